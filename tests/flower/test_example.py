"""examples/flower_mf.py runs as it stands, from a clean shell (its --quick size: 16 rounds,
5 seeds): every run stays within the ε it was calibrated to, and its conclusion is the one
its own per-seed losses give (recomputed here from the printed losses)."""

import re
import subprocess
import sys

import numpy as np
from scipy import stats

import userenv

METHODS = ("BLT", "tff-mf independent", "Flower")


def paired(a, b):
  d = np.asarray(a) - np.asarray(b)
  return d.mean(), stats.t.ppf(0.975, len(d) - 1) * d.std(ddof=1) / np.sqrt(len(d))


def test_flower_example_concludes_from_its_seeds():
  res = subprocess.run([sys.executable, "examples/flower_mf.py", "--quick"], cwd=userenv.REPO,
                       env=userenv.env(pythonpath=True), capture_output=True, text=True,
                       timeout=600)
  assert res.returncode == 0, res.stderr[-2000:]
  assert "Traceback" not in res.stderr
  losses = {}
  for name in METHODS:
    m = re.search(rf"^{re.escape(name)} +z ([\d.]+), epsilon ([\d.]+), loss [\d.]+ "
                  r"\(per seed ([\d., ]+)\)$", res.stdout, re.M)
    assert m, res.stdout
    assert float(m.group(1)) > 0 and 0 < float(m.group(2)) <= 8.0
    losses[name] = [float(v) for v in m.group(3).split(", ")]
    assert len(losses[name]) >= 5 and min(losses[name]) >= 0
  noise = paired(losses["tff-mf independent"], losses["BLT"])
  schema = paired(losses["Flower"], losses["tff-mf independent"])
  for label, (mean, half) in (("correlated noise", noise), ("the participation schema", schema)):
    m = re.search(rf"^{label} .* (lowers|raises) the loss by ([\d.]+) ± ([\d.]+)", res.stdout,
                  re.M)
    assert m, res.stdout
    assert m.group(1) == ("lowers" if mean > 0 else "raises")
    # (the printed losses are rounded to 4 decimals)
    assert abs(float(m.group(2)) - abs(mean)) < 2e-3 and abs(float(m.group(3)) - half) < 2e-3
  d = (np.asarray(losses["Flower"]) - np.asarray(losses["tff-mf independent"])
       - (np.asarray(losses["tff-mf independent"]) - np.asarray(losses["BLT"])))
  mean, half = d.mean(), stats.t.ppf(0.975, len(d) - 1) * d.std(ddof=1) / np.sqrt(len(d))
  last = res.stdout.strip().splitlines()[-1]
  if abs(mean) > half + 2e-3:
    winner = "the participation schema" if mean > 0 else "correlated noise"
    assert last.startswith(f"{winner} won, by "), res.stdout
  elif abs(mean) < half - 2e-3:
    assert last.startswith("neither effect won at 95%"), res.stdout
