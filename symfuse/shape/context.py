"""What an op's shape rule sees: the store, plus where the current node comes from.

Shape rules never do ad-hoc arithmetic on dims to decide equality; they ask this context,
and every constraint they add is recorded with the op, value and source location.
"""

from __future__ import annotations

from symfuse.ir.dims import Dim, DimLike, dim, fmt_shape
from symfuse.ir.tri import Tri
from symfuse.shape.store import Origin, ShapeError, ShapeStore


class ShapeContext:
    def __init__(self, store: ShapeStore, op: str = "", value: str = "", loc: str = "") -> None:
        self.store = store
        self.op, self.value, self.loc = op, value, loc
        self.input_bounds: list[tuple[Dim, Dim] | None] = []

    def origin(self, rule: str) -> Origin:
        return Origin(rule, self.op, self.value, self.loc)

    def error(self, msg: str) -> ShapeError:
        return ShapeError(f"{self.op} %{self.value} ({self.loc}): {msg}")

    def canon(self, d: DimLike) -> Dim:
        return self.store.canon(d)

    def eq(self, a: DimLike, b: DimLike, rule: str) -> Dim:
        return self.store.eq(a, b, self.origin(rule))

    def le(self, a: DimLike, b: DimLike, rule: str) -> None:
        self.store.le(a, b, self.origin(rule))

    def divisible(self, d: DimLike, k: int, rule: str) -> None:
        self.store.divisible(d, k, self.origin(rule))

    def numel_eq(self, a, b, rule: str) -> None:
        self.store.numel_eq(a, b, self.origin(rule))

    def is_one(self, d: DimLike) -> Tri:
        return self.store.is_one(d)

    def broadcast(self, *shapes, rule: str = "operands equal after broadcast") -> tuple[Dim, ...]:
        """numpy broadcasting on symbolic shapes.

        A dim that is statically 1 stretches; two dims that are not known to be 1 must be
        equal, which becomes a fact (and a run-time check). This is BladeDISC's rule: a
        dynamic dim never broadcasts implicitly.
        """
        rank = max(len(s) for s in shapes)
        out: list[Dim] = []
        for i in range(rank):
            cur: Dim | None = None
            for s in shapes:
                j = i - (rank - len(s))
                if j < 0:
                    continue
                d = self.canon(s[j])
                if cur is None or self.is_one(cur) is Tri.YES:
                    cur = d
                elif self.is_one(d) is Tri.YES:
                    continue
                else:
                    try:
                        cur = self.eq(cur, d, f"{rule}: dim {i} of {' vs '.join(fmt_shape(x) for x in shapes)}")
                    except ShapeError as e:
                        raise self.error(f"cannot broadcast {' and '.join(fmt_shape(x) for x in shapes)}") from e
            out.append(cur if cur is not None else dim(1))
        return tuple(out)

    def normalize_dim(self, d: int, rank: int) -> int:
        if not -max(rank, 1) <= d < max(rank, 1):
            raise self.error(f"dim {d} out of range for rank {rank}")
        return d % max(rank, 1)
