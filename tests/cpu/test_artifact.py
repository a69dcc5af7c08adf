"""Saved artifacts: a round trip into a fresh process without `transformers`, every way a
load can fail with its clear error, a rebuild for another target, the kernel cache's lock
with two real processes, and the `compile`, `run` and `cache` commands."""

from __future__ import annotations

import json
import os
import pickle
import shutil
import subprocess
import sys
import textwrap

import pytest
import torch

import symfuse
from symfuse.cli import main
from symfuse.models import load as load_case
from symfuse.runtime.artifact import ArtifactError, read_safetensors, write_safetensors
from symfuse.runtime.switches import ROWS
from tests.conftest import rel_err
from tests.support.without_transformers import run_without_transformers

SHAPES = [dict(B=1, S=1), dict(B=1, S=16), dict(B=2, S=7), dict(B=3, S=13), dict(B=1, S=32)]


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    case = load_case("bert-small")
    module = symfuse.compile(case.model, case.inputs(**case.example), case.dynamic)
    path = str(tmp_path_factory.mktemp("artifact") / "bert-small")
    module.save(path)
    return case, module, path


def copy_of(saved, tmp_path) -> str:
    path = str(tmp_path / "copy")
    shutil.copytree(saved[2], path)
    return path


def test_a_saved_model_runs_in_a_fresh_process_without_transformers(saved, tmp_path):
    case, module, path = saved
    torch.manual_seed(0)
    cases = [case.inputs(**b) for b in SHAPES]
    with torch.no_grad():
        expected = [case.model(**x) for x in cases]
    torch.save(
        {"inputs": cases, "expected": [(e.last_hidden_state, e.pooler_output) for e in expected]}, tmp_path / "io.pt"
    )
    r = run_without_transformers(
        f"""
        import torch, symfuse
        m = symfuse.load({path!r})
        io = torch.load({str(tmp_path / "io.pt")!r})
        errs = []
        for x, (hidden, pooled) in zip(io["inputs"], io["expected"]):
            out = m(**x)
            assert out.last_hidden_state.shape == hidden.shape and out[1].shape == pooled.shape
            errs.append(max(float((out.last_hidden_state - hidden).abs().max() / hidden.abs().max()),
                            float((out.pooler_output - pooled).abs().max() / pooled.abs().max())))
        try:
            m(input_ids=torch.zeros(1, 600, dtype=torch.long), attention_mask=torch.ones(1, 600, dtype=torch.long))
        except ValueError as e:
            print("GUARD", e)
        print("MODULES", *sorted(k for k in sys.modules if k.split(".")[0] == "symfuse"))
        print("ERRS", max(errs), symfuse.compile_count(), "transformers" in sys.modules, type(out).__name__)
        """
    )
    assert r.returncode == 0, r.stderr[-3000:]
    errs = next(line for line in r.stdout.splitlines() if line.startswith("ERRS")).split()
    assert float(errs[1]) < 1e-4
    assert errs[2:] == ["0", "False", "Record"]  # no compile, no transformers: its output class stood in for
    # loading and running imported the runtime alone: none of the compiler's stages
    modules = next(line for line in r.stdout.splitlines() if line.startswith("MODULES")).split()[1:]
    run_time = {"symfuse", "symfuse.version", "symfuse.options", "symfuse.errors", "symfuse.artifact", "symfuse.source"}
    assert "symfuse.runtime.program" in modules
    assert [m for m in modules if m not in run_time and not m.startswith("symfuse.runtime")] == []
    guard = next(line for line in r.stdout.splitlines() if line.startswith("GUARD"))
    with pytest.raises(ValueError) as compiled_error:
        module.bind(
            input_ids=torch.zeros(1, 600, dtype=torch.long), attention_mask=torch.ones(1, 600, dtype=torch.long)
        )
    assert guard == f"GUARD {compiled_error.value}"  # the same rule, worded the same


def test_a_loaded_module_explains_itself_as_the_compiled_one(saved):
    _, module, path = saved
    loaded = symfuse.load(path)
    a, b = module.explain(with_te=True).splitlines(), loaded.explain(with_te=True).splitlines()
    assert [x for x in a if not x.startswith("compile time")] == [x for x in b if not x.startswith("load time")]
    assert any(x.startswith(f"load time ({path})") for x in b)
    assert loaded.native.thresholds.keys() == module.native.thresholds.keys()


def test_weights_are_memory_mapped_and_aligned(saved):
    tensors = read_safetensors(os.path.join(saved[2], "packed.safetensors"))
    assert all(t.data_ptr() % 64 == 0 for t in tensors.values() if t.numel() * t.element_size() % 64 == 0)
    loaded = symfuse.load(saved[2])
    w = next(iter(loaded.native.host.panels))
    ptr = loaded.native.program._ns[w].data_ptr()
    maps = [line.split() for line in open("/proc/self/maps")]
    mapped = [m[-1] for m in maps if int(m[0].split("-")[0], 16) <= ptr < int(m[0].split("-")[1], 16)]
    assert mapped and mapped[0].endswith("packed.safetensors")  # the file's pages, shared by every process


def test_safetensors_round_trip_keeps_dtypes_and_values(tmp_path):
    ts = {"a": torch.randn(3, 5), "b": torch.arange(7), "c": torch.tensor([True, False]), "d": torch.randn(())}
    write_safetensors(str(tmp_path / "t.safetensors"), ts)
    back = read_safetensors(str(tmp_path / "t.safetensors"))
    assert all(torch.equal(back[k], v) and back[k].dtype == v.dtype for k, v in ts.items())


def _rehash(path: str, name: str) -> None:
    from symfuse.runtime.artifact import file_sha256

    m = json.load(open(os.path.join(path, "manifest.json")))
    m["files"][name] = {
        "bytes": os.path.getsize(os.path.join(path, name)),
        "sha256": file_sha256(os.path.join(path, name)),
    }
    json.dump(m, open(os.path.join(path, "manifest.json"), "w"))


def test_a_truncated_or_altered_artifact_is_a_clear_error(saved, tmp_path):
    path = copy_of(saved, tmp_path)
    weights = os.path.join(path, "weights.safetensors")
    with open(weights, "r+b") as f:
        f.truncate(os.path.getsize(weights) - 1000)
    with pytest.raises(ArtifactError, match=r"weights.safetensors is \d+ bytes, the manifest says \d+ \(truncated"):
        symfuse.load(path)
    shutil.copyfile(os.path.join(saved[2], "weights.safetensors"), weights)
    with open(os.path.join(path, "kernels.so"), "r+b") as f:
        f.seek(5000)
        byte = f.read(1)
        f.seek(5000)
        f.write(bytes([byte[0] ^ 1]))
    with pytest.raises(ArtifactError, match="kernels.so does not match its SHA-256"):
        symfuse.load(path)
    os.unlink(os.path.join(path, "kernels.so"))
    with pytest.raises(ArtifactError, match="kernels.so is missing"):
        symfuse.load(path)
    with pytest.raises(ArtifactError, match="not a symfuse artifact"):
        symfuse.load(str(tmp_path))
    with pytest.raises(ArtifactError, match="no such artifact folder"):
        symfuse.load(str(tmp_path / "nothing"))


def test_a_pickle_that_would_run_code_is_refused(saved, tmp_path):
    path = copy_of(saved, tmp_path)

    class Evil:
        def __reduce__(self):
            return (os.system, ("echo owned > " + str(tmp_path / "owned"),))

    with open(os.path.join(path, "module.pkl"), "wb") as f:
        pickle.dump({"graph": Evil()}, f)
    _rehash(path, "module.pkl")  # even with a matching hash: only symfuse's own types are built
    with pytest.raises(ArtifactError, match=r"module.pkl asks for (posix|os)\.system"):
        symfuse.load(path)
    assert not os.path.exists(tmp_path / "owned")


def test_other_format_versions_say_which_version_wrote_them(saved, tmp_path):
    path = copy_of(saved, tmp_path)
    manifest = json.load(open(os.path.join(path, "manifest.json")))
    from symfuse.runtime.artifact import FORMAT

    for fmt, words in ((99, f"this symfuse reads format {FORMAT}: upgrade"), (0, "no longer reads: compile")):
        json.dump({**manifest, "format": fmt, "symfuse": "9.9"}, open(os.path.join(path, "manifest.json"), "w"))
        with pytest.raises(ArtifactError, match=f"written by symfuse 9.9 in artifact format {fmt}.*{words}"):
            symfuse.load(path)


def _as_saved_elsewhere(path: str, **target) -> None:
    m = json.load(open(os.path.join(path, "manifest.json")))
    m["target"].update(target)
    json.dump(m, open(os.path.join(path, "manifest.json"), "w"))


def test_kernels_for_a_cpu_this_one_is_not_are_rebuilt_for_this_one(saved, tmp_path):
    case, module, path = saved
    path = copy_of(saved, tmp_path)
    _as_saved_elsewhere(path, arch="aarch64", isa="neon", flags=["-march=armv8-a"], cpu="Neoverse-V1", machine="0")
    before = symfuse.compile_count()
    loaded = symfuse.load(path, cache_dir=str(tmp_path / "kernels"))
    assert symfuse.compile_count() == before  # the saved graph is built again, not captured again
    assert loaded.native.target.arch == module.native.target.arch and not loaded.native.cached
    for b in SHAPES[:3]:
        x = case.inputs(**b)
        with torch.no_grad():
            assert rel_err(loaded(**x).last_hidden_state, case.model(**x).last_hidden_state) < 1e-4
    with pytest.raises(ArtifactError, match=r"built for neon \(aarch64.*on Neoverse-V1; this machine is x86_64.*"
                       r"needs a C\+\+ compiler.*no-such-g\+\+"):  # fmt: skip
        symfuse.load(path, cxx="no-such-g++")


def test_switch_points_measured_on_another_machine_are_this_machines(saved, tmp_path):
    """Saved on another CPU, the switch points are this one's: measured here (`symfuse tune`),
    else from the model of this CPU; on the same CPU the saved ones are used as they are."""
    from symfuse.codegen.cpu.calibrate import MODELLED

    path = copy_of(saved, tmp_path)
    _as_saved_elsewhere(path, machine="another-cpu", cpu="Another CPU")
    loaded = symfuse.load(path)
    assert all("measured on this machine" in th.source or th.source == MODELLED
               for th in loaded.native.thresholds.values())  # fmt: skip
    assert symfuse.load(saved[2]).native.thresholds == saved[1].native.thresholds
    same = symfuse.load(saved[2], thresholds="linear_rows=3")
    assert {th.value for th in same.native.thresholds.values() if th.kind == "linear_rows"} == {3}
    # with the row kernel's rows by hand, oneDNN above them at every size (no measured band)
    bands = [th for th in same.native.thresholds.values() if th.kind == "linear_library"]
    assert bands and all(th.value == ROWS[-1] and "linear_rows set by hand" in th.source for th in bands)


def test_two_processes_building_the_same_library_build_it_once(tmp_path):
    child = textwrap.dedent(
        f"""
        from symfuse.codegen.cpu.build import build
        from symfuse.codegen.cpu.target import target_for
        from symfuse.options import Options
        source = 'extern "C" int sf_answer() {{ return 42; }}  // {tmp_path}'
        lib, cached, _ = build(source, target_for("generic"), Options(cache_dir={str(tmp_path / "cache")!r}))
        import ctypes
        print(int(cached), ctypes.CDLL(lib).sf_answer())
        """
    )
    procs = [subprocess.Popen([sys.executable, "-c", child], stdout=subprocess.PIPE, text=True) for _ in range(2)]
    results = [p.communicate(timeout=300)[0].split() for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert sorted(r[0] for r in results) == ["0", "1"] and {r[1] for r in results} == {"42"}
    libs = [f for f in os.listdir(tmp_path / "cache") if f.endswith(".so")]
    assert len(libs) == 1 and libs[0].startswith("generic-")


def test_cache_info_and_clear(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("SYMFUSE_CACHE_DIR", str(tmp_path / "kernels"))
    monkeypatch.setenv("SYMFUSE_MACHINE_DIR", str(tmp_path / "machine"))
    from symfuse.codegen.cpu.build import build
    from symfuse.codegen.cpu.target import target_for
    from symfuse.options import Options

    build('extern "C" int sf_one() { return 1; }', target_for("generic"), Options.from_env())
    assert main(["cache", "info"]) == 0
    out = capsys.readouterr().out
    assert f"kernels: {tmp_path / 'kernels'} (1 libraries" in out and "generic-" in out
    assert main(["cache", "clear"]) == 0
    assert "removed 1 kernel libraries" in capsys.readouterr().out
    assert not [f for f in os.listdir(tmp_path / "kernels") if f.endswith(".so")]


def test_compile_and_run_commands(saved, tmp_path, capsys):
    assert main(["run", saved[2], "--shape", "B=2,S=5", "--reps", "1"]) == 0
    out = capsys.readouterr().out
    assert "B=2, S=5" in out and "(2, 5, 256), (2, 256)" in out
    assert main(["run", saved[2], "--shape", "B=2"]) == 2
    assert "--shape must give S" in capsys.readouterr().err
    assert main(["compile", "--model", "lstm", "-o", str(tmp_path / "lstm")]) == 0
    assert "symfuse run" in capsys.readouterr().out
    assert main(["run", str(tmp_path / "lstm")]) == 0


def _tiny_build(cache: str):
    from symfuse.codegen.cpu.build import build
    from symfuse.codegen.cpu.target import target_for
    from symfuse.options import Options

    return build('extern "C" int sf_seven() { return 7; }', target_for("generic"), Options(cache_dir=cache))


def test_the_kernel_cache_is_private_and_one_others_can_write_is_refused(tmp_path):
    from symfuse.errors import BuildError

    lib, _, _ = _tiny_build(str(tmp_path / "new" / "cache"))
    assert os.stat(tmp_path / "new" / "cache").st_mode & 0o777 == 0o700
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    with pytest.raises(BuildError, match=r"kernel cache .*shared is writable by other users \(mode 0o777\)"):
        _tiny_build(str(shared))


def test_a_cache_that_cannot_be_written_falls_back_to_a_private_folder(tmp_path, caplog, monkeypatch):
    import ctypes

    from symfuse.codegen.cpu import build as b

    (tmp_path / "file").write_text("not a folder")
    with caplog.at_level("WARNING", logger="symfuse"):
        lib, _, _ = _tiny_build(str(tmp_path / "file" / "cache"))
    assert ctypes.CDLL(lib).sf_seven() == 7 and "cannot be created" in caplog.text
    assert os.stat(os.path.dirname(lib)).st_mode & 0o777 == 0o700
    real = b._compile

    def full_disk(source, cxx, flags, target, lib, folder):
        if folder == str(tmp_path / "ok"):
            raise OSError(28, "No space left on device")
        return real(source, cxx, flags, target, lib, folder)

    monkeypatch.setattr(b, "_compile", full_disk)
    caplog.clear()
    with caplog.at_level("WARNING", logger="symfuse"):
        lib, cached, _ = _tiny_build(str(tmp_path / "ok"))
    assert ctypes.CDLL(lib).sf_seven() == 7 and "No space left on device" in caplog.text
