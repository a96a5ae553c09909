"""Packages whose names load on first use (PEP 562), so that importing one light module of a package (a
config dataclass, for a command's flags) does not import the package's heavy modules (torch, open_clip)."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable


def lazy_exports(package: str, exports: dict[str, str]) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """`__getattr__` and `__dir__` for `package`, whose name `n` lives in the module `exports[n]`.

    In the package's `__init__.py`: `__getattr__, __dir__ = lazy_exports(__name__, {"Name": "package.module"})`.
    """
    names = vars(sys.modules[package])

    def __getattr__(name: str) -> object:
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(exports[name]), name)
        names[name] = value  # later look-ups skip this function
        return value

    def __dir__() -> list[str]:
        return sorted(set(names) | set(exports))

    return __getattr__, __dir__
