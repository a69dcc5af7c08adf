"""Capture and bad input: clear errors that name the input, the dim and the rule."""

import pytest
import torch
from torch.export import Dim

import symfuse
from symfuse.shape.infer import reinfer
from tests.conftest import rel_err


class TwoUnsupported(torch.nn.Module):
    def forward(self, x):
        a = torch.fft.rfft(x).abs()
        return a.sum() + torch.linalg.det(x[..., :2, :2]).sum()


def test_unsupported_ops_are_all_listed_with_locations():
    with pytest.raises(symfuse.UnsupportedOpsError) as err:
        symfuse.compile(TwoUnsupported(), (torch.randn(3, 4, 4),), {"x": {0: "B"}})
    text = str(err.value)
    assert "2 op(s)" in text
    assert "aten.fft_rfft.default" in text and "aten.linalg_det.default" in text
    assert text.count("test_capture.py:") == 2
    assert [p[0] for p in err.value.problems] == ["aten.fft_rfft.default", "aten.linalg_det.default"]


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(6, 16)
        self.b = torch.nn.Linear(16, 6)

    def forward(self, x, y):
        return self.b(torch.relu(self.a(x))) + y


def test_positional_inputs_and_default_dynamic(seeded):
    m = MLP()
    x, y = torch.randn(3, 5, 6), torch.randn(3, 5, 6)
    c = symfuse.compile(m, (x, y))  # dynamic omitted: every dim the model lets vary
    assert str(c.graph.inputs[0].type) == "f32[x_0, x_1, 6]"
    for shape in [(1, 1, 6), (2, 13, 6), (16, 3, 6)]:
        x, y = torch.randn(shape), torch.randn(shape)
        assert rel_err(c(x, y), m(x, y)) < 1e-5


def test_a_dynamic_dim_with_an_example_of_one_is_grown_to_two_for_capture(seeded):
    m = MLP()
    before = symfuse.compile_count()
    c = symfuse.compile(m, (torch.randn(1, 5, 6), torch.randn(1, 5, 6)), ({0: "B", 1: "S"}, {0: "B", 1: "S"}))
    assert str(c.graph.inputs[0].type) == "f32[B, S, 6]"
    assert "input 'x' dim 0 ('B') had an example of size 1" in c.explain(with_graph=False)
    for shape in [(1, 5, 6), (3, 1, 6), (8, 13, 6)]:
        x, y = torch.randn(shape), torch.randn(shape)
        assert rel_err(c(x, y), m(x, y)) < 1e-5
    assert symfuse.compile_count() == before + 1


def test_inputs_given_the_same_tensor_in_the_example_stay_two_inputs(seeded):
    # torch.export alone captures both from one placeholder: a + relu(a) whatever b is
    m = MLP()
    x = torch.randn(3, 5, 6)
    c = symfuse.compile(m, (x, x), ({0: "B", 1: "S"}, {0: "B", 1: "S"}))
    assert "inputs 'x' and 'y' shared memory in the example" in c.explain(with_graph=False)
    for shape in [(1, 1, 6), (2, 7, 6), (4, 16, 6)]:
        x, y = torch.randn(shape), torch.randn(shape)
        assert rel_err(c(x, y), m(x, y)) < 1e-5
    assert rel_err(c(x, x), m(x, x)) < 1e-5


class VarArgs(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(6, 6)

    def forward(self, x, *rest, scale=1.0, **extra):
        out = self.a(x) * scale + rest[0] - rest[1]
        return out + extra["bias"] if "bias" in extra else out


class KeywordsOnly(torch.nn.Module):
    """forward(x, **extra): an input that only **kwargs takes."""

    def __init__(self):
        super().__init__()
        self.inner = VarArgs()

    def forward(self, x, **extra):
        return self.inner(x, x, x.relu(), **extra)


def test_inputs_that_forward_takes_by_star_args_and_kwargs(seeded):
    spec = {0: "B", 1: "S"}
    ex = [torch.randn(3, 5, 6) for _ in range(3)]
    before = symfuse.compile_count()
    va, kw = VarArgs(), KeywordsOnly()
    star = symfuse.compile(va, tuple(ex), {"x": spec, "rest_0": spec, "rest_1": spec})
    keywords = symfuse.compile(kw, {"x": ex[0], "bias": ex[1]}, {"x": spec, "bias": spec})
    assert star.captured.input_names == ["x", "rest_0", "rest_1"]
    assert keywords.captured.input_names == ["x", "bias"]
    for shape in [(1, 1, 6), (2, 7, 6), (4, 16, 6)]:
        xs = [torch.randn(shape) for _ in range(3)]
        with torch.no_grad():
            assert rel_err(star(*xs), va(*xs)) < 1e-5
            assert rel_err(keywords(x=xs[0], bias=xs[1]), kw(x=xs[0], bias=xs[1])) < 1e-5
    assert symfuse.compile_count() == before + 2


def test_a_transformer_compiled_from_a_batch_of_one_runs_any_batch(seeded):
    from symfuse.models import load

    case = load("bert-small")
    c = symfuse.compile(case.model, case.inputs(B=1, S=1), case.dynamic)  # one sentence of one token
    for b in (dict(B=1, S=1), dict(B=3, S=7), dict(B=2, S=64)):
        x = case.inputs(**b)
        with torch.no_grad():
            assert rel_err(c(**x).last_hidden_state, case.model(**x).last_hidden_state) < 1e-4


class WritesInPlace(torch.nn.Module):
    """Ops models write through views and in place (BART's shift of the decoder's tokens,
    DeBERTa's masked_fill, BLOOM's baddbmm with alpha and a pow of two tensors), each
    converted by value: a scatter is the parts around it concatenated."""

    def forward(self, ids, x, mask):
        shifted = ids.new_zeros(ids.shape)
        shifted[:, 1:] = ids[:, :-1].clone()
        shifted[:, 0] = 7
        shifted.masked_fill_(shifted == 3, 1)
        tail = x.clone()
        tail[:, -2:].fill_(0.5)
        tail[:, :1].copy_(x[:, -1:] * 2.0)
        scores = torch.baddbmm(x[:, :, :1], x, x.transpose(1, 2), beta=0.5, alpha=0.25)
        scores = scores.masked_fill(mask[:, None, :] == 0, float("-inf")).softmax(-1)
        nan_self = torch.full_like(x, float("nan"))
        zeroed = torch.baddbmm(nan_self, scores, x, beta=0.0)
        return shifted, tail, zeroed + torch.pow(x.abs() + 1.0, tail)


@pytest.mark.parametrize("shapes", [[(1, 3), (2, 5), (3, 16), (2, 37)]])
def test_scatters_fills_masked_fill_and_baddbmm_convert_by_value(shapes):
    m = WritesInPlace()

    def inputs(b, s, seed=0):
        g = torch.Generator().manual_seed(seed)
        mask = torch.ones(b, s)
        mask[0, s - s // 3 :] = 0
        return torch.randint(0, 6, (b, s), generator=g), torch.randn(b, s, 8, generator=g), mask

    before = symfuse.compile_count()
    dyn = {"ids": {0: "B", 1: "S"}, "x": {0: "B", 1: "S"}, "mask": {0: "B", 1: "S"}}
    c = symfuse.compile(m, inputs(2, 6), dyn)
    for b, s in shapes:
        x = inputs(b, s, seed=b * 100 + s)
        ref, out = m(*x), c(*x)
        assert torch.equal(out[0], ref[0]) and out[0][:, 0].eq(7).all()
        assert rel_err(out[1:], ref[1:]) < 1e-5
    assert symfuse.compile_count() == before + 1


class Pads(torch.nn.Module):
    """Constant pads (positive, negative, to a window multiple as Swin pads) and a 1-D pool."""

    def forward(self, x):
        a = torch.nn.functional.pad(x, (1, 2, 0, 3), value=-1.5)
        b = torch.nn.functional.pad(x, (-1, 2))
        to_window = (4 - x.shape[1] % 4) % 4
        c = torch.nn.functional.pad(x, (0, 0, 0, to_window))
        return a, b, c, torch.nn.functional.adaptive_avg_pool1d(x, 3)


def test_constant_pads_and_a_1d_pool(seeded):
    m = Pads()
    before = symfuse.compile_count()
    c = symfuse.compile(m, (torch.randn(2, 6, 9),), {"x": {0: "B", 1: "S", 2: "L"}})
    for shape in [(1, 1, 3), (2, 4, 7), (3, 13, 16), (1, 16, 31)]:
        x = torch.randn(shape)
        assert rel_err(c(x), m(x)) < 1e-6, shape
    assert symfuse.compile_count() == before + 1


class BranchesOnSizes(torch.nn.Module):
    def forward(self, x, y):  # "same" padding from the size's remainder; a branch on two sizes' equality
        pad = 1 if x.shape[-1] % 2 == 0 else 2
        out = torch.nn.functional.mish(torch.nn.functional.pad(x, (0, pad)))  # (mish: captured through decomposition)
        return out * 2.0 if x.shape[0] == y.shape[0] else out


def test_the_sizes_the_model_branched_on_are_checked_on_every_call(tmp_path):
    """torch.export traces one path of a branch on a size and records the condition as a
    guard: symfuse checks it on every call (a size on the other path is refused by name,
    never run through the traced path to a wrong shape); guards that only keep a size away
    from 1 are not checked."""
    m = BranchesOnSizes()
    c = symfuse.compile(m, (torch.randn(2, 8), torch.randn(2, 3)), {"x": {0: "B", 1: "L"}, "y": {0: "C"}})
    for b, n in [(1, 2), (3, 10), (2, 64)]:
        x, y = torch.randn(b, n), torch.randn(b, 3)
        assert rel_err(c(x, y), m(x, y)) < 1e-6
    with pytest.raises(
        ValueError, match=r"\(L % 2\) == 0 \(the model's code branches on it.*L = 7 \(input 'x' dim 1\)"
    ):
        c(torch.randn(2, 7), torch.randn(2, 3))
    with pytest.raises(ValueError, match=r"B == C .*B = 2 \(input 'x' dim 0\), C = 3 \(input 'y' dim 0\)"):
        c(torch.randn(2, 8), torch.randn(3, 3))
    text = c.explain(with_graph=False)
    assert "traced under (2 conditions" in text and "(L % 2) == 0" in text
    loaded = symfuse.load(c.save(str(tmp_path / "branches")))  # an artifact keeps the conditions
    with pytest.raises(ValueError, match=r"\(L % 2\) == 0"):
        loaded(torch.randn(2, 7), torch.randn(2, 3))


class AudioAndRepeats(torch.nn.Module):
    """What speech encoders and rotary attention use: a weight-normalised grouped conv1d,
    group norm, repeats and repeat_interleave, index_select."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv1d(4, 8, 3, stride=2, padding=1)
        self.pos = torch.nn.utils.parametrizations.weight_norm(torch.nn.Conv1d(8, 8, 5, padding=2, groups=2), dim=2)
        self.norm = torch.nn.GroupNorm(2, 8)
        self.register_buffer("pick", torch.tensor([3, 0, 0, 5]))

    def forward(self, x):
        h = self.norm(self.conv(x))
        h = h + self.pos(h)
        r = h[:, :2].repeat(1, 2, 1).repeat_interleave(2, dim=1)
        return r, h.index_select(1, self.pick), h.repeat(2, 1, 1)


def test_conv1d_group_norm_weight_norm_repeats_index_select(seeded):
    m = AudioAndRepeats().eval()
    before = symfuse.compile_count()
    c = symfuse.compile(m, (torch.randn(2, 4, 16),), {"x": {0: "B", 1: None, 2: "L"}})
    for shape in [(1, 4, 1), (2, 4, 7), (3, 4, 16), (1, 4, 97)]:
        x = torch.randn(shape)
        with torch.no_grad():
            assert rel_err(c(x), m(x)) < 1e-5, shape
    assert symfuse.compile_count() == before + 1


class Decomposed(torch.nn.Module):
    """Ops symfuse has no conversion of its own for, which torch's core ATen decompositions
    turn into ops it has (mish, hardswish, softplus, GLU, PReLU, rms_norm, logsumexp, roll,
    tril, einsum, pixel shuffle, bilinear upsampling, adaptive max
    pooling, a 1-D pool), and ones converted directly (var, std,
    max.dim, flip, ELU, leaky ReLU, instance norm, nearest upsampling)."""

    def __init__(self):
        super().__init__()
        acts = [torch.nn.Mish(), torch.nn.Hardswish(), torch.nn.Hardsigmoid(), torch.nn.ELU(0.5), torch.nn.Softplus()]
        self.acts = torch.nn.Sequential(*acts, torch.nn.LeakyReLU(0.1), torch.nn.PReLU(4))
        self.rms, self.inorm = torch.nn.RMSNorm(6), torch.nn.InstanceNorm2d(4, affine=True)

    def forward(self, x):  # x: [B, 4, H, 6]
        a = self.acts(x)
        s = torch.nn.functional.glu(self.rms(a), dim=-1) + torch.logsumexp(a, -1, keepdim=True)
        s = (
            s
            + a.var(-1, keepdim=True)[..., :3]
            + a.std((1, 2), keepdim=True)[..., :3]
            + a.max(1, keepdim=True).values[..., :3]
        )
        r = torch.roll(x, shifts=(1, -2), dims=(2, 3)).flip(2).tril()
        e = torch.einsum("bchw,bcvw->bchv", x, r)
        up = torch.nn.functional.interpolate(self.inorm(x), scale_factor=2, mode="nearest")
        ps = torch.nn.functional.pixel_shuffle(up, 2)
        bl = torch.nn.functional.interpolate(x, scale_factor=2, mode="bilinear")
        pooled = torch.nn.functional.adaptive_max_pool2d(x, 1).flatten(2) + torch.nn.functional.avg_pool1d(
            x.flatten(2), 3, stride=2
        )
        return s, e, ps, bl, pooled


def test_ops_converted_through_torchs_decompositions_or_directly(seeded):
    m = Decomposed().eval()
    before = symfuse.compile_count()
    c = symfuse.compile(m, (torch.randn(2, 4, 5, 6),), {"x": {0: "B", 2: "H"}})
    for shape in [(1, 4, 1, 6), (2, 4, 7, 6), (3, 4, 16, 6)]:
        x = torch.randn(shape)
        with torch.no_grad():
            assert rel_err(c(x), m(x)) < 1e-5, shape
    assert symfuse.compile_count() == before + 1


def test_a_transformers_cache_in_the_output_says_to_turn_the_cache_off():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(
        hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64, num_key_value_heads=1
    )
    model = transformers.LlamaModel(cfg).eval()
    ids = torch.randint(0, 100, (2, 8))
    with pytest.raises(TypeError, match=r"holds a transformers\.cache_utils\.DynamicCache.*use_cache=False"):
        symfuse.compile(model, {"input_ids": ids}, {"input_ids": {0: "B", 1: "S"}})
    c = symfuse.compile(model, {"input_ids": ids, "use_cache": False}, {"input_ids": {0: "B", 1: "S"}})
    ids = torch.randint(0, 100, (3, 11))
    with torch.no_grad():
        ref = model(input_ids=ids, use_cache=False).last_hidden_state
    assert rel_err(c(input_ids=ids, use_cache=False).last_hidden_state, ref) < 1e-4


def test_a_dynamic_dim_with_an_example_of_zero_is_refused():
    with pytest.raises(ValueError, match=r"input 'x' dim 0 is declared dynamic \('B'\) but its example size is 0"):
        symfuse.compile(MLP(), (torch.randn(0, 5, 6), torch.randn(0, 5, 6)), {"x": {0: "B"}})


def test_dynamic_dim_the_model_fixes_is_refused():
    with pytest.raises(
        ValueError, match=r"input 'x' dim 2 is declared dynamic \('F'\) but the model only works with size 6"
    ):
        symfuse.compile(MLP(), (torch.randn(2, 5, 6), torch.randn(2, 5, 6)), {"x": {2: "F"}})


def test_dynamic_naming_an_unknown_input_is_refused():
    with pytest.raises(ValueError, match="dynamic names input 'z', but the inputs are x, y"):
        symfuse.compile(MLP(), (torch.randn(2, 5, 6), torch.randn(2, 5, 6)), {"z": {0: "B"}})


def test_torch_dims_with_ranges_are_accepted(seeded):
    m = MLP()
    B = Dim("B", min=2, max=8)
    c = symfuse.compile(m, (torch.randn(2, 5, 6), torch.randn(2, 5, 6)), {"x": {0: B}, "y": {0: B}})
    assert c.store.range(c.graph.inputs[0].type.shape[0]) == (2, 8)
    with pytest.raises(ValueError, match=r"input 'x' dim 0 is 9, but 'B' must be in \[2, 8\]"):
        c(torch.randn(9, 5, 6), torch.randn(9, 5, 6))


def test_captured_graphs_verify():
    m = MLP()
    c = symfuse.compile(m, (torch.randn(2, 5, 6), torch.randn(2, 5, 6)), {"x": {0: "B", 1: "S"}, "y": {0: "B", 1: "S"}})
    assert reinfer(c.graph, c.store) == []


# -- bad input at call time, on a tiny BERT --------------------------------------------------


@pytest.fixture(scope="module")
def tiny_bert():
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    cfg = BertConfig(
        vocab_size=100, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
        max_position_embeddings=32,
    )  # fmt: skip
    m = BertModel(cfg).eval()
    ids = torch.randint(0, 100, (2, 8))
    dyn = {"input_ids": {0: "B", 1: "S"}, "attention_mask": {0: "B", 1: "S"}}
    return m, symfuse.compile(m, {"input_ids": ids, "attention_mask": torch.ones_like(ids)}, dyn)


def _inputs(b, s, mask_s=None):
    ids = torch.randint(0, 100, (b, s))
    return {"input_ids": ids, "attention_mask": torch.ones(b, s if mask_s is None else mask_s, dtype=torch.long)}


def test_tiny_bert_runs_every_shape(tiny_bert):
    m, c = tiny_bert
    before = symfuse.compile_count()
    for b, s in [(1, 1), (2, 7), (3, 16), (1, 32), (5, 13)]:
        inp = _inputs(b, s)
        with torch.no_grad():
            assert rel_err(c(**inp), m(**inp)) < 1e-4
    assert symfuse.compile_count() == before


def test_sequence_longer_than_position_table(tiny_bert):
    _, c = tiny_bert
    with pytest.raises(
        ValueError, match=r"input 'input_ids' dim 1 is 33, but 'S' must be in \[1, 32\] \(rule: .*expand"
    ):
        c(**_inputs(1, 33))


def test_mask_of_another_length(tiny_bert):
    _, c = tiny_bert
    with pytest.raises(
        ValueError, match=r"input 'attention_mask' dim 1 is 7, but it is 'S', which is 9 from input 'input_ids' dim 1"
    ):
        c(**_inputs(2, 9, mask_s=7))


def test_distinct_names_are_tied_by_the_model_and_checked():
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    m = BertModel(
        BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32)
    ).eval()
    ids = torch.randint(0, 50, (2, 8))
    c = symfuse.compile(m, {"input_ids": ids, "attention_mask": torch.ones_like(ids)},
                        {"input_ids": {0: "B", 1: "S"}, "attention_mask": {0: "B", 1: "M"}})  # fmt: skip
    with pytest.raises(
        ValueError, match=r"rule of the model: M == S \(operands equal after broadcast.*add.*\).*M = 7.*S = 9"
    ):
        c(**_inputs(2, 9, mask_s=7))


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: ((torch.randint(0, 100, (2, 8)),), {}), r"missing input\(s\) attention_mask"),
        (lambda: ((), {**_inputs(2, 8), "token_type_ids": None}), "unexpected input 'token_type_ids'"),
        (
            lambda: ((), {**_inputs(2, 8), "input_ids": torch.randint(0, 100, (2, 8, 1))}),
            r"input 'input_ids' must have rank 2, got shape \(2, 8, 1\)",
        ),
        (
            lambda: ((), {**_inputs(2, 8), "input_ids": torch.rand(2, 8)}),
            "input 'input_ids' must have dtype torch.int64, got torch.float32",
        ),
        (
            lambda: ((), {**_inputs(2, 8), "attention_mask": torch.ones(2, 8, dtype=torch.long, device="meta")}),
            "input 'attention_mask' must be on device cpu, got meta",
        ),
        (
            lambda: ((), {**_inputs(2, 8), "attention_mask": [[1] * 8] * 2}),
            "input 'attention_mask' must be a torch.Tensor, got list",
        ),
    ],
)
def test_bad_calls(tiny_bert, make, message):
    _, c = tiny_bert
    args, kwargs = make()
    with pytest.raises(ValueError, match=message):
        c(*args, **kwargs)


def test_explain_names_facts_and_backend(tiny_bert):
    _, c = tiny_bert
    text = c.explain()
    assert "backend: cpu (generated C++" in text
    assert "S in [1, 32]" in text
    assert "checked on every call" in text and "min(32, S) == S" in text
    assert "%layer_norm: f32[B, S, 32]" in text


def test_static_dim_mismatch_names_input_and_dim():
    c = symfuse.compile(MLP(), (torch.randn(2, 5, 6), torch.randn(2, 5, 6)), {"x": {0: "B"}, "y": {0: "B"}})
    with pytest.raises(ValueError, match=r"input 'x' dim 2 must be 6, got 7 \(shape \(2, 5, 7\)\)"):
        c(torch.randn(2, 5, 7), torch.randn(2, 5, 6))
    with pytest.raises(ValueError, match=r"expected at most 2 inputs"):
        c(torch.randn(2, 5, 6), torch.randn(2, 5, 6), torch.randn(1))


def test_image_too_small_for_the_pooling_windows():
    from symfuse.models import resnet

    case = resnet()
    c = symfuse.compile(case.model, case.inputs(**case.example), case.dynamic)
    assert c.store.range(c.graph.inputs[0].type.shape[2]) == (6, float("inf"))
    with pytest.raises(ValueError, match=r"input 'x' dim 2 is 5, but 'H' must be in \[6, inf\] \(rule: the pooling"):
        c(**case.inputs(B=1, H=5))
    with torch.no_grad():
        assert rel_err(c(**case.inputs(B=1, H=6)), case.model(**case.inputs(B=1, H=6))) < 1e-4


class ExtremesAndTheirIndices(torch.nn.Module):
    def forward(self, x):
        values, at = x.max(-1)
        return x.argmax(1), x.argmin(-1, keepdim=True), values, at, x.argmax(), x.min(0).indices


@pytest.mark.parametrize("backend", ["cpu", "reference"])
def test_argmax_argmin_and_max_dim_indices(backend, seeded):
    """The first index of the extreme (ties: the first), as torch; dynamic dims, one compile."""
    m = ExtremesAndTheirIndices()
    before = symfuse.compile_count()
    c = symfuse.compile(m, (torch.randn(3, 7, 5),), backend=backend)
    for shape in [(1, 1, 1), (2, 13, 16), (3, 5, 7), (1, 16, 2)]:
        x = torch.round(torch.randn(shape) * 2) / 2  # many ties
        for got, want in zip(c(x), m(x)):
            assert got.shape == want.shape and torch.equal(got, want), (shape, got, want)
    assert symfuse.compile_count() == before + 1


class NamedLikeTheGeneratedCode(torch.nn.Module):
    """Inputs named as C++ words or as the generated kernels' own locals."""

    def forward(self, x1, x2, i0, sym, row, acc1, int, default, log, acos):  # noqa: A002
        s = torch.softmax(x1 * x2 + i0, -1) * row
        math = torch.log(log.double().abs() + 1) + torch.acos(acos.double().tanh())  # float64: `log(...)` in C
        return (s + sym * acc1 * int).amax(-1) + default.sum(-1) + math.float().sum(-1)


def test_inputs_named_like_the_generated_code_compile_and_keep_their_names(seeded):
    m = NamedLikeTheGeneratedCode()
    names = ["x1", "x2", "i0", "sym", "row", "acc1", "int", "default", "log", "acos"]
    c = symfuse.compile(m, tuple(torch.randn(3, 7) for _ in names))
    for b, s in [(1, 1), (5, 11), (2, 16)]:
        xs = [torch.randn(b, s) for _ in names]
        assert rel_err(c(*xs), m(*xs)) < 1e-5
        assert rel_err(c(**dict(zip(names, xs))), m(*xs)) < 1e-5
    with pytest.raises(ValueError, match="input 'i0' dim 0"):
        c(*[torch.randn(4 if n == "i0" else 3, 7) for n in names])


class ConvByAComputedWeight(torch.nn.Module):
    def forward(self, x, w):
        return torch.nn.functional.conv2d(x, w.reshape(4, 1, 1, 3), groups=4) + 1


class UpsampleBack(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.down = torch.nn.Conv2d(3, 8, 3, stride=2, padding=1)
        self.up = torch.nn.ConvTranspose2d(8, 6, 3, stride=2, padding=1, output_padding=1, groups=2)
        self.up1 = torch.nn.ConvTranspose2d(6, 2, (2, 3), stride=(1, 3), padding=(0, 1), dilation=(2, 1))

    def forward(self, x):
        return self.up1(torch.relu(self.up(self.down(x))))


def test_conv_by_a_weight_computed_from_an_input(seeded):
    """The library convolution reads its weight whole: a reshaped input is materialised."""
    m = ConvByAComputedWeight()
    c = symfuse.compile(m, (torch.randn(2, 4, 1, 8), torch.randn(4, 3)), {"x": {0: "B", 3: "W"}, "w": None})
    for b, w in [(1, 3), (3, 17)]:
        x, wt = torch.randn(b, 4, 1, w), torch.randn(4, 3)
        assert rel_err(c(x, wt), m(x, wt)) < 1e-5


def test_transposed_convolutions(seeded):
    """Stride, padding, output padding, groups and dilation; dynamic batch and image size."""
    m = UpsampleBack().eval()
    before = symfuse.compile_count()
    c = symfuse.compile(m, (torch.randn(2, 3, 10, 12),), {"x": {0: "B", 2: "H", 3: "W"}})
    for shape in [(1, 3, 1, 1), (2, 3, 7, 13), (3, 3, 16, 16)]:
        x = torch.randn(shape)
        got, want = c(x), m(x)
        assert got.shape == want.shape and rel_err(got, want) < 1e-5, shape
    assert symfuse.compile_count() == before + 1


class ElementwiseComposites(torch.nn.Module):
    """Ops symfuse writes as several registry ops (`frontend/composite.py`)."""

    def forward(self, x, n):
        y = x * 2.5  # halves: round to even
        v, m = torch.std_mean(x, -1)
        return (
            torch.round(y), torch.sign(x), torch.trunc(y), torch.frac(y), torch.remainder(y, -1.5),
            torch.fmod(y, 1.5), torch.remainder(n, 3), torch.fmod(n, -3), torch.tan(x), torch.sinh(x),
            torch.cosh(x), torch.log2(x.abs() + 1), torch.log10(x.abs() + 1), torch.exp2(x), torch.expm1(x),
            torch.nn.functional.celu(x, 0.7), torch.logical_xor(x > 0, y), torch.bitwise_xor(n, 5),
            torch.hypot(x, y), torch.nan_to_num(x / (x > 0)), torch.clamp(x, min=m[..., None]), x.max(),
            torch.var_mean(x, (0, 1)), v, torch.nn.functional.one_hot(n.abs() % 4, 4), torch.floor(y),
            torch.ceil(y), torch.isinf(1 / (x > 0)),
        )  # fmt: skip


def test_elementwise_composites_match_eager(seeded):
    m = ElementwiseComposites()
    before = symfuse.compile_count()
    c = symfuse.compile(m, (torch.randn(3, 5, 6), torch.randint(-9, 9, (3, 5, 6))))
    for shape in [(1, 1, 1), (2, 7, 16), (4, 3, 13)]:
        x, n = torch.randn(shape), torch.randint(-9, 9, shape)
        x[0, 0, 0] = 0.2  # y = 0.5 exactly
        for k, (got, want) in enumerate(zip(torch.utils._pytree.tree_leaves(c(x, n)),
                                            torch.utils._pytree.tree_leaves(m(x, n)))):  # fmt: skip
            assert got.dtype == want.dtype and got.shape == want.shape, (k, shape)
            g, w = got.double(), want.double()  # a variance of one element is NaN in both
            finite = w[w.isfinite() & (w.abs() < 1e30)]  # nan_to_num's inf is the largest float
            scale = float(finite.abs().max()) if finite.numel() else 1.0
            torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5 * scale, equal_nan=True, msg=f"{k} at {shape}")
    assert symfuse.compile_count() == before + 1


class TopK(torch.nn.Module):
    def forward(self, x):
        v, i = torch.topk(x, 3, -1)
        v2, i2 = torch.topk(x, 2, 1, largest=False)
        return v, i, v2, i2


def test_topk_values_and_indices(seeded):
    """Equal to torch's without ties; with ties (whose order torch leaves open) the values are
    torch's and each index points at its value."""
    m = TopK()
    c = symfuse.compile(m, (torch.randn(2, 5, 7),), {"x": {0: "B", 1: "S"}})
    for shape in [(1, 2, 7), (3, 6, 7), (2, 13, 7)]:
        x = torch.randn(shape)
        assert all(torch.equal(g, w) for g, w in zip(c(x), m(x))), shape
        x = torch.round(x * 2) / 2
        v, i, v2, i2 = c(x)
        want = m(x)
        assert torch.equal(v, want[0]) and torch.equal(v2, want[2])
        assert torch.equal(x.gather(-1, i), v) and torch.equal(x.gather(1, i2), v2)
        assert all(len(set(row.tolist())) == len(row) for row in i.reshape(-1, 3))  # no index twice
    with pytest.raises(symfuse.UnsupportedOpsError, match="k <= 64"):
        symfuse.compile(lambda_module(lambda x: torch.topk(x, 65, -1).values), (torch.randn(2, 100),))


def lambda_module(fn):
    class Fn(torch.nn.Module):
        def forward(self, x):
            return fn(x)

    return Fn()


class MathAndNaN(torch.nn.Module):
    def forward(self, x, y):
        u = torch.tanh(x)  # in (-1, 1): the inverse functions' domain
        return (
            torch.acos(u), torch.asin(u), torch.atan(x), torch.acosh(x.abs() + 1), torch.asinh(x), torch.atanh(u),
            torch.erfc(x), torch.atan2(x, y), torch.copysign(x, y), torch.signbit(y), torch.isnan(y),
            torch.fmax(x, y), torch.fmin(x, y), torch.xlogy(x, y.abs()), torch.xlogy(x.round(), y),
            torch.heaviside(x.round(), y), torch.maximum(x, y), torch.minimum(x, y), torch.clamp(x, min=y),
            torch.sign(y), torch.sgn(x), torch.linalg.vector_norm(x.round(), 0, -1),
            torch.var(x, 1, correction=1.5), torch.std(x, (0, 2), correction=0.5),
        )  # fmt: skip


def test_inverse_trigonometry_and_nan_semantics_match_eager(seeded):
    """torch's NaN rules where C's differ: maximum/minimum/clamp by a tensor propagate a NaN
    on either side (std::max drops one on the right), fmax/fmin ignore it, sign(NaN) is 0."""
    m = MathAndNaN()
    before = symfuse.compile_count()
    c = symfuse.compile(m, (torch.randn(3, 5, 6), torch.randn(3, 5, 6)))
    for shape in [(1, 1, 1), (2, 7, 16), (4, 3, 13)]:
        x, y = torch.randn(shape), torch.randn(shape)
        y.view(-1)[::3] = float("nan")
        y.view(-1)[1::5] = 0.0
        x.view(-1)[::7] = float("nan")
        x.view(-1)[2::4] = 0.0
        y.view(-1)[4::9] = -0.0
        for k, (got, want) in enumerate(zip(c(x, y), m(x, y))):
            assert got.dtype == want.dtype and got.shape == want.shape, (k, shape)
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5, equal_nan=True, msg=f"{k} at {shape}")
    assert symfuse.compile_count() == before + 1


class ScalarReductions(torch.nn.Module):
    def forward(self, s):
        return (
            s.sum(), s.sum(0), s.mean(-1, keepdim=True), s.amax(), torch.amin(s, 0), torch.max(s, 0),
            torch.argmax(s, 0), (s > 0).any(0), torch.count_nonzero(s), torch.logsumexp(s, 0),
            torch.softmax(s, 0), s.var(0, correction=0), s.norm(), s.max(), torch.nn.functional.mse_loss(s, 2 * s),
        )  # fmt: skip


def test_reductions_of_a_0d_tensor(seeded):
    """torch reduces a 0-d tensor over dim 0 or -1 (and over all its none dims): the element
    itself (these crashed code generation or capture)."""
    m = ScalarReductions()
    c = symfuse.compile(m, (torch.tensor(0.5),))
    for v in (1.5, -2.0, 0.0):
        s = torch.tensor(v)
        for k, (got, want) in enumerate(zip(torch.utils._pytree.tree_leaves(c(s)),
                                            torch.utils._pytree.tree_leaves(m(s)))):  # fmt: skip
            assert got.dtype == want.dtype and got.shape == want.shape, k
            torch.testing.assert_close(got, want, equal_nan=True, msg=str(k))


class VectorsAndUnbatched(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w, self.b = torch.nn.Parameter(torch.randn(4, 3)), torch.nn.Parameter(torch.randn(4))
        self.conv = torch.nn.Conv2d(3, 2, 3, padding=1)

    def forward(self, v, img):
        pooled = torch.nn.functional.adaptive_avg_pool2d(img, (None, 2))
        return (
            torch.nn.functional.linear(v, self.w, self.b), torch.nn.functional.linear(self.w, v),
            self.conv(img), pooled, torch.nn.functional.adaptive_avg_pool2d(img, (3, None)),
            torch.nn.functional.adaptive_avg_pool2d(img, (None, None)),
        )  # fmt: skip


def test_vector_linear_unbatched_conv_and_adaptive_pool_keeping_a_side(seeded):
    """torch's 1-D linear forms, an unbatched (C, H, W) convolution, and an adaptive pool
    that keeps one side (None) at a dynamic size."""
    m = VectorsAndUnbatched().eval()
    c = symfuse.compile(m, (torch.randn(3), torch.randn(3, 6, 8)), {"img": {1: "H", 2: "W"}})
    for h, w in [(3, 4), (7, 5), (16, 16)]:
        v, img = torch.randn(3), torch.randn(3, h, w)
        for k, (got, want) in enumerate(zip(c(v, img), m(v, img))):
            assert got.shape == want.shape, (k, h, w)
            assert rel_err(got, want) < 1e-5, (k, h, w)


def test_a_conv_weight_with_a_dynamic_kernel_is_refused_by_name():
    conv = lambda_module(lambda x: torch.nn.functional.conv2d(x[:, :3], x[:2, :3, :3, :3]))
    with pytest.raises(ValueError, match=r"conv2d's kernel size must be static: weight dim 2 is"):
        symfuse.compile(conv, (torch.randn(4, 3, 8, 8),))


def test_value_dependent_models_are_refused_with_the_reason():
    class Branchy(torch.nn.Module):
        def forward(self, x):
            return x if x.sum() > 0 else -x

    with pytest.raises(symfuse.CaptureError, match=r"depends on tensor values .*GuardOnDataDependentSymNode"):
        symfuse.compile(Branchy(), (torch.randn(4),))


class PromotingBounds(torch.nn.Module):
    def forward(self, b, i, h):
        return b.clamp(-5, 5), b**2, i.clamp(0.5, 3.5), i.clamp(min=-2), h.clamp(-1.5, 2), i.clamp_min(1.5)


def test_results_have_torchs_types_where_scalars_promote(seeded):
    """A clamp's bounds take part in type promotion: an integer tensor clamped by 0.5 is
    float (it was clamped as integers: 0 stayed 0), a bool clamped or squared is int64.
    Every result has the dtype torch gives it."""
    m = PromotingBounds()
    c = symfuse.compile(m, (torch.rand(3, 4) > 0.5, torch.randint(-5, 5, (3, 4)), torch.randn(3, 4).half()))
    for rows in (1, 7, 16):
        b, i, h = torch.rand(rows, 4) > 0.5, torch.randint(-5, 5, (rows, 4)), torch.randn(rows, 4).half()
        for k, (got, want) in enumerate(zip(c(b, i, h), m(b, i, h))):
            assert got.dtype == want.dtype and torch.equal(got, want), (rows, k, got.dtype, want.dtype)


class RoundingAndRrelu(torch.nn.Module):
    def forward(self, t):
        f = torch.nn.functional
        return torch.round(t, decimals=2), torch.round(t, decimals=-1), f.rrelu(t, training=False), f.rrelu(t, 0.1, 0.3)


def test_round_to_decimals_and_rrelu_at_inference_as_torch(seeded):
    m = RoundingAndRrelu()
    c = symfuse.compile(m, (torch.randn(5, 7) * 300,))
    for rows in (1, 5, 16):
        x = torch.randn(rows, 7) * 300
        x[0, :4] = torch.tensor([0.125, 2.675, -1.005, 15.0])  # halves and values just off them
        for k, (got, want) in enumerate(zip(c(x), m(x))):
            assert torch.equal(got, want), (rows, k)


class FloatDivisions(torch.nn.Module):
    def forward(self, a, b):
        return torch.fmod(a, b), torch.remainder(a, b), a // b, torch.div(a, b, rounding_mode="trunc"), a % 0.1


def float_division_operands(n: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Dividends with large quotients, divisors that are not exact in binary (0.1, 0.37), both
    signs, zeros, infinities and NaN."""
    a = torch.cat([torch.tensor([1000.3, 1.0, -1.0, 12345.678, 1e6 + 0.3, -7.5, 0.0, float("inf"), float("nan")]),
                   torch.randn(n, generator=gen) * 1e4])  # fmt: skip
    b = torch.cat([torch.tensor([0.1, 0.1, 0.1, 0.37, -0.7, 2.0, 0.3, 3.0, 1.0]),
                   torch.randn(n, generator=gen).clamp(-3, 3)])  # fmt: skip
    b[-1] = 0.0
    return a, b


def test_float_remainders_and_floor_division_are_exact_as_in_torch(seeded):
    """fmod and remainder of floats from the exact remainder (a - b * trunc(a / b) lost it:
    fmod(1000.3, 0.1) gave -2.7e-5), and floor division as torch's (1.0 // 0.1 is 9, not
    floor(1.0 / 0.1) = 10): equal to eager, NaN where eager has NaN."""
    m = FloatDivisions()
    gen = torch.Generator().manual_seed(0)
    c = symfuse.compile(m, float_division_operands(7, gen))
    for n in (1, 13, 64):
        a, b = float_division_operands(n, gen)
        for k, (got, want) in enumerate(zip(c(a, b), m(a, b))):
            assert torch.equal(got.isnan(), want.isnan()), (n, k)
            assert torch.equal(got[~got.isnan()], want[~want.isnan()]), (n, k)


class IntegerDivisions(torch.nn.Module):
    def forward(self, a, b):
        return (
            torch.div(a, b, rounding_mode="floor"), torch.div(a, b, rounding_mode="trunc"), torch.remainder(a, b),
            torch.fmod(a, b), a // 3,
        )  # fmt: skip


def test_integer_division_by_zero_is_an_error_not_a_crash():
    """C traps on an integer division by zero (SIGFPE, the process dies); torch raises. The
    kernel reports it through the call's error slot and the call raises ZeroDivisionError."""
    m = IntegerDivisions()
    c = symfuse.compile(m, (torch.randint(-9, 9, (4, 5)), torch.randint(1, 9, (4, 5))))
    for shape in [(1, 1), (3, 7), (16, 33)]:
        a, b = torch.randint(-100, 100, shape), torch.randint(-9, 9, shape)
        b[b == 0] = 1
        assert all(torch.equal(g, w) for g, w in zip(c(a, b), m(a, b))), shape
    b[1, 2] = 0
    with pytest.raises(ZeroDivisionError, match=r"integer division by zero .*: an integer division in"):
        c(a, b)
    b[1, 2] = -1  # the next call is fine again
    assert all(torch.equal(g, w) for g, w in zip(c(a, b), m(a, b)))


class LinearByComputedOperands(torch.nn.Module):
    def forward(self, x, w, b):
        return torch.nn.functional.linear(x, w.reshape(-1, x.shape[-1]), b.reshape(-1)).log_softmax(-1)


def test_linear_whose_weight_and_bias_are_computed_from_inputs(seeded):
    """The library GEMM adds the bias tensor whole: a bias reshaped from an input is
    materialised first (it was read before anything wrote it: UnboundLocalError)."""
    m = LinearByComputedOperands()
    c = symfuse.compile(m, (torch.randn(4, 3), torch.randn(2, 3, 3), torch.randn(2, 3)))
    for rows, groups, per in [(1, 1, 1), (8, 2, 3), (5, 3, 7)]:
        x, w, b = torch.randn(rows, 3), torch.randn(groups, per, 3), torch.randn(groups, per)
        assert rel_err(c(x, w, b), m(x, w, b)) < 1e-5, (rows, groups, per)


class SelfPads(torch.nn.Module):
    def forward(self, x, y):
        f = torch.nn.functional
        return (
            f.pad(x, (1, 2, 2, 1), mode="reflect"), f.pad(x, (3, 0, 1, 2), mode="replicate"),
            f.pad(x, (2, 1, 1, 3), mode="circular"), f.pad(y, (2, 1), mode="reflect"),
            f.pad(y, (-1, 2), mode="replicate"), f.pad(y, (1, -1), mode="circular"),
            torch.nn.ReflectionPad2d(1)(x), torch.nn.ReplicationPad1d((0, 3))(y),
            # a crop and a pad on the same side: torch's reflect and replicate read the whole
            # side (at length 4, replicate gives y[3] twice, reflect y[2], y[3], y[2], y[1])
            f.pad(y, (-4, 2), mode="replicate"), f.pad(y, (-2, 2), mode="reflect"),
        )  # fmt: skip


def test_reflect_replicate_and_circular_padding_at_dynamic_sizes(seeded):
    m = SelfPads()
    before = symfuse.compile_count()
    c = symfuse.compile(m, (torch.randn(2, 3, 5, 6), torch.randn(2, 4, 7)))
    for hw, length in [((4, 4), 4), ((9, 13), 16), ((5, 17), 5)]:
        x, y = torch.randn(2, 3, *hw), torch.randn(1, 4, length)
        for k, (got, want) in enumerate(zip(c(x, y), m(x, y))):
            assert got.shape == want.shape and torch.equal(got, want), (k, hw, length)
    assert symfuse.compile_count() == before + 1
    with pytest.raises(ValueError, match=r"input shapes break a rule of the model: x_3 > 1"):
        c(torch.randn(2, 3, 2, 2), torch.randn(1, 4, 7))  # reflecting by 2 needs a side of 3 (torch's rule)


def test_an_automatic_dim_whose_example_is_one_stays_static_and_the_error_says_why(seeded):
    m = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU())
    c = symfuse.compile(m, (torch.randn(1, 5, 6),))
    x = torch.randn(1, 9, 6)
    assert rel_err(c(x), m(x)) < 1e-5
    with pytest.raises(ValueError, match=r"dim 0 must be 1, got 3 .*stays static unless `dynamic` declares it"):
        c(torch.randn(3, 5, 6))
    c = symfuse.compile(m, (torch.randn(1, 5, 6),), ({0: "B", 1: "S"},))
    x = torch.randn(3, 7, 6)
    assert rel_err(c(x), m(x)) < 1e-5


class IntegerMath(torch.nn.Module):
    def forward(self, n):
        return torch.sinh(n), torch.cosh(n), torch.tan(n), torch.isinf(n), torch.isnan(n), torch.isposinf(n)


def test_float_functions_of_integers_promote_and_integers_are_never_inf(seeded):
    m = IntegerMath()
    c = symfuse.compile(m, (torch.randint(-3, 4, (2, 5)),))
    for shape in [(1, 1), (3, 7), (2, 16)]:
        n = torch.randint(-3, 4, shape)
        for k, (got, want) in enumerate(zip(c(n), m(n))):
            assert got.dtype == want.dtype, k
            torch.testing.assert_close(got, want, msg=str(k))
    conv = lambda_module(lambda x: torch.nn.functional.conv2d(x, torch.ones(2, 3, 3, 3, dtype=torch.int64)))
    with pytest.raises(symfuse.ShapeError, match="conv2d of i64 tensors: the library convolution takes f32"):
        symfuse.compile(conv, (torch.randint(0, 3, (1, 3, 8, 8)),))


def test_volumetric_convolution_and_pools_run_every_volume():
    """Conv3d, MaxPool3d and AvgPool3d (torch's kernels inside the program) over a dynamic
    batch, depth, height and width: one compile, every volume."""

    class Volume(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv3d(3, 4, (3, 2, 3), stride=(1, 2, 1), padding=1)
            self.max = torch.nn.MaxPool3d(2, padding=1)
            self.avg = torch.nn.AvgPool3d((2, 1, 2))

        def forward(self, x):
            return self.avg(self.max(torch.relu(self.conv(x))))

    m = Volume().eval()
    before = symfuse.compile_count()
    c = symfuse.compile(m, (torch.randn(2, 3, 8, 9, 10),), dynamic={"x": {0: "B", 2: "D", 3: "H", 4: "W"}})
    for shape in [(1, 3, 2, 1, 2), (3, 3, 16, 13, 11), (2, 3, 7, 5, 13)]:
        x = torch.randn(*shape)
        torch.testing.assert_close(c(x), m(x), rtol=1e-4, atol=1e-4)
    assert symfuse.compile_count() == before + 1
