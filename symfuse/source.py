"""Where a compiled module came from: its capture, and the compiler parts that explain it.

`runtime.module.CompiledModule` asks its `Source` for what only the compiler knows. A module
compiled in this process holds its capture (`Compiled`); a loaded artifact reads the graph
from the artifact the first time it is asked for (`Saved`), so loading imports none of the
compiler, and `explain` or `profile` import what they need when they are called.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from symfuse.runtime.module import CompiledModule


class Compiled:
    """The source of a module compiled in this process."""

    def __init__(self, captured: Any) -> None:
        self._captured = captured
        self._reference = None

    def captured(self) -> Any:
        return self._captured

    def explain(self, module: CompiledModule, with_graph: bool, with_te: bool) -> str:
        from symfuse.explain import explain

        c = module.captured
        return explain(
            c.graph,
            c.store,
            backend=module.backend,
            notes=c.notes,
            traced=module.guard_spec.traced,
            with_graph=with_graph,
            with_te=with_te,
            native=module.native,
        )

    def reference(self, module: CompiledModule, binding: dict[str, int], tensors: list, on_node) -> list:
        if self._reference is None:
            from symfuse.reference import ReferenceExecutor

            self._reference = ReferenceExecutor(module.graph)
        return self._reference.run(binding, tensors, on_node=on_node)


class Saved(Compiled):
    """The source of a module loaded from an artifact: its capture read on first use."""

    def __init__(self, read: Callable[[], Any]) -> None:
        super().__init__(None)
        self._read = read

    def captured(self) -> Any:
        if self._captured is None:
            self._captured = self._read()
        return self._captured
