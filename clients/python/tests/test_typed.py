"""The package type-checks under mypy --strict (the annotations are part of its API)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest
from conftest import CI, HERE


def test_mypy_strict() -> None:
    if importlib.util.find_spec("mypy") is None:
        if CI:
            pytest.fail("mypy is not installed (apt-get install python3-mypy; CI=true: no skipping)")
        pytest.skip("mypy is not installed")
    root = HERE.parent
    p = subprocess.run([sys.executable, "-m", "mypy", "--strict", "--no-incremental", "src/rollbox"], cwd=root,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
