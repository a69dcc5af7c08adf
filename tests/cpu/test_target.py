"""The target: detection from a (faked) probe picks flags and tiles; overrides the CPU
lacks, unknown ISAs and missing or broken compilers are clear errors; the kernel cache
keys on the target; switch points are measured once per machine and cached, unless other
processes took the cores while they were measured."""

import json
import logging
import os
import stat
import subprocess
import sys
import time
from dataclasses import replace

import pytest
import torch

import symfuse
from symfuse.codegen.cpu import calibrate
from symfuse.codegen.cpu import target as tg
from symfuse.codegen.cpu.build import build
from symfuse.codegen.cpu.calibrate import BUSY, Calibration, OtherProcesses, _switch_point
from symfuse.codegen.cpu.gemm import bf16_multiplies, chunk_choices, has_bf16_rows, tile_for
from symfuse.errors import BuildError
from symfuse.options import THRESHOLD_KINDS, Options, parse_thresholds
from symfuse.runtime.switches import KEYS, ROWS, STREAMED, weight_traffic

AVX2 = ("avx", "avx2", "fma", "bmi1", "bmi2", "f16c", "lzcnt", "movbe", "os_avx")
AVX512 = AVX2 + ("avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl", "os_avx512")


def fake_cpu(monkeypatch, arch: str, features, runs=lambda flags: True):
    """Pretend to be a CPU of `arch` with `features`; `runs(flags)` says whether a program
    built with those flags builds and runs."""
    monkeypatch.setattr(tg, "machine_arch", lambda: arch)

    def run(cxx, source, flags):
        if source is tg._FEATURES_SOURCE:
            return True, " ".join(f"{f}=1" for f in features)
        return (True, "3\n") if runs(flags) else (False, "exit status -4 (signal 4)")

    monkeypatch.setattr(tg, "run_program", run)


def test_avx2_only_cpu_gets_x86_64_v3_and_a_tile_for_16_registers(monkeypatch):
    fake_cpu(monkeypatch, "x86_64", AVX2)
    t = tg.detect("g++")
    assert (t.isa, t.flags, t.lanes, t.registers, t.chosen_by) == ("avx2", ("-march=x86-64-v3",), 8, 16, "detected")
    tile = tile_for(t)
    assert (tile.rows, tile.vectors, tile.panel) == (6, 2, 16)  # 64 bytes a k step
    assert tile.rows * tile.vectors + tile.vectors + 1 <= t.registers
    assert "-march=native" not in t.all_flags


def test_avx512_cpu_gets_x86_64_v4_with_its_extensions(monkeypatch):
    fake_cpu(monkeypatch, "x86_64", AVX512 + ("avx512_bf16", "avx512_vnni"))
    t = tg.detect("g++")
    assert t.isa == "avx512" and t.extensions == ("avx512_bf16", "avx512_vnni")
    assert t.flags[0] == "-march=x86-64-v4" and "-mavx512bf16" in t.flags and "-mavx512vnni" in t.flags
    tile = tile_for(t)
    assert (tile.rows, tile.vectors, tile.panel) == (6, 4, 64)
    assert "avx512 + avx512_bf16, avx512_vnni" in t.describe()


def test_a_compiler_without_x86_64_v4_gets_the_explicit_flags(monkeypatch):
    fake_cpu(monkeypatch, "x86_64", AVX512, runs=lambda flags: "-march=x86-64-v4" not in flags)
    t = tg.detect("g++")
    assert t.isa == "avx512" and "-mavx512f" in t.flags and "-march=x86-64-v4" not in t.flags


def test_avx_state_not_enabled_by_the_os_means_generic(monkeypatch):
    fake_cpu(monkeypatch, "x86_64", tuple(f for f in AVX512 if not f.startswith("os_")))
    t = tg.detect("g++")
    assert (t.isa, t.flags, t.lanes) == ("generic", ("-march=x86-64", "-mtune=generic"), 4)


def test_an_isa_whose_probe_dies_falls_back_to_the_next(monkeypatch):
    fake_cpu(monkeypatch, "x86_64", AVX512, runs=lambda flags: not any("512" in f or "v4" in f for f in flags))
    assert tg.detect("g++").isa == "avx2"


def test_aarch64_gets_neon_and_reports_sve(monkeypatch):
    fake_cpu(monkeypatch, "aarch64", ("asimd", "sve"))
    t = tg.detect("g++")
    assert (t.isa, t.flags, t.lanes, t.registers, t.extensions) == ("neon", ("-march=armv8-a",), 4, 32, ("sve",))
    assert tile_for(t).panel == 16
    assert not t.libmvec  # glibc's vector math is x86-64 only: no `declare simd` for it


def test_other_architectures_get_generic_code_without_flags(monkeypatch):
    fake_cpu(monkeypatch, "riscv64", ())
    t = tg.detect("g++")
    assert (t.isa, t.flags) == ("generic", ())


def test_asking_for_an_isa_the_cpu_lacks_is_a_clear_error(monkeypatch):
    fake_cpu(monkeypatch, "x86_64", AVX2)
    with pytest.raises(ValueError, match=r"SYMFUSE_ISA=avx512 .*lacks avx512f.*it can run avx2, generic"):
        tg.detect("g++", "avx512")
    with pytest.raises(ValueError, match=r"SYMFUSE_ISA=neon .*is x86_64, not aarch64"):
        tg.detect("g++", "neon")
    with pytest.raises(ValueError, match=r"'sse9' is not an ISA symfuse knows; choose one of generic, avx2"):
        tg.detect("g++", "sse9")
    assert tg.detect("g++", "generic").chosen_by == "SYMFUSE_ISA=generic"


def test_an_override_the_compiler_cannot_run_is_a_clear_error(monkeypatch):
    fake_cpu(monkeypatch, "x86_64", AVX2, runs=lambda flags: not any("avx2" in f or "v3" in f for f in flags))
    with pytest.raises(ValueError, match="cannot build or run avx2 code here"):
        tg.detect("g++", "avx2")


def test_the_real_override_on_this_machine(monkeypatch):
    """On this CPU: the detected ISA is the best one it runs; one it cannot run is refused."""
    feats = tg.read_features("g++")
    arch = tg.machine_arch()
    runnable = [s.name for s in tg.ISAS.values() if tg.has_isa(s, arch, feats)]
    best = tg.detect("g++")
    assert best.isa == max(runnable, key=lambda n: tg.ISAS[n].rank)
    lacking = [n for n in tg.ISAS if n not in runnable]
    for name in lacking:
        with pytest.raises(ValueError, match=f"SYMFUSE_ISA={name} asks for code this machine cannot run"):
            tg.detect("g++", name)
    monkeypatch.setenv("SYMFUSE_ISA", "Generic ")
    assert Options.from_env().isa == "generic"


def test_the_detected_target_is_cached_per_machine(tmp_path, monkeypatch):
    first = tg.detect("g++", "", str(tmp_path))
    assert len(list(tmp_path.glob("target-*.json"))) == 1

    def no_probe(*a):
        raise AssertionError("probed again")

    monkeypatch.setattr(tg, "_probe", no_probe)
    assert tg.detect("g++", "", str(tmp_path)) == first


def test_the_kernel_cache_keys_on_the_target(tmp_path):
    src = 'extern "C" int sf_answer() { return 42; }\n'
    opts = Options(cache_dir=str(tmp_path))
    paths = {build(src, tg.target_for(isa), opts)[0] for isa in ("generic", "avx2", "avx512")}
    assert len(paths) == 3
    assert tg.target_for("avx2").key != tg.target_for("generic").key


def test_no_compiler_is_a_clear_error_with_the_way_out():
    with pytest.raises(BuildError, match=r"'/no/such/g\+\+' \(CXX; default g\+\+\) cannot be run.*backend='reference'"):
        tg.detect("/no/such/g++")
    model = torch.nn.Linear(4, 3)
    with pytest.raises(BuildError, match="backend='reference'"):
        symfuse.compile(model, (torch.randn(2, 4),), cxx="/no/such/g++")
    ref = symfuse.compile(model, (torch.randn(2, 4),), cxx="/no/such/g++", backend="reference")
    x = torch.randn(5, 4)
    assert torch.allclose(ref(x), model(x))


def test_a_broken_compiler_names_the_command_and_its_message(tmp_path):
    cxx = tmp_path / "broken-g++"
    script = '[ "$1" = --version ] && echo "broken-g++ 1.0" && exit 0\necho "internal error: no" >&2\nexit 1\n'
    cxx.write_text("#!/bin/sh\n" + script)
    cxx.chmod(cxx.stat().st_mode | stat.S_IEXEC)
    with pytest.raises(BuildError, match="could not build and run a probe program: internal error: no"):
        tg.detect(str(cxx))
    target = tg.target_for("generic", cxx=str(cxx))
    with pytest.raises(BuildError, match=r"(?s)failed to compile with .*broken-g\+\+.*-shared.*internal error: no"):
        build("int x;\n", target, Options(cache_dir=str(tmp_path / "cache")))


# -- switch points --------------------------------------------------------------------------


def test_switch_point_is_the_last_size_the_first_version_wins():
    size = {}
    setup = lambda n: size.update(n=n)
    first = lambda: size["n"] * 1.0
    second = lambda: 10.0 + size["n"] * 0.5  # overtakes after 20
    assert _switch_point(ROWS, setup, first, second)[0] == 16
    assert _switch_point(ROWS, setup, lambda: 1.0, lambda: 0.5)[0] == 0
    assert _switch_point(ROWS, setup, lambda: 0.5, lambda: 1.0)[0] == ROWS[-1]
    # one loss, then wins again: a blip, scanning goes on until two losses in a row
    table = {1: (1, 2), 2: (2, 1), 4: (1, 2), 8: (1, 2), 12: (2, 1), 16: (2, 1), 24: (1, 2)}
    value, timings = _switch_point(ROWS, setup, lambda: table[size["n"]][0], lambda: table[size["n"]][1])
    assert value == 8 and list(timings) == ["1", "2", "4", "8", "12", "16"]


@pytest.fixture
def quiet(monkeypatch):
    """A machine with nothing else running: what the tests of the cache file assume."""
    monkeypatch.setattr(OtherProcesses, "share", lambda self: 0.0)


def test_switch_points_are_measured_once_and_cached(tmp_path, monkeypatch, quiet):
    target = tg.detect("g++")
    opts = Options(switch_points="measure", machine_dir=str(tmp_path))
    calls = []

    def measure(self, kind, shape, traffic):
        calls.append((kind, shape, traffic))
        return 32, {"32": [1.0, 2.0]}

    monkeypatch.setattr(Calibration, "_measure", measure)
    th = Calibration(target, opts).get("linear_rows", (768, 3072), STREAMED)
    assert th.value == 32 and "measured on this machine" in th.source and th.source.endswith("weights streamed")
    assert Calibration(target, opts).get("linear_rows", (768, 3072), STREAMED).value == 32
    assert calls == [("linear_rows", (768, 3072), STREAMED)]
    assert len(os.listdir(tmp_path)) == 1 and target.key in os.listdir(tmp_path)[0]
    manual = Calibration(
        target, Options(switch_points="measure", machine_dir=str(tmp_path), thresholds=(("linear_rows", 5),))
    )
    th = manual.get("linear_rows", (768, 3072))
    assert th.value == 5 and "set by hand" in th.source and len(calls) == 1
    assert "symfuse's row kernel up to 5 rows, oneDNN above (set by hand" in th.describe()


def test_by_default_switch_points_come_from_the_model_of_the_cpu_and_measured_ones_win(tmp_path, monkeypatch, quiet):
    """A first compile measures nothing: every kind gets the model's value at once, and no
    file is written; a value measured on this machine (`symfuse tune`) is used from then on."""
    from symfuse.codegen.cpu.calibrate import MODELLED, modelled

    target = tg.detect("g++")

    def measure(self, kind, shape, traffic):
        raise AssertionError(f"measured {kind} under switch_points='model'")

    monkeypatch.setattr(Calibration, "_measure", measure)
    cal = Calibration(target, Options(machine_dir=str(tmp_path)))
    for kind in THRESHOLD_KINDS:
        shape = (768, 3072) if kind.startswith("linear") else (64,) if kind.startswith("att") else ()
        th = cal.get(kind, shape)
        assert th.source == MODELLED and th.value == modelled(kind, shape, target), kind
        assert th.value > 0 or kind == "bf16_multiply", kind  # 0: vdpbf16ps
    assert cal.get("attention_keys", (64,)).value == KEYS[-1]
    assert os.listdir(tmp_path) == []
    monkeypatch.setattr(Calibration, "_measure", lambda self, kind, shape, traffic: (24, {}))
    Calibration(target, Options(machine_dir=str(tmp_path), switch_points="measure")).get("linear_rows", (768, 3072))
    th = Calibration(target, Options(machine_dir=str(tmp_path))).get("linear_rows", (768, 3072))
    assert th.value == 24 and "measured on this machine" in th.source
    with pytest.raises(ValueError, match="switch_points must be 'model' or 'measure'"):
        Options.from_env(switch_points="guess")


def test_linear_switch_points_are_measured_after_the_models_weights_pass_through_the_caches(
    tmp_path, monkeypatch, quiet
):
    """A linear layer's switch point is measured after as many bytes as the model's linear
    weights (rounded up to a power of two MiB, at least twice the L2 of every core) have passed
    through the caches, streamed beyond the L3; each amount is measured and kept apart, and
    `explain`'s words say which; attention's switch points do not depend on it."""
    target = replace(tg.detect("g++"), l2=1 << 20, l3=32 << 20, cores=2)
    mib = 1 << 20
    assert weight_traffic(100_000, target) == 4 * mib  # the least: twice the L2 of both cores
    assert weight_traffic(4 * mib + 1, target) == 8 * mib
    assert weight_traffic(12 * mib + 5, target) == 16 * mib
    assert weight_traffic(32 * mib, target) == 32 * mib and weight_traffic(32 * mib + 1, target) == STREAMED
    calls = []

    def measure(self, kind, shape, traffic):
        calls.append((kind, traffic))
        return {4 * mib: 8, 16 * mib: 64, STREAMED: 16}.get(traffic, 0), {}

    monkeypatch.setattr(Calibration, "_measure", measure)
    cal = Calibration(target, Options(switch_points="measure", machine_dir=str(tmp_path)))
    seen = {t: cal.get("linear_rows", (256, 1024), t) for t in (4 * mib, 16 * mib, STREAMED)}
    assert [th.value for th in seen.values()] == [8, 64, 16]
    assert not seen[4 * mib].source.endswith("MiB") and seen[16 * mib].source.endswith("after 16 MiB of weights")
    keys = json.loads((tmp_path / os.listdir(tmp_path)[0]).read_text())
    assert {"linear_rows 256x1024", "linear_rows 256x1024 through 16 MiB", "linear_rows 256x1024 streamed"} <= set(keys)
    again = Calibration(target, Options(switch_points="measure", machine_dir=str(tmp_path)))
    assert again.get("linear_rows", (256, 1024), 16 * mib).value == 64 and len(calls) == 3  # read, not measured
    assert "MiB" not in again.get("attention_keys", (64,), 16 * mib).source


def test_linear_switch_points_time_the_row_kernel_a_model_runs(tmp_path, monkeypatch, quiet):
    """The row kernel timed against oneDNN is built with the chunk a model's library is built
    with (measured once per machine, or set by hand), not the default chunk of a library
    without linear layers."""
    target = tg.detect("g++")
    built = []
    real = calibrate.row_kernel

    def spy(target, opts, bf16=False, multiply=0, split=False, chunk=0):
        built.append((split, chunk))
        return real(target, opts, bf16, multiply, split, chunk)

    monkeypatch.setattr(calibrate, "row_kernel", spy)
    chunk = chunk_choices(target)[-1]
    cal = Calibration(
        target, Options(switch_points="measure", machine_dir=str(tmp_path), thresholds=(("row_chunk", chunk),))
    )
    setup, panels, rows, library, refresh = cal._linear(40, 24, 0, split=2)
    assert sorted(built) == [(False, chunk), (True, chunk)]
    setup(7)
    refresh()
    assert panels() > 0 and rows() > 0 and library() > 0  # each runs, timed
    measured = Calibration(target, Options(switch_points="measure", machine_dir=str(tmp_path)))
    monkeypatch.setattr(Calibration, "_chunk", lambda self: (chunk_choices(target)[0], {}))
    built.clear()
    measured._linear(40, 24, 0)
    assert sorted(built) == [(False, chunk_choices(target)[0]), (True, chunk_choices(target)[0])]


def test_the_row_kernels_chunk_by_hand_builds_it_and_keys_the_switch_points_measured_with_it(
    tmp_path, monkeypatch, quiet
):
    """`row_chunk` set by hand is the chunk the program's row kernel is built with, `explain`
    says so, and the linear switch points measured with it are kept apart from those measured
    with the chunk the machine chose; a chunk of no steps is refused. A program without the
    row kernel does not measure the chunk."""
    target = tg.detect("g++")
    calls = []

    def measure(self, kind, shape, traffic):
        calls.append(kind)
        return {"row_chunk": chunk_choices(target)[0]}.get(kind, 64), {}

    monkeypatch.setattr(Calibration, "_measure", measure)
    g = torch.nn.Linear(40, 24)
    common = dict(cache_dir=str(tmp_path / "k"), machine_dir=str(tmp_path / "m"), switch_points="measure")
    plain = symfuse.compile(torch.nn.Softmax(-1), (torch.randn(3, 40),), {"input": {0: "M"}}, **common)
    assert calls == [] and "walks a weight panel" not in plain.explain(with_graph=False)
    c = symfuse.compile(g, (torch.randn(3, 40),), {"input": {0: "M"}}, thresholds={"row_chunk": 24}, **common)
    assert "#define SF_KC 24" in c.native.generated.source and c.native.tile.chunk == 24
    assert "walks a weight panel 24 steps of K at a time (set by hand" in c.explain(with_graph=False)
    linear = sorted(calls)
    assert linear and all(k.startswith("linear_") for k in linear)
    c = symfuse.compile(g, (torch.randn(3, 40),), {"input": {0: "M"}}, **common)
    assert calls[len(linear)] == "row_chunk" and sorted(calls[len(linear) + 1 :]) == linear  # measured again
    assert f"#define SF_KC {chunk_choices(target)[0]}" in c.native.generated.source
    for x in (torch.randn(1, 40), torch.randn(37, 40)):
        assert torch.allclose(c(x), g(x), rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="row_chunk=0: a chunk takes at least one step of K"):
        symfuse.compile(g, (torch.randn(3, 40),), {"input": {0: "M"}}, thresholds={"row_chunk": 0}, **common)


def test_a_band_where_the_library_wins_is_measured_above_the_row_kernels_switch_point(tmp_path, monkeypatch, quiet):
    """Where oneDNN wins only middle sizes, `linear_library` says where the row kernel wins
    again; where oneDNN wins to the largest size, or the row kernel's rows are set by hand,
    there is no band."""
    target = tg.detect("g++")
    size = {}
    wins = {"band": lambda m: m <= 32 or m >= 192, "above": lambda m: m <= 32}  # where the row kernel wins

    def linear(self, k, n, traffic, bf16=False, multiply=None, split=1 << 30):
        own_wins = wins["band" if n == 96 else "above"]
        setup = lambda m: size.update(m=m)
        own = lambda: 1.0 if own_wins(size["m"]) else 2.0
        library = lambda: 3.0 - own()
        return setup, own, own, library, lambda: None

    monkeypatch.setattr(Calibration, "_linear", linear)
    cal = Calibration(
        target, Options(switch_points="measure", machine_dir=str(tmp_path), thresholds=(("linear_split", 6),))
    )
    assert cal.get("linear_rows", (64, 96)).value == 32
    band = cal.get("linear_library", (64, 96))
    assert (
        band.value == 128 and f"oneDNN up to 128 rows, the row kernel again above up to {ROWS[-1]}" in band.describe()
    )
    assert sorted(
        map(int, json.loads((tmp_path / os.listdir(tmp_path)[0]).read_text())["linear_library 64x96 split 6"]["ms"])
    ) == [48, 64, 96, 128, 192, 256]
    assert cal.get("linear_library", (64, 80)).value == ROWS[-1]
    assert "oneDNN at every size" in cal.get("linear_library", (64, 80)).describe()
    manual = Calibration(
        target, Options(switch_points="measure", machine_dir=str(tmp_path), thresholds=(("linear_rows", 5),))
    )
    th = manual.get("linear_library", (64, 96))
    assert th.value == ROWS[-1] and th.source == "linear_rows set by hand (thresholds / SYMFUSE_THRESHOLDS)"


def test_switch_points_measured_on_a_busy_machine_are_used_but_not_kept(tmp_path, monkeypatch, caplog):
    target = tg.detect("g++")
    opts = Options(switch_points="measure", machine_dir=str(tmp_path))
    calls = []

    def measure(self, kind, shape, traffic):
        calls.append(kind)
        return 0, {"16": [5.0, 1.0]}

    monkeypatch.setattr(Calibration, "_measure", measure)
    monkeypatch.setattr(OtherProcesses, "share", lambda self: 0.63)
    with caplog.at_level(logging.WARNING, logger="symfuse"):
        th = Calibration(target, opts).get("attention_keys_library", (64,))
    assert th.value == 0 and "while other processes took 63% of its cores: not kept" in th.source
    assert "took 63% of this process's cores while the attention_keys_library 64 switch point" in caplog.text
    assert not os.listdir(tmp_path)  # nothing written
    # the same process does not measure it again; a quiet one measures and keeps it
    again = Calibration(target, opts).get("attention_keys_library", (64,))
    assert again.value == 0 and calls == ["attention_keys_library"]
    monkeypatch.setattr(calibrate, "_UNKEPT", {})
    monkeypatch.setattr(OtherProcesses, "share", lambda self: BUSY / 2)
    assert "not kept" not in Calibration(target, opts).get("attention_keys_library", (64,)).source
    assert len(calls) == 2 and len(os.listdir(tmp_path)) == 1


def _spin(seconds: float) -> subprocess.Popen:
    code = f"import time\nt = time.perf_counter()\nwhile time.perf_counter() - t < {seconds}: pass"
    return subprocess.Popen([sys.executable, "-c", code])


def test_other_processes_share_of_the_cores():
    if OtherProcesses().start is None:
        pytest.skip("no /proc/stat on this system: the share is unknown and every measurement is kept")
    cores = len(os.sched_getaffinity(0))
    watch = OtherProcesses()
    spinners = [_spin(1.0) for _ in range(cores)]  # one busy process a core, not waited for
    time.sleep(1.0)
    assert watch.share() > 0.5
    for p in spinners:
        p.wait()
    # children this process has waited for (g++ while measuring) are its own time
    watch = OtherProcesses()
    for p in [_spin(0.5) for _ in range(cores)]:
        p.wait()
    assert watch.share() < 0.5


def test_switch_points_measured_on_this_machine(tmp_path, quiet):
    target = tg.detect("g++")
    cal = Calibration(
        target, Options(cache_dir=str(tmp_path / "k"), machine_dir=str(tmp_path / "m"), switch_points="measure")
    )
    rows = cal.get("linear_rows", (64, 96))
    assert rows.value == 0 or rows.value in ROWS
    split = cal.get("linear_split", (64, 96))  # measured first: linear_rows times the row kernel as the host runs it
    assert (
        split.value >= tile_for(target).rows
        and "the row kernel's threads split the weights' panels" in split.describe()
    )
    keys = cal.get("attention_keys_library", (16,))
    assert keys.value >= 0 and target.isa in keys.source
    if has_bf16_rows(target):  # bf16 kinds: the canonical attention in bf16, the row kernel's multiply
        keys = cal.get("attention_keys_library_bf16", (16,))
        assert keys.value >= 0 and "attention bf16, head size 16: merged kernel up to" in keys.describe()
        assert cal.get("bf16_multiply", ()).value in bf16_multiplies(target)
        split = cal.get("linear_split_bf16", (64, 96))
        assert split.value >= tile_for(target).rows and "the bf16 row kernel's threads split" in split.describe()
    chunk = cal.get("row_chunk", ())  # built and timed for each choice
    assert chunk.value in chunk_choices(target) and "walks a weight panel" in chunk.describe()
    (path,) = (tmp_path / "m").iterdir()
    assert "linear_rows 64x96" in path.read_text() and "attention_keys_library 16" in path.read_text()
    assert all(f"vs {chunk_choices(target)[0]} steps" in k for k in json.loads(path.read_text())["row_chunk "]["ms"])
    assert "linear_split 64x96" in path.read_text()


def test_thresholds_by_hand_are_checked():
    assert parse_thresholds("linear_rows=0, attention_keys=64", "X") == (("linear_rows", 0), ("attention_keys", 64))
    with pytest.raises(ValueError, match="X: unknown threshold 'rows'"):
        parse_thresholds("rows=3", "X")
    with pytest.raises(ValueError, match="X: linear_rows must be a whole number"):
        parse_thresholds("linear_rows=-1", "X")
    with pytest.raises(ValueError, match="thresholds: expected kind=rows"):
        Options.from_env(thresholds="linear_rows")


def test_the_row_gemm_is_one_object_every_model_shares_and_compiles_ahead_of_capture(tmp_path):
    """A library with linear layers is two translation units built at once: the row GEMM (with
    the tile instances), the same for every model of the target, and the model's kernels. The
    GEMM's object file is compiled once (by `prebuild`, on another core while a model is
    captured), and each model then compiles only its own part."""
    from symfuse.codegen.cpu.compile import prebuild

    cache = tmp_path / "k"
    objects = lambda: sorted(p.name for p in cache.iterdir() if p.name.endswith(".o"))  # noqa: E731
    opts = Options(cache_dir=str(cache), machine_dir=str(tmp_path / "m"))
    prebuild(opts).join()
    assert len(objects()) == 1
    models = [torch.nn.Sequential(torch.nn.Linear(96, 64), torch.nn.GELU(), torch.nn.Linear(64, 80)),
              torch.nn.Sequential(torch.nn.Linear(96, 128), torch.nn.Tanh())]  # fmt: skip
    for i, m in enumerate(models):
        c = symfuse.compile(m, (torch.randn(4, 96),), {"input": {0: "M"}}, cache_dir=str(cache),
                            machine_dir=str(tmp_path / "m"))  # fmt: skip
        assert len(c.native.generated.parts) == 2 and "#define SF_ROWS_ELSEWHERE" in c.native.generated.parts[1]
        assert len(objects()) == 2 + i  # the GEMM's object reused: one new object, the model's
        for x in (torch.randn(1, 96), torch.randn(37, 96)):
            assert torch.allclose(c(x), m(x), rtol=1e-4, atol=1e-5)
    assert prebuild(Options(cache_dir=str(cache), switch_points="measure")) is None  # measuring wants the cores
