"""`symfuse::paged_attention`: the custom op a captured decoder's attention calls.

Its meaning is `runtime.kv.paged_attention`; its fake implementation gives the shape of the
queries, so torch.export traces it with every size symbolic.
"""

from __future__ import annotations

import torch

from symfuse.runtime import kv as _kv


@torch.library.custom_op("symfuse::paged_attention", mutates_args=())
def paged_attention_op(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    table: torch.Tensor,
    lengths: torch.Tensor,
    scale: float,
    window: int,
) -> torch.Tensor:
    return _kv.paged_attention(q, k, v, k_pool, v_pool, table, lengths, scale, window)


@paged_attention_op.register_fake
def _(q, k, v, k_pool, v_pool, table, lengths, scale, window):
    return torch.empty_like(q)
