"""The documentation site (issue 51): `make docs` on a fresh copy, strict, and `make docs-check`.

Slow: the copy bootstraps .venv-docs from requirements/docs-lock.txt (about half a minute
from pip's cache, more from the index) and builds the site (about half a minute). CI runs
`make docs` itself after `make test-flower`. The browser check needs Debian's chromium and
is skipped, with the reason, where there is none.
"""

import os
import shutil
import subprocess

import pytest

import userenv

pytestmark = pytest.mark.slow


def _make(target: str, cwd, home, timeout: int = 900) -> subprocess.CompletedProcess:
  return subprocess.run(["make", target], cwd=cwd, env=userenv.env(home=str(home)),
                        capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def built_copy(tmp_path_factory):
  """A copy of the tracked files with the site built by `make docs` (and its result)."""
  base = tmp_path_factory.mktemp("docs")
  copy = base / "clone"
  userenv.copy_tracked_files(copy)
  home = base / "home"
  home.mkdir(mode=0o700)
  return copy, home, _make("docs", copy, home)


def test_make_docs_builds_the_site_in_strict_mode(built_copy):
  copy, home, result = built_copy
  assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
  for page in ("index.html", "install.html", "tutorial.html", "reference/spec.html",
               "reference/flower_strategy.html"):
    assert (copy / "site" / page).is_file(), page
  with open(copy / "site" / "tutorial.html", encoding="utf-8") as f:
    assert "held-out MSE" in f.read()  # the notebook's stored outputs are rendered
  mkdocs = [str(copy / ".venv-docs" / "bin" / "mkdocs"), "build", "--strict", "--site-dir",
            str(copy / "out" / "strict-site")]
  env = dict(userenv.env(home=str(home)), NO_MKDOCS_2_WARNING="1")
  # A broken link fails the build, naming it.
  page = copy / "docs" / "audit.md"
  original = page.read_text(encoding="utf-8")
  page.write_text(original + "\nSee [nowhere](no_such_page.md).\n", encoding="utf-8")
  broken = subprocess.run(mkdocs, cwd=copy, env=env, capture_output=True, text=True,
                          timeout=600)
  page.write_text(original, encoding="utf-8")
  assert broken.returncode != 0 and "no_such_page.md" in broken.stderr, broken.stderr[-2000:]
  # So does a docstring that does not render (an argument the signature does not have).
  module = copy / "tff_mf" / "clipping.py"
  source = module.read_text(encoding="utf-8")
  module.write_text(source + '''

def undocumented_argument(x):
  """A function.

  Args:
    y: not an argument of this function.
  """
  return x
''', encoding="utf-8")
  bad = subprocess.run(mkdocs, cwd=copy, env=env, capture_output=True, text=True, timeout=600)
  module.write_text(source, encoding="utf-8")
  assert bad.returncode != 0 and "'y' does not appear in the function signature" in bad.stderr, (
      bad.stderr[-2000:])


def test_docs_check_loads_the_site_in_headless_chromium(built_copy):
  if not any(shutil.which(name, path=userenv.PATH) for name in ("chromium", "chromium-browser")):
    pytest.skip("no chromium on PATH (Debian: apt-get install chromium)")
  copy, home, built = built_copy
  assert built.returncode == 0, built.stderr[-3000:]
  result = _make("docs-check", copy, home)
  assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
  assert "2 pages render" in result.stdout
  for shot in ("index.png", "reference_spec.png"):
    assert (copy / "out" / "docs-check" / shot).stat().st_size > 10_000, shot
