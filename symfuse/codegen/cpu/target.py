"""The CPU that generated code is built for: detected once per machine, named everywhere.

A `Target` says what the compiler may use (its flags), how wide a vector is and how many
vector registers there are (hand-written kernels shape their tiles from these), the cache
sizes and core count (calibration and blocking read them) and which compiler builds the
code. It is part of every kernel-cache key, so a cache shared by two machines, or a saved
artifact, never hands one machine code built for another's instructions.

Detection builds and runs two tiny programs with the configured compiler: the first reads
the CPU's features (`cpuid` and the OS's saved-state mask on x86, `getauxval` on aarch64),
the second is built with the chosen ISA's flags and runs a vector multiply-add. Only an
ISA that both the compiler and the CPU (and the OS) can run is chosen; the result is
cached on disk per CPU and compiler. `SYMFUSE_ISA` (or `isa=`) asks for a particular ISA;
one this machine cannot run is a `ValueError` before any generated code runs.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import subprocess
import tempfile
from dataclasses import asdict, dataclass

from symfuse.codegen.cpu.build import BuildError, compiler_version, no_compiler

log = logging.getLogger("symfuse")

# flags every build uses besides the target's: -ffp-contract=fast lets `a * b + c` on
# vectors become one FMA where the ISA has it (ISO C++ mode turns contraction off)
BASE_FLAGS = (
    "-O3",
    "-fopenmp",
    "-fno-math-errno",
    "-fno-trapping-math",
    "-ffp-contract=fast",
    "-fPIC",
    "-std=c++17",
)


@dataclass(frozen=True)
class IsaSpec:
    name: str
    arch: str  # x86_64 | aarch64 | any
    flags: tuple[tuple[str, ...], ...]  # alternatives, first the compiler accepts wins
    needs: tuple[str, ...]  # CPU features the ISA requires
    vector_bytes: int
    registers: int
    rank: int  # higher is preferred when several run

    @property
    def lanes(self) -> int:
        return self.vector_bytes // 4

    def flag_sets(self, arch: str) -> tuple[tuple[str, ...], ...]:
        return (GENERIC_FLAGS.get(arch, ()),) if self.name == "generic" else self.flags


_V3 = ("avx", "avx2", "fma", "bmi1", "bmi2", "f16c", "lzcnt", "movbe", "os_avx")
_V4 = ("avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl", "os_avx512")
ISAS: dict[str, IsaSpec] = {
    s.name: s
    for s in [
        IsaSpec("generic", "any", ((),), (), 16, 16, 0),  # flags per architecture: GENERIC_FLAGS
        IsaSpec(
            "avx2",
            "x86_64",
            (("-march=x86-64-v3",), ("-march=x86-64", "-mavx2", "-mfma", "-mbmi", "-mbmi2", "-mf16c", "-mlzcnt")),
            _V3,
            32,
            16,
            1,
        ),
        IsaSpec(
            "avx512",
            "x86_64",
            (
                ("-march=x86-64-v4", "-mprefer-vector-width=512"),
                ("-march=x86-64", "-mavx512f", "-mavx512bw", "-mavx512cd", "-mavx512dq", "-mavx512vl", "-mfma"),
            ),
            _V3 + _V4,
            64,
            32,
            2,
        ),
        IsaSpec("neon", "aarch64", (("-march=armv8-a",),), ("asimd",), 16, 32, 1),
    ]
}
# the baseline of each architecture, so "generic" does not inherit a distribution's default -march
GENERIC_FLAGS = {"x86_64": ("-march=x86-64", "-mtune=generic"), "aarch64": ("-march=armv8-a",)}
# extensions reported with the ISA and enabled in its flags when the CPU has them
EXTENSION_FLAGS = {"avx512_bf16": "-mavx512bf16", "avx512_vnni": "-mavx512vnni"}
REPORTED = ("avx512_bf16", "avx512_vnni", "amx_tile", "amx_bf16", "amx_int8", "sve")


@dataclass(frozen=True)
class Target:
    arch: str
    isa: str
    extensions: tuple[str, ...]  # of REPORTED, the ones this CPU has that code for this ISA may use
    flags: tuple[str, ...]  # the ISA's compiler flags (without BASE_FLAGS)
    vector_bytes: int
    registers: int
    l1d: int  # bytes per core
    l2: int  # bytes per core
    l3: int  # bytes, shared
    cores: int
    cxx: str
    compiler: str  # the compiler's version line
    cpu: str  # the CPU's model name, for people
    machine: str  # a hash of the CPU's model and features: measurements are per machine
    chosen_by: str  # "detected" or how it was asked for

    @property
    def lanes(self) -> int:
        """32-bit lanes in one vector register."""
        return self.vector_bytes // 4

    @property
    def all_flags(self) -> tuple[str, ...]:
        return BASE_FLAGS + self.flags

    @property
    def key(self) -> str:
        """What generated code depends on: the ISA, its flags and the compiler."""
        text = "\0".join([self.arch, self.isa, *self.flags, self.compiler])
        return f"{self.isa}-{hashlib.sha256(text.encode()).hexdigest()[:12]}"

    @property
    def libmvec(self) -> bool:
        """glibc's vector math exists for x86-64 (SSE, AVX2 and AVX-512 variants)."""
        return self.arch == "x86_64" and platform.system() == "Linux"

    def describe(self) -> str:
        ext = f" + {', '.join(self.extensions)}" if self.extensions else ""
        kib = lambda b: f"{b // 1024} KiB" if b < 1 << 20 else f"{b >> 20} MiB"  # noqa: E731
        return (
            f"{self.isa}{ext} on {self.arch} ({self.cpu}; {self.chosen_by}): {self.lanes} floats x "
            f"{self.registers} vector registers, L1d {kib(self.l1d)}, L2 {kib(self.l2)}, L3 {kib(self.l3)}, "
            f"{self.cores} cores; {self.compiler} {' '.join(self.flags) or '(no ISA flags)'}"
        )


# -- probing ---------------------------------------------------------------------------

_FEATURES_SOURCE = r"""
#include <cstdio>
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#ifdef __linux__
#include <sys/syscall.h>
#include <unistd.h>
#endif
static unsigned long long xgetbv0() {
  unsigned lo, hi;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return ((unsigned long long)hi << 32) | lo;
}
int main() {
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return 1;
  const bool osxsave = c >> 27 & 1;
  const unsigned long long xcr0 = osxsave ? xgetbv0() : 0;
  std::printf("fma=%u avx=%u f16c=%u movbe=%u\n", c >> 12 & 1, c >> 28 & 1, c >> 29 & 1, c >> 22 & 1);
  std::printf("os_avx=%d os_avx512=%d\n", (xcr0 & 6) == 6, (xcr0 & 0xe6) == 0xe6);
  // AMX's tile registers: saved by the OS (XCR0 bits 17, 18) and, on Linux, handed to a process
  // that asks (ARCH_REQ_XCOMP_PERM for XTILEDATA), as the kernels will
  unsigned os_amx = (xcr0 >> 17 & 3) == 3;
#ifdef __linux__
  os_amx = os_amx && syscall(SYS_arch_prctl, 0x1023, 18) == 0;
#endif
  if (__get_cpuid_count(7, 0, &a, &b, &c, &d)) {
    std::printf("bmi1=%u avx2=%u bmi2=%u avx512f=%u avx512dq=%u avx512cd=%u avx512bw=%u avx512vl=%u\n",
                b >> 3 & 1, b >> 5 & 1, b >> 8 & 1, b >> 16 & 1, b >> 17 & 1, b >> 28 & 1, b >> 30 & 1, b >> 31 & 1);
    std::printf("avx512_vnni=%u amx_bf16=%u amx_tile=%u amx_int8=%u\n", c >> 11 & 1, d >> 22 & os_amx,
                d >> 24 & os_amx, d >> 25 & os_amx);
  }
  if (__get_cpuid_count(7, 1, &a, &b, &c, &d)) std::printf("avx512_bf16=%u\n", a >> 5 & 1);
  if (__get_cpuid(0x80000001, &a, &b, &c, &d)) std::printf("lzcnt=%u\n", c >> 5 & 1);
  return 0;
}
#elif defined(__aarch64__) && defined(__linux__)
#include <sys/auxv.h>
int main() {
  const unsigned long hw = getauxval(AT_HWCAP);
  std::printf("asimd=%lu sve=%lu\n", hw >> 1 & 1, hw >> 22 & 1);
  return 0;
}
#elif defined(__aarch64__)
int main() { std::printf("asimd=1\n"); return 0; }  // NEON is part of every ARMv8-A CPU
#else
int main() { return 0; }
#endif
"""

# built with an ISA's flags: runs a multiply-add on vectors of its width, so a CPU or OS
# without the ISA dies here (SIGILL) rather than in a generated kernel
_CHECK_SOURCE = r"""
#include <cstdio>
#include <cstring>
typedef float vec __attribute__((vector_size(%(bytes)d)));
int main(int argc, char**) {
  vec a, b, c;
  for (int i = 0; i < %(lanes)d; ++i) { a[i] = argc + i; b[i] = 2.0f; c[i] = 1.0f; }
  c = a * b + c;
  float out[%(lanes)d];
  std::memcpy(out, &c, sizeof out);
  std::printf("%%g\n", out[%(lanes)d - 1]);
  return 0;
}
"""


def _run_program(cxx: str, source: str, flags: tuple[str, ...]) -> tuple[bool, str]:
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


def read_features(cxx: str) -> dict[str, bool]:
    ok, out = _run_program(cxx, _FEATURES_SOURCE, ())
    if not ok:
        raise BuildError(
            f"the C++ compiler {cxx!r} could not build and run a probe program: {out}. Set CXX to a working "
            "g++ or clang++; backend='reference' runs without a compiler"
        )
    feats = {}
    for tok in out.split():
        name, _, value = tok.partition("=")
        feats[name] = value == "1"
    return feats


# /proc/cpuinfo's names for the features the probe reads, where they differ; Linux lists a
# feature only when the OS saves its registers, so the OS flags follow from the ISA's
_CPUINFO_NAMES = {"lzcnt": "abm", "bmi1": "bmi1", "asimd": "asimd"}


def cpuinfo_features() -> dict[str, bool]:
    """The CPU's features as Linux reports them, for when no compiler can run the probe (a
    saved artifact loaded on a machine without one)."""
    flags: set[str] = set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.lower().startswith(("flags", "features")):
                    flags |= set(line.split(":", 1)[1].split())
    except OSError:
        return {}
    names = {n for spec in ISAS.values() for n in spec.needs} | set(REPORTED)
    feats = {n: _CPUINFO_NAMES.get(n, n) in flags for n in names}
    feats["os_avx"], feats["os_avx512"] = "avx" in flags, "avx512f" in flags
    if machine_arch() == "aarch64":
        feats["asimd"] = True  # every ARMv8-A CPU has it
    return feats


def runs_here(target: Target, cxx: str, cache_dir: str = "") -> tuple[bool, str]:
    """Whether this machine runs code built for `target` (ISA and the extensions its flags
    enable), and if not what it lacks. Uses the probe (cached) when the compiler works, else
    /proc/cpuinfo."""
    arch = machine_arch()
    if target.arch != arch or target.isa not in ISAS:
        return False, f"is {arch}, not {target.arch}"
    needed = [e for e in target.extensions if e in EXTENSION_FLAGS]
    try:
        local = detect(cxx, target.isa, cache_dir)
        missing = [e for e in needed if e not in local.extensions]
    except ValueError as e:
        return False, str(e).split(": ", 1)[-1]
    except BuildError:
        feats = cpuinfo_features()
        missing = [f for f in ISAS[target.isa].needs + tuple(needed) if not feats.get(f)]
    return not missing, f"lacks {', '.join(missing)}" if missing else ""


def machine_arch() -> str:
    m = platform.machine().lower()
    return {"amd64": "x86_64", "arm64": "aarch64"}.get(m, m)


def _cache_sizes() -> tuple[int, int, int]:
    """L1d and L2 per core and L3, from sysfs; sysconf where it has them; else typical sizes."""
    sizes = {}
    base = "/sys/devices/system/cpu/cpu0/cache"
    try:
        for entry in sorted(os.listdir(base)):
            if not entry.startswith("index"):
                continue
            read = lambda n, e=entry: open(os.path.join(base, e, n)).read().strip()  # noqa: E731
            level, kind, size = int(read("level")), read("type"), read("size")
            if kind in ("Data", "Unified"):
                mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(size[-1], 1)
                sizes[level] = int(size.rstrip("KMG")) * mult
    except (OSError, ValueError):
        pass
    for level, name in ((1, "SC_LEVEL1_DCACHE_SIZE"), (2, "SC_LEVEL2_CACHE_SIZE"), (3, "SC_LEVEL3_CACHE_SIZE")):
        if level not in sizes:
            try:
                v = os.sysconf(name)
            except (ValueError, OSError):
                v = 0
            if v > 0:
                sizes[level] = v
    return sizes.get(1, 32 << 10), sizes.get(2, 1 << 20), sizes.get(3, sizes.get(2, 1 << 20) * 4)


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.lower().startswith(("model name", "cpu model", "hardware")):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or machine_arch()


def _cpu_identity() -> str:
    """What tells this machine's CPU from another's: cpuinfo's model and feature lines."""
    try:
        with open("/proc/cpuinfo") as f:
            lines = [ln for ln in f if ln.lower().startswith(("model name", "flags", "features", "cpu part"))]
        return "".join(sorted(set(lines)))
    except OSError:
        return platform.platform() + platform.processor()


def machine_id() -> str:
    """A hash of this CPU's model and features: what measurements (switch points) belong to."""
    return hashlib.sha256(_cpu_identity().encode()).hexdigest()[:12]


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def has_isa(spec: IsaSpec, arch: str, feats: dict[str, bool]) -> bool:
    return (spec.arch in ("any", arch)) and all(feats.get(f, False) for f in spec.needs)


def target_for(
    isa: str,
    *,
    arch: str | None = None,
    cxx: str = "g++",
    extensions: tuple[str, ...] = (),
    flags: tuple[str, ...] | None = None,
    chosen_by: str = "named",
) -> Target:
    """A target for `isa` without probing the CPU (cross-compiling, tests): its first flag set,
    the machine's cache sizes, the given extensions."""
    spec = ISAS[isa]
    arch = arch or (machine_arch() if spec.arch == "any" else spec.arch)
    if flags is None:
        flags = spec.flag_sets(arch)[0] + tuple(EXTENSION_FLAGS[e] for e in extensions if e in EXTENSION_FLAGS)
    l1, l2, l3 = _cache_sizes()
    machine = machine_id()
    return Target(
        arch,
        isa,
        tuple(extensions),
        flags,
        spec.vector_bytes,
        spec.registers,
        l1,
        l2,
        l3,
        _cores(),
        cxx,
        compiler_version(cxx),
        _cpu_name(),
        machine,
        chosen_by,
    )


def _isa_flags(spec: IsaSpec, arch: str, cxx: str, extensions: tuple[str, ...]) -> tuple[tuple[str, ...] | None, str]:
    """The first flag set of `spec` with which a vector multiply-add builds and runs here."""
    source = _CHECK_SOURCE % {"bytes": spec.vector_bytes, "lanes": spec.lanes}
    why = ""
    for alt in spec.flag_sets(arch):
        flags = alt + tuple(EXTENSION_FLAGS[e] for e in extensions if e in EXTENSION_FLAGS)
        ok, why = _run_program(cxx, source, flags)
        if ok:
            return flags, ""
    return None, why


def detect(cxx: str = "g++", isa: str = "", cache_dir: str = "") -> Target:
    """This machine's target for compiler `cxx`; `isa` names one instead of the best."""
    if isa and isa not in ISAS:
        raise ValueError(f"SYMFUSE_ISA={isa!r} is not an ISA symfuse knows; choose one of {', '.join(ISAS)}")
    version = compiler_version(cxx)
    arch = machine_arch()
    # the probe's own text too: a changed probe (one more feature read) probes again
    probe = _FEATURES_SOURCE + _CHECK_SOURCE
    ident = hashlib.sha256("\0".join([_cpu_identity(), arch, cxx, version, isa, probe]).encode()).hexdigest()[:20]
    path = os.path.join(cache_dir, f"target-{ident}.json") if cache_dir else ""
    if path and os.path.exists(path):
        try:
            with open(path) as f:
                return Target(**{k: tuple(v) if isinstance(v, list) else v for k, v in json.load(f).items()})
        except (OSError, ValueError, TypeError):
            log.warning("symfuse: ignoring an unreadable target cache %s", path)
    target = _probe(cxx, isa, arch)
    if path:
        os.makedirs(cache_dir, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=cache_dir)
        with os.fdopen(fd, "w") as f:
            json.dump(asdict(target), f, indent=1)
        os.replace(tmp, path)
    return target


def _probe(cxx: str, isa: str, arch: str) -> Target:
    feats = read_features(cxx)
    extensions = tuple(e for e in REPORTED if feats.get(e))
    runnable = [s for s in ISAS.values() if has_isa(s, arch, feats)]
    if isa:
        spec = ISAS[isa]
        if spec not in runnable:
            missing = [f for f in spec.needs if not feats.get(f)]
            lacks = f"lacks {', '.join(missing)}" if spec.arch in ("any", arch) else f"is {arch}, not {spec.arch}"
            raise ValueError(
                f"SYMFUSE_ISA={isa} asks for code this machine cannot run: its CPU ({_cpu_name()}) {lacks}; "
                f"it can run {', '.join(s.name for s in sorted(runnable, key=lambda s: -s.rank))}"
            )
        candidates, chosen_by = [spec], f"SYMFUSE_ISA={isa}"
    else:
        candidates, chosen_by = sorted(runnable, key=lambda s: -s.rank), "detected"
    for spec in candidates:
        ext = tuple(e for e in extensions if spec.name == "avx512" or e == "sve")  # what code for it may use
        flags, why = _isa_flags(spec, arch, cxx, ext)
        if flags is not None:
            t = target_for(spec.name, arch=arch, cxx=cxx, extensions=ext, flags=flags, chosen_by=chosen_by)
            log.info("symfuse: target %s", t.describe())
            return t
        if isa:
            raise ValueError(f"SYMFUSE_ISA={isa}: the compiler {cxx!r} cannot build or run {isa} code here: {why}")
        log.info("symfuse: %s is not usable with %s here (%s); trying the next ISA", spec.name, cxx, why)
    raise BuildError(f"the C++ compiler {cxx!r} cannot build even generic code here")
