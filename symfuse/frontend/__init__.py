"""Capture: models in, symfuse graphs out."""

from __future__ import annotations

import os
from typing import Any

from symfuse.frontend.torch_export import Captured, capture

__all__ = ["Captured", "capture", "is_onnx"]


def is_onnx(model: Any) -> bool:
    """`model` is an ONNX model: a ModelProto or a path to a `.onnx` file (told apart without
    importing onnx, which only the ONNX road needs: `pip install symfuse[onnx]`)."""
    if type(model).__name__ == "ModelProto" and type(model).__module__.startswith("onnx"):
        return True
    return isinstance(model, (str, os.PathLike)) and str(model).lower().endswith(".onnx")
