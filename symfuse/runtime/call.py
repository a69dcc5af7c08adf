"""Calling a kernel of a built library from the host code, with less overhead than ctypes.

A ctypes call converts each argument through its `argtypes`, which at small shapes is a
visible share of a call that makes dozens of them (`python bench/overhead.py`). Every
kernel symfuse generates takes only pointers and 64-bit integers, which every 64-bit ABI
passes alike, so one small CPython extension calls them all: `Kernel(address, arity)` is a
callable that reads its arguments as integers (None is a null pointer), releases the GIL as
ctypes does, and calls the function, at about a fifth of the cost. The extension is built
once per Python and compiler into the kernel cache; where it cannot be (no Python headers,
no compiler), the host code calls through ctypes as before.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sysconfig

MAX_ARGS = 24  # kernels with more arguments are called through ctypes

with open(os.path.join(os.path.dirname(__file__), "call.cpp")) as _f:
    SOURCE = f"#define SF_MAX_ARGS {MAX_ARGS}\n" + _f.read()


def python_include() -> str:
    """The folder of this Python's headers ("" when it has none)."""
    folder = sysconfig.get_paths().get("include", "")
    return folder if folder and os.path.exists(os.path.join(folder, "Python.h")) else ""


_PATHS: dict[object, str] = {}  # a loaded Kernel type -> the file it came from


def caller_path(kernel) -> str:
    """The file a `Kernel` type was loaded from ("" for None: calls through ctypes)."""
    return _PATHS.get(kernel, "") if kernel is not None else ""


def load_caller(path: str):
    """The `Kernel` type of the extension built at `path`."""
    loader = importlib.machinery.ExtensionFileLoader("symfuse_call", path)
    spec = importlib.util.spec_from_file_location("symfuse_call", path, loader=loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    _PATHS[module.Kernel] = path
    return module.Kernel
