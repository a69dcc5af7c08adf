"""The graph IR: stable printing and the structural verifier.

The golden text's value names come from torch.export, whose version is pinned.
"""

import inspect

import pytest
import torch

import symfuse
from symfuse.ir import DType, Graph, Node, Value
from symfuse.ir.types import TensorType
from symfuse.ir.verify import VerifyError, verify

GOLDEN = """\
graph Block(%x: f32[B, S, 8]) {
  %linear: f32[B, S, 16] = linear(%x, %p_up_weight, %p_up_bias)  # up linear.py:134
  %gelu: f32[B, S, 16] = gelu(%linear, approximate='tanh')  # test_graph.py:{l1}
  %linear_1: f32[B, S, 8] = linear(%gelu, %p_down_weight, none)  # down linear.py:134
  %add: f32[B, S, 8] = add(%linear_1, %x)  # test_graph.py:{l1}
  %reshape: f32[B*S, 8] = reshape(%add, shape=[-1, 8])  # test_graph.py:{l2}
  %layer_norm: f32[B*S, 8] = layer_norm(%reshape, none, none, normalized_shape=[8], eps=1e-05)  # test_graph.py:{l2}
  return %layer_norm
}"""


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up, self.down = torch.nn.Linear(8, 16), torch.nn.Linear(16, 8, bias=False)

    def forward(self, x):
        y = self.down(torch.nn.functional.gelu(self.up(x), approximate="tanh")) + x
        return torch.nn.functional.layer_norm(y.reshape(-1, 8), (8,))


def test_printed_graph_is_stable():
    c = symfuse.compile(Block(), (torch.randn(2, 3, 8),), {"x": {0: "B", 1: "S"}})
    from symfuse.ir.graph import print_graph

    first = inspect.getsourcelines(Block.forward)[1]  # the golden text names source lines
    want = GOLDEN.replace("{l1}", str(first + 1)).replace("{l2}", str(first + 2))
    assert print_graph(c.graph, with_constants=False) == want
    verify(c.graph)


def test_verifier_finds_use_before_definition_and_duplicates():
    t = TensorType.of((4,), DType.float32)
    x, a, b = Value("x", t), Value("a", t), Value("b", t)
    g = Graph("bad", inputs=[x])
    g.nodes = [Node("relu", (b,), {}, (a,)), Node("relu", (x,), {}, (b,)), Node("neg", (x,), {}, (Value("a", t),))]
    g.outputs = [a, Value("c", t)]
    with pytest.raises(VerifyError) as err:
        verify(g)
    text = str(err.value)
    assert "node 0 (relu -> %a) uses %b before it is defined" in text
    assert "name %a is used by two values" in text
    assert "output %c is not defined" in text
