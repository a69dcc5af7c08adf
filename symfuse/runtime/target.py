"""The CPU that generated code is built for, as data: what a kernel library needs to run.

A `Target` says what the compiler may use (its flags), how wide a vector is and how many
vector registers there are (hand-written kernels shape their tiles from these), the cache
sizes and core count (calibration and blocking read them) and which compiler builds the
code. It is part of every kernel-cache key, so a cache shared by two machines, or a saved
artifact, never hands one machine code built for another's instructions.

This module only describes targets and reads what Linux says of this CPU
(`cpu_runs`): a loaded artifact checks its kernels against it without a compiler.
Detecting the best target with probe programs is the compiler's (`codegen/cpu/target.py`).
"""

from __future__ import annotations

import hashlib
import os
import platform
from dataclasses import dataclass

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


def cpu_runs(target: Target) -> tuple[bool, str]:
    """Whether this CPU runs code built for `target` (its ISA and the extensions its flags
    enable) as Linux reports its features, and if not what it lacks."""
    arch = machine_arch()
    if target.arch != arch or target.isa not in ISAS:
        return False, f"is {arch}, not {target.arch}"
    feats = cpuinfo_features()
    needed = ISAS[target.isa].needs + tuple(e for e in target.extensions if e in EXTENSION_FLAGS)
    missing = [f for f in needed if not feats.get(f)]
    return not missing, f"lacks {', '.join(missing)}" if missing else ""


def machine_arch() -> str:
    m = platform.machine().lower()
    return {"amd64": "x86_64", "arm64": "aarch64"}.get(m, m)


def cache_sizes() -> tuple[int, int, int]:
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


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.lower().startswith(("model name", "cpu model", "hardware")):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or machine_arch()


def cpu_identity() -> str:
    """What tells this machine's CPU from another's: cpuinfo's model and feature lines."""
    try:
        with open("/proc/cpuinfo") as f:
            lines = [ln for ln in f if ln.lower().startswith(("model name", "flags", "features", "cpu part"))]
        return "".join(sorted(set(lines)))
    except OSError:
        return platform.platform() + platform.processor()


def machine_id() -> str:
    """A hash of this CPU's model and features: what measurements (switch points) belong to."""
    return hashlib.sha256(cpu_identity().encode()).hexdigest()[:12]


def cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def has_isa(spec: IsaSpec, arch: str, feats: dict[str, bool]) -> bool:
    return (spec.arch in ("any", arch)) and all(feats.get(f, False) for f in spec.needs)
