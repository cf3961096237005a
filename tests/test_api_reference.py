"""The API reference (docs/reference/, issue 51) covers every public name, and each has a docstring.

Read statically, as mkdocstrings-python reads the source (griffe; no docs venv needed):

* a public name of a module is one in its ``__all__``, or else a function or class defined at
  its top level whose name does not start with ``_``; a package's ``__init__`` also exports
  the functions and classes it imports from its own submodules;
* a reference page renders a module with ``::: module``: the names of its ``members:`` option
  where it has one, else the functions and classes the module defines (mkdocstrings leaves
  imported names out unless they are listed).

The test fails when a public name has no docstring, when a page drops one, when a page lists a
member the module does not have (mkdocstrings would skip it silently), or when a page or module
is missing from mkdocs.yml's navigation.
"""

import ast
import glob
import os
import re
from typing import Dict, List, Optional, Tuple

import pytest

import userenv

REPO = userenv.REPO
REFERENCE = os.path.join(REPO, "docs", "reference")
# The public modules of issue 51's list (and the noise package's submodules that carry its API).
MODULES = ("tff_mf.spec", "tff_mf.tf.aggregators", "tff_mf.plan", "tff_mf.planner",
           "tff_mf.mechanisms",
           "tff_mf.accounting", "tff_mf.accounting.statement", "tff_mf.participation",
           "tff_mf.flower.strategy", "tff_mf.clipping", "tff_mf.runstate", "tff_mf.noise",
           "tff_mf.noise.streams", "tff_mf.noise.keys", "tff_mf.noise.rows",
           "tff_mf.noise.discrete_gaussian")
Definitions = Dict[str, ast.AST]


def source_path(module: str) -> str:
  base = os.path.join(REPO, *module.split("."))
  return os.path.join(base, "__init__.py") if os.path.isdir(base) else base + ".py"


def parse(module: str) -> ast.Module:
  with open(source_path(module), encoding="utf-8") as f:
    return ast.parse(f.read(), source_path(module))


def definitions(tree: ast.Module) -> Definitions:
  return {node.name: node for node in tree.body
          if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}


def public_names(module: str) -> Dict[str, Optional[str]]:
  """{public name: its docstring (None when it has none)} of ``module``."""
  tree = parse(module)
  own = definitions(tree)
  imported: Definitions = {}
  if source_path(module).endswith("__init__.py"):
    for node in tree.body:
      if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(module + "."):
        defined = definitions(parse(node.module))
        for alias in node.names:
          if alias.name in defined:
            imported[alias.asname or alias.name] = defined[alias.name]
  exported = None
  for node in tree.body:
    if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__"
                                            for t in node.targets):
      exported = ast.literal_eval(node.value)
  if exported is None:
    exported = [n for n in list(own) + list(imported) if not n.startswith("_")]
  found = {**imported, **own}
  return {name: ast.get_docstring(found[name]) if name in found else None for name in exported}


def directives() -> Dict[str, Tuple[str, Optional[List[str]]]]:
  """{module: (page, its members option or None)} of every ``::: module`` in the reference."""
  out = {}
  for page in sorted(glob.glob(os.path.join(REFERENCE, "*.md"))):
    with open(page, encoding="utf-8") as f:
      lines = f.read().splitlines()
    for i, line in enumerate(lines):
      found = re.match(r"^::: ([\w.]+)\s*$", line)
      if not found:
        continue
      members, j = None, i + 1
      while j < len(lines) and (lines[j].startswith("    ") or not lines[j].strip()):
        if re.match(r"^\s+members:\s*$", lines[j]):
          members = []
        elif members is not None and re.match(r"^\s+- [\w]+\s*$", lines[j]):
          members.append(lines[j].strip()[2:])
        elif members is not None and lines[j].strip() and not lines[j].strip().startswith("-"):
          break
        j += 1
      assert found.group(1) not in out, f"{found.group(1)} is rendered twice"
      out[found.group(1)] = (os.path.relpath(page, REPO), members)
  return out


DIRECTIVES = directives()


def test_every_reference_page_is_in_the_navigation():
  with open(os.path.join(REPO, "mkdocs.yml"), encoding="utf-8") as f:
    nav = set(re.findall(r"(reference/\w+\.md)", f.read()))
  pages = {os.path.relpath(p, os.path.join(REPO, "docs"))
           for p in glob.glob(os.path.join(REFERENCE, "*.md"))}
  assert pages and pages == nav, (sorted(pages - nav), sorted(nav - pages))


@pytest.mark.parametrize("module", MODULES)
def test_public_names_have_docstrings_and_the_reference_renders_them(module):
  assert module in DIRECTIVES, f"{module} has no `::: {module}` in docs/reference/"
  assert ast.get_docstring(parse(module)), f"{module} has no module docstring"
  names = public_names(module)
  undocumented = sorted(name for name, doc in names.items() if not (doc or "").strip())
  assert not undocumented, f"{module}: public names without a docstring: {undocumented}"
  page, members = DIRECTIVES[module]
  rendered = set(members) if members is not None else {
      name for name in definitions(parse(module)) if not name.startswith("_")}
  dropped = sorted(set(names) - rendered)
  assert not dropped, f"{page} drops {module}'s public names {dropped}"
  unknown = sorted(rendered - set(names))
  assert not unknown, f"{page} lists {unknown}, which {module} does not export"


def test_the_rule_sees_what_it_must():
  """The static rule finds re-exports, reads __all__-less modules and flags a drop."""
  participation = public_names("tff_mf.participation")
  assert {"fixed_epoch", "MinSep", "SamplingError"} <= set(participation)
  assert "MatrixFactorizationClientSideAdaptiveClipping" in public_names("tff_mf.flower.strategy")
  assert "epsilon_for" in public_names("tff_mf.accounting")
  assert "calibrate" in public_names("tff_mf.accounting")
  assert "build_mechanism" in public_names("tff_mf.tf.aggregators")
  assert "MechanismSpec" in public_names("tff_mf.spec")
  _, members = DIRECTIVES["tff_mf.participation"]
  assert members and set(participation) - set(members[1:]), "dropping a member must show"
