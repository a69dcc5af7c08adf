"""The GPU backend on a real NVIDIA GPU (marked `gpu`; skipped where torch sees none, as on
CI: scripts/gpu_check.sh runs them on a GPU machine). Models compiled once on `cuda` run
every binding of their sweep against eager PyTorch on the same GPU."""

import pytest
import torch

import symfuse
from symfuse.models import load
from tests.conftest import rel_err

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU (scripts/gpu_check.sh)"),
]


def _cuda(inputs: dict) -> dict:
    return {k: v.cuda() if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}


@pytest.mark.parametrize("name", ["bert-small", "gpt2", "t5-encoder-small", "resnet"])
def test_model_on_cuda_every_binding_one_compile(name):
    case = load(name)
    model = case.model.cuda().eval()
    c = symfuse.compile(model, _cuda(case.inputs(**case.example)), case.dynamic)
    assert "triton" in c.backend
    count = symfuse.compile_count()
    for binding in case.sweep:
        inputs = _cuda(case.inputs(**binding))
        with torch.no_grad():
            ref = model(**inputs)
        for _ in range(3):  # the second call of a binding captures a CUDA graph, the third replays it
            err = rel_err(c(**inputs), ref)
            assert err < 1e-4, f"{name} at {binding}: relative error {err:.2e}"
    assert symfuse.compile_count() == count, "a new binding must never recompile"
    assert "CUDA graphs" in c.explain(with_graph=False)


def test_half_precision_bert_base():
    case = load("bert-base")
    model = case.model.cuda().eval()
    c = symfuse.compile(model, _cuda(case.inputs(**case.example)), case.dynamic, precision="fp16")
    for binding in (dict(B=1, S=16), dict(B=8, S=128), dict(B=3, S=33)):
        inputs = _cuda(case.inputs(**binding))
        with torch.no_grad():
            ref = model(**inputs)["last_hidden_state"]
        out = c(**inputs)["last_hidden_state"]
        cos = torch.nn.functional.cosine_similarity(out.flatten().double(), ref.flatten().double(), dim=0)
        assert cos > 0.999, f"fp16 at {binding}: cosine similarity {cos:.5f}"


def test_inputs_on_the_wrong_device_are_refused():
    case = load("bert-small")
    c = symfuse.compile(case.model.cuda().eval(), _cuda(case.inputs(**case.example)), case.dynamic)
    with pytest.raises(ValueError, match="must be on device cuda"):
        c(**case.inputs(B=1, S=4))


def test_bad_token_id_reported_after_replay():
    case = load("bert-small")
    c = symfuse.compile(case.model.cuda().eval(), _cuda(case.inputs(**case.example)), case.dynamic)
    good = _cuda(case.inputs(B=2, S=9))
    for _ in range(3):
        c(**good)  # a CUDA graph for this binding
    bad = dict(good)
    bad["input_ids"] = good["input_ids"].clone()
    bad["input_ids"][0, 0] = 10**6
    with pytest.raises(IndexError, match="out of range"):
        c(**bad)
    with torch.no_grad():
        assert rel_err(c(**good), case.model(**good)) < 1e-4
