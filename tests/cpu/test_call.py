"""The host code's kernel caller (runtime/call.py): the same results as ctypes, clear errors."""

import ctypes
import re

import pytest
import torch

import symfuse
from symfuse.codegen.cpu import target as tg
from symfuse.codegen.cpu.build import kernel_caller
from symfuse.codegen.cpu.calibrate import row_kernel
from symfuse.codegen.cpu.gemm import pack_panels, tile_for
from symfuse.options import Options
from symfuse.runtime.call import python_include

HERE = tg.detect("g++")
pytestmark = pytest.mark.skipif(not python_include(), reason="this Python has no headers to build the caller with")


@pytest.fixture(scope="module")
def opts(tmp_path_factory):
    return Options(cache_dir=str(tmp_path_factory.mktemp("kernels")))


def test_caller_runs_a_kernel_as_ctypes_does(opts):
    Kernel = kernel_caller(HERE, opts)
    assert Kernel is not None
    rows = row_kernel(HERE, opts)  # ctypes
    fast = Kernel(ctypes.cast(rows, ctypes.c_void_p).value, len(rows.argtypes))
    gen = torch.Generator().manual_seed(0)
    m, n, k = 7, 37, 19
    w, a, bias = torch.randn(n, k, generator=gen), torch.randn(m, k, generator=gen), torch.randn(n, generator=gen)
    wp = pack_panels(w, tile_for(HERE).panel)
    for b in (bias, None):  # None is a null pointer, as ctypes passes it
        want, got = torch.full((m, n), float("nan")), torch.full((m, n), float("nan"))
        bp = b.data_ptr() if b is not None else None
        rows(a.data_ptr(), k, wp.data_ptr(), bp, want.data_ptr(), n, m, n, k, 0)
        fast(a.data_ptr(), k, wp.data_ptr(), bp, got.data_ptr(), n, m, n, k, 0)
        assert torch.equal(got, want) and not got.isnan().any()
    with pytest.raises(TypeError, match="a symfuse kernel of 10 arguments was called with 2"):
        fast(1, 2)
    with pytest.raises(TypeError, match="'float' object cannot be interpreted as an integer"):
        fast(1.5, *range(9))
    with pytest.raises(ValueError, match="a kernel takes 0 to 24 arguments"):
        Kernel(0, 25)


def test_compiled_programs_call_through_it(opts):
    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(24, 40)

        def forward(self, x, idx):
            return torch.nn.functional.gelu(self.lin(x)).softmax(-1)[:, idx]

    torch.manual_seed(0)
    net = Net().eval()
    x, idx = torch.randn(5, 24), torch.tensor([0, 3, -1])
    c = symfuse.compile(net, (x, idx), {"x": {0: "B"}, "idx": {0: "I"}}, cache_dir=opts.cache_dir)
    assert c.native.program.fast_calls
    # the weights' and bias's addresses are read, not asked of their tensors at every call
    source = c.native.program.source
    assert re.search(r"\bap_p_\w+, ac_p_\w+", source)
    assert not re.search(r"\b[cp]_\w+\.data_ptr\(\)", source)
    for b, i in [(1, 1), (13, 4), (16, 2)]:
        x, idx = torch.randn(b, 24), torch.randint(-40, 40, (i,))
        with torch.no_grad():
            assert torch.allclose(c(x, idx), net(x, idx), rtol=1e-4, atol=1e-6)
    with pytest.raises(IndexError, match="index 40 is out of range"):  # the error slot, read through its address
        c(x, torch.tensor([40]))


def test_kernels_with_more_arguments_than_the_caller_takes_use_ctypes(opts):
    class Wide(torch.nn.Module):  # one kernel reading x and 30 weights: 34 arguments
        def __init__(self):
            super().__init__()
            self.ws = torch.nn.ParameterList(torch.nn.Parameter(torch.randn(2)) for _ in range(30))

        def forward(self, x):
            return torch.cat([x * w for w in self.ws], dim=-1).relu()

    torch.manual_seed(0)
    net = Wide().eval()
    c = symfuse.compile(net, (torch.randn(3, 2),), {"x": {0: "B"}}, cache_dir=opts.cache_dir)
    ks = vars(c.native.program.kernels)
    assert c.native.program.fast_calls and any(isinstance(k, ctypes._CFuncPtr) for k in ks.values())
    for b in (1, 7):
        x = torch.randn(b, 2)
        with torch.no_grad():
            assert torch.allclose(c(x), net(x))
