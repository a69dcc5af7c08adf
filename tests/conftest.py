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
