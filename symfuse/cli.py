"""The `symfuse` command: demo, explain, bench, compile, tune, run, serve, cache, generate and models."""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time

import torch


class _Stderr(logging.Handler):
    """Progress lines to whatever `sys.stderr` is when they are written."""

    def emit(self, record: logging.LogRecord) -> None:
        print(self.format(record), file=sys.stderr)


def _times_ms(fn, reps: int) -> list[float]:
    fn()  # warm up: first calls at a new shape set up library kernels
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return times


def cmd_demo(args) -> int:
    logger = logging.getLogger("symfuse")
    level = logger.level
    logger.setLevel(logging.WARNING)  # the demo prints its own lines: a table, not a log
    try:
        return _demo(args)
    finally:
        logger.setLevel(level)


def _demo(args) -> int:
    import symfuse
    from symfuse.bench import harness, report
    from symfuse.bench.engines import flat_outputs
    from symfuse.bench.worker import rel_err
    from symfuse.models import load

    case = load(args.model)
    print(f"symfuse demo: {case.name}, dynamic dims {case.dynamic}")
    t0 = time.perf_counter()
    compiled = symfuse.compile(case.model, case.inputs(**case.example), case.dynamic)
    compile_s = time.perf_counter() - t0
    print(f"compiled once in {compile_s:.2f}s: {len(compiled.graph.nodes)} ops, symbols {compiled.symbols}")
    print(f"backend: {compiled.backend}")
    if compiled.native is not None:
        print(f"target: {compiled.native.target.describe()}")
    print(
        f"{len(compiled.store.checks())} shape facts are checked on every call; "
        f"`symfuse explain --model {case.name}` lists them\n"
    )
    print(f"{'binding':<22}{'symfuse ms':>12}{'eager ms':>10}{'ratio':>8}{'max rel err':>13}")
    compiles = symfuse.compile_count()
    results = {n: harness.EngineResult(n, "ok") for n in ("symfuse", "eager")}
    results["symfuse"].prepare_s, results["eager"].prepare_s = compile_s, 0.0
    for binding in case.sweep:
        inputs = case.inputs(**binding)
        with torch.no_grad():
            ref = case.model(**inputs)
        err = rel_err(flat_outputs(compiled(**inputs)), flat_outputs(ref))
        k = harness.key(binding)
        results["symfuse"].times[k] = _times_ms(lambda: compiled(**inputs), args.reps)
        with torch.no_grad():
            results["eager"].times[k] = _times_ms(lambda: case.model(**inputs), args.reps)
        results["symfuse"].errors[k] = err
        ours, eager = harness.median(results["symfuse"].times[k]), harness.median(results["eager"].times[k])
        print(f"{k:<22}{ours:>12.2f}{eager:>10.2f}{ours / eager:>8.2f}{err:>13.1e}")
    recompiles = symfuse.compile_count() - compiles
    results["symfuse"].recompiles = recompiles
    print(f"\ncompilations during the sweep: {recompiles} (one compile serves every shape)")
    for name, limit in case.limits.items():
        try:
            compiled.bind(**case.inputs(**{**case.example, name: limit + 1}))
        except ValueError as e:
            print(f"a call with {name}={limit + 1} is refused before running:\n  {e}")
    cfg = harness.Config(case.name, list(results), case.sweep, rounds=1, out_dir=args.out)
    result = {
        "config": cfg.__dict__, "engines": {n: r.__dict__ for n, r in results.items()},
        "rows": harness.summarize(results, case.sweep), "profile": None,
        "finished": time.strftime("%Y-%m-%d %H:%M:%S"), "command": "symfuse " + " ".join(args.argv),
    }  # fmt: skip
    paths = report.write(result, args.out)
    print(f"\nresults: {paths.get('markdown')}; plot: {paths.get('plot', 'not written (matplotlib missing)')}")
    print("for the comparison with torch.compile, ONNX Runtime and OpenVINO: pip install .[bench]; symfuse bench")
    return 0


def parse_dynamic_flags(flags: list[str] | None) -> dict[str, dict[int, str]] | None:
    """`--dynamic input_ids:0=B,1=S` (repeatable) as `symfuse.compile`'s `dynamic`."""
    if not flags:
        return None
    out: dict[str, dict[int, str]] = {}
    for text in flags:
        name, sep, dims = text.rpartition(":")
        try:
            if not sep or not name:
                raise ValueError
            out.setdefault(name, {}).update(
                {int(d): sym.strip() for d, sym in (p.split("=", 1) for p in dims.split(",") if p.strip())}
            )
        except ValueError:
            raise ValueError(f"--dynamic {text!r}: expected INPUT:DIM=NAME,..., e.g. input_ids:0=B,1=S") from None
    return out


PRECISION_HELP = "fp32 or bf16 (bfloat16 weights and intermediates; fp32 where the CPU has no bf16 instructions)"


def _compile_model(model: str, dynamic_flags: list[str] | None, precision: str = "fp32", **options):
    """A built-in model's name or an ONNX file, compiled; returns (name, module, example binding)."""
    import symfuse
    from symfuse.frontend import is_onnx
    from symfuse.models import load

    dynamic = parse_dynamic_flags(dynamic_flags)
    if is_onnx(model):
        return os.path.basename(model), symfuse.compile(model, dynamic=dynamic, precision=precision, **options), None
    if dynamic is not None:
        raise ValueError("--dynamic applies to ONNX files; a built-in model declares its own dynamic dims")
    case = load(model)
    ex = case.inputs(**case.example)
    return case.name, symfuse.compile(case.model, ex, case.dynamic, precision=precision, **options), case.example


def cmd_explain(args) -> int:
    _, compiled, _ = _compile_model(args.target or args.model, args.dynamic, args.precision)
    print(compiled.explain(with_graph=not args.no_graph, with_te=args.te))
    return 0


def cmd_compile(args) -> int:
    t0 = time.perf_counter()
    name, compiled, example = _compile_model(args.target or args.model, args.dynamic, args.precision)
    compile_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    compiled.save(args.out)
    print(f"compiled {name} in {compile_s:.2f}s and saved it to {args.out} in {time.perf_counter() - t0:.2f}s")
    print(f"target: {compiled.native.target.describe()}")
    example = example or {s: 8 for s in compiled.symbols}
    print(f"run it: symfuse run {args.out} --shape " + ",".join(f"{k}={v}" for k, v in example.items()))
    return 0


def _file_inputs(spec, given: list[str]) -> list[torch.Tensor]:
    """`--input name=file.npy` for every input of the saved module."""
    import numpy as np

    files = {}
    for text in given:
        name, sep, path = text.partition("=")
        if not sep or not name or not path:
            raise ValueError(f"--input {text!r}: expected NAME=FILE.npy")
        files[name] = path
    names = [i.name for i in spec.inputs]
    unknown = [n for n in files if n not in names]
    if unknown:
        raise ValueError(f"--input names {', '.join(unknown)}; the module's inputs are {', '.join(names)}")
    missing = [n for n in names if n not in files]
    if missing:
        raise ValueError(f"--input must give every input; missing {', '.join(missing)}")
    out = []
    for n in names:
        try:
            out.append(torch.from_numpy(np.load(files[n], allow_pickle=False)))
        except (OSError, ValueError) as e:
            raise ValueError(f"--input {n}={files[n]}: cannot read it as a .npy array ({e})") from None
    return out


def _random_inputs(spec, binding: dict[str, int]) -> list[torch.Tensor]:
    """Inputs for a saved module at `binding`: floats from a normal distribution, integers 0
    or 1 (valid as token ids, types and masks alike), booleans true."""
    out = []
    for inp in spec.inputs:
        missing = [d for d in inp.dims if isinstance(d, str) and d not in binding]
        if missing:
            raise ValueError(f"--shape must give {', '.join(missing)} (input '{inp.name}' has dims {inp.dims})")
        shape = [d if isinstance(d, int) else binding[d] for d in inp.dims]
        if inp.dtype.is_floating_point:
            out.append(torch.randn(shape, dtype=inp.dtype))
        elif inp.dtype == torch.bool:
            out.append(torch.ones(shape, dtype=torch.bool))
        else:
            out.append(torch.randint(0, 2, shape, dtype=inp.dtype))
    return out


def cmd_tune(args) -> int:
    """Measure the switch points each model needs on this machine (kept in the machine folder;
    every later compile here uses them), and show them beside the model's values."""
    from symfuse.codegen.cpu.calibrate import modelled

    for model in args.models:
        t0 = time.perf_counter()
        name, compiled, _ = _compile_model(model, args.dynamic, args.precision, switch_points="measure")
        native = compiled.native
        print(f"{name}: {len(native.thresholds)} switch points, measured or read in {time.perf_counter() - t0:.1f}s "
              f"({native.target.describe()})")  # fmt: skip
        seen = set()
        for th in sorted(native.thresholds.values(), key=lambda t: (t.kind, t.shape)):
            if (th.kind, th.shape) in seen:
                continue
            seen.add((th.kind, th.shape))
            model_value = modelled(th.kind, th.shape, native.target)
            mark = "" if model_value == th.value else f" (the model says {model_value})"
            print(f"  {th.kind:<28} {'x'.join(map(str, th.shape)) or '-':<12} {th.value:>6}{mark}")
    print("kept in the machine folder (symfuse cache shows where); compiles on this machine use them from now on")
    return 0


def cmd_run(args) -> int:
    import symfuse
    from symfuse.bench import harness

    t0 = time.perf_counter()
    module = symfuse.load(args.artifact)
    print(f"loaded {module.graph.name} from {args.artifact} in {time.perf_counter() - t0:.2f}s")
    print(f"target: {module.native.target.describe()}")
    spec = module.guard_spec
    print("inputs: " + ", ".join(f"{i.name} {str(i.dtype).replace('torch.', '')}{list(i.dims)}" for i in spec.inputs))
    shapes = args.shape or []
    if not shapes and not args.input:
        print("give --shape SYMBOL=VALUE,... (random inputs) or --input NAME=FILE.npy for each input to run it, "
              "e.g. --shape " + ",".join(f"{s}=8" for s in module.symbols))  # fmt: skip
        return 0
    runs = []
    if args.input:
        inputs = _file_inputs(spec, args.input)
        runs.append((module.bind(*inputs), inputs))
    for text in shapes:
        try:
            binding = {k.strip(): int(v) for k, v in (p.split("=", 1) for p in text.split(",") if p.strip())}
        except ValueError:
            raise ValueError(f"--shape {text!r}: expected SYMBOL=INT,..., e.g. B=1,S=16") from None
        runs.append((binding, _random_inputs(spec, binding)))
    print(f"\n{'binding':<28}{'median ms':>10}  outputs")
    for binding, inputs in runs:
        outs = module(*inputs)
        ms = harness.median(_times_ms(lambda inputs=inputs: module(*inputs), args.reps))
        flat = [o for o in torch.utils._pytree.tree_leaves(outs) if isinstance(o, torch.Tensor)]
        shown = ", ".join(str(tuple(o.shape)) for o in flat)
        print(f"{harness.key(binding):<28}{ms:>10.2f}  {shown}")
    return 0


def cmd_serve(args) -> int:
    try:
        import ray
        from ray import serve
    except ImportError:
        raise ValueError("symfuse serve needs Ray Serve: pip install .[serve]") from None
    from symfuse.serve import app

    application = app(
        args.artifact,
        replicas=args.replicas,
        threads=args.threads,
        max_batch_size=args.max_batch_size,
        batch_wait_timeout_s=args.batch_wait_ms / 1e3,
        tokenizer=args.tokenizer or "",
    )
    ray.init(address=args.address or None, include_dashboard=False)
    serve.start(http_options={"host": args.host, "port": args.port})
    serve.run(application, name="symfuse", route_prefix="/")
    print(f"serving {args.artifact} at http://{args.host}:{args.port}/ ({args.replicas} replicas); Ctrl-C stops")
    print(f"  curl -X POST http://{args.host}:{args.port}/ -d '{{\"input_ids\": [101, 7592, 102]}}'")
    print(f"  curl http://{args.host}:{args.port}/metrics    curl http://{args.host}:{args.port}/-/healthz")
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        serve.shutdown()
    return 0


def cmd_cache(args) -> int:
    from symfuse import cache
    from symfuse.options import Options

    opts = Options.from_env()
    print(cache.info(opts) if args.action == "info" else cache.clear(opts, machine=args.all))
    return 0


def cmd_bench(args) -> int:
    import shlex

    from symfuse.bench import harness, report
    from symfuse.bench.engines import ENGINES

    if args.device != "cpu":
        return _bench_gpu(args)
    if args.task == "generate":
        return _bench_generate(args)

    # "all": every fp32 engine; the bf16 ones (symfuse-bf16, openvino-bf16) when named
    every = [e for e in ENGINES if not e.endswith("bf16")]
    engines = every if args.engines == "all" else [e.strip() for e in args.engines.split(",")]
    ours = {"torch": ["symfuse"], "onnx": ["symfuse-onnx"], "both": ["symfuse", "symfuse-onnx"]}[args.source]
    engines = ours + [e for e in engines if e not in ("symfuse", "symfuse-onnx")]
    unknown = [e for e in engines if e not in ENGINES]
    if unknown:
        raise ValueError(f"unknown engine(s) {', '.join(unknown)}; engines: {', '.join(ENGINES)}")
    bindings = harness.parse_sweep(args.model, {"batch": args.batch, "seq": args.seq, "image": args.image})
    out_dir = args.out or os.path.join("symfuse-results", args.model)
    cfg = harness.Config(
        args.model, engines, bindings, rounds=args.rounds, min_reps=args.min_reps, budget_s=args.budget,
        profile=args.profile, out_dir=out_dir, isa=args.isa, hold_peers=args.hold_peers,
    )  # fmt: skip
    tty = sys.stderr.isatty()

    def progress(msg: str, done: int = 0, total: int = 0) -> None:
        bar = ""
        if total:
            filled = round(20 * done / total)
            bar = f"[{'#' * filled}{'.' * (20 - filled)}] {done}/{total}  "
        sys.stderr.write(("\r\033[K" if tty else "") + f"[bench] {bar}{msg}" + ("" if tty else "\n"))
        sys.stderr.flush()

    progress("measuring memory bandwidth and SGEMM")
    os.makedirs(os.path.join(out_dir, "logs"), exist_ok=True)
    physics = harness.measure_physics(os.path.join(out_dir, "logs", "physics.log"))
    result = harness.run(cfg, progress=progress)
    result["physics"] = physics
    result["command"] = "symfuse " + shlex.join(args.argv)
    if tty:
        sys.stderr.write("\r\033[K")
    print(report.terminal(result))
    paths = report.write(result, out_dir)
    print("\nwrote " + ", ".join(f"{k}: {v}" for k, v in paths.items()))
    return 0


def _bench_generate(args) -> int:
    from symfuse.bench import generate

    models = [m.strip() for m in (args.model if args.model != "bert-small" else "gpt2").split(",")]
    engines = list(generate.ENGINES) if args.engines == "all" else [e.strip() for e in args.engines.split(",")]
    unknown = [e for e in engines if e not in generate.ENGINES]
    if unknown:
        raise ValueError(f"unknown generate engine(s) {', '.join(unknown)}; engines: {', '.join(generate.ENGINES)}")
    batches = [int(x) for x in (args.batch or "1,8").split(",")]
    prompts = [int(x) for x in (args.seq or "16,128,512").split(",")]
    out_dir = args.out or os.path.join("symfuse-results", "generate")
    text = generate.run(models, engines, batches, prompts, args.new_tokens, out_dir,
                        progress=lambda m: print(f"[bench] {m}", file=sys.stderr, flush=True),
                        command="symfuse " + " ".join(args.argv))  # fmt: skip
    print(text)
    print(f"wrote {os.path.join(out_dir, 'generate.md')}")
    return 0


def _bench_gpu(args) -> int:
    import torch

    from symfuse.bench import gpu, harness

    if not torch.cuda.is_available():
        raise ValueError(f"--device {args.device}: torch sees no CUDA device here (torch {torch.__version__})")
    which = ["eager", "inductor", "symfuse"] if args.engines == "all" else [e.strip() for e in args.engines.split(",")]
    unknown = set(which) - {"eager", "inductor", "max-autotune", "symfuse"}
    if unknown:
        raise ValueError(f"unknown GPU engine(s) {', '.join(sorted(unknown))}; eager, inductor, max-autotune, symfuse")
    bindings = harness.parse_sweep(args.model, {"batch": args.batch, "seq": args.seq, "image": args.image})
    out_dir = args.out or os.path.join("symfuse-results", args.model)
    gpu.run(args.model, bindings, args.precision, max(args.min_reps, 10), out_dir, which,
            log=lambda m: print(m, file=sys.stderr, flush=True))  # fmt: skip
    return 0


def cmd_models(args) -> int:
    from symfuse.models import BUILTIN, DECODERS

    print("\n".join(BUILTIN))
    print("decoders (symfuse generate): " + ", ".join(DECODERS))
    return 0


def _prompts(args, folder: str | None, vocab: int):
    """(prompts as token lists, tokenizer or None) from --prompt, --prompt-ids or --prompt-len."""
    tokenizer = None
    if args.prompt is not None:
        if folder is None or not os.path.exists(os.path.join(folder, "tokenizer_config.json")):
            raise ValueError(
                "--prompt needs a tokenizer saved beside the decoder (tokenizer.save_pretrained(DIR)); "
                "the built-in decoders have random weights and none: give --prompt-ids or --prompt-len"
            )
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(folder)
        prompt = tokenizer(args.prompt)["input_ids"]
        return [list(prompt)] * args.batch, tokenizer
    if args.prompt_ids:
        try:
            prompt = [int(t) for t in args.prompt_ids.split(",")]
        except ValueError:
            raise ValueError(f"--prompt-ids {args.prompt_ids!r}: expected token ids separated by commas") from None
        return [prompt] * args.batch, None
    g = torch.Generator().manual_seed(args.seed or 0)
    return [torch.randint(0, vocab, (args.prompt_len,), generator=g).tolist() for _ in range(args.batch)], None


def cmd_generate(args) -> int:
    import statistics

    import symfuse
    from symfuse.models import load_decoder
    from symfuse.runtime.decoder import Decoder

    folder = args.target if os.path.isdir(args.target) else None
    t0 = time.perf_counter()
    if folder is not None:
        decoder = symfuse.load(folder)
        if not isinstance(decoder, Decoder):
            raise ValueError(f"{folder} holds a compiled model that does not generate (no decoder.json); "
                             "symfuse run runs it")  # fmt: skip
        print(f"loaded {decoder.spec.model} from {folder} in {time.perf_counter() - t0:.2f}s")
    else:
        model = load_decoder(args.target)
        t0 = time.perf_counter()
        decoder = symfuse.compile(model, precision=args.precision)
        print(f"compiled {args.target} ({decoder.spec.model}) once in {time.perf_counter() - t0:.2f}s")
        if args.save:
            decoder.save(args.save)
            print(f"saved to {args.save}: symfuse generate {args.save} --prompt-len 16")
    prompts, tokenizer = _prompts(args, folder, decoder.spec.vocab)
    options = dict(do_sample=args.sample, temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                   seed=args.seed)  # fmt: skip
    decoder.generate(prompts, max_new_tokens=2, **options)  # warm-up: first-call allocations are not timed
    out = decoder.generate(prompts, max_new_tokens=args.max_new_tokens, **options)
    t = decoder.last
    steps = sorted(t.steps) or [0.0]
    print(
        f"batch {len(prompts)}, prompt {len(prompts[0])} tokens, {t.new_tokens} new tokens in {t.seconds:.3f}s: "
        f"{t.tokens_per_second:.1f} tokens/s"
    )
    print(f"time to first token {1e3 * t.first_token:.1f} ms")
    print(
        f"per-token latency: median {1e3 * statistics.median(steps):.2f} ms, "
        f"p90 {1e3 * steps[int(0.9 * (len(steps) - 1))]:.2f} ms over {len(t.steps)} decoding steps"
    )
    for row in out[: args.show]:
        new = row[len(prompts[0]) :]
        print("new tokens:", tokenizer.decode(new) if tokenizer is not None else " ".join(map(str, new)))
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="symfuse", description="compile once with symbolic shapes, run every shape")
    sub = p.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("demo", help="compile a built-in model once and run it at several shapes")
    d.add_argument("--model", default="bert-small")
    d.add_argument("--reps", type=int, default=5, help="timed repetitions per shape (median is shown)")
    d.add_argument("--out", default=os.path.join("symfuse-results", "demo"), help="where the table and plot go")
    d.set_defaults(fn=cmd_demo)
    e = sub.add_parser("explain", help="show the graph, shape classes, fusion and run-time checks of a model")
    e.add_argument("target", nargs="?", help="a built-in model's name or an ONNX file (default: --model)")
    e.add_argument("--model", default="bert-small", help="a built-in model (symfuse models lists them)")
    e.add_argument("--dynamic", action="append", help="for an ONNX file: INPUT:DIM=NAME,... (repeatable)")
    e.add_argument("--no-graph", action="store_true", help="leave out the graph listing")
    e.add_argument("--te", action="store_true", help="also list the tensor-expression program")
    e.add_argument("--precision", default="fp32", help=PRECISION_HELP)
    e.set_defaults(fn=cmd_explain)
    b = sub.add_parser("bench", help="compare symfuse with eager, torch.compile, ONNX Runtime and OpenVINO")
    b.add_argument("--model", default="bert-small")
    b.add_argument(
        "--task",
        choices=("infer", "generate"),
        default="infer",
        help="generate: text generation with decoders (--model gpt2,tinyllama; --seq is the prompt lengths; "
        "engines symfuse, eager, torch-compile, ctranslate2)",
    )
    b.add_argument("--new-tokens", type=int, default=128, help="with --task generate: tokens generated per prompt")
    b.add_argument("--engines", default="all", help="comma-separated engines, or 'all'")
    b.add_argument("--batch", help="batch sizes, e.g. 1,2,4,8")
    b.add_argument("--seq", help="sequence lengths, e.g. 16,33,64,128,200,384")
    b.add_argument("--image", help="image sides for vision models, e.g. 160,224,288")
    b.add_argument("--rounds", type=int, default=2, help="passes over all engines and shapes (order rotates)")
    b.add_argument("--min-reps", type=int, default=5, help="timed runs per shape and round, at least")
    b.add_argument("--budget", type=float, default=0.5, help="seconds of timed runs per shape and round")
    b.add_argument(
        "--profile", action="store_true", help="also time each kind of symfuse step against the physical limits"
    )
    b.add_argument(
        "--device",
        default="cpu",
        help="cuda: symfuse's GPU backend against eager and torch.compile on the GPU (engines eager, inductor, "
        "max-autotune, symfuse; one process, CUDA-synchronised timings)",
    )
    b.add_argument("--precision", default="fp32", help="with --device cuda: fp32, fp16 or bf16 for every engine")
    b.add_argument(
        "--isa",
        default="",
        help="symfuse's ISA (generic, avx2, avx512, neon); its oneDNN and ATen calls are held to it too, "
        "the peers keep the machine's best",
    )
    b.add_argument(
        "--hold-peers",
        action="store_true",
        help="with --isa: hold the peers' libraries to that ISA too, where they have a control for it "
        "(torch's engines; OpenVINO's oneDNN; not onnxruntime)",
    )
    b.add_argument(
        "--from",
        dest="source",
        choices=("torch", "onnx", "both"),
        default="torch",
        help="symfuse captures the PyTorch model (torch), imports its ONNX export (onnx), or both side by side",
    )
    b.add_argument("--out", help="results folder (default symfuse-results/MODEL)")
    b.set_defaults(fn=cmd_bench)
    c = sub.add_parser("compile", help="compile a built-in model or an ONNX file and save it as an artifact folder")
    c.add_argument("target", nargs="?", help="a built-in model's name or an ONNX file (default: --model)")
    c.add_argument("--model", default="bert-small", help="a built-in model (symfuse models lists them)")
    c.add_argument(
        "--dynamic",
        action="append",
        help="for an ONNX file: name or bound its dims, INPUT:DIM=NAME,... (repeatable), e.g. input_ids:0=B,1=S; "
        "by default its dim_params are the symbols",
    )
    c.add_argument("-o", "--out", required=True, help="the artifact folder to write")
    c.add_argument("--precision", default="fp32", help=PRECISION_HELP)
    c.set_defaults(fn=cmd_compile)
    t = sub.add_parser("tune", help="measure the switch points models need on this machine (else modelled)")
    t.add_argument("models", nargs="*", default=["bert-small"], help="built-in models' names or ONNX files")
    t.add_argument("--dynamic", action="append", help="for an ONNX file: INPUT:DIM=NAME,... (repeatable)")
    t.add_argument("--precision", default="fp32", help=PRECISION_HELP)
    t.set_defaults(fn=cmd_tune)
    r = sub.add_parser("run", help="load a saved artifact and run it on given inputs or random ones at given shapes")
    r.add_argument("artifact", help="a folder written by `symfuse compile` or CompiledModule.save")
    r.add_argument("--shape", action="append", help="SYMBOL=VALUE,... (repeatable), e.g. --shape B=1,S=16")
    r.add_argument("--input", action="append", help="NAME=FILE.npy for each input (numpy's format)")
    r.add_argument("--reps", type=int, default=5, help="timed repetitions per shape (median is shown)")
    r.set_defaults(fn=cmd_run)
    v = sub.add_parser("serve", help="serve a saved artifact over HTTP on Ray Serve, with dynamic batching")
    v.add_argument("artifact")
    v.add_argument("--replicas", type=int, default=1)
    v.add_argument("--threads", type=int, default=1, help="CPU threads (and Ray CPUs) per replica")
    v.add_argument("--max-batch-size", type=int, default=8)
    v.add_argument("--batch-wait-ms", type=float, default=5.0, help="how long a batch waits to fill")
    v.add_argument("--tokenizer", help="a local tokenizer folder, for requests that send text")
    v.add_argument("--host", default="127.0.0.1")
    v.add_argument("--port", type=int, default=8000)
    v.add_argument("--address", help="an existing Ray cluster (ray start --head; e.g. auto or HOST:6379)")
    v.set_defaults(fn=cmd_serve)
    k = sub.add_parser("cache", help="where the kernel cache and machine measurements are; clear them")
    k.add_argument("action", choices=("info", "clear"))
    k.add_argument("--all", action="store_true", help="clear: also the detected targets and switch points")
    k.set_defaults(fn=cmd_cache)
    g = sub.add_parser("generate", help="generate text with a built-in decoder or a saved one; report its speed")
    g.add_argument("target", help="a built-in decoder (gpt2, tinyllama, ...) or a folder a Decoder was saved to")
    src = g.add_mutually_exclusive_group()
    src.add_argument("--prompt", help="text (needs a tokenizer saved in the folder)")
    src.add_argument("--prompt-ids", help="token ids, e.g. 464,2068,318")
    src.add_argument("--prompt-len", type=int, default=16, help="a random prompt of this many tokens (default)")
    g.add_argument("--max-new-tokens", type=int, default=32)
    g.add_argument("--batch", type=int, default=1, help="sequences generated together")
    g.add_argument("--sample", action="store_true", help="sample (else greedy)")
    g.add_argument("--temperature", type=float, default=1.0)
    g.add_argument("--top-k", type=int, default=0)
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--seed", type=int)
    g.add_argument("--precision", default="fp32", help=PRECISION_HELP)
    g.add_argument("--save", help="also save the compiled decoder to this folder")
    g.add_argument("--show", type=int, default=1, help="print the new tokens of this many sequences")
    g.set_defaults(fn=cmd_generate)
    m = sub.add_parser("models", help="list the built-in models")
    m.set_defaults(fn=cmd_models)
    args = p.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    log = logging.getLogger("symfuse")  # progress on long work (capture, measuring switch points) to stderr
    if not log.handlers:
        handler = _Stderr()
        handler.setFormatter(logging.Formatter("%(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
    from symfuse.errors import BuildError

    try:
        return args.fn(args)
    except (
        ValueError,
        NotImplementedError,
        BuildError,
        FileNotFoundError,
        TypeError,
    ) as err:  # ArtifactError is a ValueError
        print(f"symfuse: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
