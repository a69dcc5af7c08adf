"""The model's output structure rebuilt around the program's outputs (runtime/outputs.py)."""

from dataclasses import dataclass

import torch
from torch.utils import _pytree as pytree
from transformers.modeling_outputs import BaseModelOutputWithPooling
from transformers.utils import ModelOutput

from symfuse.runtime.outputs import OutputBuilder


def spec_of(value):
    return pytree.tree_flatten(value)[1]


def same(a, b) -> bool:
    return (
        type(a) is type(b)
        and list(a.keys()) == list(b.keys())
        and all(a[k] is b[k] for k in b.keys())
        and a.to_tuple() == b.to_tuple()
        and vars(a).keys() == vars(b).keys()
    )


def test_model_output_built_directly_after_one_checked_call():
    x, y = torch.randn(2, 3), torch.randn(2)
    spec = spec_of(BaseModelOutputWithPooling(last_hidden_state=x, pooler_output=y))
    build = OutputBuilder(spec)
    assert not build.direct
    for _ in range(2):
        a, b = torch.randn(4, 3), torch.randn(4)
        got, want = build([a, b]), pytree.tree_unflatten([a, b], spec)
        assert same(got, want) and got.last_hidden_state is a and got.hidden_states is None
        assert got[0] is a and got["pooler_output"] is b and "hidden_states" not in got
    assert build.direct


@dataclass
class Scaled(ModelOutput):
    """A model output whose `__post_init__` does more than ModelOutput's: not built directly."""

    value: torch.Tensor | None = None
    doubled: torch.Tensor | None = None

    def __post_init__(self):
        super().__post_init__()
        self.note = "checked"


def test_output_with_its_own_post_init_keeps_pytree():
    spec = spec_of(Scaled(value=torch.ones(2)))
    build = OutputBuilder(spec)
    for _ in range(2):
        t = torch.randn(3)
        got = build([t])
        assert same(got, pytree.tree_unflatten([t], spec)) and got.note == "checked"
    assert not build.direct


def test_plain_structures_use_pytree():
    for value in ((torch.ones(1), [torch.ones(2)]), {"a": torch.ones(1)}, torch.ones(3)):
        spec = spec_of(value)
        build = OutputBuilder(spec)
        leaves = pytree.tree_leaves(value)
        assert pytree.tree_flatten(build(leaves))[1] == spec and not build.direct
