"""Capturing `torch.nn.LSTM` with a dynamic sequence length.

torch.export specialises the sequence length of `aten.lstm` (its fake implementation
unrolls the time loop). During capture every `nn.LSTM` in the model is swapped for a
module that calls `symfuse::lstm`, a custom op whose fake implementation only computes
shapes; the graph then holds one `lstm` node with symbolic batch and time.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

_SCHEMA_DOC = "symfuse::lstm: a whole multi-layer LSTM as one op"


@torch.library.custom_op("symfuse::lstm", mutates_args=())
def lstm_op(
    x: torch.Tensor,
    h0: torch.Tensor | None,
    c0: torch.Tensor | None,
    params: list[torch.Tensor],
    num_layers: int,
    bidirectional: bool,
    batch_first: bool,
    has_biases: bool,
    hidden_size: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    b = x.shape[0] if batch_first else x.shape[1]
    zeros = x.new_zeros(num_layers * (2 if bidirectional else 1), b, hidden_size)
    hx = [h0 if h0 is not None else zeros, c0 if c0 is not None else zeros]
    out, h, c = torch.lstm(x, hx, params, has_biases, num_layers, 0.0, False, bidirectional, batch_first)
    return out, h, c


@lstm_op.register_fake
def _(x, h0, c0, params, num_layers, bidirectional, batch_first, has_biases, hidden_size):
    dirs = 2 if bidirectional else 1
    b, t = (x.shape[0], x.shape[1]) if batch_first else (x.shape[1], x.shape[0])
    out = x.new_empty((b, t, dirs * hidden_size) if batch_first else (t, b, dirs * hidden_size))
    state = x.new_empty((num_layers * dirs, b, hidden_size))
    return out, state, state.clone()


class _CapturedLSTM(torch.nn.Module):
    def __init__(self, lstm: torch.nn.LSTM) -> None:
        super().__init__()
        if lstm.proj_size:
            raise NotImplementedError("symfuse does not support LSTM with proj_size yet")
        self.inner = lstm

    def forward(self, input, hx=None):  # noqa: A002 (nn.LSTM's names: a model that is an LSTM keeps its inputs' names)
        m = self.inner
        if input.dim() != 3:
            raise NotImplementedError("symfuse captures batched (3-D) LSTM input only")
        h0, c0 = hx if hx is not None else (None, None)
        out, h, c = torch.ops.symfuse.lstm(
            input, h0, c0, list(m._flat_weights), m.num_layers, m.bidirectional, m.batch_first, m.bias, m.hidden_size
        )
        return out, (h, c)


def as_root(model: torch.nn.Module) -> torch.nn.Module:
    """A model that is itself an nn.LSTM, wrapped so that capture sees the custom op (the
    swap below replaces LSTMs inside a model, where a parent holds them)."""
    if type(model) is not torch.nn.LSTM:
        return model
    wrapped = _CapturedLSTM(model)
    return wrapped.train(model.training)


@contextlib.contextmanager
def lstms_as_custom_op(model: torch.nn.Module) -> Iterator[None]:
    """Swap every nn.LSTM for the capturable wrapper, and always swap back."""
    swapped = [
        (parent, name, child)
        for parent in model.modules()
        for name, child in parent.named_children()
        if type(child) is torch.nn.LSTM and not isinstance(parent, _CapturedLSTM)
    ]
    for parent, name, child in swapped:
        setattr(parent, name, _CapturedLSTM(child))
    try:
        yield
    finally:
        for parent, name, child in swapped:
            setattr(parent, name, child)
