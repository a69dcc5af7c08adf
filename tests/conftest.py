import importlib.util
import math
import os
import shutil

# Triton's interpreter must be chosen before triton is first imported (its own library
# functions are decorated then), and some tests import it indirectly: on a machine without
# an NVIDIA GPU every Triton kernel of the test session runs in the interpreter.
if shutil.which("nvidia-smi") is None:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(2)


def rel_err(a, b) -> float:
    """Largest difference relative to the reference's largest magnitude, over nested outputs."""
    if isinstance(a, torch.Tensor):
        assert a.shape == b.shape, f"shape {tuple(a.shape)} != {tuple(b.shape)}"
        assert a.dtype == b.dtype, f"dtype {a.dtype} != {b.dtype}"
        if a.numel() == 0:
            return 0.0
        if not a.dtype.is_floating_point:
            return 0.0 if torch.equal(a, b) else float("inf")
        a, b = a.detach(), b.detach()
        err = float((a - b).abs().max() / b.abs().max().clamp_min(1e-12))
        return float("inf") if math.isnan(err) else err  # (max() over nested outputs would drop a NaN)
    if hasattr(a, "to_tuple"):
        a, b = a.to_tuple(), b.to_tuple()
    assert len(a) == len(b)
    return max(rel_err(x, y) for x, y in zip(a, b))


@pytest.fixture
def seeded():
    torch.manual_seed(0)


# -- tiers and skips ---------------------------------------------------------------------
def pytest_collection_modifyitems(config, items):
    """tests/models/ is the slow tier: its tests are marked `models` by their folder."""
    for item in items:
        if item.path.parent.name == "models" and item.path.parent.parent.name == "tests":
            item.add_marker(pytest.mark.models)


# tests a CI machine that can run them must not skip: (file, what the machine needs, whether it has it)
_MUST_RUN = (
    ("test_emulated.py", "qemu-aarch64 and aarch64-linux-gnu-g++",
     lambda: bool(shutil.which("qemu-aarch64") and shutil.which("aarch64-linux-gnu-g++"))),
    ("test_gpu.py", "triton (its interpreter)", lambda: importlib.util.find_spec("triton") is not None),
)  # fmt: skip
_skipped: list[tuple[str, str, tuple]] = []  # (test, why it skipped, its entry of _MUST_RUN)


def pytest_runtest_logreport(report):
    if not report.skipped:
        return
    file = report.nodeid.split("::")[0]
    must = next((m for m in _MUST_RUN if file.endswith("/" + m[0])), None)
    if must is not None:
        _skipped.append((report.nodeid, str(report.longrepr[-1]) if isinstance(report.longrepr, tuple) else "", must))


def pytest_sessionfinish(session, exitstatus):
    """In CI, a skip of a test this machine can run fails the run: an emulated-CPU or
    interpreter test that skips silently would leave a backend untested."""
    if not os.environ.get("CI"):
        return
    bad = [(n, why, needs) for n, why, (_, needs, has) in _skipped if has()]
    if bad:
        print(f"\nCI: {len(bad)} test(s) skipped on a machine that can run them:")
        for n, why, needs in bad[:20]:
            print(f"  {n}: {why} (this machine has {needs})")
        session.exitstatus = 1
