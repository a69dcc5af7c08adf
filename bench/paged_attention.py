"""The decoder's attention kernel (`sf_paged_attention`) at decoding and prefill shapes.

For each shape (batch, query heads, kv heads, new tokens, head size, past): the best of five
calls of the compiled kernel (through `runtime/kv.call_kernel`, as the runtime calls it), the
bytes of cache it must read (keys and values of the past, once) and their rate; for prefill
shapes (no past) torch's fused causal attention beside it, which the runtime calls for a
prefill instead (`runtime/kv.run_paged_attention`).

Run: .venv/bin/python bench/paged_attention.py
"""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F

import symfuse
from symfuse.runtime.kv import BLOCK, call_kernel

SHAPES = [  # (B, Hq, Hkv, S, D, past): GPT-2 and TinyLlama heads
    (1, 12, 12, 1, 64, 128), (1, 12, 12, 1, 64, 1024), (8, 12, 12, 1, 64, 512),
    (1, 32, 4, 1, 64, 1024), (8, 32, 4, 1, 64, 1024),
    (1, 12, 12, 512, 64, 0), (8, 12, 12, 512, 64, 0), (1, 32, 4, 1024, 64, 0),
]  # fmt: skip


class Paged(torch.nn.Module):
    def forward(self, q, k, v, k_pool, v_pool, table, lengths):
        return torch.ops.symfuse.paged_attention(q, k, v, k_pool, v_pool, table, lengths, 0.125, 0)


def case(b, hq, hkv, s, d, past):
    width = -(-(past + s) // BLOCK)
    blocks = b * width
    return (torch.randn(b, hq, s, d), torch.randn(b, hkv, s, d), torch.randn(b, hkv, s, d),
            torch.randn(blocks, hkv, BLOCK, d), torch.randn(blocks, hkv, BLOCK, d),
            torch.arange(blocks).view(b, width), torch.full((b,), past))  # fmt: skip


def best_ms(fn, reps: int = 5) -> float:
    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1e3 * min(times)


def main() -> None:
    dyn = {"q": {0: "B", 2: "S"}, "k": {0: "B", 2: "S"}, "v": {0: "B", 2: "S"}, "k_pool": {0: "N"},
           "v_pool": {0: "N"}, "table": {0: "B", 1: "M"}, "lengths": {0: "B"}}  # fmt: skip
    module = symfuse.compile(Paged(), case(2, 12, 12, 3, 64, 5), dyn)
    kernel = module.native.program.kernels.sf_paged_attention
    print("B Hq Hkv S D past | kernel ms | cache GB/s | torch's causal attention ms")
    for b, hq, hkv, s, d, past in SHAPES:
        x = case(b, hq, hkv, s, d, past)
        ms = best_ms(lambda: call_kernel(kernel, *x, 0.125, 0))
        cache = 2 * b * hkv * past * d * 4
        rate = f"{cache / ms / 1e6:.1f}" if past else "-"
        sdpa = ""
        if past == 0:
            q, k, v = x[:3]
            causal = best_ms(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=hq != hkv))
            sdpa = f"{causal:.2f}"
        print(f"{b} {hq} {hkv} {s} {d} {past} | {ms:.2f} | {rate} | {sdpa}")


if __name__ == "__main__":
    main()
