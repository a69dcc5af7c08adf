"""`torch.compile(model, backend="symfuse", dynamic=True)`: one symfuse program per Dynamo
graph, reused for every new size; Dynamo's own recompilations (its 0/1 specialisation)
are counted and equal symfuse's compiles."""

import pytest
import torch
import torch._dynamo

import symfuse
import symfuse.dynamo
from tests.conftest import rel_err


class Block(torch.nn.Module):
    def __init__(self, d: int = 16) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(d, d)
        self.norm = torch.nn.LayerNorm(d)
        self.scale = 0.5  # a float attribute: Dynamo passes it as a 0-d tensor under dynamic=True

    def forward(self, x, mask):
        scores = self.proj(x) @ x.transpose(1, 2) * self.scale + mask[:, None, :]
        return self.norm(torch.softmax(scores, dim=-1) @ x)


def _inputs(b, s, d=16):
    g = torch.Generator().manual_seed(b * 100 + s)
    return torch.randn(b, s, d, generator=g), torch.randn(b, s, generator=g)


def _counts():
    return symfuse.compile_count(), int(torch._dynamo.utils.counters["stats"]["unique_graphs"])


def test_backend_is_registered_by_name():
    assert "symfuse" in torch._dynamo.list_backends(exclude_tags=())


def test_one_program_per_graph_every_size_after():
    torch._dynamo.reset()
    model = Block().eval()
    fn = torch.compile(model, backend="symfuse", dynamic=True)
    c0, g0 = _counts()
    with torch.no_grad():
        for b, s in [(2, 7), (3, 16), (5, 33), (4, 2), (2, 97)]:
            x, m = _inputs(b, s)
            assert rel_err(fn(x, m), model(x, m)) < 1e-4
    c1, g1 = _counts()
    assert (c1 - c0, g1 - g0) == (1, 1)  # one Dynamo graph, one symfuse program, five sizes
    with torch.no_grad():  # size 1: Dynamo specialises it, a graph of its own (documented)
        for b, s in [(1, 5), (1, 64), (1, 13)]:
            x, m = _inputs(b, s)
            assert rel_err(fn(x, m), model(x, m)) < 1e-4
    c2, g2 = _counts()
    assert c2 - c1 == g2 - g1 == 1
    assert symfuse.dynamo.stats()["fallbacks"] == 0


def test_graph_symfuse_cannot_lower_falls_back_visibly():
    torch._dynamo.reset()

    def f(x):
        return torch.fft.rfft(x).abs() + 1

    fn = torch.compile(f, backend="symfuse", dynamic=True)
    before = symfuse.dynamo.stats()["fallbacks"]
    x = torch.randn(3, 8)
    with pytest.warns(UserWarning, match="runs without symfuse"):
        out = fn(x)
    assert torch.allclose(out, f(x))
    assert symfuse.dynamo.stats()["fallbacks"] == before + 1


@pytest.mark.models
def test_bert_small_through_dynamo():
    from symfuse.models import load

    torch._dynamo.reset()
    case = load("bert-small")
    fn = torch.compile(case.model, backend="symfuse", dynamic=True)
    c0, g0 = _counts()
    with torch.no_grad():
        for b in [dict(B=2, S=7), dict(B=3, S=33), dict(B=4, S=64), dict(B=2, S=128)]:
            inputs = case.inputs(**b)
            assert rel_err(fn(**inputs).last_hidden_state, case.model(**inputs).last_hidden_state) < 1e-4
    c1, g1 = _counts()
    assert c1 - c0 == g1 - g0 == 1
