"""Runs a notebook's code cells in order as one program, with this Python (no Jupyter).

The project's virtual environment holds no Jupyter kernel; this runs the tutorial with it
as it is:

    .venv/bin/python examples/run_notebook.py examples/tutorial.ipynb

Each cell's output is printed as the cell runs; a failing cell stops the run (exit 1, its
traceback). Markdown cells are skipped.
"""

import json
import sys


def code_of(path: str) -> str:
  """The notebook's code cells, joined in order into one program."""
  with open(path, encoding="utf-8") as f:
    notebook = json.load(f)
  return "\n\n".join("".join(cell["source"]) for cell in notebook["cells"]
                     if cell["cell_type"] == "code")


def main(argv) -> int:
  if len(argv) != 2:
    print("usage: run_notebook.py NOTEBOOK.ipynb", file=sys.stderr)
    return 2
  try:
    program = code_of(argv[1])
  except (OSError, ValueError, KeyError, TypeError) as e:
    print(f"run_notebook.py: error: {argv[1]} is not a readable notebook: {e}", file=sys.stderr)
    return 2
  exec(compile(program, argv[1], "exec"), {"__name__": "__main__"})  # pylint: disable=exec-used
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv))
