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

from filelock import FileLock, Timeout

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
    """`source` compiled to `lib`: a shared library, or an object file where `lib` ends in `.o`."""
    _Compilation(source, cxx, flags, target, lib, folder).finish()


class _Compilation:
    """One g++ run, started now and finished (checked, stamped, moved into place) by `finish`:
    a library's translation units compile at once from the calling thread (g++ started from
    worker threads hangs under qemu-user, which the emulated-CPU tests run in)."""

    def __init__(self, source: str, cxx: str, flags: list[str], target: Target, lib: str, folder: str) -> None:
        fd, self.src = tempfile.mkstemp(prefix=".build-", suffix=".cpp", dir=folder)  # (`cache clear` skips dot files)
        with os.fdopen(fd, "w") as f:
            f.write(source)
        obj = lib.endswith(".o")
        self.tmp = self.src[:-4] + (".o" if obj else ".so")
        self.cmd = [cxx, *flags, "-c" if obj else "-shared", self.src, "-o", self.tmp]
        self.cmd += [] if obj or not target.libmvec else ["-lmvec"]
        self.cxx, self.target, self.lib, self.folder = cxx, target, lib, folder
        try:
            self.proc = subprocess.Popen(self.cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        except OSError as e:
            os.unlink(self.src)
            raise BuildError(no_compiler(cxx, str(e))) from e

    def finish(self) -> None:
        try:
            _, err = self.proc.communicate()
        finally:
            os.unlink(self.src)
        if self.proc.returncode != 0:
            if os.path.exists(self.tmp):
                os.unlink(self.tmp)
            raise BuildError(
                f"generated C++ failed to compile with {self.cxx!r} (CXX) for {self.target.isa}:\n  "
                f"{' '.join(self.cmd)}\n{err[-4000:]}\nSet CXX to another g++ or clang++, SYMFUSE_ISA to another "
                f"ISA, or use {HINT}"
            )
        _place(self.tmp, self.lib, self.folder)


def _place(tmp: str, lib: str, folder: str) -> None:
    """A finished build moved into the cache with its checksum beside it."""
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


def _flags(target: Target, opts: Options, extra: tuple[str, ...] = ()) -> list[str]:
    flags = list(target.all_flags) + list(extra)
    if opts.sanitize:
        flags += SANITIZE_FLAGS
        _check_sanitizer_runtime()
    return flags


def build_object(source: str, target: Target, opts: Options) -> str:
    """The object file of one translation unit, as `build` of a tuple of sources compiles it
    (cached; `build` then finds it, or waits for the process or thread compiling it)."""
    return _object(cache_folder(opts.kernel_cache), source, target.cxx, _flags(target, opts), target)


def build(
    source: str | tuple[str, ...], target: Target, opts: Options, extra: tuple[str, ...] = ()
) -> tuple[str, bool, float]:
    """Path of the library built from `source` for `target` (with `extra` flags), whether it
    came from the cache, seconds spent. A tuple of sources is one library of as many
    translation units, compiled at once (one g++ each) into object files that are cached too,
    so a part two libraries share (the row GEMM of a target) is compiled once."""
    flags = _flags(target, opts, extra)
    cxx = target.cxx
    parts = (source,) if isinstance(source, str) else tuple(source)
    key = _key(parts, target, cxx, flags)
    folder = cache_folder(opts.kernel_cache)
    t0 = time.perf_counter()
    try:
        return _build_in(folder, parts, cxx, flags, target, key, t0)
    except OSError as e:  # a full disk, or a folder that stopped taking writes: build privately
        if folder == private.get("folder"):
            raise
        folder = fallback(folder, f"could not be written ({e})")
        return _build_in(folder, parts, cxx, flags, target, key, t0)


def _key(parts: tuple[str, ...], target: Target, cxx: str, flags: list[str]) -> str:
    text = "\0".join([*parts[:1], *(f"\0part\0{p}" for p in parts[1:]), target.key, compiler_version(cxx), *flags])
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def _build_in(folder: str, parts: tuple[str, ...], cxx: str, flags: list[str], target: Target, key: str, t0: float):
    lib = os.path.join(folder, f"{target.key}-{key}.so")  # named by target: `symfuse cache info`
    # one process builds an entry while others wait for it (then hit), instead of all building it
    with FileLock(lib + ".lock"):
        if _valid(lib):
            return lib, True, time.perf_counter() - t0
        if len(parts) == 1:
            _compile(parts[0], cxx, flags, target, lib, folder)
        else:
            _link(_objects(folder, parts, cxx, flags, target), cxx, flags, target, lib, folder)
    return lib, False, time.perf_counter() - t0


def _object_path(folder: str, source: str, cxx: str, flags: list[str], target: Target) -> str:
    return os.path.join(folder, f"{target.key}-{_key((source,), target, cxx, flags)}.o")


def _object(folder: str, source: str, cxx: str, flags: list[str], target: Target) -> str:
    """The object file of one translation unit, from the cache or compiled now."""
    obj = _object_path(folder, source, cxx, flags, target)
    with FileLock(obj + ".lock"):
        if not _valid(obj):
            _compile(source, cxx, flags, target, obj, folder)
    return obj


def _objects(folder: str, parts: tuple[str, ...], cxx: str, flags: list[str], target: Target) -> list[str]:
    """The object file of each translation unit: those not cached compile at once; one another
    thread or process is compiling (`prebuild`) is waited for after ours have started."""
    running, busy, held = [], [], []
    try:
        for source in parts:
            obj = _object_path(folder, source, cxx, flags, target)
            lock = FileLock(obj + ".lock")
            try:
                lock.acquire(timeout=0)
            except Timeout:
                busy.append(source)
                continue
            held.append(lock)
            if not _valid(obj):
                running.append(_Compilation(source, cxx, flags, target, obj, folder))
        for compilation in running:
            compilation.finish()
    finally:
        for lock in held:
            lock.release()
    for source in busy:
        _object(folder, source, cxx, flags, target)
    return [_object_path(folder, source, cxx, flags, target) for source in parts]


def _link(objects: list[str], cxx: str, flags: list[str], target: Target, lib: str, folder: str) -> None:
    fd, tmp = tempfile.mkstemp(prefix=".build-", suffix=".so", dir=folder)
    os.close(fd)
    cmd = [cxx, *flags, "-shared", *objects, "-o", tmp] + (["-lmvec"] if target.libmvec else [])
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        os.unlink(tmp)
        raise BuildError(f"linking the generated library failed with {cxx!r}:\n  {' '.join(cmd)}\n{r.stderr[-4000:]}")
    _place(tmp, lib, folder)


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
