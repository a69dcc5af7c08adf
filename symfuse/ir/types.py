"""Tensor types: a static rank, symbolic sizes and an element type."""

from __future__ import annotations

from dataclasses import dataclass

from symfuse.ir.dims import Dim, DimLike, dim, fmt, product
from symfuse.ir.dtypes import DType


@dataclass(frozen=True)
class TensorType:
    shape: tuple[Dim, ...]
    dtype: DType

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", tuple(dim(d) for d in self.shape))

    @staticmethod
    def of(shape: tuple[DimLike, ...] | list[DimLike], dtype: DType) -> TensorType:
        return TensorType(tuple(dim(d) for d in shape), dtype)

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def numel(self) -> Dim:
        return product(self.shape)

    def with_shape(self, shape) -> TensorType:
        return TensorType.of(tuple(shape), self.dtype)

    def __str__(self) -> str:
        return f"{self.dtype}[{', '.join(fmt(d) for d in self.shape)}]"
