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
import os
from typing import Dict, Optional, Sequence

from tff_mf import checks
from tff_mf import runstate
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


encoder_sha256 = runstate.encoder_sha256


def schema_sha256(schema_dict: Dict[str, object]) -> str:
  """sha256 of a participation schema's canonical JSON."""
  return runstate.json_sha256(schema_dict)


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


model_digest = runstate.model_digest


class ReleaseLog(runstate.ReleaseLog):
  """``releases.jsonl``: the model digest of every round ever logged (never truncated;
  ``tff_mf.runstate.ReleaseLog``), each record bound to the run identity's digest."""

  def __init__(self, run_dir: str):
    super().__init__(os.path.join(run_dir, RELEASES_FILE), "use a new --experiment_name",
                     TrainingError)

  def check_identity(self, identity: RunIdentity) -> None:
    """Refuses records bound to another identity than ``identity`` (one line)."""
    expected = digest(identity)
    round_num = self.bound_elsewhere(expected)
    if round_num is not None:
      found = self.logged[round_num].get(runstate.BINDING_FIELD)
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

  def record(self, round_num: int, model: Dict[str, object], identity: RunIdentity,
             nonprivate: Sequence[str] = ()) -> None:
    """Appends round ``round_num``'s record: its model digest, the run identity's digest and
    the non-private metrics released with it (a logged round is never recorded again)."""
    super().record(round_num, model, digest(identity), nonprivate=sorted(nonprivate))
