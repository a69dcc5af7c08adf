"""Every ISA version of the generated code, whatever CPU runs the tests.

Each x86 ISA builds (gcc compiles AVX-512 on any x86 host); each ISA this CPU runs (generic
and AVX2 code run on AVX-512 CPUs too) runs the hand-written kernels (the row GEMM with
every activation, the merged attention) and a whole bert-small against the reference at
odd shapes: 1, primes, tails that are not multiples of the vector width or the panel.
"""

import itertools
import os
import re
import subprocess

import pytest
import torch

import symfuse
from symfuse.api import compile_captured
from symfuse.codegen.cpu import target as tg
from symfuse.codegen.cpu.build import build
from symfuse.codegen.cpu.c import preamble
from symfuse.codegen.cpu.calibrate import canonical_attention, row_kernel
from symfuse.codegen.cpu.compile import compile_program
from symfuse.codegen.cpu.gemm import ACTIVATIONS, chunk_choices, gemm_source, pack_panels, tile_for
from symfuse.codegen.cpu.generate import generate
from symfuse.options import SWITCH_KINDS, Options
from symfuse.reference import ReferenceExecutor
from symfuse.runtime.switches import ROWS
from symfuse.schedule.attention import AttentionStep
from tests.conftest import rel_err

X86 = ("generic", "avx2", "avx512")
ARCH = tg.machine_arch()
FEATURES = tg.read_features("g++")
RUNNABLE = [s.name for s in tg.ISAS.values() if tg.has_isa(s, ARCH, FEATURES)]
BUILT = list(X86) if ARCH == "x86_64" else RUNNABLE


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return str(tmp_path_factory.mktemp("kernels"))


def forced(cache: str, value: int) -> Options:
    """Options that pin every version switch point (no measuring in tests)."""
    return Options(cache_dir=cache, thresholds=tuple((k, value) for k in SWITCH_KINDS))


@pytest.mark.parametrize("isa", BUILT)
def test_every_isa_builds(isa, cache):
    """The GEMM micro-kernel, the merged attention and row kernels build for each ISA."""
    target = tg.target_for(isa)
    graph, store = canonical_attention()
    gen = generate(graph, store, target)
    assert f"#define SF_LANES {target.lanes}" in gen.source
    assert sum(isinstance(s, AttentionStep) for s in gen.schedule.steps) == 2
    path, _, _ = build(gen.source, target, Options(cache_dir=cache))
    assert path.endswith(".so")


@pytest.mark.parametrize("isa", [i for i in ("avx2", "avx512") if i in BUILT])
def test_the_tile_loads_each_weight_vector_once_a_step(isa, tmp_path):
    """In the tiles of few rows too, each weight vector is loaded into a register once a step of
    K and multiplied from there: no FMA of the tile takes a (non-broadcast) memory operand. GCC
    folded the load into every row's FMA in tiles of 1-3 rows (10 loads a step for 8 FMAs at 2
    rows), until the tile held each one in a register (SF_IN_REGISTER)."""
    target = tg.target_for(isa)
    tile = tile_for(target)
    src = tmp_path / "tile.cpp"
    # the merged attention's table taken out of the library, so its tiles are emitted too
    src.write_text(preamble(target) + gemm_source(tile) + 'extern "C" const void* sf_nv() { return sf_tiles_nv; }')
    asm = tmp_path / "tile.s"
    r = subprocess.run([target.cxx, *target.all_flags, "-S", str(src), "-o", str(asm)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    text = asm.read_text()
    # a memory operand read whole: `-256(%rax),`; a broadcast one, `(%rdx){1to16},`, does not match
    folded = re.compile(r"^\s*vfmadd\w+ps\s+[-\w]*\(%\w+[^)]*\),")
    for rows, strided in itertools.product(range(1, tile.rows + 1), (0, 1)):
        # sf_tile<rows, false, vectors, strided>: the row kernel's tile without prefetching, and
        # the merged attention's, whose panel rows are ldw apart
        name = re.compile(rf"^_ZL?7sf_tileILi{rows}ELb0ELi{tile.vectors}ELb{strided}EE\w*:$", re.M)
        found = name.search(text)
        assert found, (isa, rows, strided)
        body = text[found.end() : text.index(".cfi_endproc", found.end())]
        fmas = [ln for ln in body.splitlines() if re.match(r"^\s*vfmadd\w+ps", ln)]
        assert len(fmas) >= rows * tile.vectors, (isa, rows, strided)
        assert not [ln for ln in fmas if folded.match(ln)], (isa, rows, strided)


ACTS = {
    "none": lambda y: y,
    "gelu": lambda y: torch.nn.functional.gelu(y),
    "gelu_tanh": lambda y: torch.nn.functional.gelu(y, approximate="tanh"),
    "relu": torch.relu,
    "tanh": torch.tanh,
    "sigmoid": torch.sigmoid,
    "swish": torch.nn.functional.silu,
}


@pytest.mark.parametrize("isa", RUNNABLE)
def test_row_gemm_at_odd_shapes(isa, cache):

    target = tg.detect("g++", isa)
    for split in (False, True):  # the threads on panels, or on rows first
        _row_gemm_at_odd_shapes(target, row_kernel(target, Options(cache_dir=cache), split=split), isa)
        for chunk in chunk_choices(target)[1:]:  # the chunks a machine may measure as faster: K over two
            fn = row_kernel(target, Options(cache_dir=cache), split=split, chunk=chunk)
            _row_gemm_in_chunks(target, fn, isa, tile_for(target, chunk), ms=(1, 13), ks=(chunk + 5,))


def _row_gemm_at_odd_shapes(target, fn, isa):
    tile = tile_for(target)
    gen = torch.Generator().manual_seed(0)
    p = tile.panel
    for n in (1, target.lanes - 1, p - 1, p + 5, 3 * p + target.lanes + 1):
        for k in (1, 3, 17, 64):
            w, bias = torch.randn(n, k, generator=gen), torch.randn(n, generator=gen)
            wp = pack_panels(w, p)
            for m in (1, 2, tile.rows + 1, 13, 31, 48):
                a = torch.randn(m, k + 3, generator=gen)[:, :k]  # rows with a stride of k + 3
                for name, code in ACTIVATIONS.items():
                    for b in (bias, None):
                        c = torch.full((m, n), float("nan"))
                        fn(a.data_ptr(), k + 3, wp.data_ptr(), b.data_ptr() if b is not None else None,
                           c.data_ptr(), n, m, n, k, code)  # fmt: skip
                        want = ACTS[name](torch.nn.functional.linear(a, w, b))
                        assert torch.allclose(c, want, rtol=1e-4, atol=1e-5), (isa, m, n, k, name)
    # K in chunks of tile.chunk steps (the last one short) while a thread's rows are at most two
    # chunks' worth, then in one piece; the next chunk prefetched by the tiles of 13 rows, not
    # by those of 2 * kc rows on panels (more than SF_PF_BLOCKS blocks); on rows first, 4 * kc + 1
    # rows are more than two chunks' worth a thread on 2 threads, fewer on 3 or more
    kc = tile.chunk
    _row_gemm_in_chunks(target, fn, isa, tile, (1, 13, 2 * kc, 2 * kc + 1, 4 * kc + 1), (kc - 1, kc + 5, 2 * kc + 3))


def _row_gemm_in_chunks(target, fn, isa, tile, ms, ks):
    gen = torch.Generator().manual_seed(1)
    p = tile.panel
    for n in (p - 1, 2 * p + target.lanes + 1):
        for k in ks:
            w, bias = torch.randn(n, k, generator=gen), torch.randn(n, generator=gen)
            wp = pack_panels(w, p)
            for m in ms:
                a = torch.randn(m, k + 3, generator=gen)[:, :k]
                for name in ("none", "gelu"):
                    for b in (bias, None):
                        c = torch.full((m, n), float("nan"))
                        fn(a.data_ptr(), k + 3, wp.data_ptr(), b.data_ptr() if b is not None else None,
                           c.data_ptr(), n, m, n, k, ACTIVATIONS[name])  # fmt: skip
                        want = ACTS[name](torch.nn.functional.linear(a, w, b))
                        # relative to the output's scale: sums of hundreds of products round apart
                        assert (c - want).abs().max() <= 1e-4 * want.abs().max() + 1e-5, (isa, m, n, k, name)


ATTENTION_SHAPES = [(1, 1, 1, 1), (2, 3, 7, 13), (1, 2, 31, 64), (3, 1, 17, 8)]  # (B, H, S, D)


def merged_attention_cases(isa, options, shapes, all_padding=True, force_precision=False):
    """The canonical attention built for `isa` with its attention steps merged at every length,
    then never (`options(limit)` gives the options for a switch point), run at `shapes` with a
    random padding mask (a sentence that is all padding too, where `all_padding`): per case,
    (merged, shape), the reference's outputs and the program's."""
    graph, store = canonical_attention()
    ref = ReferenceExecutor(graph)
    gen = torch.Generator().manual_seed(1)
    for merged in (True, False):
        limit = 1 << 20 if merged else 0
        target = tg.detect("g++", isa)
        be = compile_program(graph, store, options(limit), target=target, force_precision=force_precision)
        assert all(be.limit(s) == limit for s in be.schedule.steps if isinstance(s, AttentionStep))
        for b, h, s, d in shapes:
            q, k, v = (torch.randn(b, h, s, d, generator=gen) for _ in range(3))
            mask = torch.rand(b, 1, 1, s, generator=gen) > 0.3
            mask[0, ..., s - s // 3 :] = False  # a padded tail: the merged kernel's GEMMs stop before it
            mask[..., 0] = True
            if all_padding and b > 1:
                mask[1] = False  # all padding: zeros, as torch's fused attention gives
            bias = torch.where(mask, 0.0, -1e4)
            inputs, binding = [q, k, v, mask, bias], dict(B=b, H=h, S=s, D=d)
            yield (merged, b, h, s, d), ref.run(binding, inputs), be.program(inputs, binding)


@pytest.mark.parametrize("isa", RUNNABLE)
def test_merged_attention_at_odd_shapes(isa, cache):
    # past one panel of keys: 65 (the last panel holds one key), 150 (three panels, the last
    # multiplied over fewer vectors than the others); heads of 48 and 80, whole vectors on every
    # ISA, whose v the context GEMM reads in place: one panel narrower than the tile (AVX-512),
    # two panels the second of which is narrower
    shapes = ATTENTION_SHAPES + [(1, 12, 65, 20), (1, 2, 150, 24), (2, 3, 29, 48), (1, 2, 70, 80)]
    cases = merged_attention_cases(isa, lambda limit: forced(cache, limit), shapes)
    for case, want, got in cases:
        for w, o in zip(want, got):
            assert rel_err(o, w) < 1e-4, (isa, *case)


class ExpFamily(torch.nn.Module):
    """Every generated op built on the kernels' own exp."""

    def forward(self, x):
        f = torch.nn.functional
        return torch.exp(x), torch.sigmoid(x), f.silu(x), f.gelu(x, approximate="tanh")


# NaN, infinities, zeros, both ends of exp's range (underflow below -87.33, overflow from 88.37
# on: values in (88.37, 88.72] give inf where expf still gives a float near its largest, left
# out), ties of x log2(e) near half-integers, and ordinary values
EXP_SPECIALS = [float("nan"), float("inf"), -float("inf"), 0.0, -0.0, 1.0, -1.0, 0.5 * 0.6931472, -0.5 * 0.6931472]
EXP_SPECIALS += [20.5, -20.5, 80.0, 88.0, 88.3, 88.8, 100.0, 1e30, -1e30, 1e-30, -1e-30]
EXP_SPECIALS += [-86.9, -87.0, -87.1, -87.3, -87.4, -100.0]


@pytest.mark.parametrize("isa", RUNNABLE)
def test_exp_family_at_special_values(isa, cache):
    """exp, sigmoid, silu and tanh-GELU agree with torch at the edges of exp's range, NaN
    included, in vector loops and their scalar tails (rows of 1 to 126 values, the special ones
    at two offsets)."""
    m = ExpFamily().eval()
    pool = torch.tensor(EXP_SPECIALS + torch.linspace(-30, 30, 37).tolist()).repeat(2)
    compiled = symfuse.compile(m, (pool.repeat(2, 1),), {"x": {0: "B", 1: "S"}}, cache_dir=cache, isa=isa)
    for b, s in [(1, 1), (1, 27), (3, 64), (2, len(pool))]:
        xs = pool[:s].repeat(b, 1)
        for name, got, want in zip(("exp", "sigmoid", "silu", "gelu_tanh"), compiled(xs), m(xs)):
            assert torch.equal(got.isnan(), want.isnan()), (isa, name, b, s)
            # exp: relative everywhere down to the smallest normal float (below -87.33 it gives 0,
            # not a subnormal); the others near 0 to 1e-6 (torch's gelu_tanh, 0.5 x (1 + tanh(..)),
            # loses to cancellation what x / (1 + exp(..)) keeps)
            atol = torch.finfo(torch.float32).tiny if name == "exp" else 1e-6
            assert torch.allclose(got, want, rtol=2e-6, atol=atol, equal_nan=True), (isa, name, b, s)


@pytest.fixture(scope="module")
def bert_small():
    from symfuse.models import load

    case = load("bert-small")
    compiled = symfuse.compile(case.model, case.inputs(**case.example), case.dynamic, backend="reference")
    return case, compiled.captured


@pytest.mark.parametrize("isa", BUILT)
def test_bert_small_at_every_isa(isa, cache, bert_small):
    """Where this CPU runs the ISA: every shape agrees with eager, both sides of every switch
    point, without recompiling. Elsewhere (AVX-512 on an AVX2 host): the model's C++ builds."""
    case, captured = bert_small
    if isa not in RUNNABLE:
        gen = generate(captured.graph, captured.store, tg.target_for(isa))
        assert len(gen.parts) == 2  # the row GEMM's translation unit and the model's, built and linked
        assert build(gen.parts, tg.target_for(isa), Options(cache_dir=cache))[0].endswith(".so")
        return
    # 4-8 rows: threads on rows; 9-24 rows oneDNN, the row kernel again above
    th = (("linear_rows", 8), ("linear_split", 3), ("linear_library", 24), ("attention_keys_library", 16))
    opts = Options(cache_dir=cache, isa=isa, thresholds=th)
    c = compile_captured(captured, opts)
    explained = c.explain(with_graph=False)
    assert c.native.target.isa == isa and f"target: {isa}" in explained
    assert (
        f"row kernel up to 8 rows, oneDNN above up to 24 rows, the row kernel again from 25 to {ROWS[-1]}, oneDNN above"
        " (weights prepared once); its threads on the weights' panels up to 3" in explained
    )
    count = symfuse.compile_count()
    for b, s in [(1, 1), (1, 7), (1, 20), (2, 13), (3, 17), (1, 31), (2, 64)]:
        inputs = case.inputs(B=b, S=s)
        with torch.no_grad():
            assert rel_err(c(**inputs), case.model(**inputs)) < 1e-4, (isa, b, s)
    assert symfuse.compile_count() == count


@pytest.mark.parametrize("isa", RUNNABLE)
def test_the_benchs_fma_peak_builds_and_runs_at_every_isa(isa):
    """The bench's FMA peak loop, in the vector type of each ISA this CPU runs: built, run, and
    a rate no faster than the vectors allow (2 FLOPs a lane, at most 8 vector FMAs a cycle at
    6 GHz on every core)."""
    from symfuse.bench.worker import fma_peak

    target = tg.detect("g++", isa)
    peak = fma_peak(isa)
    assert peak["l3_bytes"] == target.l3
    assert 0 < peak["fma_gflops"] < 2 * target.lanes * 8 * 6.0 * (os.cpu_count() or 1)
