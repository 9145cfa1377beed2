"""A rank that listens as TensorFlow's server does (every interface) and says where and in
which network it runs, then waits for the test to try its port (tests/test_launchers.py)."""
import os
import socket
import time

server = socket.socket()
server.bind(("0.0.0.0", 0))
server.listen()
interfaces = sorted(line.split(":")[0].strip() for line in open("/proc/net/dev").readlines()[2:])
print(f"LISTENING {server.getsockname()[1]} NET {os.readlink('/proc/self/ns/net')} "
      f"INTERFACES {','.join(interfaces)} SECRET {len(os.environ.get('TFTORUS_JOB_SECRET', ''))}",
      flush=True)
server.settimeout(float(os.environ.get("LISTEN_SECONDS", "4")))
try:
    server.accept()
    print("SOMEONE CONNECTED", flush=True)
except socket.timeout:
    pass
