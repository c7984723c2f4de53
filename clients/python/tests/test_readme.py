"""The README's GRPO-step example runs, as printed there, against a real service and the fake policy."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from conftest import HERE, REPO


def readme_example() -> str:
    text = (REPO / "README.md").read_text()
    m = re.search(r"<!-- grpo-example -->\s*```python\n(.*?)```", text, re.S)
    assert m, "README.md has no ```python block after <!-- grpo-example -->"
    return m.group(1)


def test_the_readme_grpo_step_runs(service, policy_url: str) -> None:
    code = readme_example()
    assert len(code.strip().splitlines()) <= 20
    env = dict(os.environ, ROLLBOX_URL=service.url, POLICY_URL=policy_url,
               PYTHONPATH=str(HERE.parent / "src") + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    print(p.stdout)  # the evidence: pytest -s shows it
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert lines[0].startswith("add rewards ") and "advantages" in lines[0]
    assert re.fullmatch(r"4 sequences, \d+ sampled tokens, policy step-1 announced to \d+ rollouts?", lines[-1]), lines[-1]
