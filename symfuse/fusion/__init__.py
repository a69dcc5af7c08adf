"""Fusion: partitioning the TE program into kernels, from shape relations only."""
