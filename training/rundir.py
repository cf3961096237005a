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

import contextlib
import errno
import fcntl
import os
import stat
from typing import Iterator, Optional

from training.config import TrainingError

LOCK_FILE = ".lock"


def _describe_mode(mode: int) -> str:
  return oct(stat.S_IMODE(mode))


def check_private(path: str) -> None:
  """Refuses ``path`` unless the current user owns it and it is not group/other-writable.

  A symbolic link is judged by the link itself and by what it points to.
  """
  uid = os.getuid()
  for follow in (False, True):
    st = os.stat(path, follow_symlinks=follow)
    if st.st_uid != uid:
      raise TrainingError(
          f"refusing to use {path}: it is owned by uid {st.st_uid}, not by you (uid {uid}); "
          "its checkpoints could have been planted or read by someone else; use another "
          "--root_output_dir or --experiment_name")
    if not stat.S_ISLNK(st.st_mode) and st.st_mode & 0o022:
      raise TrainingError(
          f"refusing to use {path}: it is group- or other-writable (mode "
          f"{_describe_mode(st.st_mode)}), so others could replace its checkpoints; "
          f"`chmod go-w {path}` or use another --root_output_dir")
    if not stat.S_ISLNK(st.st_mode):
      break


def check_secret(path: str, what: str) -> None:
  """Refuses a file holding secrets (``what``) that group or others may read.

  Refused, not repaired: a chmod cannot unread what may have been read, and ε holds only
  while the secrets are secret; the owner, who knows whether anyone else could read it,
  decides (``chmod 600``) or starts a new run.
  """
  mode = os.stat(path).st_mode
  if mode & 0o077:
    raise TrainingError(
        f"refusing to use {path}: it is readable by group or others (mode "
        f"{_describe_mode(mode)}), so {what} may have been read and epsilon would not hold; "
        f"if nobody else could read it, `chmod 600 {path}` and rerun, else use a new "
        "--experiment_name")


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


@contextlib.contextmanager
def private_umask() -> Iterator[None]:
  """Process umask 077 inside the block (files 0600, directories 0700), restored after."""
  previous = os.umask(0o077)
  try:
    yield
  finally:
    os.umask(previous)


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


class RunLock:
  """An exclusive ``fcntl.flock`` on ``<run_dir>/.lock`` (0600), held until :meth:`release`.

  ``RunLock(run_dir)`` acquires the lock or raises TrainingError at once: another
  run (in any process) holds the directory. The lock file keeps the holder's pid.
  """

  def __init__(self, run_dir: str):
    self.path = os.path.join(run_dir, LOCK_FILE)
    try:
      fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as e:
      if e.errno == errno.ELOOP:
        raise TrainingError(f"refusing to use {self.path}: it is a symbolic link") from None
      raise
    self._fd: Optional[int] = fd
    try:
      check_private(self.path)
      os.fchmod(fd, 0o600)
      try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
      except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip()
        raise TrainingError(
            f"{run_dir} is in use by another run (lock {self.path} is held"
            f"{f' by pid {holder}' if holder else ''}); wait for it to finish or use another "
            "--experiment_name") from None
      os.ftruncate(fd, 0)
      os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    except BaseException:
      self.release()
      raise

  def release(self) -> None:
    """Releases the lock (closing the file releases the flock)."""
    if self._fd is not None:
      os.close(self._fd)
      self._fd = None

  def __enter__(self) -> "RunLock":
    return self

  def __exit__(self, *exc) -> None:
    self.release()
