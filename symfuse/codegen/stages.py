"""What both backends do with generated kernels: share the identical ones, dump every stage."""

from __future__ import annotations

import logging
import os
import re
from dataclasses import replace

from symfuse.fusion.plan import Plan
from symfuse.ir.graph import Graph, print_graph
from symfuse.te.lower import TEProgram

log = logging.getLogger("symfuse")

_IDENT = re.compile(r"\b[A-Za-z_]\w*\b")
# the emitters' names derived from a value's: register, pointer, row buffer, loop, temporary
_LOCAL = re.compile(r"^(?:v|p|row|r\d+|t\d+)_")
_COMMENT = re.compile(r"^\s*(//|# ).*$", re.M)  # C++ and Python comments


def share(kernels: dict, names: set[str]) -> dict:
    """Kernels whose C++ is the same up to the names of the graph's values (each layer of a
    transformer repeats its layer norm, its attention, its GELU) share one function: the
    later ones call the first, so the compiler sees each distinct kernel once."""
    first: dict[str, str] = {}
    out = {}
    for name, k in kernels.items():
        seen: dict[str, str] = {}

        def placeholder(m: re.Match, seen=seen, own=name) -> str:
            word = m.group(0)
            if word not in (own, f"{own}_team") and word not in names and _LOCAL.sub("", word) not in names:
                return word
            return seen.setdefault(word, f"@{len(seen)}")

        canonical = _IDENT.sub(placeholder, _COMMENT.sub("", k.source))
        if canonical in first:
            out[name] = replace(k, function=first[canonical])
        else:
            first[canonical] = name
            out[name] = k
    return out


def dump_stages(folder: str, graph: Graph, prog: TEProgram, fp: Plan, kernels: tuple[str, str], host: str) -> None:
    """Write every stage to `folder`: graph, TEs, fusion plan, kernels (file name, source), host."""
    os.makedirs(folder, exist_ok=True)
    files = {
        "1_graph.txt": print_graph(graph, with_constants=False),
        "2_tensor_expressions.txt": str(prog),
        "3_fusion_plan.txt": "\n".join(str(k) for k in fp.kernels)
        + "\n\nrefused:\n"
        + "\n".join(f"{d.producer} -> {d.consumer}: {d.reason}" for d in fp.refused()),
        kernels[0]: kernels[1],
        "5_host.py": host,
    }
    for name, text in files.items():
        with open(os.path.join(folder, name), "w") as f:
            f.write(text + ("\n" if not text.endswith("\n") else ""))
    log.info("symfuse: wrote every stage to %s", folder)
