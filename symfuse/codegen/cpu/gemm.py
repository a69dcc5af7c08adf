"""symfuse's own GEMM for linear layers over few rows, where streaming the weights is the
cost: all rows pass over each chunk of a panel of packed weights while it sits in cache (two
thirds of L1 or a quarter of L2, measured per machine: `chunk_choices`), the next chunk is
prefetched meanwhile (while a thread has up to 192 rows on
AVX-512; past them the hardware's prefetchers keep up, and the tiles run without the
bookkeeping, as the merged attention's do), and bias and activation are applied
to the tile while it is in registers and cache. The host picks it or oneDNN per call from
the row count, at a switch point measured on the machine (`calibrate.py`).

The micro-kernel is written once over `sf_vec` (c.py's vector abstraction) and shaped per
target: a tile of `rows` x `vectors` accumulators plus one register per weight vector and
one for the broadcast A element must fit in the target's vector registers (AVX-512: 6 x 4
vectors of 16 floats, a 64-column panel; AVX2: 6 x 2 vectors of 8, a 16-column panel;
NEON: 6 x 4 vectors of 4; SSE2 and other targets: 4 x 3 vectors of 4). The same tile is
the merged attention kernel's GEMM.
"""

from __future__ import annotations

import torch

from symfuse.codegen.cpu.c import defines, header
from symfuse.runtime.code import Tile
from symfuse.runtime.target import Target

ACTIVATIONS = {"none": 0, "gelu": 1, "gelu_tanh": 2, "relu": 3, "tanh": 4, "sigmoid": 5, "swish": 6}


def tile_for(target: Target, chunk: int = 0) -> Tile:
    """The register tile with the most accumulators that fits (rows*vectors accumulators,
    `vectors` weight vectors, one broadcast). On a tie, the one whose panel row is whole
    cache lines (AVX2: 6x2, 64 bytes a step, over 4x3's 96 bytes, which loads A less but ran
    BERT's layers slower, `python bench/gemm_libraries.py`), then the wider one. `chunk`:
    steps of K in a chunk of a panel (0: the first of `chunk_choices`)."""
    rows, vectors = _tile_shape(target)
    return Tile(rows, vectors, target.lanes, chunk or chunk_choices(target)[0])


def _tile_shape(target: Target) -> tuple[int, int]:
    best = (0, 0, 0, 0)
    for vectors in (1, 2, 3, 4):
        rows = min(8, (target.registers - vectors - 1) // vectors)
        whole_lines = (vectors * target.vector_bytes) % 64 == 0
        if rows >= 1:
            best = max(best, (rows * vectors, whole_lines, vectors, rows))
    return best[3], best[2]


def chunk_choices(target: Target) -> tuple[int, ...]:
    """The steps of K a chunk of a panel may take, one of which a machine measures once
    (calibrate.py, "row_chunk"): two thirds of L1, so that the chunk stays there while every
    block of rows multiplies it (on a CPU with a large L1 the best choice for
    BERT-base's weights streamed at 16-64 rows), or a quarter of L2, fewer passes over the tile's
    accumulators (each chunk adds to them in C; on a CPU with a small L1 the faster choice for
    bert-small's layers at 64-128 rows). Which one wins differs by CPU, hence the measurement
    (`Calibration._chunk`; `symfuse bench --model bert-small --profile` shows the rate it gives)."""
    panel_bytes = _tile_shape(target)[1] * target.vector_bytes
    l1 = max(8, target.l1d * 2 // 3 // panel_bytes // 8 * 8)
    l2 = target.l2 // 4 // panel_bytes // 8 * 8
    return (l1, l2) if l2 > l1 else (l1,)


def pack_panels(w: torch.Tensor, panel: int, bf16: bool = False) -> torch.Tensor:
    """Weight [N, K] as panels [ceil(N/panel), K, panel], zero-padded: one panel is contiguous.
    `bf16`: bfloat16 panels [ceil(N/panel), K'/2, panel, 2], the pair (k, k+1) of each column
    side by side, as `vdpbf16ps` and AMX's `tdpbf16ps` multiply them (K' is K padded with zeros
    to a multiple of 32, an AMX tile's steps)."""
    n, k = w.shape
    panels = (n + panel - 1) // panel
    if bf16:
        kp = (k + 31) // 32 * 32
        padded = torch.zeros(panels * panel, kp, dtype=torch.bfloat16)
        padded[:n, :k] = w
        return padded.view(panels, panel, kp // 2, 2).transpose(1, 2).contiguous()
    padded = torch.zeros(panels * panel, k, dtype=w.dtype)
    padded[:n] = w
    return padded.view(panels, panel, k).transpose(1, 2).contiguous()


def has_bf16_rows(target: Target) -> bool:
    """Whether the bf16 row kernel (`vdpbf16ps`, AVX512-BF16) builds and runs for `target`."""
    return "avx512_bf16" in target.extensions


# how the bf16 row kernel multiplies (the value of calibration kind "bf16_multiply")


def bf16_multiplies(target: Target) -> tuple[int, ...]:
    """The ways of `BF16_MULTIPLY` the bf16 row kernel can use on `target` (AMX where the CPU
    has it; the kernel falls back to vdpbf16ps if the OS will not grant the tiles)."""
    return (0, 1, 2) if "amx_bf16" in target.extensions else (0, 1)


def activation_code(postop: tuple[str, str] | None) -> int:
    if postop is None:
        return 0
    attr, algo = postop
    return ACTIVATIONS["gelu_tanh" if attr == "gelu" and algo == "tanh" else attr]


def gemm_source(tile: Tile, bf16: bool = False, multiply: int = 0, rows_elsewhere: bool = False) -> str:
    """The micro-kernel `sf_tile<MR>` and `sf_linear_rows`, for `tile`; with `bf16` also
    `sf_tile_bf16<MR>` and `sf_linear_rows_bf16` (AVX512-BF16 targets only), multiplying as
    `BF16_MULTIPLY[multiply]` says. `rows_elsewhere`: the row GEMM declared, not defined (for
    the translation unit of a model's kernels; the other one defines it)."""
    tiles = lambda pf: ", ".join(f"sf_tile<{m}, {pf}>" for m in range(1, tile.rows + 1))  # noqa: E731
    out = "#define SF_ROWS_ELSEWHERE 1\n" if rows_elsewhere else ""
    out += defines(
        MR=tile.rows,
        NV=tile.vectors,
        KC=tile.chunk,
        TILES=tiles("false"),
        TILES_PF=tiles("true"),
        TILES_NV=_by_vectors(tile, "sf_tile<{m}, false, {v}, true>"),
    )
    out += header("sf_gemm.h")
    if bf16:
        out += defines(
            BF16_MULTIPLY=multiply,
            TILES_BF16=", ".join(f"sf_tile_bf16<{m}>" for m in range(1, tile.rows + 1)),
            TILES_DP=_by_vectors(tile, "sf_tile_dp<{m}, {v}>"),
        )
        out += header("sf_gemm_bf16.h")
    return out


def _by_vectors(tile: Tile, name: str) -> str:
    """A C table [vectors][rows] of the tile template `name` (`{m}` rows, `{v}` vectors)."""
    rows = range(1, tile.rows + 1)
    return ", ".join("{" + ", ".join(name.format(m=m, v=v) for m in rows) + "}" for v in range(1, tile.vectors + 1))
