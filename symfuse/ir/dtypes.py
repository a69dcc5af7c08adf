"""Element types. symfuse names them itself and maps them to torch at the boundary."""

from __future__ import annotations

import enum

import torch


class DType(enum.Enum):
    bool = "bool"
    uint8 = "u8"
    int8 = "i8"
    int16 = "i16"
    int32 = "i32"
    int64 = "i64"
    float16 = "f16"
    bfloat16 = "bf16"
    float32 = "f32"
    float64 = "f64"

    @property
    def torch(self) -> torch.dtype:
        return getattr(torch, self.name)

    @property
    def is_float(self) -> bool:
        return self in (DType.float16, DType.bfloat16, DType.float32, DType.float64)

    @property
    def is_int(self) -> bool:
        return not self.is_float and self is not DType.bool

    @staticmethod
    def of(t: torch.dtype) -> DType:
        for d in DType:
            if d.torch == t:
                return d
        raise TypeError(f"dtype {t} is not supported by symfuse")

    def __str__(self) -> str:
        return self.value


def promote(*items: tuple[DType, int]) -> DType:
    """torch's result dtype for operands given as (dtype, rank) pairs.

    Rank matters: zero-dim operands (and Python scalars) only decide the category,
    exactly as in torch's type promotion.
    """
    tensors = [torch.empty((1,) * min(rank, 1), dtype=dt.torch) for dt, rank in items]
    out = tensors[0]
    for t in tensors[1:]:
        out = torch.empty((1,) * max(out.dim(), t.dim()), dtype=torch.result_type(out, t))
    return DType.of(out.dtype)
