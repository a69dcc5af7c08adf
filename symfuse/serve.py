"""Serving saved artifacts on Ray Serve, with dynamic batching that never recompiles.

Two deployments (`pip install .[serve]`):

- `Ingress` takes HTTP: `POST /` with one request as JSON, `GET /metrics`. It checks the
  request against the model's inputs and rules (a bad one gets a 400 with symfuse's own
  message and never reaches a batch), forwards it to a model replica and, if that replica
  dies mid-request, sends it again to another (up to `retries` times) before answering 503.
- `ModelReplica` loads the artifact once (its weights are memory-mapped: replicas on one
  machine share the pages) and batches requests with `@serve.batch`: each batch is padded
  to its own longest request, not to a fixed bucket, and runs at whatever size it has,
  since the compiled model serves every batch size and length without compiling. Each
  request gets its own slice of every output back.

A request: `{"input_ids": [101, 2023, ...]}` (the other inputs optional: a missing
`attention_mask` is all ones, a missing `token_type_ids` zeros), or `{"text": "..."}` when
the deployment names a tokenizer folder; `"outputs": ["pooler_output"]` picks outputs.
The answer: `{"outputs": {"last_hidden_state": [[...]], ...}}`.

`engine="eager"` or `"onnxruntime"` runs the same deployment on a built-in model with
PyTorch or ONNX Runtime, for comparisons under the same batching (`bench/serve_load.py`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import statistics
import time
from collections import Counter
from typing import Any

import torch
from ray import serve
from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError
from starlette.requests import Request
from starlette.responses import JSONResponse

import symfuse
from symfuse.bench.engines import flat_outputs
from symfuse.ir.dims import evaluate
from symfuse.runtime.artifact import read_manifest

log = logging.getLogger("symfuse")

DEFAULTS = {"attention_mask": 1, "token_type_ids": 0}  # inputs a request may leave out, and their fill


class BadRequest(ValueError):
    """A request the model cannot take, with the reason in symfuse's words."""


class Model:
    """What a replica runs: the artifact's module (or a peer on the same model), plus the
    artifact's description of its inputs and outputs for checking and slicing requests."""

    def __init__(self, artifact: str, engine: str = "symfuse", model: str = "", tokenizer: str = "") -> None:
        self.module = symfuse.load(artifact)
        self.spec = self.module.guard_spec
        graph = self.module.graph
        self.out_dims = [v.type.shape for v in graph.outputs]
        self.out_names = _output_names(self.module.captured.out_spec, len(graph.outputs))
        self.batch = self.spec.inputs[0].dims[0]  # the symbol of the batch dim
        self.has_mask = any(i.name == "attention_mask" for i in self.spec.inputs)
        self.engine = engine
        self.run = self._runner(engine, model)
        self.tokenizer = None
        if tokenizer:
            from transformers import AutoTokenizer

            self.tokenizer = AutoTokenizer.from_pretrained(tokenizer, local_files_only=True)

    def _runner(self, engine: str, model: str):
        if engine == "symfuse":
            return lambda inputs: flat_outputs(self.module(**inputs))
        from symfuse.models import load

        case = load(model)
        if engine == "eager":

            def eager(inputs):
                with torch.no_grad():
                    return flat_outputs(case.model(**inputs))

            return eager
        if engine == "onnxruntime":
            import tempfile

            import onnxruntime as ort

            from symfuse.bench.engines import export_onnx

            path = os.path.join(tempfile.mkdtemp(prefix="symfuse-serve-"), f"{model}.onnx")
            export_onnx(case, path)
            opts = ort.SessionOptions()
            opts.intra_op_num_threads = torch.get_num_threads()
            sess = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
            feeds = [i.name for i in sess.get_inputs()]
            return lambda inputs: [torch.from_numpy(o) for o in sess.run(None, {k: inputs[k].numpy() for k in feeds})]
        raise ValueError(f"unknown engine {engine!r}: symfuse, eager or onnxruntime")

    def parse(self, body: Any) -> dict[str, torch.Tensor]:
        """One request as tensors with a batch dim of 1, checked by the model's guard."""
        if not isinstance(body, dict):
            raise BadRequest('a request is a JSON object, e.g. {"input_ids": [101, 2023, 102]}')
        body = dict(body)
        if "text" in body:
            if self.tokenizer is None:
                raise BadRequest("this deployment has no tokenizer: send input_ids")
            body.update({k: v for k, v in self.tokenizer(body.pop("text")).items() if k in self.names})
        tensors = {}
        for inp in self.spec.inputs:
            if inp.name in body:
                try:
                    t = torch.tensor(body[inp.name], dtype=inp.dtype)
                except (TypeError, ValueError, RuntimeError) as e:
                    raise BadRequest(f"input '{inp.name}' must be a list of {inp.dtype}: {e}") from None
                tensors[inp.name] = t[None]
            elif inp.name not in DEFAULTS:
                raise BadRequest(f"missing input '{inp.name}'")
        first = next(iter(tensors.values()), None)
        if first is None:
            raise BadRequest(f"a request needs {', '.join(i.name for i in self.spec.inputs)}")
        for inp in self.spec.inputs:
            if inp.name not in tensors:
                tensors[inp.name] = torch.full(first.shape, DEFAULTS[inp.name], dtype=inp.dtype)
        unknown = sorted(set(body) - set(tensors) - {"outputs"})
        if unknown:
            raise BadRequest(f"unknown field(s) {', '.join(unknown)}; inputs are {', '.join(self.names)}")
        try:
            self.module.bind(**tensors)  # every rule of the model, in its own words
        except ValueError as e:
            raise BadRequest(str(e)) from None
        wanted = body.get("outputs") or self.out_names
        bad = [w for w in wanted if w not in self.out_names]
        if bad:
            raise BadRequest(f"unknown output(s) {', '.join(map(str, bad))}; outputs are {', '.join(self.out_names)}")
        return {"tensors": tensors, "outputs": list(wanted)}

    @property
    def names(self) -> list[str]:
        return [i.name for i in self.spec.inputs]

    def run_batch(self, reqs: list[dict]) -> list[dict]:
        """Run requests as few padded batches as the model allows: one, padded to the
        longest, when it takes an attention mask; else one per distinct shape."""
        groups: dict[Any, list[int]] = {}
        for i, r in enumerate(reqs):
            key = None if self.has_mask else tuple(tuple(t.shape) for t in r["tensors"].values())
            groups.setdefault(key, []).append(i)
        answers: list[dict] = [{}] * len(reqs)
        for idx in groups.values():
            batch = self._pad([reqs[i]["tensors"] for i in idx])
            outs = self.run(batch)
            for row, i in enumerate(idx):
                answers[i] = self._slice(outs, row, reqs[i])
        return answers

    def _pad(self, items: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        out = {}
        for name in items[0]:
            ts = [it[name] for it in items]
            shape = [len(ts)] + [max(t.shape[d] for t in ts) for d in range(1, ts[0].dim())]
            full = torch.zeros(shape, dtype=ts[0].dtype)  # padding: 0, and 0 in the mask
            for i, t in enumerate(ts):
                full[(i, *(slice(0, s) for s in t.shape[1:]))] = t[0]
            out[name] = full
        return out

    def _slice(self, outs: list[torch.Tensor], row: int, req: dict) -> dict:
        """Request `row`'s part of each output it asked for: its row of the batch dim, and of
        every other dim the size its own binding gives (padding cut off)."""
        binding = self.module.bind(**req["tensors"])  # this request's own sizes
        answer = {}
        for name, dims, t in zip(self.out_names, self.out_dims, outs):
            if name not in req["outputs"]:
                continue
            if dims and str(dims[0]) == self.batch:
                t = t[row][tuple(slice(0, evaluate(d, binding)) for d in dims[1:])]
            answer[name] = t.tolist()
        return answer


def _output_names(spec, n: int) -> list[str]:
    """The model's output names (a ModelOutput's or dict's keys), else their positions."""
    keys = spec.context if not spec.is_leaf() else None
    if isinstance(keys, tuple) and len(keys) == 2 and isinstance(keys[1], list):  # a Record: (type, keys)
        keys = keys[1]
    if isinstance(keys, list) and len(keys) == n and all(isinstance(k, str) for k in keys):
        return list(keys)
    return [str(i) for i in range(n)]


@serve.deployment
class ModelReplica:
    """One copy of the model; batches what the ingress sends it."""

    def __init__(self, artifact: str, engine: str = "symfuse", model: str = "", tokenizer: str = "",
                 threads: int = 1, max_batch_size: int = 8, batch_wait_timeout_s: float = 0.005) -> None:  # fmt: skip
        torch.set_num_threads(threads)
        self.model = Model(artifact, engine, model, tokenizer)
        self.compiles = symfuse.compile_count()
        self.batch_sizes: Counter = Counter()
        self.batched.set_max_batch_size(max_batch_size)
        self.batched.set_batch_wait_timeout_s(batch_wait_timeout_s)

    async def __call__(self, req: dict) -> dict:
        return await self.batched(req)

    @serve.batch(max_batch_size=8, batch_wait_timeout_s=0.005)
    async def batched(self, reqs: list[dict]) -> list[dict]:
        self.batch_sizes[len(reqs)] += 1
        # off the event loop: requests that arrive meanwhile join the next batch's queue
        return await asyncio.to_thread(self.model.run_batch, reqs)

    def stats(self) -> dict:
        return {
            "pid": os.getpid(),
            "engine": self.model.engine,
            "batches": dict(self.batch_sizes),
            "compilations_since_start": symfuse.compile_count() - self.compiles,
        }

    def check_health(self) -> None:
        if symfuse.compile_count() != self.compiles:
            raise RuntimeError("the model compiled after start")


@serve.deployment
class Ingress:
    """HTTP in front of the replicas: checks requests, retries one whose replica died."""

    def __init__(self, replica, artifact: str, tokenizer: str = "", retries: int = 3) -> None:
        self.replica = replica
        self.checker = Model(artifact, "symfuse", tokenizer=tokenizer)  # the guard and tokenizer only
        self.retries = retries
        self.counts: Counter = Counter()
        self.latencies: list[float] = []

    async def __call__(self, request: Request):
        if request.method == "GET":
            if request.url.path.rstrip("/").endswith("metrics"):
                return JSONResponse(await self.metrics())
            return JSONResponse({"model": self.checker.module.graph.name, "inputs": self.checker.names})
        t0 = time.perf_counter()
        try:
            req = self.checker.parse(await request.json())
        except (BadRequest, ValueError) as e:
            self.counts["bad requests"] += 1
            return JSONResponse({"error": str(e)}, status_code=400)
        for attempt in range(self.retries + 1):
            try:
                answer = await self.replica.remote(req)
                break
            except (ActorDiedError, ActorUnavailableError, RayActorError) as e:
                self.counts["retried after a replica died"] += 1
                if attempt == self.retries:
                    self.counts["failed"] += 1
                    return JSONResponse({"error": f"no replica could answer: {e}"}, status_code=503)
                await asyncio.sleep(0.2 * (attempt + 1))
        self.counts["answered"] += 1
        self.latencies.append(time.perf_counter() - t0)
        del self.latencies[:-10000]
        return JSONResponse({"outputs": answer})

    async def metrics(self) -> dict:
        lat = sorted(self.latencies)
        pick = lambda q: round(lat[min(len(lat) - 1, int(q * len(lat)))] * 1e3, 2) if lat else None  # noqa: E731
        replica = await self.replica.stats.remote()
        return {
            **self.counts,
            "latency_ms": {
                "p50": pick(0.5),
                "p99": pick(0.99),
                "mean": round(statistics.mean(lat) * 1e3, 2) if lat else None,
            },
            "a_replica": replica,  # one replica's counts (each keeps its own)
        }


def app(artifact: str, *, replicas: int = 1, threads: int = 1, max_batch_size: int = 8,
        batch_wait_timeout_s: float = 0.005, engine: str = "symfuse", model: str = "", tokenizer: str = "",
        num_cpus: float | None = None):  # fmt: skip
    """The Ray Serve application for a saved artifact (`serve.run(app(...))`)."""
    artifact = os.path.abspath(artifact)
    read_manifest(artifact)  # a missing or foreign folder fails here, not in a replica
    replica = ModelReplica.options(
        num_replicas=replicas,
        ray_actor_options={"num_cpus": threads if num_cpus is None else num_cpus},
        max_ongoing_requests=4 * max_batch_size,  # a full batch running, the next ones filling
        health_check_period_s=2,
        health_check_timeout_s=10,
    ).bind(artifact, engine, model, tokenizer, threads, max_batch_size, batch_wait_timeout_s)
    # the ingress only checks and forwards: it must hold every client's request at once, or
    # requests queue in the proxy and never meet in a replica's batch
    return Ingress.options(ray_actor_options={"num_cpus": 0}, max_ongoing_requests=1024).bind(
        replica, artifact, tokenizer
    )
