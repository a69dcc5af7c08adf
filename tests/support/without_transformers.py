"""Running code in a fresh Python process where `transformers` cannot be imported: what a
saved artifact must run in."""

from __future__ import annotations

import subprocess
import sys
import textwrap

_BLOCK = """
import sys
class NoTransformers:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "transformers":
            raise ImportError("transformers is not installed here")
sys.meta_path.insert(0, NoTransformers())
"""


def run_without_transformers(code: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """`code` (dedented) in a child process whose imports of transformers fail; its output as text."""
    child = _BLOCK + textwrap.dedent(code)
    return subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=timeout)
