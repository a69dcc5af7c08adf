"""Choosing the next token from logits: greedy, or sampled with temperature, top-k and top-p
(applied in that order, as transformers' logits warpers are)."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Sampling:
    do_sample: bool = False
    temperature: float = 1.0
    top_k: int = 0  # 0: no limit
    top_p: float = 1.0
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.temperature <= 0:
            raise ValueError(
                f"temperature must be > 0, got {self.temperature} (for greedy decoding leave do_sample off)"
            )
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        self.generator = torch.Generator()
        if self.seed is not None:
            self.generator.manual_seed(self.seed)
        else:
            self.generator.seed()


def choose(logits: torch.Tensor, rule: Sampling) -> torch.Tensor:
    """One token per row of `logits [B, vocab]`."""
    logits = logits.float()
    if not rule.do_sample:
        return logits.argmax(-1)
    logits = logits / rule.temperature
    if rule.top_k and rule.top_k < logits.shape[-1]:
        kth = torch.topk(logits, rule.top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if rule.top_p < 1:
        ordered, order = torch.sort(logits, descending=True, dim=-1)
        mass = ordered.softmax(-1).cumsum(-1)
        drop = mass - ordered.softmax(-1) >= rule.top_p  # keep the smallest set whose mass reaches top_p
        logits = logits.scatter(-1, order, ordered.masked_fill(drop, float("-inf")))
    probs = logits.softmax(-1)
    return torch.multinomial(probs, 1, generator=rule.generator).squeeze(-1)
