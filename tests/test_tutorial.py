"""examples/tutorial.ipynb runs: every code cell, in order, in one fresh interpreter.

The cells are executed as one program by the venv's Python in a user's minimal
environment (``userenv``), from the repository root as the notebook says; a failing
cell (its own asserts included) fails the test. The notebook is kept without outputs.
"""

import json
import os
import subprocess
import sys

import userenv

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
  program = "\n\n".join("".join(c["source"]) for c in _notebook()["cells"]
                        if c["cell_type"] == "code")
  script = tmp_path / "tutorial.py"
  script.write_text(program, encoding="utf-8")
  result = subprocess.run([sys.executable, str(script)], cwd=userenv.REPO, text=True,
                          capture_output=True, env=userenv.env(pythonpath=True), timeout=600)
  assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
  out = result.stdout
  assert "optimal" in out and "honaker_online" in out  # the comparison table
  assert "round 16: held-out MSE" in out
  assert "epsilon:" in out and "at delta = 1e-06" in out
