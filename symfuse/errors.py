"""Errors symfuse raises on purpose, each naming what was wrong and where."""

from __future__ import annotations


class UnsupportedOpsError(NotImplementedError):
    """The model uses ops symfuse cannot capture; lists every one with its source location."""

    def __init__(self, problems: list[tuple[str, str, str]]) -> None:
        self.problems = problems  # (op, reason, location)
        lines = [f"  {op}: {reason}" + (f"  [{loc}]" if loc else "") for op, reason, loc in problems]
        super().__init__(f"the model uses {len(problems)} op(s) symfuse cannot capture:\n" + "\n".join(lines))


class CaptureError(RuntimeError):
    """torch.export could not trace the model; says why in symfuse's terms, with torch's
    error chained as the cause."""
