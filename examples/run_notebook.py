"""Runs a notebook's code cells in order as one program, with this Python (no Jupyter).

The project's virtual environment holds no Jupyter kernel; this runs the tutorial with it
as it is:

    .venv/bin/python examples/run_notebook.py examples/tutorial.ipynb

Each cell's output is printed as the cell runs; a failing cell stops the run (exit 1, its
traceback). Markdown cells are skipped.

The notebook keeps the outputs of such a run, which the documentation site shows
(mkdocs-jupyter renders them without executing anything). ``--write`` runs it and stores
each cell's printed output in the notebook; ``--check`` runs it and compares: exit 1, naming
the first cell that differs, when the stored outputs are not what the cells print now. The
comparison is of the text with its numbers masked, and of the numbers within 0.1% (and one
unit of their last printed digit), but for cells tagged ``outputs-vary`` (their numbers
depend on noise drawn from OS entropy), whose numbers are not compared.
"""

import contextlib
import io
import json
import re
import sys
from typing import List, Optional

VARY_TAG = "outputs-vary"
NUMBER = re.compile(r"[-+]?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")


def code_of(path: str) -> str:
  """The notebook's code cells, joined in order into one program."""
  with open(path, encoding="utf-8") as f:
    notebook = json.load(f)
  return "\n\n".join("".join(cell["source"]) for cell in notebook["cells"]
                     if cell["cell_type"] == "code")


class _Tee(io.StringIO):
  """Keeps what a cell prints and passes it on to the real stdout as it comes."""

  def write(self, text):
    sys.__stdout__.write(text)
    sys.__stdout__.flush()
    return super().write(text)

  def fileno(self):  # a subprocess started with stdout=sys.stdout writes to the real one
    return sys.__stdout__.fileno()


def execute(notebook: dict, path: str) -> List[str]:
  """Runs the code cells in order in one namespace; the stdout text of each."""
  namespace = {"__name__": "__main__"}
  outputs = []
  for index, cell in enumerate(c for c in notebook["cells"] if c["cell_type"] == "code"):
    tee = _Tee()
    with contextlib.redirect_stdout(tee):
      exec(compile("".join(cell["source"]), f"{path} (code cell {index + 1})", "exec"),  # pylint: disable=exec-used
           namespace)
    outputs.append(tee.getvalue())
  return outputs


def stored(cell: dict) -> str:
  """The stdout text a cell's stored outputs hold."""
  return "".join("".join(o.get("text", "")) for o in cell.get("outputs", [])
                 if o.get("output_type") == "stream" and o.get("name") == "stdout")


def _shape(text: str) -> str:
  """The text with its numbers masked and its white space dropped (numpy pads a printed
  array's columns to the widest number, so the spacing moves with the values)."""
  return "".join(NUMBER.sub("#", text).split())


def mismatch(old: str, new: str, compare_numbers: bool) -> Optional[str]:
  """Why ``old`` (stored) does not match ``new`` (fresh), or None when it does."""
  if _shape(old) != _shape(new):
    return "its text differs"
  if not compare_numbers:
    return None
  for a, b in zip(NUMBER.findall(old), NUMBER.findall(new)):
    decimals = len(a.split(".")[1]) if "." in a and "e" not in a.lower() else 0
    x, y = float(a), float(b)
    if abs(x - y) > 1e-3 * max(abs(x), abs(y)) + 10.0 ** -decimals:
      return f"it printed {b} where the notebook holds {a}"
  return None


def main(argv) -> int:
  args = [a for a in argv[1:] if a not in ("--write", "--check")]
  mode = next((a for a in argv[1:] if a in ("--write", "--check")), None)
  if len(args) != 1:
    print("usage: run_notebook.py [--write | --check] NOTEBOOK.ipynb", file=sys.stderr)
    return 2
  path = args[0]
  try:
    with open(path, encoding="utf-8") as f:
      notebook = json.load(f)
    cells = [c for c in notebook["cells"] if c["cell_type"] == "code"]
  except (OSError, ValueError, KeyError, TypeError) as e:
    print(f"run_notebook.py: error: {path} is not a readable notebook: {e}", file=sys.stderr)
    return 2
  outputs = execute(notebook, path)
  if mode == "--write":
    for index, (cell, text) in enumerate(zip(cells, outputs)):
      cell["execution_count"] = index + 1
      cell["outputs"] = [{"output_type": "stream", "name": "stdout",
                          "text": text.splitlines(keepends=True)}] if text else []
    with open(path, "w", encoding="utf-8") as f:
      json.dump(notebook, f, indent=1, ensure_ascii=False)
      f.write("\n")
  elif mode == "--check":
    for index, (cell, text) in enumerate(zip(cells, outputs)):
      why = mismatch(stored(cell), text, VARY_TAG not in cell.get("metadata", {}).get("tags", []))
      if why:
        print(f"run_notebook.py: error: {path}: code cell {index + 1}'s stored output is stale "
              f"({why}); run: .venv/bin/python examples/run_notebook.py --write {path}",
              file=sys.stderr)
        return 1
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv))
