"""Saved artifacts: a compiled model in a folder that runs without its Python code.

`CompiledModule.save(path)` writes a folder; `symfuse.load(path)` reads it back into a module
that checks its inputs, runs and explains itself as the compiled one did, without
torch.export, the model's code or `transformers`:

    manifest.json        format, symfuse and torch versions, target, and every file's
                         size and SHA-256 (checked on load: a truncated or altered file is
                         an error, never a crash or a wrong answer)
    module.pkl           the graph and its shape facts, the host code and its tables: plain
                         data, read back by an unpickler that builds symfuse, sympy and a
                         few builtin types only
    weights.safetensors  the model's constants (memory-mapped on load: processes that load
                         the same artifact share the pages)
    packed.safetensors   the linear weights packed for the row kernel's tile
    kernels.cpp          the generated C++ and
    kernels.so           the library built from it for the saved target

On a machine whose CPU cannot run the saved target's instructions, `load` rebuilds the
kernels for its own target from the saved graph (a C++ compiler is needed then; without one
it says what was saved and what this machine lacks). Switch points measured on another
machine are measured again, once, for this one.
"""

from __future__ import annotations

import datetime
import functools
import hashlib
import io
import json
import logging
import os
import pickle
import platform
import shutil
import struct
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, replace
from typing import Any

import torch
import torch.utils._pytree as pytree

from symfuse.codegen.cpu.build import file_sha256, kernel_caller

log = logging.getLogger("symfuse")

FORMAT = 3  # bump when the layout or the host-kernel contract changes (2: per-call error slot; 3: symbols by address)
FILES = ("module.pkl", "weights.safetensors", "packed.safetensors", "kernels.cpp", "kernels.so")


class ArtifactError(ValueError):
    """An artifact that cannot be loaded here, and why."""


# -- safetensors, written with every tensor 64-byte aligned in the mapped file ---------------
_DTYPES = {
    torch.float32: "F32",
    torch.float64: "F64",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.bool: "BOOL",
}


def write_safetensors(path: str, tensors: dict[str, torch.Tensor]) -> str:
    """Write `tensors` in the safetensors format and return the file's SHA-256. The header is
    padded so the data starts at a multiple of 64 bytes, and tensors whose size is a multiple
    of 64 bytes come first, so vector loads from the mapped file stay aligned."""
    flat = {k: t.detach().contiguous().cpu() for k, t in tensors.items()}
    order = sorted(flat, key=lambda k: ((flat[k].numel() * flat[k].element_size()) % 64 != 0, k))
    header: dict[str, Any] = {}
    offset = 0
    for k in order:
        t = flat[k]
        if t.dtype not in _DTYPES:
            raise ArtifactError(f"cannot save tensor {k!r} of dtype {t.dtype}")
        n = t.numel() * t.element_size()
        header[k] = {"dtype": _DTYPES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + n]}
        offset += n
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-(8 + len(head)) % 64)
    digest = hashlib.sha256()
    with open(path, "wb") as f:
        for chunk in (struct.pack("<Q", len(head)), head):
            f.write(chunk)
            digest.update(chunk)
        for k in order:
            data = memoryview(flat[k].reshape(-1).view(torch.uint8).numpy())
            f.write(data)
            digest.update(data)
    return digest.hexdigest()


def read_safetensors(path: str) -> dict[str, torch.Tensor]:
    """The tensors of a safetensors file, memory-mapped (copy-on-write) by the safetensors library."""
    from safetensors import safe_open

    with safe_open(path, framework="pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 - safe_open has no __iter__


# -- the output structure, without the classes of the model's library -------------------------
class Record(dict):
    """Stands in for an output class whose library is not imported in this process (a
    `transformers` ModelOutput, say): keys, attributes and positions as that class has them."""

    type_name = "Record"

    def __getattr__(self, name: str):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(f"{self.type_name} has no field {name!r}") from None

    def __getitem__(self, key):
        if isinstance(key, (int, slice)):
            return self.to_tuple()[key]
        return super().__getitem__(key)

    def to_tuple(self) -> tuple:
        return tuple(self.values())

    def __repr__(self) -> str:
        return f"{self.type_name}({', '.join(f'{k}=...' for k in self)})"


def _record_unflatten(values, context):
    name, keys = context
    r = Record(zip(keys, values))
    r.type_name = name
    return r


pytree.register_pytree_node(Record, lambda r: (list(r.values()), (r.type_name, list(r.keys()))), _record_unflatten)


def encode_spec(spec: pytree.TreeSpec) -> Any:
    """A pytree spec as plain data: None for a leaf, else its type's import path, context, children."""
    if spec.is_leaf():
        return None
    ctx = spec.context
    if isinstance(ctx, type):
        ctx = {"type": f"{ctx.__module__}:{ctx.__qualname__}"}
    elif ctx is not None and not (isinstance(ctx, (list, tuple)) and all(isinstance(c, (str, int)) for c in ctx)):
        raise ArtifactError(f"cannot save the model's output structure: {spec.type.__qualname__} context {ctx!r}")
    return {
        "type": f"{spec.type.__module__}:{spec.type.__qualname__}",
        "context": list(ctx) if isinstance(ctx, tuple) else ctx,
        "children": [encode_spec(c) for c in spec.children()],
    }


def _imported(path: str):
    """The class at `module:qualname` if its module is already imported (never imports one)."""
    module, _, qual = path.partition(":")
    obj = sys.modules.get(module)
    for part in qual.split("."):
        obj = getattr(obj, part, None)
    return obj


def decode_spec(enc: Any) -> pytree.TreeSpec:
    if enc is None:
        return pytree.treespec_leaf()
    children = [decode_spec(c) for c in enc["children"]]
    ctx = enc["context"]
    if isinstance(ctx, dict):
        ctx = _imported(ctx["type"])
    cls = _imported(enc["type"])
    if cls is None or cls not in pytree.SUPPORTED_NODES or (isinstance(enc["context"], dict) and ctx is None):
        keys = ctx if isinstance(ctx, list) and all(isinstance(k, str) for k in ctx) else None
        if keys is None:
            raise ArtifactError(f"the model's output type {enc['type']} is not importable here")
        return pytree.TreeSpec(Record, (enc["type"].rpartition(":")[2], keys), children)
    return pytree.TreeSpec(cls, ctx, children)


# -- pickling the graph with its tensors kept apart --------------------------------------------
class _Pickler(pickle.Pickler):
    def __init__(self, f, names: dict[int, str], extra: dict[str, torch.Tensor]) -> None:
        super().__init__(f, protocol=4)
        self.names, self.extra = names, extra

    def persistent_id(self, obj):
        if isinstance(obj, torch.Tensor):
            key = self.names.get(id(obj))
            if key is None:
                key = self.names[id(obj)] = f"extra.{len(self.extra)}"
                self.extra[key] = obj
            return ("tensor", key)
        return None


# what module.pkl may build: symfuse's own types, sympy's, torch's dtypes and a few builtins
_SAFE_MODULES = ("symfuse.", "sympy.", "mpmath.")
_SAFE_NAMES = {
    ("builtins", n)
    for n in ("dict", "list", "tuple", "set", "frozenset", "int", "float", "str", "bool", "complex", "slice", "getattr")
} | {("collections", "OrderedDict"), ("copyreg", "_reconstructor"), ("builtins", "object"), ("torch", "dtype")}


class _Unpickler(pickle.Unpickler):
    def __init__(self, f, tensors: dict[str, torch.Tensor]) -> None:
        super().__init__(f)
        self.tensors = tensors

    def persistent_load(self, pid):
        kind, key = pid
        if kind != "tensor" or key not in self.tensors:
            raise ArtifactError(f"module.pkl refers to a tensor {key!r} the weights do not hold")
        return self.tensors[key]

    def find_class(self, module: str, name: str):
        if module.startswith(_SAFE_MODULES) or (module, name) in _SAFE_NAMES:
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise ArtifactError(f"module.pkl asks for {module}.{name}, which a symfuse artifact never holds")


# -- save ---------------------------------------------------------------------------------------
def save(module, path: str) -> str:
    """Write `module` (a `CompiledModule` on the cpu backend) to the folder `path`."""
    native = module.native
    if native is None:
        raise ArtifactError("only a module compiled with the cpu backend can be saved (this one is 'reference')")
    from symfuse import __version__

    t0 = time.perf_counter()
    graph, captured = module.graph, module.captured
    weights = {v.name: t for v, t in graph.constants.items()}
    names = {id(t): k for k, t in weights.items()}
    extra: dict[str, torch.Tensor] = {}
    state = {
        "graph": graph,
        "store": module.store,
        "declared": captured.declared,
        "input_names": captured.input_names,
        "fixed": captured.fixed,
        "notes": captured.notes,
        "out_spec": encode_spec(captured.out_spec),
        "guard": module.guard_spec,
        "host": native.host,
        "gathers": native.gathers,
        "tile": asdict(native.tile),
        "thresholds": {k: asdict(v) for k, v in native.thresholds.items()},
    }
    buf = io.BytesIO()
    _Pickler(buf, names, extra).dump(state)
    parent = os.path.dirname(os.path.abspath(path))
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".symfuse-save-", dir=parent)  # written whole, then renamed into place
    try:
        files = {}
        with open(os.path.join(tmp, "module.pkl"), "wb") as f:
            f.write(buf.getvalue())
        files["weights.safetensors"] = write_safetensors(os.path.join(tmp, "weights.safetensors"), {**weights, **extra})
        packed = {k: native.program._ns[k] for k in native.host.panels}
        files["packed.safetensors"] = write_safetensors(os.path.join(tmp, "packed.safetensors"), packed)
        with open(os.path.join(tmp, "kernels.cpp"), "w") as f:
            f.write(native.gen.source)
        shutil.copyfile(native.program.library, os.path.join(tmp, "kernels.so"))
        manifest = {
            "format": FORMAT,
            "symfuse": __version__,
            "torch": torch.__version__,
            "python": platform.python_version(),
            "created": datetime.datetime.now().isoformat(timespec="seconds"),
            "model": graph.name,
            "inputs": [v.name for v in captured.declared],
            "symbols": list(module.store.symbols),
            "target": asdict(native.target),
            "files": {
                name: {
                    "bytes": os.path.getsize(os.path.join(tmp, name)),
                    "sha256": files.get(name) or file_sha256(os.path.join(tmp, name)),
                }
                for name in FILES
            },
        }
        with open(os.path.join(tmp, "manifest.json"), "w") as f:
            json.dump(manifest, f, indent=1)
        if os.path.isdir(path):
            if not os.path.exists(os.path.join(path, "manifest.json")) and os.listdir(path):
                raise ArtifactError(f"{path} exists and is not a symfuse artifact: not overwriting it")
            shutil.rmtree(path)
        os.replace(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    size = sum(v["bytes"] for v in manifest["files"].values())
    log.info("symfuse: saved %s to %s (%.0f MB) in %.2fs", graph.name, path, size / 1e6, time.perf_counter() - t0)
    return path


# -- load -------------------------------------------------------------------------------------
def read_manifest(path: str) -> dict:
    mpath = os.path.join(path, "manifest.json")
    if not os.path.isdir(path):
        raise ArtifactError(f"{path}: no such artifact folder")
    try:
        with open(mpath) as f:
            manifest = json.load(f)
    except FileNotFoundError:
        raise ArtifactError(f"{path} is not a symfuse artifact: it has no manifest.json") from None
    except (OSError, ValueError) as e:
        raise ArtifactError(f"{path}: manifest.json is unreadable ({e})") from None
    fmt = manifest.get("format")
    if fmt != FORMAT:
        by = f"symfuse {manifest.get('symfuse', '?')}"
        if isinstance(fmt, int) and fmt > FORMAT:
            raise ArtifactError(
                f"{path} was written by {by} in artifact format {fmt}; this symfuse reads format {FORMAT}: "
                "upgrade symfuse to load it"
            )
        raise ArtifactError(
            f"{path} was written by {by} in artifact format {fmt}, which this symfuse (format {FORMAT}) no longer "
            "reads: compile the model again and save it"
        )
    return manifest


def verify(path: str, manifest: dict) -> float:
    """Check every file's size and SHA-256 against the manifest (in parallel); the seconds spent."""
    t0 = time.perf_counter()

    def check(name: str) -> str | None:
        want = manifest["files"].get(name)
        fpath = os.path.join(path, name)
        if want is None:
            return f"the manifest does not list {name}"
        if not os.path.exists(fpath):
            return f"{name} is missing"
        size = os.path.getsize(fpath)
        if size != want["bytes"]:
            return f"{name} is {size} bytes, the manifest says {want['bytes']} (truncated or replaced)"
        if file_sha256(fpath) != want["sha256"]:
            return f"{name} does not match its SHA-256 in the manifest (altered or damaged)"
        return None

    with ThreadPoolExecutor(max_workers=min(len(FILES), os.cpu_count() or 1)) as pool:
        problems = [p for p in pool.map(check, FILES) if p]
    if problems:
        raise ArtifactError(f"{path}: " + "; ".join(problems))
    return time.perf_counter() - t0


def load(path: str, **options):
    """The module saved in folder `path`; `options` as for `symfuse.compile` (cxx, isa,
    cache_dir, machine_dir, thresholds)."""
    from symfuse.api import CompiledModule
    from symfuse.codegen.compile import Backend, compile_program, generate, link, switch_points
    from symfuse.codegen.cpu.calibrate import Threshold, by_hand
    from symfuse.codegen.cpu.gemm import Tile
    from symfuse.codegen.cpu.target import Target, detect, machine_id
    from symfuse.frontend.torch_export import Captured
    from symfuse.options import Options

    opts = Options.from_env(**options)
    if opts.backend != "cpu":
        raise ArtifactError(f"an artifact runs on the cpu backend, not {opts.backend!r}")
    seconds: dict[str, float] = {}
    manifest = read_manifest(path)
    seconds["verify (read and hash every file)"] = verify(path, manifest)
    t0 = time.perf_counter()
    tensors = read_safetensors(os.path.join(path, "weights.safetensors"))
    packed = read_safetensors(os.path.join(path, "packed.safetensors"))
    try:
        with open(os.path.join(path, "module.pkl"), "rb") as f:
            state = _Unpickler(f, tensors).load()
    except ArtifactError:
        raise
    except Exception as e:  # noqa: BLE001 - a file that passed its hash but does not unpickle here
        raise ArtifactError(f"{path}: module.pkl cannot be read by this symfuse ({type(e).__name__}: {e})") from None
    graph, store = state["graph"], state["store"]
    captured = Captured(
        graph,
        store,
        state["declared"],
        state["input_names"],
        state["fixed"],
        decode_spec(state["out_spec"]),
        0.0,
        state["notes"],
    )
    seconds["read graph and map weights"] = time.perf_counter() - t0
    saved = Target(**{k: tuple(v) if isinstance(v, list) else v for k, v in manifest["target"].items()})
    here = _local_target(saved, opts)
    if here is not None:  # this CPU cannot run the saved code (or another ISA was asked for): build for it
        log.info(
            "symfuse: %s was built for %s on %s; building its kernels for %s here",
            path,
            saved.isa,
            saved.cpu,
            here.isa,
        )
        native = compile_program(graph, store, replace(opts, precision=state["host"].precision), target=here)
        native.seconds, native.artifact = {**seconds, **native.seconds}, path
        return CompiledModule(captured, opts, native=native, guard=state["guard"])
    t0 = time.perf_counter()
    host = state["host"]
    thresholds = {
        k: Threshold(v["kind"], tuple(v["shape"]), v["value"], v["source"]) for k, v in state["thresholds"].items()
    }
    if thresholds and saved.machine != machine_id():  # measured on another CPU: measure for this one
        try:
            linear_bytes = sum(p.numel() * p.element_size() for p in packed.values())
            thresholds = switch_points(
                host.thresholds, detect(opts.cxx, saved.isa, opts.machine_cache), opts, linear_bytes
            )
        except Exception as e:  # noqa: BLE001 - no compiler to measure with: keep the saved values, say so
            log.warning("symfuse: keeping the switch points measured on %s (%s)", saved.cpu, e)
            thresholds = {
                k: Threshold(v.kind, v.shape, v.value, f"measured on {saved.cpu}, where the artifact was saved")
                for k, v in thresholds.items()
            }
    elif opts.thresholds:  # set by hand now
        manual = dict(opts.thresholds)
        thresholds = {k: by_hand(v.kind, v.shape, manual) or v for k, v in thresholds.items()}
    seconds["switch points"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    tile = Tile(**state["tile"])
    consts = {v.name: tensors[v.name] for v in graph.constants}
    regenerate = functools.cache(
        lambda: generate(graph, store, saved, host.precision, host.bf16_multiply, host.row_chunk)
    )  # for explain, and kernels run by torch
    step = lambda name: regenerate().step(name)  # noqa: E731
    program = link(
        host,
        os.path.join(path, "kernels.so"),
        len(store.symbols),
        consts,
        packed,
        state["gathers"],
        thresholds,
        step,
        kernel_caller(saved, opts),
    )
    seconds["link (load the library, host code)"] = time.perf_counter() - t0
    native = Backend(program, saved, thresholds, host, state["gathers"], tile, True, seconds, None, regenerate, path)
    return CompiledModule(captured, opts, native=native, guard=state["guard"])


def _local_target(saved, opts):
    """None when the saved library runs here as it is; else the target to build for here."""
    from symfuse.codegen.cpu.target import detect, runs_here

    if opts.isa and opts.isa != saved.isa:
        return detect(opts.cxx, opts.isa, opts.machine_cache)
    ok, lacks = runs_here(saved, opts.cxx, opts.machine_cache)
    if ok:
        return None
    try:
        return detect(opts.cxx, "", opts.machine_cache)
    except Exception as e:  # noqa: BLE001 - no compiler: say what was saved and what this machine is
        raise ArtifactError(
            f"the artifact's kernels were built for {saved.isa} ({saved.arch}, {' '.join(saved.flags)}) on "
            f"{saved.cpu}; this machine {lacks}, so they must be rebuilt here, which needs a C++ compiler: {e}"
        ) from None
