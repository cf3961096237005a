"""examples/tutorial.ipynb runs: every code cell, in order, in one fresh interpreter.

The cells are executed as one program by the venv's Python in a user's minimal
environment (``userenv``), from the repository root as the notebook says; a failing
cell (its own asserts included) fails the test. The notebook is kept without outputs.
"""

import json
import os
import re
import subprocess
import sys

import userenv
from tff_mf.accounting import statement

NOTEBOOK = os.path.join(userenv.REPO, "examples", "tutorial.ipynb")


def _notebook():
  with open(NOTEBOOK, encoding="utf-8") as f:
    return json.load(f)


def test_tutorial_is_a_valid_notebook_without_outputs():
  nb = _notebook()
  assert nb["nbformat"] == 4
  kinds = [c["cell_type"] for c in nb["cells"]]
  assert set(kinds) <= {"markdown", "code"} and kinds.count("code") >= 4
  for cell in nb["cells"]:
    if cell["cell_type"] == "code":
      assert cell["outputs"] == [] and cell["execution_count"] is None
  text = "".join("".join(c["source"]) for c in nb["cells"])
  for topic in ("strategies.factorize", "build_mechanism", "epsilon"):
    assert topic in text


def test_tutorial_cells_run_in_order(tmp_path):
  """As its first cell tells a reader to run it, from the venv as it is (no Jupyter)."""
  result = subprocess.run([sys.executable, os.path.join("examples", "run_notebook.py"),
                           os.path.join("examples", "tutorial.ipynb")], cwd=userenv.REPO,
                          text=True, capture_output=True, env=userenv.env(home=str(tmp_path)),
                          timeout=600)
  assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
  out = result.stdout
  assert "optimal" in out and "honaker_online" in out  # the comparison table
  assert "round 16: held-out MSE" in out
  # ε to 4 significant digits, rounded up (it printed "epsilon: 8" for 7.997 before) ...
  printed = re.search(r"^epsilon: +(\S+) at delta = 1e-06", out, re.M)
  assert printed and re.fullmatch(r"\d\.\d{3}", printed.group(1)), out[-2000:]
  assert float(printed.group(1)) <= 8.0
  assert re.search(r"^epsilon = \d\.\d{3} \(amplification", out, re.M), out[-2000:]
  # ... and the privacy statement, which names the unit of privacy.
  assert statement.UNIT.split(":")[0] in out and "not covered" in out.lower(), out[-3000:]
  # The statement of this configuration (print(setup.privacy)): it names the mechanism, the
  # clients per round and the clip norm, and claims nothing about a training binary's files.
  assert re.search(r"Setup: mechanism opt_prefix_sum .*, n = 16 rounds, .*8 clients per round, "
                   r"fixed clip norm 1\.", out), out[-3000:]
  assert "metrics.csv" not in out, out[-3000:]
  first = "".join(_notebook()["cells"][0]["source"])
  assert ".venv/bin/python examples/run_notebook.py examples/tutorial.ipynb" in first
  assert "select `.venv/bin/python`" not in first  # the venv has no Jupyter kernel
