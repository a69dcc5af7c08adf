"""Differential fuzzing: random programs of registry ops over symbolic shapes, each batch
compiled once and run at B, S in (1, 1), (3, 7), (2, 16), (5, 33), (2, 130) against eager
torch and the reference executor. CI runs 30 batches of 10 programs from a fixed seed
(hypothesis, derandomized); the long run is `python -m tests.cpu.fuzz.corpus 10000`."""

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.cpu.fuzz.corpus import check_batch, mismatch, programs_for


@settings(max_examples=30, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])  # fmt: skip
@given(seed=st.integers(0, 2**31 - 1))
def test_random_programs_agree_with_eager_and_reference(seed):
    problems = check_batch(programs_for(seed, 10), seed=seed % 10_000)
    assert not problems, "\n".join(problems[:5])


def test_the_comparison_catches_real_differences():
    x = torch.randn(4, 5)
    assert mismatch(x, x.clone()) == ""
    assert "max abs error" in mismatch(x + 1e-2, x)
    y = x.clone()
    y[1, 2] = float("nan")
    assert mismatch(y, x) == "NaN positions differ"
    z = x.clone()
    z[0, 0] = float("inf")
    w = z.clone()
    w[0, 0] = -float("inf")
    assert mismatch(w, z) == "infinities differ"
    assert "shape" in mismatch(x[:, :4], x)


def test_ill_conditioned_programs_are_judged_against_float64():
    """cos(exp(x)) for exp near 3000: a last-bit difference in exp moves cos by 1e-4, in
    eager too. Such a result passes when it is as close to float64 as eager is; a real
    error does not."""
    from tests.cpu.fuzz.corpus import as_accurate

    x = torch.linspace(7.0, 8.0, 1000)
    exact = torch.cos(torch.exp(x.double()))
    eager = torch.cos(torch.exp(x))
    shifted = torch.cos(torch.exp(x) * (1 + 2**-23))  # exp one ulp off, as another library may be
    assert mismatch(shifted, eager) != ""  # beyond the fixed tolerance...
    assert as_accurate(shifted, eager, exact)  # ...but as accurate as eager
    assert not as_accurate(shifted + 1e-2, eager, exact)
