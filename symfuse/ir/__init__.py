"""The graph IR: symbolic dims, dtypes, tensor types and the SSA graph."""

from symfuse.ir.dims import Dim, dim, fmt, fmt_shape, sym
from symfuse.ir.dtypes import DType
from symfuse.ir.graph import Graph, Node, Value, print_graph
from symfuse.ir.types import TensorType

__all__ = ["DType", "Dim", "Graph", "Node", "TensorType", "Value", "dim", "fmt", "fmt_shape", "print_graph", "sym"]
