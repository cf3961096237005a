"""`pip install tff-mf` gives the numpy core without TensorFlow, on the newest Python here.

The module builds the wheel of this checkout, creates a fresh virtual environment with the
newest Python the machine offers (pyenv's versions, then the interpreters on PATH), installs
the wheel there with its core requirements from the package index (or pip's cache), and
checks, in that environment: TensorFlow is absent and numpy is 2.x; ``tff-mf`` factorizes,
accounts (the same ε as the pinned TensorFlow environment) and names the extra a TF-only
command needs, in one line; the core's noise stream (``tff_mf.noise.streams``) runs. Every
subprocess gets a clean-shell environment (``userenv.env``) plus pip's index settings and
cache, never this process's ``os.environ``. About a minute from a warm pip cache.
"""

from __future__ import annotations

import configparser
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import zipfile

import pytest

import userenv

REPO = userenv.REPO
# What the wheel is built from (setup.cfg reads README.md as its long description).
SOURCES = ("tff_mf", "setup.cfg", "pyproject.toml", "README.md")
# pip settings a user's shell may carry that say where packages come from; TensorFlow sets
# none of them, and a clean environment without them could reach no index at all.
PIP_SOURCE_VARIABLES = ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS", "PIP_CERT",
                        "PIP_TRUSTED_HOST", "PIP_DEFAULT_TIMEOUT", "PIP_CONFIG_FILE",
                        "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY")
INSTALL_TIMEOUT_SECONDS = 900
COMMAND_TIMEOUT_SECONDS = 300


def _version(python: str):
  """(major, minor) of ``python`` when it can create a venv with pip, else None."""
  try:
    out = subprocess.run(
        [python, "-c", "import sys, venv, ensurepip; print(*sys.version_info[:2])"],
        capture_output=True, text=True, timeout=60, env=userenv.env())
  except (OSError, subprocess.TimeoutExpired):
    return None
  return tuple(map(int, out.stdout.split())) if out.returncode == 0 else None


def newest_python():
  """(version, path) of the newest Python >= 3.11 here that can build a venv, or None."""
  pyenv_root = os.environ.get("PYENV_ROOT") or os.path.join(os.path.expanduser("~"), ".pyenv")
  candidates = sorted(glob.glob(os.path.join(pyenv_root, "versions", "3.*", "bin", "python3")))
  for folder in userenv.PATH.split(os.pathsep):
    candidates += sorted(glob.glob(os.path.join(folder, "python3.[0-9]*")))
  found = []
  for path in candidates:
    if re.search(r"python3(\.\d+)?$", path) and os.access(path, os.X_OK):
      version = _version(path)
      if version is not None and version >= (3, 11):
        found.append((version, path))
  return max(found) if found else None


def _pip_env(home: str, **extra: str):
  """The clean-shell environment with pip's sources and cache."""
  sources = {k: os.environ[k] for k in PIP_SOURCE_VARIABLES if k in os.environ}
  cache = os.environ.get("PIP_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache",
                                                          "pip")
  return userenv.env(home=home, PIP_CACHE_DIR=cache, PIP_DISABLE_PIP_VERSION_CHECK="1",
                     **sources, **extra)


def _run(argv, *, env, cwd, timeout=COMMAND_TIMEOUT_SECONDS, what):
  try:
    out = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=cwd,
                         timeout=timeout)
  except subprocess.TimeoutExpired:
    pytest.fail(f"{what}: no answer within {timeout} s: {' '.join(argv)}")
  return out


def _checked(argv, *, env, cwd, timeout=COMMAND_TIMEOUT_SECONDS, what):
  out = _run(argv, env=env, cwd=cwd, timeout=timeout, what=what)
  assert out.returncode == 0, f"{what} failed ({out.returncode}):\n{out.stdout}\n{out.stderr}"
  return out


@pytest.fixture(scope="module")
def core(tmp_path_factory):
  """A fresh venv with the wheel of this checkout and its core requirements only."""
  newest = newest_python()
  if newest is None:
    pytest.skip("no Python >= 3.11 that can create a venv with pip was found")
  version, python = newest
  root = tmp_path_factory.mktemp("core_install")
  src, dist, home, work = (root / name for name in ("src", "dist", "home", "work"))
  for path in (home, work):
    path.mkdir()
  for name in SOURCES:
    source = os.path.join(REPO, name)
    if os.path.isdir(source):
      shutil.copytree(source, src / name, ignore=shutil.ignore_patterns("__pycache__"))
    else:
      src.mkdir(exist_ok=True)
      shutil.copy(source, src / name)
  env = _pip_env(str(home))
  # The wheel: built by this environment's setuptools (no download, no build isolation).
  _checked([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps",
            "--no-build-isolation", "--wheel-dir", str(dist), str(src)],
           env=env, cwd=str(work), what="building the wheel")
  wheels = glob.glob(str(dist / "tff_mf-*.whl"))
  assert len(wheels) == 1, wheels
  venv = root / "venv"
  _checked([python, "-m", "venv", str(venv)], env=env, cwd=str(work), what="creating the venv")
  _checked([str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", wheels[0]],
           env=env, cwd=str(work), timeout=INSTALL_TIMEOUT_SECONDS,
           what=f"pip install of the wheel on Python {version[0]}.{version[1]}")
  return dict(version=version, python=str(venv / "bin" / "python"),
              tff_mf=str(venv / "bin" / "tff-mf"), work=str(work), wheel=wheels[0],
              env=userenv.env(home=str(home), TFF_MF_CACHE=str(root / "cache")))


def _python(core, code):
  """stdout of ``code`` run by the core venv's Python, outside the repository."""
  return _checked([core["python"], "-c", textwrap.dedent(code)], env=core["env"],
                  cwd=core["work"], what="a Python snippet in the core venv").stdout


def test_the_core_installs_on_the_newest_python_with_numpy_2_and_without_tensorflow(core):
  out = json.loads(_python(core, """
      import importlib.util, json, sys
      import numpy, scipy, dp_accounting, tff_mf
      print(json.dumps(dict(
          python=list(sys.version_info[:2]), numpy=numpy.__version__, tff_mf=tff_mf.__file__,
          present=[m for m in ("tensorflow", "tensorflow_federated", "tensorflow_privacy",
                              "jax", "matplotlib") if importlib.util.find_spec(m)])))
  """))
  assert tuple(out["python"]) == core["version"]
  assert out["present"] == [], f"the core install pulled in {out['present']}"
  assert int(out["numpy"].split(".")[0]) >= 2, out["numpy"]
  assert not out["tff_mf"].startswith(REPO), "tff_mf was imported from the checkout"


def test_the_wheel_holds_every_package_of_the_library(core):
  """Every folder of tff_mf (participation, noise, factorization and its families,
  accounting, audit, tf, flower, commands) is in the wheel, with every module."""
  with zipfile.ZipFile(core["wheel"]) as wheel:
    shipped = {n for n in wheel.namelist() if n.endswith(".py")}
  ours = {os.path.relpath(os.path.join(root, name), REPO).replace(os.sep, "/")
          for root, _, files in os.walk(os.path.join(REPO, "tff_mf"))
          for name in files if name.endswith(".py")}
  assert "tff_mf/noise/streams.py" in ours and ours - shipped == set()


def test_factorize_then_the_noise_stream_of_that_factorization(core):
  """The stream the core rebuilds from the cached factorization is C⁻¹ (both exact up to
  float64 rounding over 32 rounds of a well-conditioned C)."""
  out = _checked([core["tff_mf"], "factorize", "--mechanism", "blt", "--total_rounds", "32",
                  "--json"], env=core["env"], cwd=core["work"], what="tff-mf factorize")
  record = json.loads(out.stdout)
  assert record["sensitivity"] == pytest.approx(1.0)
  assert record["outcome"]["converged"], record["outcome"]
  checked = json.loads(_python(core, """
      import json
      import numpy as np
      from tff_mf.factorization import cache, strategies, workloads
      from tff_mf import registry
      spec = strategies.FactorizationSpec(workload=workloads.WorkloadSpec("prefix_sum", 32),
                                          strategy="blt", **registry.default_parameters("blt", 32))
      f, entry = cache.load_or_factorize(spec, progress=False)
      stream = strategies.stream("blt", f.extras, f.a)
      z = np.random.default_rng().standard_normal((32, 3))
      expected = np.linalg.solve(f.c, z)
      state, error = np.zeros((stream.k, 3)), 0.0
      for i in range(4):  # round by round, as an aggregator draws it
        row, state = stream.step(state, z[i], i)
        error = max(error, float(np.max(np.abs(row - expected[i]))))
      error = max(error, float(np.max(np.abs(stream.run(z) - expected))))
      print(json.dumps(dict(hit=entry.cache_hit, error=error,
                            scale=float(np.max(np.abs(expected))))))
  """))
  assert checked["hit"], "the stream did not use the factorization tff-mf factorize cached"
  assert checked["error"] <= 1e-9 * checked["scale"], checked


def test_account_gives_the_pinned_environments_epsilon(core):
  """numpy 2 and today's scipy report the same ε as the lock's numpy 1.25 / scipy 1.9: the
  exact Gaussian ε is bisected to a relative 1e-12 (tff_mf.accounting.gaussian.EXACT_TOLERANCE) from
  log Φ accurate to a few ulp, and the sensitivity of C = I under fixed_epoch is exact."""
  argv = ["account", "--mechanism", "gaussian", "--total_rounds", "64", "--participation",
          "fixed_epoch", "--epochs", "4", "--noise_multiplier", "4", "--delta", "1e-6", "--json"]
  here = _checked([core["tff_mf"], *argv], env=core["env"], cwd=core["work"],
                  what="tff-mf account (core venv)")
  pinned = _checked([sys.executable, "-m", "tff_mf.cli", *argv],
                    env=userenv.env(TFF_MF_CACHE=os.path.join(core["work"], "pinned-cache")),
                    cwd=REPO, what="tff-mf account (pinned venv)")
  eps, eps_pinned = (json.loads(o.stdout)["epsilon"] for o in (here, pinned))
  assert eps == pytest.approx(eps_pinned, rel=1e-9)


def test_account_of_a_factorized_mechanism(core):
  out = _checked([core["tff_mf"], "account", "--mechanism", "blt", "--total_rounds", "32",
                  "--min_sep", "8", "--noise_multiplier", "2", "--delta", "1e-6", "--json"],
                 env=core["env"], cwd=core["work"], what="tff-mf account --mechanism blt")
  record = json.loads(out.stdout)
  # z/sens with sens >= 1 (C is normalized to column norm 1, min_sep joins up to 4 rounds).
  floor = _python(core, """
      from tff_mf.accounting import gaussian
      print(gaussian.gaussian_epsilon_exact(2.0, 1e-6))
  """)
  assert float(floor) <= record["epsilon"] < float("inf")


def test_help_and_the_one_line_refusal_of_tf_only_commands(core):
  help_text = _checked([core["tff_mf"], "--help"], env=core["env"], cwd=core["work"],
                       what="tff-mf --help").stdout
  assert "audit" in help_text and "factorize" in help_text
  _checked([core["tff_mf"], "audit", "--help"], env=core["env"], cwd=core["work"],
           what="tff-mf audit --help")
  for argv, extra in ((["audit", "--mechanism", "blt", "--noise_multiplier", "1"], "tff"),
                      (["plot", "--total_rounds", "8", "--output_dir", "plots"], "plot")):
    out = _run([core["tff_mf"], *argv], env=core["env"], cwd=core["work"], what="tff-mf")
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2, out
    assert len(lines) == 1 and "Traceback" not in out.stderr, out.stderr
    assert lines[0].startswith(f"tff-mf {argv[0]}: error: needs the "), lines[0]
    assert f"pip install 'tff-mf[{extra}]'" in lines[0], lines[0]
  assert not os.path.exists(os.path.join(core["work"], "plots")), "a refusal wrote output"
  # From Python: the TF layer's import says the same.
  out = _run([core["python"], "-c", "import tff_mf.tf"], env=core["env"], cwd=core["work"],
             what="import tff_mf.tf")
  assert out.returncode != 0
  assert out.stderr.strip().splitlines()[-1].startswith(
      "ImportError: tff_mf.tf needs the TensorFlow extra"), out.stderr
  # And the Flower layer's, naming its extra (flwr is not in the core's environment).
  out = _run([core["python"], "-c", "import tff_mf.flower.strategy"], env=core["env"],
             cwd=core["work"], what="import tff_mf.flower.strategy")
  assert out.returncode != 0
  assert out.stderr.strip().splitlines()[-1].startswith(
      "ImportError: tff_mf.flower.strategy needs the Flower extra (flwr not installed): "
      "pip install '<a tff-mf wheel or clone>[flower]'"), out.stderr


def _requirement(line):
  name, _, version = line.split(";")[0].strip().partition("==")
  return re.sub(r"[-_.]+", "-", name).lower(), version


def test_the_tff_extra_holds_the_pins_of_the_lock():
  cfg = configparser.ConfigParser()
  cfg.read(os.path.join(REPO, "setup.cfg"))
  extra = [_requirement(x) for x in cfg["options.extras_require"]["tff"].split("\n") if x]
  with open(os.path.join(REPO, "requirements", "lock.txt"), encoding="utf-8") as f:
    lock = dict(_requirement(x) for x in f if x.strip() and not x.startswith("#"))
  assert extra, "setup.cfg has no tff extra"
  assert [(n, v) for n, v in extra if lock.get(n) != v] == []
  # The requirements no pip can resolve stay out of the extra (lock-nodeps.txt's --no-deps).
  with open(os.path.join(REPO, "requirements", "lock-nodeps.txt"), encoding="utf-8") as f:
    nodeps = {_requirement(x)[0] for x in f if x.strip() and not x.startswith("#")}
  assert nodeps.isdisjoint(n for n, _ in extra)
