"""The environment a user's shell gives a command, for the tests' subprocesses.

Importing TensorFlow changes ``os.environ`` of the importing process (it sets
``TF2_BEHAVIOR=1``, ``TF_CPP_MIN_LOG_LEVEL``, ``KMP_*`` ...). A subprocess that
inherits the test process's environment therefore runs under conditions no user
has, and once hid a crash of the training binary in a clean shell. Every
subprocess a test starts gets :func:`env` instead: a minimal PATH/HOME/LANG
environment built from constants, never from ``os.environ``, plus

* ``TFF_MF_CACHE`` pointing at the tests' shared cache (so nothing is written
  into the real ``~/.cache/tff_mf``);
* ``TF_CPP_MIN_LOG_LEVEL=3`` (the training binary sets the same default itself;
  it only silences TensorFlow's C++ start-up banner);
* ``PYTHONPATH`` = the repository root, only when asked (``pythonpath=True``):
  a script outside the repository root that imports ``training`` or
  ``tff_mf`` needs it, since neither is importable from elsewhere.

``HOME`` is a private empty directory under ``.pytest_cache`` unless a test
passes its own, so a command that writes to ``~`` writes nowhere real.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from typing import Dict, Optional

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CACHE = os.path.join(REPO, ".pytest_cache", "tff_mf")
PATH = "/usr/local/bin:/usr/bin:/bin"


def default_home() -> str:
  """A per-process empty HOME under .pytest_cache (created 0700 on first use)."""
  home = os.path.join(REPO, ".pytest_cache", "userenv_home", str(os.getpid()))
  os.makedirs(home, mode=0o700, exist_ok=True)
  return home


def env(home: Optional[str] = None, pythonpath: bool = False,
        **extra: str) -> Dict[str, str]:
  """A clean-shell environment (see the module docstring); ``extra`` adds variables."""
  out = {
      "PATH": PATH,
      "HOME": str(home) if home is not None else default_home(),
      "LANG": "C.UTF-8",
      "TFF_MF_CACHE": CACHE,
      "TF_CPP_MIN_LOG_LEVEL": "3",
  }
  if pythonpath:
    out["PYTHONPATH"] = REPO
  out.update({k: str(v) for k, v in extra.items()})
  return out


def copy_tracked_files(destination) -> None:
  """Copies the files git tracks in the repository (as they are in the working tree) to
  ``destination``: a fresh clone's content, without what is ignored (venvs, site/, out/)."""
  files = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True,
                         check=True).stdout.decode().split("\0")
  for name in filter(None, files):
    source = os.path.join(REPO, name)
    if os.path.isfile(source):
      target = os.path.join(str(destination), name)
      os.makedirs(os.path.dirname(target), exist_ok=True)
      shutil.copy2(source, target)
