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


def file_sha256(path: str) -> str:
    """A file's SHA-256, read in blocks (a library's sidecar, an artifact's manifest)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 24), b""):
            h.update(block)
    return h.hexdigest()


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
        if folder == _private.get("folder"):
            raise
        folder = _fallback(folder, f"could not be written ({e})")
        return _build_in(folder, source, cxx, flags, target, key, t0)


def _build_in(folder: str, source: str, cxx: str, flags: list[str], target: Target, key: str, t0: float):
    lib = os.path.join(folder, f"{target.key}-{key}.so")  # named by target: `symfuse cache info`
    # one process builds an entry while others wait for it (then hit), instead of all building it
    with FileLock(lib + ".lock"):
        if _valid(lib):
            return lib, True, time.perf_counter() - t0
        _compile(source, cxx, flags, target, lib, folder)
    return lib, False, time.perf_counter() - t0


_private: dict[str, str] = {}  # this process's fallback folder, once made


def _fallback(folder: str, why: str) -> str:
    if "folder" not in _private:
        _private["folder"] = tempfile.mkdtemp(prefix="symfuse-kernels-")  # 0700, this process's own
    log.warning("symfuse: the kernel cache %s %s; building in %s for this process", folder, why, _private["folder"])
    return _private["folder"]


def cache_folder(path: str) -> str:
    """The kernel cache, checked before any library in it is loaded: created private (0700);
    one that other users can write to is refused (they could put code there that this
    process would run); one that cannot be created or written falls back, with a warning,
    to a private temporary folder."""
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
    except OSError as e:
        return _fallback(path, f"cannot be created ({e})")
    mode = os.stat(path).st_mode
    if mode & 0o022:
        raise BuildError(
            f"the kernel cache {path} is writable by other users (mode {oct(mode & 0o777)}); symfuse loads "
            f"compiled code from it, so it will not use it: run `chmod go-w {path}` or set SYMFUSE_CACHE_DIR to "
            "a private folder"
        )
    if not os.access(path, os.W_OK | os.X_OK):
        return _fallback(path, "is not writable")
    return path


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
