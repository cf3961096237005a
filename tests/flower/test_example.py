"""examples/flower_mf.py runs as it stands, from a clean shell, and both of its runs stay
within the ε they were calibrated to."""

import re
import subprocess
import sys

import userenv


def test_flower_example_runs_at_the_same_epsilon():
  res = subprocess.run([sys.executable, "examples/flower_mf.py"], cwd=userenv.REPO,
                       env=userenv.env(pythonpath=True), capture_output=True, text=True,
                       timeout=600)
  assert res.returncode == 0, res.stderr[-2000:]
  assert "Traceback" not in res.stderr
  found = re.findall(r"epsilon ([\d.]+), loss ([\d.]+)", res.stdout)
  assert len(found) == 2, res.stdout
  for epsilon, loss in found:
    assert 0 < float(epsilon) <= 8.0 and float(loss) >= 0.0
