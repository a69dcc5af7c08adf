"""One compiled module called from many threads at once: every result equals the
single-threaded one, and a bad input's error reaches the thread that sent it only."""

import threading

import pytest
import torch

from symfuse.runtime.program import NativeIndexError
from tests.support.reliability_models import compile_encoder, encoder_inputs

SHAPES = [(1, 1), (2, 7), (3, 16), (1, 13), (4, 5), (2, 32)]


def _hammer(compiled, threads: int, calls: int, bad_thread: int | None = None):
    """Each thread runs `calls` calls cycling through SHAPES (offset by its number); the
    bad thread sends an out-of-range token id every 10th call."""
    want = {}
    for b, s in SHAPES:
        inputs = encoder_inputs(b, s, seed=b * 100 + s)
        want[(b, s)] = (inputs, compiled(*inputs))
    results = {t: {"wrong": 0, "errors": 0, "unexpected": []} for t in range(threads)}
    start = threading.Barrier(threads)

    def work(t: int) -> None:
        start.wait()
        r = results[t]
        for i in range(calls):
            b, s = SHAPES[(t + i) % len(SHAPES)]
            (ids, mask), expect = want[(b, s)]
            if t == bad_thread and i % 10 == 0:
                bad = ids.clone()
                bad[0, -1] = 10_000
                try:
                    compiled(bad, mask)
                    r["unexpected"].append("no error for a bad token id")
                except NativeIndexError:
                    r["errors"] += 1
                continue
            try:
                got = compiled(ids, mask)
            except Exception as e:  # noqa: BLE001  (any error here is the bug this test looks for)
                r["unexpected"].append(repr(e))
                continue
            if not torch.equal(got, expect):
                r["wrong"] += 1

    pool = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
    for th in pool:
        th.start()
    for th in pool:
        th.join()
    return results


def test_eight_threads_agree_with_one_and_errors_stay_in_their_thread():
    _, compiled = compile_encoder()
    results = _hammer(compiled, threads=8, calls=250, bad_thread=3)
    for t, r in results.items():
        assert r["unexpected"] == [], (t, r["unexpected"][:3])
        assert r["wrong"] == 0, (t, r)
        assert r["errors"] == (25 if t == 3 else 0), (t, r)


@pytest.mark.models
def test_eight_threads_thousand_calls_each():
    _, compiled = compile_encoder()
    results = _hammer(compiled, threads=8, calls=1000, bad_thread=5)
    assert all(r["unexpected"] == [] and r["wrong"] == 0 for r in results.values()), results
    assert [r["errors"] for r in results.values()] == [100 if t == 5 else 0 for t in range(8)]
