"""The model's own output structure, rebuilt around the program's flat outputs at each call.

torch's pytree rebuilds a node by calling its type's constructor; for transformers' model
outputs (dataclasses over an OrderedDict) that runs `__post_init__`'s checks, a visible share
of a small model's call (`python bench/overhead.py`). A node of that kind whose children are
all tensors is built directly instead: every field set as an attribute and the ones that are not None as items, which is
what `__post_init__` leaves. The first call builds both ways and keeps the direct one only
if the two agree (type, items, attributes), so a class whose constructor does more keeps
pytree's.
"""

from __future__ import annotations

import dataclasses
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from torch.utils import _pytree as pytree


class OutputBuilder:
    """`builder(flat_outputs)` is `pytree.tree_unflatten(flat_outputs, spec)`, faster where it can."""

    def __init__(self, spec: pytree.TreeSpec) -> None:
        self.spec = spec
        self._direct = _direct(spec)
        # what calls build with: decided by the first call where a direct builder exists
        self._build: Callable[[list], Any] | None = None if self._direct else self._unflatten
        self._lock = threading.Lock()

    @property
    def direct(self) -> bool:
        """Whether calls build the output directly (known after the first call)."""
        return self._build is not None and self._build is self._direct

    def _unflatten(self, outs: list) -> Any:
        return pytree.tree_unflatten(outs, self.spec)

    def __call__(self, outs: list) -> Any:
        build = self._build
        if build is not None:
            return build(outs)
        with self._lock:
            built = self._unflatten(outs)
            if self._build is None:
                self._build = self._direct if _same(self._direct(outs), built) else self._unflatten
            return built


def _direct(spec: pytree.TreeSpec) -> Callable[[list], Any] | None:
    """A direct builder for a dataclass-over-OrderedDict node of leaves, else None."""
    cls, names = spec.type, spec.context
    if not (
        isinstance(cls, type)
        and issubclass(cls, OrderedDict)
        and dataclasses.is_dataclass(cls)
        and isinstance(names, list | tuple)
        and spec.num_leaves == spec.num_children == len(names)  # every child a leaf
    ):
        return None
    fields = [f.name for f in dataclasses.fields(cls)]
    if not set(names) <= set(fields):
        return None
    set_attr, set_item, init = object.__setattr__, OrderedDict.__setitem__, OrderedDict.__init__

    def build(outs: list) -> Any:
        given = dict(zip(names, outs))
        obj = cls.__new__(cls)
        init(obj)
        for f in fields:
            value = given.get(f)
            set_attr(obj, f, value)
            if value is not None:
                set_item(obj, f, value)
        return obj

    return build


def _same(a: Any, b: Any) -> bool:
    """Same type, the same objects as items in the same order, the same attributes."""
    return (
        type(a) is type(b)
        and list(a.keys()) == list(b.keys())
        and all(a[k] is b[k] for k in b.keys())
        and vars(a).keys() == vars(b).keys()
        and all(vars(a)[k] is vars(b)[k] for k in vars(b))
    )
