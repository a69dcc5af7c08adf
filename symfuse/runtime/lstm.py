"""A multi-layer LSTM on the library's recurrence (`codegen/cpu/lstm.py`), float32.

Per layer and direction: the input projection of every step is one GEMM here (x W_ih^T plus
both biases), then one call runs the steps. A bidirectional layer's two directions write
the two halves of its output's features; the next layer reads that output.
"""

from __future__ import annotations

import weakref

import torch

# tensors derived from a program's constants (W transposed, the summed biases), made once per
# tuple of source tensors and dropped with the first of them
_DERIVED: dict[tuple, tuple[weakref.ref, torch.Tensor]] = {}


def _once(make, *sources: torch.Tensor) -> torch.Tensor:
    key = (make, *map(id, sources))
    held = _DERIVED.get(key)
    if held is None or held[0]() is not sources[0]:
        held = _DERIVED[key] = (weakref.ref(sources[0], lambda _: _DERIVED.pop(key, None)), make(*sources))
    return held[1]


def _transpose(w: torch.Tensor) -> torch.Tensor:
    return w.t().contiguous()


def _transposed(w: torch.Tensor) -> torch.Tensor:
    """W transposed ([K, 4H]: the library broadcasts a row's elements over W^T's rows)."""
    return _once(_transpose, w)


def _bias(b_ih: torch.Tensor, b_hh: torch.Tensor) -> torch.Tensor:
    return _once(torch.add, b_ih, b_hh)


# the input projection runs on the library's `sf_lstm_input` up to this many multiply-adds
# (rows x features x 4 hidden), torch's addmm above: under it addmm's call costs more than its
# arithmetic (`symfuse bench --model lstm --seq 16,128 --profile`)
PROJECT_IN_LIBRARY = 1 << 22


def torch_lstm(x, h0, c0, params, num_layers, bidirectional, batch_first, has_biases, hidden_size):
    """`torch.lstm` with an op's arguments: the lstm op's reference, and what runs tensors
    other than float32."""
    b = x.shape[0] if batch_first else x.shape[1]
    dirs = 2 if bidirectional else 1
    zeros = x.new_zeros(num_layers * dirs, b, hidden_size)
    hx = [h0 if h0 is not None else zeros, c0 if c0 is not None else zeros]
    return tuple(torch.lstm(x, hx, params, has_biases, num_layers, 0.0, False, bidirectional, batch_first))


def run_lstm(
    recurrence, x, h0, c0, params, num_layers, bidirectional, batch_first, has_biases, hidden_size, project=None
):
    """(output, h_n, c_n) as `torch.lstm` returns them (no dropout: inference). Tensors other
    than float32 (a bf16 program stores its weights in bf16) go through torch's LSTM.
    `project`: the library's input projection (`sf_lstm_input`), for few rows."""
    if any(t is not None and t.dtype != torch.float32 for t in (x, h0, c0, *params)):
        return torch_lstm(x, h0, c0, params, num_layers, bidirectional, batch_first, has_biases, hidden_size)
    dirs = 2 if bidirectional else 1
    seq = x.transpose(0, 1) if batch_first else x  # time-major [T, B, features]
    t, b = seq.shape[0], seq.shape[1]
    hn = (h0.clone() if h0 is not None else x.new_zeros(num_layers * dirs, b, hidden_size)).contiguous()
    cn = (c0.clone() if c0 is not None else x.new_zeros(num_layers * dirs, b, hidden_size)).contiguous()
    per = 4 if has_biases else 2
    layer_in = seq.contiguous()
    for layer in range(num_layers):
        out = x.new_empty(t, b, dirs * hidden_size)
        for d in range(dirs):
            w_ih, w_hh, *biases = params[(layer * dirs + d) * per : (layer * dirs + d + 1) * per]
            rows = layer_in.reshape(t * b, layer_in.shape[-1])
            features = rows.shape[1]
            if project is not None and t * b * features * 4 * hidden_size <= PROJECT_IN_LIBRARY:
                gates = x.new_empty(t * b, 4 * hidden_size)
                bias = _bias(*biases) if biases else x.new_zeros(4 * hidden_size)
                project(rows.data_ptr(), rows.stride(0), _transposed(w_ih).data_ptr(), bias.data_ptr(),
                        gates.data_ptr(), t * b, features, 4 * hidden_size)  # fmt: skip
            else:
                gates = torch.addmm(_bias(*biases), rows, w_ih.t()) if biases else rows @ w_ih.t()
            w_hh = _transposed(w_hh)
            k = layer * dirs + d
            recurrence(
                gates.data_ptr(), w_hh.data_ptr(), hn[k].data_ptr(), cn[k].data_ptr(),
                out.data_ptr() + d * hidden_size * out.element_size(), dirs * hidden_size, t, b, hidden_size, d,
            )  # fmt: skip
        layer_in = out
    return (layer_in.transpose(0, 1).contiguous() if batch_first else layer_in), hn, cn
