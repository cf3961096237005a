"""Checkpoints of a training run: private numpy files, written off the round's critical path.

A checkpoint of round ``r`` is one numpy file, ``<run dir>/checkpoints/checkpoint_<r>``,
written whole (a 0600 temporary file, fsynced, then renamed:
``tff_mf.runstate.write_private``), so there is no half-written checkpoint: its
``program_state/`` arrays (the LearningAlgorithmState, its leaves in ``tf.nest`` order with
their paths), ``sampling/`` (the sampler's state and the participation record,
``training.sampling``: fixed-shape int64 arrays) and ``meta/`` (a :class:`RunProgress`:
round, sampler cursor, counters, the secret noise seed and the secret sampling seed, and the
digest of the run identity it was written under, ``training.identity``). The latest
``keep`` checkpoints are kept, with the files they refer to.

Incremental: a state leaf of ``INCREMENTAL_BYTES`` or more whose bits equal a leaf of the
last checkpoint this process wrote (a streaming mechanism's state row, which a round passes on
unchanged until it leaves the band) is neither copied nor written again. The file refers to
the member of the earlier checkpoint file that holds it (always the file that holds it, never
one that refers on), with that member's CRC-32, and loading checks the CRC before it reads the
member. A referred file is written, fsynced and renamed before any file refers to it; pruning
renames an older checkpoint that a kept one refers to ``rows_<round>`` (no longer a checkpoint
to resume from) and removes it once none does. So a kill at any point leaves every
checkpoint whole. Banded C with b bands thus writes one new state row a round instead of
b − 1; the writer holds a private copy of the last checkpoint's large leaves (the size of the
state) to compare with, and a new process writes its first checkpoint whole. Large members
are read as read-only views of the file's map (no copy).

Writing is off the critical path (:meth:`Checkpointer.save` with ``background=True``): the
caller's thread copies the arrays and one writer thread writes them, while the next round
runs; the next save, :meth:`Checkpointer.wait` and :meth:`Checkpointer.close` wait for it
(and raise its error). A checkpoint of round ``r`` is only requested after round ``r``'s
release is logged (``training.identity``), so a kill before its write finishes leaves an
older checkpoint, and the rerun replays the rounds after it against their logged releases
with the same seeds: the same model, or a refusal. (Writing through
``tff.program.FileProgramStateManager``'s SavedModels cost 0.2-0.3 s of CPU a checkpoint,
eight to fifteen rounds of 8 clients of the main job's model.) Checkpoints written that
way by an earlier tff-mf (the directories ``program_state_<r>``, ``sampling_<r>`` and
``meta_<r>``, meta last) are still read, and a meta written before the noise key's second
word was recorded (``noise_seed_key``) loads with -1 there: the public tag, the key that run
drew its noise with, so it continues its identical noise.

The checkpoints hold the secret noise and sampling seeds and who joined which round
(amplification by sampling assumes that is secret): they are written 0600 in 0700
directories whatever the umask, and a checkpoint directory or file owned by
another user or writable by group/others is refused before anything is read or
written (``training.rundir``).
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import dataclasses
import mmap
import os
import re
import shutil
import zipfile
import zlib
from typing import Dict, List, Optional, Tuple, Union

import numpy as np

try:  # ISA-L's CRC-32 (zlib's checksum, which zip members carry): about 8x zlib's speed here
  from isal.isal_zlib import crc32 as _crc32  # pylint: disable=g-import-not-at-top
except ImportError:  # without python-isal (the lock pins it): zlib's, the same checksum
  _crc32 = zlib.crc32

from tff_mf import runstate
from training import rundir
from training.config import TrainingError

CHECKPOINT_DIR = "checkpoints"
CHECKPOINT = "checkpoint_"  # checkpoint_<round>: one file
# rows_<round>: a checkpoint file pruning no longer keeps as a checkpoint, kept (renamed) for
# the members a kept checkpoint refers to; not a checkpoint to resume from.
ROWS = "rows_"
# Its parts (key prefixes), and an earlier tff-mf's SavedModel directories <part>_<round>.
STATE, SAMPLING, META = "program_state", "sampling", "meta"
PARTS = (STATE, SAMPLING, META)
LEGACY_PARTS = tuple(f"{part}_" for part in PARTS)  # written in this order, meta last
_NAME = re.compile(r"(checkpoint|rows|program_state|sampling|meta)_(\d+)$")
# State entries whose leading dimension grows during a run: TFF's tree_aggregation keeps one
# buffered node per level completed so far (tensorflow_privacy tree_aggregation.TreeState).
GROWING_ENTRIES = ("tree_state/level_buffer",)
_PATHS_KEY = "__paths__"  # program_state/: the state's leaf paths, in order
# program_state/: the leaves stored in an earlier checkpoint file (``_Held``): their indices,
# the round of the file that holds each, its member there and that member's CRC-32.
_REF_KEYS = ("__ref_leaves__", "__ref_rounds__", "__ref_members__", "__ref_crcs__")
# A leaf of at least this many bytes is written once and referred to while unchanged.
INCREMENTAL_BYTES = 1 << 20


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


def _array(leaf) -> np.ndarray:
  """A state leaf as the array a checkpoint stores (a copy; a ``str`` as UTF-8 bytes)."""
  if isinstance(leaf, str):
    leaf = leaf.encode()
  out = np.array(leaf, copy=True)
  if out.dtype == object:
    raise TypeError(f"a state leaf of type {type(leaf).__name__} cannot be checkpointed")
  return out


def _leaf(array: np.ndarray):
  """A stored array as the leaf TFF's runtime returns: 0-d as a numpy scalar (bytes as
  ``bytes``), else the array."""
  if array.ndim:
    return array
  value = array[()]
  return bytes(value) if isinstance(value, bytes) else value


def _write_npz(path: str, arrays: Dict[str, np.ndarray]) -> None:
  """``np.savez``'s file (a zip of stored ``.npy`` members, read by ``np.load``), each array's
  bytes written from its own buffer: ``np.savez`` copies them through ``tobytes`` chunks."""
  def write(f):
    with zipfile.ZipFile(f, "w", zipfile.ZIP_STORED, allowZip64=True) as zf:
      for key, value in arrays.items():
        array = value if value.flags.c_contiguous else np.array(value, order="C")
        with zf.open(f"{key}.npy", "w", force_zip64=True) as member:
          np.lib.format.write_array_header_1_0(
              member, np.lib.format.header_data_from_array_1_0(array))
          member.write(array.reshape(-1).view(np.uint8))
  runstate.write_private(path, write)


class _File:
  """An open checkpoint file: its zip directory, and one read-only map of the file (made at
  its first large member) that the arrays of its large members share."""

  def __init__(self, path: str):
    self.raw = open(path, "rb")  # pylint: disable=consider-using-with
    try:
      self.zf = zipfile.ZipFile(self.raw)
    except BaseException:
      self.raw.close()
      raise
    self._mapped: Optional[mmap.mmap] = None

  def mapped(self) -> mmap.mmap:
    if self._mapped is None:  # unmapped when the last array on it goes
      self._mapped = mmap.mmap(self.raw.fileno(), 0, access=mmap.ACCESS_READ)
    return self._mapped

  def __enter__(self) -> "_File":
    return self

  def __exit__(self, *exc) -> None:
    self.zf.close()
    self.raw.close()


def _read_part(path: str, part: str) -> Dict[str, np.ndarray]:
  """The arrays of ``part`` in checkpoint file ``path``, keyed without the part's prefix."""
  out = {}
  with _File(path) as f:
    for info in f.zf.infolist():
      key = info.filename[:-4] if info.filename.endswith(".npy") else info.filename
      if key.startswith(part + "/"):
        out[key[len(part) + 1:]] = _read_member(f, info)
  return out


def _read_member(f: _File, info: zipfile.ZipInfo) -> np.ndarray:
  """One ``.npy`` member, its CRC-32 checked as ``zipfile`` does: a stored C-order one read
  straight from the file into its array (``np.load`` reads it in chunks and copies them), or
  one of ``INCREMENTAL_BYTES`` or more a read-only view of the file's map (no copy: the file
  is private and only ever replaced whole, by a rename, never rewritten in place)."""
  raw = f.raw
  with f.zf.open(info) as member:
    version = np.lib.format.read_magic(member)
    read_header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                   else np.lib.format.read_array_header_2_0)
    shape, fortran_order, dtype = read_header(member)
    header_size = member.tell()
    if info.compress_type != zipfile.ZIP_STORED or fortran_order or dtype.hasobject:
      member.seek(0)
      return np.lib.format.read_array(member, allow_pickle=False)
  raw.seek(info.header_offset)
  local = raw.read(30)  # the local file header: its name and extra field lengths at 26, 28
  start = info.header_offset + 30 + int.from_bytes(local[26:28], "little") + int.from_bytes(
      local[28:30], "little")
  nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
  raw.seek(start)
  header = raw.read(header_size)
  if local[:4] != b"PK\x03\x04" or header_size + nbytes != info.file_size or (
      start + info.file_size > os.fstat(raw.fileno()).st_size):
    raise zipfile.BadZipFile(f"member {info.filename} is truncated or malformed")
  if nbytes >= INCREMENTAL_BYTES:
    array = np.frombuffer(f.mapped(), dtype, nbytes // dtype.itemsize, start + header_size)
    data = array.view(np.uint8)
  else:
    array = np.empty(shape, dtype)
    data = array.reshape(-1).view(np.uint8)
    if raw.readinto(data) != data.size:
      raise zipfile.BadZipFile(f"member {info.filename} is truncated or malformed")
  if _crc32(data, _crc32(header)) != info.CRC:
    raise zipfile.BadZipFile(f"Bad CRC-32 for file {info.filename!r}")
  return array.reshape(shape)


def _meta_arrays(progress: RunProgress) -> Dict[str, np.ndarray]:
  values = _meta_structure()
  return {key: np.asarray(np.float64(value) if isinstance(values[key], np.float64)
                          else np.int64(value))
          for key, value in dataclasses.asdict(progress).items()}


class _RefError(ValueError):
  """A checkpoint's reference to a leaf in another file does not resolve."""


@dataclasses.dataclass(frozen=True, eq=False)
class _Held:
  """A large state leaf as a checkpoint file holds it: its bits (the writer's private,
  read-only copy), the round of that file, the member there and the member's CRC-32."""
  array: np.ndarray
  round: int
  member: str
  crc: int


def _large(leaf) -> Optional[np.ndarray]:
  """``leaf`` as an array (no copy) when it is a numeric one of ``INCREMENTAL_BYTES`` or more."""
  if not hasattr(leaf, "dtype") or not np.shape(leaf):
    return None
  array = np.asarray(leaf)
  return array if array.dtype.kind in "biuf" and array.nbytes >= INCREMENTAL_BYTES else None


def _bits(array: np.ndarray) -> np.ndarray:
  """The array's bits as unsigned integers of its item size (equal bits: equal views; no
  float equality, which takes −0 for +0)."""
  flat = np.ascontiguousarray(array).reshape(-1)
  return flat.view(f"u{flat.itemsize}") if flat.itemsize in (1, 2, 4, 8) else flat.view("u1")


def _fingerprint(array: np.ndarray) -> Tuple[str, Tuple[int, ...], bytes]:
  """dtype, shape and 64 sampled items: which held leaves might equal ``array``."""
  bits = _bits(array)
  picks = np.linspace(0, bits.size - 1, 64).astype(np.int64)
  return array.dtype.str, tuple(array.shape), bits[picks].tobytes()


def _member_crcs(path: str) -> Dict[str, int]:
  """The CRC-32 of each member of checkpoint file ``path`` (its central directory), by key."""
  with zipfile.ZipFile(path) as zf:
    return {info.filename[:-4]: info.CRC for info in zf.infolist()}


# A streaming mechanism's state row entry: <prefix>stream_state/<row>/<part>.
_STREAM_ROW = re.compile(r"(.*stream_state/\d+)/\d+$")


def _joined_stream_rows(paths: List[str], leaves: List, want: List[str]):
  """(paths, leaves) with the stream state rows of an earlier tff-mf (one entry per variable)
  joined as this one keeps them (one per dtype: ``tff_mf.tf.noise.join_variable_rows``),
  when that gives ``want``'s paths; else as they are."""
  from tff_mf.tf import noise  # pylint: disable=g-import-not-at-top
  rows: Dict[str, List] = {}
  out: List[Tuple[str, object]] = []
  for path, leaf in zip(paths, leaves):
    match = _STREAM_ROW.match(path)
    if match is None:
      out.append((path, leaf))
    else:
      if match.group(1) not in rows:
        rows[match.group(1)] = []
        out.append((match.group(1), rows[match.group(1)]))
      rows[match.group(1)].append(leaf)
  joined = []
  for path, leaf in out:
    if path in rows:
      joined += [(f"{path}/{g}", v) for g, v in enumerate(noise.join_variable_rows(leaf))]
    else:
      joined.append((path, leaf))
  if not rows or [p for p, _ in joined] != want:
    return paths, leaves
  return [p for p, _ in joined], [v for _, v in joined]


class Checkpointer:
  """Saves and loads (RunProgress, program state, sampling state) in ``directory`` (kept
  private), the latest ``keep``; one writer thread writes the background saves in order."""

  def __init__(self, directory: str, keep: int = 3):
    self.directory = directory
    self.keep = keep
    rundir.make_private_dir(directory)
    rundir.check_private_tree(directory)
    self._writer: Optional[concurrent.futures.ThreadPoolExecutor] = None
    self._pending: Optional[concurrent.futures.Future] = None
    # The large leaves of the last checkpoint this writes, by fingerprint (``_Held``).
    self._held: Dict[Tuple, List[_Held]] = {}

  def _file(self, version: int) -> str:
    return os.path.join(self.directory, f"{CHECKPOINT}{version}")

  def _legacy_path(self, part: str, version: int) -> Optional[str]:
    """An earlier tff-mf's directory of ``part`` at ``version`` (None: this round has a
    checkpoint file, or no such directory)."""
    path = os.path.join(self.directory, f"{part}_{version}")
    return path if os.path.isdir(path) and not os.path.exists(self._file(version)) else None

  def _versions(self) -> List[int]:
    """Rounds with a checkpoint: a file, or an earlier tff-mf's meta directory."""
    versions = set()
    for name in os.listdir(self.directory):
      match = _NAME.match(name)
      if match and match.group(1) in ("checkpoint", META):
        versions.add(int(match.group(2)))
    return sorted(versions)

  def _legacy(self, part: str):
    """A FileProgramStateManager over an earlier tff-mf's SavedModel checkpoints."""
    import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
    return tff.program.FileProgramStateManager(self.directory, prefix=f"{part}_",
                                               keep_total=0)

  def _read_meta(self, version: int) -> Dict[str, object]:
    if self._legacy_path(META, version):
      return _load_meta(self._legacy(META), version)
    meta = _read_part(self._file(version), META)
    if set(meta) - set(_meta_structure()):
      raise ValueError(f"unknown fields {sorted(set(meta) - set(_meta_structure()))}")
    return meta

  def latest(self) -> Optional[RunProgress]:
    """The RunProgress of the newest checkpoint, or None when there is none."""
    self.wait()
    rundir.check_private_tree(self.directory)
    versions = self._versions()
    if not versions:
      return None
    name = os.path.basename(self._legacy_path(META, versions[-1]) or self._file(versions[-1]))
    try:
      meta = self._read_meta(versions[-1])
      if "identity_digest" not in meta:
        raise ValueError("no identity digest")
    except (OSError, ValueError, TypeError):
      raise TrainingError(
          f"checkpoint {name} in {self.directory} does not have this tff-mf's "
          "fields (an older version wrote it, without the digest that binds the run's "
          "identity); resume with that version, or use a new --experiment_name") from None
    progress = RunProgress(**{f.name: (float(meta[f.name]) if f.type == "float"
                                       else int(meta[f.name]))
                              for f in dataclasses.fields(RunProgress) if f.name in meta})
    if progress.round != versions[-1]:
      raise TrainingError(f"checkpoint {name} in {self.directory} records round "
                          f"{progress.round}; the checkpoint directory is corrupt")
    return progress

  def _read_state(self, round_num: int, structure, name: str, hint: str):
    """The state's leaves as stored, with their paths (a legacy SavedModel: ``structure``'s)."""
    from tensorflow.python.util import nest  # pylint: disable=g-import-not-at-top
    if self._legacy_path(STATE, round_num):
      try:
        state = _run(self._legacy(STATE).load(round_num, structure))
      except (ValueError, TypeError) as e:
        raise TrainingError(f"{name} does not have this run's state structure ({hint}): "
                            f"{str(e).splitlines()[0]}") from e
      return [p for p, _ in nest.flatten_with_joined_string_paths(structure)], nest.flatten(
          state)
    try:
      stored = _read_part(self._file(round_num), STATE)
      paths = [str(p) for p in stored.pop(_PATHS_KEY)]
      refs = [stored.pop(key, None) for key in _REF_KEYS]
      if refs[0] is not None:
        stored.update(self._read_refs(round_num, *refs))
      return paths, [_leaf(stored[str(i)]) for i in range(len(paths))]
    except _RefError as e:
      raise TrainingError(f"{name} {e}: a state entry it holds by reference is lost; resume "
                          "from an older checkpoint (remove this one) or start a new "
                          "experiment directory") from None
    except (OSError, ValueError, KeyError, zipfile.BadZipFile) as e:
      raise TrainingError(f"{name} is unreadable ({type(e).__name__}: "
                          f"{str(e).splitlines()[0] if str(e) else ''}); {hint}") from None

  def _read_refs(self, round_num: int, leaves, rounds, members, crcs) -> Dict[str, np.ndarray]:
    """The leaves checkpoint ``round_num`` refers to, read from the files that hold them,
    each checked to be the member it names (its CRC-32) before it is read."""
    out = {}
    for source in sorted(set(int(r) for r in rounds)):
      path = self._file(source)
      if not os.path.isfile(path):  # pruned: kept as rows_<source> while referred to
        path = os.path.join(self.directory, f"{ROWS}{source}")
      if not os.path.isfile(path):
        raise _RefError(f"refers to {CHECKPOINT}{source}, which is missing")
      name = os.path.basename(path)
      with _File(path) as f:
        for leaf, r, member, crc in zip(leaves, rounds, members, crcs):
          if int(r) != source:
            continue
          try:
            info = f.zf.getinfo(f"{member}.npy")
          except KeyError:
            raise _RefError(f"refers to {member} of {name}, which has none") from None
          if info.CRC != int(crc):
            raise _RefError(f"refers to {member} of {name}, which holds another one (its "
                            "CRC-32 differs)")
          try:
            out[str(int(leaf))] = _read_member(f, info)
          except (OSError, ValueError, zipfile.BadZipFile) as e:
            raise _RefError(f"refers to {member} of {name}, which is damaged "
                            f"({str(e).splitlines()[0] if str(e) else type(e).__name__})"
                            ) from None
    return out

  def load_state(self, round_num: int, structure):
    """``program_state_<round_num>``, checked leaf by leaf against ``structure``.

    A checkpoint written by another tff-mf version, model or mechanism has other leaves,
    nesting, shapes or dtypes; this raises a TrainingError naming the first difference,
    and leaves the checkpoint files untouched.
    """
    from tensorflow.python.util import nest  # pylint: disable=g-import-not-at-top
    self.wait()
    rundir.check_private_tree(self.directory)
    where = self._legacy_path(STATE, round_num) or self._file(round_num)
    name = f"checkpoint {os.path.basename(where)} in {self.directory}"
    hint = ("it was written by a different tff-mf version, model or mechanism; resume with "
            "the code and flags that wrote it, or start a new experiment directory")
    paths, loaded = self._read_state(round_num, structure, name, hint)
    expected = nest.flatten_with_joined_string_paths(structure)
    if paths != [path for path, _ in expected]:
      paths, loaded = _joined_stream_rows(paths, loaded, [path for path, _ in expected])
    if paths != [path for path, _ in expected]:
      raise TrainingError(f"{name} does not have this run's state structure ({hint}): its "
                          f"{len(paths)} entries are not this run's {len(expected)}")
    for (path, want), got in zip(expected, loaded):
      want_shape, got_shape = tuple(np.shape(want)), tuple(np.shape(got))
      want_dtype, got_dtype = _leaf_dtype(want), _leaf_dtype(got)
      if _grows(path) and len(want_shape) == len(got_shape) >= 1:
        want_shape, got_shape = want_shape[1:], got_shape[1:]
      if want_shape != got_shape or want_dtype != got_dtype:
        raise TrainingError(f"{name}: state entry {path or '<root>'} is "
                            f"{got_dtype}{list(got_shape)} in the checkpoint but "
                            f"{want_dtype}{list(want_shape)} in this run ({hint})")
    return nest.pack_sequence_as(structure, loaded)

  def load_sampling(self, round_num: int, structure):
    """``sampling_<round_num>``: arrays of ``structure``'s shapes (TrainingError otherwise)."""
    self.wait()
    rundir.check_private_tree(self.directory)
    legacy = self._legacy_path(SAMPLING, round_num)
    name = (f"checkpoint {os.path.basename(legacy or self._file(round_num))} (sampling) in "
            f"{self.directory}")
    try:
      if legacy:
        loaded = _run(self._legacy(SAMPLING).load(round_num, structure))
      else:
        loaded = _read_part(self._file(round_num), SAMPLING)
        missing = set(structure) - set(loaded)
        if missing:
          raise ValueError(f"it has no {sorted(missing)[0]}")
    except (OSError, ValueError, TypeError, zipfile.BadZipFile) as e:
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

  def save(self, state, progress: RunProgress, sampling=None, background: bool = False) -> None:
    """Writes checkpoint_<round> (private), with the program state, sampling state and meta.

    The arrays are copied here; ``background``: the writer thread writes them, after any
    earlier save, and this returns at once (:meth:`wait` for it). A large state leaf whose
    bits equal one the last checkpoint this wrote holds (a stream's state row a round
    passes on) is not copied or written again: the file refers to the member that holds it."""
    from tensorflow.python.util import nest  # pylint: disable=g-import-not-at-top
    flat = nest.flatten_with_joined_string_paths(state)
    self.wait()  # the last write's leaves are known
    arrays = {f"{STATE}/{_PATHS_KEY}": np.array([p for p, _ in flat], dtype=str)}
    refs: List[Tuple[int, _Held]] = []
    fresh: List[str] = []
    for i, (_, leaf) in enumerate(flat):
      large = _large(leaf)
      same = None if large is None else self._same(large, int(progress.round))
      if same is not None:
        refs.append((i, same))
        continue
      arrays[f"{STATE}/{i}"] = _array(leaf)
      if large is not None:
        fresh.append(f"{STATE}/{i}")
    if refs:
      arrays.update(zip((f"{STATE}/{key}" for key in _REF_KEYS), (
          np.array([i for i, _ in refs], np.int64), np.array([h.round for _, h in refs], np.int64),
          np.array([h.member for _, h in refs], dtype=str),
          np.array([h.crc for _, h in refs], np.int64))))
    arrays.update((f"{SAMPLING}/{k}", _array(v)) for k, v in (sampling or {}).items())
    arrays.update((f"{META}/{k}", v) for k, v in _meta_arrays(progress).items())
    job = (int(progress.round), arrays, [h for _, h in refs], fresh)
    if not background:
      self._write(*job)
      return
    if self._writer is None:
      self._writer = concurrent.futures.ThreadPoolExecutor(1, "tff-mf-checkpoint")
    self._pending = self._writer.submit(self._write, *job)

  def _same(self, array: np.ndarray, version: int) -> Optional[_Held]:
    """A held leaf with ``array``'s dtype, shape and bits, in a file of a round before
    ``version`` (never the file a save of ``version`` replaces), if any."""
    for held in self._held.get(_fingerprint(array), ()):
      if held.round < version and np.array_equal(_bits(held.array), _bits(array)):
        return held
    return None

  def _write(self, version: int, arrays: Dict[str, np.ndarray], kept: List[_Held] = (),
             fresh: List[str] = ()) -> None:
    """Writes checkpoint_<version>; then holds its large leaves (``kept``, those it refers to,
    and ``fresh``, its own members) for the next save, and prunes."""
    self._held = {}  # until this file is written: a failed write leaves nothing to refer to
    rundir.check_private_tree(self.directory)
    for part in (META, STATE, SAMPLING):  # an earlier tff-mf's of this round, meta first
      path = os.path.join(self.directory, f"{part}_{version}")
      if os.path.isdir(path):
        shutil.rmtree(path)
    _write_npz(self._file(version), arrays)
    crcs = _member_crcs(self._file(version)) if fresh else {}
    held: Dict[Tuple, List[_Held]] = {}
    for leaf in list(kept) + [_Held(arrays[key], version, key, crcs[key]) for key in fresh]:
      leaf.array.flags.writeable = False
      held.setdefault(_fingerprint(leaf.array), []).append(leaf)
    self._held = held
    self._prune()

  def _referred(self, version: int) -> Optional[List[int]]:
    """The rounds of the files checkpoint ``version`` refers to (none for an earlier
    tff-mf's SavedModel directories; None when its file cannot be read)."""
    if self._legacy_path(STATE, version):
      return []
    key = f"{STATE}/{_REF_KEYS[1]}.npy"
    try:
      with _File(self._file(version)) as f:
        if key not in f.zf.namelist():
          return []
        return [int(r) for r in _read_member(f, f.zf.getinfo(key))]
    except (OSError, ValueError, zipfile.BadZipFile):
      return None

  def _prune(self) -> None:
    """Keeps the latest ``keep`` checkpoints; an older one that a kept one refers to becomes
    ``rows_<round>`` (the members are read from there; references always name the file
    that holds the member), any other older one goes (while a kept one cannot be read, all
    stay), and so does a leftover temporary file."""
    kept = self._versions()[-self.keep:]
    referred = [self._referred(version) for version in kept]
    keep_older = any(rounds is None for rounds in referred)
    referred = {r for rounds in referred for r in rounds or ()}
    for name in os.listdir(self.directory):
      match = _NAME.match(name)
      path = os.path.join(self.directory, name)
      if match and kept and int(match.group(2)) < kept[0] and not keep_older:
        if int(match.group(2)) in referred:
          if match.group(1) == "checkpoint":
            os.replace(path, os.path.join(self.directory, f"{ROWS}{match.group(2)}"))
        elif os.path.isdir(path):
          shutil.rmtree(path)
        else:
          os.unlink(path)
      elif name.startswith(CHECKPOINT) and name.endswith(".tmp"):
        os.unlink(path)

  def wait(self) -> None:
    """Waits for the background save, if any (raising its error)."""
    pending, self._pending = self._pending, None
    if pending is not None:
      pending.result()

  def close(self) -> None:
    """Waits for the background save, stops the writer thread and lets the held leaves go
    (a save after this writes every leaf)."""
    try:
      self.wait()
    finally:
      self._held = {}
      if self._writer is not None:
        self._writer.shutdown(wait=True)
        self._writer = None
