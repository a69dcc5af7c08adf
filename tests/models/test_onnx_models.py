"""Every built-in model through its ONNX export: imported once, run at shapes of its sweep
(1, primes, multiples of 16) against onnxruntime on the same file and against eager."""

import importlib.util

import numpy as np
import onnx
import pytest
import torch

import symfuse
from symfuse.bench.engines import flat_outputs
from symfuse.models import BUILTIN, export_onnx, load
from tests.conftest import rel_err

pytestmark = pytest.mark.models
ort = pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")


def _bindings(case):
    """The smallest, a prime and a multiple-of-16 binding of the sweep."""
    sweep = case.sweep
    ones = [b for b in sweep if min(b.values()) == 1][:1]
    primes = [b for b in sweep if any(v in (3, 5, 7, 13, 31) for v in b.values())][:1]
    sixteens = [b for b in sweep if any(v % 16 == 0 and v <= 128 for v in b.values())][:1]
    return ones + primes + sixteens


@pytest.mark.parametrize("name", list(BUILTIN))
def test_builtin_model_from_onnx(name, tmp_path):
    case = load(name)
    path = str(tmp_path / f"{name}.onnx")
    names = export_onnx(case, path)
    before = symfuse.compile_count()
    compiled = symfuse.compile(path)
    assert symfuse.compile_count() == before + 1
    assert len(compiled.symbols) == len({str(s) for dims in case.dynamic.values() for s in dims.values()})
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    for b in _bindings(case):
        inputs = case.inputs(**b)
        feed = {k: inputs[k] for k in names}
        got = compiled(**feed)
        want = [torch.from_numpy(np.asarray(x)) for x in sess.run(None, {k: v.numpy() for k, v in feed.items()})]
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert g.shape == w.shape, (b, g.shape, w.shape)
            assert rel_err(g, w) < 1e-4, (b, rel_err(g, w))
        with torch.no_grad():
            eager = flat_outputs(case.model(**inputs))
        assert rel_err(got[0], eager[0]) < 1e-4
    assert symfuse.compile_count() == before + 1


def test_bench_peers_at_their_best_prepare_and_agree_with_eager(tmp_path):
    """The bench's ONNX Runtime with its transformer optimizer (fused attention and layer
    norms in the file it writes), OpenVINO at its default precision (the engine says which),
    and symfuse's first compile on a fresh kernel cache and machine folder: each prepares
    bert-small and answers like eager."""
    from symfuse.bench.engines import ENGINES

    case = load("bert-small")
    inputs = case.inputs(B=2, S=13)
    with torch.no_grad():
        want = flat_outputs(case.model(**inputs))
    names = ["onnxruntime-optimized", "symfuse-fresh"]
    if importlib.util.find_spec("openvino") is not None:
        names.append("openvino-default")
    for name in names:
        engine = ENGINES[name]()
        (tmp_path / name).mkdir()
        run = engine.prepare(case, str(tmp_path / name))
        got = [torch.as_tensor(np.asarray(g)) for g in run(inputs)]
        if name == "openvino-default":
            assert engine.note.startswith("computes in "), engine.note
        half = "bf16" in engine.note or "f16" in engine.note  # OpenVINO's default on CPUs with bf16
        assert rel_err(got, want) < (3e-2 if half else 1e-3), (name, engine.note)
    optimized = [f for f in (tmp_path / "onnxruntime-optimized").iterdir() if f.name.endswith("-optimized.onnx")]
    ops = {n.op_type for n in onnx.load(str(optimized[0])).graph.node}
    assert {"Attention", "SkipLayerNormalization"} & ops or "MultiHeadAttention" in ops, sorted(ops)
    fresh = tmp_path / "symfuse-fresh"
    assert any((fresh / "fresh-machine").iterdir()) and any((fresh / "fresh-kernels").iterdir())
