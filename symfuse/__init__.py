"""symfuse: compile a model once with symbolic shapes, run every shape."""

from symfuse.api import CompiledModule, compile, compile_count
from symfuse.artifact import ArtifactError, load
from symfuse.errors import CaptureError, UnsupportedOpsError
from symfuse.shape.store import ShapeError, Tri

__all__ = [
    "ArtifactError",
    "CaptureError",
    "CompiledModule",
    "ShapeError",
    "Tri",
    "UnsupportedOpsError",
    "compile",
    "compile_count",
    "load",
]
__version__ = "0.1.0"
