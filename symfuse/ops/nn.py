"""Compute-intensive ops: linear, matmul, convolution, attention, and the LSTM.

Their constraints tie contraction dims (matmul's K), channel counts and the batch dims
that attention's operands share.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from symfuse.ir.dtypes import DType
from symfuse.ops.reduction import _pool_out as pool_out
from symfuse.ops.registry import Kind, defop, promoted, same_dtype
from symfuse.runtime.kv import paged_attention
from symfuse.runtime.lstm import torch_lstm
from symfuse.te.rules import conv2d_rule, linear_rule, matmul_rule


def _linear_shape(ctx, x, weight, bias):
    if weight.rank != 2 or x.rank < 1:
        raise ctx.error(f"linear needs a 2-D weight and an input of rank >= 1, got {x} and {weight}")
    ctx.eq(x.shape[-1], weight.shape[1], "linear contracts the input's last dim with the weight's columns")
    if bias is not None:
        ctx.eq(bias.shape[-1], weight.shape[0], "linear bias has one entry per output feature")
    return x.shape[:-1] + (weight.shape[0],)


defop(
    "linear",
    Kind.COMPUTE,
    ("x", "weight", "bias?"),
    shape=_linear_shape,
    dtype=same_dtype(),
    ref=lambda x, weight, bias: F.linear(x, weight, bias),
    lower=linear_rule,
    constraints="x[..., K] with weight[N, K]; bias[N]",
)


def _matmul_shape(ctx, a, b):
    if a.rank < 2 or b.rank < 2:
        raise ctx.error(f"matmul needs operands of rank >= 2, got {a} and {b}")
    ctx.eq(a.shape[-1], b.shape[-2], "matmul contracts K")
    batch = ctx.broadcast(a.shape[:-2], b.shape[:-2], rule="matmul batch dims broadcast")
    return batch + (a.shape[-2], b.shape[-1])


defop(
    "matmul",
    Kind.COMPUTE,
    ("a", "b"),
    shape=_matmul_shape,
    dtype=promoted,
    ref=torch.matmul,
    lower=matmul_rule,
    constraints="a[..., M, K] @ b[..., K, N]; batch dims broadcast",
)


def _conv_shape(spatial: int):
    op, rank = f"conv{spatial}d", spatial + 2

    def shape(ctx, x, weight, bias, stride, padding, dilation, groups):
        if x.rank != rank or weight.rank != rank:
            raise ctx.error(f"{op} needs {rank}-D input and weight, got {x} and {weight}")
        if x.dtype not in (DType.float32, DType.bfloat16, DType.float16):
            raise ctx.error(f"{op} of {x.dtype} tensors: the library convolution takes f32, bf16 and f16")
        ctx.eq(x.shape[1], weight.shape[1] * groups, f"{op} input channels equal weight channels times groups")
        if bias is not None:
            ctx.eq(bias.shape[0], weight.shape[0], f"{op} bias has one entry per output channel")
        for i in range(2, rank):
            if not weight.shape[i].is_Integer:
                raise ctx.error(
                    f"{op}'s kernel size must be static: weight dim {i} is {weight.shape[i]} (an input's dim that "
                    "is declared or left dynamic; fix it in `dynamic`)"
                )
        sides = tuple(
            pool_out(ctx, x.shape[2 + i], int(weight.shape[2 + i]), stride[i], padding[i], dilation[i])
            for i in range(spatial)
        )
        return (x.shape[0], weight.shape[0]) + sides

    return shape


defop(
    "conv2d",
    Kind.COMPUTE,
    ("x", "weight", "bias?"),
    ("stride", "padding", "dilation", "groups"),
    shape=_conv_shape(2),
    dtype=same_dtype(),
    ref=lambda x, weight, bias, stride, padding, dilation, groups: F.conv2d(
        x, weight, bias, stride, padding, dilation, groups
    ),
    lower=conv2d_rule,
    constraints="channels tie; each output side is (H + 2p - d(k-1) - 1)//s + 1 >= 1",
)
defop(
    "conv3d",
    Kind.COMPUTE,
    ("x", "weight", "bias?"),
    ("stride", "padding", "dilation", "groups"),
    shape=_conv_shape(3),
    dtype=same_dtype(),
    ref=lambda x, weight, bias, stride, padding, dilation, groups: F.conv3d(
        x, weight, bias, stride, padding, dilation, groups
    ),
    constraints="channels tie; each output side is (D + 2p - d(k-1) - 1)//s + 1 >= 1",
    doc="volumetric convolution: the library's (torch's) kernel inside the program",
)


def _sdpa_shape(ctx, q, k, v, mask, is_causal, scale):
    if min(q.rank, k.rank, v.rank) < 2:
        raise ctx.error("attention operands need rank >= 2")
    if is_causal and mask is not None:
        raise ctx.error("attention takes a mask or is_causal, not both (as in torch)")
    ctx.eq(q.shape[-1], k.shape[-1], "attention: query and key share the head dim")
    ctx.eq(k.shape[-2], v.shape[-2], "attention: keys and values share the sequence")
    batch = ctx.broadcast(q.shape[:-2], k.shape[:-2], v.shape[:-2], rule="attention batch and head dims")
    if mask is not None:
        ctx.broadcast(mask.shape, batch + (q.shape[-2], k.shape[-2]), rule="attention mask covers [.., L, S]")
    return batch + (q.shape[-2], v.shape[-1])


defop(
    "sdpa",
    Kind.COMPUTE,
    ("q", "k", "v", "mask?"),
    ("is_causal", "scale"),
    shape=_sdpa_shape,
    dtype=same_dtype(),
    ref=lambda q, k, v, mask, is_causal, scale: F.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, is_causal=is_causal, scale=scale
    ),
    constraints="q[.., L, E], k[.., S, E], v[.., S, Ev]; mask broadcasts to [.., L, S]",
    doc="scaled dot-product attention: softmax(q k^T * scale + mask) v",
)


def _lstm_shape(ctx, x, h0, c0, params, num_layers, bidirectional, batch_first, has_biases, hidden_size):
    if x.rank != 3:
        raise ctx.error(f"LSTM input must be 3-D, got {x}")
    dirs = 2 if bidirectional else 1
    per_layer = 4 if has_biases else 2
    if len(params) != num_layers * dirs * per_layer:
        raise ctx.error(f"LSTM expects {num_layers * dirs * per_layer} weights, got {len(params)}")
    b, t = (x.shape[0], x.shape[1]) if batch_first else (x.shape[1], x.shape[0])
    ctx.eq(x.shape[2], params[0].shape[1], "LSTM input features match weight_ih_l0")
    state = (num_layers * dirs, b, hidden_size)
    for s in (h0, c0):
        if s is not None:
            for d, e in zip(s.shape, state):
                ctx.eq(d, e, "LSTM initial state is [layers * directions, batch, hidden]")
    out = (b, t, dirs * hidden_size) if batch_first else (t, b, dirs * hidden_size)
    return [out, state, state]


defop(
    "lstm",
    Kind.OPAQUE,
    ("x", "h0?", "c0?", "params*"),
    ("num_layers", "bidirectional", "batch_first", "has_biases", "hidden_size"),
    shape=_lstm_shape,
    dtype=lambda x, h0, c0, params, **_: [x.dtype] * 3,
    ref=torch_lstm,
    constraints="input features tie to weight_ih_l0; states are [layers * directions, batch, hidden]",
    doc="a multi-layer LSTM; outputs (output, h_n, c_n)",
)


def _paged_attention_shape(ctx, q, k, v, k_pool, v_pool, table, lengths, scale, window):
    for t, rank, what in ((q, 4, "q"), (k, 4, "k"), (v, 4, "v"), (k_pool, 4, "k_pool"), (v_pool, 4, "v_pool"),
                          (table, 2, "table"), (lengths, 1, "lengths")):  # fmt: skip
        if t.rank != rank:
            raise ctx.error(f"paged_attention: {what} must be {rank}-D, got {t}")
    for d in range(4):
        ctx.eq(k.shape[d], v.shape[d], "paged_attention: new keys and values are both [B, Hkv, S, D]")
        ctx.eq(k_pool.shape[d], v_pool.shape[d], "paged_attention: the key and value pools are alike")
    ctx.eq(q.shape[0], k.shape[0], "paged_attention: queries and new keys share the batch")
    ctx.eq(q.shape[2], k.shape[2], "paged_attention: one new key per new query")
    ctx.eq(q.shape[3], k.shape[3], "paged_attention: queries and keys have one head size")
    ctx.eq(k_pool.shape[1], k.shape[1], "paged_attention: the pools hold the kv heads")
    ctx.eq(k_pool.shape[3], k.shape[3], "paged_attention: the pools hold the head size")
    ctx.eq(table.shape[0], q.shape[0], "paged_attention: one block-table row per sequence")
    ctx.eq(lengths.shape[0], q.shape[0], "paged_attention: one past length per sequence")
    return q.shape


defop(
    "paged_attention",
    Kind.OPAQUE,
    ("q", "k", "v", "k_pool", "v_pool", "table", "lengths"),
    ("scale", "window"),
    shape=_paged_attention_shape,
    dtype=same_dtype(0),
    ref=paged_attention,
    constraints="q[B, Hq, S, D], k/v[B, Hkv, S, D], pools[N, Hkv, BLOCK, D], table[B, M], lengths[B]; Hkv divides Hq",
    doc="causal attention of new tokens over each sequence's cached past (read through a block table) and themselves",
)
