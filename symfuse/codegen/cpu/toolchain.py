"""The C++ toolchain: which compiler builds generated code, and running it.

Both the kernel build (`build.py`) and target detection (`target.py`) use it; neither imports
the other.
"""

from __future__ import annotations

import functools
import os
import subprocess
import tempfile

from symfuse.errors import BuildError

HINT = "backend='reference' runs without a compiler (each op through PyTorch)"


def no_compiler(cxx: str, why: str) -> str:
    return (
        f"the C++ compiler {cxx!r} (CXX; default g++) cannot be run: {why}. Install g++ or clang++, or set CXX; {HINT}"
    )


@functools.cache
def compiler_version(cxx: str) -> str:
    try:
        r = subprocess.run([cxx, "--version"], capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError) as e:
        raise BuildError(no_compiler(cxx, str(e).strip() or type(e).__name__)) from e
    lines = r.stdout.splitlines()
    if not lines:
        raise BuildError(no_compiler(cxx, "`--version` printed nothing"))
    return lines[0]


def run_program(cxx: str, source: str, flags: tuple[str, ...]) -> tuple[bool, str]:
    """Build `source` with `flags` and run it: (whether both worked, its output or the error)."""
    with tempfile.TemporaryDirectory(prefix="symfuse-probe-") as d:
        src, exe = os.path.join(d, "probe.cpp"), os.path.join(d, "probe")
        with open(src, "w") as f:
            f.write(source)
        try:
            r = subprocess.run([cxx, "-O1", *flags, src, "-o", exe], capture_output=True, text=True, timeout=120)
        except OSError as e:
            raise BuildError(no_compiler(cxx, str(e))) from e
        if r.returncode != 0:
            return False, r.stderr.strip()[-2000:]
        try:
            r = subprocess.run([exe], capture_output=True, text=True, timeout=60)
        except OSError as e:
            return False, str(e)
        if r.returncode != 0:
            return False, f"exit status {r.returncode} (signal {-r.returncode})" if r.returncode < 0 else r.stderr
        return True, r.stdout
