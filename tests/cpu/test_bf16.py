"""precision="bf16" on the CPU backend.

The storage (bf16 loads widened, stores rounded to nearest even) and the merged attention's
bf16 form are plain C++: they run at every ISA this CPU runs, forced with
`force_precision` (library GEMMs in bf16 are oneDNN's, which needs AVX-512 at least). The
bf16 row GEMM (every way of multiplying the CPU has: `vdpbf16ps`, FMA on widened weights, AMX
tiles) and the end-to-end speed path need AVX512-BF16; on CPUs without it the program runs fp32 and
`explain` says why, which is tested wherever that holds.
"""

import pytest
import torch
import torch.nn.functional as F

import symfuse
from symfuse.api import compile_captured
from symfuse.codegen.cpu import target as tg
from symfuse.codegen.cpu.calibrate import canonical_attention, row_kernel
from symfuse.codegen.cpu.compile import compile_program
from symfuse.codegen.cpu.gemm import ACTIVATIONS, bf16_multiplies, has_bf16_rows, pack_panels, tile_for
from symfuse.codegen.cpu.generate import generate
from symfuse.codegen.precision import cpu_bf16_missing
from symfuse.ir.dtypes import DType
from symfuse.options import SWITCH_KINDS, Options
from symfuse.reference import ReferenceExecutor
from symfuse.runtime.switches import BF16_MULTIPLY, Threshold
from symfuse.shape.infer import GraphBuilder
from tests.conftest import rel_err
from tests.cpu.test_isa import ACTS, ATTENTION_SHAPES, RUNNABLE, merged_attention_cases

HERE = tg.detect("g++")
BF16_HERE = not cpu_bf16_missing(HERE, ())


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return str(tmp_path_factory.mktemp("kernels"))


def forced(cache: str, value: int, multiply: int = 0, **kw) -> Options:
    """Every switch point at `value`; the bf16 row kernel multiplying as `BF16_MULTIPLY[multiply]`."""
    kinds = tuple((k, value) for k in SWITCH_KINDS) + (("bf16_multiply", multiply),)
    return Options(cache_dir=cache, thresholds=kinds, precision="bf16", **kw)


def cosine_rows(a: torch.Tensor, b: torch.Tensor) -> float:
    """The smallest cosine similarity between matching rows (last dim) of two outputs."""
    a, b = a.double().reshape(-1, a.shape[-1]), b.double().reshape(-1, b.shape[-1])
    return F.cosine_similarity(a, b, dim=-1).min().item()


def chain():
    """x -> x + 0 (storage round trip), a layer norm, a GELU and a softmax: C++ kernels only."""
    b = GraphBuilder("bf16_chain")
    B, S = b.store.declare("B"), b.store.declare("S")
    x = b.input("x", (B, S, 37), DType.float32)
    w, bias = b.input("w", (37,), DType.float32), b.input("bias", (37,), DType.float32)
    (same,) = b.add("add", [x, b.scalar(0.0)])
    (ln,) = b.add("layer_norm", [x, w, bias], {"normalized_shape": [37], "eps": 1e-5})
    (act,) = b.add("gelu", [ln], {"approximate": "none"})
    (soft,) = b.add("softmax", [act], {"dim": -1})
    return b.finish([same, soft]), b.store


@pytest.mark.parametrize("isa", RUNNABLE)
def test_storage_rounds_as_torch_at_every_isa(isa, cache):
    graph, store = chain()
    be = compile_program(graph, store, forced(cache, 0), target=tg.detect("g++", isa), force_precision=True)
    assert be.precision == "bf16" and "sf_to_bf16(" in be.gen.source
    ref = ReferenceExecutor(graph)
    gen = torch.Generator().manual_seed(0)
    for b, s in [(1, 1), (2, 7), (3, 16), (1, 13)]:
        x = torch.randn(b, s, 37, generator=gen) * 10
        x.view(-1)[:6] = torch.tensor([float("nan"), float("inf"), -float("inf"), 1.00390625, 3.4e38, -0.0])
        w, bias = torch.randn(37, generator=gen), torch.randn(37, generator=gen)
        same, soft = be.program([x, w, bias], {"B": b, "S": s})
        want = x.bfloat16().float()  # round to nearest even, NaN kept, overflow to inf
        assert torch.equal(same.isnan(), want.isnan())
        assert torch.equal(same[~same.isnan()], want[~want.isnan()]), (isa, b, s)
        # the rest computed in float from bf16 inputs and weights, rounded once per stored value
        x2 = x.clone()
        x2.view(-1)[:6] = 0.0
        _, soft = be.program([x2, w, bias], {"B": b, "S": s})
        _, ref_soft = ref.run({"B": b, "S": s}, [t.bfloat16().float() for t in (x2, w, bias)])
        assert soft.dtype == torch.float32 and rel_err(soft, ref_soft) < 2e-2, (isa, b, s)


@pytest.mark.skipif(not has_bf16_rows(HERE), reason="the bf16 row kernel needs AVX512-BF16, which this CPU lacks")
@pytest.mark.parametrize("multiply", bf16_multiplies(HERE))
def test_bf16_row_gemm_at_odd_shapes(multiply, cache):
    for split in (False, True):  # the threads on panels, or on rows first
        _bf16_row_gemm_at_odd_shapes(row_kernel(HERE, Options(cache_dir=cache), True, multiply, split), multiply)


def _bf16_row_gemm_at_odd_shapes(fn, multiply):
    tile = tile_for(HERE)
    gen = torch.Generator().manual_seed(0)
    p = tile.panel
    for n in (1, 15, p - 1, p + 5, 3 * p + 17):
        for k in (1, 2, 3, 17, 64, 97):  # AMX: K in steps of 32, a partial last step
            w = torch.randn(n, k, generator=gen).bfloat16()
            bias = torch.randn(n, generator=gen).bfloat16()
            wp = pack_panels(w.float(), p, bf16=True)
            for m in (1, 2, tile.rows + 1, 13, 31, 48):  # AMX: blocks of 16 rows, whole or padded (2-3 of them)
                a = torch.randn(m, k + 3, generator=gen).bfloat16()[:, :k]  # rows with a stride of k + 3
                for name, code in ACTIVATIONS.items():
                    for b in (bias, None):
                        c = torch.full((m, n), float("nan")).bfloat16()
                        fn(a.data_ptr(), k + 3, wp.data_ptr(), b.data_ptr() if b is not None else None,
                           c.data_ptr(), n, m, n, k, code)  # fmt: skip
                        exact = ACTS[name](F.linear(a.float(), w.float(), b.float() if b is not None else None))
                        # float accumulation in another order, then one rounding: within a bf16 step
                        assert torch.allclose(c.float(), exact, rtol=1e-2, atol=1e-2), (multiply, m, n, k, name)


@pytest.mark.parametrize(
    "isa, multiply", [(i, m) for i in RUNNABLE for m in ((0, 1) if has_bf16_rows(tg.detect("g++", i)) else (0,))]
)
def test_bf16_merged_attention_at_odd_shapes(isa, multiply, cache):
    # the merged kernel multiplies by vdpbf16ps (bf16 pairs: odd head sizes and key counts
    # padded) where the row kernel does, else (or without AVX512-BF16) on values widened to
    # float; past one panel of keys (65, 150) and of value columns (80). No all-padding
    # sentence: its rows are zeros, which have no cosine
    target = tg.detect("g++", isa)
    way = Threshold("bf16_multiply", (), multiply, "test")
    source = generate(*canonical_attention(), target, "bf16", way).source
    assert ("sf_tile_dp_for(mr, " in source) == (has_bf16_rows(target) and multiply == 0)
    shapes = ATTENTION_SHAPES + [(1, 12, 65, 20), (1, 2, 150, 24), (2, 1, 9, 80)]
    options = lambda limit: forced(cache, limit, multiply)  # noqa: E731
    for case, want, got in merged_attention_cases(isa, options, shapes, False, force_precision=True):
        for w, o in zip(want, got):
            assert cosine_rows(o, w) > 0.999 and rel_err(o, w) < 3e-2, (isa, multiply, *case)


@pytest.fixture(scope="module")
def minilm():
    from symfuse.models import load

    case = load("minilm")
    compiled = symfuse.compile(case.model, case.inputs(**case.example), case.dynamic, backend="reference")
    return case, compiled.captured


def test_sentence_embeddings_in_bf16(minilm, cache):
    """bf16 where it is faster (AVX512-BF16): embeddings within cosine 0.999 of fp32 eager on both
    sides of every switch point, one compile; elsewhere fp32, with the reason in `explain`."""
    case, captured = minilm
    # library versions everywhere, then symfuse's (its row kernel multiplying every way it can)
    for value, multiply in ((0, 0), *((1 << 20, m) for m in bf16_multiplies(HERE))):
        c = compile_captured(captured, forced(cache, value, multiply))
        text = c.explain(with_graph=False)
        if BF16_HERE:
            assert c.native.precision == "bf16" and "precision: bf16" in text
            how = BF16_MULTIPLY[multiply]
            assert f"symfuse's bf16 row kernel multiplies by {how} (set by hand" in text
        else:
            assert c.native.precision == "fp32" and "precision bf16 was asked for, but" in text
        count = symfuse.compile_count()
        for b, s in [(1, 1), (2, 7), (3, 16), (1, 13), (4, 64)]:
            inputs = case.inputs(B=b, S=s)
            with torch.no_grad():
                want, got = case.model(**inputs), c(**inputs)
            assert got.dtype == torch.float32
            if BF16_HERE:
                assert cosine_rows(got, want) > 0.999, (value, multiply, b, s)
            else:
                assert rel_err(got, want) < 1e-4, (value, b, s)
        assert symfuse.compile_count() == count


@pytest.mark.skipif(not BF16_HERE, reason="the bf16 row kernel needs AVX512-BF16, which this CPU lacks")
def test_bf16_multiply_set_by_hand_is_checked(minilm, cache):
    _, captured = minilm
    with pytest.raises(ValueError, match=r"bf16_multiply=7 is not a way to multiply; use one of 0 \(vdpbf16ps\)"):
        compile_captured(captured, forced(cache, 8, 7))


def test_no_bf16_instructions_falls_back_to_fp32_and_says_why(minilm, cache):
    case, captured = minilm
    plain = HERE.__class__(**{**HERE.__dict__, "extensions": (), "isa": "avx2"})
    why = cpu_bf16_missing(plain, ())
    assert "has no bf16 multiply instructions (avx512_bf16 or amx_bf16)" in why
    assert "oneDNN is held to AVX2" in cpu_bf16_missing(HERE, (("ONEDNN_MAX_CPU_ISA", "AVX2"),)) or not BF16_HERE
    if "avx2" in RUNNABLE:
        c = compile_captured(captured, Options(cache_dir=cache, isa="avx2", precision="bf16"))
        assert c.native.precision == "fp32"
        assert "precision bf16 was asked for, but this CPU" in c.explain(with_graph=False)
        inputs = case.inputs(B=2, S=7)
        with torch.no_grad():
            assert rel_err(c(**inputs), case.model(**inputs)) < 1e-4


def test_precision_options_are_checked():
    with pytest.raises(ValueError, match="precision='fp16' needs the GPU backend.*'fp32' and 'bf16'"):
        Options.from_env(precision="fp16")
    with pytest.raises(ValueError, match="reference backend is fp32"):
        Options.from_env(precision="bf16", backend="reference")
    with pytest.raises(ValueError, match="precision must be"):
        Options.from_env(precision="int8")


@pytest.mark.skipif(not BF16_HERE, reason="saving a bf16 program needs a CPU where bf16 runs (AVX512-BF16)")
def test_bf16_artifact_round_trip(minilm, cache, tmp_path):
    case, captured = minilm
    c = compile_captured(captured, forced(cache, 8))
    c.save(str(tmp_path / "a"))
    back = symfuse.load(str(tmp_path / "a"), cache_dir=cache)
    assert back.native.precision == "bf16" and "precision: bf16" in back.explain(with_graph=False)
    for b, s in [(1, 5), (3, 16)]:
        inputs = case.inputs(B=b, S=s)
        assert torch.equal(back(**inputs), c(**inputs))


def test_vector_norm_matches_torch():
    """F.normalize (linalg_vector_norm) at p = 2, 1, inf and 3, over the last dim."""

    class Norms(torch.nn.Module):
        def forward(self, x):
            return (
                F.normalize(x, dim=-1),
                torch.linalg.vector_norm(x, 1, dim=-1),
                torch.linalg.vector_norm(x, float("inf"), dim=(1, 2)),
                torch.linalg.vector_norm(x, 3.0, dim=-1, keepdim=True),
            )

    m = Norms()
    c = symfuse.compile(m, (torch.randn(2, 5, 8),), {"x": {0: "B", 1: "S"}})
    for b, s in [(1, 1), (3, 7), (2, 16)]:
        x = torch.randn(b, s, 8)
        assert rel_err(c(x), m(x)) < 1e-5
