"""Benchmark reports: a terminal table, JSON, Markdown and a latency plot."""

from __future__ import annotations

import json
import os

from symfuse.bench.harness import key


def _fmt(v, spec: str = ".2f", none: str = "-") -> str:
    return none if v is None else format(v, spec)


def _status(e: dict) -> str:
    if e["status"] == "ok":
        return f"ok ({e['detail']})" if e.get("detail") else "ok"
    text = f"{e['status']}: {e['detail'][:90]}" if e["detail"] else e["status"]
    return text + (f" (log: {e['log']})" if e["status"] == "failed" and e.get("log") else "")


def engine_lines(result: dict) -> list[tuple]:
    out = []
    for n, e in result["engines"].items():
        errs = [v for v in e["errors"].values() if v is not None]
        out.append((
            n, _status(e),
            _fmt(e["prepare_s"]), _fmt(e["recompiles"], "d"), _fmt(e["peak_rss_mb"], ".0f"),
            _fmt(max(errs) if errs else None, ".1e"),
        ))  # fmt: skip
    return out


def shape_table(result: dict, stat: str = "median") -> tuple[list[str], list[list[str]]]:
    """Rows: shapes. Columns: each engine's median ms (ratio to the best peer), or with
    `stat="min"` each engine's fastest call and repetitions."""
    engines = [n for n, e in result["engines"].items() if e["status"] == "ok"]
    header = ["shape"] + engines
    by_shape: dict[str, dict[str, dict]] = {}
    for r in result["rows"]:
        by_shape.setdefault(key(r["binding"]), {})[r["engine"]] = r
    rows = []
    for label, cells in by_shape.items():
        row = [label]
        for n in engines:
            c = cells.get(n, {})
            if c.get("median_ms") is None:
                row.append("failed" if c.get("failure") else "-")
            elif stat == "min":
                row.append(f"{c['min_ms']:.2f} (n={c['reps']})")
            else:
                row.append(
                    f"{c['median_ms']:.2f} ({c['ratio_to_best_peer']:.2f}x)"
                    if c.get("ratio_to_best_peer")
                    else f"{c['median_ms']:.2f}"
                )
        rows.append(row)
    return header, rows


def floor_table(result: dict) -> tuple[list[str], list[list[str]]] | None:
    """Per shape, what one call does (counted on the first symfuse engine's program: FLOPs of
    its GEMMs, convolutions and attention, bytes of its weights) and the least time any engine
    could take for it on this machine, the floor: the FLOPs at the FMA peak or, where the
    weights do not fit in the L3 cache, reading them once at the read bandwidth, whichever is
    longer. The floor over the best peer's median is the smallest ratio to the best peer the
    machine allows; the best peer's rate beside symfuse's says how much room it leaves (a
    ratio r to it needs symfuse at its rate over r). None without the FMA peak or the counts."""
    phys, work = result.get("physics") or {}, result.get("work") or {}
    if not phys.get("fma_gflops") or not work:
        return None
    ours = next(iter(work))
    header = ["shape", "GFLOP", "weights MB", "floor ms", "best peer ms", "floor / best peer", f"{ours} ms"]
    header += ["its rate", "best peer's rate"]
    rows = []
    for r in result["rows"]:
        label = key(r["binding"])
        w = work[ours].get(label)
        if r["engine"] != ours or w is None:
            continue
        flops, weights = w["flops"], w["weight_bytes"]
        floor = flops / phys["fma_gflops"] / 1e6
        if weights > phys.get("l3_bytes", 0) and phys.get("read_gbps"):
            floor = max(floor, weights / phys["read_gbps"] / 1e6)
        best, ms = r.get("best_peer_ms"), r["median_ms"]
        rate, peer = (flops / t / 1e6 if t else None for t in (ms, best))
        rows.append(
            [
                label,
                f"{flops / 1e9:.2f}",
                f"{weights / 2**20:.1f}",
                f"{floor:.2f}",
                _fmt(best),
                f"{floor / best:.2f}x" if best else "-",
                _fmt(ms),
                *(f"{x:.0f} GFLOP/s ({x / phys['fma_gflops']:.0%} of FMA peak)" if x else "-" for x in (rate, peer)),
            ]
        )
    return header, rows


def _text_table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
    line = lambda r: "  ".join(
        str(x).ljust(w) if i == 0 else str(x).rjust(w) for i, (x, w) in enumerate(zip(r, widths))
    )
    return "\n".join([line(header), "  ".join("-" * w for w in widths)] + [line(r) for r in rows])


def _md_table(header: list[str], rows: list[list[str]]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return "\n".join(out + ["| " + " | ".join(str(x) for x in r) + " |" for r in rows])


ENGINE_HEADER = ["engine", "status", "compile/export s", "recompiles", "peak MB", "max rel err vs eager"]


def physics_text(p: dict) -> str:
    if not p:
        return "physical references: not measured"
    text = (
        f"physical references: copy bandwidth {p['copy_gbps']:.1f} GB/s (read + write), "
        + (f"read {p['read_gbps']:.1f} GB/s, " if p.get("read_gbps") else "")
        + f"SGEMM {p['sgemm_gflops']:.0f} GFLOP/s (torch.matmul, {p['sgemm_n']}^3)"
        + (f", FMA peak {p['fma_gflops']:.0f} GFLOP/s (every core)" if p.get("fma_gflops") else "")
    )
    return text + (f"\n\nmachine: {p['machine']}" if p.get("machine") else "")


def profiles(result: dict) -> dict[str, list[list[str]]]:
    """Each profiled symfuse engine's table rows."""
    return {n: profile_lines(p, result.get("physics") or {}) for n, p in (result.get("profile") or {}).items() if p}


# below this many bytes moved a call, a memory-bound step is bound by its fixed cost (a parallel
# region, a call), not by the memory's bandwidth: the profile says so beside its rate
SMALL_BYTES = 1 << 20


def profile_lines(p: list[dict], phys: dict) -> list[list[str]]:
    rows = []
    for s in p[:15]:
        sec = s["seconds"] or 1e-12
        gbps, gflops = s["bytes"] / sec / 1e9, s["flops"] / sec / 1e9
        if not s["bytes"] and not s["flops"]:
            frac = "views only (no data moved)"
        elif not phys:
            frac = "-"
        elif s["flops"] and phys.get("fma_gflops"):  # the machine's limit (bf16 multiplies may pass it)
            frac = f"{gflops / phys['fma_gflops']:.0%} of the fp32 FMA peak"
        elif s["flops"]:
            frac = f"{gflops / phys['sgemm_gflops']:.0%} of SGEMM"
        else:
            frac = f"{gbps / phys['copy_gbps']:.0%} of copy bandwidth"
            per_call = s["bytes"] / max(s["calls"], 1)
            if per_call < SMALL_BYTES:  # over in microseconds: its fixed cost, not the memory, decides
                frac += f" ({per_call / 1024:.0f} KiB a call: fixed-cost bound)"
        rows.append(
            [
                s["op"],
                str(s["calls"]),
                f"{s['seconds'] * 1e3:.2f}",
                f"{gbps:.1f}",
                f"{gflops:.1f}" if s["flops"] else "-",
                frac,
            ]
        )
    return rows


FLOOR_TITLE = (
    "the floor: the least time a call can take on this machine (its FLOPs at the FMA peak; its weights"
    " read once at the read bandwidth where they exceed the L3 cache)"
)
PROFILE_HEADER = ["symfuse step", "calls", "ms", "GB/s", "GFLOP/s", "achieved"]


def terminal(result: dict) -> str:
    parts = [
        f"\n{result['config']['model']}: median latency in ms "
        "(ratio to the best peer; peers are all engines but symfuse)",
        _text_table(*shape_table(result)),
    ]
    parts += ["", _text_table(ENGINE_HEADER, engine_lines(result)), "", physics_text(result.get("physics", {}))]
    floor = floor_table(result)
    if floor:
        parts += ["", f"{FLOOR_TITLE}:", _text_table(*floor)]
    for name, prof in profiles(result).items():
        at = result["config"]["bindings"][-1]
        parts += ["", f"profile of one {name} call at {at}, step by step:", _text_table(PROFILE_HEADER, prof)]
    return "\n".join(parts)


def markdown(result: dict) -> str:
    cfg = result["config"]
    parts = [
        f"## {cfg['model']}", "", f"Command: `{result.get('command', '')}`", "",
        f"Finished {result['finished']}; {cfg['rounds']} rounds, engines alternating, each in its own process. "
        "Cells: median ms (ratio to the best peer).", "",
        _md_table(*shape_table(result)), "", "Fastest call in ms (number of timed calls):", "",
        _md_table(*shape_table(result, "min")), "", _md_table(ENGINE_HEADER, engine_lines(result)), "",
        physics_text(result.get("physics", {})),
    ]  # fmt: skip
    floor = floor_table(result)
    if floor:
        parts += ["", f"{FLOOR_TITLE}:", "", _md_table(*floor)]
    for name, prof in profiles(result).items():
        at = cfg["bindings"][-1]
        parts += ["", f"Profile of one {name} call at {at}, step by step:", "", _md_table(PROFILE_HEADER, prof)]
    return "\n".join(parts) + "\n"


def plot(result: dict, path: str) -> str | None:
    """Latency against the swept axis, one line per engine; None when matplotlib is absent."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    rows = [r for r in result["rows"] if r["median_ms"] is not None]
    if not rows:
        return None
    symbols = list(rows[0]["binding"])
    axis = max(symbols, key=lambda s: len({r["binding"][s] for r in rows}))
    fig, ax = plt.subplots(figsize=(8, 5))
    series: dict[str, list[tuple[int, float]]] = {}
    for r in rows:
        others = ", ".join(f"{k}={v}" for k, v in r["binding"].items() if k != axis)
        label = r["engine"] + (
            f" ({others})"
            if others
            and len(symbols) > 1
            and len({tuple((k, v) for k, v in x["binding"].items() if k != axis) for x in rows}) > 1
            else ""
        )
        series.setdefault(label, []).append((r["binding"][axis], r["median_ms"]))
    for label, pts in series.items():
        pts.sort()
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=label)
    ax.set_xlabel(axis)
    ax.set_ylabel("median latency (ms)")
    ax.set_title(f"{result['config']['model']}: latency by {axis}")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write(result: dict, out_dir: str) -> dict[str, str]:
    os.makedirs(out_dir, exist_ok=True)
    paths = {"json": os.path.join(out_dir, "results.json"), "markdown": os.path.join(out_dir, "results.md")}
    with open(paths["json"], "w") as f:
        json.dump(result, f, indent=1, default=str)
    with open(paths["markdown"], "w") as f:
        f.write(markdown(result))
    png = plot(result, os.path.join(out_dir, "latency.png"))
    if png:
        paths["plot"] = png
    return paths
