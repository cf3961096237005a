"""What makes a resumed or repeated run the same mechanism: its identity and its releases.

``<run dir>/identity.json`` (0600) is written once, after the mechanism is built and
before round 1 is computed. It holds the secret noise seed (with ``noise_seed_key``, the
second secret word of its key, drawn with it from OS entropy: ``tff_mf.noise.keys``; absent
for a pinned seed, keyed with the public tag, and in an identity written before it was
recorded, so that run resumes with its old key) and sampling secret, where
the seed came from (``pinned`` or ``os_entropy``), the fingerprint of the run's flags,
the sha256 of the encoder C the noise realizes (float64; for a non-square C also the
decoder B that fixes the per-round noise A⁻¹·B) and the sha256 of the participation
schema. Every later start of the same run directory once a round was released, with or
without a checkpoint, reuses the seeds and source, and refuses, naming both fingerprints, an encoder or
schema other than the recorded ones: whatever ``--cache_dir``, ``--force`` or solver
version produced the C at hand, a run is one mechanism (Denisov et al. 2022,
arXiv:2202.08312, Thm 4.1, holds for one fixed C only). Every field is bound to what the
run released: the checkpoint's meta and every ``releases.jsonl`` record carry the
identity's digest (:func:`digest`), so an identity edited, restored or copied after a
checkpoint or a release is refused. An identity file readable by group or others is
refused too: its seeds may have been read, and ε holds only while they are secret.

``<run dir>/releases.jsonl`` (0600) records, for every round ever logged, the sha256
and ℓ2 norm of the model that round released, the identity digest and the names of the
non-private metrics released with it. It is never truncated (but for a last line cut by
a kill, which names no released round; any other malformed line is refused): a rerun that
replays a logged round must reproduce it bit for bit (same seed, same cohorts, same
noise), or the run stops before that second release is logged; a replayed round is not written
to TensorBoard again. No TensorFlow.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
from typing import Dict, Optional, Sequence

import numpy as np

from tff_mf import checks
from training import rundir
from training.config import TrainingError

IDENTITY_FILE = "identity.json"
RELEASES_FILE = "releases.jsonl"
SEED_SOURCES = ("pinned", "os_entropy", "no_noise")
PINNED_WARNING = ("the noise seed was pinned with --noise_seed: anyone who knows it can "
                  "regenerate the noise and subtract it, so epsilon holds only while that "
                  "seed stays secret")


@dataclasses.dataclass
class RunIdentity:
  """The seeds and fingerprints a run keeps from its first start (noise_seed -1: none;
  noise_seed_key None: the key's second word is the public tag)."""
  noise_seed: int
  sampling_secret: int
  seed_source: str
  config_fingerprint: str
  encoder_sha256: Optional[str] = None
  schema_sha256: Optional[str] = None
  noise_seed_key: Optional[int] = None

  def fields(self) -> Dict[str, object]:
    """Its fields as recorded: ``noise_seed_key`` only when set, so an identity without it
    has the file and digest an earlier tff-mf wrote (and its releases still match)."""
    out = dataclasses.asdict(self)
    if out["noise_seed_key"] is None:
      del out["noise_seed_key"]
    return out


def _path(run_dir: str) -> str:
  return os.path.join(run_dir, IDENTITY_FILE)


def digest(identity: RunIdentity) -> str:
  """sha256 of every field of ``identity`` (canonical JSON): what checkpoints and releases bind."""
  return hashlib.sha256(json.dumps(identity.fields(), sort_keys=True).encode()).hexdigest()


def digest_int(identity: RunIdentity) -> int:
  """:func:`digest` as a non-negative int64 (its first 63 bits), for the checkpoint's meta."""
  return int(digest(identity)[:16], 16) >> 1


def load(run_dir: str) -> Optional[RunIdentity]:
  """The recorded identity, None when the run directory has none (TrainingError if bad)."""
  path = _path(run_dir)
  if not os.path.lexists(path):
    return None
  rundir.check_private(path)
  rundir.check_secret(path, "its noise seed and sampling secret")
  try:
    with open(path, encoding="utf-8") as f:
      value = json.load(f)
    identity = RunIdentity(**value)
  except (OSError, ValueError, TypeError) as e:
    raise TrainingError(f"{path} is unreadable ({type(e).__name__}); the run's seeds and "
                        "mechanism cannot be proven: use a new --experiment_name") from None
  if identity.seed_source not in SEED_SOURCES:
    raise TrainingError(f"{path} records seed source {identity.seed_source!r}; expected one "
                        f"of {', '.join(SEED_SOURCES)}")
  if identity.noise_seed_key is not None:
    try:
      checks.seed(identity.noise_seed_key, "noise_seed_key")
    except checks.CheckError as e:
      raise TrainingError(f"{path}: {e}; the run's noise key cannot be proven: use a new "
                          "--experiment_name") from None
  return identity


def save(run_dir: str, identity: RunIdentity) -> None:
  """Writes identity.json atomically, 0600."""
  path = _path(run_dir)
  tmp = path + ".tmp"
  with rundir.private_umask():
    with open(tmp, "w", encoding="utf-8") as f:
      json.dump(identity.fields(), f, indent=2, sort_keys=True)
      f.flush()
      os.fsync(f.fileno())
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)


def _sha256(*arrays: np.ndarray) -> str:
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
    return _sha256(c, np.asarray(b, np.float64))
  return _sha256(c)


def schema_sha256(schema_dict: Dict[str, object]) -> str:
  """sha256 of a participation schema's canonical JSON."""
  return hashlib.sha256(json.dumps(schema_dict, sort_keys=True).encode()).hexdigest()


def check_same_mechanism(recorded: RunIdentity, encoder: Optional[str], schema: str,
                         run_dir: str) -> None:
  """Refuses (one line, both fingerprints) an encoder or schema other than the recorded."""
  for what, old, new in (("encoder C", recorded.encoder_sha256, encoder),
                         ("participation schema", recorded.schema_sha256, schema)):
    if old != new:
      raise TrainingError(
          f"{run_dir} was started with {what} sha256 {old} but this run has {new}: a resumed "
          "run must keep its mechanism (the cache entry may have been recomputed or replaced, "
          "or --cache_dir changed); restore that entry or use a new --experiment_name")


def model_digest(arrays: Sequence[np.ndarray]) -> Dict[str, object]:
  """sha256 and ℓ2 norm of a released model (its trainable arrays, as stored)."""
  hasher = hashlib.sha256()
  norm = 0.0
  for x in arrays:
    x = np.ascontiguousarray(np.asarray(x))
    hasher.update(f"{x.dtype.str}{x.shape}".encode())
    hasher.update(x.tobytes())
    norm += float(np.sum(np.square(x, dtype=np.float64)))
  return {"sha256": hasher.hexdigest(), "l2": math.sqrt(norm)}


def _release_entry(line: bytes) -> Optional[Dict[str, object]]:
  """One parsed ``releases.jsonl`` record, or None when the line is not one."""
  try:
    entry = json.loads(line)
    entry["round"] = int(entry["round"])
    if not isinstance(entry["sha256"], str):
      return None
  except (ValueError, KeyError, TypeError):
    return None
  return entry


class ReleaseLog:
  """``releases.jsonl``: the model digest of every round ever logged (never truncated).

  A malformed line followed by others is refused (TrainingError naming the file and line):
  the rounds of the lines after it would otherwise escape the replay check. A last line
  without its newline is what a kill during :meth:`record` leaves; the round it names was
  not written anywhere else yet (metrics and TensorBoard come after it), so an unreadable
  one is removed, and a complete one gets its newline before anything is appended.
  """

  def __init__(self, run_dir: str):
    self.path = os.path.join(run_dir, RELEASES_FILE)
    self.logged: Dict[int, Dict[str, object]] = {}
    if not os.path.lexists(self.path):
      return
    rundir.check_private(self.path)
    with open(self.path, "rb") as f:
      data = f.read()
    lines = data.split(b"\n")
    tail = lines.pop()  # b"" when the file ends with a newline
    for number, line in enumerate(lines, 1):
      if not line.strip():
        continue
      entry = _release_entry(line)
      if entry is None:
        raise TrainingError(
            f"{self.path} line {number} is not a release record (cut or edited), so a rerun "
            "could release its round again unchecked; restore the file or use a new "
            "--experiment_name")
      self._add(entry, number)
    entry = _release_entry(tail) if tail.strip() else None
    if entry is not None:
      self._add(entry, len(lines) + 1)
    if tail:
      with open(self.path, "r+b") as f:
        if entry is not None:
          f.seek(0, os.SEEK_END)
          f.write(b"\n")
        else:
          f.truncate(len(data) - len(tail))  # cut by a kill inside record()

  def _add(self, entry: Dict[str, object], number: int) -> None:
    if entry["round"] in self.logged:
      raise TrainingError(f"{self.path} line {number} logs round {entry['round']} a second "
                          "time; restore the file or use a new --experiment_name")
    self.logged[entry["round"]] = entry

  def check_identity(self, identity: RunIdentity) -> None:
    """Refuses records bound to another identity than ``identity`` (one line)."""
    expected = digest(identity)
    for round_num in sorted(self.logged):
      found = self.logged[round_num].get("identity")
      if found != expected:
        raise TrainingError(
            f"{self.path} logs round {round_num} under another run identity than "
            f"{IDENTITY_FILE} ({str(found)[:16]}… against {expected[:16]}…): {IDENTITY_FILE} "
            "was edited, replaced or restored after that round was released (or written by "
            "an older tff-mf); restore it or use a new --experiment_name")

  def nonprivate_metrics(self) -> Sequence[str]:
    """The names of the non-private metrics any logged round released."""
    names = set()
    for entry in self.logged.values():
      names.update(entry.get("nonprivate", ()))
    return tuple(sorted(names))

  @property
  def last_round(self) -> int:
    return max(self.logged, default=0)

  def replays(self, round_num: int, model: Dict[str, object]) -> bool:
    """True if ``round_num`` was logged and ``model`` reproduces it; raises if it does not."""
    old = self.logged.get(round_num)
    if old is None:
      return False
    if old["sha256"] == model["sha256"]:
      return True
    raise TrainingError(
        f"round {round_num} was already released by this run and the rerun computed another "
        f"model (sha256 {str(old['sha256'])[:16]}… logged, {str(model['sha256'])[:16]}… now); "
        "refusing to release it twice: use a new --experiment_name")

  def record(self, round_num: int, model: Dict[str, object], identity: RunIdentity,
             nonprivate: Sequence[str] = ()) -> None:
    """Appends round ``round_num``'s record: its model digest, the run identity's digest and
    the non-private metrics released with it (a logged round is never recorded again)."""
    if round_num in self.logged:
      return
    entry = {"round": int(round_num), **model, "identity": digest(identity),
             "nonprivate": sorted(nonprivate)}
    with rundir.private_umask():
      fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600)
      with os.fdopen(fd, "a", encoding="utf-8") as f:
        f.write(json.dumps(entry, sort_keys=True) + "\n")
    self.logged[round_num] = entry
