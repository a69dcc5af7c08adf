"""Building generated C++ into a shared library, cached on disk by content hash.

The key hashes the source, the compiler's version and the flags, which name the target's
ISA (`target.py`), so a cache shared by two machines never gives one the other's code. An
entry is written atomically (compiled to a temporary name, then renamed) with a sidecar
holding the library's SHA-256; an entry whose sidecar is missing or does not match is
rebuilt, never loaded. A lock file per entry makes processes that need the same library at
once wait for the one building it. The folder is created private (0700) and refused if
other users can write to it; one that cannot be written falls back to a private temporary
folder. Entries are named `<target key>-<content hash>.so`. The library links against the
OpenMP runtime already loaded by torch, so the process has one thread pool.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import subprocess
import tempfile
import time

from filelock import FileLock

from symfuse.codegen.cache import cache_folder, fallback, private
from symfuse.codegen.cpu.toolchain import HINT, compiler_version, no_compiler
from symfuse.errors import BuildError
from symfuse.options import Options
from symfuse.runtime.artifact import file_sha256
from symfuse.runtime.target import Target

log = logging.getLogger("symfuse")


def _valid(lib: str) -> bool:
    stamp = lib + ".sha256"
    if not (os.path.exists(lib) and os.path.exists(stamp)):
        return False
    with open(stamp) as f:
        if f.read().strip() == file_sha256(lib):
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
    digest = file_sha256(tmp)
    os.replace(tmp, lib)
    fd, tmp_stamp = tempfile.mkstemp(prefix=".build-", dir=folder)
    with os.fdopen(fd, "w") as f:
        f.write(digest)
    os.replace(tmp_stamp, lib + ".sha256")


SANITIZE_FLAGS = ["-fsanitize=address,undefined", "-fno-sanitize-recover=all", "-fno-omit-frame-pointer", "-g"]


def _check_sanitizer_runtime() -> None:
    """An ASan-built library loads only into a process whose first library is ASan's runtime."""
    try:
        with open("/proc/self/maps") as f:
            loaded = "libasan" in f.read()
    except OSError:
        loaded = True  # not Linux: let the loader say it
    if not loaded:
        raise BuildError(
            "SYMFUSE_SANITIZE builds kernels with AddressSanitizer, which must be loaded before Python starts: run "
            "with LD_PRELOAD=$(g++ -print-file-name=libasan.so) ASAN_OPTIONS=detect_leaks=0 (docs/reliability.md)"
        )


def build(source: str, target: Target, opts: Options, extra: tuple[str, ...] = ()) -> tuple[str, bool, float]:
    """Path of the library built from `source` for `target` (with `extra` flags), whether it
    came from the cache, seconds spent."""
    flags = list(target.all_flags) + list(extra)
    if opts.sanitize:
        flags += SANITIZE_FLAGS
        _check_sanitizer_runtime()
    cxx = target.cxx
    key = hashlib.sha256("\0".join([source, target.key, compiler_version(cxx), *flags]).encode()).hexdigest()[:24]
    folder = cache_folder(opts.kernel_cache)
    t0 = time.perf_counter()
    try:
        return _build_in(folder, source, cxx, flags, target, key, t0)
    except OSError as e:  # a full disk, or a folder that stopped taking writes: build privately
        if folder == private.get("folder"):
            raise
        folder = fallback(folder, f"could not be written ({e})")
        return _build_in(folder, source, cxx, flags, target, key, t0)


def _build_in(folder: str, source: str, cxx: str, flags: list[str], target: Target, key: str, t0: float):
    lib = os.path.join(folder, f"{target.key}-{key}.so")  # named by target: `symfuse cache info`
    # one process builds an entry while others wait for it (then hit), instead of all building it
    with FileLock(lib + ".lock"):
        if _valid(lib):
            return lib, True, time.perf_counter() - t0
        _compile(source, cxx, flags, target, lib, folder)
    return lib, False, time.perf_counter() - t0


@functools.cache
def kernel_caller(target: Target, opts: Options):
    """The fast kernel-calling type of `symfuse.runtime.call` for this Python, built once into
    the kernel cache; None (the host calls through ctypes) where it cannot be built or loaded."""
    import sysconfig

    from symfuse.runtime.call import SOURCE, load_caller, python_include

    include = python_include()
    if not include or opts.sanitize:
        return None
    source = f"// for {sysconfig.get_config_var('EXT_SUFFIX')}\n" + SOURCE
    try:
        path, _, _ = build(source, target, opts, ("-I" + include,))
        return load_caller(path)
    except (BuildError, ImportError, OSError) as e:
        log.info("symfuse: calling kernels through ctypes (the kernel caller did not build: %s)", str(e)[:200])
        return None
