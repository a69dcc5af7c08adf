"""The caches on disk: built kernel libraries, and what was measured on this machine.

`symfuse cache info` says where they are, how big, and what they hold by target;
`symfuse cache clear` empties the kernel cache (and with `--all` the machine folder: the
detected targets and switch points, measured again at next use).
"""

from __future__ import annotations

import os
import re
import shutil
import time
from collections import defaultdict

from filelock import FileLock

from symfuse.options import Options


def _size(path: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files)


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB"


def info(opts: Options) -> str:
    kernels, machine = opts.kernel_cache, opts.machine_cache
    lines = []
    libs = sorted(f for f in os.listdir(kernels) if f.endswith(".so")) if os.path.isdir(kernels) else []
    by_target: dict[str, list[int]] = defaultdict(list)
    for f in libs:
        m = re.match(r"(.+)-[0-9a-f]{24}\.so$", f)
        by_target[m.group(1) if m else "(older entries)"].append(os.path.getsize(os.path.join(kernels, f)))
    total = _size(kernels) if os.path.isdir(kernels) else 0
    lines.append(f"kernels: {kernels} ({len(libs)} libraries, {_mb(total)})")
    for t, sizes in sorted(by_target.items()):
        lines.append(f"  {t}: {len(sizes)} libraries, {_mb(sum(sizes))}")
    names = sorted(os.listdir(machine)) if os.path.isdir(machine) else []
    targets = [f for f in names if f.startswith("target-")]
    measured = [f for f in names if f.startswith("thresholds-")]
    lines.append(f"machine: {machine} ({len(targets)} detected targets, {len(measured)} sets of switch points)")
    for f in measured:
        lines.append(f"  {f[len('thresholds-') : -len('.json')]}")
    return "\n".join(lines)


def clear(opts: Options, machine: bool = False) -> str:
    """Remove every kernel library (each under its lock, so a process building one finishes
    first); with `machine`, also the detected targets and measured switch points."""
    removed, folder = 0, opts.kernel_cache
    if os.path.isdir(folder):
        for f in os.listdir(folder):
            path = os.path.join(folder, f)
            if f.endswith(".so"):
                with FileLock(path + ".lock"):
                    for p in (path, path + ".sha256"):
                        if os.path.exists(p):
                            os.unlink(p)
                removed += 1
            elif f.startswith(".build-") and time.time() - os.path.getmtime(path) > 3600:
                os.unlink(path)  # left by a build that died (a running one's are newer)
    out = f"removed {removed} kernel libraries from {folder}"
    if machine and os.path.isdir(opts.machine_cache):
        shutil.rmtree(opts.machine_cache)
        out += f"; removed {opts.machine_cache}"
    return out
