"""The scalar vocabulary and its spellings: every function is spelled by every backend, or
the backend says why not; the interpreter and the op registry take their references from it."""

import pytest
import torch

from symfuse import ops
from symfuse.codegen.cpu import spell as cpu
from symfuse.codegen.gpu import spell as gpu
from symfuse.te.interp import FN
from symfuse.te.scalar import FUNCTIONS, POSTOPS, unary_ops


@pytest.mark.parametrize("backend", [cpu, gpu], ids=["cpu", "gpu"])
def test_every_function_has_a_spelling_or_a_reason(backend):
    missing = [n for n in FUNCTIONS if n not in backend.SPELLING and n not in backend.UNSPELLED]
    assert missing == [], f"{backend.__name__} has no spelling for {missing}"


@pytest.mark.parametrize("backend", [cpu, gpu], ids=["cpu", "gpu"])
def test_every_spelling_is_of_a_function_of_the_vocabulary(backend):
    assert sorted(set(backend.SPELLING) - set(FUNCTIONS)) == []
    assert sorted(set(backend.SPELLING) & set(backend.UNSPELLED)) == []


def test_the_interpreter_and_the_registry_use_the_vocabulary():
    assert set(FN) == set(FUNCTIONS)
    for f in unary_ops():
        assert ops.get(f.name).ref is f.ref
    assert POSTOPS["silu"] == "swish" and POSTOPS["gelu"] == "gelu"


def test_references_compute_what_torch_does():
    x = torch.linspace(-0.9, 0.9, 11)
    assert torch.allclose(FUNCTIONS["silu"].ref(x), x * torch.sigmoid(x))
    assert torch.equal(FUNCTIONS["from_end"].ref(torch.tensor([-1, 2]), 5), torch.tensor([4, 2]))
    assert torch.equal(FUNCTIONS["clamp"].ref(x, min=0.0), x.clamp(min=0.0))
