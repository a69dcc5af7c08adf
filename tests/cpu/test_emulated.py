"""Other CPUs, emulated by qemu-user: an aarch64 CPU (NEON), an AVX2-only x86 CPU
(Haswell) and an x86 CPU without AVX (Nehalem), whatever CPU runs the tests.

For each, the target is detected by running symfuse's real probes under the emulator, the
generated code for that target is built as a static program (cross-compiled for aarch64)
with a small harness appended (it reads each kernel argument from a file, calls the kernel
and writes the output back), and run under the emulator: the row GEMM (every activation,
tails of the panel) and both forms of the merged attention kernel (whose row code is the
generated softmax) and the LSTM recurrence, against torch on this machine. An instruction the emulated CPU lacks
would kill the program (SIGILL). Needs Debian's g++-aarch64-linux-gnu and qemu-user, which
`scripts/test.sh` installs when it runs as root.
"""

import os
import shutil
import subprocess
import sys

import pytest
import torch

from symfuse.codegen.cpu import target as tg
from symfuse.codegen.cpu.calibrate import canonical_attention
from symfuse.codegen.cpu.gemm import ACTIVATIONS, pack_panels, tile_for
from symfuse.codegen.cpu.generate import generate
from symfuse.codegen.cpu.lstm import LSTM_SOURCE
from symfuse.codegen.cpu.paged import PAGED_SOURCE
from symfuse.ir.dims import evaluate
from symfuse.reference import ReferenceExecutor
from symfuse.runtime.kv import BLOCK, kernel_arguments, paged_attention
from tests.conftest import rel_err
from tests.cpu.test_isa import ACTS

# name: (architecture, compiler, emulator command, the ISA detection must find)
MACHINES = {
    "aarch64": ("aarch64", "aarch64-linux-gnu-g++", ["qemu-aarch64", "-L", "/usr/aarch64-linux-gnu"], "neon"),
    "haswell": ("x86_64", "g++", ["qemu-x86_64", "-cpu", "Haswell-v4"], "avx2"),
    "nehalem": ("x86_64", "g++", ["qemu-x86_64", "-cpu", "Nehalem"], "generic"),
}
pytestmark = pytest.mark.skipif(
    not all(shutil.which(m[1]) and shutil.which(m[2][0]) for m in MACHINES.values()),
    reason="needs aarch64-linux-gnu-g++ and qemu-user (apt-get install g++-aarch64-linux-gnu qemu-user; "
    "scripts/test.sh does as root)",
)

HARNESS = r"""
#include <cstdio>
#include <cstdlib>
#include <vector>
struct Any {  // a buffer's address, converted to whatever pointer the kernel's signature takes
  char* p;
  template <class T> operator T*() const { return (T*)p; }
};
static std::vector<char> slurp(const char* dir, const char* name) {
  char path[4096];
  std::snprintf(path, sizeof path, "%s/%s.bin", dir, name);
  FILE* f = std::fopen(path, "rb");
  if (!f) { std::perror(path); std::exit(2); }
  std::fseek(f, 0, SEEK_END);
  std::vector<char> data(std::ftell(f) + 64);
  std::fseek(f, 0, SEEK_SET);
  if (std::fread(data.data(), 1, data.size() - 64, f) != data.size() - 64) std::exit(3);
  std::fclose(f);
  return data;
}
static void spill(const char* dir, const char* name, const void* p, long bytes) {
  char path[4096];
  std::snprintf(path, sizeof path, "%s/%s.bin", dir, name);
  FILE* f = std::fopen(path, "wb");
  std::fwrite(p, 1, bytes, f);
  std::fclose(f);
}
int main(int argc, char** argv) {
  const char* dir = argv[2];
  if (std::string(argv[1]) == "linear") {  // linear DIR M N K ACT HAS_BIAS SPLIT
    const long M = std::atol(argv[3]), N = std::atol(argv[4]), K = std::atol(argv[5]), act = std::atol(argv[6]);
    auto a = slurp(dir, "a"), w = slurp(dir, "w"), b = slurp(dir, "bias");
    std::vector<float> c(M * N);
    (std::atol(argv[8]) ? sf_linear_rows_split : sf_linear_rows)(
        (float*)a.data(), K, (float*)w.data(), std::atol(argv[7]) ? (float*)b.data() : nullptr, c.data(), N, M, N, K,
        act);
    spill(dir, "c", c.data(), c.size() * 4);
    return 0;
  }
  if (std::string(argv[1]) == "lstm") {  // lstm DIR T B H REVERSE
    const long T = std::atol(argv[3]), B = std::atol(argv[4]), H = std::atol(argv[5]);
    auto g = slurp(dir, "g"), wt = slurp(dir, "wt"), h = slurp(dir, "h"), c = slurp(dir, "c");
    std::vector<float> out(T * B * H);
    sf_lstm((float*)g.data(), (float*)wt.data(), (float*)h.data(), (float*)c.data(), out.data(), H, T, B, H,
            std::atol(argv[6]));
    spill(dir, "out", out.data(), out.size() * 4);
    spill(dir, "hn", h.data(), B * H * 4);
    spill(dir, "cn", c.data(), B * H * 4);
    return 0;
  }
  if (std::string(argv[1]) == "lstm_input") {  // lstm_input DIR M K N
    const long M = std::atol(argv[3]), K = std::atol(argv[4]), N = std::atol(argv[5]);
    auto x = slurp(dir, "x"), wt = slurp(dir, "wt"), b = slurp(dir, "bias");
    std::vector<float> g(M * N);
    sf_lstm_input((float*)x.data(), K, (float*)wt.data(), (float*)b.data(), g.data(), M, K, N);
    spill(dir, "g", g.data(), g.size() * 4);
    return 0;
  }
  if (std::string(argv[1]) == "paged") {  // paged DIR OUT_FLOATS BF16: runtime/kv.kernel_arguments' files
    auto q = slurp(dir, "q"), k = slurp(dir, "k"), v = slurp(dir, "v"), kp = slurp(dir, "kp"), vp = slurp(dir, "vp"),
         table = slurp(dir, "table"), lengths = slurp(dir, "lengths"), dims = slurp(dir, "dims");
    std::vector<float> out(std::atol(argv[3]));
    if (std::atol(argv[4]))
      sf_paged_attention_bf16(Any{q.data()}, Any{k.data()}, Any{v.data()}, Any{kp.data()}, Any{vp.data()},
                              Any{table.data()}, Any{lengths.data()}, out.data(), Any{dims.data()});
    else
      sf_paged_attention(Any{q.data()}, Any{k.data()}, Any{v.data()}, Any{kp.data()}, Any{vp.data()},
                         Any{table.data()}, Any{lengths.data()}, out.data(), Any{dims.data()});
    spill(dir, "out", out.data(), out.size() * 4);
    return 0;
  }
  // KERNEL DIR OUT_BYTES SYM...: the kernel's buffers from DIR/<name>.bin, in signature order
  std::vector<int64_t> sym;
  for (int i = 4; i < argc; ++i) sym.push_back(std::atol(argv[i]));
@CALLS@
  return 1;
}
"""


def emulated_target(monkeypatch, name: str) -> tg.Target:
    """Detect the target as symfuse does, with every probe program run under the emulator."""
    arch, cxx, emulator, _ = MACHINES[name]
    run = subprocess.run

    def under_emulator(cmd, *a, **kw):
        if os.path.basename(cmd[0]) == "probe":  # the probe programs, not the compiler
            cmd = emulator + list(cmd)
        return run(cmd, *a, **kw)

    monkeypatch.setattr(tg, "machine_arch", lambda: arch)
    monkeypatch.setattr(subprocess, "run", under_emulator)
    return tg.detect(cxx)


@pytest.fixture(scope="module", params=sorted(MACHINES))
def program(request, tmp_path_factory):
    """The canonical attention's C++ for the emulated CPU's target plus the harness, built static."""
    with pytest.MonkeyPatch.context() as mp:
        target = emulated_target(mp, request.param)
    assert target.isa == MACHINES[request.param][3], target.describe()
    graph, store = canonical_attention()
    gen = generate(graph, store, target)
    calls = []
    for name, k in gen.kernels.items():
        loads = "\n".join(f'    auto b{i} = slurp(dir, "{a}");' for i, a in enumerate(k.args[1:], 1))
        ptrs = ", ".join(["Any{out.data()}"] + [f"Any{{b{i}.data()}}" for i in range(1, len(k.args))])
        calls.append(
            f'  if (std::string(argv[1]) == "{name}") {{\n'
            f"    std::vector<char> out(std::atol(argv[3]) + 64);\n{loads}\n"
            f"    {name}({ptrs}, sym.data(), 0, 1);\n"
            f'    spill(dir, "out", out.data(), std::atol(argv[3]));\n    return 0;\n  }}'
        )
    # the library's translation units as the build links them (the row GEMM's apart), the harness
    # in the model's
    *gemm, own = gen.parts
    own = own.replace("#include <memory>", "#include <memory>\n#include <string>", 1)
    own += LSTM_SOURCE + PAGED_SOURCE + HARNESS.replace("@CALLS@", "\n".join(calls))
    d = tmp_path_factory.mktemp(request.param)
    srcs, exe = [d / f"part{i}.cpp" for i in range(len(gen.parts))], d / "kernels"
    for src, text in zip(srcs, [*gemm, own]):
        src.write_text(text)
    cmd = [target.cxx, *target.all_flags, "-static", *map(str, srcs), "-o", str(exe)]
    cmd += ["-lmvec"] if target.libmvec else []
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    emulator = MACHINES[request.param][2]
    return lambda *args: _run(emulator, exe, *args), gen, graph, target


def _run(emulator, exe, *args):
    r = subprocess.run([*emulator, str(exe), *map(str, args)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]


def test_row_gemm(program, tmp_path):
    import numpy as np

    run, _, _, target = program
    tile = tile_for(target)
    panel, kc = tile.panel, tile.chunk
    gen = torch.Generator().manual_seed(0)
    # the last two walk K in chunks (one short), then as one piece (rows past twice a chunk)
    shapes = [(1, 1, 1), (5, panel + 3, 17), (13, 3 * panel + 1, 64), (7, 37, 5), (9, panel + 1, 2 * kc + 3)]
    for m, n, k in shapes + [(2 * kc + 1, 2 * panel - 1, kc + 1)]:
        a, w, bias = torch.randn(m, k, generator=gen), torch.randn(n, k, generator=gen), torch.randn(n, generator=gen)
        a.numpy().tofile(tmp_path / "a.bin")
        pack_panels(w, panel).numpy().tofile(tmp_path / "w.bin")
        bias.numpy().tofile(tmp_path / "bias.bin")
        # the threads on panels with every activation, on rows first (sf_linear_rows_split) with two
        for name, code, split in [(x, c, 0) for x, c in ACTIVATIONS.items()] + [("none", 0, 1), ("gelu", 1, 1)]:
            run("linear", tmp_path, m, n, k, code, 1, split)
            got = torch.from_numpy(np.fromfile(tmp_path / "c.bin", dtype="float32")).view(m, n)
            want = ACTS[name](torch.nn.functional.linear(a, w, bias))
            if k <= 64:
                assert torch.allclose(got, want, rtol=1e-4, atol=1e-5), (m, n, k, name, split)
            else:  # relative to the output's scale: sums of hundreds of products round apart
                assert (got - want).abs().max() <= 1e-4 * want.abs().max() + 1e-5, (m, n, k, name, split)


def test_lstm_recurrence(program, tmp_path):
    """Hidden sizes that take the four-vector blocks, single vectors and the scalar tail of
    every target, forwards and backwards, against the LSTM step written in torch; the input
    projection (`sf_lstm_input`) against addmm."""
    import numpy as np

    run = program[0]
    gen = torch.Generator().manual_seed(0)
    for t, b, h, reverse in [(1, 1, 7, 0), (5, 2, 40, 1), (9, 3, 70, 0), (4, 1, 64, 1), (3, 6, 21, 0)]:
        g, w = torch.randn(t, b, 4 * h, generator=gen), torch.randn(4 * h, h, generator=gen) / h**0.5
        h0, c0 = torch.randn(b, h, generator=gen), torch.randn(b, h, generator=gen)
        for name, x in [("g", g), ("wt", w.t().contiguous()), ("h", h0), ("c", c0)]:
            x.numpy().tofile(tmp_path / f"{name}.bin")
        run("lstm", tmp_path, t, b, h, reverse)
        hs, cs, want = h0, c0, torch.empty(t, b, h)
        for step in reversed(range(t)) if reverse else range(t):
            i, f, cand, o = (g[step] + hs @ w.t()).chunk(4, dim=1)
            cs = torch.sigmoid(f) * cs + torch.sigmoid(i) * torch.tanh(cand)
            hs = want[step] = torch.sigmoid(o) * torch.tanh(cs)
        for name, ref in [("out", want), ("hn", hs), ("cn", cs)]:
            got = torch.from_numpy(np.fromfile(tmp_path / f"{name}.bin", dtype="float32")).view(ref.shape)
            assert torch.allclose(got, ref, rtol=1e-4, atol=1e-5), (t, b, h, reverse, name)
    # the input projection of every step: four-row blocks, a tail of rows, columns past the vectors
    for m, k, n in [(1, 3, 28), (4, 32, 256), (7, 5, 160), (13, 64, 84)]:
        x, w, bias = torch.randn(m, k, generator=gen), torch.randn(n, k, generator=gen), torch.randn(n, generator=gen)
        for name, t in [("x", x), ("wt", w.t().contiguous()), ("bias", bias)]:
            t.numpy().tofile(tmp_path / f"{name}.bin")
        run("lstm_input", tmp_path, m, k, n)
        got = torch.from_numpy(np.fromfile(tmp_path / "g.bin", dtype="float32")).view(m, n)
        assert torch.allclose(got, torch.addmm(bias, x, w.t()), rtol=1e-4, atol=1e-5), (m, k, n)


def test_paged_attention(program, tmp_path):
    """The decoder's attention over a paged cache: float32 and bfloat16 caches, a head size
    past the vectors with a tail, pasts across block edges split over chunks, a window, grouped
    queries, scattered blocks; against `runtime/kv.paged_attention`."""
    import numpy as np

    run = program[0]
    hq, hkv, d = 6, 2, 20
    for i, (lengths, s, window, cache) in enumerate(
        [([0], 3, 0, torch.float32), ([17, 0], 1, 0, torch.float32), ([300], 2, 5, torch.float32),
         ([40, 3], 1, 0, torch.bfloat16)]
    ):  # fmt: skip
        g = torch.Generator().manual_seed(i)
        b, width = len(lengths), max(-(-(n + s) // BLOCK) for n in lengths)
        blocks = b * width + 2
        table = torch.randperm(blocks, generator=g)[: b * width].view(b, width)
        kv = [
            torch.randn(shape, generator=g).to(cache) for shape in [(b, hkv, s, d)] * 2 + [(blocks, hkv, BLOCK, d)] * 2
        ]
        x = (torch.randn(b, hq, s, d, generator=g), *kv, table, torch.tensor(lengths))
        for name, t in zip(("q", "k", "v", "kp", "vp", "table", "lengths", "dims"), kernel_arguments(*x, 0.3, window)):
            (t.view(torch.int16) if t.dtype == torch.bfloat16 else t).numpy().tofile(tmp_path / f"{name}.bin")
        run("paged", tmp_path, b * hq * s * d, int(cache == torch.bfloat16))
        got = torch.from_numpy(np.fromfile(tmp_path / "out.bin", dtype="float32")).view(b, hq, s, d)
        assert torch.allclose(got, paged_attention(*x, 0.3, window).float(), rtol=1e-4, atol=1e-5), (lengths, s)


def test_merged_attention(program, tmp_path):
    import numpy as np

    run, gen, graph, _ = program
    ref = ReferenceExecutor(graph)
    g = torch.Generator().manual_seed(1)
    attention = [st for st in gen.schedule.steps if st.name in gen.kernels and hasattr(st, "scores")]
    assert len(attention) == 2
    for b, h, s, d in [(1, 1, 1, 1), (2, 3, 7, 13), (1, 2, 31, 64)]:
        q, k, v = (torch.randn(b, h, s, d, generator=g) for _ in range(3))
        mask = torch.rand(b, 1, 1, s, generator=g) > 0.3
        mask[..., 0] = True
        bias = torch.where(mask, 0.0, -1e4)
        tensors = {"q": q, "k": k, "v": v, "mask": mask.to(torch.uint8), "bias": bias}
        for name, t in tensors.items():
            t.contiguous().numpy().tofile(tmp_path / f"{name}.bin")
        binding = dict(B=b, H=h, S=s, D=d)
        want = dict(zip([o.name for o in graph.outputs], ref.run(binding, [q, k, v, mask, bias])))
        for st in attention:
            buf = gen.schedule.buffers[st.out]
            shape = [evaluate(x, binding) for x in buf.shape]
            strides = [evaluate(x, binding) for x in buf.strides]
            extent = 1 + sum((n - 1) * st_ for n, st_ in zip(shape, strides))
            run(st.name, tmp_path, extent * 4, *[binding[n] for n in gen.symbols])
            flat = torch.from_numpy(np.fromfile(tmp_path / "out.bin", dtype="float32"))
            got = flat.as_strided(shape, strides)
            assert rel_err(got, want[st.out]) < 1e-4, (st.name, b, h, s, d)


WHOLE_MODEL = r"""
import torch, symfuse

class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv, self.out = torch.nn.Linear(32, 96), torch.nn.Linear(32, 32)
        self.norm, self.ff = torch.nn.LayerNorm(32), torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU())

    def forward(self, x, mask):
        b, s, _ = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, 2, 16).permute(2, 0, 3, 1, 4)
        a = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None, None, :])
        return self.ff(self.norm(x + self.out(a.transpose(1, 2).reshape(b, s, 32))))

torch.manual_seed(0)
m = Block().eval()
ex = (torch.randn(2, 5, 32), torch.ones(2, 5, dtype=torch.bool))
dyn = ({0: "B", 1: "S"}, {0: "B", 1: "S"})
# both versions of each run below: the row kernel at 1 row (threads on panels) and 33 (on rows,
# above oneDNN's band of 5-8 rows), oneDNN at 6 and 7; merged attention up to 6 keys
th = {"linear_rows": 4, "linear_library": 8, "linear_split": 6, "attention_keys_library": 6}
c = symfuse.compile(m, ex, dyn, thresholds=th)
assert c.native.target.isa == "ISA", c.native.target.describe()
for b, s in [(1, 1), (2, 3), (1, 7), (3, 11)]:
    x, mask = torch.randn(b, s, 32), torch.rand(b, s) > 0.2
    mask[:, 0] = True
    with torch.no_grad():
        want = m(x, mask)
    err = float((c(x, mask) - want).abs().max() / want.abs().max())
    assert err < 1e-4, (b, s, err)
print("ok", c.native.target.isa, symfuse.compile_count())
"""


@pytest.mark.models
@pytest.mark.parametrize("name", ["haswell"])
def test_a_whole_model_on_an_emulated_avx2_cpu(name, tmp_path):
    """Compile and run a small transformer block, torch and oneDNN included, in a Python
    process on the emulated CPU: nothing symfuse builds or loads needs more than AVX2.
    (qemu-user runs the probe programs the process starts on the real CPU, so the ISA is
    named here rather than detected: detection under emulation is the fixture's job.)"""
    _, _, emulator, isa = MACHINES[name]
    env = dict(os.environ, SYMFUSE_ISA=isa, SYMFUSE_CACHE_DIR=str(tmp_path / "k"), SYMFUSE_MACHINE_DIR=str(tmp_path))
    cmd = [*emulator, sys.executable, "-c", WHOLE_MODEL.replace('"ISA"', repr(isa))]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env)
    assert r.returncode == 0 and f"ok {isa} 1" in r.stdout, r.stderr[-3000:]
