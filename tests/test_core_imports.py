"""The numpy/scipy core and every CLI command module import no TensorFlow."""

import importlib.util
import os
import pkgutil
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CORE_MODULES = ("tff_mf", "tff_mf.workloads", "tff_mf.factorization", "tff_mf.tree",
                "tff_mf.strategies", "tff_mf.families.dense", "tff_mf.structured", "tff_mf.cache",
                "tff_mf.accounting", "tff_mf.mmcc", "tff_mf.cli", "tff_mf.plots")


def _command_modules():
  import tff_mf.commands  # pylint: disable=g-import-not-at-top
  return tuple(f"tff_mf.commands.{m.name}" for m in pkgutil.iter_modules(tff_mf.commands.__path__))


def _existing(modules):
  return [m for m in modules if importlib.util.find_spec(m) is not None]


@pytest.mark.parametrize("module", _existing(CORE_MODULES + _command_modules()))
def test_module_imports_without_tensorflow(module):
  code = (
      "import importlib, sys\n"
      f"importlib.import_module({module!r})\n"
      "bad = sorted(m for m in sys.modules if m.split('.')[0] in "
      "('tensorflow', 'tensorflow_federated', 'tensorflow_privacy', 'jax'))\n"
      "print('LOADED', bad)\n")
  out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                       timeout=120)
  assert out.returncode == 0, out.stderr
  assert "LOADED []" in out.stdout, f"{module} pulls in {out.stdout}"


def test_command_modules_are_light():
  """`tff-mf factorize` on a cache hit must not pay for matplotlib or tqdm at import."""
  modules = _existing(("tff_mf.cli",) + _command_modules())
  code = (
      "import importlib, sys\n"
      f"for m in {modules!r}: importlib.import_module(m)\n"
      "print('LOADED', sorted(m for m in ('matplotlib', 'tqdm', 'scipy.linalg') "
      "if m in sys.modules))\n")
  out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                       timeout=120)
  assert out.returncode == 0, out.stderr
  assert "LOADED []" in out.stdout
