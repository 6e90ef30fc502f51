"""The config layer and the CLI's light path import neither torch nor Ray nor MLflow, in a fresh
interpreter: a bad config is answered before any of them loads (the config sections live in
torch-free modules, ``trainers/*/config.py``; ``docs/architecture.md``, "Imports")."""

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "ray", "mlflow")


@pytest.mark.parametrize("module", ["orchestrator.config.preflight", "orchestrator.cli"])
def test_importing_loads_no_heavy_package(module):
    script = textwrap.dedent(f"""
        import json, sys
        import {module}
        print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))
    """)
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []
