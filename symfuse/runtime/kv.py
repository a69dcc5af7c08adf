"""The key/value cache a compiled decoder owns, and the attention that reads it.

Each layer keeps two pools of fixed-size blocks, `[blocks, kv_heads, BLOCK, head_dim]` (keys
and values); a sequence owns a list of blocks (its row of the block table) and a length.
A decoding step reads the past where it lies, through the table, and the runtime writes the
step's new keys and values into the sequence's blocks: a step moves O(new tokens) of cache,
never the past. A finished sequence's blocks go back to the free list; the pools grow (by
doubling) only when no block is free.

`paged_attention` is the op's meaning, in torch: the compiled programs run a native kernel
that the tests compare with it.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

BLOCK = 16  # tokens per cache block: at most 15 tokens of a sequence's last block lie unused


def visible(lengths: torch.Tensor, s: int, keys: int, window: int) -> torch.Tensor:
    """[B, s, keys] bool: which keys (past, then the s new ones) each new query row sees:
    causal from its position `lengths[b] + i`, and within `window` positions where one is set."""
    pos = lengths.view(-1, 1, 1) + torch.arange(s, device=lengths.device).view(1, -1, 1)
    key = torch.arange(keys, device=lengths.device).view(1, 1, -1)
    seen = key <= pos
    if window:
        seen &= pos - key < window
    return seen


def paged_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    table: torch.Tensor,
    lengths: torch.Tensor,
    scale: float,
    window: int = 0,
) -> torch.Tensor:
    """Attention of the new tokens' queries `q [B, Hq, S, D]` over each sequence's past
    (`lengths[b]` tokens in the blocks `table[b]` of the pools `[N, Hkv, BLOCK, D]`) followed
    by the new keys and values `k, v [B, Hkv, S, D]`, causal; grouped-query attention where
    `Hkv` divides `Hq` (query head h reads kv head h // (Hq / Hkv))."""
    b_, hq, s, d = q.shape
    hkv, block = k.shape[1], k_pool.shape[2]
    out = torch.empty_like(q)
    for b in range(b_):
        n = int(lengths[b])
        used = table[b, : (n + block - 1) // block].long()
        past_k = k_pool[used].permute(1, 0, 2, 3).reshape(hkv, len(used) * block, d)[:, :n]
        past_v = v_pool[used].permute(1, 0, 2, 3).reshape(hkv, len(used) * block, d)[:, :n]
        keys = torch.cat([past_k, k[b]], 1).repeat_interleave(hq // hkv, 0)
        values = torch.cat([past_v, v[b]], 1).repeat_interleave(hq // hkv, 0)
        mask = visible(lengths[b : b + 1], s, n + s, window)[0]
        scores = (q[b].float() @ keys.float().transpose(1, 2)) * scale
        weights = scores.masked_fill(~mask, float("-inf")).softmax(-1)
        out[b] = (weights @ values.float()).to(q.dtype)
    return out


class CacheError(ValueError):
    """A cache used against its rules: another model's, a removed sequence, past the context."""


@dataclass
class Sequence:
    """One sequence in a cache: its id, how many tokens its blocks hold, which blocks."""

    id: int
    length: int = 0
    blocks: list[int] = field(default_factory=list)
    removed: bool = False


class KVCache:
    """The pools of one decoder (`layers` of keys and values) and the sequences in them.

    Not shared between threads: each thread generating at once has its own cache (the
    compiled module itself may be called from several threads)."""

    def __init__(
        self, owner: str, layers: int, kv_heads: int, head_dim: int, context: int,
        dtype: torch.dtype = torch.float32, blocks: int = 8, device: str = "cpu",
    ) -> None:  # fmt: skip
        self.owner, self.layers, self.kv_heads, self.head_dim = owner, layers, kv_heads, head_dim
        self.context, self.dtype, self.device = context, dtype, device
        self.pools = [
            torch.zeros(blocks, kv_heads, BLOCK, head_dim, dtype=dtype, device=device) for _ in range(2 * layers)
        ]
        self.free = list(range(blocks - 1, -1, -1))  # popped from the end: lowest first
        self.sequences: dict[int, Sequence] = {}
        self._next = 0

    @property
    def capacity(self) -> int:
        """Blocks in each pool."""
        return self.pools[0].shape[0]

    def add(self) -> Sequence:
        """A new, empty sequence."""
        seq = Sequence(self._next)
        self._next += 1
        self.sequences[seq.id] = seq
        return seq

    def remove(self, seq: Sequence) -> None:
        """Give a sequence's blocks back; using it again is an error."""
        self.check(seq)
        self.free.extend(reversed(seq.blocks))
        seq.blocks, seq.removed = [], True
        del self.sequences[seq.id]

    def check(self, seq: Sequence) -> None:
        if seq.removed or self.sequences.get(seq.id) is not seq:
            raise CacheError(f"sequence {seq.id} was removed from this cache (or belongs to another cache)")

    def reserve(self, seqs: list[Sequence], new: int) -> None:
        """Blocks for `new` more tokens of each sequence, growing the pools when none are free."""
        for seq in seqs:
            self.check(seq)
            if seq.length + new > self.context:
                raise CacheError(
                    f"sequence {seq.id}: {seq.length} tokens cached + {new} new = {seq.length + new} exceeds the "
                    f"model's context of {self.context} positions"
                )
        need = sum(max(0, -(-(s.length + new) // BLOCK) - len(s.blocks)) for s in seqs)
        if need > len(self.free):
            self._grow(self.capacity - len(self.free) + need)
        for seq in seqs:
            while len(seq.blocks) * BLOCK < seq.length + new:
                seq.blocks.append(self.free.pop())

    def _grow(self, used: int) -> None:
        old = self.capacity
        size = max(2 * old, used)
        for i, p in enumerate(self.pools):
            grown = torch.zeros((size, *p.shape[1:]), dtype=p.dtype, device=p.device)
            grown[:old] = p
            self.pools[i] = grown
        self.free = list(range(size - 1, old - 1, -1)) + self.free

    def table(self, seqs: list[Sequence]) -> tuple[torch.Tensor, torch.Tensor]:
        """(block table [B, M], lengths [B]) of these sequences, int64."""
        width = max(1, max(len(s.blocks) for s in seqs))
        table = torch.zeros(len(seqs), width, dtype=torch.int64)
        for i, s in enumerate(seqs):
            table[i, : len(s.blocks)] = torch.tensor(s.blocks, dtype=torch.int64)
        lengths = torch.tensor([s.length for s in seqs], dtype=torch.int64)
        return table, lengths

    def write(self, seqs: list[Sequence], table: torch.Tensor, lengths: torch.Tensor, kv: list[torch.Tensor]) -> None:
        """Store a step's new keys and values (`[B, Hkv, S, D]` per layer, k then v) after each
        sequence's past, and count them."""
        s = kv[0].shape[2]
        pos = lengths.view(-1, 1) + torch.arange(s, device=lengths.device).view(1, -1)  # [B, S]
        block = torch.gather(table, 1, pos // BLOCK).reshape(-1)
        slot = (pos % BLOCK).reshape(-1)
        for pool, new in zip(self.pools, kv):
            pool[block, :, slot] = new.permute(0, 2, 1, 3).reshape(-1, new.shape[1], new.shape[3]).to(pool.dtype)
        for seq in seqs:
            seq.length += s


def _float_bits(x: float) -> int:
    return struct.unpack("<I", struct.pack("<f", x))[0]


def run_paged_attention(ks, q, k, v, k_pool, v_pool, table, lengths, scale: float, window: int) -> torch.Tensor:
    """`paged_attention` on the library's kernels `ks` (`sf_paged_attention` over float32 keys
    and values, `sf_paged_attention_bf16` over bfloat16 ones: a bf16 program's cache), after
    checking what they will read: a block-table entry outside the pools or a past longer than
    a row of the table would read past the pools' end. A prefill (several new tokens, no past
    in any sequence, no window) is plain causal attention: torch's fused CPU attention, which
    tiles query rows against key blocks as GEMMs, where the kernel reads each key once per row:
    3-4x faster at 512-1,024 tokens (`.venv/bin/python bench/paged_attention.py`)."""
    kinds = {torch.float32: ks.sf_paged_attention, torch.bfloat16: ks.sf_paged_attention_bf16}
    fn = kinds.get(k_pool.dtype)
    if fn is None or v_pool.dtype != k_pool.dtype:
        return paged_attention(q, k, v, k_pool, v_pool, table, lengths, scale, window)
    dtype = q.dtype
    q, k, v = q.float(), k.to(k_pool.dtype), v.to(k_pool.dtype)  # (the new tokens: few)
    b, hq, s, d = q.shape
    hkv, block = k.shape[1], k_pool.shape[2]
    blocks, width = k_pool.shape[0], table.shape[1]
    if b and (int(lengths.min()) < 0 or int(lengths.max()) > width * block):
        raise IndexError(
            f"paged_attention: past lengths {lengths.tolist()} outside [0, {width * block}] (table width x block)"
        )
    if b and table.numel() and (int(table.min()) < 0 or int(table.max()) >= blocks):
        raise IndexError(f"paged_attention: block table holds entries outside [0, {blocks}) (the pools' blocks)")
    if s > 1 and window == 0 and (b == 0 or int(lengths.max()) == 0):  # a prefill: no past to read
        k, v = k.float(), v.float()
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, enable_gqa=hq != hkv).to(dtype)
    return call_kernel(fn, q, k, v, k_pool, v_pool, table, lengths, scale, window).to(dtype)


def kernel_arguments(q, k, v, k_pool, v_pool, table, lengths, scale: float, window: int) -> list[torch.Tensor]:
    """The paged attention kernel's inputs as it reads them: q, k, v with unit stride along the
    head, contiguous pools, int64 table and lengths, then `dims` (sizes, the scale's float bits,
    the strides of q, k and v; `include/sf_paged_attention.h`)."""
    b, hq, s, d = q.shape
    q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
    dims = [b, hq, k.shape[1], s, d, table.shape[1], k_pool.shape[2], window, _float_bits(scale)]
    dims = torch.tensor(dims + [*q.stride()[:3], *k.stride()[:3], *v.stride()[:3]], dtype=torch.int64)
    table, lengths = table.to(torch.int64).contiguous(), lengths.to(torch.int64).contiguous()
    return [q, k, v, k_pool.contiguous(), v_pool.contiguous(), table, lengths, dims]


def call_kernel(fn, q, k, v, k_pool, v_pool, table, lengths, scale: float, window: int) -> torch.Tensor:
    """One call of a paged attention kernel `fn` (float32 queries; keys, values and pools of
    the kernel's type). Nothing checked: `run_paged_attention` checks."""
    *inputs, dims = kernel_arguments(q, k, v, k_pool, v_pool, table, lengths, scale, window)
    out = torch.empty(q.shape, dtype=torch.float32)
    if out.numel():
        fn(*(t.data_ptr() for t in inputs), out.data_ptr(), dims.data_ptr())
    return out
