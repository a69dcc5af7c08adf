"""Orchestrating a benchmark: workers, rounds, statistics.

Every engine runs in a worker process of its own (`worker.py`). Workers are started one
after another (a compile never overlaps another engine's work), then the harness walks
the shape sweep for several rounds, asking one engine at a time for timings and rotating
the order of engines every round, so the machine's drift falls on all of them. Nothing
here measures time itself; `launch` is injectable so the logic is testable without any.
"""

from __future__ import annotations

import itertools
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from symfuse.bench.worker import MARK

SWEEP_DEFAULTS = {
    "text": {"batch": [1], "seq": [16, 33, 64, 128, 200, 384]},
    "image": {"batch": [1], "image": [160, 224, 288]},
    "batch": {"batch": [1, 2, 4, 8]},
}
# which CLI axis drives which symbol of each built-in model
AXES = {
    "bert-base": ("text", {"batch": "B", "seq": "S"}),
    "bert-small": ("text", {"batch": "B", "seq": "S"}),
    "gpt2": ("text", {"batch": "B", "seq": "S"}),
    "minilm": ("text", {"batch": "B", "seq": "S"}),
    "t5-encoder-small": ("text", {"batch": "B", "seq": "S"}),
    "lstm": ("text", {"batch": "B", "seq": "T"}),
    "resnet": ("image", {"batch": "B", "image": "H"}),
    "vit-base": ("batch", {"batch": "B"}),
}


# a pause before each engine's turn: the engine before it may still have threads spinning for
# work (ONNX Runtime's and OpenMP's thread pools spin a while after each call), which would
# run beside the next engine's timed calls on a machine of few cores
SETTLE_S = 0.05


def parse_list(text: str, what: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ValueError(f"--{what} takes comma-separated positive integers, got {text!r}") from None
    if not values or any(v < 1 for v in values):
        raise ValueError(f"--{what} takes comma-separated positive integers, got {text!r}")
    return values


def parse_sweep(model: str, given: dict[str, str | None]) -> list[dict[str, int]]:
    """Bindings of the model's symbols from --batch/--seq/--image (defaults per model kind)."""
    if model not in AXES:
        raise ValueError(f"no sweep axes known for model {model!r}; known: {', '.join(AXES)}")
    kind, axes = AXES[model]
    for axis, text in given.items():
        if text is not None and axis not in axes:
            raise ValueError(f"--{axis} does not apply to {model} (its axes: {', '.join('--' + a for a in axes)})")
    values = {a: parse_list(given[a], a) if given.get(a) else SWEEP_DEFAULTS[kind][a] for a in axes}
    return [dict(zip((axes[a] for a in axes), combo)) for combo in itertools.product(*values.values())]


class Worker(Protocol):
    def request(self, msg: dict) -> dict: ...

    def close(self) -> None: ...


class ProcessWorker:
    """A worker process speaking JSON lines; its stderr goes to a log file."""

    def __init__(self, config: dict, log_path: str, env: dict[str, str] | None = None) -> None:
        self.log = open(log_path, "a")  # noqa: SIM115 - closed in close()
        env = dict(os.environ, PYTHONUNBUFFERED="1", **(env or {}))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "symfuse.bench.worker"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, text=True, env=env,
        )  # fmt: skip
        self.first = self._send(config)

    def _send(self, msg: dict) -> dict:
        try:
            self.proc.stdin.write(json.dumps(msg) + "\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            return {"status": "failed", "error": "worker exited", "detail": f"worker exited (see {self.log.name})"}
        for line in self.proc.stdout:
            if line.startswith(MARK):
                return json.loads(line[len(MARK) :])
            self.log.write(line)
        code = self.proc.wait()
        return {
            "status": "failed",
            "error": f"worker exited with code {code}",
            "detail": f"worker exited with code {code} (see {self.log.name})",
        }

    def request(self, msg: dict) -> dict:
        return self._send(msg)

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write(json.dumps({"cmd": "quit"}) + "\n")
                self.proc.stdin.flush()
                self.proc.wait(timeout=30)
            except (BrokenPipeError, subprocess.TimeoutExpired):
                self.proc.kill()
        self.log.close()


def launch_process(engine: str, model: str, log_path: str, env: dict[str, str] | None = None) -> tuple[Worker, dict]:
    w = ProcessWorker({"engine": engine, "model": model}, log_path, env)
    return w, w.first


# `--isa`: symfuse's worker builds its code for that ISA and holds the libraries it calls
# (oneDNN, ATen's kernels, MKL) to the same instructions; the peers keep the machine's best
# unless `--hold-peers` holds their libraries too, where they read these variables (torch's
# engines all do; OpenVINO's oneDNN reads ONEDNN_MAX_CPU_ISA; onnxruntime has no such control)
ISA_ENV = {
    "avx2": {"ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"},
    "generic": {"ONEDNN_MAX_CPU_ISA": "SSE41", "ATEN_CPU_CAPABILITY": "default", "MKL_ENABLE_INSTRUCTIONS": "SSE4_2"},
    "avx512": {},
    "neon": {},
}


def engine_env(engine: str, isa: str, hold_peers: bool = False) -> dict[str, str]:
    """The environment an engine's worker starts with under `--isa` (and `--hold-peers`)."""
    if not isa:
        return {}
    if isa not in ISA_ENV:
        raise ValueError(f"--isa {isa!r}: symfuse has {', '.join(ISA_ENV)}")
    if engine.startswith("symfuse"):
        return {"SYMFUSE_ISA": isa, **ISA_ENV[isa]}
    return dict(ISA_ENV[isa]) if hold_peers else {}


def measure_physics(log_path: str) -> dict:
    w = ProcessWorker({"physics": True}, log_path)
    try:
        return w.first.get("physics", {})
    finally:
        w.close()


@dataclass
class Config:
    model: str
    engines: list[str]
    bindings: list[dict[str, int]]
    rounds: int = 2
    min_reps: int = 5
    max_reps: int = 200
    budget_s: float = 0.5
    profile: bool = False
    out_dir: str = "symfuse-results"
    isa: str = ""  # symfuse's ISA (and its libraries'), "" for the machine's best
    hold_peers: bool = False  # hold the peers' libraries to `isa` too


@dataclass
class EngineResult:
    name: str
    status: str = "pending"  # ok | missing | failed
    detail: str = ""
    prepare_s: float | None = None
    recompiles: int | None = None
    peak_rss_mb: float | None = None
    times: dict[str, list[float]] = field(default_factory=dict)  # binding key -> all times (ms)
    errors: dict[str, float] = field(default_factory=dict)  # binding key -> max rel error vs eager
    failures: dict[str, str] = field(default_factory=dict)  # binding key -> why it did not run
    log: str = ""  # the worker's log file


def key(binding: dict[str, int]) -> str:
    return ", ".join(f"{k}={v}" for k, v in binding.items())


def median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def summarize(results: dict[str, EngineResult], bindings: list[dict[str, int]]) -> list[dict]:
    """One row per (engine, binding): median, min, error and ratio to the best peer.

    Peers are every engine but symfuse's own (captured or imported); the ratio is an engine's median over the fastest
    peer median at that shape (below 1 means faster than every peer).
    """
    rows = []
    for b in bindings:
        k = key(b)
        medians = {n: median(r.times.get(k, [])) for n, r in results.items()}
        peer = [m for n, m in medians.items() if not n.startswith("symfuse") and m is not None]
        best = min(peer) if peer else None
        for n, r in results.items():
            m = medians[n]
            rows.append({
                "engine": n, "binding": b, "median_ms": m, "min_ms": min(r.times[k]) if r.times.get(k) else None,
                "reps": len(r.times.get(k, [])), "max_rel_err": r.errors.get(k), "best_peer_ms": best,
                "ratio_to_best_peer": (m / best) if (m is not None and best) else None,
                "failure": r.failures.get(k, "" if r.status == "ok" else r.detail),
            })  # fmt: skip
    return rows


def run(
    cfg: Config, launch: Callable = launch_process, progress: Callable[..., None] = lambda msg, done=0, total=0: None
) -> dict:
    """Run the benchmark; `progress(message, done, total)` is called before each step."""
    logs = os.path.join(cfg.out_dir, "logs")
    os.makedirs(logs, exist_ok=True)
    results = {n: EngineResult(n) for n in cfg.engines}
    workers: dict[str, Worker] = {}
    profile: dict[str, list] = {}  # symfuse engine -> its steps' profile
    work: dict[str, dict] = {}  # symfuse engine -> binding key -> a call's FLOPs and weight bytes
    try:
        for n in cfg.engines:
            progress(f"preparing {n}")
            try:
                env = engine_env(n, cfg.isa, cfg.hold_peers)
                w, first = launch(n, cfg.model, os.path.join(logs, f"{n}.log"), env)
            except Exception as e:  # noqa: BLE001 - a peer that cannot start is reported
                first, w = {"status": "failed", "detail": f"{type(e).__name__}: {e}"}, None
            r = results[n]
            r.status = {"ready": "ok"}.get(first.get("status"), first.get("status", "failed"))
            r.detail, r.prepare_s = first.get("detail", ""), first.get("prepare_s")
            r.log = os.path.join(logs, n + ".log")
            if r.status == "ok":
                workers[n] = w
            elif w is not None:
                w.close()
        total = cfg.rounds * len(cfg.bindings) * len(workers)
        done = 0
        for rnd in range(cfg.rounds):
            names = list(workers)
            shift = rnd % max(len(names), 1)
            order = names[shift:] + names[:shift]
            for b in cfg.bindings:
                for n in order:
                    done += 1
                    progress(f"round {rnd + 1}/{cfg.rounds}  {n:<22} {key(b)}", done, total)
                    time.sleep(SETTLE_S)
                    ans = workers[n].request(
                        {
                            "cmd": "run",
                            "binding": b,
                            "min_reps": cfg.min_reps,
                            "max_reps": cfg.max_reps,
                            "budget_s": cfg.budget_s,
                        }
                    )
                    r = results[n]
                    if "times_ms" in ans:
                        r.times.setdefault(key(b), []).extend(ans["times_ms"])
                        r.errors[key(b)] = max(r.errors.get(key(b), 0.0), ans["err"])
                    else:
                        r.failures[key(b)] = ans.get("error", "no answer")
        for n, w in workers.items():
            st = w.request({"cmd": "stats"})
            results[n].recompiles, results[n].peak_rss_mb = st.get("recompiles"), st.get("peak_rss_mb")
        ours = [n for n in workers if n.startswith("symfuse")]  # each precision
        for n in ours:  # what a call does at each shape, whoever runs it: the floor under every engine
            for b in cfg.bindings:
                ans = workers[n].request({"cmd": "work", "binding": b})
                if "work" in ans:
                    work.setdefault(n, {})[key(b)] = ans["work"]
        for n in ours if cfg.profile else []:
            progress(f"profiling {n}")
            profile[n] = workers[n].request({"cmd": "profile", "binding": cfg.bindings[-1]}).get("profile")
    finally:
        for w in workers.values():
            w.close()
    return {
        "config": cfg.__dict__,
        "engines": {n: r.__dict__ for n, r in results.items()},
        "rows": summarize(results, cfg.bindings),
        "profile": profile or None,
        "work": work or None,
        "finished": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
