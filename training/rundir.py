"""Run directories that keep the secret noise seed secret, and one run per directory.

A run directory ``<root_output_dir>/<experiment_name>`` holds the checkpoints, and
the checkpoints hold the secret noise seed of the matrix mechanism (whoever reads
it can subtract the noise). So:

* the run directory and everything under it are created private: directories
  0700, files 0600, whatever the caller's umask (:func:`make_private_dir`,
  :func:`private_umask`, :func:`restrict_tree`);
* a run refuses to write into, or resume from, a directory or checkpoint file that
  another user owns or that is group- or other-writable: someone else could have
  planted or could swap a checkpoint (:func:`check_private`, :func:`check_private_tree`);
* one run at a time per directory: :class:`RunLock` holds an exclusive
  ``fcntl.flock`` on ``<run dir>/.lock`` (0600) for the run's lifetime; a second
  run on the same directory fails at once, before writing anything.

Every refusal is a ``TrainingError`` with a one-line message naming the path.
No TensorFlow.
"""

from __future__ import annotations

import os
import stat

from tff_mf import runstate
from training.config import TrainingError

LOCK_FILE = ".lock"


REMEDY = "use another --root_output_dir or --experiment_name"


def check_private(path: str) -> None:
  """Refuses ``path`` unless the current user owns it and it is not group/other-writable
  (``tff_mf.runstate.check_private``; a symbolic link is judged by itself and its target)."""
  runstate.check_private(path, REMEDY, TrainingError)


def check_secret(path: str, what: str) -> None:
  """Refuses a file holding secrets (``what``) that group or others may read
  (``tff_mf.runstate.check_secret``): refused, not repaired, since a chmod cannot unread
  what may have been read; the owner decides (``chmod 600``) or starts a new run."""
  runstate.check_secret(path, what, "use a new --experiment_name", TrainingError)


def check_private_tree(directory: str) -> None:
  """check_private on ``directory`` and every directory and file below it."""
  check_private(directory)
  for dirpath, dirnames, filenames in os.walk(directory):
    for name in sorted(dirnames) + sorted(filenames):
      check_private(os.path.join(dirpath, name))


def restrict_tree(directory: str) -> None:
  """chmod 0700 on ``directory`` and its subdirectories, 0600 on its files."""
  os.chmod(directory, 0o700)
  for dirpath, dirnames, filenames in os.walk(directory):
    for name in dirnames:
      os.chmod(os.path.join(dirpath, name), 0o700)
    for name in filenames:
      os.chmod(os.path.join(dirpath, name), 0o600)


private_umask = runstate.private_umask


def make_private_dir(path: str) -> str:
  """Creates ``path`` (0700) if missing, checks it is private, and tightens it to 0700.

  The parents are created with the caller's permissions (they may hold many runs).
  """
  parent = os.path.dirname(os.path.abspath(path))
  os.makedirs(parent, exist_ok=True)
  try:
    os.mkdir(path, 0o700)
  except FileExistsError:
    pass
  if not os.path.isdir(path):
    raise TrainingError(f"refusing to use {path}: it exists and is not a directory")
  check_private(path)
  if stat.S_IMODE(os.stat(path).st_mode) != 0o700:
    os.chmod(path, 0o700)
  return path


def open_run_dir(run_dir: str) -> str:
  """The run directory, created private or checked private (TrainingError naming it if not)."""
  return make_private_dir(os.path.abspath(run_dir))


class RunLock(runstate.StateLock):
  """An exclusive ``fcntl.flock`` on ``<run_dir>/.lock`` (0600), held until :meth:`release`
  (``tff_mf.runstate.StateLock``): ``RunLock(run_dir)`` acquires the lock or raises
  TrainingError at once: another run (in any process) holds the directory. The lock file
  keeps the holder's pid."""

  def __init__(self, run_dir: str):
    super().__init__(os.path.join(run_dir, LOCK_FILE), run_dir, "use another --experiment_name",
                     TrainingError)
