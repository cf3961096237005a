"""A run's state belongs to one run: private files, one writer, a binding, a release log.

The state of a matrix-mechanism run holds its secret seeds: whoever reads them can
regenerate and subtract the noise, and whoever replaces them chooses it. The state also
fixes which rounds were released: a round released twice with the same noise row on new
updates gives away their noise-free difference (Denisov et al. 2022, arXiv:2202.08312,
Thm 4.1 holds for one fixed C, each row released once). So, for every framework:

* a state file is owned by the current user and neither group- nor other-writable
  (:func:`check_private`), and, as it holds secrets, neither group- nor other-readable
  (:func:`check_secret`): refused, not repaired, since a chmod cannot unread it;
* it is written whole through a 0600 temporary file, then renamed (:func:`write_private`);
* one process at a time: :class:`StateLock` holds an exclusive ``fcntl.flock``;
* the state is bound to its run: :func:`binding_digest` of what makes the run one mechanism
  (the encoder C, the schema, the spec, where the seeds came from), compared field by field
  at every restart (:func:`check_binding`);
* a :class:`ReleaseLog` records each released round's model digest under the binding's
  digest and is never truncated: a state older than the log (a restored backup, a second
  server on the same file) is refused, and a replayed round must reproduce its release bit
  for bit.

Refusals are one line naming the path and the remedy; ``error`` picks the exception class
(``tff_mf.checks.CheckError`` unless a framework gives its own subclass). No TensorFlow.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import math
import os
import stat
from typing import Callable, Dict, Iterator, Mapping, Optional, Sequence

import numpy as np

from tff_mf import checks

Error = Callable[[str], Exception]


def _mode(st: os.stat_result) -> str:
  return oct(stat.S_IMODE(st.st_mode))


def check_private(path: str, remedy: str, error: Error = checks.CheckError) -> None:
  """Refuses ``path`` unless the current user owns it and it is not group/other-writable
  (a symbolic link is judged by the link itself and by what it points to)."""
  uid = os.getuid()
  for follow in (False, True):
    st = os.stat(path, follow_symlinks=follow)
    if st.st_uid != uid:
      raise error(f"refusing to use {path}: it is owned by uid {st.st_uid}, not by you (uid "
                  f"{uid}), so its state could have been planted or read by someone else; "
                  f"{remedy}")
    if not stat.S_ISLNK(st.st_mode) and st.st_mode & 0o022:
      raise error(f"refusing to use {path}: it is group- or other-writable (mode {_mode(st)}), "
                  f"so others could replace its state; `chmod go-w {path}` or {remedy}")
    if not stat.S_ISLNK(st.st_mode):
      break


def check_secret(path: str, what: str, remedy: str, error: Error = checks.CheckError) -> None:
  """Refuses a file holding secrets (``what``) that group or others may read."""
  st = os.stat(path)
  if st.st_mode & 0o077:
    raise error(f"refusing to use {path}: it is readable by group or others (mode {_mode(st)}), "
                f"so {what} may have been read and epsilon would not hold; if nobody else "
                f"could read it, `chmod 600 {path}` and rerun, else {remedy}")


@contextlib.contextmanager
def private_umask() -> Iterator[None]:
  """Process umask 077 inside the block (files 0600, directories 0700), restored after."""
  previous = os.umask(0o077)
  try:
    yield
  finally:
    os.umask(previous)


def write_private(path: str, write: Callable[[object], None]) -> None:
  """Writes ``path`` whole: ``write(binary file)`` into ``path.tmp`` (0600, fsynced), then
  renames it into place."""
  tmp = f"{path}.tmp"
  with contextlib.suppress(FileNotFoundError):
    os.unlink(tmp)  # never write through a link or a file someone else left there
  fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
  os.fchmod(fd, 0o600)
  with os.fdopen(fd, "wb") as f:
    write(f)
    f.flush()
    os.fsync(f.fileno())
  os.replace(tmp, path)


class StateLock:
  """An exclusive ``fcntl.flock`` on ``path`` (0600, keeps the holder's pid) until
  :meth:`release`; raises at once when another process (or another open in this one)
  holds it."""

  def __init__(self, path: str, what: str, remedy: str, error: Error = checks.CheckError):
    self.path = path
    try:
      fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as e:
      if e.errno == errno.ELOOP:
        raise error(f"refusing to use {path}: it is a symbolic link") from None
      raise
    self._fd: Optional[int] = fd
    try:
      check_private(path, remedy, error)
      os.fchmod(fd, 0o600)
      try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
      except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip()
        raise error(f"{what} is in use by another run (lock {path} is held"
                    f"{f' by pid {holder}' if holder else ''}); wait for it to finish or "
                    f"{remedy}") from None
      os.ftruncate(fd, 0)
      os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    except BaseException:
      self.release()
      raise

  @property
  def held(self) -> bool:
    return self._fd is not None

  def release(self) -> None:
    """Releases the lock (closing the file releases the flock)."""
    if self._fd is not None:
      os.close(self._fd)
      self._fd = None

  def __enter__(self) -> "StateLock":
    return self

  def __exit__(self, *exc) -> None:
    self.release()


# ----------------------------------------------------------------------------- binding


def arrays_sha256(*arrays: np.ndarray) -> str:
  """sha256 of float64 arrays with their shapes (an encoder C, a decoder B)."""
  hasher = hashlib.sha256()
  for x in arrays:
    x = np.ascontiguousarray(x, dtype=np.float64)
    hasher.update(repr(x.shape).encode())
    hasher.update(x.tobytes())
  return hasher.hexdigest()


def encoder_sha256(c: Optional[np.ndarray], b: Optional[np.ndarray] = None) -> Optional[str]:
  """sha256 of the float64 C the noise realizes (and of B when C is not square)."""
  if c is None:
    return None
  c = np.asarray(c, np.float64)
  if b is not None and c.shape[0] != c.shape[1]:
    return arrays_sha256(c, np.asarray(b, np.float64))
  return arrays_sha256(c)


def json_sha256(value: object) -> str:
  """sha256 of ``value``'s canonical JSON (sorted keys)."""
  return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()


def binding_digest(binding: Mapping[str, object]) -> str:
  """The digest of a run's binding (its canonical JSON): what releases are recorded under."""
  return json_sha256(dict(binding))


def check_binding(recorded: Mapping[str, object], current: Mapping[str, object], where: str,
                  remedy: str, error: Error = checks.CheckError) -> None:
  """Refuses (one line naming the first differing field, both values) a state written
  for another run than ``current``."""
  for key in sorted(set(recorded) | set(current)):
    old, new = recorded.get(key), current.get(key)
    if old != new:
      show = lambda v: (f"{v[:16]}…" if isinstance(v, str) and len(v) == 64 else repr(v))
      raise error(f"{where} belongs to another run: its {key} is {show(old)}, this run's "
                  f"{show(new)}; continuing it would mix two mechanisms under one noise seed "
                  f"and an epsilon that covers neither; {remedy}")


def model_digest(arrays: Sequence[np.ndarray]) -> Dict[str, object]:
  """sha256 and ℓ2 norm of a released model (its arrays, as stored)."""
  hasher = hashlib.sha256()
  norm = 0.0
  for x in arrays:
    x = np.ascontiguousarray(np.asarray(x))
    hasher.update(f"{x.dtype.str}{x.shape}".encode())
    hasher.update(x.tobytes())
    norm += float(np.sum(np.square(x, dtype=np.float64)))
  return {"sha256": hasher.hexdigest(), "l2": math.sqrt(norm)}


# ----------------------------------------------------------------------------- releases

# The field of a release record that holds the digest of what the run is bound to.
BINDING_FIELD = "identity"


def _release_entry(line: bytes) -> Optional[Dict[str, object]]:
  """One parsed release record, or None when the line is not one."""
  try:
    entry = json.loads(line)
    entry["round"] = int(entry["round"])
    if not isinstance(entry["sha256"], str):
      return None
  except (ValueError, KeyError, TypeError):
    return None
  return entry


class ReleaseLog:
  """A JSON-lines file with the model digest of every round ever released (never truncated).

  A malformed line followed by others is refused: the rounds after it would escape the
  replay check. A last line without its newline is what a kill during :meth:`record`
  leaves (its round was released nowhere else yet): an unreadable one is removed, a
  complete one gets its newline before anything is appended.
  """

  def __init__(self, path: str, remedy: str, error: Error = checks.CheckError):
    self.path = path
    self.remedy = remedy
    self.error = error
    self.logged: Dict[int, Dict[str, object]] = {}
    if not os.path.lexists(path):
      return
    check_private(path, remedy, error)
    with open(path, "rb") as f:
      data = f.read()
    lines = data.split(b"\n")
    tail = lines.pop()  # b"" when the file ends with a newline
    for number, line in enumerate(lines, 1):
      if not line.strip():
        continue
      entry = _release_entry(line)
      if entry is None:
        raise error(f"{path} line {number} is not a release record (cut or edited), so a "
                    f"rerun could release its round again unchecked; restore the file or "
                    f"{remedy}")
      self._add(entry, number)
    entry = _release_entry(tail) if tail.strip() else None
    if entry is not None:
      self._add(entry, len(lines) + 1)
    if tail:
      with open(path, "r+b") as f:
        if entry is not None:
          f.seek(0, os.SEEK_END)
          f.write(b"\n")
        else:
          f.truncate(len(data) - len(tail))  # cut by a kill inside record()

  def _add(self, entry: Dict[str, object], number: int) -> None:
    if entry["round"] in self.logged:
      raise self.error(f"{self.path} line {number} logs round {entry['round']} a second time; "
                       f"restore the file or {self.remedy}")
    self.logged[entry["round"]] = entry

  @property
  def last_round(self) -> int:
    return max(self.logged, default=0)

  def bound_elsewhere(self, expected: str) -> Optional[int]:
    """The first logged round whose binding digest is not ``expected`` (None if none)."""
    for round_num in sorted(self.logged):
      if self.logged[round_num].get(BINDING_FIELD) != expected:
        return round_num
    return None

  def check_state_round(self, state_round: int, where: str) -> bool:
    """Refuses a state that is behind the log's last round: an older copy (a restored
    backup, or a second server on the same state) would release logged rounds again with
    the noise they were released with, on other updates. True when the state is one round
    ahead (a kill between writing the state, which holds that round's release, and logging
    it: the caller logs it from the state); refuses a state further ahead (a cut log)."""
    last = self.last_round
    if state_round < last:
      raise self.error(
          f"{where} is at round {state_round} but {self.path} shows round {last} released: it "
          "is an older copy (a restored backup, or a second server on the same state), and "
          f"continuing would release rounds {state_round + 1}..{last} again with the same noise "
          f"on other updates; restore the state of round {last} or {self.remedy}")
    if state_round > last + 1:
      raise self.error(
          f"{where} is at round {state_round} but {self.path} logs only {last} released "
          f"rounds: the log was cut, replaced or lost; restore it or {self.remedy}")
    return state_round == last + 1

  def replays(self, round_num: int, model: Dict[str, object]) -> bool:
    """True if ``round_num`` was logged and ``model`` reproduces it; raises if it does not."""
    old = self.logged.get(round_num)
    if old is None:
      return False
    if old["sha256"] == model["sha256"]:
      return True
    raise self.error(
        f"round {round_num} was already released by this run and the rerun computed another "
        f"model (sha256 {str(old['sha256'])[:16]}… logged, {str(model['sha256'])[:16]}… now); "
        f"refusing to release it twice: {self.remedy}")

  def record(self, round_num: int, model: Dict[str, object], binding: str,
             **extra: object) -> None:
    """Appends round ``round_num``'s record: its model digest, the binding's digest and
    ``extra`` fields (a logged round is never recorded again)."""
    if round_num in self.logged:
      return
    entry = {"round": int(round_num), **model, BINDING_FIELD: binding, **extra}
    with private_umask():
      fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600)
      with os.fdopen(fd, "a", encoding="utf-8") as f:
        f.write(json.dumps(entry, sort_keys=True) + "\n")
    self.logged[round_num] = entry
