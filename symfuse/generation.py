"""A compiled decoder as a `transformers` model: `generate`, pipelines and streamers unchanged.

    lm = symfuse.ForCausalLM.from_model(model)      # or ForCausalLM(symfuse.load(path), config)
    lm.generate(input_ids, max_new_tokens=32, do_sample=True, top_p=0.9)
    pipeline("text-generation", model=lm, tokenizer=tokenizer)

transformers' generation loop (its logits processors, stopping criteria, streamers) calls
`forward`; the key/value cache is symfuse's, one per `generate` call: the first call of a
generation prefills every row's real tokens (those its attention mask keeps: left padding
is dropped, not computed), and each later call feeds the new tokens after them. The cache
travels in transformers' `cache` slot, as optimum's ONNX Runtime and OpenVINO models do.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from transformers import GenerationConfig, GenerationMixin, PretrainedConfig, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutputWithPast

from symfuse.runtime.decoder import Decoder
from symfuse.runtime.kv import KVCache, Sequence


class Session:
    """symfuse's cache for one `generate` call: its sequences and how many tokens of each row
    of `input_ids` they hold."""

    def __init__(self, decoder: Decoder, rows: int) -> None:
        self.cache: KVCache = decoder.new_cache()
        self.seqs: list[Sequence] = [self.cache.add() for _ in range(rows)]
        self.seen = 0  # columns of input_ids already fed

    def get_seq_length(self, layer_idx: int = 0) -> int:  # (what transformers may ask a cache)
        return self.seen


class ForCausalLM(PreTrainedModel, GenerationMixin):
    """A symfuse `Decoder` behind transformers' causal-LM interface."""

    config_class = PretrainedConfig
    main_input_name = "input_ids"
    base_model_prefix = "symfuse"
    _supports_cache_class = True
    _supports_sdpa = True  # (transformers checks the attention it would pick; symfuse's is compiled in)

    def __init__(self, decoder: Decoder, config: PretrainedConfig, generation_config: GenerationConfig | None = None):
        super().__init__(copy.deepcopy(config))
        self.decoder = decoder
        if generation_config is not None:
            self.generation_config = generation_config

    @classmethod
    def from_model(cls, model: torch.nn.Module, **options) -> ForCausalLM:
        """Compile a transformers causal LM (`symfuse.compile`) and wrap it."""
        from symfuse.api import compile as compile_model

        decoder = compile_model(model, **options)
        return cls(decoder, model.config, getattr(model, "generation_config", None))

    @property
    def device(self) -> torch.device:  # (the weights live in the compiled program, not in parameters)
        return self.decoder.device

    @property
    def dtype(self) -> torch.dtype:
        return torch.float32

    def can_generate(self) -> bool:  # noqa: D102
        return True

    def get_output_embeddings(self):  # (transformers asks; the weights live in the compiled program)
        return None

    def prepare_inputs_for_generation(self, input_ids, cache=None, attention_mask=None, **kwargs) -> dict[str, Any]:
        return {"input_ids": input_ids, "cache": cache, "attention_mask": attention_mask}

    def forward(
        self, input_ids: torch.Tensor, cache: Any = None, attention_mask: torch.Tensor | None = None, **kwargs
    ) -> CausalLMOutputWithPast:
        session = cache if isinstance(cache, Session) else None
        if session is None or session.seen > input_ids.shape[1] or len(session.seqs) != input_ids.shape[0]:
            session = Session(self.decoder, input_ids.shape[0])
        new = input_ids[:, session.seen :]
        if session.seen == 0:  # prefill: each row's real tokens
            keep = attention_mask.bool() if attention_mask is not None else torch.ones_like(new, dtype=torch.bool)
            prompts = [row[k].tolist() for row, k in zip(new, keep)]
            logits = self.decoder.prefill(session.cache, session.seqs, prompts)
        else:
            logits = torch.empty(new.shape[0], self.decoder.spec.vocab, device=self.decoder.device)
            for t in range(new.shape[1]):
                logits = self.decoder.forward(session.cache, session.seqs, new[:, t : t + 1])
        session.seen = input_ids.shape[1]
        return CausalLMOutputWithPast(logits=logits[:, None, :], cache=session)
