"""Load test of the Ray Serve deployment on loopback: symfuse against the same deployment
running eager PyTorch and ONNX Runtime, then a fault run.

Closed-loop clients (each sends its next request when the last is answered) send token
sequences of realistic, varying lengths (log-normal, median 25 tokens, 4 to 256) and ask
for the pooled output. Every engine runs in the same deployment: the same replicas,
threads and batching. Bounded: --requests per concurrency level and --seconds at most.

The fault run kills one symfuse replica's process (SIGKILL) a few seconds into a load and
reports the requests lost (answered with anything but 200) and the latency around the kill.

Run: .venv/bin/python bench/serve_load.py [--model bert-base] [--concurrency 1,8,32]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import math
import os
import random
import signal
import statistics
import tempfile
import threading
import time
import urllib.error
import urllib.request

import ray
from ray import serve

import symfuse
from symfuse.models import load as load_case
from symfuse.serve import app

PORT = 8777


def lengths(n: int, seed: int = 0) -> list[int]:
    rng = random.Random(seed)
    return [max(4, min(256, round(math.exp(rng.gauss(math.log(25), 0.7))))) for _ in range(n)]


def post(body: dict) -> tuple[int, float]:
    data = json.dumps(body).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{PORT}/", data, {"Content-Type": "application/json"})
    t0 = time.perf_counter()
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            r.read()
            code = r.status
    except urllib.error.HTTPError as e:
        code = e.code
    except OSError:
        code = -1
    return code, time.perf_counter() - t0


def load(concurrency: int, requests: int, seconds: float, seed: int) -> list[tuple[float, int, float]]:
    """(start time, status, latency) of every request of a closed loop of `concurrency` clients."""
    lens = lengths(requests, seed)
    rng = random.Random(seed)
    bodies = [
        {"input_ids": [101] + [rng.randrange(1000, 20000) for _ in range(n - 2)] + [102], "outputs": ["pooler_output"]}
        for n in lens
    ]
    out: list[tuple[float, int, float]] = []
    lock, nxt = threading.Lock(), [0]
    t_end = time.perf_counter() + seconds

    def client() -> None:
        while time.perf_counter() < t_end:
            with lock:
                i = nxt[0]
                nxt[0] += 1
            if i >= len(bodies):
                return
            t = time.perf_counter()
            code, lat = post(bodies[i])
            with lock:
                out.append((t, code, lat))

    with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
        for f in [pool.submit(client) for _ in range(concurrency)]:
            f.result()
    return out


def summary(rows: list[tuple[float, int, float]]) -> dict:
    ok = sorted(lat for _, code, lat in rows if code == 200)
    span = max(t + lat for t, _, lat in rows) - min(t for t, _, _ in rows)
    q = lambda p: ok[min(len(ok) - 1, int(p * len(ok)))] * 1e3  # noqa: E731
    return {"n": len(rows), "ok": len(ok), "rps": len(ok) / span, "p50": q(0.5), "p99": q(0.99)}


def replica_stats() -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{PORT}/metrics", timeout=30) as r:
        return json.loads(r.read())


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="bert-base")
    p.add_argument("--engines", default="symfuse,eager,onnxruntime")
    p.add_argument("--concurrency", default="1,8,32")
    p.add_argument("--requests", type=int, default=200, help="requests per concurrency level")
    p.add_argument("--seconds", type=float, default=60, help="at most this long per level")
    p.add_argument("--replicas", type=int, default=2)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--max-batch-size", type=int, default=8)
    p.add_argument("--batch-wait-ms", type=float, default=5)
    args = p.parse_args()
    case = load_case(args.model)
    work = tempfile.mkdtemp(prefix="symfuse-serve-load-")
    artifact = os.path.join(work, args.model)
    symfuse.compile(case.model, case.inputs(**case.example), case.dynamic).save(artifact)
    ray.init(num_cpus=max(4, args.replicas * args.threads), include_dashboard=False, log_to_driver=False)
    serve.start(http_options={"host": "127.0.0.1", "port": PORT})
    cfg = dict(replicas=args.replicas, threads=args.threads, max_batch_size=args.max_batch_size,
               batch_wait_timeout_s=args.batch_wait_ms / 1e3, model=args.model)  # fmt: skip
    print(f"{args.model}: {args.replicas} replicas x {args.threads} thread(s), batches up to "
          f"{args.max_batch_size} waiting {args.batch_wait_ms} ms; {args.requests} requests per level\n")  # fmt: skip
    print("| engine | clients | requests ok | throughput req/s | p50 ms | p99 ms | batch sizes (one replica) |")
    print("|---|---|---|---|---|---|---|")
    for engine in args.engines.split(","):
        serve.run(app(artifact, engine=engine, **cfg), name=engine, route_prefix="/")
        load(2, 8, 30, seed=99)  # warm up both replicas
        for c in (int(x) for x in args.concurrency.split(",")):
            s = summary(load(c, args.requests, args.seconds, seed=c))
            batches = replica_stats()["a_replica"]["batches"]
            print(f"| {engine} | {c} | {s['ok']}/{s['n']} | {s['rps']:.1f} | {s['p50']:.1f} | {s['p99']:.1f} | "
                  f"{dict(sorted((int(k), v) for k, v in batches.items()))} |", flush=True)  # fmt: skip
        if engine == "symfuse":
            assert replica_stats()["a_replica"]["compilations_since_start"] == 0
        serve.delete(engine)
    # the fault run: kill one replica mid-load
    serve.run(app(artifact, engine="symfuse", **cfg), name="fault", route_prefix="/")
    load(2, 8, 30, seed=99)
    pids = {replica_stats()["a_replica"]["pid"] for _ in range(30)}
    victim = sorted(pids)[0]
    killed_at: list[float] = []

    def killer() -> None:
        time.sleep(3)
        killed_at.append(time.perf_counter())
        os.kill(victim, signal.SIGKILL)

    threading.Thread(target=killer).start()
    rows = load(8, 4 * args.requests, 3 * args.seconds, seed=7)
    k = killed_at[0]
    lost = sum(1 for _, code, _ in rows if code != 200)
    before = sorted(lat for t, code, lat in rows if code == 200 and t < k)
    around = sorted(lat for t, code, lat in rows if code == 200 and k - 1 <= t < k + 5)
    after = sorted(lat for t, code, lat in rows if code == 200 and t >= k + 5)
    med = lambda xs: statistics.median(xs) * 1e3 if xs else float("nan")  # noqa: E731
    print(f"\nfault run: {len(pids)} replicas, pid {victim} killed 3 s into {len(rows)} requests from 8 clients")
    print(f"  requests lost (not answered 200): {lost}")
    print(f"  median latency ms: before {med(before):.1f}, from 1 s before to 5 s after the kill {med(around):.1f} "
          f"(max {max(around) * 1e3 if around else float('nan'):.0f}), after {med(after):.1f}")  # fmt: skip
    m = replica_stats()
    print(f"  ingress: {json.dumps({k: v for k, v in m.items() if k != 'a_replica'})}")
    serve.shutdown()
    ray.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
