"""The benchmark harness's logic, without timing anything: fake workers answer with
scripted times, so sweep parsing, missing and failing engines, rotation, medians and
ratios are checked exactly."""

import json
import os

import pytest
import torch

from symfuse.bench import harness, report
from symfuse.bench.harness import Config, EngineResult, key, parse_list, parse_sweep, summarize
from symfuse.cli import main


def test_parse_list():
    assert parse_list("16,33, 64", "seq") == [16, 33, 64]
    for bad in ["", "a,b", "0,16", "-1"]:
        with pytest.raises(ValueError, match="--seq takes comma-separated positive integers"):
            parse_list(bad, "seq")


def test_parse_sweep_defaults_and_products():
    default = [dict(B=1, S=s) for s in (16, 33, 64, 128, 200, 384)]
    assert parse_sweep("bert-small", {"batch": None, "seq": None}) == default
    assert parse_sweep("bert-base", {"batch": "1,2", "seq": "8"}) == [dict(B=1, S=8), dict(B=2, S=8)]
    assert parse_sweep("resnet", {"image": "160,224"}) == [dict(B=1, H=160), dict(B=1, H=224)]
    assert parse_sweep("vit-base", {}) == [dict(B=b) for b in (1, 2, 4, 8)]
    with pytest.raises(ValueError, match="--image does not apply to bert-small"):
        parse_sweep("bert-small", {"image": "224"})
    with pytest.raises(ValueError, match="no sweep axes known for model 'nope'"):
        parse_sweep("nope", {})


def test_every_builtin_model_has_sweep_axes():
    from symfuse.models import BUILTIN

    assert set(harness.AXES) == set(BUILTIN)
    assert parse_sweep("minilm", {"seq": "16,128"}) == [dict(B=1, S=16), dict(B=1, S=128)]


def test_summarize_medians_and_ratio_to_best_peer():
    b = [dict(B=1, S=16)]
    k = key(b[0])
    res = {
        "symfuse": EngineResult("symfuse", "ok", times={k: [5.0, 1.0, 3.0]}, errors={k: 1e-7}),
        "eager": EngineResult("eager", "ok", times={k: [8.0, 6.0, 7.0, 9.0]}),
        "onnxruntime": EngineResult("onnxruntime", "ok", times={k: [4.0, 4.0, 2.0]}),
        "openvino": EngineResult("openvino", "missing", detail="not installed: openvino"),
    }
    rows = {r["engine"]: r for r in summarize(res, b)}
    assert rows["symfuse"]["median_ms"] == 3.0 and rows["symfuse"]["min_ms"] == 1.0
    assert rows["eager"]["median_ms"] == 7.5  # even count: mean of the middle two
    assert rows["onnxruntime"]["ratio_to_best_peer"] == 1.0  # the best peer
    assert all(r["best_peer_ms"] == 4.0 for r in rows.values())
    assert rows["symfuse"]["ratio_to_best_peer"] == pytest.approx(3.0 / 4.0)  # symfuse is not its own peer
    assert rows["eager"]["ratio_to_best_peer"] == pytest.approx(7.5 / 4.0)
    assert rows["openvino"]["median_ms"] is None and rows["openvino"]["failure"] == "not installed: openvino"


class FakeWorker:
    def __init__(self, name, script, log):
        self.name, self.script, self.log, self.closed = name, script, log, False

    def request(self, msg):
        self.log.append((self.name, msg["cmd"], msg.get("binding")))
        if msg["cmd"] == "stats":
            return {"recompiles": 0, "peak_rss_mb": 100.0}
        if msg["cmd"] == "work":  # 1 GFLOP per 16 tokens; 64 MiB of weights
            return {"work": {"flops": 1e9 * msg["binding"]["S"] / 16, "weight_bytes": 64 * 2**20}}
        return self.script(msg["binding"])

    def close(self):
        self.closed = True


def fake_launcher(log, workers, envs=None):
    def launch(engine, model, log_path, env):
        if envs is not None:
            envs[engine] = env
        if engine == "openvino":
            return None, {"status": "missing", "detail": "not installed: openvino (pip install .[bench])"}
        if engine == "onnxruntime":
            raise RuntimeError("export crashed")
        if engine == "torch-compile":
            w = FakeWorker(engine, None, log)
            workers.append(w)
            return w, {"status": "failed", "detail": "InductorError: no compiler"}
        ms = {"symfuse": 2.0, "eager": 4.0}[engine]

        def script(binding):
            if engine == "eager" and binding["S"] == 33:
                return {"error": "RuntimeError: out of memory"}
            return {"times_ms": [ms * binding["S"] / 16] * 3, "err": 1e-6}

        w = FakeWorker(engine, script, log)
        workers.append(w)
        return w, {"status": "ready", "prepare_s": 1.5}

    return launch


def test_run_reports_missing_and_failing_engines_and_rotates(tmp_path):
    log, workers = [], []
    cfg = Config(
        "bert-small", ["symfuse", "eager", "onnxruntime", "openvino", "torch-compile"],
        [dict(B=1, S=16), dict(B=1, S=33)], rounds=2, out_dir=str(tmp_path),
    )  # fmt: skip
    result = harness.run(cfg, launch=fake_launcher(log, workers))
    eng = result["engines"]
    assert eng["openvino"]["status"] == "missing" and "pip install .[bench]" in eng["openvino"]["detail"]
    assert eng["onnxruntime"]["status"] == "failed" and "export crashed" in eng["onnxruntime"]["detail"]
    assert eng["torch-compile"]["status"] == "failed"
    assert eng["symfuse"]["status"] == "ok" and eng["symfuse"]["prepare_s"] == 1.5 and eng["symfuse"]["recompiles"] == 0
    assert all(w.closed for w in workers)  # failed workers too
    runs = [(n, b["S"]) for n, cmd, b in log if cmd == "run"]
    # round 1: symfuse first at each shape; round 2: the order rotates
    assert runs == [("symfuse", 16), ("eager", 16), ("symfuse", 33), ("eager", 33)] + [
        ("eager", 16), ("symfuse", 16), ("eager", 33), ("symfuse", 33),
    ]  # fmt: skip
    rows = {(r["engine"], r["binding"]["S"]): r for r in result["rows"]}
    assert rows[("symfuse", 16)]["reps"] == 6 and rows[("symfuse", 16)]["median_ms"] == 2.0
    assert rows[("eager", 33)]["failure"] == "RuntimeError: out of memory"
    assert rows[("symfuse", 33)]["ratio_to_best_peer"] is None  # no peer ran at S=33
    assert rows[("symfuse", 16)]["ratio_to_best_peer"] == 0.5

    result["physics"] = {"copy_gbps": 40.0, "sgemm_gflops": 300.0, "sgemm_n": 2048}
    text = report.terminal(result)
    assert "missing: not installed: openvino" in text and "failed: RuntimeError: export crashed" in text
    assert "2.00 (0.50x)" in text and "copy bandwidth 40.0 GB/s" in text
    paths = report.write(result, str(tmp_path / "out"))
    assert json.load(open(paths["json"]))["engines"]["symfuse"]["status"] == "ok"
    assert "| B=1, S=16 | 2.00 (0.50x) | 4.00 (1.00x) |" in open(paths["markdown"]).read()
    assert os.path.getsize(paths["plot"]) > 1000


def test_the_floor_is_the_flops_at_the_fma_peak_or_the_weights_at_the_read_bandwidth(tmp_path):
    """Each shape's floor: its FLOPs at the FMA peak, or reading weights larger than the L3 once,
    whichever is longer; over the best peer's median, the least ratio the machine allows. Only
    symfuse engines are asked what a call does; without the FMA peak there is no floor table."""
    log = []
    cfg = Config("bert-small", ["symfuse", "eager"], [dict(B=1, S=16), dict(B=1, S=64)], 1, out_dir=str(tmp_path))
    result = harness.run(cfg, launch=fake_launcher(log, []))
    assert [(n, b["S"]) for n, cmd, b in log if cmd == "work"] == [("symfuse", 16), ("symfuse", 64)]
    result["physics"] = {"copy_gbps": 40.0, "sgemm_gflops": 300.0, "sgemm_n": 2048}
    assert report.floor_table(result) is None and "the floor" not in report.terminal(result)
    result["physics"].update(fma_gflops=500.0, read_gbps=32.0, l3_bytes=32 * 2**20)
    header, rows = report.floor_table(result)
    by = {r[0]: dict(zip(header, r)) for r in rows}
    # 16 tokens: 1 GFLOP at 500 GFLOP/s is 2 ms, 64 MiB at 32 GB/s 2.10 ms: the weights decide
    assert by["B=1, S=16"]["floor ms"] == "2.10" and by["B=1, S=16"]["best peer ms"] == "4.00"
    assert by["B=1, S=16"]["floor / best peer"] == "0.52x"
    # 64 tokens: 4 GFLOP, 8 ms at the FMA peak; the peer takes 16 ms; symfuse 8 ms at 500 GFLOP/s
    assert by["B=1, S=64"]["floor ms"] == "8.00" and by["B=1, S=64"]["floor / best peer"] == "0.50x"
    assert by["B=1, S=64"]["its rate"] == "500 GFLOP/s (100% of FMA peak)"
    assert by["B=1, S=64"]["best peer's rate"] == "250 GFLOP/s (50% of FMA peak)"
    result["physics"]["l3_bytes"] = 128 * 2**20  # weights in cache: the FLOPs alone
    assert dict(zip(header, report.floor_table(result)[1][0]))["floor ms"] == "2.00"
    assert "FMA peak 500 GFLOP/s" in report.terminal(result) and "| B=1, S=64 | 4.00 | 64.0 | 8.00 |" in (
        report.markdown(result)
    )


def test_profile_covers_each_symfuse_engine(tmp_path):
    """`--profile` profiles every symfuse engine (each precision its own table), no peer."""
    log = []

    def launch(engine, model, log_path, env):
        def script(binding):
            step = {"op": f"linear ({engine})", "calls": 2, "seconds": 1e-3, "bytes": 0, "flops": 3e8}
            small = {"op": "C++ loop kernels", "calls": 2, "seconds": 1e-5, "bytes": 2**18, "flops": 0}
            big = {"op": "C++ reduction kernels", "calls": 1, "seconds": 1e-3, "bytes": 4e7, "flops": 0}
            return {"times_ms": [1.0], "err": 0.0, "profile": [step, small, big]}

        return FakeWorker(engine, script, log), {"status": "ready"}

    engines = ["symfuse", "symfuse-bf16", "eager"]
    cfg = Config("bert-small", engines, [dict(B=1, S=16)], 1, out_dir=str(tmp_path), profile=True)
    result = harness.run(cfg, launch=launch)
    assert [n for n, cmd, _ in log if cmd == "profile"] == ["symfuse", "symfuse-bf16"]
    result["physics"] = {"copy_gbps": 40.0, "sgemm_gflops": 300.0, "sgemm_n": 2048}
    text = report.terminal(result)
    for n in ("symfuse", "symfuse-bf16"):
        assert f"profile of one {n} call at" in text and f"linear ({n})" in text
    assert "300.0" in text and "100% of SGEMM" in text  # 3e8 FLOP in 1 ms
    # 128 KiB a call is over in microseconds: said so; 40 MB in 1 ms is a rate to compare
    assert "66% of copy bandwidth (128 KiB a call: fixed-cost bound)" in text
    assert "100% of copy bandwidth" in text and "100% of copy bandwidth (" not in text
    assert "Profile of one symfuse-bf16 call" in report.markdown(result)
    # with the FMA peak measured, a GEMM's rate is put against it, the machine's limit
    result["physics"]["fma_gflops"] = 400.0
    assert "75% of the fp32 FMA peak" in report.terminal(result) and "of SGEMM" not in report.terminal(result)


def test_isa_holds_symfuse_and_its_libraries_to_it_and_leaves_the_peers(tmp_path):
    envs = {}
    cfg = Config("bert-small", ["symfuse", "eager"], [dict(B=1, S=16)], rounds=1, out_dir=str(tmp_path), isa="avx2")
    harness.run(cfg, launch=fake_launcher([], [], envs))
    assert envs["symfuse"]["SYMFUSE_ISA"] == "avx2" and envs["symfuse"]["ONEDNN_MAX_CPU_ISA"] == "AVX2"
    assert envs["eager"] == {}
    with pytest.raises(ValueError, match="--isa 'sse9'"):
        harness.engine_env("symfuse", "sse9")


def test_hold_peers_holds_the_peers_libraries_but_builds_only_symfuse_for_the_isa(tmp_path):
    envs = {}
    b = [dict(B=1, S=16)]
    cfg = Config("bert-small", ["symfuse", "eager"], b, 1, out_dir=str(tmp_path), isa="avx2", hold_peers=True)
    harness.run(cfg, launch=fake_launcher([], [], envs))
    assert envs["eager"]["ATEN_CPU_CAPABILITY"] == "avx2" and "SYMFUSE_ISA" not in envs["eager"]
    assert envs["symfuse"]["SYMFUSE_ISA"] == "avx2"


def test_a_worker_that_dies_is_a_failure_not_a_crash(tmp_path):
    w, first = harness.launch_process("no-such-engine", "bert-small", str(tmp_path / "w.log"))
    w.close()
    assert first["status"] == "failed" and "worker exited with code 1" in first["detail"]
    assert "KeyError" in open(tmp_path / "w.log").read()


def test_bench_cli_rejects_unknown_engines(capsys):
    assert main(["bench", "--engines", "symfuse,tvm"]) == 2
    assert "unknown engine(s) tvm" in capsys.readouterr().err


def test_markdown_shows_minimum_and_repetitions():
    b = [dict(B=1, S=16)]
    res = {"symfuse": EngineResult("symfuse", "ok", times={key(b[0]): [3.0, 1.5, 2.0]})}
    result = {"config": {"model": "m", "rounds": 1}, "engines": {n: r.__dict__ for n, r in res.items()},
              "rows": summarize(res, b), "finished": "now"}  # fmt: skip
    md = report.markdown(result)
    assert "| B=1, S=16 | 2.00 |" in md and "| B=1, S=16 | 1.50 (n=3) |" in md


def test_profile_of_the_compiled_program_covers_every_step(tmp_path):
    """Not a timing test: the profile's rows account for every step once, with FLOPs where a
    step multiplies and bytes everywhere."""
    import symfuse
    from symfuse.bench.worker import profile_symfuse, work_symfuse
    from symfuse.models import load

    case = load("bert-small")
    c = symfuse.compile(case.model, case.inputs(**case.example), case.dynamic, cache_dir=str(tmp_path))
    rows = {r["op"]: r for r in profile_symfuse(c, case.inputs(B=1, S=8))}
    assert sum(r["calls"] for r in rows.values()) == len(c.native.schedule.steps)
    assert rows["linear (row kernel)"]["calls"] == 4 * 4 + 1  # 4 per layer and the pooler
    # what a call does, counted as the profile counts it: every linear's weights read once
    work = work_symfuse(c, case.inputs(B=1, S=8))
    assert work["flops"] == sum(r["flops"] for r in rows.values()) > 0
    linears = [m for m in case.model.modules() if isinstance(m, torch.nn.Linear)]
    assert work["weight_bytes"] == 4 * sum(m.weight.numel() for m in linears)
    assert rows["attention (merged kernel)"]["calls"] == 4
    assert rows["linear (row kernel)"]["flops"] > 0 and rows["C++ reduction kernels"]["bytes"] > 0
    assert not [op for op in rows if op.startswith("torch:")], "every step of BERT is generated code or a GEMM"
