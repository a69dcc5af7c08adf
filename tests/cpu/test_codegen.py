"""The CPU backend: every op through generated C++, the kernel cache, dumps and bad input."""

import copy
import os
import re

import pytest
import torch

import symfuse
from symfuse import ops
from symfuse.codegen.cpu.compile import compile_program
from symfuse.options import Options
from symfuse.reference import ReferenceExecutor
from symfuse.schedule.layout import address, affine, fold_div_mod, reorder_for
from symfuse.schedule.steps import NativeStep, OpaqueStep
from tests.conftest import rel_err
from tests.cpu.test_isa import RUNNABLE
from tests.support.fusion_checks import assert_explain_per_layer
from tests.unit.test_ops import BINDINGS, CASES, one_op_graph

LOWERED = sorted(name for name, op in ops.REGISTRY.items() if op.lower is not None)
NO_CPP = {"cast"}  # its case casts to float16, which the C++ generator leaves to torch


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return str(tmp_path_factory.mktemp("kernels"))


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dtype.is_floating_point:
        return torch.allclose(a, b, rtol=1e-4, atol=1e-5, equal_nan=True)
    return torch.equal(a, b)


@pytest.mark.parametrize("op", sorted(CASES))
def test_every_op_through_the_cpu_backend(op, cache):
    g, inputs, store = one_op_graph(op)
    be = compile_program(g, store, Options(cache_dir=cache))
    steps = be.schedule.steps
    if op in LOWERED:
        assert not any(isinstance(s, OpaqueStep) for s in steps), f"{op} has a TE lowering but runs opaque"
    native = [s for s in steps if isinstance(s, NativeStep)]
    if op not in NO_CPP:
        assert all(s.name in be.kernels for s in native), be.schedule.notes
    ref = ReferenceExecutor(g)
    gen = torch.Generator().manual_seed(3)
    for binding in BINDINGS + [dict(B=5, S=31)]:
        tensors = inputs(binding, gen)
        if op in ("log", "sqrt", "rsqrt", "pow"):  # keep the reference finite
            tensors = [t.abs() + 0.5 if t.dtype.is_floating_point else t for t in tensors]
        want, got = ref.run(binding, tensors), be.program(tensors, binding)
        for w, o in zip(want, got):
            assert o.shape == w.shape and o.dtype == w.dtype, (op, binding)
            assert _close(o, w), f"{op} at {binding}: {(o.double() - w.double()).abs().max()}"


def test_div_mod_fold_and_affine_views():
    from symfuse.te.ir import axis, reduce_axis

    i0, i1, r = axis(0), axis(1), reduce_axis("x", 0)
    assert fold_div_mod(64 * (r // 64) + r % 64) == r
    # the attention context [B, H, S, 64] read as [B, S, H*64]: only [B, S, H, 64] storage is affine
    shape = (2, 12, 5, 64)
    index = (i0, r // 64, i1, r % 64)
    assert affine(address(index, (3840, 320, 64, 1)), (i0, i1, r)) is None
    order = reorder_for(shape, [(index, (i0, i1, r), (2, 5, 768))])
    assert order == (0, 2, 1, 3)


def test_cache_hit_corrupt_entry_rebuilt_and_dump(tmp_path):
    from symfuse.models import load

    case = load("bert-small")
    cache, dump = str(tmp_path / "cache"), str(tmp_path / "dump")
    example = case.inputs(**case.example)
    first = symfuse.compile(case.model, example, case.dynamic, cache_dir=cache, dump_dir=dump)
    assert not first.native.cached
    assert sorted(os.listdir(dump)) == [
        "1_graph.txt",
        "2_tensor_expressions.txt",
        "3_fusion_plan.txt",
        "4_kernels.cpp",
        "5_host.py",
    ]
    cpp = open(os.path.join(dump, "4_kernels.cpp")).read()
    assert "// k0_layer_norm [reduction]: " in cpp and "#pragma omp simd" in cpp
    second = symfuse.compile(case.model, example, case.dynamic, cache_dir=cache)
    assert second.native.cached
    lib = os.path.basename(first.native.program.library)  # (measuring switch points may build more)
    assert second.native.program.library == first.native.program.library
    damaged = os.path.join(cache, "damaged")
    with open(os.path.join(cache, lib), "rb") as f, open(damaged, "wb") as g:
        g.write(f.read()[:100])  # a partial entry, as a crashed writer could leave it
    os.replace(damaged, os.path.join(cache, lib))  # (the loaded copy keeps its own inode)
    third = symfuse.compile(case.model, example, case.dynamic, cache_dir=cache)
    assert not third.native.cached
    inputs = case.inputs(B=2, S=9)
    with torch.no_grad():
        assert rel_err(third(**inputs), case.model(**inputs)) < 1e-4


class _Indexing(torch.nn.Module):
    """Advanced indexing four ways: one index tensor (negative entries count from the end),
    two adjacent indexed dims, two apart (NumPy puts their broadcast dims first), and an
    arange, computed where it is read, read at the indices."""

    def forward(self, x, rows, cols):
        at = torch.arange(x.shape[1])[cols] * 10
        return x[rows], x[:, cols, cols.T], x[rows, :, cols.to(torch.int32)], at


def test_advanced_indexing_is_generated_code_with_python_semantics(tmp_path):
    """x[5, S, S] indexed by rows[1, N] in [-5, 5) and cols[M, 1] in [-S, S)."""
    x, rows, cols = torch.randn(5, 9, 9), torch.tensor([[0, -1, 4, -5]]), torch.tensor([[1], [-9]])
    dynamic = {"x": {1: "S", 2: "S"}, "rows": {1: "N"}, "cols": {0: "M"}}
    c = symfuse.compile(_Indexing(), (x, rows, cols), dynamic, cache_dir=str(tmp_path))
    count = symfuse.compile_count()
    assert not [s.name for s in c.native.schedule.steps if isinstance(s, OpaqueStep)]
    gen = torch.Generator().manual_seed(0)
    for s, n, m in [(1, 1, 1), (7, 3, 2), (16, 16, 1), (13, 1, 5)]:
        x = torch.randn(5, s, s, generator=gen)
        rows = torch.randint(-5, 5, (1, n), generator=gen)
        cols = torch.randint(-s, s, (m, 1), generator=gen)
        for got, want in zip(c(x, rows, cols), _Indexing()(x, rows, cols)):
            assert got.shape == want.shape and torch.equal(got, want), (s, n, m)
    assert symfuse.compile_count() == count
    x = torch.randn(5, 3, 3)
    with pytest.raises(IndexError, match=r"index 5 is out of range \[-5, 5\): rows indexing dim 0 of x"):
        c(x, torch.tensor([[5]]), torch.tensor([[0]]))
    with pytest.raises(IndexError, match=r"index -4 is out of range \[-3, 3\): cols indexing"):
        c(x, torch.tensor([[0]]), torch.tensor([[-4]]))
    # an index that varies along a vectorised loop is checked without a branch (a reduction of
    # the bad ones, reported after the loop): still an error, naming one of the bad indices
    assert any("sf_index_from_end_v(" in k.source for k in c.native.kernels.values())
    with pytest.raises(IndexError, match=r"index (-5|-7|6) is out of range \[-3, 3\): cols indexing"):
        c(x, torch.tensor([[0]]), torch.tensor([[1], [-5], [-7], [6], [2]]))


def test_out_of_range_token_is_a_clear_error_not_a_crash(tmp_path):
    from symfuse.models import load

    case = load("bert-small")
    c = symfuse.compile(case.model, case.inputs(**case.example), case.dynamic, cache_dir=str(tmp_path))
    inputs = case.inputs(B=1, S=5)
    vocab = case.model.config.vocab_size
    inputs["input_ids"][0, 3] = vocab + 7
    with pytest.raises(
        IndexError, match=rf"index {vocab + 7} is out of range \[0, {vocab}\): input_ids indexing dim 0"
    ):
        c(**inputs)
    inputs["input_ids"][0, 3] = 1  # the next call is fine again
    with torch.no_grad():
        assert rel_err(c(**inputs), case.model(**inputs)) < 1e-4


def test_explain_shows_the_executed_steps(tmp_path):
    from symfuse.models import load

    case = load("bert-small")
    c = symfuse.compile(case.model, case.inputs(**case.example), case.dynamic, cache_dir=str(tmp_path))
    text = c.explain(with_graph=False)
    assert "execution (" in text
    assert "gelu fused (oneDNN post-op, or on the row kernel's tile)" in text
    assert_explain_per_layer(text, 4)


def test_attention_versions_agree_with_eager(tmp_path):
    """BERT's attention is merged into one kernel up to a number of keys and runs as torch's
    fused attention above; so does T5's, whose position bias (computed once, before the first
    layer) is its additive mask. With the switch point set by hand, every version agrees with
    eager, with a padded key and an all-padding sequence, and no binding recompiles; moving
    the switch point at run time needs no compile either."""
    from symfuse.models import load
    from symfuse.schedule.attention import AttentionStep

    limit = 16
    for name, library in (("bert-small", True), ("t5-encoder-small", True)):
        case = load(name)
        kind = "attention_keys_library" if library else "attention_keys"
        c = symfuse.compile(
            case.model, case.inputs(**case.example), case.dynamic, cache_dir=str(tmp_path), thresholds={kind: limit}
        )
        merged = [s for s in c.native.schedule.steps if isinstance(s, AttentionStep)]
        assert len(merged) == 4 and all(s.name in c.native.kernels for s in merged)
        assert all((s.library is not None) == library for s in merged), name
        assert all(c.native.limit(s) == limit for s in merged)
        assert f"merged kernel up to {limit} keys" in c.explain(with_graph=False)
        count = symfuse.compile_count()
        for b, s in [(1, 1), (2, 5), (1, limit), (2, limit + 3)]:
            inputs = case.inputs(B=b, S=s)
            inputs["attention_mask"][:, -1] = 0  # a padded key
            if b > 1:
                inputs["attention_mask"][1] = 0  # a sequence of padding only: zeros from attention, not NaN
            with torch.no_grad():
                want = case.model(**inputs)
            assert rel_err(c(**inputs), want) < 1e-4, (name, b, s)
            for th in c.native.thresholds:  # the other version at the same binding
                c.native.program.set_threshold(th, 0 if s <= limit else 1 << 20)
            assert rel_err(c(**inputs), want) < 1e-4, (name, b, s, "other version")
            for th in c.native.thresholds:
                c.native.program.set_threshold(th, c.native.thresholds[th].value)
        assert symfuse.compile_count() == count


class SoftCappedAttention(torch.nn.Module):
    """Attention whose scores are soft-capped (`cap * tanh(scores / cap)`, as Gemma 2 does):
    more than scale, mask and softmax, so no library attention computes it."""

    def forward(self, q, k, v):
        scores = q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5
        return torch.softmax(20.0 * torch.tanh(scores / 20.0), -1) @ v


def test_attention_the_library_cannot_compute_runs_as_three_steps_above_its_switch_point(tmp_path):
    """A row kernel that is more than attention's scale, mask and softmax is merged up to the
    switch point and runs as three steps above it (batched GEMMs around the row kernel); both
    agree with eager at odd lengths from one compile."""
    from symfuse.schedule.attention import AttentionStep

    m, limit = SoftCappedAttention(), 16
    dims = {0: "B", 2: "S"}
    ex = tuple(torch.randn(2, 3, 8, 24) for _ in range(3))
    c = symfuse.compile(m, ex, (dims, dims, dims), cache_dir=str(tmp_path), thresholds={"attention_keys": limit})
    (st,) = [s for s in c.native.schedule.steps if isinstance(s, AttentionStep)]
    assert st.library is None and st.name in c.native.kernels and c.native.limit(st) == limit
    count = symfuse.compile_count()
    for b, s in [(1, 1), (2, 7), (1, limit), (3, limit + 5), (1, 67)]:
        args = tuple(torch.randn(b, 3, s, 24) for _ in range(3))
        assert rel_err(c(*args), m(*args)) < 1e-4, (b, s)
    assert symfuse.compile_count() == count


def test_linear_layers_run_the_row_kernel_again_above_the_library_band(tmp_path):
    """A linear layer runs symfuse's row kernel up to `linear_rows` rows, oneDNN up to
    `linear_library` rows, the row kernel again above that up to the largest size measured,
    and oneDNN above it: the host picks per call, every version agrees with eager, and no
    row count recompiles."""
    from symfuse.models import load
    from symfuse.runtime.switches import ROWS

    case = load("bert-small")
    th = {"linear_rows": 8, "linear_library": 24, "linear_split": 6}
    c = symfuse.compile(case.model, case.inputs(**case.example), case.dynamic, cache_dir=str(tmp_path), thresholds=th)
    ns = c.native.program._ns
    library, rows = ns["linear"], []

    def counted(a, *args):  # oneDNN's calls, by their rows
        rows.append(a.numel() // a.shape[-1])
        return library(a, *args)

    ns["linear"] = counted
    assert (
        f"row kernel up to 8 rows, oneDNN above up to 24 rows, the row kernel again from 25 to {ROWS[-1]}"
        in c.explain(with_graph=False)
    )
    count = symfuse.compile_count()
    for b, s in [(1, 8), (1, 9), (2, 12), (1, 25), (3, 17), (5, 205), (8, 512), (25, 164)]:
        rows.clear()
        inputs = case.inputs(B=b, S=s)
        with torch.no_grad():
            assert rel_err(c(**inputs), case.model(**inputs)) < 1e-4, (b, s)
        m = b * s
        library_rows = set(rows)  # (the pooler's B rows always run the row kernel here)
        assert library_rows == ({m} if 8 < m <= 24 or m > ROWS[-1] else set()), (b, s, rows)
        assert all(c.native.runs_own(st, m) == (m not in library_rows) for st in linears(c)), (b, s)
    assert symfuse.compile_count() == count


def linears(c) -> list:
    from symfuse.schedule.steps import GemmStep

    return [st for st in c.native.schedule.steps if isinstance(st, GemmStep) and st.name in c.native.host_thresholds]


class CausalBlock(torch.nn.Module):
    """Self-attention with a causal mask and a padding mask, as decoders run a padded batch."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv = torch.nn.Linear(48, 144)

    def forward(self, x: torch.Tensor, pad: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, 3, 16).permute(2, 0, 3, 1, 4)
        pos = torch.arange(s, device=x.device)
        causal = pos[None, :] <= pos[:, None]
        mask = causal[None, None] & pad[:, None, None, :]
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def test_merged_attention_stops_at_the_last_key_a_block_attends_to(tmp_path):
    """Where the softmax's input is masked to -inf, each block of query rows multiplies only up
    to the last key any of its rows attends to (causal: up to the block's last row; padding:
    before the padded tail); the result agrees with eager at odd lengths, past several panels
    of keys, with padded tails. An additive bias (T5) is not a mask: every key is multiplied."""
    from symfuse.models import load

    torch.manual_seed(0)
    m = CausalBlock().eval()
    ex = (torch.randn(2, 5, 48), torch.ones(2, 5, dtype=torch.bool))
    c = symfuse.compile(m, ex, ({0: "B", 1: "S"}, {0: "B", 1: "S"}), cache_dir=str(tmp_path))
    (merged,) = [k for k in c.native.kernels.values() if "[attention]" in k.source]
    assert "kmax = i3 + 1;" in merged.source and "sf_tile_for(mr, DV - p * SF_PANEL)(pr, SK" in merged.source
    assert "for (int64_t p = 0; p < kq; ++p)" in merged.source
    count = symfuse.compile_count()
    for b, s in [(1, 1), (2, 7), (1, 65), (3, 130), (2, 200)]:
        x, pad = torch.randn(b, s, 48), torch.ones(b, s, dtype=torch.bool)
        pad[0, s - s // 3 :] = False  # a padded tail (key 0 always seen: no row is all masked)
        with torch.no_grad():
            want = m(x, pad)
        assert rel_err(c(x, pad), want) < 1e-4, (b, s)
    assert symfuse.compile_count() == count
    case = load("t5-encoder-small")
    t5 = symfuse.compile(case.model, case.inputs(**case.example), case.dynamic, cache_dir=str(tmp_path))
    sources = [k.source for k in t5.native.kernels.values() if "[attention]" in k.source]
    assert sources and all("const int64_t kmax = SK, kq = kp;" in src for src in sources)


class MaskedAttention(torch.nn.Module):
    """Attention over heads of 32 with a padding mask, as SDPA's safe softmax (a row whose every
    key is masked gives 0) or written out with a plain one (that row is NaN)."""

    def __init__(self, safe: bool) -> None:
        super().__init__()
        self.safe = safe

    def forward(self, q, k, v, pad):
        mask = pad[:, None, None, :]
        if self.safe:
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        s = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
        return torch.softmax(s.masked_fill(~mask, float("-inf")), -1) @ v


@pytest.mark.parametrize("safe", [True, False])
def test_merged_attention_normalises_each_output_row_late(tmp_path, safe):
    """The probabilities are the exponentials' row times one value per row: the merged kernel
    multiplies the exponentials by v and each output row by that value (no pass over the keys
    writes probabilities); a row whose every key is masked is 0 or NaN as in eager. Heads of 32
    and key panels of fewer keys than a tile's width run on narrower tiles."""
    torch.manual_seed(0)
    m = MaskedAttention(safe).eval()
    b, h, s, d = 2, 3, 5, 32
    ex = (*(torch.randn(b, h, s, d) for _ in range(3)), torch.ones(b, s, dtype=torch.bool))
    dims = {0: "B", 2: "S"}
    c = symfuse.compile(m, ex, (dims, dims, dims, {0: "B", 1: "S"}), cache_dir=str(tmp_path))
    (merged,) = [k for k in c.native.kernels.values() if "[attention]" in k.source]
    # the context GEMM's tile multiplies each output row by its factor as it stores it
    assert "rs[r] = " in merged.source and "kmax, nullptr, 0, rs);" in merged.source
    assert "sf_tile_for(mr, kmax - p * SF_PANEL)" in merged.source
    # written out, the mask is inverted by a kernel between the scores and the softmax: it runs first
    assert safe or re.search(r"run before k\d+_matmul \(not reading its scores\)", c.explain())
    assert "(probabilities normalised late:" in c.explain()
    count = symfuse.compile_count()
    for b, s in [(1, 1), (2, 7), (3, 16), (2, 65), (1, 131)]:
        q, k, v = (torch.randn(b, h, s, d) for _ in range(3))
        pad = torch.rand(b, s) > 0.3
        pad[:, 0] = True
        if b > 1:
            pad[1] = False  # every key masked
        with torch.no_grad():
            want = m(q, k, v, pad)
        got = c(q, k, v, pad)
        assert torch.equal(got.isnan(), want.isnan()), (safe, b, s)
        assert rel_err(got.nan_to_num(), want.nan_to_num()) < 1e-4, (safe, b, s)
    assert symfuse.compile_count() == count


def test_kernels_equal_up_to_value_names_share_one_function():
    from symfuse.codegen.cpu.kernel import KernelSource
    from symfuse.codegen.stages import share

    def kernel(name, out, x, scale):
        src = (
            f"// {name}: {out} = {x} * {scale}\n"
            f'extern "C" void {name}(float* {out}, const float* {x}, const int64_t* sym, int64_t b, int64_t e) {{\n'
            f"  for (int64_t r0_{out} = b; r0_{out} < e; ++r0_{out}) {{ const float v_{x} = {x}[r0_{out}];"
            f" {out}[r0_{out}] = v_{x} * {scale}f; }}\n}}"
        )
        return KernelSource(name, src, [out, x], 1)

    ks = {
        "k1_mul": kernel("k1_mul", "mul", "add", "0.5"),
        "k2_mul_1": kernel("k2_mul_1", "mul_1", "add_3", "0.5"),  # the same up to names
        "k3_mul_2": kernel("k3_mul_2", "mul_2", "add_5", "0.25"),  # another constant
    }
    shared = share(ks, {"mul", "add", "mul_1", "add_3", "mul_2", "add_5"})
    assert [k.function for k in shared.values()] == ["", "k1_mul", ""]
    assert shared["k2_mul_1"].args == ["mul_1", "add_3"]  # called with its own buffers


def test_a_transformer_compiles_each_distinct_kernel_once(tmp_path):
    from symfuse.models import load

    case = load("bert-small")
    c = symfuse.compile(case.model, case.inputs(**case.example), case.dynamic, cache_dir=str(tmp_path))
    kernels = c.native.kernels
    own = [k for k in kernels.values() if not k.function]
    assert len(own) < len(kernels) // 2  # four layers: their layer norms and attention repeat
    assert all(kernels[k.function].function == "" for k in kernels.values() if k.function)
    source = c.native.gen.source
    assert all(f'"C" void {k.name}(' not in source for k in kernels.values() if k.function)
    for b in (dict(B=1, S=1), dict(B=2, S=13), dict(B=1, S=64)):
        x = case.inputs(**b)
        with torch.no_grad():
            assert rel_err(c(**x).last_hidden_state, case.model(**x).last_hidden_state) < 1e-4


class BothOperandsCopied(torch.nn.Module):
    def forward(self, x, y):  # einsum's bmm reads both operands through permutes no strided view expresses
        return torch.einsum("bchw,bcvw->bchv", x, y)


def test_a_gemm_whose_two_operands_are_both_copied():
    """Each copy step of a library GEMM gets a kernel of its own (two copies were once one
    kernel name, and the host code read an operand it never wrote)."""
    m = BothOperandsCopied()
    dyn = {"x": {0: "B", 2: "H"}, "y": {0: "B", 2: "H"}}
    c = symfuse.compile(m, (torch.randn(2, 4, 5, 6), torch.randn(2, 4, 5, 6)), dyn)
    for b, h in [(1, 1), (2, 7), (3, 16)]:
        x, y = torch.randn(b, 4, h, 6), torch.randn(b, 4, h, 6)
        assert rel_err(c(x, y), m(x, y)) < 1e-5
    steps = c.explain(with_graph=False)
    assert "k0_bmm_copy: native C++ [copy] writes x_for_bmm" in steps
    assert "k0_bmm_copy_b: native C++ [copy] writes y_for_bmm" in steps


def test_fp16_and_bf16_models_run_on_any_cpu(seeded):
    """A model in fp16 (or bf16) runs its oneDNN linears and convolutions in that type where
    the CPU has it, else in fp32 narrowed back (oneDNN refuses fp16 without AVX512-FP16)."""
    for dt in (torch.float16, torch.bfloat16):
        m = torch.nn.Sequential(
            torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.Flatten(2), torch.nn.Linear(30, 16)
        ).eval()
        m = m.to(dt)
        wide = copy.deepcopy(m).float()  # the same (rounded) weights, computed in fp32
        c = symfuse.compile(m, (torch.randn(2, 3, 5, 6).to(dt),), {"input": {0: "B"}})
        for b in (1, 3, 16):
            x = torch.randn(b, 3, 5, 6).to(dt)
            with torch.no_grad():
                want = wide(x.float())
            got = c(x)
            assert got.dtype == dt
            assert rel_err(got.float(), want) < (4e-3 if dt == torch.float16 else 3e-2), (dt, b)


class Extremes(torch.nn.Module):
    def forward(self, x):
        v, i = x.max(-1)
        return x.amax(-1), x.amin((0, 2)), v, i, x.max(), x.argmin(1)


def test_max_and_min_reductions_propagate_nan_as_torch(seeded):
    """A NaN is the extreme (and its index the argmax), as in torch; the kernel keeps a NaN
    flag beside its vectorised maximum."""
    m = Extremes()
    c = symfuse.compile(m, (torch.randn(3, 7, 5),))
    for shape in [(2, 13, 16), (3, 5, 7)]:
        x = torch.randn(shape)
        x[0, 1, 2] = x[1, 2, 0] = float("nan")
        for got, want in zip(c(x), m(x)):
            assert torch.equal(got.isnan(), want.isnan()), (shape, got, want)
            assert torch.equal(got.nan_to_num(0), want.nan_to_num(0)), (shape, got, want)
    src = "\n".join(k.source for k in c.native.kernels.values())
    assert "|= " in src and "= NAN;" in src


class Statistics(torch.nn.Module):
    """Row statistics over members of one kernel: a softmax (its max over the scaled scores,
    its sum over the exponentials), a sum over a member that reads a later one, and one that
    reads its member at another element as well (its first), one that calls libm's tanh."""

    def forward(self, x):
        y = x * 0.5
        z = y + 1.0
        first = (y * y[:, :1]).abs().sum(-1, keepdim=True)  # no cancellation: its order of adding is free
        bent = torch.tanh(y).sum(-1, keepdim=True)
        return torch.softmax(y, -1), (y * z).sum(-1, keepdim=True) + z, y / (first + 1.0), y * bent


def test_row_statistics_accumulate_in_the_loop_of_the_member_they_read(seeded, cache):
    """A reduction over a member's row that reads it at the element its loop computes, and
    nothing computed after it, is accumulated in that loop (one pass over the row less: a
    softmax kernel streaming from memory ran 1.6x faster); one that reads the member at
    another element, or calls a libm function (scalar where there is no vector math library),
    keeps a loop of its own. NaN, -inf and rows of -inf behave as in torch."""
    m = Statistics()
    c = symfuse.compile(m, (torch.randn(3, 40),), ({0: "N", 1: "C"},), cache_dir=cache)
    for n, cols in [(1, 1), (2, 16), (5, 37), (7, 64)]:
        x = torch.randn(n, cols) * 4
        x[0, 0] = float("nan")
        x[-1, :] = float("-inf") if n > 1 else x[-1, :]
        if cols > 3:
            x[n // 2, 2] = float("-inf")
        for got, want in zip(c(x), m(x)):
            assert torch.allclose(got, want, rtol=1e-5, atol=1e-6, equal_nan=True), (n, cols)
    src = "\n".join(k.source for k in c.native.kernels.values())
    assert "// softmax_max's max over it" in src and "// softmax_sum's sum over it" in src
    assert src.count("'s sum over it") == 2  # the softmax's and (y * z)'s, in z's loop
    assert "// softmax_max (accumulated above)" in src
    own_loop = r"for \(int64_t (r\d+_\w+) = 0;.*\n.*"  # a reduction's loop of its own, then its line
    assert re.search(own_loop + r"\[\1\] \* v_mul\[0\]", src)  # the sum with the first element
    assert re.search(own_loop + r"tanhf\(v_mul\[\1\]\)", src)  # the sum of tanh


def test_the_row_kernels_relu_keeps_a_nan(seeded):
    """ReLU applied by the row GEMM to its tile keeps a NaN, as torch.relu does (it was
    `x > 0 ? x : 0`, which makes it 0)."""
    m = torch.nn.Sequential(torch.nn.Linear(24, 40), torch.nn.ReLU()).eval()
    c = symfuse.compile(m, (torch.randn(4, 24),), ({0: "B"},))
    x = torch.randn(3, 24)
    x[1, 5] = float("nan")
    assert c.native.runs_own(next(s for s in c.native.schedule.steps if s.name.endswith("linear")), 3)
    got, want = c(x), m(x)
    assert torch.equal(got.isnan(), want.isnan()) and want[1].isnan().all()
    assert torch.allclose(got.nan_to_num(0), want.nan_to_num(0), rtol=1e-5, atol=1e-6)


class Pools(torch.nn.Module):
    """The pooling forms a CNN uses, behind a convolution + ReLU as in a ResNet's stem."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x, z):
        F = torch.nn.functional
        y = torch.relu(self.conv(x))
        return (
            F.max_pool2d(y, 2),
            F.max_pool2d(z, 3, 2, 1),
            F.max_pool2d(z, (2, 3), 1, (1, 0), dilation=(1, 2)),
            F.avg_pool2d(y, 2),
            F.avg_pool2d(z, 3, 2, 1),
            F.avg_pool2d(z, 3, 2, 1, count_include_pad=False),
            F.avg_pool2d(z, 3, 1, 1, divisor_override=5),
            F.adaptive_avg_pool2d(F.avg_pool2d(F.max_pool2d(y, 2), 2), 1),
            F.adaptive_avg_pool2d(z, (3, 5)),
        )


def test_pools_are_generated_kernels_at_every_size(seeded, tmp_path):
    """Pools run as generated C++ (torch's NCHW max pooling is 4-30x slower than the
    vectorised kernel), match eager at odd and even sizes with NaN propagating as in torch,
    leave the ReLU before them to the convolution as a post-op, and compute their pooled
    sides once per kernel instead of at every element."""
    from symfuse.schedule.steps import GemmStep

    m = Pools().eval()
    before = symfuse.compile_count()
    dims = {0: "B", 2: "H", 3: "W"}
    ex = torch.randn(2, 3, 12, 12)
    c = symfuse.compile(m, (ex, ex), (dims, dims), cache_dir=str(tmp_path))
    for shape in [(1, 3, 7, 5), (2, 3, 16, 16), (3, 3, 13, 31), (1, 3, 48, 17)]:
        x, z = torch.randn(shape), torch.randn(shape)
        z[0, 0, 1, 1] = float("nan")
        for k, (got, want) in enumerate(zip(c(x, z), m(x, z))):
            assert got.shape == want.shape, (k, shape)
            assert torch.allclose(got, want, rtol=1e-5, atol=1e-6, equal_nan=True), (k, shape)
    assert symfuse.compile_count() == before + 1
    steps = c.native.schedule.steps
    assert not [s for s in steps if isinstance(s, OpaqueStep)]
    (conv,) = [s for s in steps if isinstance(s, GemmStep)]
    assert conv.postop is not None and conv.epilogue is None  # the ReLU did not go looking for a pool's kernel
    for name, src in c.native.kernels.items():  # sizes such as H//2 are locals set before the loops
        loops = src.source.split("#pragma omp for", 1)[-1].split('extern "C"', 1)[0]  # (not its entry's work estimate)
        for args in re.findall(r"sf_floordiv<int64_t>\(((?:[^()]|\((?:[^()]|\([^()]*\))*\))*)\)", loops):
            assert re.search(r"\b(i\d|r\d+_\w+)", args), (name, args)  # a division in the loops involves a loop


class ConvBlocks(torch.nn.Module):
    """Convolutions (a stem on the input, a depthwise one, a strided 1x1) with the kernels
    between them, and values that leave the program: a convolution's own result, a kernel's
    result computed from a channels-last buffer, a linear head on a pooled vector."""

    def __init__(self) -> None:
        super().__init__()
        nn = torch.nn
        self.stem = nn.Conv2d(3, 16, 3, padding=1)
        self.a = nn.Conv2d(16, 16, 3, padding=1, bias=False)
        self.dw = nn.Conv2d(16, 16, 3, padding=1, groups=16)
        self.down = nn.Conv2d(16, 24, 1, stride=2)
        self.side = nn.Conv2d(3, 8, 3, padding=1)
        self.head = nn.Linear(24, 5)

    def forward(self, x):
        F = torch.nn.functional
        y = F.max_pool2d(torch.relu(self.stem(x)), 2)
        y = torch.relu(y + self.dw(torch.relu(self.a(y))))
        z = torch.relu(self.down(y))
        return self.head(torch.flatten(F.adaptive_avg_pool2d(z, 1), 1)), z * 2, self.side(x)


@pytest.mark.parametrize("isa", RUNNABLE)
def test_convolutions_keep_their_activations_channels_last(isa, seeded, tmp_path):
    """The buffers convolutions read and write are stored channels-last (oneDNN's fast path)
    and so is a pool or residual add between them, whose kernel then loops over channels
    innermost; what leaves the program is in torch's layout, and every ISA's kernels match
    eager at odd sizes from one compile."""
    from symfuse.schedule.channels_last import NHWC
    from symfuse.schedule.layout import row_major
    from symfuse.schedule.steps import GemmStep

    m = ConvBlocks().eval()
    before = symfuse.compile_count()
    c = symfuse.compile(m, (torch.randn(2, 3, 12, 12),), ({0: "B", 2: "H", 3: "W"},), cache_dir=str(tmp_path), isa=isa)
    for shape in [(1, 3, 2, 3), (2, 3, 7, 5), (1, 3, 16, 16), (3, 3, 13, 31)]:
        x = torch.randn(shape)
        for k, (got, want) in enumerate(zip(c(x), m(x))):
            assert got.shape == want.shape and got.is_contiguous(), (k, shape)
            assert torch.allclose(got, want, rtol=1e-5, atol=1e-5), (k, shape)
    assert symfuse.compile_count() == before + 1
    sched = c.native.schedule
    nhwc = {n for n, b in sched.buffers.items() if len(b.shape) == 4 and b.strides == row_major(b.shape, NHWC)}
    convs = [s for s in sched.steps if isinstance(s, GemmStep) and s.conv is not None]
    assert len(convs) == 5
    outputs = set(sched.outputs)
    for st in convs:  # around every convolution, except a program input or output
        assert {st.a.buffer, st.out} - outputs - {v.name for v in sched.graph.inputs} <= nhwc, st.anchor
    assert not nhwc & outputs
    looped = [s for s in sched.steps if isinstance(s, NativeStep) and s.order == NHWC]
    looped += [s.epilogue for s in convs if s.epilogue is not None and s.epilogue.order == NHWC]
    assert {"max_pool2d"} <= {o for s in looped for o in s.outputs}
    for st in looped:  # channels innermost: the vectorised loop runs over a constant channel count
        assert re.search(r"for \(int64_t i3 = 0; i3 < (16|24);", c.native.kernels[st.name].source), st.name
    prepared = c.native.program._ns["conv_weight"].packed  # oneDNN's layout, or channels-last where it lacks the type
    assert len(prepared) == 5 and all(
        w.is_mkldnn or w.is_contiguous(memory_format=torch.channels_last) for w in prepared.values()
    )
    assert "is stored channels-last" in c.explain(with_graph=False)


class _LSTMWithState(torch.nn.Module):
    def __init__(self, lstm: torch.nn.LSTM) -> None:
        super().__init__()
        self.lstm = lstm

    def forward(self, x, h, c):
        return self.lstm(x, (h, c))


@pytest.mark.parametrize(
    "cfg",
    [
        dict(input_size=32, hidden_size=64, num_layers=2, batch_first=True),  # threads share a step
        dict(input_size=5, hidden_size=7, num_layers=3, bidirectional=True),
        dict(input_size=16, hidden_size=40, num_layers=1, batch_first=True, bias=False),
        dict(input_size=8, hidden_size=24, num_layers=2, batch_first=True, bidirectional=True),
    ],
)
def test_lstm_runs_the_library_recurrence_at_every_length(cfg, seeded, tmp_path, monkeypatch):
    """An LSTM runs on the library's recurrence (one call per layer and direction, not
    torch's ops at every step): outputs and final states match eager, with and without an
    initial state, at lengths 1 to 33 and batches 1 to 5 from one compile, its input
    projection on the library (few rows) or torch's addmm (many)."""
    import symfuse.runtime.lstm as native_lstm

    lstm = torch.nn.LSTM(**cfg).eval()
    first = cfg.get("batch_first", False)
    states = cfg["num_layers"] * (2 if cfg.get("bidirectional") else 1)

    def make(b, t):
        x = torch.randn(b, t, cfg["input_size"]) if first else torch.randn(t, b, cfg["input_size"])
        return x, torch.randn(states, b, cfg["hidden_size"]), torch.randn(states, b, cfg["hidden_size"])

    seq = {0: "B", 1: "T"} if first else {0: "T", 1: "B"}
    with_state = _LSTMWithState(lstm)
    before = symfuse.compile_count()
    c = symfuse.compile(with_state, make(2, 5), (seq, {1: "B"}, {1: "B"}), cache_dir=str(tmp_path))
    c0 = symfuse.compile(lstm, (make(2, 5)[0],), (seq,), cache_dir=str(tmp_path))
    for compiled in (c, c0):
        assert "lstm(k.sf_lstm" in compiled.native.program.source
    for b, t in [(1, 1), (1, 16), (3, 7), (2, 33), (5, 9)]:  # batch rows one by one and four at once
        x, h, cell = make(b, t)
        for limit in (native_lstm.PROJECT_IN_LIBRARY, 0):
            monkeypatch.setattr(native_lstm, "PROJECT_IN_LIBRARY", limit)
            for got, want in [(c(x, h, cell), with_state(x, h, cell)), (c0(x), lstm(x))]:
                for g, w in zip([got[0], *got[1]], [want[0], *want[1]]):
                    assert g.shape == w.shape and torch.allclose(g, w, rtol=1e-4, atol=1e-5), (b, t, limit)
    assert symfuse.compile_count() == before + 2
