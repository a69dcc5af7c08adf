"""A compiled decoder: one step program, its key/value cache, and the generation loop.

`Decoder` drives the step that `symfuse.frontend.decoder` captured: it prefills each new
sequence's prompt, then decodes all live sequences together one token at a time, each at
its own past length (no padding to the longest), choosing tokens by `sampling`. It needs
neither the compiler nor `transformers`: a saved decoder loads and generates with the
runtime alone.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from symfuse.runtime.kv import CacheError, KVCache, Sequence
from symfuse.runtime.sampling import Sampling, choose

SPEC_FILE = "decoder.json"


@dataclass(frozen=True)
class DecoderSpec:
    """What the runtime needs to drive a captured step."""

    model: str  # the model's class, for messages
    layers: int
    kv_heads: int
    head_dim: int
    vocab: int
    context: int  # positions the model has (prompt plus new tokens)
    eos: list[int] = field(default_factory=list)
    cache_dtype: str = "float32"  # the cache's (the program's storage: bfloat16 in a bf16 program)

    @property
    def fingerprint(self) -> str:
        return f"{self.model}:{self.layers}x{self.kv_heads}x{self.head_dim}:{self.vocab}:{self.context}"


@dataclass
class Timings:
    """One `generate` call: time to the first token, then each decoding step (seconds)."""

    first_token: float = 0.0
    steps: list[float] = field(default_factory=list)
    prompt_tokens: int = 0
    new_tokens: int = 0

    @property
    def seconds(self) -> float:
        return self.first_token + sum(self.steps)

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.seconds if self.seconds else 0.0


class Decoder:
    """A causal LM compiled once for every batch, prompt length and past length.

    `step` is the compiled program (a `CompiledModule`); `spec` its shape of model."""

    def __init__(self, step: Any, spec: DecoderSpec) -> None:
        self.step, self.spec = step, spec
        self.device = torch.device(getattr(step.options, "device", None) or "cpu")  # where the step runs
        self.cache_dtype = getattr(torch, spec.cache_dtype)
        self.last = Timings()  # the last generate call's timings

    def __repr__(self) -> str:
        s = self.spec
        return (
            f"<symfuse.Decoder {s.model} layers={s.layers} kv_heads={s.kv_heads} head_dim={s.head_dim} "
            f"context={s.context} backend='{self.step.backend}'>"
        )

    # -- the cache ----------------------------------------------------------------------------
    def new_cache(self, blocks: int = 8) -> KVCache:
        """An empty cache for this decoder (pools of `blocks` blocks that grow when full)."""
        s = self.spec
        return KVCache(
            s.fingerprint, s.layers, s.kv_heads, s.head_dim, s.context, self.cache_dtype, blocks, self.device
        )

    def _own(self, cache: KVCache) -> None:
        if not isinstance(cache, KVCache):
            raise CacheError(f"expected a symfuse KVCache, got {type(cache).__name__}")
        if cache.owner != self.spec.fingerprint:
            raise CacheError(f"this cache was made for {cache.owner}, not for this decoder ({self.spec.fingerprint})")
        if cache.dtype != self.cache_dtype:
            raise CacheError(f"this cache holds {cache.dtype}; this decoder's program reads {self.cache_dtype}")

    # -- one step -----------------------------------------------------------------------------
    def forward(self, cache: KVCache, seqs: list[Sequence], ids: torch.Tensor) -> torch.Tensor:
        """Run `ids [B, S]` (S new tokens of each sequence, all sequences the same S) after each
        sequence's past, store their keys and values, and return the last position's logits
        `[B, vocab]`."""
        self._own(cache)
        if ids.dim() != 2 or ids.shape[0] != len(seqs) or ids.shape[1] < 1:
            raise ValueError(f"input_ids: expected [{len(seqs)}, S >= 1] (one row per sequence), got {list(ids.shape)}")
        lo, hi = (int(ids.min()), int(ids.max())) if ids.numel() else (0, 0)
        if lo < 0 or hi >= self.spec.vocab:
            bad = hi if hi >= self.spec.vocab else lo
            raise ValueError(f"input_ids: token {bad} is outside the vocabulary [0, {self.spec.vocab})")
        s = ids.shape[1]
        cache.reserve(seqs, s)
        table, lengths = (t.to(self.device) for t in cache.table(seqs))
        positions = lengths.view(-1, 1) + torch.arange(s, device=self.device).view(1, -1)
        out = self.step(ids.to(self.device, torch.int64), positions, table, lengths, *cache.pools)
        cache.write(seqs, table, lengths, list(out[1:]))
        return out[0][:, -1]

    def prefill(self, cache: KVCache, seqs: list[Sequence], prompts: list[list[int]]) -> torch.Tensor:
        """Each sequence's prompt, prompts of one length together; the last logits `[B, vocab]`."""
        logits = torch.empty(len(seqs), self.spec.vocab, device=self.device)
        by_length: dict[int, list[int]] = {}
        for i, p in enumerate(prompts):
            if not p:
                raise ValueError(f"prompt {i} is empty: give at least one token")
            by_length.setdefault(len(p), []).append(i)
        for rows in by_length.values():
            ids = torch.tensor([prompts[i] for i in rows], dtype=torch.int64)
            logits[rows] = self.forward(cache, [seqs[i] for i in rows], ids)
        return logits

    # -- generation ---------------------------------------------------------------------------
    def generate(
        self,
        input_ids: torch.Tensor | Iterable[Iterable[int]],
        max_new_tokens: int = 32,
        *,
        do_sample: bool = False,
        temperature: float = 1.0,
        top_k: int = 0,
        top_p: float = 1.0,
        eos_token_id: int | list[int] | None = None,
        pad_token_id: int | None = None,
        seed: int | None = None,
        streamer: Any = None,
        on_token: Callable[[int, int], Any] | None = None,
        cache: KVCache | None = None,
    ) -> torch.Tensor | list[list[int]]:
        """Prompt plus generated tokens of each sequence.

        input_ids: `[B, T]` (a tensor: the result is a `[B, T + n]` tensor, sequences that
            ended early padded with `pad_token_id`) or a list of prompts of any lengths (the
            result is a list of token lists).
        Greedy by default; `do_sample` samples with `temperature`, `top_k`, `top_p` (applied
        in that order, as transformers does), from `seed` when given. A sequence ends at an
        end-of-sequence token (`eos_token_id`, by default the model's) or after
        `max_new_tokens`. `streamer`: an object with `put(tokens)` and `end()`
        (transformers' streamers); `on_token(sequence index, token)`: called for each token.
        `cache`: generate in this cache (its other sequences are left alone); by default a
        new one. Sequences this call added are removed from the cache when it returns or
        fails, so a cancelled call leaves cache and decoder usable.
        """
        as_tensor = isinstance(input_ids, torch.Tensor)
        if as_tensor:
            input_ids = input_ids.unsqueeze(0) if input_ids.dim() == 1 else input_ids
            if input_ids.dim() != 2:
                raise ValueError(f"input_ids: expected [batch, tokens], got {list(input_ids.shape)}")
            input_ids = input_ids.tolist()
        prompts = [[int(t) for t in row] for row in input_ids]
        if max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
        for i, p in enumerate(prompts):
            if len(p) + max_new_tokens > self.spec.context:
                raise ValueError(
                    f"prompt {i}: {len(p)} tokens + max_new_tokens {max_new_tokens} = {len(p) + max_new_tokens} "
                    f"exceeds the model's context of {self.spec.context} positions"
                )
        eos = set(
            self.spec.eos if eos_token_id is None else [eos_token_id] if isinstance(eos_token_id, int) else eos_token_id
        )
        rule = Sampling(do_sample, temperature, top_k, top_p, seed)
        cache = cache if cache is not None else self.new_cache()
        self._own(cache)
        seqs = [cache.add() for _ in prompts]
        outs = [list(p) for p in prompts]
        timings = Timings(prompt_tokens=sum(map(len, prompts)))
        try:
            if streamer is not None and len(prompts) == 1:
                streamer.put(torch.tensor([prompts[0]]))
            live = list(range(len(prompts)))
            if max_new_tokens:
                t0 = time.perf_counter()
                logits = self.prefill(cache, seqs, prompts)
                timings.first_token = time.perf_counter() - t0
            for n in range(max_new_tokens):
                if n:
                    t0 = time.perf_counter()
                    ids = torch.tensor([[outs[i][-1]] for i in live], dtype=torch.int64)
                    logits = self.forward(cache, [seqs[i] for i in live], ids)
                    timings.steps.append(time.perf_counter() - t0)
                tokens = choose(logits, rule)
                still = []
                for row, i in enumerate(live):
                    t = int(tokens[row])
                    outs[i].append(t)
                    timings.new_tokens += 1
                    if on_token is not None:
                        on_token(i, t)
                    if t not in eos:
                        still.append((row, i))
                if streamer is not None and len(prompts) == 1:
                    streamer.put(torch.tensor([outs[0][-1]]))
                for i in set(live) - {i for _, i in still}:  # finished sequences give their blocks back now
                    cache.remove(seqs[i])
                keep = [row for row, _ in still]
                live = [i for _, i in still]
                if not live:
                    break
                logits = logits[keep]
        finally:
            for seq in seqs:
                if not seq.removed:
                    cache.remove(seq)
            if streamer is not None:
                streamer.end()
            self.last = timings
        if not as_tensor:
            return outs
        width = max(map(len, outs))
        pad = pad_token_id if pad_token_id is not None else (min(eos) if eos else 0)
        return torch.tensor([o + [pad] * (width - len(o)) for o in outs], dtype=torch.int64)

    # -- the artifact -------------------------------------------------------------------------
    def save(self, path: str) -> str:
        """Write the decoder to folder `path`; `symfuse.load(path)` gives it back, without the
        model's code or transformers."""
        self.step.save(path)
        with open(os.path.join(path, SPEC_FILE), "w") as f:
            json.dump(asdict(self.spec), f, indent=1)
        return path


def read_spec(path: str) -> DecoderSpec | None:
    """The decoder spec saved in folder `path`, None where it holds an encoder's module."""
    file = os.path.join(path, SPEC_FILE)
    if not os.path.exists(file):
        return None
    with open(file) as f:
        return DecoderSpec(**json.load(f))
