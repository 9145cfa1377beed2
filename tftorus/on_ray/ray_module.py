"""Ray, imported on first use: it is an optional extra, so a missing one says how to get it."""
import importlib

#: the Ray release tftorus is tested with (pyproject.toml's `ray` extra pins the same)
TESTED = "2.60.0"


def ray():
    """The `ray` module, or an ImportError of one line naming the extra to install."""
    try:
        return importlib.import_module("ray")
    except ImportError as e:
        raise ImportError(
            f"tftorus.ray needs Ray, which is not installed here ({e}): pip install "
            f"'tftorus[ray]' (Ray {TESTED}), or run bash run_scripts/setup.sh with "
            f"TFTORUS_STACK=current, which installs it") from None
