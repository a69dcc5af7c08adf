"""torch's own op tests (OpInfo, `torch.testing._internal.common_methods_invocations.op_db`)
run through symfuse: each op's first usable float32 sample, compiled with its dims dynamic and
compared with eager. Every sample must match or be refused by a symfuse error that says why;
a wrong answer, a crash or an error from inside symfuse fails the test.
"""

import pytest
import torch
import torch.utils._pytree as pytree
from torch.testing._internal.common_methods_invocations import op_db  # (imports expecttest)

import symfuse
from symfuse.errors import BuildError

pytestmark = pytest.mark.models

# random ops, in-place/out variants, and families symfuse has no op of at all (their refusals
# are tested elsewhere: a whole family per name here would only slow the tier)
SKIP = ("rand", "normal", "uniform", "cauchy", "exponential", "geometric", "bernoulli", "multinomial", "dropout",
        "empty", "rrelu", "fractional", "lowrank", "jiterator", "sparse", "fft", "linalg", "signal", "special",
        "hash", "resize", "complex", "cfloat", "cdouble", "chalf", "polar", "to_sparse", "ctc_loss")  # fmt: skip
# weights and statistics are model parameters: only the batch of the first input is dynamic
WITH_PARAMETERS = ("conv", "linear", "bilinear", "prelu", "_norm", "embedding")
# errors that are symfuse refusing the model, each naming why (the rest fail the test)
REFUSALS = (symfuse.UnsupportedOpsError, symfuse.ShapeError, symfuse.CaptureError)
REFUSED_BY_TEXT = ("is declared dynamic", "must be static")
MIN_RUNNING = 340  # ops whose sample runs and matches: 352 of 505 with torch 2.13
MIN_RESIZED = 40  # samples run at another size through a program compiled from the first: 46 with torch 2.13


MORE_SHAPES = 3  # other samples of the same form run through the program compiled from the first


def _samples():
    """(name, fn, leaves, spec, tensor positions, other samples' leaves): the first usable
    sample of each op, and up to MORE_SHAPES later ones that differ from it only in their
    tensors' sizes (same ranks, dtypes and other arguments), for the compiled program to run."""
    for op in op_db:
        name = op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")
        if any(w in name for w in SKIP) or torch.float32 not in op.supported_dtypes("cpu"):
            continue
        first, others = None, []
        for s in op.sample_inputs("cpu", torch.float32, requires_grad=False):
            leaves, spec = pytree.tree_flatten((s.input, s.args, s.kwargs))
            tensors = [i for i, leaf in enumerate(leaves) if isinstance(leaf, torch.Tensor)]
            if not tensors or not all(leaves[i].numel() and not leaves[i].dtype.is_complex for i in tensors):
                continue
            form = (str(spec), tuple((i, leaves[i].dim(), leaves[i].dtype) for i in tensors),
                    tuple(repr(x) for i, x in enumerate(leaves) if i not in tensors))  # fmt: skip
            if first is None:
                first = (leaves, spec, tensors, form)
            elif form == first[3] and len(others) < MORE_SHAPES:
                others.append(leaves)
        if first is not None:
            yield name, op.op, first[0], first[1], first[2], others


class _Sample(torch.nn.Module):
    def __init__(self, fn, leaves, spec, tensors):
        super().__init__()
        self.fn, self.leaves, self.spec, self.tensors = fn, leaves, spec, tensors

    def forward(self, *ts):
        leaves = list(self.leaves)
        for i, t in zip(self.tensors, ts):
            leaves[i] = t
        x, args, kwargs = pytree.tree_unflatten(leaves, self.spec)
        return self.fn(x, *args, **kwargs)


def _mismatch(got, want) -> str | None:
    g, w = pytree.tree_leaves(got), pytree.tree_leaves(want)
    if len(g) != len(w):
        return f"{len(g)} outputs, eager has {len(w)}"
    for k, (a, b) in enumerate(zip(g, w)):
        if not isinstance(b, torch.Tensor):
            a = a.item() if isinstance(a, torch.Tensor) else a
            if a != b:
                return f"output {k}: {a} != {b}"
            continue
        if a.shape != b.shape or a.dtype != b.dtype:
            return f"output {k}: {a.dtype}{list(a.shape)}, eager {b.dtype}{list(b.shape)}"
        if not b.dtype.is_floating_point:
            if not torch.equal(a, b):
                return f"output {k}: {int((a != b).sum())} of {b.numel()} elements differ"
            continue
        finite = b[b.isfinite()]
        scale = max(float(finite.abs().max()), 1.0) if finite.numel() else 1.0
        try:
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4 * scale, equal_nan=True)
        except AssertionError as e:
            return f"output {k}: {str(e).splitlines()[1:3]}"
    return None


def test_opinfo_samples_match_eager_or_are_refused_by_name(seeded):
    """Each op compiled once from its first sample; that sample and the op's others of the
    same form (other sizes) run through the one program: each matches eager, or (compiling)
    is refused by name, or (a size the program was not compiled for, such as a broadcast
    the first sample did not have) is refused at the call by an error naming the input."""
    failures, running, refused, resized = [], [], [], 0
    for name, fn, leaves, spec, tensors, others in _samples():
        m = _Sample(fn, leaves, spec, tensors)
        inputs = tuple(leaves[i].clone() for i in tensors)
        try:
            want, again = m(*[t.clone() for t in inputs]), m(*[t.clone() for t in inputs])
        except Exception:  # noqa: BLE001 (a sample eager itself rejects)
            continue
        if _mismatch(again, want) is not None or not all(
            isinstance(x, (torch.Tensor, int, float, bool)) for x in pytree.tree_leaves(want)
        ):
            continue  # not deterministic, or not tensors out
        dynamic = None
        if any(w in name for w in WITH_PARAMETERS):
            dynamic = tuple({0: "B"} if i == 0 and t.dim() > 1 and t.shape[0] > 1 else {} for i, t in enumerate(inputs))
        try:
            compiled = symfuse.compile(m, inputs, dynamic)
            got = compiled(*[t.clone() for t in inputs])
        except REFUSALS as e:
            refused.append((name, str(e).splitlines()[0]))
            continue
        except (ValueError, NotImplementedError) as e:
            if any(t in str(e) for t in REFUSED_BY_TEXT) and not isinstance(e, BuildError):
                refused.append((name, str(e).splitlines()[0]))
                continue
            failures.append(f"{name}: {type(e).__name__}: {str(e)[:300]}")
            continue
        except Exception as e:  # noqa: BLE001 (any other error is symfuse failing on a valid model)
            failures.append(f"{name}: {type(e).__name__}: {str(e)[:300]}")
            continue
        bad = _mismatch(got, want)
        if bad:
            failures.append(f"{name} at {[list(t.shape) for t in inputs]}: {bad}")
            continue
        running.append(name)
        for other in others:
            ins = tuple(other[i].clone() for i in tensors)
            try:
                want = m(*[t.clone() for t in ins])
            except Exception:  # noqa: BLE001
                continue
            try:
                got = compiled(*[t.clone() for t in ins])
            except (ValueError, IndexError) as e:
                if "input '" not in str(e):
                    failures.append(f"{name} at {[list(t.shape) for t in ins]}: {type(e).__name__}: {str(e)[:300]}")
                continue
            except Exception as e:  # noqa: BLE001
                failures.append(f"{name} at {[list(t.shape) for t in ins]}: {type(e).__name__}: {str(e)[:300]}")
                continue
            bad = _mismatch(got, want)
            if bad:
                failures.append(f"{name} at {[list(t.shape) for t in ins]} (compiled at another size): {bad}")
            resized += 1
    assert not failures, f"{len(failures)} OpInfo samples failed:\n" + "\n".join(failures)
    assert resized >= MIN_RESIZED, f"only {resized} samples ran at a size other than the compiled one"
    assert len(running) >= MIN_RUNNING, f"only {len(running)} ops ran; refused: {refused}"
