"""examples/tutorial.ipynb runs: every code cell, in order, in one fresh interpreter.

The cells are executed as one program by the venv's Python in a user's minimal
environment (``userenv``), from the repository root as the notebook says; a failing
cell (its own asserts included) fails the test. The notebook keeps the outputs of such a run
(the documentation site renders them, issue 51), and the run checks them (``--check``): a stored
output that is not what its cell prints now fails the test; ``run_notebook.py --write``
refreshes them.
"""

import importlib.util
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


def test_tutorial_is_a_valid_notebook_with_stored_outputs():
  nb = _notebook()
  assert nb["nbformat"] == 4
  kinds = [c["cell_type"] for c in nb["cells"]]
  assert set(kinds) <= {"markdown", "code"} and kinds.count("code") >= 4
  code = [c for c in nb["cells"] if c["cell_type"] == "code"]
  for number, cell in enumerate(code, start=1):
    # The outputs of one run, in order: printed text only (what run_notebook.py stores).
    assert cell["execution_count"] == number
    assert cell["outputs"] and all(o["output_type"] == "stream" and o["name"] == "stdout"
                                   for o in cell["outputs"])
  text = "".join("".join(c["source"]) for c in nb["cells"])
  for topic in ("strategies.factorize", "build_mechanism", "epsilon"):
    assert topic in text
  # Relative links resolve from examples/ but not on the site: the notebook names pages instead.
  assert "](../" not in text


def test_tutorial_cells_run_in_order(tmp_path):
  """As its first cell tells a reader to run it, from the venv as it is (no Jupyter), checking
  the stored outputs against this run."""
  result = subprocess.run([sys.executable, os.path.join("examples", "run_notebook.py"), "--check",
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


def test_check_refuses_stale_outputs_and_ignores_only_tagged_cells_numbers():
  """--check's comparison: text with masked numbers, and numbers within 0.1% and one unit of
  the last printed digit, except in cells tagged outputs-vary."""
  spec = importlib.util.spec_from_file_location(
      "run_notebook", os.path.join(userenv.REPO, "examples", "run_notebook.py"))
  run_notebook = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(run_notebook)
  assert run_notebook.mismatch("sens 1.698\n", "sens 1.699\n", True) is None
  assert run_notebook.mismatch("sens 1.698\n", "sens 1.720\n", True)
  assert run_notebook.mismatch("MSE 0.0510\n", "MSE 0.9000\n", False) is None
  assert run_notebook.mismatch("MSE 0.0510\n", "loss 0.0510\n", False) == "its text differs"
  assert run_notebook.mismatch("a\n", "a\nb\n", False) == "its text differs"
  # A printed array pads its columns to the widest number: spacing is not text.
  assert run_notebook.mismatch("w [ 0.974 -1.921  0.539]\n", "w [-0.974 -1.921 10.539]\n",
                               False) is None
  varying = [c for c in _notebook()["cells"]
             if run_notebook.VARY_TAG in c.get("metadata", {}).get("tags", [])]
  # Only the training cell draws noise from OS entropy.
  assert len(varying) == 1 and "process.next" in "".join(varying[0]["source"])
