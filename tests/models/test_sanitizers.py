"""The generated C++ under AddressSanitizer and UndefinedBehaviorSanitizer: BERT-small,
GPT-2 small and the conv net at odd shapes, and the fuzz corpus's programs, in a process
started with the sanitizer runtime preloaded (as gcc's documentation describes for a
library loaded into an uninstrumented program). Any report fails the test."""

import os
import shutil
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.models

SCRIPT = textwrap.dedent(
    """
    import torch, symfuse
    from symfuse.models import load
    from tests.conftest import rel_err

    ran = 0
    for name, bindings in [
        ("bert-small", [dict(B=1, S=1), dict(B=2, S=7), dict(B=3, S=13), dict(B=1, S=33)]),
        ("gpt2", [dict(B=1, S=1), dict(B=2, S=5), dict(B=1, S=17)]),
        ("resnet", [dict(B=1, H=7), dict(B=2, H=13), dict(B=1, H=31)]),
    ]:
        case = load(name)
        c = symfuse.compile(case.model, case.inputs(**case.example), case.dynamic)
        for b in bindings:
            x = case.inputs(**b)
            with torch.no_grad():
                want = case.model(**x)
            got = c(**x)
            assert rel_err(got, want) < 1e-4, (name, b)
            ran += 1
    from tests.cpu.fuzz.corpus import run_corpus
    ran += run_corpus()
    print("SANITIZED RUNS", ran)
    """
)


def _runtime(name: str) -> str | None:
    cxx = os.environ.get("CXX", "g++")
    if not shutil.which(cxx):
        return None
    path = subprocess.run([cxx, f"-print-file-name={name}"], capture_output=True, text=True).stdout.strip()
    return path if os.path.isabs(path) and os.path.exists(path) else None


def test_models_and_fuzz_corpus_under_asan_and_ubsan(tmp_path):
    asan = _runtime("libasan.so")
    assert asan, "g++ ships libasan.so; without it this tier cannot run"
    env = dict(os.environ)
    env.update(
        LD_PRELOAD=asan,
        ASAN_OPTIONS="detect_leaks=0:alloc_dealloc_mismatch=0:abort_on_error=0:halt_on_error=1",
        UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1",
        SYMFUSE_SANITIZE="1",
        SYMFUSE_CACHE_DIR=str(tmp_path / "kernels"),
        PYTHONPATH=os.getcwd() + os.pathsep + env.get("PYTHONPATH", ""),
    )
    proc = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=1500)
    report = proc.stderr
    assert "AddressSanitizer" not in report and "runtime error" not in report, report[-4000:]
    assert proc.returncode == 0, report[-4000:]
    assert "SANITIZED RUNS" in proc.stdout
