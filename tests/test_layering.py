"""Layering, stated once and tested: the numpy core (``tff_mf`` outside the framework layers
``tff_mf.tf`` and ``tff_mf.flower``) loads no TensorFlow and no Flower at import, and never
imports the Flower layer (its TF-only commands import ``tff_mf.tf`` when run); the two
framework layers never import each other, and the Flower layer's numpy modules (all but those
that import flwr) load neither framework; the library (``tff_mf``) imports neither the
harness (``training``) nor the data package (``stackoverflow``); the data package does not
import the harness; and no module imports, directly or through others, a module that imports
it back; the library's parts (its folders and loose modules) import only down their floors
(FLOORS); and no library function runs over MAX_FUNCTION_LINES lines."""

import ast
import os
import pkgutil
import subprocess
import sys


import userenv

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ("tff_mf", "training", "stackoverflow")
HEAVY = ("tensorflow", "tensorflow_federated", "tensorflow_privacy", "jax", "keras", "flwr")
# The framework layers over the numpy core: each may import the core, never the other.
FRAMEWORK_LAYERS = ("tff_mf.tf", "tff_mf.flower")
# package -> packages it may import
ALLOWED = {"tff_mf": {"tff_mf"}, "stackoverflow": {"stackoverflow", "tff_mf"},
           "training": {"training", "stackoverflow", "tff_mf"}}


def _modules(package):
  """Every module of ``package`` (dotted name -> file path)."""
  out = {}
  root = os.path.join(REPO, package)
  for info in pkgutil.walk_packages([root], prefix=f"{package}."):
    spec_path = os.path.join(REPO, *info.name.split("."))
    path = spec_path + ".py" if not info.ispkg else os.path.join(spec_path, "__init__.py")
    out[info.name] = path
  out[package] = os.path.join(root, "__init__.py")
  return out


def _imports(name, path, modules=()):
  """Project modules ``name`` imports anywhere in its file (module- or function-level).

  ``from package import submodule`` names the submodule only (the package's own names are
  not read); a name that is not one of ``modules`` is read from the package itself."""
  tree = ast.parse(open(path, encoding="utf-8").read())
  found = set()
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      found.update(alias.name for alias in node.names)
    elif isinstance(node, ast.ImportFrom):
      if node.level:  # relative import
        base = name.split(".")[:-node.level] if not path.endswith("__init__.py") else \
            name.split(".")[:len(name.split(".")) - node.level + 1]
        module = ".".join(base + ([node.module] if node.module else []))
      else:
        module = node.module or ""
      named = {f"{module}.{alias.name}" for alias in node.names}
      found.update(named)
      if not named <= set(modules):
        found.add(module)
  return {m for m in found if m.split(".")[0] in PACKAGES}


def _all_modules():
  modules = {}
  for package in PACKAGES:
    modules.update(_modules(package))
  return modules


def _graph():
  modules = _all_modules()
  graph = {}
  for name, path in modules.items():
    graph[name] = {m for m in _imports(name, path, modules) if m in modules and m != name}
  return graph


def test_packages_import_only_what_the_layering_allows():
  bad = []
  for name, deps in _graph().items():
    package = name.split(".")[0]
    bad += [f"{name} imports {d}" for d in deps if d.split(".")[0] not in ALLOWED[package]]
  assert bad == []


def test_no_import_cycles():
  graph = _graph()
  index, low, on_stack, stack, cycles = {}, {}, set(), [], []

  def visit(v):  # Tarjan's strongly connected components
    index[v] = low[v] = len(index)
    stack.append(v)
    on_stack.add(v)
    for w in graph[v]:
      if w not in index:
        visit(w)
        low[v] = min(low[v], low[w])
      elif w in on_stack:
        low[v] = min(low[v], index[w])
    if low[v] == index[v]:
      component = []
      while True:
        w = stack.pop()
        on_stack.discard(w)
        component.append(w)
        if w == v:
          break
      # A package's __init__ importing its own submodule is not a cycle through the submodule.
      if len(component) > 1:
        cycles.append(sorted(component))

  sys.setrecursionlimit(10000)
  for v in graph:
    if v not in index:
      visit(v)
  assert cycles == []


# The floors of the library: each part (a folder of tff_mf or one of its loose modules) may
# import only parts on lower floors (and itself); on floor 0, the basic tools, any other.
# docs/architecture.md draws the same tree. A new part must be given a floor here.
FLOORS = {
    "tff_mf": 0, "entropy": 0, "jsonio": 0, "interrupt": 0, "plots": 0, "checks": 0,
    "optional": 0, "clipping": 0, "runstate": 0, "flagspec": 0, "toeplitz_view": 0,
    "participation": 1, "noise": 1,
    "registry": 2,
    "factorization": 3,
    "accounting": 4,
    "audit": 5, "spec": 5,
    "mechanisms": 6,
    "planner_bounds": 5, "planner_prefetch": 5,
    "plan": 7, "planner": 7,
    "tf": 8, "flower": 8,
    "clitools": 9,
    "cli": 10, "commands": 10,
}


def _part(module):
  """The part of the library ``module`` belongs to: ``tff_mf.x.y`` -> ``x``."""
  names = module.split(".")
  return names[1] if len(names) > 1 else names[0]


def upward_imports(graph):
  """``a imports b`` for every import of the library that does not go down a floor."""
  bad = []
  for name, deps in sorted(graph.items()):
    if not name.startswith("tff_mf"):
      continue
    own = _part(name)
    for dep in sorted(d for d in deps if d.startswith("tff_mf")):
      other = _part(dep)
      if other == own or FLOORS[other] < FLOORS[own] or FLOORS[own] == FLOORS[other] == 0:
        continue
      bad.append(f"{name} (floor {FLOORS[own]}) imports {dep} (floor {FLOORS[other]})")
  return bad


def test_every_part_of_the_library_has_a_floor():
  parts = {_part(m) for m in _modules("tff_mf")}
  assert parts - set(FLOORS) == set(), "give the new part a floor in FLOORS"
  assert set(FLOORS) - parts == set(), "FLOORS names a part that no longer exists"


def test_the_library_imports_only_down_its_floors():
  assert upward_imports(_graph()) == []


def test_the_floor_check_sees_an_upward_import():
  """The check finds an upward or sideways import (so an empty list is not blindness)."""
  graph = {"tff_mf.participation.kinds": {"tff_mf.factorization.toeplitz_ops"},
           "tff_mf.noise.streams": {"tff_mf.participation.kinds", "tff_mf.checks"},
           "tff_mf.factorization.cache": {"tff_mf.registry", "tff_mf.factorization"}}
  assert len(upward_imports(graph)) == 2


def _layer(module):
  """The framework layer ``module`` belongs to, or None for the numpy core."""
  for layer in FRAMEWORK_LAYERS:
    if module == layer or module.startswith(layer + "."):
      return layer
  return None


def test_core_never_imports_flower_and_layers_not_each_other():
  """(The core's TF-only commands import ``tff_mf.tf`` inside their functions, which
  ``test_numpy_core_imports_no_tensorflow`` allows: they run only when asked for.)"""
  bad = []
  for name, deps in _graph().items():
    if not name.startswith("tff_mf"):
      continue
    own = _layer(name)
    bad += [f"{name} imports {d}" for d in deps if _layer(d) not in (None, own)
            and (own is not None or _layer(d) == "tff_mf.flower")]
  assert bad == []


def _imports_flwr(path):
  tree = ast.parse(open(path, encoding="utf-8").read())
  return any((isinstance(n, ast.Import) and any(a.name.split(".")[0] == "flwr" for a in n.names))
             or (isinstance(n, ast.ImportFrom) and (n.module or "").split(".")[0] == "flwr")
             for n in ast.walk(tree))


def test_numpy_core_imports_no_tensorflow():
  """The core and the Flower layer's numpy modules load neither TensorFlow nor flwr."""
  core = sorted(m for m, path in _modules("tff_mf").items()
                if _layer(m) is None or (_layer(m) == "tff_mf.flower" and not _imports_flwr(path)))
  assert "tff_mf.noise.rows" in core
  code = (
      "import importlib, sys\n"
      f"for m in {core!r}:\n"
      "  importlib.import_module(m)\n"
      f"  heavy = sorted(x for x in sys.modules if x.split('.')[0] in {HEAVY!r})\n"
      "  if heavy:\n"
      "    print('LOADED', m, heavy[:3]); break\n"
      "else:\n"
      "  print('LOADED none')\n")
  assert "LOADED none" in _python(code), "a numpy-core module imports TensorFlow"


def test_command_modules_are_light():
  """`tff-mf factorize` on a cache hit must not pay for matplotlib or tqdm at import."""
  import tff_mf.commands  # pylint: disable=g-import-not-at-top
  modules = ["tff_mf.cli"] + [f"tff_mf.commands.{m.name}"
                              for m in pkgutil.iter_modules(tff_mf.commands.__path__)]
  code = (
      "import importlib, sys\n"
      f"for m in {modules!r}: importlib.import_module(m)\n"
      "print('LOADED', sorted(m for m in ('matplotlib', 'tqdm', 'scipy.linalg') "
      "if m in sys.modules))\n")
  assert "LOADED []" in _python(code)


# Longest function (or method) of the library, in lines from ``def`` to its last line,
# docstring included.
MAX_FUNCTION_LINES = 80


def test_library_functions_are_short():
  long = []
  for name, path in sorted(_modules("tff_mf").items()):
    tree = ast.parse(open(path, encoding="utf-8").read())
    for node in ast.walk(tree):
      if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        lines = node.end_lineno - node.lineno + 1
        if lines > MAX_FUNCTION_LINES:
          long.append(f"{name}.{node.name} (line {node.lineno}): {lines} lines")
  assert long == [], f"split into helpers (at most {MAX_FUNCTION_LINES} lines): {long}"


def _python(code):
  """stdout of ``code`` run in a fresh interpreter from a clean environment."""
  out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                       timeout=300, env=userenv.env())
  assert out.returncode == 0, out.stderr
  return out.stdout


# Participation kinds own their rules (tff_mf.participation): at most this many comparisons
# against a kind's name remain outside that package.
MAX_KIND_NAME_COMPARISONS = 5
KIND_NAMES = ("single", "fixed_epoch", "min_sep", "balls_in_bins", "random_allocation",
              "cyclic_poisson")


def _names_in(node):
  """The kind names a comparison operand spells out (a string, or a tuple/list/set of them)."""
  if isinstance(node, ast.Constant) and node.value in KIND_NAMES:
    return [node.value]
  if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
    return [e.value for e in node.elts if isinstance(e, ast.Constant) and e.value in KIND_NAMES]
  return []


def _operand_name(node):
  if isinstance(node, ast.Name):
    return node.id
  if isinstance(node, ast.Attribute):
    return node.attr
  return ""


CODE_FOLDERS = ("tff_mf", "training", "stackoverflow", "benchmarks", "scripts", "examples")


def _code_outside(excluded, folders=CODE_FOLDERS):
  """(path relative to the repository, parsed module) of every Python file of ``folders``,
  except those under ``excluded`` (a path or a tuple of them)."""
  for top in folders:
    for root, _, files in os.walk(os.path.join(REPO, top)):
      for name in sorted(files):
        path = os.path.join(root, name)
        rel = os.path.relpath(path, REPO)
        if name.endswith(".py") and not rel.startswith(excluded):
          with open(path, encoding="utf-8") as f:
            yield rel, ast.parse(f.read())


def kind_name_comparisons():
  """``file:line`` of every ==, !=, in, not in against a kind's name outside the package."""
  found = []
  for rel, tree in _code_outside(os.path.join("tff_mf", "participation")):
    for node in ast.walk(tree):
      if not isinstance(node, ast.Compare):
        continue
      operands = [node.left] + node.comparators
      if any(isinstance(op, (ast.Eq, ast.NotEq, ast.In, ast.NotIn)) for op in node.ops) and \
          any(_names_in(o) for o in operands):
        found.append(f"{rel}:{node.lineno}")
  return found


def test_participation_kinds_are_compared_by_name_in_few_places():
  found = kind_name_comparisons()
  assert len(found) <= MAX_KIND_NAME_COMPARISONS, (
      f"{len(found)} comparisons against a participation kind's name outside "
      f"tff_mf.participation (at most {MAX_KIND_NAME_COMPARISONS}); ask the kind instead "
      f"(a method or attribute of its class): {found}")


# Analyses own their words and rules (tff_mf.accounting.analyses): at most this many comparisons against
# an analysis's or a Gaussian accountant's name remain outside that module.
MAX_ANALYSIS_NAME_COMPARISONS = 2
ANALYSIS_NAMES = ("none", "mmcc", "amplified_banded", "amplified_allocation",
                  "amplified_fixed_bin", "adaptive", "monte_carlo", "monte_carlo_bound",
                  "discrete_gaussian", "exact", "pld", "rdp", "auto")
# Operands that hold an analysis's or an accountant's name.
ANALYSIS_HOLDERS = ("analysis", "amplification", "accountant", "unamplified_accountant")


def _holds_analysis(node):
  """Whether ``node`` reads an analysis or accountant name: a variable or attribute so called,
  or ``record["analysis"]`` / ``record.get("analysis")``."""
  if _operand_name(node) in ANALYSIS_HOLDERS:
    return True
  if isinstance(node, ast.Subscript):
    key = node.slice
    return isinstance(key, ast.Constant) and key.value in ANALYSIS_HOLDERS
  if isinstance(node, ast.Call) and _operand_name(node.func) == "get" and node.args:
    key = node.args[0]
    return isinstance(key, ast.Constant) and key.value in ANALYSIS_HOLDERS
  return False


def _spells_analysis(node):
  if isinstance(node, ast.Constant):
    return node.value in ANALYSIS_NAMES
  if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
    return any(isinstance(e, ast.Constant) and e.value in ANALYSIS_NAMES for e in node.elts)
  return False


def _compares_analysis(node):
  """Whether ``node`` is ==, !=, in or not in between an analysis operand and a name."""
  if not isinstance(node, ast.Compare) or not any(
      isinstance(op, (ast.Eq, ast.NotEq, ast.In, ast.NotIn)) for op in node.ops):
    return False
  operands = [node.left] + node.comparators
  return any(map(_holds_analysis, operands)) and any(map(_spells_analysis, operands))


def analysis_name_comparisons():
  """``file:line`` of every ==, !=, in, not in between an analysis (or accountant) operand and
  an analysis's name, outside tff_mf/accounting/analyses.py."""
  return [f"{rel}:{node.lineno}"
          for rel, tree in _code_outside(os.path.join("tff_mf", "accounting", "analyses.py"))
          for node in ast.walk(tree) if _compares_analysis(node)]


def test_analyses_are_compared_by_name_in_few_places():
  found = analysis_name_comparisons()
  assert len(found) <= MAX_ANALYSIS_NAME_COMPARISONS, (
      f"{len(found)} comparisons against an analysis's or accountant's name outside "
      f"tff_mf.accounting.analyses (at most {MAX_ANALYSIS_NAME_COMPARISONS}); ask the analysis instead "
      f"(an attribute or method of its class in tff_mf.accounting.analyses.REGISTRY): {found}")


def test_the_analysis_count_sees_a_comparison():
  """The counter finds the forms it is meant to find (so a zero is not blindness)."""
  code = ('a = analysis == "mmcc"\nb = record["analysis"] in ("banded", "mmcc")\n'
          'c = r.get("accountant") != "exact"\nd = strategy == "banded"\n')
  hits = [n.lineno for n in ast.walk(ast.parse(code)) if _compares_analysis(n)]
  assert sorted(hits) == [1, 2, 3]


def test_the_shared_tiny_task_is_keyed_on_every_field_build_task_reads():
  """conftest's ``tiny_task`` shares one task between configs equal on ``TASK_FIELDS``: a
  field that training/task.py reads but the key lacks would hand a test another config's task.
  (``progress`` only draws bars.)"""
  import ast
  import conftest
  with open(os.path.join(REPO, "training", "task.py"), encoding="utf-8") as f:
    tree = ast.parse(f.read())
  read = {node.attr for node in ast.walk(tree)
          if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
          and node.value.id == "config"}
  assert read, "training/task.py reads no config field: the check finds nothing"
  assert read - {"progress"} <= set(conftest.TASK_FIELDS), read - set(conftest.TASK_FIELDS)


# Strategies own their rules (their family's Declaration, tff_mf.registry): at most this many
# dispatches on a strategy's name remain outside the families and the registry, in the
# library, the harness, the data package, the scripts and the examples. (The benchmarks name
# strategies to map them onto other libraries' constructors.) The issue's goal was 8; 7 were
# left before the strategies were named through their registry entries. Today's 2: the papers'
# Table 4, keyed by mechanism (training/grids.py, "honaker_full" a mechanism's name too), and
# analyses.RENAMED ("banded", the amplified banded analysis's former name), which only spells
# a strategy's name. (tests/test_run_core_counts.py counts every such string constant.)
MAX_STRATEGY_NAME_DISPATCHES = 2
STRATEGY_DISPATCH_FOLDERS = ("tff_mf", "training", "stackoverflow", "scripts", "examples")
STRATEGY_DISPATCH_HOMES = (os.path.join("tff_mf", "factorization", "families"),
                           os.path.join("tff_mf", "registry.py"))


def _spells_strategy(node, names):
  if isinstance(node, ast.Constant):
    return node.value in names
  if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
    return any(isinstance(e, ast.Constant) and e.value in names for e in node.elts)
  return False


def strategy_dispatches(trees, names):
  """``file:line`` of every ==, !=, in, not in against a strategy's name (an analysis
  operand aside: "banded" was also an analysis) and of every dict literal keyed by one."""
  found = []
  for rel, tree in trees:
    for node in ast.walk(tree):
      if isinstance(node, ast.Compare) and any(
          isinstance(op, (ast.Eq, ast.NotEq, ast.In, ast.NotIn)) for op in node.ops):
        operands = [node.left] + node.comparators
        if any(map(_spells_strategy, operands, [names] * len(operands))) and \
            not any(map(_holds_analysis, operands)):
          found.append(f"{rel}:{node.lineno}")
      elif isinstance(node, ast.Dict) and any(_spells_strategy(k, names) for k in node.keys
                                              if k is not None):
        found.append(f"{rel}:{node.lineno}")
  return found


def test_strategies_are_dispatched_on_by_name_in_few_places():
  from tff_mf import registry  # pylint: disable=g-import-not-at-top
  found = strategy_dispatches(_code_outside(STRATEGY_DISPATCH_HOMES, STRATEGY_DISPATCH_FOLDERS),
                              tuple(registry.STRATEGIES))
  assert len(found) <= MAX_STRATEGY_NAME_DISPATCHES, (
      f"{len(found)} dispatches on a strategy's name outside the families and the registry "
      f"(at most {MAX_STRATEGY_NAME_DISPATCHES}); ask the strategy's Declaration or registry "
      f"entry instead: {found}")


def test_the_strategy_count_sees_a_dispatch():
  code = ('a = strategy == "blt"\nb = name in ("banded", "bsr")\nc = {"optimal": 1}\n'
          'd = analysis == "banded"\ne = kind == "single"\n')
  found = strategy_dispatches([("x.py", ast.parse(code))], ("blt", "banded", "bsr", "optimal"))
  assert found == ["x.py:1", "x.py:2", "x.py:3"]


def test_an_import_from_a_package_reads_its_api_only_when_it_names_no_submodule(tmp_path):
  """``from pkg import submodule`` depends on the submodule; ``from pkg import name`` on the
  package's own API (so a sibling may import a sibling without a cycle through the package,
  and a caller of the package API still depends on it)."""
  path = tmp_path / "m.py"
  path.write_text("from tff_mf.accounting import analyses\n"
                  "from tff_mf.accounting import epsilon_for\n", encoding="utf-8")
  modules = _all_modules()
  assert _imports("tff_mf.x", str(path), modules) == {
      "tff_mf.accounting.analyses", "tff_mf.accounting", "tff_mf.accounting.epsilon_for"}
  path.write_text("from tff_mf.accounting import analyses\n", encoding="utf-8")
  assert _imports("tff_mf.x", str(path), modules) == {"tff_mf.accounting.analyses"}
