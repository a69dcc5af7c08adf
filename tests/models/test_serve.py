"""Serving a saved bert-small on a local Ray Serve: concurrent requests of different
lengths against eager, batches that formed, no compilation after start, a bad request
answered 400 while its batch-mates succeed, and a killed replica that loses no request."""

from __future__ import annotations

import concurrent.futures
import json
import os
import signal
import time
import urllib.error
import urllib.request

import pytest
import ray
import torch
from ray import serve

import symfuse
from symfuse.models import load as load_case

pytestmark = pytest.mark.models
PORT = 8765


def post(body: dict, timeout: float = 60) -> tuple[int, dict]:
    req = urllib.request.Request(
        f"http://127.0.0.1:{PORT}/", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def get(path: str) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{PORT}{path}", timeout=30) as r:
        return json.loads(r.read())


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    from symfuse.serve import app

    case = load_case("bert-small")
    path = str(tmp_path_factory.mktemp("serve") / "bert-small")
    symfuse.compile(case.model, case.inputs(**case.example), case.dynamic).save(path)
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    serve.start(http_options={"host": "127.0.0.1", "port": PORT})
    serve.run(app(path, replicas=2, threads=1, max_batch_size=8, batch_wait_timeout_s=0.05), name="t", route_prefix="/")
    yield case
    serve.shutdown()
    ray.shutdown()


def sentence(n: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return [101] + torch.randint(1000, 5000, (n - 2,), generator=g).tolist() + [102]


def eager(case, ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.tensor([ids])
    with torch.no_grad():
        out = case.model(input_ids=x, attention_mask=torch.ones_like(x))
    return out.last_hidden_state[0], out.pooler_output[0]


def test_concurrent_requests_of_different_lengths_match_eager_in_batches(served):
    case = served
    lengths = [3, 17, 5, 64, 9, 33, 2, 128, 11, 40, 7, 23, 31, 13, 90, 4]
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(lambda i: post({"input_ids": sentence(lengths[i], i)}), range(len(lengths))))
    for i, (status, body) in enumerate(answers):
        assert status == 200, body
        hidden, pooled = eager(case, sentence(lengths[i], i))
        got = torch.tensor(body["outputs"]["last_hidden_state"])
        assert got.shape == hidden.shape  # its own length, not the batch's
        assert (got - hidden).abs().max() / hidden.abs().max() < 1e-4
        assert (torch.tensor(body["outputs"]["pooler_output"]) - pooled).abs().max() < 1e-4
    m = get("/metrics")
    assert m["a_replica"]["compilations_since_start"] == 0
    sizes = {int(k) for k in m["a_replica"]["batches"]}
    assert max(sizes) > 1, m  # requests were batched together


def test_a_bad_request_gets_400_and_its_batch_mates_succeed(served):
    bodies = [
        {"input_ids": sentence(10, 1)},
        {"input_ids": sentence(600, 2)},
        {"input_ids": "hello"},
        {"input_ids": sentence(12, 3), "outputs": ["pooler_output"]},
        {"input_ids": sentence(8, 4), "colour": 1},
    ]
    with concurrent.futures.ThreadPoolExecutor(len(bodies)) as pool:
        answers = list(pool.map(post, bodies))
    assert [a[0] for a in answers] == [200, 400, 400, 200, 400]
    assert "'S' must be in [1, 512]" in answers[1][1]["error"]
    assert "input 'input_ids' must be a list of torch.int64" in answers[2][1]["error"]
    assert list(answers[3][1]["outputs"]) == ["pooler_output"]
    assert "unknown field(s) colour" in answers[4][1]["error"]


def test_a_killed_replica_loses_no_request(served):
    pids = {get("/metrics")["a_replica"]["pid"] for _ in range(20)}
    assert len(pids) == 2  # both replicas answered
    victim = next(iter(pids))

    def client(i: int) -> int:
        return post({"input_ids": sentence(8 + i % 50, i), "outputs": ["pooler_output"]}, timeout=120)[0]

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(client, i) for i in range(120)]
        time.sleep(1.0)
        os.kill(victim, signal.SIGKILL)
        codes = [f.result() for f in futures]
    assert codes.count(200) == len(codes), sorted(set(codes))
    deadline = time.time() + 120
    while time.time() < deadline:  # Ray starts a new replica in its place
        if len({get("/metrics")["a_replica"]["pid"] for _ in range(10)} - {victim}) == 2:
            break
        time.sleep(2)
    else:
        pytest.fail("the killed replica was not replaced")
