"""The op registry. Importing this package registers every op."""

from symfuse.ops import elementwise, layout, nn, reduction  # noqa: F401  (registration)
from symfuse.ops.registry import REGISTRY, Kind, OpDef, get

__all__ = ["REGISTRY", "Kind", "OpDef", "get"]
