"""The bad-input catalogue: each case gets a clear error that names the input, the dim and
the rule, or the same result as eager; never a crash, a hang or a wrong answer."""

import pytest
import torch

import symfuse
from symfuse.runtime.program import NativeIndexError
from tests.support.reliability_models import compile_encoder, encoder_inputs


@pytest.fixture(scope="module")
def encoder():
    return compile_encoder()


def test_wrong_rank_dtype_device_and_type(encoder):
    _, c = encoder
    ids, mask = encoder_inputs(2, 5)
    with pytest.raises(ValueError, match=r"input 'ids' must have rank 2, got shape \(10,\)"):
        c(ids.reshape(-1), mask)
    with pytest.raises(ValueError, match=r"input 'ids' must have dtype torch.int64, got torch.float32"):
        c(ids.float(), mask)
    with pytest.raises(ValueError, match=r"input 'mask' must be on device cpu, got meta"):
        c(ids, mask.to("meta"))
    with pytest.raises(ValueError, match=r"input 'ids' must be a torch.Tensor, got list"):
        c(ids.tolist(), mask)


def test_dims_that_break_a_rule_name_the_input_dim_and_rule(encoder):
    _, c = encoder
    ids, _ = encoder_inputs(2, 5)
    _, mask = encoder_inputs(2, 6)
    with pytest.raises(ValueError, match=r"input 'mask' dim 1 is 6, but it is 'S', which is 5 from input 'ids' dim 1"):
        c(ids, mask)


def test_an_empty_batch_is_a_clear_error(encoder):
    _, c = encoder
    ids, mask = encoder_inputs(2, 5)
    with pytest.raises(ValueError, match=r"input 'ids' dim 0.*'B' must be in \[1, "):
        c(ids[:0], mask[:0])


def test_out_of_range_and_negative_indices_are_errors_not_crashes(encoder):
    _, c = encoder
    ids, mask = encoder_inputs(2, 5)
    for bad in (50, 10**9, -1):
        x = ids.clone()
        x[1, 3] = bad
        with pytest.raises(NativeIndexError, match=rf"index {bad} is out of range \[0, 50\)"):
            c(x, mask)
    assert torch.equal(c(ids, mask), c(ids, mask))  # the module keeps working afterwards


def test_strided_and_non_contiguous_inputs_give_eager_results(encoder):
    model, c = encoder
    ids, mask = encoder_inputs(3, 20)
    for a, m in ((ids[:, ::2], mask[:, ::2]), (ids.t().contiguous().t(), mask.t().contiguous().t()),
                 (ids[1:], mask[1:]), (ids.expand(3, 20), mask.expand(3, 20))):  # fmt: skip
        with torch.no_grad():
            want = model(a, m)
        torch.testing.assert_close(c(a, m), want, rtol=1e-4, atol=1e-5)


def test_nan_and_inf_propagate_as_in_eager(encoder):
    model, c = encoder
    ids, mask = encoder_inputs(2, 7)
    for value in (float("nan"), float("inf"), -float("inf")):
        m = mask.clone()
        m[0, 1] = value
        with torch.no_grad():
            want = model(ids, m)
        got = c(ids, m)
        assert torch.equal(torch.isnan(got), torch.isnan(want)), value
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5, equal_nan=True)


class TwoInputs(torch.nn.Module):
    def forward(self, x, y):
        return torch.tanh(x) * y + x, x[:, :1], x  # the last two alias the input in eager


def test_aliasing_inputs_and_outputs_that_alias_an_input():
    model = TwoInputs()
    x = torch.randn(3, 5)
    c = symfuse.compile(model, (x, x.clone()), {"x": {0: "B", 1: "N"}, "y": {0: "B", 1: "N"}})
    for b, n in ((1, 1), (4, 7), (2, 16)):
        t = torch.randn(b, n)
        got, want = c(t, t), model(t, t)  # the same tensor as both inputs
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w)
        before = t.clone()
        got[2].add_(1.0)  # writing to an output never corrupts the next call's inputs
        torch.testing.assert_close(c(before, before)[0], model(before, before)[0])


@pytest.mark.models
def test_sizes_past_int32_index_correctly():
    """2**31 + 37 elements: an index computed in 32 bits would wrap."""

    class AddOne(torch.nn.Module):
        def forward(self, x):
            return x + 1

    c = symfuse.compile(AddOne(), torch.zeros(4, 8, dtype=torch.int8), {"x": {0: "R", 1: "C"}})
    x = torch.zeros(2**31 // 37 + 2, 37, dtype=torch.int8)
    assert x.numel() > 2**31
    x[-1, -1] = 5
    y = c(x)
    assert y.shape == x.shape and int(y[-1, -1]) == 6 and int(y[0, 0]) == 1 and int(y[-1, 0]) == 1
