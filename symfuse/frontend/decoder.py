"""Capturing a `transformers` causal LM as one decoding step over a paged key/value cache.

The model's own code runs under torch.export with two things swapped in:
- its attention function (transformers' attention interface, as vLLM and TGI plug in
  theirs) calls `symfuse::paged_attention`, which reads the past through the cache's block
  table and attends causally over past and new tokens; no mask is built;
- its cache is a recorder: `update` hands back the new keys and values unchanged and keeps
  them, and the step returns them for the runtime to write into the cache.

The step takes `input_ids [B, S]`, `position_ids [B, S]`, the block table `[B, M]`, the
past lengths `[B]` and one pool `[N, Hkv, BLOCK, D]` per layer for keys and one for values;
it returns the last position's logits `[B, 1, V]` and each layer's new keys and values
`[B, Hkv, S, D]`. B, S, M and N are symbols: prefill (no past, any S) and decode (S = 1,
any past) are the same program, compiled once.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from symfuse.errors import CaptureError
from symfuse.frontend import paged as _paged  # noqa: F401  (registers symfuse::paged_attention)
from symfuse.frontend.torch_export import Captured, capture
from symfuse.runtime import kv as _kv
from symfuse.runtime.decoder import DecoderSpec

ATTENTION = "symfuse_paged"


@dataclass
class _Step:
    """What the attention function reads while the step is traced."""

    pools: tuple[torch.Tensor, ...] = ()
    table: torch.Tensor | None = None
    lengths: torch.Tensor | None = None


_STEP = _Step()


def _attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """transformers' attention interface: `[B, H, S, D]` in, `[B, S, H, D]` out."""
    for name in ("softcap", "s_aux", "sinks"):
        if kwargs.get(name) is not None:
            raise CaptureError(f"symfuse's decoder attention does not support `{name}` yet ({type(module).__name__})")
    i = module.layer_idx
    scale = float(scaling) if scaling is not None else query.shape[-1] ** -0.5
    window = int(kwargs.get("sliding_window") or 0)
    out = torch.ops.symfuse.paged_attention(
        query, key, value, _STEP.pools[2 * i], _STEP.pools[2 * i + 1], _STEP.table, _STEP.lengths, scale, window
    )
    return out.transpose(1, 2), None


def _register() -> None:
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    if ATTENTION not in ALL_ATTENTION_FUNCTIONS:
        ALL_ATTENTION_FUNCTIONS.register(ATTENTION, _attention)


def _recorder(layers: int):
    from transformers.cache_utils import Cache

    class Recorder(Cache):
        """A cache that keeps each layer's new keys and values and hands them back as they are."""

        def __init__(self) -> None:  # (Cache's own __init__ builds layers this one does not have)
            self.layers = []
            self.new: list = [None] * layers

        def update(self, key_states, value_states, layer_idx, *args, **kwargs):
            self.new[layer_idx] = (key_states, value_states)
            return key_states, value_states

        def get_seq_length(self, layer_idx: int = 0) -> int:
            return 0

        @property
        def is_compileable(self) -> bool:
            return False

    return Recorder()


class DecoderStep(torch.nn.Module):
    """One decoding step of `model` over the paged cache (see the module's docstring)."""

    def __init__(self, model: torch.nn.Module, layers: int) -> None:
        super().__init__()
        self.model, self.layers = model, layers

    def forward(self, input_ids, position_ids, table, lengths, *pools):
        _STEP.pools, _STEP.table, _STEP.lengths = pools, table, lengths
        cache = _recorder(self.layers)
        try:
            out = self.model(
                input_ids=input_ids, position_ids=position_ids, cache=cache, use_cache=True, logits_to_keep=1
            )
        finally:
            _STEP.pools, _STEP.table, _STEP.lengths = (), None, None
        missing = [i for i, kv in enumerate(cache.new) if kv is None]
        if missing:
            raise CaptureError(f"layers {missing} of {type(self.model).__name__} never wrote to the cache")
        return (out.logits, *[t for kv in cache.new for t in kv])


def is_causal_lm(model) -> bool:
    """A `transformers` model that generates text with a cache of its own (GPT-2, Llama, ...)."""
    try:
        from transformers import GenerationMixin
    except ImportError:
        return False
    config = getattr(model, "config", None)
    name = type(model).__name__
    return (
        isinstance(model, GenerationMixin)
        and config is not None
        and not getattr(config, "is_encoder_decoder", False)
        and (name.endswith("ForCausalLM") or name.endswith("LMHeadModel"))
    )


def generates(model, example_inputs) -> bool:
    """Compile `model` as a decoder: a causal LM whose example (if any) leaves its cache on."""
    if not is_causal_lm(model):
        return False
    if example_inputs is None:
        return True
    return isinstance(example_inputs, dict) and example_inputs.get("use_cache", True) is not False


@contextlib.contextmanager
def _attention_swapped(model) -> Iterator[None]:
    _register()
    configs = {id(m.config): m.config for m in model.modules() if hasattr(m, "config")}
    before = {k: c._attn_implementation for k, c in configs.items()}
    try:
        for c in configs.values():
            c._attn_implementation = ATTENTION
        yield
    finally:
        for k, c in configs.items():
            c._attn_implementation = before[k]


def _layers(config) -> int:
    layers = getattr(config, "num_hidden_layers", None)
    if not isinstance(layers, int):
        raise CaptureError(f"{type(config).__name__} does not say how many layers the model has (num_hidden_layers)")
    return layers


def _context(config) -> int:
    for name in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        n = getattr(config, name, None)
        if isinstance(n, int) and n > 0:
            return n
    raise CaptureError(f"{type(config).__name__} does not say the model's context length (max_position_embeddings)")


def _eos(model) -> list[int]:
    for source in (getattr(model, "generation_config", None), model.config):
        eos = getattr(source, "eos_token_id", None)
        if eos is not None:
            return [int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos])]
    return []


def capture_decoder(model: torch.nn.Module, cache_dtype: torch.dtype = torch.float32) -> tuple[Captured, DecoderSpec]:
    """The decoding step of a causal LM as a symfuse graph, and what the runtime needs to
    drive it (layers, kv heads, head size, vocabulary, context, end-of-sequence tokens);
    `cache_dtype`: the pools' (a half-precision program keeps its cache in its own)."""
    config = model.config
    layers, context = _layers(config), _context(config)
    step = DecoderStep(model, layers).eval()
    b, s, m = 2, 3, 2
    vocab = int(getattr(config, "vocab_size", 2) or 2)
    ids = torch.randint(0, vocab, (b, s), generator=torch.Generator().manual_seed(0))
    with _attention_swapped(model), torch.no_grad():
        hkv, d = _probe(step, ids, [torch.zeros(1, 1, _kv.BLOCK, 1)] * (2 * layers))  # (from a first, eager step)
        pools = [torch.zeros(4, hkv, _kv.BLOCK, d, dtype=cache_dtype) for _ in range(2 * layers)]
        example = (ids, torch.arange(s).repeat(b, 1), torch.zeros(b, m, dtype=torch.int64),
                   torch.zeros(b, dtype=torch.int64), *pools)  # fmt: skip
        dynamic = {"input_ids": {0: "B", 1: "S"}, "position_ids": {0: "B", 1: "S"}, "table": {0: "B", 1: "M"},
                   "lengths": {0: "B"}, **{f"pools_{i}": {0: "N"} for i in range(2 * layers)}}  # fmt: skip
        captured = capture(step, example, dynamic)
    captured.graph.name = type(model).__name__
    spec = DecoderSpec(
        model=type(model).__name__,
        layers=layers,
        kv_heads=hkv,
        head_dim=d,
        vocab=int(captured.graph.outputs[0].type.shape[-1]),
        context=context,
        eos=_eos(model),
        cache_dtype=str(cache_dtype).removeprefix("torch."),
    )
    return captured, spec


def _probe(step: DecoderStep, ids: torch.Tensor, pools: list[torch.Tensor]) -> tuple[int, int]:
    """(kv heads, head size): one eager step with no past, its new keys' shape."""
    b, s = ids.shape
    out = step(ids, torch.arange(s).repeat(b, 1), torch.zeros(b, 1, dtype=torch.int64),
               torch.zeros(b, dtype=torch.int64), *pools)  # fmt: skip
    return int(out[1].shape[1]), int(out[1].shape[3])
