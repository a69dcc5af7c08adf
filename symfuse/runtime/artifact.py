"""Saved artifacts: a compiled model in a folder that runs without its Python code.

`CompiledModule.save(path)` writes a folder; `read(path)` checks it and reads it back, and
`symfuse.load(path)` (`symfuse/artifact.py`) makes a module of it that checks its inputs,
runs and explains itself as the compiled one did, without torch.export, the model's code,
`transformers` or, where the saved kernels run on this CPU, any module of the compiler:

    manifest.json        format, symfuse and torch versions, target, and every file's
                         size and SHA-256 (checked on load: a truncated or altered file is
                         an error, never a crash or a wrong answer)
    module.pkl           what a call needs: the input signature and guard, the host code
                         and its tables, the switch points: plain data of the runtime's
                         own types, read back by an unpickler that builds symfuse, sympy
                         and a few builtin types only
    graph.pkl            the graph and its shape facts, read only when asked for (explain,
                         a rebuild for another CPU)
    weights.safetensors  the model's constants (memory-mapped on load: processes that load
                         the same artifact share the pages)
    packed.safetensors   the linear weights packed for the row kernel's tile
    kernels.cpp          the generated C++ and
    kernels.so           the library built from it for the saved target
    caller<suffix>.so    the kernel caller for the saving Python (optional)

On a machine whose CPU cannot run the saved target's instructions, `load` rebuilds the
kernels for its own target from the saved graph (a C++ compiler is needed then; without one
it says what was saved and what this machine lacks). Switch points measured on another
machine are measured again, once, for this one.
"""

from __future__ import annotations

import datetime
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
import sysconfig
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.utils._pytree as pytree

from symfuse.runtime.call import caller_path, load_caller
from symfuse.runtime.switches import Threshold
from symfuse.runtime.target import Target
from symfuse.version import __version__

log = logging.getLogger("symfuse")

# bump when the layout or the host-kernel contract changes (2: per-call error slot; 3: symbols by
# address; 4: the run-time state apart from the graph, the kernel caller saved)
FORMAT = 4
FILES = ("module.pkl", "graph.pkl", "weights.safetensors", "packed.safetensors", "kernels.cpp", "kernels.so")
# optional: the kernel caller built for the saving Python
CALLER = "caller" + (sysconfig.get_config_var("EXT_SUFFIX") or ".so")


class ArtifactError(ValueError):
    """An artifact that cannot be loaded here, and why."""


def file_sha256(path: str) -> str:
    """A file's SHA-256, read in blocks (a library's sidecar, an artifact's manifest)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 24), b""):
            h.update(block)
    return h.hexdigest()


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
    t0 = time.perf_counter()
    captured = module.captured
    graph = captured.graph
    weights = {v.name: t for v, t in graph.constants.items()}
    names = {id(t): k for k, t in weights.items()}
    extra: dict[str, torch.Tensor] = {}
    runtime = {  # what a call needs: the run-time module's own types and plain data
        "signature": {**vars(module.signature), "out_spec": encode_spec(module.signature.out_spec)},
        "guard": module.guard_spec,
        "host": native.host,
        "gathers": native.gathers,
        "tile": asdict(native.tile),
        "thresholds": {k: asdict(v) for k, v in native.thresholds.items()},
        "symbols": module.symbols,
    }
    compiler = {"graph": graph, "store": captured.store, "declared": captured.declared, "notes": captured.notes}
    pickles = {}
    for name, state in (("module.pkl", runtime), ("graph.pkl", compiler)):
        buf = io.BytesIO()
        _Pickler(buf, names, extra).dump(state)
        pickles[name] = buf.getvalue()
    caller = caller_path(native.program.caller)
    parent = os.path.dirname(os.path.abspath(path))
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".symfuse-save-", dir=parent)  # written whole, then renamed into place
    try:
        files = {}
        for name, data in pickles.items():
            with open(os.path.join(tmp, name), "wb") as f:
                f.write(data)
        files["weights.safetensors"] = write_safetensors(os.path.join(tmp, "weights.safetensors"), {**weights, **extra})
        packed = {k: native.program._ns[k] for k in native.host.panels}
        files["packed.safetensors"] = write_safetensors(os.path.join(tmp, "packed.safetensors"), packed)
        with open(os.path.join(tmp, "kernels.cpp"), "w") as f:
            f.write(native.gen.source)
        shutil.copyfile(native.program.library, os.path.join(tmp, "kernels.so"))
        saved = list(FILES)
        if caller:  # the kernel caller for this Python: a load by the same Python needs no compiler
            shutil.copyfile(caller, os.path.join(tmp, CALLER))
            saved.append(CALLER)
        manifest = {
            "format": FORMAT,
            "symfuse": __version__,
            "torch": torch.__version__,
            "python": platform.python_version(),
            "created": datetime.datetime.now().isoformat(timespec="seconds"),
            "model": graph.name,
            "inputs": list(module.signature.tensor_names),
            "symbols": list(module.symbols),
            "target": asdict(native.target),
            "files": {
                name: {
                    "bytes": os.path.getsize(os.path.join(tmp, name)),
                    "sha256": files.get(name) or file_sha256(os.path.join(tmp, name)),
                }
                for name in saved
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

    names = list(FILES) + [n for n in manifest["files"] if n not in FILES]  # and the optional ones it lists
    with ThreadPoolExecutor(max_workers=min(len(names), os.cpu_count() or 1)) as pool:
        problems = [p for p in pool.map(check, names) if p]
    if problems:
        raise ArtifactError(f"{path}: " + "; ".join(problems))
    return time.perf_counter() - t0


@dataclass
class Saved:
    """An artifact read back, before anything is built or linked: its manifest, tensors and
    run-time state; `compiler_state()` reads the graph and its shape facts (explain, rebuilds)."""

    path: str
    manifest: dict
    weights: dict[str, torch.Tensor]
    packed: dict[str, torch.Tensor]
    state: dict
    seconds: dict[str, float]

    @property
    def target(self) -> Target:
        return Target(**{k: tuple(v) if isinstance(v, list) else v for k, v in self.manifest["target"].items()})

    @property
    def thresholds(self) -> dict[str, Threshold]:
        saved = self.state["thresholds"].items()
        return {k: Threshold(v["kind"], tuple(v["shape"]), v["value"], v["source"]) for k, v in saved}

    def caller(self):
        """The saved kernel caller where this Python can load it, else None (ctypes)."""
        path = os.path.join(self.path, CALLER)
        if not os.path.exists(path):
            return None
        try:
            return load_caller(path)
        except (ImportError, OSError) as e:
            log.info("symfuse: calling kernels through ctypes (the saved kernel caller did not load: %s)", e)
            return None

    def compiler_state(self) -> dict:
        return _unpickle(self.path, "graph.pkl", self.weights)


def _unpickle(path: str, name: str, tensors: dict[str, torch.Tensor]) -> dict:
    try:
        with open(os.path.join(path, name), "rb") as f:
            return _Unpickler(f, tensors).load()
    except ArtifactError:
        raise
    except Exception as e:  # noqa: BLE001 - a file that passed its hash but does not unpickle here
        raise ArtifactError(f"{path}: {name} cannot be read by this symfuse ({type(e).__name__}: {e})") from None


def read(path: str) -> Saved:
    """Check and read the artifact in folder `path` (tensors memory-mapped); builds nothing."""
    seconds: dict[str, float] = {}
    manifest = read_manifest(path)
    seconds["verify (read and hash every file)"] = verify(path, manifest)
    t0 = time.perf_counter()
    weights = read_safetensors(os.path.join(path, "weights.safetensors"))
    packed = read_safetensors(os.path.join(path, "packed.safetensors"))
    state = _unpickle(path, "module.pkl", weights)
    seconds["read host code and map weights"] = time.perf_counter() - t0
    return Saved(path, manifest, weights, packed, state, seconds)
