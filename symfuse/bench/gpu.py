"""`symfuse bench --device cuda`: symfuse against eager PyTorch and torch.compile on a GPU.

One process, the engines one after another on the same model and shape sweep. A call is
timed as a user sees it (host work included: Python, launches, CUDA-graph replay), with
the device synchronised after each call; medians of `rounds` calls after warm-up calls.
Compilations are counted for every engine: symfuse's with `symfuse.compile_count()`,
torch.compile's with Dynamo's count of compiled graphs.
"""

from __future__ import annotations

import copy
import json
import os
import statistics
import time

import torch

from symfuse.bench.engines import flat_outputs
from symfuse.models import load


def _time(fn, inputs, warmup: int, rounds: int) -> float:
    for _ in range(warmup):
        fn(inputs)
    torch.cuda.synchronize()
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn(inputs)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def _rel(a: list, b: list) -> float:
    err = 0.0
    for x, y in zip(a, b):
        if x.is_floating_point():
            x, y = x.float(), y.float()
            err = max(err, float((x - y).abs().max() / y.abs().max().clamp_min(1e-12)))
    return err


def _dynamo_graphs() -> int:
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def engines(case, precision: str, which: list[str]):
    """name -> (prepare() -> run(inputs), count() -> compilations so far)."""
    import symfuse

    half = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(precision)
    model = case.model.cuda().eval()
    low = model if half is None else copy.deepcopy(model).to(half)
    out = {}
    if "symfuse" in which:
        ex = {k: v.cuda() if isinstance(v, torch.Tensor) else v for k, v in case.inputs(**case.example).items()}

        def prepare():
            c = symfuse.compile(model, ex, case.dynamic, precision=precision)
            return lambda x: flat_outputs(c(**x))

        out[f"symfuse ({precision})"] = (prepare, symfuse.compile_count)
    if "eager" in which:
        out["eager"] = (lambda: lambda x: flat_outputs(low(**x)), lambda: 0)
    if "inductor" in which:
        out["torch.compile(dynamic=True)"] = (
            lambda: (lambda f: lambda x: flat_outputs(f(**x)))(torch.compile(low, dynamic=True)),
            _dynamo_graphs,
        )
    if "max-autotune" in which:
        out["torch.compile(max-autotune-no-cudagraphs)"] = (
            lambda: (lambda f: lambda x: flat_outputs(f(**x)))(
                torch.compile(low, dynamic=True, mode="max-autotune-no-cudagraphs")
            ),
            _dynamo_graphs,
        )
    return out


def run(
    model: str, bindings: list[dict], precision: str, rounds: int, folder: str, which: list[str], log=print
) -> dict:
    case = load(model)
    results: dict = {"model": model, "precision": precision, "device": torch.cuda.get_device_name()}
    eager = engines(case, "fp32", ["eager"])["eager"][0]()  # the fp32 reference for errors
    inputs = [
        {k: v.cuda() if isinstance(v, torch.Tensor) else v for k, v in case.inputs(**b).items()} for b in bindings
    ]
    with torch.no_grad():
        refs = [eager(x) for x in inputs]
    table: dict[str, dict] = {}
    for name, (prepare, count) in engines(case, precision, which).items():
        t0 = time.perf_counter()
        with torch.no_grad():
            fn = prepare()
            first = count()
            fn(inputs[0])
            compile_s = time.perf_counter() - t0
            start = count()
            rows = []
            for b, x, ref in zip(bindings, inputs, refs):
                ms = _time(fn, x, warmup=3, rounds=rounds)
                rows.append({"binding": b, "ms": ms, "err": _rel(fn(x), ref)})
                log(f"[bench] {name} {b}: {ms:.3f} ms")
        table[name] = {"compile_s": compile_s, "recompiles": count() - start, "first": first, "rows": rows}
        log(f"[bench] {name}: compiled in {compile_s:.1f}s, {count() - start} recompilations over the sweep")
        results["engines"] = table
        text = _write(results, bindings, rounds, folder)  # after every engine: a stopped run keeps what it measured
    log(text)
    return results


def _write(results: dict, bindings: list[dict], rounds: int, folder: str) -> str:
    model, precision, table = results["model"], results["precision"], results["engines"]
    base = "torch.compile(dynamic=True)" if "torch.compile(dynamic=True)" in table else "eager"
    lines = [
        f"{model}, {precision}, {results['device']}, median of {rounds} calls (ms; ratio to {base})",
        "",
        "| shape | " + " | ".join(table) + " |",
        "|---" * (len(table) + 1) + "|",
    ]
    for i, b in enumerate(bindings):
        cells = []
        for t in table.values():
            ms = t["rows"][i]["ms"]
            ref = table.get(base, {}).get("rows", [None] * len(bindings))[i]
            ratio = f" ({ms / ref['ms']:.2f}x)" if ref else ""
            cells.append(f"{ms:.3f}{ratio}")
        lines.append(f"| B={b.get('B')} S={b.get('S')} | " + " | ".join(cells) + " |")
    lines.append("")
    lines += [
        f"- {name}: compile + first call {t['compile_s']:.1f} s, {t['recompiles']} recompilations over the sweep, "
        f"max relative error vs fp32 eager {max(r['err'] for r in t['rows']):.2e}"
        for name, t in table.items()
    ]
    text = "\n".join(lines)
    os.makedirs(folder, exist_ok=True)
    stem = os.path.join(folder, f"gpu-{model}-{precision}")
    with open(stem + ".json", "w") as f:
        json.dump(results, f, indent=1)
    with open(stem + ".md", "w") as f:
        f.write(text + "\n")
    return text
