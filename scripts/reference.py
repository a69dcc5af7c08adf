"""Write docs/reference.md from the code: options, environment variables, switch points, the op
registry, the scalar functions and what each frontend maps. `--check` compares instead of
writing (tests/unit/test_reference_doc.py runs it), so the page never drifts from the code.

    .venv/bin/python scripts/reference.py [--check]
"""

from __future__ import annotations

import ast
import dataclasses
import pathlib
import sys

from symfuse import ops
from symfuse.codegen.cpu import spell as cpu
from symfuse.codegen.gpu import spell as gpu
from symfuse.frontend.aten_table import ATEN
from symfuse.frontend.onnx_table import FOLD, ONNX_OPS
from symfuse.options import ENVIRONMENT, THRESHOLD_KINDS, Options
from symfuse.te.scalar import FUNCTIONS

ROOT = pathlib.Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "reference.md"


def _field_comments() -> dict[str, str]:
    """Each `Options` field's comment: on its line, or the comment lines just above it."""
    source = (ROOT / "symfuse" / "options.py").read_text().splitlines()
    tree = ast.parse("\n".join(source))
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Options")
    out = {}
    for node in cls.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            line = source[node.lineno - 1]
            words = [line.split("#", 1)[1].strip()] if "#" in line else []
            k = node.lineno - 2
            above = []
            while k >= 0 and source[k].strip().startswith("#"):
                above.insert(0, source[k].strip()[1:].strip())
                k -= 1
            out[node.target.id] = " ".join(above + words)
    return out


def _cells(names: list[str], per_row: int = 6) -> list[str]:
    rows = [names[i : i + per_row] for i in range(0, len(names), per_row)]
    return ["| " + " | ".join(f"`{n}`" for n in row) + " |" * (per_row - len(row)) + " |" for row in rows]


def render() -> str:
    out = [
        "# Reference",
        "",
        "Generated from the code by `scripts/reference.py`; a test fails when it is out of date.",
        "",
        "## Options",
        "",
        "`symfuse.compile(model, example, dynamic, **options)` and `symfuse.load(path, **options)` take",
        "these fields of `symfuse.options.Options`:",
        "",
        "| option | default | what it does |",
        "|---|---|---|",
    ]
    comments = _field_comments()
    for f in dataclasses.fields(Options):
        doc = comments.get(f.name, "").replace("|", "\\|")  # (a bar would end the cell)
        out.append(f"| `{f.name}` | `{f.default!r}` | {doc} |")
    out += ["", "## Environment variables", "", "| variable | sets | what it does |", "|---|---|---|"]
    for name, (field, _, doc) in ENVIRONMENT.items():
        out.append(f"| `{name}` | `{field}` | {doc} |")
    out += ["", "## Switch-point kinds (`thresholds`, `SYMFUSE_THRESHOLDS`)", ""]
    out += [", ".join(f"`{k}`" for k in THRESHOLD_KINDS), ""]
    out += ["## Ops of the registry", "", "| op | kind | inputs | attributes | notes |", "|---|---|---|---|---|"]
    for name in sorted(ops.REGISTRY):
        d = ops.get(name)
        notes = d.doc or ("runs its torch reference inside the program" if d.lower is None else "")
        out.append(f"| `{name}` | {d.kind.name.lower()} | {', '.join(d.inputs)} | {', '.join(d.attrs)} | {notes} |")
    out += ["", "## Scalar functions", ""]
    out += ["The functions a tensor expression may call (`te/scalar.py`), and each backend's spelling:", ""]
    out += ["| function | operands | result dtype | CPU | GPU |", "|---|---|---|---|---|"]
    for f in FUNCTIONS.values():
        c = "yes" if f.name in cpu.SPELLING else cpu.UNSPELLED[f.name]
        g = "yes" if f.name in gpu.SPELLING else gpu.UNSPELLED[f.name]
        out.append(f"| `{f.name}` | {f.arity} | {f.result.value} | {c} | {g} |")
    aten = sorted({str(k) for k in ATEN})
    out += ["", f"## aten ops captured by `torch.export` ({len(aten)})", "", "|" + " |" * 6, "|---" * 6 + "|"]
    out += _cells(aten)
    onnx = sorted(set(ONNX_OPS) | set(FOLD))
    out += ["", f"## ONNX ops ({len(onnx)})", "", "`docs/frontends.md` says how each maps.", ""]
    out += ["|" + " |" * 6, "|---" * 6 + "|", *_cells(onnx)]
    return "\n".join(out) + "\n"


def main() -> int:
    text = render()
    if "--check" in sys.argv:
        if not PAGE.exists() or PAGE.read_text() != text:
            print(f"{PAGE.relative_to(ROOT)} is out of date: run python scripts/reference.py")
            return 1
        return 0
    PAGE.write_text(text)
    print(f"wrote {PAGE.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
