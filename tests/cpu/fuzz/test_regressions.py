"""Mismatches and crashes the fuzzer found, each as a named test (the program it printed,
reduced by hand)."""

import torch

import symfuse


def _check(model, example, dynamic, bindings, make):
    c = symfuse.compile(model, example, dynamic)
    for b in bindings:
        x = make(*b)
        with torch.no_grad():
            want = model(*x)
        for g, w in zip(c(*x), want):
            torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)


class GramOfGather(torch.nn.Module):
    """Found by seed 838: `e @ e^T` where `e` is an embedding lookup. A library GEMM cannot
    read a gather as a view, so both operands are copies of `e` in two layouts; both got the
    same name, the first copy ran with the second's row count and wrote past its buffer
    (a wrong index error, then heap corruption)."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("emb", torch.randn(5, 4, generator=torch.Generator().manual_seed(0)))

    def forward(self, ids):
        e = torch.nn.functional.embedding(ids, self.emb)
        return torch.relu(e), e @ e.transpose(-1, -2)


def test_gram_matrix_of_a_gather_copies_each_operand_once():
    g = torch.Generator().manual_seed(1)
    _check(GramOfGather(), (torch.randint(0, 5, (2, 5), generator=g),), {"ids": {0: "B", 1: "S"}},
           [(1, 1), (3, 7), (2, 16), (5, 33)], lambda b, s: (torch.randint(0, 5, (b, s), generator=g),))  # fmt: skip


class EpilogueReadsGemmInput(torch.nn.Module):
    """Found by seed 54: `y = linear(m) / (|m| + 1)` with `m = amax(x)`. The division joined
    the GEMM's kernel as its epilogue, and `m` followed it there, so the GEMM read `m` before
    the kernel computed it (an unbound variable in the host code). Also: a linear whose
    weight is a slice of a constant was handed the whole constant."""

    def __init__(self) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.register_buffer("w", torch.randn(8, 17, generator=g))
        self.register_buffer("b", torch.randn(8, generator=g))

    def forward(self, x):
        m = torch.amax(x, dim=2)  # [S, 1]
        return torch.nn.functional.linear(m, self.w[:, :1], self.b) / (torch.abs(m) + 1.0), m


def test_an_epilogue_never_holds_what_its_gemm_reads():
    g = torch.Generator().manual_seed(2)
    _check(EpilogueReadsGemmInput(), (torch.randn(5, 1, 1, generator=g),), {"x": {0: "S"}},
           [(1,), (7,), (16,)], lambda s: (torch.randn(s, 1, 1, generator=g),))  # fmt: skip


class CatOfGathers(torch.nn.Module):
    """Found by seed 27384: a concatenation is a select per element, and its code evaluates
    both sides; the side not taken read its part at an index outside the part (before the
    buffer's start for the second part), so the embedding's index came from garbage memory
    and raised a false out-of-range error. Each part's index is now clamped into the part."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("emb", torch.randn(5, 8, generator=torch.Generator().manual_seed(0)))

    def forward(self, ids):
        e = torch.nn.functional.embedding(ids, self.emb)
        c = torch.cat([e, e], dim=1)
        b = c @ c.transpose(-1, -2)
        return torch.log(torch.abs(b) + 1).sum(dim=2), b


def test_concatenation_reads_inside_each_part():
    g = torch.Generator().manual_seed(3)
    _check(CatOfGathers(), (torch.randint(0, 5, (5, 4), generator=g),), {"ids": {0: "S"}},
           [(1,), (7,), (33,)], lambda s: (torch.randint(0, 5, (s, 4), generator=g),))  # fmt: skip


class EpilogueAfterReductionOfGemm(torch.nn.Module):
    """Found by seed 1030: `y = linear(x); y - amax(y, dim=1)`. The subtraction joined the
    GEMM's kernel as its epilogue though it also reads `amax(y)`, which needs the GEMM's
    whole output first: a cycle between kernels, and the planner found no order to run them."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(6, 17)

    def forward(self, x):
        y = self.proj(x[:, :, 11:])
        m = torch.amax(y, dim=1, keepdim=True)
        return y - m, m


def test_an_epilogue_that_would_close_a_cycle_is_its_own_kernel():
    g = torch.Generator().manual_seed(4)
    _check(EpilogueAfterReductionOfGemm(), (torch.randn(2, 5, 17, generator=g),), {"x": {0: "B", 1: "S"}},
           [(1, 1), (3, 7), (2, 16)], lambda b, s: (torch.randn(b, s, 17, generator=g),))  # fmt: skip


class NormOfConstantRows(torch.nn.Module):
    """Found by seed 1127: layer norm over rows whose elements are all equal (a unit dim
    expanded). The mean `sum(x) / n` came out an ulp off `x`, and dividing by
    `sqrt(var + eps)` magnified that to 3e-4; torch (Welford) is exact there. The mean is
    now shifted by the row's first element, which makes a constant row exact."""

    def __init__(self) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.register_buffer("w", torch.randn(3, generator=g))
        self.register_buffer("b", torch.randn(3, generator=g))

    def forward(self, x):
        e = torch.log_softmax(x.expand(-1, -1, 3), dim=0)
        return (torch.nn.functional.layer_norm(e, (3,), self.w, self.b),)


def test_layer_norm_of_a_constant_row_is_its_bias():
    g = torch.Generator().manual_seed(5)
    model = NormOfConstantRows()
    _check(model, (torch.randn(2, 5, 1, generator=g),), {"x": {0: "B", 1: "S"}},
           [(1, 1), (5, 33)], lambda b, s: (torch.randn(b, s, 1, generator=g) * 2,))  # fmt: skip
    c = symfuse.compile(model, (torch.randn(2, 5, 1, generator=g),), {"x": {0: "B", 1: "S"}})
    (y,) = c(torch.randn(5, 33, 1, generator=g) * 2)
    assert torch.equal(y, model.b.expand_as(y))
