"""aarch64: the NEON version of the hand-written kernels, cross-compiled and run under
qemu-user, against torch on this machine.

A small harness is appended to the generated library: it reads each kernel argument from a
file, calls the kernel and writes the output back. It runs the row GEMM (every activation,
tails of the panel) and both forms of the merged attention kernel (whose row code is the
generated softmax). Needs Debian's g++-aarch64-linux-gnu and qemu-user, which
`scripts/test.sh` installs when it runs as root.
"""

import os
import shutil
import subprocess

import pytest
import torch

from symfuse.codegen.compile import generate
from symfuse.codegen.cpu import target as tg
from symfuse.codegen.cpu.calibrate import canonical_attention
from symfuse.codegen.cpu.gemm import ACTIVATIONS, pack_panels, tile_for
from symfuse.ir.dims import evaluate
from symfuse.reference import ReferenceExecutor
from tests.conftest import rel_err
from tests.test_isa import ACTS

CXX, QEMU = "aarch64-linux-gnu-g++", "qemu-aarch64"
pytestmark = pytest.mark.skipif(
    not (shutil.which(CXX) and shutil.which(QEMU)),
    reason=f"needs {CXX} and {QEMU} (apt-get install g++-aarch64-linux-gnu qemu-user; scripts/test.sh does as root)",
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
  if (std::string(argv[1]) == "linear") {  // linear DIR M N K ACT HAS_BIAS
    const long M = std::atol(argv[3]), N = std::atol(argv[4]), K = std::atol(argv[5]), act = std::atol(argv[6]);
    auto a = slurp(dir, "a"), w = slurp(dir, "w"), b = slurp(dir, "bias");
    std::vector<float> c(M * N);
    sf_linear_rows((float*)a.data(), K, (float*)w.data(), std::atol(argv[7]) ? (float*)b.data() : nullptr,
                   c.data(), N, M, N, K, act);
    spill(dir, "c", c.data(), c.size() * 4);
    return 0;
  }
  // KERNEL DIR OUT_BYTES SYM...: the kernel's buffers from DIR/<name>.bin, in signature order
  std::vector<int64_t> sym;
  for (int i = 4; i < argc; ++i) sym.push_back(std::atol(argv[i]));
@CALLS@
  return 1;
}
"""


@pytest.fixture(scope="module")
def program(tmp_path_factory):
    """The canonical attention's C++ for NEON plus the harness, built static for aarch64."""
    target = tg.target_for("neon", cxx=CXX)
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
    source = gen.source.replace("#include <memory>", "#include <memory>\n#include <string>", 1)
    source += HARNESS.replace("@CALLS@", "\n".join(calls))
    d = tmp_path_factory.mktemp("aarch64")
    src, exe = d / "kernels.cpp", d / "kernels"
    src.write_text(source)
    cmd = [CXX, *target.all_flags, "-static", str(src), "-o", str(exe)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    return exe, gen, graph, target


def run(exe, *args):
    r = subprocess.run([QEMU, str(exe), *map(str, args)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr


def test_row_gemm_on_aarch64(program, tmp_path):
    import numpy as np

    exe, _, _, target = program
    panel = tile_for(target).panel
    gen = torch.Generator().manual_seed(0)
    for m, n, k in [(1, 1, 1), (5, panel + 3, 17), (13, 3 * panel + 1, 64), (7, 37, 5)]:
        a, w, bias = torch.randn(m, k, generator=gen), torch.randn(n, k, generator=gen), torch.randn(n, generator=gen)
        a.numpy().tofile(tmp_path / "a.bin")
        pack_panels(w, panel).numpy().tofile(tmp_path / "w.bin")
        bias.numpy().tofile(tmp_path / "bias.bin")
        for name, code in ACTIVATIONS.items():
            run(exe, "linear", tmp_path, m, n, k, code, 1)
            got = torch.from_numpy(np.fromfile(tmp_path / "c.bin", dtype="float32")).view(m, n)
            want = ACTS[name](torch.nn.functional.linear(a, w, bias))
            assert torch.allclose(got, want, rtol=1e-4, atol=1e-5), (m, n, k, name)


def test_merged_attention_on_aarch64(program, tmp_path):
    import numpy as np

    exe, gen, graph, _ = program
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
            run(exe, st.name, tmp_path, extent * 4, *[binding[n] for n in gen.symbols])
            flat = torch.from_numpy(np.fromfile(tmp_path / "out.bin", dtype="float32"))
            got = flat.as_strided(shape, strides)
            assert rel_err(got, want[st.out]) < 1e-4, (st.name, b, h, s, d)
    assert os.path.getsize(exe) > 0
