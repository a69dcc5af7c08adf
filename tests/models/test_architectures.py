"""The transformers architectures users deploy, built from small configs with seeded random
weights: each compiled once with dynamic batch and sequence length, then compared with eager
at several shapes (1, primes, a multiple of 16), padded tails included where the model
takes a mask. They cover ops the built-in models do not use: DeBERTa's masked_fill,
BLOOM's baddbmm with alpha and ALiBi, BART's shifted decoder tokens (slice and select
scatters), rotary embeddings and grouped-query attention (Llama, Mistral, Qwen2, Gemma),
parallel attention (GPT-NeoX, Phi, Falcon), GPT-J's interleaved rotary embedding
(repeat_interleave), OPT's and ALBERT's projections; speech encoders' conv1d, group norm
and weight norm (wav2vec 2.0, Whisper).
"""

import pytest
import torch

import symfuse
from tests.conftest import rel_err

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.models

_SMALL = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128)
_GQA = dict(_SMALL, num_key_value_heads=2)
_BART = dict(
    d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
    encoder_ffn_dim=128, decoder_ffn_dim=128,
)  # fmt: skip

# name: (config class, model class, takes an attention mask, config arguments)
ARCHITECTURES = {
    "distilbert": ("DistilBertConfig", "DistilBertModel", True, dict(dim=64, n_layers=2, n_heads=4, hidden_dim=128)),
    "roberta": ("RobertaConfig", "RobertaModel", True, _SMALL),
    "albert": ("AlbertConfig", "AlbertModel", True, dict(_SMALL, embedding_size=32)),
    "electra": ("ElectraConfig", "ElectraModel", True, dict(_SMALL, embedding_size=32)),
    "deberta-v2": ("DebertaV2Config", "DebertaV2Model", True, _SMALL),
    "mpnet": ("MPNetConfig", "MPNetModel", True, _SMALL),
    "bart": ("BartConfig", "BartModel", True, _BART),
    "opt": ("OPTConfig", "OPTModel", True, dict(_SMALL, ffn_dim=128, word_embed_proj_dim=64)),
    "bloom": ("BloomConfig", "BloomModel", True, dict(hidden_size=64, n_layer=2, n_head=4)),
    "llama": ("LlamaConfig", "LlamaModel", False, _GQA),
    "mistral": ("MistralConfig", "MistralModel", False, _GQA),
    "qwen2": ("Qwen2Config", "Qwen2Model", False, _GQA),
    "gemma": ("GemmaConfig", "GemmaModel", False, dict(_GQA, head_dim=16)),
    "gpt-neox": ("GPTNeoXConfig", "GPTNeoXModel", False, _SMALL),
    "phi": ("PhiConfig", "PhiModel", False, _SMALL),
    "qwen3": ("Qwen3Config", "Qwen3Model", False, dict(_GQA, head_dim=16)),
    "falcon": ("FalconConfig", "FalconModel", False, dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4)),
    "gptj": ("GPTJConfig", "GPTJModel", False, dict(n_embd=64, n_layer=2, n_head=4, rotary_dim=8)),
    "codegen": ("CodeGenConfig", "CodeGenModel", False, dict(n_embd=64, n_layer=2, n_head=4, rotary_dim=8)),
    "gpt-bigcode": ("GPTBigCodeConfig", "GPTBigCodeModel", False, dict(n_embd=64, n_layer=2, n_head=4)),
}


def _case(name):
    config_cls, model_cls, mask, kwargs = ARCHITECTURES[name]
    torch.manual_seed(0)
    cfg = getattr(transformers, config_cls)(**kwargs)
    model = getattr(transformers, model_cls)(cfg).eval()

    def inputs(b, s, seed=0):
        g = torch.Generator().manual_seed(seed)
        x = {"input_ids": torch.randint(0, min(cfg.vocab_size, 1000), (b, s), generator=g)}
        if mask:
            m = torch.ones(b, s, dtype=torch.long)
            m[0, s - s // 3 :] = 0  # the first sentence's last third is padding
            x["attention_mask"] = m
        return x

    encoders = ("distilbert", "roberta", "albert", "electra", "deberta-v2", "mpnet")
    extra = {} if name in encoders else {"use_cache": False}  # (no key/value cache in the output)
    return model, inputs, extra


@pytest.mark.parametrize("name", sorted(ARCHITECTURES))
def test_architecture_compiles_once_and_matches_eager(name):
    model, inputs, extra = _case(name)
    dynamic = {k: {0: "B", 1: "S"} for k in inputs(2, 8)}
    before = symfuse.compile_count()
    c = symfuse.compile(model, {**inputs(2, 8), **extra}, dynamic)
    for b, s in [(1, 1), (1, 7), (2, 16), (3, 37)]:
        x = inputs(b, s, seed=100 * b + s)
        with torch.no_grad():
            ref = model(**x, **extra).last_hidden_state
        out = c(**x, **extra).last_hidden_state
        assert rel_err(out, ref) < 1e-4, f"{name} at B={b}, S={s}"
    assert symfuse.compile_count() == before + 1


_VIT = dict(
    hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128, image_size=32, patch_size=8
)
_STAGES = dict(hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 1, 1])

# name: (config class, model class, config arguments, example size, dynamic dims of pixel_values, sizes run)
VISION = {
    "vit": ("ViTConfig", "ViTModel", _VIT, 32, {0: "B"}, [(1, 32, 32), (5, 32, 32)]),
    "deit": ("DeiTConfig", "DeiTModel", _VIT, 32, {0: "B"}, [(1, 32, 32), (3, 32, 32)]),
    "clip-vision": ("CLIPVisionConfig", "CLIPVisionModel", _VIT, 32, {0: "B"}, [(1, 32, 32), (3, 32, 32)]),
    "beit": ("BeitConfig", "BeitModel", _VIT, 32, {0: "B"}, [(1, 32, 32), (3, 32, 32)]),
    "convnext": (
        "ConvNextConfig", "ConvNextModel", _STAGES, 64, {0: "B", 2: "H", 3: "W"},
        [(1, 64, 64), (2, 72, 64), (1, 76, 92)],
    ),
    "resnet": (
        "ResNetConfig", "ResNetModel", dict(_STAGES, embedding_size=16), 64, {0: "B", 2: "H", 3: "W"},
        [(1, 64, 64), (2, 72, 64), (1, 77, 93)],
    ),
    "segformer": (
        "SegformerConfig", "SegformerModel", dict(_STAGES, num_attention_heads=[1, 2, 2, 4], decoder_hidden_size=64),
        64, {0: "B", 2: "H", 3: "W"}, [(1, 64, 64), (2, 72, 64), (1, 97, 80)],
    ),
}  # fmt: skip


def _vision(name):
    config_cls, model_cls, kwargs, size, dynamic, sizes = VISION[name]
    torch.manual_seed(0)
    model = getattr(transformers, model_cls)(getattr(transformers, config_cls)(**kwargs)).eval()
    return model, size, dynamic, sizes


@pytest.mark.parametrize("name", sorted(VISION))
def test_vision_architecture_compiles_once_and_matches_eager(name):
    model, size, dynamic, sizes = _vision(name)
    before = symfuse.compile_count()
    c = symfuse.compile(model, {"pixel_values": torch.randn(2, 3, size, size)}, {"pixel_values": dynamic})
    g = torch.Generator().manual_seed(1)
    for b, h, w in sizes:
        x = torch.randn(b, 3, h, w, generator=g)
        with torch.no_grad():
            ref = model(pixel_values=x).last_hidden_state
        assert rel_err(c(pixel_values=x).last_hidden_state, ref) < 1e-4, f"{name} at {b}x{h}x{w}"
    assert symfuse.compile_count() == before + 1


def test_sizes_a_vision_model_branches_on_are_refused_by_name():
    """Swin pads its windows only where the size needs it, DINOv2 interpolates its position
    table only where the patches outnumber it, MobileNetV2 pads "same" from the size's remainder:
    each was traced on one path, and a call off it is refused (never run to a wrong shape);
    MobileNetV2's sizes export fixes outright, so declaring them dynamic is refused."""
    torch.manual_seed(0)
    swin = transformers.SwinModel(
        transformers.SwinConfig(image_size=64, embed_dim=16, depths=[1, 1], num_heads=[2, 4], window_size=4)
    ).eval()
    dyn = {"pixel_values": {0: "B", 2: "H", 3: "W"}}
    c = symfuse.compile(swin, {"pixel_values": torch.randn(2, 3, 64, 64)}, dyn)
    x = torch.randn(1, 3, 128, 96)
    with torch.no_grad():
        assert rel_err(c(pixel_values=x).last_hidden_state, swin(pixel_values=x).last_hidden_state) < 1e-4
    with pytest.raises(ValueError, match=r"input shapes break a rule of the model.*H = 66"):
        c(pixel_values=torch.randn(1, 3, 66, 64))

    dino = transformers.Dinov2Model(
        transformers.Dinov2Config(
            hidden_size=64, num_hidden_layers=1, num_attention_heads=4, image_size=28, patch_size=14
        )
    ).eval()
    c = symfuse.compile(dino, {"pixel_values": torch.randn(2, 3, 28, 28)}, dyn)
    with pytest.raises(ValueError, match=r"\(\(H // 14\)\*\(W // 14\)\) == 4 \(the model's code branches on it"):
        c(pixel_values=torch.randn(1, 3, 42, 28))

    mobilenet = transformers.MobileNetV2Model(transformers.MobileNetV2Config(depth_multiplier=0.35)).eval()
    with pytest.raises(ValueError, match=r"input 'pixel_values' dim 2 is declared dynamic \('H'\) but the model only"):
        symfuse.compile(mobilenet, {"pixel_values": torch.randn(2, 3, 64, 64)}, dyn)
    c = symfuse.compile(mobilenet, {"pixel_values": torch.randn(2, 3, 64, 64)}, {"pixel_values": {0: "B"}})
    x = torch.randn(3, 3, 64, 64)
    with torch.no_grad():
        assert rel_err(c(pixel_values=x).last_hidden_state, mobilenet(pixel_values=x).last_hidden_state) < 1e-4


def test_speech_architectures_compile_once_and_match_eager():
    torch.manual_seed(0)
    wav2vec = transformers.Wav2Vec2Model(
        transformers.Wav2Vec2Config(
            hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128, conv_dim=(16, 16),
            conv_kernel=(10, 3), conv_stride=(5, 2), num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4,
        )
    ).eval()  # fmt: skip
    whisper = transformers.WhisperModel(
        transformers.WhisperConfig(
            d_model=64, encoder_layers=1, decoder_layers=1, encoder_attention_heads=4, decoder_attention_heads=4,
            encoder_ffn_dim=128, decoder_ffn_dim=128, num_mel_bins=16, max_source_positions=50,
        )
    ).eval()  # fmt: skip
    before = symfuse.compile_count()
    c = symfuse.compile(wav2vec, {"input_values": torch.randn(2, 800)}, {"input_values": {0: "B", 1: "L"}})
    for b, n in [(1, 400), (3, 701), (2, 1600)]:
        x = torch.randn(b, n)
        with torch.no_grad():
            assert rel_err(c(input_values=x).last_hidden_state, wav2vec(input_values=x).last_hidden_state) < 1e-4
    example = {"input_features": torch.randn(2, 16, 100), "decoder_input_ids": torch.randint(0, 100, (2, 8))}
    dyn = {"input_features": {0: "B"}, "decoder_input_ids": {0: "B", 1: "T"}}
    c = symfuse.compile(whisper, {**example, "use_cache": False}, dyn)
    for b, t in [(1, 1), (3, 7), (2, 16)]:
        x = {"input_features": torch.randn(b, 16, 100), "decoder_input_ids": torch.randint(0, 100, (b, t))}
        with torch.no_grad():
            ref = whisper(**x, use_cache=False).last_hidden_state
        assert rel_err(c(**x, use_cache=False).last_hidden_state, ref) < 1e-4
    assert symfuse.compile_count() == before + 2
