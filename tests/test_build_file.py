"""The Bazel BUILD file names every Python module of the project.

BUILD is Starlark, whose syntax for our rules is a subset of Python's, so we
parse it with ``ast`` rather than a regular expression.
"""

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGES = ("tff_mf", "training", "stackoverflow", "tests")
RULES = ("py_library", "py_binary", "py_test")


def _targets():
  tree = ast.parse((ROOT / "BUILD").read_text(), filename="BUILD")
  targets = []
  for node in ast.walk(tree):
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)):
      continue
    if node.func.id not in RULES:
      continue
    kwargs = {kw.arg: kw.value for kw in node.keywords}
    name = ast.literal_eval(kwargs["name"])
    srcs = ast.literal_eval(kwargs.get("srcs", ast.List(elts=[])))
    deps = ast.literal_eval(kwargs.get("deps", ast.List(elts=[])))
    targets.append((node.func.id, name, srcs, deps))
  return targets


def test_every_python_file_is_named_by_a_target():
  named = {src for _, _, srcs, _ in _targets() for src in srcs}
  missing = []
  for package in PACKAGES:
    for path in sorted((ROOT / package).rglob("*.py")):
      rel = path.relative_to(ROOT).as_posix()
      if rel not in named:
        missing.append(rel)
  assert not missing, f"BUILD names no target for: {missing}"


def test_every_named_source_exists_and_names_are_unique():
  names = [name for _, name, _, _ in _targets()]
  assert len(names) == len(set(names)), "duplicate target names in BUILD"
  for _, name, srcs, _ in _targets():
    for src in srcs:
      assert (ROOT / src).is_file(), f"target {name} names missing file {src}"


def test_local_deps_resolve():
  names = {name for _, name, _, _ in _targets()}
  for _, name, _, deps in _targets():
    for dep in deps:
      if dep.startswith(":"):
        assert dep[1:] in names, f"target {name} depends on unknown {dep}"


@pytest.mark.parametrize("rule", ["py_test"])
def test_tests_are_py_test_targets(rule):
  tested = {src for kind, _, srcs, _ in _targets() if kind == rule for src in srcs}
  for path in sorted((ROOT / "tests").glob("test_*.py")):
    assert path.relative_to(ROOT).as_posix() in tested, f"{path.name} is not a py_test"


def test_build_is_generated_from_the_imports():
  """BUILD is what scripts/generate_build.py writes: every target's deps are its imports."""
  import subprocess  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  import userenv  # pylint: disable=g-import-not-at-top
  out = subprocess.run([sys.executable, str(ROOT / "scripts" / "generate_build.py"), "--check"],
                       cwd=ROOT, env=userenv.env(), capture_output=True, text=True, timeout=120)
  assert out.returncode == 0, out.stderr
