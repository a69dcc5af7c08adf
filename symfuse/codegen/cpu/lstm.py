"""The LSTM recurrence in C++: one call runs every time step of one layer and direction.

torch's `lstm` dispatches a handful of ops per time step, so a small LSTM is its
overhead (`symfuse bench --model lstm --engines symfuse,eager,onnxruntime`). Here the input
projection of all steps is one GEMM (`sf_lstm_input` for few rows, a library GEMM above:
`runtime/lstm.py`), and the steps run inside one parallel region: each thread owns a share
of the hidden units (their four gates, cell and output), and a barrier separates one step
from the next, which reads every unit's output (Souffle's one kernel with barriers in place
of launches).
"""

from symfuse.codegen.cpu.c import header  # noqa: E402

LSTM_SOURCE = header("sf_lstm.h")
