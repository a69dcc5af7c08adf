"""Built-in models for the demo, the tests and the benchmarks.

Every model is built from a config with seeded random weights (no model hub is needed),
with example inputs whose dynamic dims are at least 2 and the `dynamic` spec naming them.
`inputs(binding)` makes random inputs for any binding of the model's symbols.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class ModelCase:
    name: str
    model: torch.nn.Module
    dynamic: dict
    make_inputs: Callable[..., dict[str, Any]]
    example: dict[str, int]  # a binding of the symbols used for capture
    sweep: list[dict[str, int]]  # bindings the tests and the demo run
    limits: dict[str, int]  # largest value of each symbol the model accepts

    def inputs(self, **binding: int) -> dict[str, Any]:
        g = torch.Generator().manual_seed(sum(binding.values()) * 7919 + 17)
        return self.make_inputs(g, **binding)


def _text_inputs(vocab: int, mask: bool):
    def make(g, B: int, S: int) -> dict[str, Any]:
        out = {"input_ids": torch.randint(0, vocab, (B, S), generator=g)}
        if mask:
            m = torch.ones(B, S, dtype=torch.long)
            if S > 1:  # pad the tail of every other row
                m[1::2, S - S // 3 :] = 0
            out["attention_mask"] = m
        return out

    return make


_TEXT_SWEEP = [
    dict(B=1, S=1),
    dict(B=1, S=16),
    dict(B=2, S=7),
    dict(B=3, S=33),
    dict(B=1, S=128),
    dict(B=4, S=64),
    dict(B=8, S=31),
    dict(B=1, S=512),
]


def _text_dynamic(mask: bool) -> dict:
    d = {"input_ids": {0: "B", 1: "S"}}
    if mask:
        d["attention_mask"] = {0: "B", 1: "S"}
    return d


def bert(layers: int = 12, hidden: int = 768, heads: int = 12, ffn: int = 3072, name: str = "bert-base") -> ModelCase:
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    cfg = BertConfig(num_hidden_layers=layers, hidden_size=hidden, num_attention_heads=heads, intermediate_size=ffn)
    m = BertModel(cfg).eval()
    return ModelCase(
        name, m, _text_dynamic(True), _text_inputs(cfg.vocab_size, True), dict(B=2, S=8), _TEXT_SWEEP, {"S": 512}
    )


class SentenceEmbedder(torch.nn.Module):
    """A sentence-embedding model as sentence-transformers runs it: a BERT encoder, the mean of
    its token states over the attention mask, L2-normalised."""

    def __init__(self, encoder: torch.nn.Module) -> None:
        super().__init__()
        self.encoder = encoder

    def forward(self, input_ids, attention_mask):
        states = self.encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        m = attention_mask.unsqueeze(-1).to(states.dtype)
        mean = (states * m).sum(1) / m.sum(1).clamp(min=1e-9)
        return torch.nn.functional.normalize(mean, p=2.0, dim=1)


def minilm() -> ModelCase:
    """all-MiniLM-L6-v2's architecture (6 layers, 384 wide, 12 heads) with seeded random weights."""
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    cfg = BertConfig(num_hidden_layers=6, hidden_size=384, num_attention_heads=12, intermediate_size=1536)
    m = SentenceEmbedder(BertModel(cfg, add_pooling_layer=False)).eval()
    return ModelCase(
        "minilm", m, _text_dynamic(True), _text_inputs(cfg.vocab_size, True), dict(B=2, S=8), _TEXT_SWEEP, {"S": 512}
    )


def gpt2(layers: int = 12, hidden: int = 768, heads: int = 12, name: str = "gpt2") -> ModelCase:
    from transformers import GPT2Config, GPT2Model

    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=layers, n_embd=hidden, n_head=heads)
    m = GPT2Model(cfg).eval()
    make_text = _text_inputs(cfg.vocab_size, False)

    def make(g, B, S):
        return {**make_text(g, B, S), "use_cache": False}

    return ModelCase(name, m, _text_dynamic(False), make, dict(B=2, S=8), _TEXT_SWEEP, {"S": cfg.n_positions})


def t5_encoder(
    layers: int = 4, hidden: int = 256, heads: int = 4, ffn: int = 1024, name: str = "t5-encoder-small"
) -> ModelCase:
    from transformers import T5Config, T5EncoderModel

    torch.manual_seed(0)
    cfg = T5Config(num_layers=layers, d_model=hidden, num_heads=heads, d_kv=hidden // heads, d_ff=ffn)
    m = T5EncoderModel(cfg).eval()
    return ModelCase(name, m, _text_dynamic(True), _text_inputs(cfg.vocab_size, True), dict(B=2, S=8), _TEXT_SWEEP, {})


def vit(
    layers: int = 12, hidden: int = 768, heads: int = 12, ffn: int = 3072, image: int = 224, name: str = "vit-base"
) -> ModelCase:
    from transformers import ViTConfig, ViTModel

    torch.manual_seed(0)
    cfg = ViTConfig(
        num_hidden_layers=layers, hidden_size=hidden, num_attention_heads=heads, intermediate_size=ffn, image_size=image
    )
    m = ViTModel(cfg, add_pooling_layer=True).eval()

    def make(g, B):
        return {"pixel_values": torch.randn(B, 3, image, image, generator=g)}

    sweep = [dict(B=b) for b in (1, 2, 3, 4, 5, 7, 8, 16)]
    return ModelCase(name, m, {"pixel_values": {0: "B"}}, make, dict(B=2), sweep, {})


class ConvNet(torch.nn.Module):
    """A small ResNet-style network: conv, batch norm, relu, residual add, pools, linear."""

    def __init__(self, width: int = 32, classes: int = 10) -> None:
        super().__init__()
        nn = torch.nn
        self.stem = nn.Sequential(nn.Conv2d(3, width, 3, padding=1, bias=False), nn.BatchNorm2d(width), nn.ReLU())
        self.pool = nn.MaxPool2d(2)
        self.block = nn.Sequential(
            nn.Conv2d(width, width, 3, padding=1, bias=False), nn.BatchNorm2d(width), nn.ReLU(),
            nn.Conv2d(width, width, 3, padding=1, bias=False), nn.BatchNorm2d(width),
        )  # fmt: skip
        self.down = nn.Sequential(
            nn.Conv2d(width, 2 * width, 3, stride=2, padding=1), nn.BatchNorm2d(2 * width), nn.ReLU()
        )
        self.avg = nn.AvgPool2d(2)
        self.head = nn.Linear(2 * width, classes)

    def forward(self, x):
        x = self.pool(self.stem(x))
        x = torch.relu(x + self.block(x))
        x = self.avg(self.down(x))
        x = torch.nn.functional.adaptive_avg_pool2d(x, 1)
        return self.head(torch.flatten(x, 1))


def resnet(name: str = "resnet") -> ModelCase:
    torch.manual_seed(0)
    m = ConvNet().eval()
    for mod in m.modules():  # non-trivial batch-norm statistics
        if isinstance(mod, torch.nn.BatchNorm2d):
            mod.running_mean.uniform_(-0.5, 0.5)
            mod.running_var.uniform_(0.5, 2.0)

    def make(g, B, H):
        return {"x": torch.randn(B, 3, H, H, generator=g)}

    sweep = [dict(B=1, H=8), dict(B=2, H=13), dict(B=1, H=16), dict(B=3, H=31), dict(B=2, H=64), dict(B=1, H=97)]
    sweep += [dict(B=8, H=7), dict(B=5, H=48)]
    return ModelCase(name, m, {"x": {0: "B", 2: "H", 3: "H"}}, make, dict(B=2, H=32), sweep, {})


class LSTMNet(torch.nn.Module):
    def __init__(self, features: int = 32, hidden: int = 64, layers: int = 2) -> None:
        super().__init__()
        self.lstm = torch.nn.LSTM(features, hidden, num_layers=layers, batch_first=True)
        self.head = torch.nn.Linear(hidden, 8)

    def forward(self, x):
        out, (h, c) = self.lstm(x)
        return self.head(out), h


def lstm(name: str = "lstm") -> ModelCase:
    torch.manual_seed(0)
    m = LSTMNet().eval()

    def make(g, B, T):
        return {"x": torch.randn(B, T, 32, generator=g)}

    sweep = [dict(B=1, T=1), dict(B=2, T=7), dict(B=1, T=16), dict(B=3, T=31), dict(B=4, T=64)]
    sweep += [dict(B=8, T=2), dict(B=5, T=13), dict(B=1, T=128)]
    return ModelCase(name, m, {"x": {0: "B", 1: "T"}}, make, dict(B=2, T=5), sweep, {})


BUILTIN: dict[str, Callable[[], ModelCase]] = {
    "bert-base": bert,
    "bert-small": lambda: bert(layers=4, hidden=256, heads=4, ffn=1024, name="bert-small"),
    "gpt2": gpt2,
    "minilm": minilm,
    "vit-base": vit,
    "t5-encoder-small": t5_encoder,
    "resnet": resnet,
    "lstm": lstm,
}


def export_onnx(case: ModelCase, path: str) -> list[str]:
    """Write `case`'s model to `path` as ONNX with its dynamic dims as named axes (`B`,
    `S`, ...); returns the ONNX input names.

    The torch.export-based exporter comes first; where it fails (its decompositions break
    on some models, T5 among them) the TorchScript exporter is tried, with the same axes.
    """
    import logging
    import sys
    import warnings

    from torch.export import Dim

    example = case.inputs(**case.example)
    tensors = {k: v for k, v in example.items() if isinstance(v, torch.Tensor)}
    names: dict[str, Any] = {}
    dyn: dict[str, Any] = {k: None for k in example}
    for k in tensors:
        dyn[k] = {d: names.setdefault(str(s), Dim(str(s))) for d, s in case.dynamic.get(k, {}).items()}
    quiet = logging.getLogger("torch.onnx"), logging.getLogger("onnxscript")
    levels = [q.level for q in quiet]
    for q in quiet:
        q.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                prog = torch.onnx.export(case.model, (), kwargs=example, dynamic_shapes=dyn, dynamo=True, verbose=False)
                prog.save(path)
            except Exception as first:  # noqa: BLE001
                print(f"torch.export-based ONNX export failed ({type(first).__name__}); trying the TorchScript "
                      "exporter", file=sys.stderr)  # fmt: skip
                axes = {k: {d: str(s) for d, s in case.dynamic.get(k, {}).items()} for k in tensors}
                torch.onnx.export(
                    case.model, (), path, kwargs=tensors, input_names=list(tensors), dynamic_axes=axes,
                    dynamo=False, opset_version=17,
                )  # fmt: skip
    finally:
        for q, lv in zip(quiet, levels):
            q.setLevel(lv)
    return list(tensors)


def load(name: str) -> ModelCase:
    try:
        return BUILTIN[name]()
    except KeyError:
        raise ValueError(f"unknown model {name!r}; built-in models: {', '.join(BUILTIN)}") from None


# -- decoders: causal LMs for `symfuse generate` and `symfuse bench --task generate` -----------


def _seeded(make):
    torch.manual_seed(0)
    return make().eval()


def gpt2_decoder(layers: int = 12, hidden: int = 768, heads: int = 12, vocab: int = 50257) -> torch.nn.Module:
    """GPT-2 (124M at the defaults): learned positions, 1,024 of them."""
    from transformers import GPT2Config, GPT2LMHeadModel

    return _seeded(lambda: GPT2LMHeadModel(GPT2Config(n_layer=layers, n_embd=hidden, n_head=heads, vocab_size=vocab)))


def llama_decoder(
    layers: int = 22, hidden: int = 2048, heads: int = 32, kv_heads: int = 4, ffn: int = 5632, vocab: int = 32000
) -> torch.nn.Module:
    """A Llama (TinyLlama's 1.1B shape at the defaults): RoPE, RMSNorm, SwiGLU, grouped-query
    attention (8 query heads per kv head), 2,048 positions."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        num_hidden_layers=layers, hidden_size=hidden, num_attention_heads=heads, num_key_value_heads=kv_heads,
        intermediate_size=ffn, vocab_size=vocab, max_position_embeddings=2048, tie_word_embeddings=False,
    )  # fmt: skip
    return _seeded(lambda: LlamaForCausalLM(config))


DECODERS: dict[str, Callable[[], torch.nn.Module]] = {
    "gpt2": gpt2_decoder,
    "tinyllama": llama_decoder,
    "gpt2-tiny": lambda: gpt2_decoder(layers=2, hidden=128, heads=4, vocab=1000),
    "llama-tiny": lambda: llama_decoder(layers=2, hidden=128, heads=8, kv_heads=2, ffn=256, vocab=1000),
}


def load_decoder(name: str) -> torch.nn.Module:
    try:
        return DECODERS[name]()
    except KeyError:
        raise ValueError(f"unknown decoder {name!r}; built-in decoders: {', '.join(DECODERS)}") from None
