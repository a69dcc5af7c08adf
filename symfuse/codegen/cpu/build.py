"""Building generated C++ into a shared library, cached on disk by content hash.

The key hashes the source, the compiler's version and the flags, which name the target's
ISA (`target.py`), so a cache shared by two machines never gives one the other's code. An entry is written
atomically (compiled to a temporary name, then renamed) with a sidecar holding the
library's SHA-256; an entry whose sidecar is missing or does not match is rebuilt, never
loaded. A lock file per entry makes processes that need the same library at once wait for
the one building it. Entries are named `<target key>-<content hash>.so`. The library links
against the OpenMP runtime already loaded by torch, so the process has one thread pool.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import subprocess
import tempfile
import time
from typing import TYPE_CHECKING

from filelock import FileLock

from symfuse.options import Options

if TYPE_CHECKING:
    from symfuse.codegen.cpu.target import Target

log = logging.getLogger("symfuse")


class BuildError(RuntimeError):
    pass


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


def _digest(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def _valid(lib: str) -> bool:
    stamp = lib + ".sha256"
    if not (os.path.exists(lib) and os.path.exists(stamp)):
        return False
    with open(stamp) as f:
        if f.read().strip() == _digest(lib):
            return True
    log.warning("symfuse: cache entry %s does not match its checksum; rebuilding", lib)
    return False


def _compile(source: str, cxx: str, flags: list[str], target: Target, lib: str, folder: str) -> None:
    fd, src = tempfile.mkstemp(prefix=".build-", suffix=".cpp", dir=folder)  # (dot files: `cache clear` skips them)
    with os.fdopen(fd, "w") as f:
        f.write(source)
    tmp = src[:-4] + ".so"
    cmd = [cxx, *flags, "-shared", src, "-o", tmp] + (["-lmvec"] if target.libmvec else [])
    try:
        r = subprocess.run(cmd, capture_output=True, text=True)
    except OSError as e:
        raise BuildError(no_compiler(cxx, str(e))) from e
    finally:
        os.unlink(src)
    if r.returncode != 0:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise BuildError(
            f"generated C++ failed to compile with {cxx!r} (CXX) for {target.isa}:\n  {' '.join(cmd)}\n"
            f"{r.stderr[-4000:]}\nSet CXX to another g++ or clang++, SYMFUSE_ISA to another ISA, or use {HINT}"
        )
    digest = _digest(tmp)
    os.replace(tmp, lib)
    fd, tmp_stamp = tempfile.mkstemp(prefix=".build-", dir=folder)
    with os.fdopen(fd, "w") as f:
        f.write(digest)
    os.replace(tmp_stamp, lib + ".sha256")


def build(source: str, target: Target, opts: Options) -> tuple[str, bool, float]:
    """Path of the library built from `source` for `target`, whether it came from the cache,
    seconds spent."""
    flags = list(target.all_flags)
    cxx = target.cxx
    key = hashlib.sha256("\0".join([source, target.key, compiler_version(cxx), *flags]).encode()).hexdigest()[:24]
    os.makedirs(opts.kernel_cache, exist_ok=True)
    lib = os.path.join(opts.kernel_cache, f"{target.key}-{key}.so")  # named by target: `symfuse cache info`
    t0 = time.perf_counter()
    # one process builds an entry while others wait for it (then hit), instead of all building it
    with FileLock(lib + ".lock"):
        if _valid(lib):
            return lib, True, time.perf_counter() - t0
        _compile(source, cxx, flags, target, lib, opts.kernel_cache)
    return lib, False, time.perf_counter() - t0
