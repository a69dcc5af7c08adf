"""Detecting the target (`symfuse.runtime.target.Target`) generated code is built for.

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
import tempfile
from dataclasses import asdict

from symfuse.codegen.cpu.toolchain import compiler_version, run_program
from symfuse.errors import BuildError
from symfuse.runtime.target import (
    EXTENSION_FLAGS,
    ISAS,
    REPORTED,
    IsaSpec,
    Target,
    cache_sizes,
    cores,
    cpu_identity,
    cpu_name,
    cpu_runs,
    has_isa,
    machine_arch,
    machine_id,
)

log = logging.getLogger("symfuse")

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


def read_features(cxx: str) -> dict[str, bool]:
    ok, out = run_program(cxx, _FEATURES_SOURCE, ())
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
        return cpu_runs(target)
    return not missing, f"lacks {', '.join(missing)}" if missing else ""


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
    l1, l2, l3 = cache_sizes()
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
        cores(),
        cxx,
        compiler_version(cxx),
        cpu_name(),
        machine,
        chosen_by,
    )


def _isa_flags(spec: IsaSpec, arch: str, cxx: str, extensions: tuple[str, ...]) -> tuple[tuple[str, ...] | None, str]:
    """The first flag set of `spec` with which a vector multiply-add builds and runs here."""
    source = _CHECK_SOURCE % {"bytes": spec.vector_bytes, "lanes": spec.lanes}
    why = ""
    for alt in spec.flag_sets(arch):
        flags = alt + tuple(EXTENSION_FLAGS[e] for e in extensions if e in EXTENSION_FLAGS)
        ok, why = run_program(cxx, source, flags)
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
    ident = hashlib.sha256("\0".join([cpu_identity(), arch, cxx, version, isa, probe]).encode()).hexdigest()[:20]
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
                f"SYMFUSE_ISA={isa} asks for code this machine cannot run: its CPU ({cpu_name()}) {lacks}; "
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
