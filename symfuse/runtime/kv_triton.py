"""Attention over the paged key/value cache as a Triton kernel (the GPU backend's).

One program per (sequence, query head, query row, split of the keys): it walks its split in
chunks of BLOCK_N keys, the past read through the block table and the new keys where the
step computed them, keeping a running max, sum and weighted sum of values (flash-decoding's
partial softmax); the splits are merged after by a few tensor ops. The number of splits
follows the shapes alone (the table's width), never the lengths' values, so a CUDA graph
captured for one binding replays for any lengths. Block-table entries are clamped into the
pools: a bad table reads a wrong block, never outside memory (the decoder builds its tables
and checks them on the host).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK_N = 32  # keys a program scores at once
KEYS_PER_SPLIT = 512  # a split's keys at least: fewer make the merge cost more than it spreads


@triton.jit
def _paged_attention(
    q, k, v, kp, vp, table, lengths, m_out, l_out, acc_out,
    qb, qh, qs, kb, kh, ks, vb, vh, vs,
    Hq, Hkv, S, D, M, N, BL, window, scale, span,
    SPLITS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0)  # (b, h, i)
    split = tl.program_id(1)
    i = row % S
    h = (row // S) % Hq
    b = row // (S * Hq)
    g = h // (Hq // Hkv)
    past = tl.load(lengths + b)
    pos = past + i
    first = tl.where(window > 0, tl.maximum(pos - window + 1, 0), 0)
    lo = tl.maximum(split * span, first)
    hi = tl.minimum((split + 1) * span, pos + 1)
    d = tl.arange(0, BLOCK_D)
    dm = d < D
    qv = tl.load(q + b * qb + h * qh + i * qs + d, mask=dm, other=0.0).to(tl.float32) * scale
    m_i = tl.full((), float("-inf"), tl.float32)
    l_i = tl.full((), 0.0, tl.float32)
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    for start in range(lo, hi, BLOCK_N):
        j = start + tl.arange(0, BLOCK_N)
        live = j < hi
        in_past = live & (j < past)
        blk = tl.load(table + b * M + j // BL, mask=in_past, other=0)
        blk = tl.minimum(tl.maximum(blk, 0), N - 1)
        at = ((blk * Hkv + g) * BL + j % BL) * D
        new = j - past
        kk = tl.load(kp + at[:, None] + d[None, :], mask=in_past[:, None] & dm[None, :], other=0.0).to(tl.float32)
        kk += tl.load(k + b * kb + g * kh + new[:, None] * ks + d[None, :],
                      mask=(live & ~in_past)[:, None] & dm[None, :], other=0.0).to(tl.float32)  # fmt: skip
        x = tl.sum(kk * qv[None, :], axis=1)
        x = tl.where(live, x, -float("inf"))
        m_new = tl.maximum(m_i, tl.max(x, axis=0))
        c = tl.exp(m_i - m_new)
        p = tl.where(live, tl.exp(x - m_new), 0.0)
        vv = tl.load(vp + at[:, None] + d[None, :], mask=in_past[:, None] & dm[None, :], other=0.0).to(tl.float32)
        vv += tl.load(v + b * vb + g * vh + new[:, None] * vs + d[None, :],
                      mask=(live & ~in_past)[:, None] & dm[None, :], other=0.0).to(tl.float32)  # fmt: skip
        acc = acc * c + tl.sum(p[:, None] * vv, axis=0)
        l_i = l_i * c + tl.sum(p, axis=0)
        m_i = m_new
    at_out = row * SPLITS + split
    tl.store(m_out + at_out, m_i)
    tl.store(l_out + at_out, l_i)
    tl.store(acc_out + at_out * BLOCK_D + d, acc)


def paged_attention_gpu(q, k, v, k_pool, v_pool, table, lengths, scale: float, window: int) -> torch.Tensor:
    """`runtime.kv.paged_attention` on the kernel above."""
    b, hq, s, d = q.shape
    hkv, bl = k.shape[1], k_pool.shape[2]
    width, blocks = table.shape[1], k_pool.shape[0]
    rows = b * hq * s
    out = torch.empty((b, hq, s, d), dtype=q.dtype, device=q.device)
    if rows == 0:
        return out
    keys = width * bl + s  # the most keys a row can see, from the shapes alone
    splits = max(1, min(triton.cdiv(keys, KEYS_PER_SPLIT), 16))
    span = triton.cdiv(keys, splits)
    block_d = triton.next_power_of_2(d)
    m = torch.empty((rows, splits), dtype=torch.float32, device=q.device)
    l_ = torch.empty_like(m)
    acc = torch.empty((rows, splits, block_d), dtype=torch.float32, device=q.device)
    q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
    k_pool, v_pool = k_pool.contiguous(), v_pool.contiguous()
    table, lengths = table.to(torch.int64).contiguous(), lengths.to(torch.int64).contiguous()
    _paged_attention[(rows, splits)](
        q, k, v, k_pool, v_pool, table, lengths, m, l_, acc,
        *q.stride()[:3], *k.stride()[:3], *v.stride()[:3],
        hq, hkv, s, d, width, blocks, bl, window, scale, span,
        SPLITS=splits, BLOCK_N=BLOCK_N, BLOCK_D=block_d,
    )  # fmt: skip
    top = m.amax(1, keepdim=True)
    w = torch.where(l_ > 0, torch.exp(m - top), torch.zeros_like(m))
    merged = (acc * w[:, :, None]).sum(1) / (l_ * w).sum(1, keepdim=True)
    return merged[:, :d].reshape(b, hq, s, d).to(q.dtype)
