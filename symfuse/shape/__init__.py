"""Shape analysis: the global constraint store and shape inference over a graph."""

from symfuse.ir.tri import Tri
from symfuse.shape.store import Fact, Origin, ShapeError, ShapeStore

__all__ = ["Fact", "Origin", "ShapeError", "ShapeStore", "Tri"]
