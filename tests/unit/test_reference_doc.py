"""docs/reference.md is what scripts/reference.py makes of the code."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_reference_page_is_up_to_date():
    r = subprocess.run([sys.executable, "scripts/reference.py", "--check"], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
