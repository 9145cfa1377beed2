"""A package's names re-exported from its modules, each imported on first use.

A package's __init__ lists the names a user imports from it; the module that defines a name is
imported only when the name is first read. So importing any module of the recipe does not pull
in the rest: a plan (`train.py --plan_only`) or the embedded data's drawing processes import
no TensorFlow through a package's __init__.

    __getattr__, __dir__ = lazy_exports(__name__, {"LARS": "optimizers.lars"})
"""
import importlib
from typing import Callable, Dict, List, Tuple


def lazy_exports(package: str, exports: Dict[str, str]) -> Tuple[Callable, Callable]:
    """A module `__getattr__` and `__dir__` for `package`: `exports` maps each name to the
    module defining it, relative to the package (a subpackage exports only its own modules)."""
    def __getattr__(name: str):
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(f"{package}.{exports[name]}"), name)

    def __dir__() -> List[str]:
        return sorted(set(exports) | set(vars(importlib.import_module(package))))

    return __getattr__, __dir__
