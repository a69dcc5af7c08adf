"""Subprogram merging (Souffle): attention's scores GEMM, its softmax kernel and the
context GEMM run as one kernel, so the `[B, H, S, S]` scores never reach memory.

The pattern is found on the schedule, from what the steps read and write, not from op
names: a batched GEMM whose result only a row kernel reads, whose one output only a second
batched GEMM reads as its left operand. Inside the merged kernel each (batch, head) packs
its keys and values once, then every block of query rows computes its scores with the
GEMM micro-kernel, runs the row kernel's code on them in cache (the barrier between the
two kernels becomes program order inside one thread) and multiplies by the values.
Measured here, that wins up to about 128 keys; above, the library batched GEMMs are
faster than the micro-kernel on these shapes, so the host keeps both versions and picks
one per call from the number of keys.
"""

from __future__ import annotations

from dataclasses import dataclass

from symfuse.schedule.layout import View
from symfuse.schedule.steps import GemmStep, NativeStep, Schedule, Step

MERGED_KEYS = 128  # the host runs the merged kernel up to this many keys (docs/benchmarks.md)


@dataclass
class AttentionStep:
    name: str
    scores: GemmStep  # q @ k^T
    softmax: NativeStep  # the row kernel between them
    context: GemmStep  # probs @ v
    out: str

    rows: tuple = ()  # the kernel walks (batch, head) pairs itself

    @property
    def members(self) -> list[str]:
        return [self.scores.anchor] + [m.name for m in self.softmax.members] + [self.context.anchor]


def _reads(st: Step) -> set[str]:
    from symfuse.te.analysis import loads

    if isinstance(st, GemmStep):
        return {v.buffer for v in (st.a, st.b) if v is not None} | ({st.bias} if st.bias else set())
    if isinstance(st, NativeStep):
        return {ld.tensor for m in st.members for ld, _ in loads(m.body)}
    return {v.name for v in st.node.inputs if v is not None}


def _unit_last(v: View | None) -> bool:
    return v is not None and len(v.sizes) == 4 and v.strides[-1] == 1


def _candidate(a: Step, b: Step, c: Step, sched: Schedule, readers: dict[str, int]) -> bool:
    if not (isinstance(a, GemmStep) and isinstance(b, NativeStep) and isinstance(c, GemmStep)):
        return False
    if a.op != "matmul" or c.op != "matmul" or a.epilogue or c.epilogue or a.bias or c.bias:
        return False
    if b.kind != "reduction" or b.outputs != [c.a.buffer] or a.out in sched.outputs or c.a.buffer in sched.outputs:
        return False
    scores, probs = a.out, c.a.buffer
    if readers.get(scores) != 1 or readers.get(probs) != 1 or scores not in _reads(b):
        return False
    pbuf = sched.buffers[probs]
    if c.a.strides != pbuf.strides or c.a.offset != 0 or tuple(c.a.sizes) != tuple(pbuf.shape):
        return False
    if sched.buffers[scores].dtype.name != "float32" or pbuf.dtype.name != "float32":
        return False
    # q and the output need unit stride along their last dim (the micro-kernel's rows)
    out = sched.buffers[c.out]
    return _unit_last(a.a) and len(a.b.sizes) == 4 and len(c.b.sizes) == 4 and out.strides[-1] == 1


def merge_attention(sched: Schedule) -> Schedule:
    readers: dict[str, int] = {}
    for st in sched.steps:
        for name in _reads(st):
            readers[name] = readers.get(name, 0) + 1
    steps: list = []
    i = 0
    while i < len(sched.steps):
        a, b, c = (sched.steps + [None, None])[i : i + 3]
        if c is not None and _candidate(a, b, c, sched, readers):
            steps.append(AttentionStep(f"{b.name}_attention", a, b, c, c.out))
            sched.notes.append(f"{a.name}, {b.name} and {c.name} run as one kernel: the scores stay in cache")
            i += 3
        else:
            steps.append(a)
            i += 1
    sched.steps = steps
    return sched


__all__ = ["MERGED_KEYS", "AttentionStep", "merge_attention"]
