import pytest


@pytest.fixture(autouse=True)
def no_compiler(monkeypatch, tmp_path):
    """The unit tier runs without a C++ compiler: a test here that builds code fails."""
    monkeypatch.setenv("CXX", str(tmp_path / "no-compiler-in-the-unit-tier"))
