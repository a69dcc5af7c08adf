"""Graph rewrites. Each pass maps a graph to a new graph with the same semantics.

Passes rebuild the graph through `GraphBuilder`, so every rewritten node gets its type
from the registry's rules against the same shape store; tests run the reference executor
on the graph before and after a pass at several bindings.
"""

from symfuse.passes.algebra import fold_layout_chains, hoist_scales, recognise_gelu_tanh
from symfuse.passes.attention import decompose_attention
from symfuse.passes.batch_norm import fold_batch_norm
from symfuse.passes.cse import merge_common_subexpressions
from symfuse.passes.horizontal import merge_parallel_linears
from symfuse.passes.linear import canonical_linears
from symfuse.passes.rewrite import Rewriter

PIPELINE = (
    merge_common_subexpressions,
    fold_layout_chains,
    hoist_scales,
    recognise_gelu_tanh,
    decompose_attention,
    canonical_linears,
    merge_parallel_linears,
    fold_batch_norm,
)

__all__ = [
    "PIPELINE",
    "Rewriter",
    "canonical_linears",
    "decompose_attention",
    "fold_batch_norm",
    "fold_layout_chains",
    "hoist_scales",
    "merge_common_subexpressions",
    "merge_parallel_linears",
    "recognise_gelu_tanh",
]
