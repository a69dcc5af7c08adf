"""Shape analysis: the global constraint store and shape inference over a graph."""

from symfuse.shape.store import Fact, Origin, ShapeError, ShapeStore, Tri

__all__ = ["Fact", "Origin", "ShapeError", "ShapeStore", "Tri"]
