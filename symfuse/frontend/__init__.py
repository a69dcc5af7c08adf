"""Capture: models in, symfuse graphs out."""

from symfuse.frontend.torch_export import Captured, capture

__all__ = ["Captured", "capture"]
