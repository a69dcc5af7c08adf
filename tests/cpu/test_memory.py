"""Memory under changing shapes: resident memory stays flat over many calls, the workspace's
high-water mark is reported, and it can be capped and released."""

import os

import pytest
import torch

from tests.support.reliability_models import compile_encoder, encoder_inputs

SHAPES = [(1, 1), (8, 64), (2, 7), (4, 33), (1, 128), (3, 16)]


def rss_mb() -> float:
    if not os.path.exists("/proc/self/statm"):
        pytest.skip("resident memory is read from /proc/self/statm (Linux)")
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _calls(compiled, n: int) -> None:
    inputs = [encoder_inputs(b, s, seed=b + s) for b, s in SHAPES]
    for i in range(n):
        compiled(*inputs[i % len(inputs)])


def test_workspace_high_water_cap_and_release():
    _, c = compile_encoder()
    c(*encoder_inputs(1, 4))
    small = c.memory()["high_water"]
    c(*encoder_inputs(8, 128))
    mem = c.memory()
    assert mem["high_water"] > small > 0 and mem["held"] >= mem["high_water"]
    assert "workspace: high-water" in c.explain(with_graph=False)
    assert c.release_workspace() >= mem["high_water"] and c.memory()["held"] == 0
    c.cap_workspace(small)
    want = c(*encoder_inputs(8, 128))
    assert c.memory()["held"] == 0  # over the cap: the call's buffer went with the call
    c(*encoder_inputs(1, 4))
    assert 0 < c.memory()["held"] <= max(small, 64)
    c.cap_workspace(None)
    assert torch.equal(c(*encoder_inputs(8, 128)), want)


def test_resident_memory_is_flat_over_varying_shapes():
    _, c = compile_encoder()
    _calls(c, 60)  # every shape once, caches warm
    before = rss_mb()
    _calls(c, 1200)
    growth = rss_mb() - before
    assert growth < 8, f"resident memory grew {growth:.1f} MB over 1,200 calls"


@pytest.mark.models
def test_resident_memory_over_ten_thousand_calls():
    _, c = compile_encoder()
    _calls(c, 60)
    before = rss_mb()
    _calls(c, 10_000)
    growth = rss_mb() - before
    print(f"\nRSS growth over 10,000 calls: {growth:.2f} MB")
    assert growth < 8, f"resident memory grew {growth:.1f} MB over 10,000 calls"


def test_large_outputs_take_the_memory_of_outputs_the_caller_has_dropped():
    """An output of 1 MiB or more is written into the memory of the last output of its size
    once the caller holds no tensor on it (a fresh allocation that large is faulted in page by
    page while the kernel writes it); never while the caller holds it or a view of it."""
    import symfuse

    norm = torch.nn.LayerNorm(512).eval()
    c = symfuse.compile(norm, (torch.randn(4, 512),), ({0: "N"},))
    x = torch.randn(1024, 512)  # a 2 MiB output
    with torch.no_grad():
        want = norm(x)

    first = c(x)
    second = c(x)  # the first is held: other memory
    assert second.data_ptr() != first.data_ptr()
    view = second[3:]
    del first, second
    third = c(x)  # a view of the second is held: other memory again
    assert third.data_ptr() != view.data_ptr() - 3 * 512 * 4
    reused = third.data_ptr()
    del third, view
    fourth = c(x)  # nothing held: the third's memory
    assert fourth.data_ptr() == reused
    assert torch.allclose(fourth, want, atol=1e-5)
    small = c(torch.randn(3, 512))  # small outputs come from the allocator as before
    assert small.untyped_storage().nbytes() == 3 * 512 * 4
    assert c.release_workspace() >= 1024 * 512 * 4
    assert torch.allclose(c(x), want, atol=1e-5)
