"""A whole call in one C++ function (codegen/cpu/run.py): `sf_run` runs every step in one parallel
region at the bindings where every step is the library's own version, and the Python host runs
the others; both give eager's results."""

import re

import pytest
import torch

import symfuse
from symfuse.schedule.attention import AttentionStep


class Layer(torch.nn.Module):
    """An encoder layer with an embedding in front: gathers, the row GEMM (with GELU), the merged
    attention with a padding mask, layer norms and residual adds."""

    def __init__(self, vocab=50, d=32, heads=2):
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, d)
        self.qkv, self.out = torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d)
        self.up, self.down = torch.nn.Linear(d, 4 * d), torch.nn.Linear(4 * d, d)
        self.ln1, self.ln2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
        self.heads = heads

    def forward(self, ids, mask):
        x = self.emb(ids)
        b, s, d = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        a = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None, None, :].bool())
        x = self.ln1(x + self.out(a.transpose(1, 2).reshape(b, s, d)))
        return self.ln2(x + self.down(torch.nn.functional.gelu(self.up(x))))


def inputs(b, s, gen):
    mask = torch.ones(b, s, dtype=torch.long)
    mask[0, s // 2 + 1 :] = 0  # padding in the first sentence
    return torch.randint(0, 50, (b, s), generator=gen), mask


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    torch.manual_seed(0)
    net = Layer().eval()
    gen = torch.Generator().manual_seed(1)
    dims = {0: "B", 1: "S"}
    c = symfuse.compile(net, inputs(2, 8, gen), (dims, dims), cache_dir=str(tmp_path_factory.mktemp("kernels")))
    return net, c


def layer_norm(c) -> str:
    return next(k for k in c.native.host.kernels if "layer_norm" in k)


def counted(program, name):
    """Count the host code's calls of kernel `name` (the host looks it up at every call)."""
    calls = []
    f = getattr(program.kernels, name)
    setattr(program.kernels, name, lambda *a: (calls.append(1), f(*a))[1])
    return calls


def test_every_step_in_one_parallel_region_where_every_step_is_the_librarys(compiled):
    net, c = compiled
    prog, host = c.native.program, c.native.host
    assert host.run is not None and "sf_run" in prog.source
    run = c.native.gen.source.split('extern "C" void sf_run(', 1)[1]
    assert run.count("#pragma omp parallel") == 1  # one region; each step's loop is shared in it
    assert any(isinstance(st, AttentionStep) and st.name in c.native.kernels for st in c.native.schedule.steps)
    assert "_attention_team(" in run and "sf_rows_gemm_team(" in run and "#pragma omp barrier" in run
    assert "host code: one C++ call (sf_run) runs the whole call" in c.explain(with_graph=False)
    whole, stepwise = counted(prog, "sf_run"), counted(prog, layer_norm(c))
    before = symfuse.compile_count()
    gen = torch.Generator().manual_seed(2)
    threads = torch.get_num_threads()
    try:
        for n in (threads, 1):  # a team of one runs every step's loop whole
            torch.set_num_threads(n)
            for b, s in [(1, 1), (1, 7), (2, 16), (3, 13)]:
                ids, mask = inputs(b, s, gen)
                with torch.no_grad():
                    want = net(ids, mask)
                before_step = len(stepwise)
                got = c(ids, mask)
                assert len(stepwise) == before_step  # no kernel called one by one
                assert got.shape == want.shape
                assert torch.allclose(got, want, rtol=1e-4, atol=1e-5), (n, b, s)
                tensors = c._inputs((), {"ids": ids, "mask": mask})
                (alone,) = prog(tensors, c.guard(tensors), whole=False)  # the same kernels, one region each
                assert torch.equal(alone, got)
    finally:
        torch.set_num_threads(threads)
    assert len(whole) == 8
    assert symfuse.compile_count() == before


def test_the_python_host_runs_a_binding_where_a_step_is_a_librarys(compiled):
    net, c = compiled
    prog = c.native.program
    whole, stepwise = counted(prog, "sf_run"), counted(prog, layer_norm(c))
    rows = next(n for n in prog.thresholds if n.startswith("th_linear_rows_32_128"))
    band = rows.replace("rows", "library")
    saved = {n: prog.thresholds[n] for n in (rows, band)}
    gen = torch.Generator().manual_seed(3)
    try:
        prog.set_threshold(rows, 0)  # the FFN's first linear in oneDNN at every size
        prog.set_threshold(band, 4096)
        ids, mask = inputs(2, 9, gen)
        with torch.no_grad():
            assert torch.allclose(c(ids, mask), net(ids, mask), rtol=1e-4, atol=1e-5)
        assert not whole and stepwise  # step by step
    finally:
        for n, v in saved.items():
            prog.set_threshold(n, v)
    c(ids, mask)
    assert len(whole) == 1


def test_switch_points_set_by_hand_reach_the_cxx_call(compiled):
    net, c = compiled
    prog = c.native.program
    ns = prog._ns
    names = [n for n in ns["run_threshold_names"] if n.startswith("th_linear_split_")]
    assert names
    saved = {n: prog.thresholds[n] for n in names}
    gen = torch.Generator().manual_seed(4)
    ids, mask = inputs(3, 11, gen)
    with torch.no_grad():
        want = net(ids, mask)
    try:
        for value in (0, 4096):  # the row GEMM's threads on the rows first, then on the panels
            for n in names:
                prog.set_threshold(n, value)
            assert all(ns["run_thresholds"][ns["run_threshold_names"].index(n)] == value for n in names)
            assert torch.allclose(c(ids, mask), want, rtol=1e-4, atol=1e-5)
    finally:
        for n, v in saved.items():
            prog.set_threshold(n, v)


def test_a_bad_index_in_the_cxx_call_is_a_clear_error(compiled):
    _, c = compiled
    ids, mask = inputs(2, 5, torch.Generator().manual_seed(5))
    ids[1, 3] = 50
    with pytest.raises(IndexError, match=r"index 50 is out of range"):
        c(ids, mask)


def test_a_program_with_a_step_run_by_torch_says_why_it_has_no_cxx_call(tmp_path):
    class Recurrent(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lstm = torch.nn.LSTM(8, 16, batch_first=True)

        def forward(self, x):
            return self.lstm(x)[0].relu()

    torch.manual_seed(0)
    net = Recurrent().eval()
    c = symfuse.compile(net, (torch.randn(2, 5, 8),), {"x": {0: "B", 1: "T"}}, cache_dir=str(tmp_path))
    assert c.native.host.run is None and "sf_run" not in c.native.program.source
    assert re.search(r"lstm\w* runs through torch", c.native.host.run_missing)
    assert "Python calls the steps one by one (no single C++ call: " in c.explain()
    x = torch.randn(3, 4, 8)
    with torch.no_grad():
        assert torch.allclose(c(x), net(x), rtol=1e-4, atol=1e-5)


def test_a_bf16_program_runs_as_one_cxx_call_unless_its_row_kernel_multiplies_by_amx(tmp_path):
    """precision="bf16": the bf16 row GEMM's team form runs inside `sf_run` (where the machine's
    bf16 row kernel multiplies by vector instructions; by AMX tiles it keeps a region of its
    own, and `explain` says why), bit-identical to the same steps one region each and close to
    eager float32. On a CPU without bf16 instructions the program is float32 and still one call."""
    torch.manual_seed(0)
    net = Layer().eval()
    gen = torch.Generator().manual_seed(6)
    dims = {0: "B", 1: "S"}
    by_hand = {"linear_rows": 4096, "linear_rows_bf16": 4096}  # the row kernel at every size
    c = symfuse.compile(
        net, inputs(2, 8, gen), (dims, dims), precision="bf16", thresholds=by_hand, cache_dir=str(tmp_path)
    )
    host, prog = c.native.host, c.native.program
    amx = host.bf16_multiply is not None and host.bf16_multiply.value == 2
    if amx:
        assert host.run is None and "multiplies by AMX tiles" in host.run_missing
        assert "no single C++ call: " in c.explain(with_graph=False)
    else:
        assert host.run is not None
        gemm = "sf_rows_gemm_bf16_team(" if c.native.precision == "bf16" else "sf_rows_gemm_team("
        assert gemm in c.native.gen.source.split('extern "C" void sf_run(', 1)[1]
    whole = counted(prog, "sf_run") if host.run else []
    for b, s in [(1, 1), (2, 16), (3, 13)]:
        ids, mask = inputs(b, s, gen)
        with torch.no_grad():
            want = net(ids, mask)
        got = c(ids, mask)
        assert got.dtype == torch.float32  # stored in bf16, returned as eager returns it
        cos = torch.nn.functional.cosine_similarity(got.flatten(), want.flatten(), dim=0)
        assert cos > 0.999, (b, s, cos)
        tensors = c._inputs((), {"ids": ids, "mask": mask})
        (alone,) = prog(tensors, c.guard(tensors), whole=False)
        assert torch.equal(alone, got)
    assert len(whole) == (0 if amx else 3)
