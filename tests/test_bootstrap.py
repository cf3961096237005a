"""The README's bootstrap (scripts/bootstrap.sh) on a fresh copy, from a minimal environment.

Slow: it builds the whole pinned environment (3-5 minutes on 2 cores). It runs with a HOME
that cannot be written (a path below a file), as on machines whose home is read-only: pip's
cache and wheel builds must go elsewhere, and the environment must still come up.
"""

import os
import subprocess
import sys

import pytest

import userenv


@pytest.mark.slow
def test_bootstrap_builds_the_venv_with_a_home_that_cannot_be_written(tmp_path):
  copy = tmp_path / "fresh clone"  # a path with a space, as the README's users may have
  userenv.copy_tracked_files(copy)
  base_python = os.path.join(sys.base_prefix, "bin", "python3.11")
  env = dict(userenv.env(home=tmp_path), HOME="/proc/version/home",
             PYTHON=base_python if os.path.exists(base_python) else "python3.11")
  result = subprocess.run(["bash", "scripts/bootstrap.sh"], cwd=copy, env=env,
                          capture_output=True, text=True, timeout=1800)
  assert result.returncode == 0, result.stderr[-3000:]
  assert "is not writable" in result.stderr
  check = subprocess.run([str(copy / ".venv" / "bin" / "tff-mf"), "--help"], env=env,
                         capture_output=True, text=True, timeout=300)
  assert check.returncode == 0, check.stderr[-2000:]
