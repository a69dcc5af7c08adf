"""Every built-in model through its ONNX export: imported once, run at shapes of its sweep
(1, primes, multiples of 16) against onnxruntime on the same file and against eager."""

import numpy as np
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
