"""Time to a runnable model, each part in fresh processes (median of --runs, default 3):

- symfuse cold: `symfuse.compile` with an empty kernel cache (the machine's target and
  switch points are measured once per machine and kept, as on a deployed machine);
- symfuse warm: the same with every kernel cached;
- save: `CompiledModule.save`;
- load + first call: `symfuse.load` and one call in a fresh process, split into reading
  and hashing the files, the rest of loading, and the first call (import of torch and
  symfuse reported apart);
- torch.compile(dynamic=True): its first call, which compiles;
- ONNX Runtime: session creation from an exported file, and its first call.

Run: .venv/bin/python bench/compile_time.py [--models bert-base,gpt2] [--runs 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

T_START = time.perf_counter()


def child(mode: str, model: str, work: str) -> dict:
    import torch

    import symfuse
    from symfuse.models import load

    t_import = time.perf_counter() - T_START
    out: dict = {"import torch + symfuse": t_import}
    if mode == "load":
        t0 = time.perf_counter()
        m = symfuse.load(os.path.join(work, "artifact"))
        out["load"] = time.perf_counter() - t0
        out.update({f"load: {k}": v for k, v in m.native.seconds.items()})
        inputs = torch.load(os.path.join(work, "inputs.pt"))
        t0 = time.perf_counter()
        m(**inputs)
        out["first call"] = time.perf_counter() - t0
        return out
    case = load(model)
    example = case.inputs(**case.example)
    if mode in ("cold", "warm"):
        t0 = time.perf_counter()
        m = symfuse.compile(case.model, example, case.dynamic, cache_dir=os.path.join(work, "kernels"))
        out["compile"] = time.perf_counter() - t0
        out.update({f"capture: {k}": v for k, v in m.captured.stages.items()})
        out.update({k: v for k, v in m.native.seconds.items()})
        if mode == "warm":
            t0 = time.perf_counter()
            m.save(os.path.join(work, "artifact"))
            out["save"] = time.perf_counter() - t0
            torch.save(case.inputs(**case.sweep[0]), os.path.join(work, "inputs.pt"))
        return out
    if mode == "torch-compile":
        compiled = torch.compile(case.model, dynamic=True)
        t0 = time.perf_counter()
        with torch.no_grad():
            compiled(**example)
        out["first call (compiles)"] = time.perf_counter() - t0
        return out
    if mode == "onnxruntime":
        import onnxruntime as ort

        from symfuse.bench.engines import export_onnx

        path = os.path.join(work, f"{model}.onnx")
        if not os.path.exists(path):
            export_onnx(case, path)
        t0 = time.perf_counter()
        sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
        out["session creation"] = time.perf_counter() - t0
        feeds = {i.name: example[i.name].numpy() for i in sess.get_inputs()}
        t0 = time.perf_counter()
        sess.run(None, feeds)
        out["first call"] = time.perf_counter() - t0
        return out
    raise ValueError(mode)


def run_child(mode: str, model: str, work: str) -> dict:
    r = subprocess.run(
        [sys.executable, __file__, "--child", mode, model, work], capture_output=True, text=True, check=False
    )
    if r.returncode != 0:
        return {"error": r.stderr.strip().splitlines()[-1] if r.stderr.strip() else f"exit {r.returncode}"}
    return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--models", default="bert-base,gpt2")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--child", nargs=3, metavar=("MODE", "MODEL", "WORK"))
    args = p.parse_args()
    if args.child:
        print(json.dumps(child(*args.child)))
        return 0
    for model in args.models.split(","):
        runs: dict[str, list[dict]] = {}
        with tempfile.TemporaryDirectory() as work:
            for i in range(args.runs):
                for mode in ("cold", "warm", "load", "torch-compile", "onnxruntime"):
                    if mode == "cold":
                        subprocess.run(["rm", "-rf", os.path.join(work, "kernels")], check=True)
                    runs.setdefault(mode, []).append(run_child(mode, model, work))
                    print(f"{model} run {i + 1} {mode}: {runs[mode][-1]}", file=sys.stderr)
        print(f"\n{model}: median of {args.runs} fresh processes, seconds")
        for mode, results in runs.items():
            ok = [r for r in results if "error" not in r]
            if not ok:
                print(f"  {mode}: failed: {results[0]['error']}")
                continue
            keys = [k for k in ok[0] if all(k in r for r in ok)]
            parts = ", ".join(f"{k} {statistics.median(r[k] for r in ok):.2f}" for k in keys)
            print(f"  {mode}: {parts}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
