"""Tensor expressions: the whole graph as compute rules over symbolic domains.

`te.lower.lower(graph)` builds the TE program, `te.interp` runs it on torch tensors,
`te.analysis` classifies TEs and their dependences as Souffle does. Importing this package
imports nothing else, so the op registry can use `te.rules` without a cycle.
"""
