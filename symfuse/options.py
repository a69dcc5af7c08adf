"""The one options object; the only place environment variables are read."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# switch points between kernel versions (the host picks a version per call from a size)
SWITCH_KINDS = (
    "linear_rows", "linear_split", "linear_library", "linear_rows_bf16", "linear_split_bf16", "linear_library_bf16",
    "attention_keys", "attention_keys_library", "attention_keys_bf16", "attention_keys_library_bf16",
)  # fmt: skip
# how a kernel is built: how the bf16 row kernel multiplies, the steps of K in the row kernel's chunk
BUILD_KINDS = ("bf16_multiply", "row_chunk")
# every threshold can be set by hand; else it is modelled from the CPU, or measured once per machine (calibrate.py)
THRESHOLD_KINDS = SWITCH_KINDS + BUILD_KINDS


def split_kind(kind: str) -> str:
    """The switch point between the row kernel's two thread layouts that goes with a
    `linear_rows` or `linear_library` kind (`linear_rows_bf16` -> `linear_split_bf16`)."""
    return kind.replace("linear_rows", "linear_split").replace("linear_library", "linear_split")


def library_kind(rows_kind: str) -> str:
    """The switch point back from oneDNN to the row kernel that goes with a `linear_rows` kind
    (`linear_rows_bf16` -> `linear_library_bf16`)."""
    return rows_kind.replace("linear_rows", "linear_library")


def threshold_name(kind: str, shape: tuple[int, ...]) -> str:
    """The host code's name for the switch point of `kind` at `shape` (`th_linear_split_256_768`)."""
    return f"th_{kind}_{'_'.join(map(str, shape))}"


def rows_kind(library: str) -> str:
    """The `linear_rows` kind a `linear_library` kind goes with (the inverse of `library_kind`)."""
    return library.replace("linear_library", "linear_rows")


LIBRARY_LIMITS = ("ONEDNN_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS")


@dataclass(frozen=True)
class Options:
    # cpu: generated C++ and library GEMMs | triton: Triton kernels and cuBLAS (the GPU backend;
    # on a CPU device its kernels run in Triton's interpreter) | reference: each op through torch
    backend: str = "cpu"
    cache_dir: str = ""  # compiled kernels, keyed by a content hash; "" means the default
    dump_dir: str = ""  # when set, every stage is written here (graph, TEs, plan, C++, host code)
    cxx: str = "g++"  # the C++ compiler that builds generated code
    isa: str = ""  # "" detects the best this machine runs; generic | avx2 | avx512 | neon asks for one
    machine_dir: str = ""  # the detected target and measured thresholds; "" means the default
    thresholds: tuple[tuple[str, int], ...] = ()  # (kind, value): set a version switch point by hand
    # the libraries' own ISA limits (oneDNN, ATen, MKL) where set: switch points measured against
    # a library held to AVX2 do not hold for the same library at full speed
    library_limits: tuple[tuple[str, str], ...] = ()
    # build the generated C++ with AddressSanitizer and UndefinedBehaviorSanitizer (a test
    # mode: the process must start with the sanitizer runtime preloaded, see docs/reliability.md)
    sanitize: bool = False
    device: str = "cpu"  # cpu | cuda | cuda:N: where the compiled program runs and its weights live
    # fp32 | bf16 (cpu and GPU) | fp16 (GPU): half-precision storage, float32 math and accumulation
    precision: str = "fp32"
    cuda_graphs: int = 16  # GPU: CUDA graphs kept (one per binding seen twice, least recently used dropped); 0: none
    # switch points not yet measured on this machine: "model" takes them from a model of the
    # CPU (no wait), "measure" times the versions now and keeps the values (`symfuse tune`)
    switch_points: str = "model"

    @staticmethod
    def from_env(**overrides) -> Options:
        env = {field: read(os.environ[name]) for name, (field, read, _) in ENVIRONMENT.items() if name in os.environ}
        env["library_limits"] = tuple((v, os.environ[v]) for v in LIBRARY_LIMITS if os.environ.get(v))
        given = {k: v for k, v in overrides.items() if v is not None}
        if isinstance(given.get("thresholds"), (dict, str)):
            given["thresholds"] = parse_thresholds(given["thresholds"], "thresholds")
        env.update(given)
        if "backend" not in given and str(env.get("device", "cpu")).startswith("cuda"):
            env["backend"] = "triton"
        opts = Options(**env)
        if opts.switch_points not in ("model", "measure"):
            raise ValueError(f"switch_points must be 'model' or 'measure', got {opts.switch_points!r}")
        if opts.precision not in ("fp32", "fp16", "bf16"):
            raise ValueError(f"precision must be 'fp32', 'fp16' or 'bf16', got {opts.precision!r}")
        if opts.backend not in ("cpu", "triton", "reference"):
            raise ValueError(f"unknown backend {opts.backend!r}; symfuse has 'cpu', 'triton' and 'reference'")
        if opts.device.startswith("cuda") and opts.backend == "cpu":
            raise ValueError(f"device={opts.device!r} runs the 'triton' backend, not 'cpu'")
        if opts.precision == "fp16" and opts.backend != "triton":
            raise ValueError(
                f"precision='fp16' needs the GPU backend (device='cuda'); the {opts.backend} backend has "
                + ("'fp32' and 'bf16'" if opts.backend == "cpu" else "'fp32' only")
            )
        if opts.precision == "bf16" and opts.backend == "reference":
            raise ValueError("precision='bf16' needs the 'cpu' or 'triton' backend; the reference backend is fp32")
        return opts

    @property
    def kernel_cache(self) -> str:
        return self.cache_dir or os.path.join(os.path.expanduser("~"), ".cache", "symfuse", "kernels")

    @property
    def machine_cache(self) -> str:
        return self.machine_dir or os.path.join(os.path.expanduser("~"), ".cache", "symfuse", "machine")


# every environment variable symfuse reads, and only here: name -> (the `Options` field it sets,
# how its text is read, what it does); docs/reference.md is generated from this table
ENVIRONMENT: dict[str, tuple[str, Callable[[str], Any], str]] = {
    "SYMFUSE_CACHE_DIR": ("cache_dir", str, "the kernel cache (default `~/.cache/symfuse/kernels`)"),
    "SYMFUSE_MACHINE_DIR": ("machine_dir", str, "detected targets and measured switch points "
                            "(default `~/.cache/symfuse/machine`)"),
    "SYMFUSE_DUMP_DIR": ("dump_dir", str, "write every stage (graph, TEs, plan, C++, host code) to this folder"),
    "CXX": ("cxx", str, "the C++ compiler that builds generated code (default `g++`)"),
    "SYMFUSE_ISA": ("isa", lambda v: v.strip().lower(), "build for this ISA (`generic`, `avx2`, `avx512`, `neon`) "
                    "instead of the best this machine runs"),
    "SYMFUSE_THRESHOLDS": ("thresholds", lambda v: parse_thresholds(v, "SYMFUSE_THRESHOLDS"),
                           "switch points set by hand, `kind=value,...` (`linear_rows=48`)"),
    "SYMFUSE_SWITCH_POINTS": ("switch_points", lambda v: v.strip().lower(), "`model` (default): switch points not "
                              "measured on this machine come from a model of its CPU; `measure`: time them now, "
                              "once, and keep them (what `symfuse tune` does)"),
    "SYMFUSE_SANITIZE": ("sanitize", lambda v: v not in ("", "0"), "build generated C++ with AddressSanitizer and "
                         "UBSan (a test mode, `docs/reliability.md`)"),
    "SYMFUSE_CUDA_GRAPHS": ("cuda_graphs", int, "GPU: CUDA graphs kept, one per binding (default 16; 0: none)"),
}  # fmt: skip


def parse_thresholds(spec: str | dict, origin: str) -> tuple[tuple[str, int], ...]:
    """`"linear_rows=0,attention_keys=64"` or a dict of the same: switch points set by hand."""
    items = spec.items() if isinstance(spec, dict) else [p.split("=", 1) for p in spec.split(",") if p.strip()]
    out = []
    for item in items:
        if len(item) != 2:
            raise ValueError(f"{origin}: expected kind=rows, e.g. linear_rows=48; got {'='.join(item)!r}")
        kind, value = item[0].strip(), str(item[1]).strip()
        if kind not in THRESHOLD_KINDS:
            raise ValueError(f"{origin}: unknown threshold {kind!r}; symfuse has {', '.join(THRESHOLD_KINDS)}")
        if not value.isdigit():
            raise ValueError(f"{origin}: {kind} must be a whole number >= 0, got {value!r}")
        out.append((kind, int(value)))
    return tuple(out)
