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


class CodegenError(NotImplementedError):
    """A kernel a backend cannot generate (an op or dtype it has no spelling for); the step then
    runs another way (its tensor expressions through torch) and `explain` says why."""


class BuildError(RuntimeError):
    """The C++ compiler could not be run, or could not build generated code; says which and why."""
