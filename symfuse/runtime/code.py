"""What the compiler hands the runtime: the host code and the tables it reads, as plain data.

A compiled program is its kernel library plus a `HostCode`: the generated Python host
function and the names it expects in its namespace (constants, packed weights, switch
points, torch-run functions by recipe). An artifact pickles these; nothing here refers to
the compiler's own types, so loading one needs none of it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from symfuse.runtime.switches import Threshold


@dataclass
class RunCode:
    source: str  # C++: sf_addr and sf_run
    params: list[str]  # the Python host's arguments after (sym, ws, th, ca): inputs', then outputs' addresses
    constants: list[str] = field(default_factory=list)  # ca[i]: the address of this namespace name
    thresholds: list[str] = field(default_factory=list)  # th[i]: this switch point's value


@dataclass(frozen=True)
class Tile:
    rows: int  # rows of A per micro-kernel call (MR)
    vectors: int  # vectors of output columns per row (NV)
    lanes: int  # floats per vector
    chunk: int = 128  # steps of K the row GEMM takes from a panel at a time (KC)

    @property
    def panel(self) -> int:
        """Output columns per packed weight panel."""
        return self.vectors * self.lanes


@dataclass
class HostCode:
    source: str
    constants: dict[str, str] = field(default_factory=dict)  # namespace name -> constant value name
    packed: dict[str, str] = field(default_factory=dict)  # W[name] -> weight to reorder for oneDNN
    # namespace name -> weight to pack for sf_linear_rows (bf16 programs: sf_linear_rows_bf16)
    panels: dict[str, str] = field(default_factory=dict)
    # namespace name -> how to make its function: ("op", op, attrs) runs an op's torch reference,
    # ("te", step) a kernel's tensor expressions through torch (plain data: an artifact saves it)
    recipes: dict[str, tuple] = field(default_factory=dict)
    kernels: dict[str, int] = field(default_factory=dict)  # native kernel -> number of buffer arguments
    # namespace name -> (kind, shape): a version switch point, measured per machine (runtime/switches.py)
    thresholds: dict[str, tuple[str, tuple[int, ...]]] = field(default_factory=dict)
    step_thresholds: dict[str, str] = field(default_factory=dict)  # step -> the threshold it reads
    precision: str = "fp32"  # bf16: float32 buffers and constants are stored in bfloat16
    bf16_multiply: Threshold | None = None  # how the bf16 row kernel multiplies (switches.BF16_MULTIPLY)
    row_chunk: Threshold | None = None  # steps of K in a chunk of the row kernel's panels (gemm.chunk_choices)
    lstm: bool = False  # an LSTM runs on the library's recurrence (codegen/cpu/lstm.py)
    paged: bool = False  # a decoder's attention: the CPU library then has its kernel (codegen/cpu/paged.py)
    conv_weights: tuple[str, ...] = ()  # constant convolution weights, prepared once (runtime/program.py: ConvWeights)
    run: RunCode | None = None  # the whole call in C++ where every step runs in the library (codegen/cpu/run.py)
    run_missing: str = ""  # else why not
