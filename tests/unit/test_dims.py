import sympy

from symfuse.ir.dims import dmin, evaluate, exact_quotient, floordiv, fmt, mod, sym, to_python


def test_canonical_products_compare_equal():
    B, S = sym("B"), sym("S")
    assert B * S * 768 == 768 * S * B
    assert fmt(B * S * 768) == "768*B*S"


def test_printer_reads_like_python():
    S = sym("S")
    assert fmt(floordiv(S, 2) + 1) == "S//2 + 1"
    assert fmt(dmin(S, 512)) == "min(512, S)"
    assert fmt(mod(S, 16)) == "S%16"


def test_to_python_matches_sympy_at_many_points():
    B, S = sym("B"), sym("S")
    exprs = [B * S * 12, floordiv(S - 1, 2) + 1, dmin(S, 512) - 3, mod(B * S, 16), sympy.ceiling(S / 4), S**2 + B]
    for e in exprs:
        f = eval("lambda B, S: " + to_python(e))
        for b, s in [(1, 1), (2, 7), (3, 16), (8, 513)]:
            want = int(e.subs({B: b, S: s}))
            assert f(b, s) == want == evaluate(e, {"B": b, "S": s}), fmt(e)


def test_exact_quotient():
    B, S = sym("B"), sym("S")
    assert exact_quotient(B * S * 768, B * S * 64) == 12
    assert exact_quotient(B * S * 768, 768) == B * S
    assert exact_quotient(S, 2) is None
    assert exact_quotient(B * S, B * S * 2) is None
