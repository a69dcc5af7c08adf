import pytest

from symfuse.ir.dims import dmin, floordiv, sym
from symfuse.ir.tri import Tri
from symfuse.shape.store import Origin, ShapeError, ShapeStore

ORIGIN = Origin("test")


def store_with(*names):
    st = ShapeStore()
    return st, [st.declare(n, bound_at=f"input 'x' dim {i}") for i, n in enumerate(names)]


def test_union_find_makes_dims_equal_and_records_why():
    st, (B, S, T) = store_with("B", "S", "T")
    assert st.dims_equal(S, T) is Tri.UNKNOWN
    rep = st.eq(T, S, Origin("broadcast", "add", "add_1", "m.py:3"))
    assert rep == S and st.canon(T) == S
    assert st.dims_equal(S, T) is Tri.YES
    assert st.same_shape((B, T, 768), (B, S, 768)) is Tri.YES
    ((rep_, members, origins),) = st.dim_classes()
    assert members == [S, T] and origins[0].op == "add"
    assert [f.text() for f in st.checks()] == ["T == S"]


def test_min_equal_to_symbol_bounds_its_range():
    st, (S,) = store_with("S")
    st.eq(dmin(S, 512), S, ORIGIN)
    assert st.range(S) == (1, 512)
    assert st.canon(dmin(S, 512)) == S
    assert st.dims_equal(S, 600) is Tri.NO


def test_equal_symbols_share_ranges():
    st, (S, T) = store_with("S", "T")
    st.eq(dmin(T, 512), T, ORIGIN)
    st.eq(S, T, ORIGIN)
    assert st.range(S) == (1, 512)


def test_constants_that_differ_are_a_compile_error():
    st, (S,) = store_with("S")
    st.eq(S, 64, ORIGIN)
    with pytest.raises(ShapeError, match="never holds"):
        st.eq(S, 128, ORIGIN)


def test_contradictory_range_is_a_compile_error():
    st = ShapeStore()
    S = st.declare("S", lo=600)
    with pytest.raises(ShapeError):
        st.le(S, 512, ORIGIN)


def test_product_classes():
    st, (B, S, N) = store_with("B", "S", "N")
    assert st.same_numel((B, S, 768), (B, S, 12, 64)) is Tri.YES
    assert st.same_numel((B, S, 768), (N, 768)) is Tri.UNKNOWN
    st.numel_eq((B, S, 768), (N, 768), ORIGIN)
    assert st.same_numel((B, S, 768), (N, 768)) is Tri.YES
    assert st.same_numel((B, S), (N,)) is Tri.UNKNOWN  # only the recorded products are tied


def test_divisibility():
    st, (S,) = store_with("S")
    assert st.divides(16 * S, 16) is Tri.YES
    assert st.divides(S, 16) is Tri.UNKNOWN
    assert st.divides(24, 16) is Tri.NO
    st.divisible(S, 16, ORIGIN)
    assert st.divides(S, 8) is Tri.YES
    assert st.divides(3 * S, 48) is Tri.YES


def test_bounds_of_expressions():
    st = ShapeStore()
    H = st.declare("H", lo=8, hi=224)
    assert st.range(floordiv(H - 1, 2) + 1) == (4, 112)
    assert st.range(dmin(H, 100)) == (8, 100)


def test_tri_is_never_truthy():
    with pytest.raises(TypeError):
        bool(Tri.YES)


def test_representative_prefers_constants_then_earlier_symbols():
    st, (S, T) = store_with("S", "T")
    st.eq(T, 2 * S, ORIGIN)
    assert st.canon(T + 1) == 2 * S + 1
    st.eq(S, 8, ORIGIN)
    assert st.canon(T) == 16
    assert sym("S") in st.members(8)
