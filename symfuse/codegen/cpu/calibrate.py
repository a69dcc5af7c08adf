"""Switch points between kernel versions, measured on the machine that runs them.

The host picks a version per call from a size: symfuse's row GEMM or oneDNN from the rows
of a linear layer; the merged attention kernel, or torch's fused attention (or the three
steps) from the number of keys. Where one version overtakes the other depends on the CPU,
so each switch point is measured the first time a target needs it and cached in the
machine folder (`~/.cache/symfuse/machine`), one file per target, CPU and version of the
kernels:

- a linear layer `[K -> N]`: symfuse's row kernel and oneDNN on the same rows (in float32,
  or both in bfloat16 for `precision="bf16"`), each call after as many bytes as the model's
  other weights have passed through the caches (`weight_traffic`): weights rotated through
  more memory than the L3 cache when the model's weights do not fit it (they stream from
  memory when a model runs), else a pass over that many bytes, so that the layer's weights
  are read from where the model leaves them (oneDNN suffers more from weights pushed out to
  the far end of the L3 cache than the row kernel, which walks them in order: at 64 rows of
  a 256->1024 layer, after a 12 MiB pass oneDNN took 1.43x its time after a 4 MiB one, the
  row kernel 1.12x); first the row
  kernel with its threads on the weights' panels against its threads on the rows
  (`linear_split`, `linear_split_bf16`), which the row kernel is then timed as; then, above
  the row kernel's switch point (`linear_rows`), oneDNN against the row kernel once more
  (`linear_library`, `linear_library_bf16`): on some CPUs the library wins a band of middle
  sizes only, so the row kernel runs again above the band, up to the largest size
  measured (4096 rows); oneDNN, which blocks for any size, runs above that;
- how the bf16 row kernel multiplies (`bf16_multiply`): `vdpbf16ps`, FMA on weights widened
  to float32 (some CPUs run `vdpbf16ps` at half their FMA rate) or, where the CPU has them,
  AMX tiles; each timed on a 768x768 layer over 48 rows, once per machine, the fastest kept;
- attention with head size D: a canonical attention (12 heads, scale, padding mask, safe
  softmax; and a plain softmax with an additive bias for the row kernels torch's fused
  attention cannot express) compiled once per target (and once more in bfloat16 for
  `precision="bf16"`, whose kernels and library calls differ), each version timed at once.

Sizes grow until the second version has won twice in a row; the switch point is the
largest size up to which the first version won. `Options.thresholds` (or
`SYMFUSE_THRESHOLDS`) sets a kind by hand, and `explain` says where each value came from.

A switch point measured while other processes took more than `BUSY` of the CPU time of the
cores this process runs on (a test suite, a build, a neighbour on the host) is not kept: the
versions do not suffer alike from sharing cores (an OpenMP kernel waits at every barrier for
its slowest thread), so such a value can be far off (a busy neighbour can make the library win
at every length). The process that measured it uses it; the next process measures again.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import logging
import os
import re
import resource
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace

import torch

from symfuse.codegen.cpu.build import build
from symfuse.codegen.cpu.c import preamble
from symfuse.codegen.cpu.gemm import bf16_multiplies, chunk_choices, gemm_source, has_bf16_rows, pack_panels, tile_for
from symfuse.codegen.cpu.generate import build_generated, generate, make_program
from symfuse.ir.dtypes import DType
from symfuse.options import BUILD_KINDS, THRESHOLD_KINDS, Options, rows_kind, split_kind
from symfuse.runtime.native import Backend
from symfuse.runtime.program import linear_rows
from symfuse.runtime.switches import (
    BY_HAND,
    HEADS,
    KEYS,
    ROWS,
    STREAMED,
    Threshold,
    by_hand,
    least_traffic,
    traffic_words,
)
from symfuse.runtime.target import Target
from symfuse.schedule.attention import AttentionStep
from symfuse.shape.infer import GraphBuilder

log = logging.getLogger("symfuse")

# how the measurements are made, in the cache file's name: a change to what a value means
# (not only to the kernels measured) measures again. 2: the row kernel timed with the machine's
# chunk, after the model's weight traffic
METHOD = 2
BUSY = 0.1  # other processes' share of this process's cores above which a measurement is not kept
_UNKEPT: dict[tuple[str, str], dict] = {}  # (file, key) -> a measurement not kept, for this process


MODELLED = "modelled from this CPU (`symfuse tune` measures it)"


def modelled(kind: str, shape: tuple[int, ...], target: Target) -> int:
    """A switch point from what the target says of its CPU (ISA, registers, cores, caches), for
    a first compile that measures nothing. From the values measured on AMD EPYC Zen 4 with
    AVX-512 and with AVX2 (`symfuse tune`; docs/benchmarks.md's switch point table):

    - the merged attention kernel beat torch's fused attention and the three steps at every
      length measured (8 to 512 keys, head sizes 4 to 64, float32 and bf16), by 1.3-3x;
    - the row kernel beat oneDNN by about 2x up to 16 rows (oneDNN's call costs 20-30 us),
      and above that both stream the weights at the same rate: within 3% of each other at
      every size with 32 vector registers (AVX-512), within about 10% with 16 (AVX2), where
      oneDNN's larger blocking wins from a few hundred rows;
    - the row kernel's threads on the weights' panels beat its threads on the rows while there
      are at most a block of rows (the tile's) per core; AMX blocks 16 rows; with weights
      beyond the L2 caches (each thread on rows streams them all) up to 64 rows at least: on
      BERT-base at 14-16 rows, threads on rows above 12 made the whole model 1.35x slower
      (`python bench/switch_points.py`), while panels lose at most 2% a layer up to 64 rows;
    - a chunk of a quarter of L2 where L1 is small (32 KiB), else of two thirds of L1
      (`chunk_choices`), and bf16 products by AMX tiles where the CPU has them, else by
      `vdpbf16ps`."""
    if kind == "row_chunk":  # a small L1 (Zen 4's 32 KiB): the quarter of L2 streamed BERT-base 6% faster
        return chunk_choices(target)[-1] if target.l1d <= 32 * 1024 else chunk_choices(target)[0]
    if kind == "bf16_multiply":
        return 2 if 2 in bf16_multiplies(target) else 0
    if kind.startswith("attention_keys"):
        return KEYS[-1]
    if kind.startswith("linear_split"):
        rows = 16 if kind.endswith("_bf16") and "amx_bf16" in target.extensions else tile_for(target).rows
        block = rows * max(1, target.cores)
        weights = shape[0] * shape[1] * (2 if kind.endswith("_bf16") else 4)
        # weights beyond the L2 caches: threads on rows would each stream all of them
        return max(block, 64) if weights > target.l2 * max(1, target.cores) else block
    if kind.startswith(("linear_rows", "linear_library")):
        wide = target.registers >= 32  # AVX-512: 32 vector registers
        return ROWS[-1] if wide or kind.startswith("linear_library") else 256
    raise ValueError(f"unknown threshold kind {kind!r}")


class Calibration:
    """The switch points of one target on this CPU: read from the cache, else measured."""

    def __init__(self, target: Target, opts: Options) -> None:
        self.target, self.opts = target, opts
        self.manual = dict(opts.thresholds)
        self._entries: dict | None = None
        self._kernels: dict = {}  # precision -> the canonical attention program
        self._helper_lib = None  # _helpers()
        self._path = ""

    @property
    def path(self) -> str:
        """One file per target, CPU, library limits and version of the kernels measured: a
        change to symfuse's kernels (a new tile, say) measures again."""
        if not self._path:
            source = generate(*canonical_attention(), self.target).source
            if has_bf16_rows(self.target):  # each way of multiplying: its row kernel and merged attention
                for m in bf16_multiplies(self.target):
                    way = Threshold("bf16_multiply", (), m, "")
                    source += generate(*canonical_attention(), self.target, "bf16", way).source
            source += f"rows {ROWS}"  # the sizes measured: a switch point means "up to here"
            source += f" method {METHOD}"
            source += f" chunks {chunk_choices(self.target)}"  # the row kernel's chunks measured
            kernels = hashlib.sha256(source.encode()).hexdigest()[:8]
            limits = "".join("-" + re.sub(r"[^a-z0-9_]", "", v.lower()) for _, v in self.opts.library_limits)
            name = f"thresholds-{self.target.key}-{self.target.machine}-{kernels}{limits}.json"
            self._path = os.path.join(self.opts.machine_cache, name)
        return self._path

    def get(self, kind: str, shape: tuple[int, ...], traffic: int = 0) -> Threshold:
        """The switch point of `kind` at `shape`; a linear layer's measured with `traffic`
        bytes of other weights through the caches before each call (`weight_traffic`; 0: the
        least)."""
        if kind not in THRESHOLD_KINDS:
            raise ValueError(f"unknown threshold kind {kind!r}")
        manual = by_hand(kind, shape, self.manual)
        if manual is not None:
            return manual
        words = traffic_words(traffic, self.target) if kind.startswith("linear_") else ""
        key = f"{kind} {'x'.join(map(str, shape))}" + (f" {words}" if words else "")
        if kind.startswith(("linear_rows", "linear_library")) and split_kind(kind) in self.manual:
            key += f" split {self.manual[split_kind(kind)]}"  # measured with that split
        if kind.startswith("linear_") and not kind.endswith("_bf16") and "row_chunk" in self.manual:
            key += f" chunk {self.manual['row_chunk']}"  # measured on a row kernel with that chunk
        entries = self._load()
        e = entries.get(key) or _UNKEPT.get((self.path, key))
        if e is None and self.opts.switch_points == "model":
            return Threshold(kind, shape, modelled(kind, shape, self.target), MODELLED)
        if e is None:
            what = f"{key.strip()} {'value' if kind in BUILD_KINDS else 'switch point'}"
            log.info("symfuse: measuring the %s on this machine (%s), once", what, self.target.isa)
            t0, others = time.perf_counter(), OtherProcesses()
            value, timings = self._measure(kind, shape, traffic)
            e = {
                "value": value,
                "measured": datetime.date.today().isoformat(),
                "seconds": round(time.perf_counter() - t0, 2),
                "ms": timings,
            }
            busy = others.share()
            if busy is not None and busy > BUSY:
                e["busy"] = round(busy, 2)
                _UNKEPT[self.path, key] = e
                log.warning(
                    "symfuse: other processes took %d%% of this process's cores while the %s was"
                    " measured (it came out at %d); this process uses it, but it is not kept: the next process"
                    " measures it again (or set it by hand with SYMFUSE_THRESHOLDS)",
                    round(100 * busy),
                    what,
                    value,
                )
            else:
                entries[key] = e
                self._save(entries)
        where = f"measured on this machine {e['measured']}, {self.target.isa}"
        if words:
            where += ", weights streamed" if traffic == STREAMED else f", after {traffic >> 20} MiB of weights"
        if "busy" in e:
            where += f", while other processes took {round(100 * e['busy'])}% of its cores: not kept"
        return Threshold(kind, shape, int(e["value"]), where)

    # -- the cache file ------------------------------------------------------------------
    def _load(self) -> dict:
        if self._entries is None:
            self._entries = {}
            if os.path.exists(self.path):
                try:
                    with open(self.path) as f:
                        self._entries = json.load(f)
                except (OSError, ValueError):
                    log.warning("symfuse: ignoring an unreadable calibration file %s", self.path)
        return self._entries

    def _save(self, entries: dict) -> None:
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(self.path))
        with os.fdopen(fd, "w") as f:
            json.dump(entries, f, indent=1, sort_keys=True)
        os.replace(tmp, self.path)

    # -- measuring -----------------------------------------------------------------------
    def multiply(self) -> int:
        """How the bf16 row kernel multiplies (`gemm.BF16_MULTIPLY`)."""
        return self.get("bf16_multiply", ()).value

    def _measure(self, kind: str, shape: tuple[int, ...], traffic: int) -> tuple[int, dict]:
        if kind == "row_chunk":
            return self._chunk()
        if kind == "bf16_multiply":  # 48 rows of a 768x768 layer, weights hot: the multiply's rate
            best, timings = 0, {}
            setup_best, run_best, _, _, _ = self._linear(768, 768, False, bf16=True, multiply=0)
            setup_best(48)
            for way in bf16_multiplies(self.target)[1:]:  # each against the fastest so far
                setup, run, _, _, _ = self._linear(768, 768, False, bf16=True, multiply=way)
                setup(48)
                a, b = _ratio(run, run_best)
                timings[f"48 rows: {way} vs {best}"] = [round(a * 1e3, 4), round(b * 1e3, 4)]
                if a < b:
                    best, run_best = way, run
            return best, timings
        if kind.startswith("linear_split"):  # the row kernel's threads on panels, then on rows
            # the two are the same kernel while there is one block of rows (AMX: 16), or one thread
            bf16 = kind == "linear_split_bf16"
            same = 16 if bf16 and self.multiply() == 2 else tile_for(self.target).rows
            if self._helpers().sf_threads() < 2:
                return ROWS[-1], {}
            setup, panels, rows, _, refresh = self._linear(*shape, traffic, bf16=bf16)
            value, timings = _switch_point([m for m in ROWS if m > same], setup, panels, rows, refresh)
            return max(value, same), timings
        if kind.startswith("linear_rows"):  # the row kernel as the host runs it: on panels up to the split
            bf16 = kind == "linear_rows_bf16"
            split = self.get(split_kind(kind), shape, traffic).value
            setup, own, _, library, refresh = self._linear(*shape, traffic, bf16=bf16, split=split)
            return _switch_point(ROWS, setup, own, library, refresh)
        if kind.startswith("linear_library"):  # above the row kernel's switch point: oneDNN up to where?
            bf16 = kind == "linear_library_bf16"
            low = self.get(rows_kind(kind), shape, traffic).value
            above = [m for m in ROWS if m > low]
            if not above:
                return ROWS[-1], {}
            split = self.get(split_kind(kind), shape, traffic).value
            setup, own, _, library, refresh = self._linear(*shape, traffic, bf16=bf16, split=split)
            value, timings = _switch_point(above, setup, library, own, refresh)
            return max(value, low), timings  # oneDNN lost at once: the row kernel at every size measured
        # attention's inputs come hot from the GEMM before it, as back to back here
        library, bf16 = kind.startswith("attention_keys_library"), kind.endswith("_bf16")
        return _switch_point(KEYS, *self._attention(shape[0], library, bf16))

    def kernels(self, precision: str = "fp32") -> Backend:
        """The canonical attention program for this target (it carries the GEMM kernel too),
        every switch point at 0; built as measured, or as set by hand (the bf16 multiply
        shapes the merged kernel in bf16, the chunk the row kernel)."""
        if precision not in self._kernels:
            graph, store = canonical_attention()
            multiply = self.get("bf16_multiply", ()) if precision == "bf16" and has_bf16_rows(self.target) else None
            gen = generate(graph, store, self.target, precision, multiply, lambda: self.get("row_chunk", ()))
            built = build_generated(gen, graph, self.target, replace(self.opts, dump_dir=""))
            zero = {name: Threshold(kind, shape, 0, BY_HAND) for name, (kind, shape) in gen.host.thresholds.items()}
            program = make_program(gen, built, len(store.symbols), zero)
            self._kernels[precision] = Backend(
                program, self.target, zero, gen.host, gen.gathers, gen.tile, built.cached, {}, gen
            )
        return self._kernels[precision]

    # the layers the chunk is timed on: (K, N, rows, weight traffic)
    LAYERS = ((256, 1024, 128, 0), (768, 3072, 16, STREAMED))

    def _chunk(self) -> tuple[int, dict]:
        """The row kernel's chunk (`gemm.chunk_choices`): each choice built and timed against the
        fastest so far, on the same weights and inputs, where the chunk matters (threads on
        panels): 128 rows of a 256->1024 layer with its weights in cache (bert-small's FFN) and
        16 rows of a 768->3072 layer streaming them from memory (BERT-base's); a choice is taken
        where the product of its two time ratios is below 1."""

        choices = chunk_choices(self.target)
        built = {c: tuple(row_kernel(self.target, self.opts, split=s, chunk=c) for s in (False, True)) for c in choices}
        which = [choices[0]]  # the chunk whose kernel the calls below run
        kernel = tuple(lambda *args, s=s: built[which[0]][s](*args) for s in (0, 1))
        best, timings = choices[0], {}
        layers = [(k, n, rows, self._linear(k, n, traffic, kernel=kernel)) for k, n, rows, traffic in self.LAYERS]

        def version(chunk: int, run: Callable[[], float]) -> Callable[[], float]:
            def timed() -> float:
                which[0] = chunk
                return run()

            return timed

        for chunk in choices[1:]:
            ratio = 1.0
            for k, n, rows, (setup, run, *_, refresh) in layers:
                setup(rows)
                a, b = _ratio(version(chunk, run), version(best, run), refresh)
                timings[f"{k}->{n} at {rows} rows: {chunk} vs {best} steps"] = [round(a * 1e3, 4), round(b * 1e3, 4)]
                ratio *= a / b
            if ratio < 1:
                best = chunk
        return best, timings

    def _linear(
        self,
        k: int,
        n: int,
        traffic: int,
        bf16: bool = False,
        multiply: int | None = None,
        split: int = 1 << 30,
        kernel: tuple | None = None,
    ):
        """(setup(rows), the row kernel with its threads on panels up to `split` rows and on
        rows above, the row kernel with its threads on rows, oneDNN, refresh()): each call
        timed alone, after refresh().

        refresh() leaves the caches as a model's layer finds them: the layers between two
        uses of a weight have taken the caches (a pass over `traffic` bytes less the layer's
        own weights, at least twice the L2 on every core; back to back, the libraries' lead
        at 64 rows of a 256->768 layer was one the model reversed; where the weights stream
        (`STREAMED`), copies of them rotated through twice the L3 cache), and the input was
        just written by the kernel before, a block of rows by each thread, as a layer norm
        leaves it (the row kernel with its threads on rows reads its own rows then: timed on freshly made
        inputs instead, its switch points did not hold in the model; `symfuse bench --model
        bert-small --seq 128 --profile`)."""

        if kernel is not None:  # (threads on panels, threads on rows) of a row kernel built for the purpose
            rows_fn, split_fn = kernel
        elif bf16:
            way = self.multiply() if multiply is None else multiply
            rows_fn = row_kernel(self.target, self.opts, True, way)
            split_fn = row_kernel(self.target, self.opts, True, way, split=True)
        else:  # built as a model's library builds it: with the machine's chunk (the canonical
            # attention program has no linear layer, so its row kernel keeps tile_for's chunk)
            chunk = self.get("row_chunk", ()).value
            rows_fn = row_kernel(self.target, self.opts, chunk=chunk)
            split_fn = row_kernel(self.target, self.opts, split=True, chunk=chunk)
        dtype = torch.bfloat16 if bf16 else torch.float32
        panel = tile_for(self.target).panel
        layer, least = dtype.itemsize * k * n, least_traffic(self.target)
        streamed = traffic == STREAMED
        copies = max(1, min(64, (2 * self.target.l3) // layer + 1)) if streamed else 1
        gen = torch.Generator().manual_seed(0)
        ws = [torch.randn(n, k, generator=gen).to(dtype) for _ in range(copies)]
        packed = [pack_panels(w, panel, bf16) for w in ws]
        reordered: list[torch.Tensor] = []  # oneDNN's copies, made at its first call
        bias = torch.randn(n, generator=gen).to(dtype)
        linear = torch.ops.mkldnn._linear_pointwise
        st = {}

        scratch = torch.zeros((least if streamed else max(least, traffic - layer)) // 4)
        rewrite = self._helpers().sf_rewrite

        def setup(m: int) -> None:
            a = torch.randn(m, k, generator=gen).to(dtype)
            st["a"], st["c"], st["m"], st["i"] = a, torch.empty(m, n, dtype=dtype), m, 0

        def refresh() -> None:
            scratch.add_(1.0)
            a = st["a"]
            rewrite(a.data_ptr(), a.numel() * a.element_size() // 4, 0)

        def own(split: int) -> Callable[[], float]:
            def run() -> float:
                a, c, i, m = st["a"], st["c"], st["i"], st["m"]
                st["i"] = (i + 1) % copies
                fn = rows_fn if m <= split else split_fn
                t0 = time.perf_counter()
                fn(a.data_ptr(), k, packed[i].data_ptr(), bias.data_ptr(), c.data_ptr(), n, m, n, k, 0)
                return time.perf_counter() - t0

            return run

        def library() -> float:
            if not reordered:
                reordered.extend(torch.ops.mkldnn._reorder_linear_weight(w) for w in ws)
            i = st["i"]
            st["i"] = (i + 1) % copies
            t0 = time.perf_counter()
            linear(st["a"], reordered[i], bias, "none", [], "")
            return time.perf_counter() - t0

        return setup, own(split), own(0), library, refresh

    def _helpers(self):
        """A library of two: `sf_rewrite(words, n, x)`, words[i] ^= x over n 32-bit words split
        in blocks between the threads the kernels run on (x = 0 leaves them as they were,
        written), and `sf_threads()`, how many threads the kernels run on."""
        if self._helper_lib is None:
            import ctypes

            source = (
                "#include <cstdint>\n#include <omp.h>\n"
                'extern "C" void sf_rewrite(uint32_t* words, int64_t n, uint32_t x) {\n'
                "#pragma omp parallel for schedule(static)\n"
                "  for (int64_t i = 0; i < n; ++i) words[i] ^= x;\n"
                "}\n"
                'extern "C" int sf_threads() { return omp_get_max_threads(); }\n'
            )
            lib = ctypes.CDLL(build(source, self.target, self.opts)[0])
            lib.sf_rewrite.argtypes, lib.sf_rewrite.restype = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_uint32], None
            lib.sf_threads.argtypes, lib.sf_threads.restype = [], ctypes.c_int
            self._helper_lib = lib
        return self._helper_lib

    def _attention(self, d: int, library: bool, bf16: bool = False):
        be = self.kernels("bf16" if bf16 else "fp32")
        steps = [s for s in be.schedule.steps if isinstance(s, AttentionStep)]
        step = next(s for s in steps if (s.library is not None) == library)
        name = be.host_thresholds[step.name]
        prog = be.program
        gen = torch.Generator().manual_seed(0)
        st = {}

        def setup(s: int) -> None:
            q, k, v = (torch.randn(1, HEADS, s, d, generator=gen) for _ in range(3))
            mask = torch.ones(1, 1, 1, s, dtype=torch.bool)
            mask[..., s - s // 4 :] = False  # a padded tail, as a batch of sentences has
            bias = torch.where(mask, 0.0, -1e4).float()
            st["inputs"], st["binding"] = [q, k, v, mask, bias], {"B": 1, "H": HEADS, "S": s, "D": d}

        def version(limit: int) -> Callable[[], float]:
            def run() -> float:  # the attention step's own time, not the rest of the program's
                prog.set_threshold(name, limit)
                times, _ = prog.profile(st["inputs"], st["binding"])
                return sum(t for n, t in times if n == step.name)

            return run

        return setup, version(1 << 30), version(0)


class OtherProcesses:
    """The CPU time other processes take on the cores this process may run on, from now: busy
    and stolen time in `/proc/stat` less this process's own (its threads, and its children it
    has waited for, such as g++). Where there is no `/proc/stat`, unknown (None)."""

    def __init__(self) -> None:
        self.start = self._sample()

    @staticmethod
    def _sample() -> tuple[float, float, float, int] | None:
        try:
            cores = os.sched_getaffinity(0)
            busy = 0
            with open("/proc/stat") as f:
                for line in f:
                    name, *ticks = line.split()
                    if name.startswith("cpu") and name[3:].isdigit() and int(name[3:]) in cores:
                        user, nice, system, _idle, _iowait, irq, softirq, steal = map(int, ticks[:8])
                        busy += user + nice + system + irq + softirq + steal
        except (OSError, AttributeError, ValueError):
            return None
        own = sum(
            r.ru_utime + r.ru_stime
            for r in (resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN))
        )
        return busy / os.sysconf("SC_CLK_TCK"), own, time.perf_counter(), len(cores)

    def share(self) -> float | None:
        """Their CPU seconds since the start over the cores' wall seconds (0: quiet, 1: every core
        busy with other work the whole time), less a clock tick a core (`/proc/stat` counts in
        ticks, so a short span could otherwise look busy)."""
        end = self._sample()
        if self.start is None or end is None or end[2] <= self.start[2]:
            return None
        (busy0, own0, t0, cores), (busy1, own1, t1, _) = self.start, end
        others = (busy1 - busy0) - (own1 - own0) - cores / os.sysconf("SC_CLK_TCK")
        return max(0.0, others) / ((t1 - t0) * cores)


def row_kernel(
    target: Target, opts: Options, bf16: bool = False, multiply: int = 0, split: bool = False, chunk: int = 0
):
    """symfuse's row GEMM built for `target` alone (`sf_linear_rows`, or with `bf16`
    `sf_linear_rows_bf16` multiplying as `gemm.BF16_MULTIPLY[multiply]` says; with `split`
    the one whose threads take the rows first, `..._split`; `chunk`: steps of K in a chunk, 0
    for `tile_for`'s), typed for ctypes."""
    import ctypes

    path, _, _ = build(preamble(target) + gemm_source(tile_for(target, chunk), bf16, multiply), target, opts)
    name = "sf_linear_rows_bf16" if bf16 else "sf_linear_rows"
    return linear_rows(ctypes.CDLL(path), name + "_split" if split else name)


def _switch_point(sizes, setup, first, second, between=lambda: None) -> tuple[int, dict]:
    """The largest size up to which `first` is no slower than `second` (0 if it loses at once),
    scanning sizes until `second` has won twice in a row. At each size the two versions run
    in pairs, `between()` before each call, at least 5 pairs and more while a third of a
    second lasts; the verdict is the median of the pairs' time ratios, so a slow spell of the
    machine, which slows both calls of a pair, does not decide it."""
    value, losses, timings = 0, 0, {}
    for size in sizes:
        setup(size)
        a, b = _ratio(first, second, between)
        timings[str(size)] = [round(a * 1e3, 4), round(b * 1e3, 4)]
        if a <= b:
            value, losses = size, 0
        else:
            losses += 1
            if losses == 2:
                break
    return value, timings


def _ratio(first, second, between=lambda: None) -> tuple[float, float]:
    """Two versions run in pairs, `between()` before each call, at least 5 pairs and more while
    a third of a second lasts: their median times, scaled so that their ratio is the median of
    the pairs' time ratios."""
    first(), second()  # warm up
    pairs: list[tuple[float, float]] = []
    until = time.perf_counter() + 0.33
    while len(pairs) < 5 or (len(pairs) < 40 and time.perf_counter() < until):
        between()
        a = first()
        between()
        pairs.append((a, second()))
    b = statistics.median(p[1] for p in pairs)
    return statistics.median(p[0] / p[1] for p in pairs) * b, b


def canonical_attention():
    """Attention over symbolic B, H, S, D twice: scale + padding mask + safe softmax (what
    torch's fused attention computes) and scale + additive bias + softmax (a row kernel it
    does not express)."""

    b = GraphBuilder("canonical_attention")
    B, H, S, D = (b.store.declare(n) for n in "BHSD")
    q, k, v = (b.input(n, (B, H, S, D), DType.float32) for n in "qkv")
    mask = b.input("mask", (B, 1, 1, S), DType.bool)
    bias = b.input("bias", (B, 1, 1, S), DType.float32)
    scale = b.scalar(0.125)
    outs = []
    for form in ("library", "rows"):
        (kt,) = b.add("permute", [k], {"dims": (0, 1, 3, 2)}, name=f"{form}_kt")
        (scores,) = b.add("matmul", [q, kt], name=f"{form}_scores")
        (scaled,) = b.add("mul", [scores, scale], name=f"{form}_scaled")
        if form == "library":
            (masked,) = b.add("where", [mask, scaled, b.scalar(-float("inf"))], name=f"{form}_masked")
            (probs,) = b.add("safe_softmax", [masked], {"dim": -1}, name=f"{form}_probs")
        else:
            (masked,) = b.add("add", [scaled, bias], name=f"{form}_biased")
            (probs,) = b.add("softmax", [masked], {"dim": -1}, name=f"{form}_probs")
        (ctx,) = b.add("matmul", [probs, v], name=f"{form}_context")
        outs.append(ctx)
    return b.finish(outs), b.store
