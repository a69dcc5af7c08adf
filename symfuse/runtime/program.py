"""Running a compiled program: the native library, the host function, the library GEMMs.

Imports nothing from the compiler: it gets the host function's source, the library's path,
the kernels' arities and the prepared tensors, and puts them together once. A call is
then one Python function that binds the sizes and runs every step.
"""

from __future__ import annotations

import ctypes
import functools
import threading
import time
from collections.abc import Callable

import torch

from symfuse.runtime.call import MAX_ARGS
from symfuse.runtime.kv import run_paged_attention
from symfuse.runtime.lstm import run_lstm

DIV_BY_ZERO = -(2**63)  # the extent that marks an integer division by zero in the error slot (c.py)


class NativeIndexError(IndexError):
    """An out-of-range gather index a kernel reported."""


def slot_error(index: int, extent: int, what: str) -> Exception:
    """The error for what a kernel reported in its call's error slot: a negative extent stands
    for an index that may count from the end (valid in [extent, -extent)), `DIV_BY_ZERO` for an
    integer division by zero (of `index`)."""
    if extent == DIV_BY_ZERO:
        return ZeroDivisionError(f"integer division by zero (of {index}): {what}")
    valid = f"[{extent}, {-extent})" if extent < 0 else f"[0, {extent})"
    return NativeIndexError(f"index {index} is out of range {valid}: {what}")


class HostProgram:
    """What the CPU and GPU programs share: a generated host function (`run`, `run_timed`, in
    the namespace `_ns`, whose `now` is the clock `profile` reads) and per-thread workspaces."""

    workspaces: Workspaces
    _ns: dict

    workspace_high_water = property(lambda self: self.workspaces.high_water)
    workspace_bytes = property(lambda self: self.workspaces.held)

    @property
    def workspace_cap(self) -> int | None:
        return self.workspaces.cap

    @workspace_cap.setter
    def workspace_cap(self, nbytes: int | None) -> None:
        self.workspaces.cap = nbytes

    def release_workspace(self) -> int:
        """Drop every thread's workspace (the next call allocates afresh); returns the bytes freed."""
        return self.workspaces.release()

    def profile(self, inputs: list[torch.Tensor], binding: dict[str, int]) -> tuple[list[tuple[str, float]], float]:
        """One call: seconds inside each step's kernel and library calls, and the whole call's
        seconds (the difference is the host's overhead: sizes, views, allocation, ctypes)."""
        times: list[tuple[str, float]] = []

        def tick(step: str, seconds: float) -> None:
            times.append((step, seconds))

        with torch.no_grad():
            t0 = self._ns["now"]()
            self._run_timed(inputs, binding, tick)
            total = self._ns["now"]() - t0
        return times, total


class Program(HostProgram):
    def __init__(
        self,
        source: str,
        library: str,
        kernels: dict[str, int],
        n_symbols: int,
        tensors: dict[str, torch.Tensor],
        functions: dict[str, object],
        describe: Callable[[int], str],
        thresholds: dict[str, int] | None = None,
        caller: Callable | None = None,
        run: int = 0,
    ) -> None:
        """`caller`: `runtime.call`'s Kernel type, which the host code calls kernels through
        (else ctypes); `run`: the number of arguments of the library's `sf_run` (a whole call in
        C++, codegen/cpu/run.py), 0 where it has none."""
        self.source = source
        self.library = library
        lib = ctypes.CDLL(library)
        self._lib = lib
        self.thresholds = dict(thresholds or {})  # version switch points the host code reads at each call
        sym_t = ctypes.c_int64 * (n_symbols + 3)  # the symbols, then the call's error slot

        class Kernels:
            pass

        ks = Kernels()
        for name in sorted(kernels):
            f = getattr(lib, name)
            f.argtypes = [ctypes.c_void_p] * (kernels[name] + 1) + [ctypes.c_int64, ctypes.c_int64]
            f.restype = None
            setattr(ks, name, f)
        for name in ("sf_linear_rows", "sf_linear_rows_split", "sf_linear_rows_bf16", "sf_linear_rows_bf16_split"):
            if hasattr(lib, name):
                setattr(ks, name, linear_rows(lib, name))
        self.whole = bool(run)  # the library has sf_run
        if run:
            lib.sf_run.argtypes = [ctypes.c_void_p] * run
            lib.sf_run.restype = None
            ks.sf_run = lib.sf_run
        if hasattr(lib, "sf_lstm"):  # (G, W_hh, h, c, out, ld_out, T, B, H, reverse)
            lib.sf_lstm.argtypes = [ctypes.c_void_p] * 5 + [ctypes.c_int64] * 5
            lib.sf_lstm.restype = None
            ks.sf_lstm = lib.sf_lstm
            lib.sf_lstm_input.argtypes = (
                [ctypes.c_void_p, ctypes.c_int64] + [ctypes.c_void_p] * 3 + [ctypes.c_int64] * 3
            )
            lib.sf_lstm_input.restype = None
            ks.sf_lstm_input = lib.sf_lstm_input
        for name in ("sf_paged_attention", "sf_paged_attention_bf16"):  # (q, k, v, pools, table, lengths, out, dims)
            if hasattr(lib, name):
                getattr(lib, name).argtypes = [ctypes.c_void_p] * 9
                getattr(lib, name).restype = None
                setattr(ks, name, getattr(lib, name))
        if caller is not None:  # the same functions, called with less overhead (all take integers)
            for name, f in list(vars(ks).items()):
                if len(f.argtypes) <= MAX_ARGS:
                    setattr(ks, name, caller(ctypes.cast(f, ctypes.c_void_p).value, len(f.argtypes)))
        self.caller = caller  # kept: an artifact saves its file
        self.fast_calls = caller is not None

        def check(sym) -> None:
            """Raise the first out-of-range gather index (or integer division by zero) this
            call's kernels saw."""
            if sym[n_symbols + 2] >= 0:
                index, extent, site = sym[n_symbols], sym[n_symbols + 1], sym[n_symbols + 2]
                raise slot_error(index, extent, describe(site))

        self.workspaces = Workspaces()
        self.outputs = OutputStorages()

        ns = {
            "workspace": self.workspaces.get,
            "Sym": sym_t,
            "addressof": ctypes.addressof,
            "Int64s": lambda *values: (ctypes.c_int64 * len(values))(*values),
            "k": ks,
            "check": check,
            "empty_strided": self.outputs.empty_strided,
            "as_strided": torch.as_strided,
            "view": _view,
            "linear": _portable(torch.ops.mkldnn._linear_pointwise),
            "matmul": torch.matmul,
            "conv": _portable(torch.ops.mkldnn._convolution_pointwise),
            "sdpa": torch.nn.functional.scaled_dot_product_attention,
            "paged": functools.partial(run_paged_attention, ks),
            "lstm": functools.partial(run_lstm, project=getattr(ks, "sf_lstm_input", None)),
            "torch": torch,
            "now": time.perf_counter,
            **tensors,
            **addresses(tensors),
            **functions,
            **self.thresholds,
        }
        exec(compile(source, "<symfuse host>", "exec"), ns)  # noqa: S102
        self._ns = ns
        self.kernels = ks
        self._run = ns["run"]
        self._run_timed = ns["run_timed"]

    def release_workspace(self) -> int:
        """Drop every thread's workspace and the kept output storages (the next call allocates
        afresh); returns the bytes freed."""
        return super().release_workspace() + self.outputs.release()

    def set_threshold(self, name: str, value: int) -> None:
        """Move a version switch point (read by the host code at every call)."""
        if name not in self.thresholds:
            raise KeyError(f"no threshold {name!r}; this program has {', '.join(self.thresholds) or 'none'}")
        self.thresholds[name] = self._ns[name] = int(value)
        if name in self._ns.get("run_threshold_names", ()):  # what sf_run reads
            self._ns["run_thresholds"][self._ns["run_threshold_names"].index(name)] = int(value)

    def __call__(self, inputs: list[torch.Tensor], binding: dict[str, int], whole: bool = True) -> list[torch.Tensor]:
        """One call; `whole=False` runs it step by step even where the library's `sf_run` would
        take it whole (to compare the two)."""
        with torch.no_grad():
            return self._run(inputs, binding, whole=False) if not whole and self.whole else self._run(inputs, binding)


def addresses(tensors: dict[str, object]) -> dict[str, int]:
    """The address of each prepared tensor (a constant `c_x`, packed weights `p_w`) as the host
    code names it (`ac_x`, `ap_w`): they stay where they are for the program's life, so a call
    reads an integer instead of asking each tensor (65 ns a time, 63 times a bert-small call)."""
    return {f"a{k}": t.data_ptr() for k, t in tensors.items() if isinstance(t, torch.Tensor)}


def linear_rows(lib: ctypes.CDLL, name: str = "sf_linear_rows"):
    """A row GEMM of a built library (`sf_linear_rows`, `sf_linear_rows_bf16`), typed: called
    as (A, lda, W panels, bias, C, ldc, M, N, K, act), pointers as ints or None."""
    fn = getattr(lib, name)
    fn.argtypes = [ctypes.c_void_p, ctypes.c_int64] + [ctypes.c_void_p] * 3 + [ctypes.c_int64] * 5
    fn.restype = None
    return fn


class Workspaces:
    """One workspace per calling thread (a call's intermediates, packed by lifetime), kept for
    the thread's next call unless it is over the cap; on the program's device."""

    def __init__(self, device: str | torch.device = "cpu") -> None:
        self.device = device
        self._held: dict[int, torch.Tensor] = {}
        self._lock = threading.Lock()
        self.high_water = 0  # the largest workspace a call has needed, in bytes
        self.cap: int | None = None  # bytes a thread may keep between calls; None: no cap
        self.keep = True  # False while a call is captured into a CUDA graph: its memory is the graph's

    def get(self, nbytes: int) -> torch.Tensor:
        if not self.keep:
            with self._lock:
                self.high_water = max(self.high_water, nbytes)
            return torch.empty(max(nbytes, 64), dtype=torch.uint8, device=self.device)
        me = threading.get_ident()
        ws = self._held.get(me)
        if ws is None or ws.numel() < nbytes:
            ws = torch.empty(max(nbytes, 64), dtype=torch.uint8, device=self.device)
            with self._lock:
                self.high_water = max(self.high_water, nbytes)
                if self.cap is None or nbytes <= self.cap:
                    alive = {t.ident for t in threading.enumerate()}
                    for gone in [t for t in self._held if t not in alive]:
                        del self._held[gone]
                    self._held[me] = ws
                else:
                    self._held.pop(me, None)  # this call's buffer goes when the call ends
        return ws

    @property
    def held(self) -> int:
        """Bytes the threads' workspaces hold now."""
        return sum(ws.numel() for ws in list(self._held.values()))

    def release(self) -> int:
        with self._lock:
            freed = sum(ws.numel() for ws in self._held.values())
            self._held.clear()
        return freed


class OutputStorages:
    """The memory of a call's large outputs (`SMALL` bytes and up), taken again by a later call
    of the same size once the caller holds no tensor on it. A fresh allocation that large comes
    from the OS (glibc maps anything over 32 MiB afresh) and is faulted in page by page while a
    kernel writes it: a layer norm writing 100 MB ran at 22% of the copy bandwidth so, 98% on
    memory already mapped. One storage per size is kept, for the `SIZES` sizes used last."""

    SMALL = 1 << 20
    SIZES = 4

    def __init__(self) -> None:
        self._kept: dict[tuple[int, torch.dtype], torch.UntypedStorage] = {}  # in order of use, last last
        self._lock = threading.Lock()

    def empty_strided(self, shape: tuple, strides: tuple, dtype: torch.dtype) -> torch.Tensor:
        extent = 1 + sum((n - 1) * s for n, s in zip(shape, strides)) if all(shape) else 0
        key = (extent * dtype.itemsize, dtype)
        if key[0] < self.SMALL or _USE_COUNT is None:
            return torch.empty_strided(shape, strides, dtype=dtype)
        with self._lock:  # (the tensor is made under the lock: until then the storage looks free)
            kept = self._kept.pop(key, None)
            if kept is None or _USE_COUNT(kept._cdata) > 1:  # none, or the caller still holds the last one
                kept = torch.empty_strided(shape, strides, dtype=dtype).untyped_storage()
            self._kept[key] = kept
            while len(self._kept) > self.SIZES:
                del self._kept[next(iter(self._kept))]
            return torch.empty(0, dtype=dtype).set_(kept, 0, shape, strides)

    def release(self) -> int:
        with self._lock:
            freed = sum(st.nbytes() for st in self._kept.values())
            self._kept.clear()
        return freed


def onednn_lacks(dtype: torch.dtype) -> bool:
    """Whether oneDNN refuses `dtype` on this CPU (fp16 without AVX512-FP16 or AVX-NE-CONVERT,
    bf16 without AVX-512)."""
    if dtype == torch.float16:
        return not torch.ops.mkldnn._is_mkldnn_fp16_supported()
    if dtype == torch.bfloat16:
        return not torch.ops.mkldnn._is_mkldnn_bf16_supported()
    return False


def _portable(op: Callable) -> Callable:
    """oneDNN's `op` (linear or convolution: input, weight, bias, ...); where this CPU lacks
    fp16 or bf16 for it, a call in that type runs in fp32 (its weight is already fp32 where
    `reorder_weight` made it) and the result is narrowed back. Decided when a program is
    linked; where the CPU has both, `op` itself."""
    lacks = {dt for dt in (torch.float16, torch.bfloat16) if onednn_lacks(dt)}
    if not lacks:
        return op

    def call(x, w, b, *rest):
        if x.dtype not in lacks:
            return op(x, w, b, *rest)
        return op(x.float(), w.float(), None if b is None else b.float(), *rest).to(x.dtype)

    return call


# how many tensors and storage objects hold a storage's memory (torch's own, for its CUDA graph
# trees); without it every output is allocated afresh
_USE_COUNT = getattr(torch._C, "_storage_Use_Count", None)


def _view(t: torch.Tensor, sizes: tuple, strides: tuple, offset: int) -> torch.Tensor:
    """A strided view of a buffer, `offset` elements from the buffer's own start."""
    return t.as_strided(sizes, strides, t.storage_offset() + offset)


class ConvWeights:
    """Convolution weights channels-last (so oneDNN takes its NHWC path, on an NCHW program input
    too) and in oneDNN's blocked layout, each made at its first call, for that call's input size
    (another size still runs: oneDNN then reorders it as it does a plain weight). A plain weight
    is reordered inside every call, at any size (`symfuse bench --model resnet --profile`)."""

    def __init__(self, plain: dict[str, torch.Tensor]) -> None:
        self.plain, self.packed = plain, {}

    def __call__(self, name: str, x: torch.Tensor, padding: list, stride: list, dilation: list, groups: int):
        w = self.packed.get(name)
        if w is None:  # two threads may both reorder: same result
            w = self.plain[name].contiguous(memory_format=torch.channels_last)
            if not onednn_lacks(w.dtype):
                reorder = torch.ops.mkldnn._reorder_convolution_weight
                w = reorder(w, padding, stride, dilation, groups, list(x.shape))
            self.packed[name] = w
        return w


class OneDNNWeights(dict):
    """Linear weights in oneDNN's blocked layout, each reordered at its first use (`W[name]` in
    the host code): calls that all stay under a layer's switch point to symfuse's row kernel
    never pay for the reorder, nor hold the copy."""

    def __init__(self, plain: dict[str, torch.Tensor]) -> None:
        super().__init__()
        self.plain = plain

    def __missing__(self, name: str) -> torch.Tensor:
        w = self[name] = reorder_weight(self.plain[name])  # two threads may both reorder: same result
        return w


def reorder_weight(w: torch.Tensor) -> torch.Tensor:
    """A linear layer's weight in oneDNN's blocked layout, for every number of rows (in fp32
    where oneDNN lacks the weight's type on this CPU: `_portable` multiplies in fp32 there)."""
    return torch.ops.mkldnn._reorder_linear_weight((w.float() if onednn_lacks(w.dtype) else w).contiguous())
