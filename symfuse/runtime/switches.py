"""Switch points between kernel versions: what they are, not how they are measured.

A `Threshold` says up to which size (rows of a linear layer, keys of attention) the first of
two versions runs, and where that value came from. The host code reads these values on every
call; `codegen/cpu/calibrate.py` measures them, `Options.thresholds` sets them by hand, and an
artifact carries them. This module is plain data and pure functions, so a loaded artifact
needs nothing of the compiler to use them.
"""

from __future__ import annotations

from dataclasses import dataclass

from symfuse.options import rows_kind
from symfuse.runtime.target import Target

# how the bf16 row kernel multiplies (`bf16_multiply`), by value
BF16_MULTIPLY = {0: "vdpbf16ps", 1: "FMA on weights widened to float32", 2: "AMX tiles (tdpbf16ps)"}
# the row counts a linear layer's versions are timed at; above the last, oneDNN runs (its
# blocking covers any size; the row kernel's does not block the input)
ROWS = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096)
KEYS = (8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512)
HEADS = 12
BY_HAND = "set by hand (thresholds / SYMFUSE_THRESHOLDS)"
ANY_HEAD = 64  # the head size measured for attention whose head size is symbolic
STREAMED = 1 << 62  # weight traffic (`weight_traffic`) of weights that stream from memory


@dataclass(frozen=True)
class Threshold:
    kind: str  # one of options.THRESHOLD_KINDS
    shape: tuple[int, ...]  # (K, N) of a linear layer; (D,) of attention
    value: int  # the first version runs up to this size (inclusive)
    source: str  # where the value came from, for explain

    def describe(self) -> str:
        if self.kind == "bf16_multiply":
            what = f"symfuse's bf16 row kernel multiplies by {BF16_MULTIPLY.get(self.value, '?')}"
        elif self.kind == "row_chunk":
            what = f"symfuse's row kernel walks a weight panel {self.value} steps of K at a time"
        elif self.kind.startswith("linear_split"):
            k, n = self.shape
            bf16 = " bf16" if self.kind == "linear_split_bf16" else ""
            what = (
                f"linear {k}->{n}: the{bf16} row kernel's threads split the weights' panels up to {self.value} rows,"
                " the rows above"
            )
        elif self.kind.startswith("linear_rows"):
            k, n = self.shape
            bf16 = " bf16" if self.kind == "linear_rows_bf16" else ""
            what = f"linear {k}->{n}: symfuse's{bf16} row kernel up to {self.value} rows, oneDNN{bf16} above"
        elif self.kind.startswith("linear_library"):
            k, n = self.shape
            bf16 = " bf16" if self.kind == "linear_library_bf16" else ""
            what = f"linear {k}->{n}: above the{bf16} row kernel's rows, oneDNN{bf16} " + (
                f"up to {self.value} rows, the row kernel again above up to {ROWS[-1]}, oneDNN above that"
                if self.value < ROWS[-1]
                else "at every size"
            )
        else:
            library = self.kind.startswith("attention_keys_library")
            other = "torch's fused attention" if library else "the three steps"
            bf16 = " bf16" if self.kind.endswith("_bf16") else ""
            what = f"attention{bf16}, head size {self.shape[0]}: merged kernel up to {self.value} keys, {other} above"
        return f"{what} ({self.source})"


def weight_traffic(linear_bytes: int, target: Target) -> int:
    """The bytes that pass through the caches between two calls of a linear layer in a model
    whose linear weights take `linear_bytes`, as its switch points are measured: those weights
    rounded up to a power of two MiB (models of about one size share a measurement), at least
    twice the L2 cache of every core (the layers in between have taken it); above the L3 cache
    the weights stream from memory (`STREAMED`)."""
    if linear_bytes > target.l3:
        return STREAMED
    return max(least_traffic(target), 1 << max(20, (linear_bytes - 1).bit_length()))


def least_traffic(target: Target) -> int:
    """The bytes passed through the caches before every timed call of a linear layer at the
    least: twice the L2 cache of every core (the layers in between have taken it)."""
    return 2 * target.l2 * target.cores


def traffic_words(traffic: int, target: Target) -> str:
    """A measurement's weight traffic in words, for its key and for `explain` ("" where it is
    the least: twice the L2 cache of every core)."""
    if traffic == STREAMED:
        return "streamed"
    return f"through {traffic >> 20} MiB" if traffic > least_traffic(target) else ""


def by_hand(kind: str, shape: tuple[int, ...], manual: dict[str, int]) -> Threshold | None:
    """The switch point `kind` as the thresholds set by hand (`manual`) make it, or None where
    they leave it to measuring. With the row kernel's rows set by hand and no band, oneDNN
    runs at every size above them (no band)."""
    if kind in manual:
        return Threshold(kind, shape, manual[kind], BY_HAND)
    rows = rows_kind(kind)
    if kind.startswith("linear_library") and rows in manual:
        return Threshold(kind, shape, ROWS[-1], f"{rows} {BY_HAND}")
    return None
