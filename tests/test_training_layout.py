"""One home per concept: the harness's module layout, its imports, citations and packaging.

* ``training/`` is split by role (config, sampling, task, mechanisms, checkpoints,
  run directories, outputs, loop); no function there is longer than 80 lines.
* No import cycle in ``training/`` or ``stackoverflow/`` (function-level imports
  included), and the library ``tff_mf/`` imports neither.
* Papers are cited by authors, year and arXiv id, never by local file names.
* The installed distribution holds ``tff_mf`` only, not generic top-level
  ``training``/``stackoverflow`` packages.
"""

import ast
import configparser
import pathlib
import re

import setuptools

ROOT = pathlib.Path(__file__).resolve().parents[1]
HARNESS = ("training", "stackoverflow")
ROLE_MODULES = ("config", "sampling", "task", "run_setup", "checkpoints", "rundir", "outputs",
                "loop", "run_stackoverflow", "main_job")
MAX_FUNCTION_LINES = 80


def _modules(package):
  return {f"{package}.{p.stem}": p for p in sorted((ROOT / package).glob("*.py"))
          if p.stem != "__init__"}


def _imports(path, package_names):
  """Modules of ``package_names`` that ``path`` imports (anywhere in the file)."""
  out = set()
  for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
    if isinstance(node, ast.Import):
      names = [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
      names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
    else:
      continue
    out.update(n for n in names if n.split(".")[0] in package_names)
  return out


def test_training_is_split_by_role():
  modules = _modules("training")
  assert "training.train_lib" not in modules
  for role in ROLE_MODULES:
    assert f"training.{role}" in modules, role


def test_no_function_in_the_harness_is_longer_than_80_lines():
  long = []
  for package in HARNESS:
    for name, path in _modules(package).items():
      for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
          lines = node.end_lineno - node.lineno + 1
          if lines > MAX_FUNCTION_LINES:
            long.append(f"{name}.{node.name}: {lines} lines")
  assert not long, long


def test_no_import_cycles_in_the_harness():
  modules = {}
  for package in HARNESS:
    modules.update(_modules(package))
  graph = {name: {m for m in _imports(path, HARNESS) if m in modules and m != name}
           for name, path in modules.items()}
  assert "stackoverflow.data" not in graph["stackoverflow.pydocs"]
  state = {}

  def visit(node, stack):
    state[node] = "open"
    for nxt in sorted(graph[node]):
      if state.get(nxt) == "open":
        raise AssertionError(f"import cycle: {' -> '.join(stack + [node, nxt])}")
      if nxt not in state:
        visit(nxt, stack + [node])
    state[node] = "done"

  for name in sorted(graph):
    if name not in state:
      visit(name, [])


def test_library_does_not_import_the_harness():
  offenders = {}
  for path in sorted((ROOT / "tff_mf").rglob("*.py")):
    found = _imports(path, HARNESS)
    if found:
      offenders[str(path.relative_to(ROOT))] = sorted(found)
  assert not offenders, offenders


def test_papers_are_cited_by_authors_year_and_arxiv_id():
  pattern = re.compile(r"\b00\d_[0-9a-f…]|shared/papers")
  bad = []
  for package in HARNESS:
    for path in sorted((ROOT / package).rglob("*.py")):
      for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if pattern.search(line):
          bad.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
  assert not bad, bad


def test_only_the_library_is_installed():
  config = configparser.ConfigParser()
  config.read(ROOT / "setup.cfg")
  include = config["options.packages.find"]["include"].split()
  found = setuptools.find_packages(where=str(ROOT), include=include)
  assert "tff_mf" in found
  assert not [p for p in found if p.split(".")[0] in HARNESS], found
  bootstrap = (ROOT / "scripts" / "bootstrap.sh").read_text(encoding="utf-8")
  assert "import tff_mf.cli, training, stackoverflow" not in bootstrap
