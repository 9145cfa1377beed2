"""A network of their own for one machine's ranks: a new Linux network namespace, loopback only.

TensorFlow's gRPC server listens on every interface (it binds 0.0.0.0 whatever the TF_CONFIG
says), and it runs what it is sent. `python -m tftorus.run` starts all its ranks on this machine,
so it moves itself into a fresh network namespace before starting them: they inherit it, talk
over its loopback, and nothing outside the machine (or outside the job on it) can reach their
ports. As root that is unshare(CLONE_NEWNET); as another user, a user namespace first, with this
user mapped to itself (files keep their owners), where the kernel allows unprivileged ones.

The cost: the ranks reach nothing but each other. Files on mounted file systems (NFS, a FUSE
mount) still read as before, the kernel or the mount's daemon doing the networking; what a rank
would open a socket for itself (gs:// or s3:// paths, a metrics service, a download, a
TensorBoard server others browse) needs `--share-network`, which keeps the machine's network.
Standard library only.
"""
import ctypes
import fcntl
import os
import socket
import struct
import sys
import threading
from typing import Optional

CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000
_SIOCGIFFLAGS, _SIOCSIFFLAGS, _IFF_UP = 0x8913, 0x8914, 0x1
_IFREQ = struct.Struct("16sh22x")


def enter() -> Optional[str]:
    """Move this process into a new network namespace with loopback up. None when done, else
    why it could not (the process is then where it was)."""
    if not sys.platform.startswith("linux"):
        return f"network namespaces are Linux's ({sys.platform} has none)"
    if threading.active_count() > 1:
        return "the launcher runs threads already (unshare needs a single thread)"
    libc = ctypes.CDLL(None, use_errno=True)
    uid, gid = os.geteuid(), os.getegid()
    flags = CLONE_NEWNET if uid == 0 else CLONE_NEWUSER | CLONE_NEWNET
    if libc.unshare(flags) != 0:
        err = ctypes.get_errno()
        return (f"unshare: {os.strerror(err)}" + ("" if uid == 0 else
                " (unprivileged user namespaces are off: kernel.unprivileged_userns_clone or "
                "user.max_user_namespaces)"))
    try:
        if uid != 0:
            _write("/proc/self/setgroups", "deny")
            _write("/proc/self/uid_map", f"{uid} {uid} 1")
            _write("/proc/self/gid_map", f"{gid} {gid} 1")
        _loopback_up()
    except OSError as e:  # inside, half set up: no way back; the launcher must not go on
        raise RuntimeError(f"tftorus.run: a private network was made but not set up "
                           f"({e}); run again with --share-network") from None
    return None


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def _loopback_up() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        flags = _IFREQ.unpack(fcntl.ioctl(s, _SIOCGIFFLAGS, _IFREQ.pack(b"lo", 0)))[1]
        fcntl.ioctl(s, _SIOCSIFFLAGS, _IFREQ.pack(b"lo", flags | _IFF_UP))
