"""Checkpoints of a training run through ``tff.program.FileProgramStateManager``.

Three managers in ``<run dir>/checkpoints``: ``meta_<round>`` (a :class:`RunProgress`:
round, sampler cursor, counters, the secret noise seed and the secret sampling seed, and
the digest of the run identity it was written under (``training.identity``);
fixed structure, so it can be read before the process is built with that seed),
``sampling_<round>`` (the sampler's state and the participation record,
``training.sampling``: fixed-shape int64 arrays) and ``program_state_<round>`` (the
LearningAlgorithmState). A meta written before the noise key's second word was recorded
(``noise_seed_key``) loads with -1 there: the public tag, the key that run drew its noise
with, so it continues its identical noise. Meta is written last, so its latest version
always has a complete process state and sampling state beside it.

The checkpoints hold the secret noise and sampling seeds and who joined which round
(amplification by sampling assumes that is secret): they are written 0600 in 0700
directories whatever the umask, and a checkpoint directory or file owned by
another user or writable by group/others is refused before anything is read or
written (``training.rundir``).
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import os
from typing import Optional, Tuple, Union

import numpy as np

from training import rundir
from training.config import TrainingError

CHECKPOINT_DIR = "checkpoints"
# State entries whose leading dimension grows during a run: TFF's tree_aggregation keeps one
# buffered node per level completed so far (tensorflow_privacy tree_aggregation.TreeState).
GROWING_ENTRIES = ("tree_state/level_buffer",)


@dataclasses.dataclass
class RunProgress:
  """Where a run is: what ``meta_<round>`` stores (noise_seed -1: the run has none;
  noise_seed_key -1: the key's second word is the public tag, ``tff_mf.noise.keys``)."""
  round: int = 0
  cursor: int = 0
  noise_seed: int = -1
  noise_seed_key: int = -1
  sampling_secret: int = -1
  empty_clients_skipped: int = 0
  zeroed_client_updates: int = 0
  wall_seconds: float = 0.0
  identity_digest: int = -1  # training.identity.digest_int of the identity it was written under

  @property
  def noise_key(self) -> Optional[Union[int, Tuple[int, int]]]:
    """What the mechanism is built with: None (no noise), the int seed (keyed with the
    public tag: pinned, or recorded before the second word was) or the secret pair."""
    if self.noise_seed < 0:
      return None
    return self.noise_seed if self.noise_seed_key < 0 else (self.noise_seed, self.noise_seed_key)


def _run(coro):
  return asyncio.run(coro)


def _grows(path: str) -> bool:
  """Whether state entry ``path`` may have another leading dimension than the initial state."""
  return any(entry in path for entry in GROWING_ENTRIES)


def _leaf_dtype(x) -> str:
  """numpy dtype name of a state leaf (array, tensor or Python scalar)."""
  dtype = getattr(x, "dtype", None)
  if dtype is None:
    return np.asarray(x).dtype.name
  return getattr(dtype, "name", str(dtype))


# Fields a meta written by an earlier tff-mf may lack (their defaults are what that run used).
LEGACY_FIELDS = ("noise_seed_key",)


def _meta_structure(legacy: bool = False) -> "collections.OrderedDict[str, object]":
  out = collections.OrderedDict()
  for field in dataclasses.fields(RunProgress):
    if not (legacy and field.name in LEGACY_FIELDS):
      out[field.name] = np.float64(0.0) if field.type == "float" else np.int64(0)
  return out


def _load_meta(manager, version: int):
  """``meta_<version>`` with this tff-mf's fields, else an earlier one's (the missing
  ``LEGACY_FIELDS`` then keep their defaults); ValueError/TypeError if neither fits."""
  try:
    return _run(manager.load(version, _meta_structure()))
  except (ValueError, TypeError):
    return _run(manager.load(version, _meta_structure(legacy=True)))


class Checkpointer:
  """Saves and loads (RunProgress, program state) pairs in ``directory`` (kept private)."""

  def __init__(self, directory: str, keep: int = 3):
    import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
    self.directory = directory
    rundir.make_private_dir(directory)
    rundir.check_private_tree(directory)
    self.meta = tff.program.FileProgramStateManager(directory, prefix="meta_", keep_total=keep,
                                                    keep_first=False)
    self.state = tff.program.FileProgramStateManager(directory, prefix="program_state_",
                                                     keep_total=keep, keep_first=False)
    self.sampling = tff.program.FileProgramStateManager(directory, prefix="sampling_",
                                                        keep_total=keep, keep_first=False)

  def latest(self) -> Optional[RunProgress]:
    """The RunProgress of the newest checkpoint, or None when there is none."""
    rundir.check_private_tree(self.directory)
    versions = _run(self.meta.get_versions())
    if not versions:
      return None
    try:
      meta = _load_meta(self.meta, versions[-1])
    except (ValueError, TypeError):
      raise TrainingError(
          f"checkpoint meta_{versions[-1]} in {self.directory} does not have this tff-mf's "
          "fields (an older version wrote it, without the digest that binds the run's "
          "identity); resume with that version, or use a new --experiment_name") from None
    progress = RunProgress(**{f.name: (float(meta[f.name]) if f.type == "float"
                                       else int(meta[f.name]))
                              for f in dataclasses.fields(RunProgress) if f.name in meta})
    if progress.round != versions[-1]:
      raise TrainingError(f"checkpoint meta_{versions[-1]} in {self.directory} records round "
                          f"{progress.round}; the checkpoint directory is corrupt")
    return progress

  def load_state(self, round_num: int, structure):
    """``program_state_<round_num>``, checked leaf by leaf against ``structure``.

    FileProgramStateManager would return arrays of the checkpoint's shapes for a
    template of other shapes, and fails with a bare nest error when the nesting
    differs. Both happen when the checkpoint was written by another tff-mf
    version or model; either way this raises a TrainingError naming the first
    difference, and leaves the checkpoint files untouched.
    """
    from tensorflow.python.util import nest  # pylint: disable=g-import-not-at-top
    rundir.check_private_tree(self.directory)
    name = f"checkpoint program_state_{round_num} in {self.directory}"
    hint = ("it was written by a different tff-mf version, model or mechanism; resume with "
            "the code and flags that wrote it, or start a new experiment directory")
    try:
      state = _run(self.state.load(round_num, structure))
    except (ValueError, TypeError) as e:
      raise TrainingError(f"{name} does not have this run's state structure ({hint}): "
                          f"{str(e).splitlines()[0]}") from e
    expected = nest.flatten_with_joined_string_paths(structure)
    loaded = nest.flatten(state)
    if len(expected) != len(loaded):
      raise TrainingError(f"{name} holds {len(loaded)} arrays, this run's state "
                          f"{len(expected)} ({hint})")
    for (path, want), got in zip(expected, loaded):
      want_shape, got_shape = tuple(np.shape(want)), tuple(np.shape(got))
      want_dtype, got_dtype = _leaf_dtype(want), _leaf_dtype(got)
      if _grows(path) and len(want_shape) == len(got_shape) >= 1:
        want_shape, got_shape = want_shape[1:], got_shape[1:]
      if want_shape != got_shape or want_dtype != got_dtype:
        raise TrainingError(f"{name}: state entry {path or '<root>'} is "
                            f"{got_dtype}{list(got_shape)} in the checkpoint but "
                            f"{want_dtype}{list(want_shape)} in this run ({hint})")
    return state

  def load_sampling(self, round_num: int, structure):
    """``sampling_<round_num>``: arrays of ``structure``'s shapes (TrainingError otherwise)."""
    rundir.check_private_tree(self.directory)
    name = f"checkpoint sampling_{round_num} in {self.directory}"
    try:
      loaded = _run(self.sampling.load(round_num, structure))
    except (ValueError, TypeError) as e:
      raise TrainingError(f"{name} does not match this run's sampler: "
                          f"{str(e).splitlines()[0]}") from e
    out = collections.OrderedDict()
    for key, want in structure.items():
      got = np.asarray(loaded[key])
      if got.shape != np.shape(want):
        raise TrainingError(f"{name}: {key} has shape {list(got.shape)}, this run's sampler "
                            f"{list(np.shape(want))}; resume with the same dataset and flags")
      out[key] = got.astype(np.int64)
    return out

  def save(self, state, progress: RunProgress, sampling=None) -> None:
    """Writes program_state_<round>, sampling_<round>, then meta_<round>, all private."""
    rundir.check_private_tree(self.directory)
    version = int(progress.round)
    with rundir.private_umask():
      for manager in (self.state, self.sampling, self.meta):
        versions = _run(manager.get_versions()) or []
        if version in versions:  # left by a run killed between the writes
          _run(manager._remove(version))  # pylint: disable=protected-access
      _run(self.state.save(state, version))
      if sampling is not None:
        _run(self.sampling.save(sampling, version))
      values = _meta_structure()
      for key, value in dataclasses.asdict(progress).items():
        values[key] = np.float64(value) if isinstance(values[key], np.float64) else np.int64(
            value)
      _run(self.meta.save(values, version))
    rundir.restrict_tree(self.directory)
