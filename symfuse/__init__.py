"""symfuse: compile a model once with symbolic shapes, run every shape.

The names below are imported when first used, so that `symfuse.load` of a saved artifact (and
`import symfuse.runtime`) does not import the compiler.
"""

from __future__ import annotations

import importlib

from symfuse.version import __version__

_LAZY = {
    "compile": "symfuse.api",
    "compile_count": "symfuse.api",
    "load": "symfuse.artifact",
    "CompiledModule": "symfuse.runtime.module",
    "Decoder": "symfuse.runtime.decoder",
    "KVCache": "symfuse.runtime.kv",
    "CacheError": "symfuse.runtime.kv",
    "ForCausalLM": "symfuse.generation",
    "ArtifactError": "symfuse.runtime.artifact",
    "CaptureError": "symfuse.errors",
    "UnsupportedOpsError": "symfuse.errors",
    "ShapeError": "symfuse.shape.store",
    "Tri": "symfuse.ir.tri",
}

__all__ = sorted(_LAZY) + ["__version__"]


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'symfuse' has no attribute {name!r}")


def __dir__() -> list[str]:
    return __all__
