"""On-disk cache of precomputed factorizations (numpy core, no TensorFlow).

An entry is a directory ``<cache_dir>/<label>-<key>/`` where ``key`` is a stable
hash of everything that determines the stored matrices: the cache format, the
version of the strategy family's solver (so that entries an older solver wrote are
a miss, never reused), the workload (a user matrix file by the sha256 of its
contents), the strategy's parameters and the participation schema. It holds

- ``factorization-<sha16>.npz``: float64 ``A``, ``B``, ``C`` (normalized so that
  γ(C) = 1, Denisov et al. 2022, arXiv:2202.08312, App I) and the family's
  parameters (structured pieces, Toeplitz coefficients, BLT buffers, ...); for a
  Toeplitz family on a Toeplitz workload, their first columns ``A_column``,
  ``B_column``, ``C_column`` instead (``toeplitz_factorization``: B·C = A is checked on
  every entry by the Toeplitz identity within its FFT bound, and the family's stream
  against C⁻¹);
- ``metadata.json``: the parameters, √L, sensitivity, rmse and max_error under
  the schema, solver figures, package versions and the sha256 of the ``.npz``.

Writes are atomic: the ``.npz`` is written under a new, content-addressed name,
checked by loading it back, and only then does ``os.replace`` swap in the new
``metadata.json`` (the commit point). A reader that finds the file its sidecar
named already replaced re-reads the sidecar, so a concurrent rewrite is never
seen half done. Every load checks the sha256, that the file named by the sidecar
lies in the entry's own folder, every array (dtype, shape, triangularity,
γ(C) = 1, B·C = A by the full product up to n = ``FULL_CHECK_MAX_N``, beyond by a
product with secret random vectors), that A is the requested workload, that the
family's parameters rebuild its matrices, that the key recomputed from the
sidecar's parameters names the entry's folder and its schema is the one in the
sidecar, and that every figure in the sidecar (top level and ``info``) matches
the arrays under the key's schema. ``verify`` applies the same checks. Any
problem raises ``CacheError`` naming the file, which is then never used.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
import os
import re
import shutil
import sys
import tempfile
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from tff_mf import checks
from tff_mf import factorization as fz
from tff_mf.factorization import families
from tff_mf import jsonio
from tff_mf import participation as participation_lib
from tff_mf import registry
from tff_mf.factorization import strategies
from tff_mf.factorization import toeplitz_factorization
from tff_mf.factorization import toeplitz_ops
from tff_mf.factorization import workloads

CACHE_ENV = "TFF_MF_CACHE"
FORMAT_VERSION = 2
METADATA_FILE = "metadata.json"
# Folders of the cache directory that are not factorization entries.
RESERVED_DIRS = ("datasets",)
# Up to this n, B·C = A is checked by the full product (about 0.6 s at n = 2048 on
# 2 cores); above, by B·(C·R) = A·R for 8 random vectors R drawn from OS entropy.
FULL_CHECK_MAX_N = 4096
_NPZ_NAME = re.compile(r"^factorization-[0-9a-f]{16}\.npz$")
# Sidecar figures recomputed from the arrays on every load.
_FIGURES = ("single_participation_sqrt_loss", "sensitivity", "rmse", "max_error")
_READ_ATTEMPTS = 4
# How a refused entry is replaced: the command-line flag and the Python argument.
RECOMPUTE = ("recompute it with tff-mf factorize, its parameters and --force "
             "(force=True from Python)")
# Sidecar keys renamed since format 2 was introduced: old name -> current name. Entries
# written under the old names are read as if written under the new ones; every figure is
# then recomputed from the arrays as for any entry.
_RENAMED_KEYS = {"sqrt_loss": "single_participation_sqrt_loss",
                 "loss": "single_participation_loss"}


class CacheError(checks.CheckError):
  """A cache file is corrupt, mismatched or unreadable (the message names the file)."""


class _Replaced(Exception):
  """The file a sidecar named vanished: a concurrent writer replaced the entry."""


@dataclasses.dataclass
class CacheEntry:
  """Where a factorization lives on disk and what its sidecar says."""
  npz_path: str
  json_path: str
  metadata: Dict[str, Any]
  cache_hit: bool

  @property
  def directory(self) -> str:
    return os.path.dirname(self.json_path)


def default_cache_dir() -> str:
  """``$TFF_MF_CACHE`` if set, else ``~/.cache/tff_mf``."""
  env = os.environ.get(CACHE_ENV)
  if env:
    return os.path.abspath(os.path.expanduser(env))
  return os.path.join(os.path.expanduser("~"), ".cache", "tff_mf")


def resolve_dir(cache_dir: Optional[str]) -> str:
  return os.path.abspath(os.path.expanduser(cache_dir)) if cache_dir else default_cache_dir()


def file_sha256(path: str) -> str:
  with open(path, "rb") as f:
    return _stream_sha256(f)


def _stream_sha256(f) -> str:
  digest = hashlib.sha256()
  for chunk in iter(lambda: f.read(1 << 22), b""):
    digest.update(chunk)
  return digest.hexdigest()


# ----------------------------------------------------------------------------- keys


def solver_version(strategy: str) -> str:
  """``<family>-<VERSION>`` of the family module that computes ``strategy``."""
  family = registry.strategy(strategy).family
  return f"{family}-{strategies.family_module(strategy).VERSION}"


def workload_key_params(workload: workloads.WorkloadSpec) -> Dict[str, Any]:
  """The parameters that determine A (a matrix file by its content's sha256)."""
  if workload.kind == "prefix_sum":
    return {"kind": "prefix_sum", "n": int(workload.n)}
  if workload.kind == "momentum":
    out = {"kind": "momentum", "n": int(workload.n), "momentum": float(workload.momentum),
           "lr_schedule": workload.lr_schedule}
    if workload.lr_schedule != "constant":
      out["schedule_rounds"] = int(workload.schedule_rounds) if workload.schedule_rounds else None
    return out
  if workload.kind == "file":
    if not workload.matrix_file or not os.path.isfile(workload.matrix_file):
      raise workloads.WorkloadError(f"matrix file {workload.matrix_file!r} does not exist")
    return {"kind": "file", "n": int(workload.n),
            "matrix_sha256": file_sha256(workload.matrix_file)}
  raise workloads.WorkloadError(
      f"unknown workload {workload.kind!r}; expected prefix_sum, momentum or file")


def key_params(spec: strategies.FactorizationSpec) -> Dict[str, Any]:
  """Everything of ``spec`` that determines the stored matrices (the cache key)."""
  params = {"format": FORMAT_VERSION, "solver": solver_version(spec.strategy),
            "workload": workload_key_params(spec.workload)}
  params.update(spec.key_params())
  params.update(spec.participation.analysis_versions())
  return params


def key_hash(params: Dict[str, Any]) -> str:
  canonical = json.dumps(params, sort_keys=True, separators=(",", ":"))
  return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def entry_name(params: Dict[str, Any]) -> str:
  """Human-readable directory name, e.g. ``structured-h6r5-prefix_sum-n2048-<key>``."""
  w = params["workload"]
  label = w["kind"]
  if w["kind"] == "momentum":
    label += f"{w['momentum']:g}"
    if w.get("lr_schedule", "constant") != "constant":
      label += f"-{w['lr_schedule']}{w.get('schedule_rounds')}"
  strategy = params["strategy"]
  declared = registry.strategy(strategy).declaration if strategy in registry.STRATEGIES \
      else families.Declaration()
  shown = "".join(f"{declared.label(field)}{params[field]}"
                  for field in ("bands", "rank", "buffers") if field in params)
  if shown:
    strategy += f"-{shown}"
  schema = params.get("participation", {}).get("label", "")
  return "-".join(x for x in (strategy, label, f"n{w['n']}", schema, key_hash(params)) if x)


def entry_paths(spec: strategies.FactorizationSpec,
                cache_dir: Optional[str] = None) -> Tuple[str, Dict[str, Any]]:
  """(entry directory, key params) for ``spec``."""
  params = key_params(spec)
  return os.path.join(resolve_dir(cache_dir), entry_name(params)), params


# ----------------------------------------------------------------------------- reading


def _read_metadata(json_path: str) -> Dict[str, Any]:
  try:
    with open(json_path, "r", encoding="utf-8") as f:
      metadata = json.load(f)
  except FileNotFoundError:
    raise
  except (OSError, ValueError) as e:
    raise CacheError(f"cache sidecar {json_path} is unreadable or not valid JSON: {e}") from e
  if not isinstance(metadata, dict) or "npz_file" not in metadata or "npz_sha256" not in metadata:
    raise CacheError(f"cache sidecar {json_path} lacks npz_file/npz_sha256")
  if metadata.get("format") != FORMAT_VERSION:
    raise CacheError(f"cache sidecar {json_path} has format {metadata.get('format')!r}, "
                     f"expected {FORMAT_VERSION}")
  for old, new in _RENAMED_KEYS.items():
    if old in metadata and new not in metadata:
      metadata[new] = metadata.pop(old)
  name = metadata["npz_file"]
  if not isinstance(name, str) or not _NPZ_NAME.match(name):
    raise CacheError(f"cache sidecar {json_path} names {name!r}, not a file of its own entry "
                     "folder (factorization-<sha16>.npz)")
  return metadata


def _load_arrays(npz_path: str, expected_sha256: str) -> Dict[str, np.ndarray]:
  """The arrays of ``npz_path``, hashed and read through one open file: a writer that
  replaces the entry meanwhile removes only the name, so the bytes hashed are the bytes read."""
  try:
    f = open(npz_path, "rb")  # pylint: disable=consider-using-with
  except FileNotFoundError:
    raise _Replaced() from None
  with f:
    actual = _stream_sha256(f)
    if actual != expected_sha256:
      raise CacheError(f"cache file {npz_path} is corrupt: sha256 {actual[:16]}… does not "
                       f"match its sidecar ({str(expected_sha256)[:16]}…)")
    f.seek(0)
    try:
      with np.load(f, allow_pickle=False) as data:
        arrays = {k: data[k] for k in data.files}
    except Exception as e:  # zipfile.BadZipFile, ValueError, EOFError, OSError, ...
      raise CacheError(f"cache file {npz_path} cannot be read as .npz: "
                       f"{type(e).__name__}: {e}") from e
  # Dense A, B, C, or (Toeplitz families on Toeplitz workloads) their first columns.
  needed = toeplitz_factorization.COLUMNS if toeplitz_factorization.COLUMNS[2] in arrays \
      else ("A", "B", "C")
  for key in needed:
    if key not in arrays:
      raise CacheError(f"cache file {npz_path} lacks array {key!r} (has {sorted(arrays)})")
  for key, x in arrays.items():
    if x.dtype != np.float64:
      raise CacheError(f"cache file {npz_path}: {key} has dtype {x.dtype}, expected float64")
  return arrays


def _check_product(a, b, c, full: bool, name: str) -> None:
  """B·C = A: the full product, or B·(C·R) = A·R with R drawn from OS entropy."""
  if full:
    checks.product(a, b, c, name)
    return
  probe = np.random.default_rng(np.random.SeedSequence()).standard_normal((a.shape[1], 8))
  err = float(np.max(np.abs(b @ (c @ probe) - a @ probe)) / np.sqrt(a.shape[1]))
  scale = max(1.0, float(np.max(np.abs(a))))
  if not err <= 1e-8 * scale:
    raise CacheError(f"{name}: B·C differs from A (random product error {err:.3g})")


def _factorization(arrays: Dict[str, np.ndarray], metadata: Dict[str, Any], npz_path: str,
                   full_check: Optional[bool]) -> fz.Factorization:
  """Checks the arrays and returns them as a Factorization (any problem names the file)."""
  name = f"cache file {npz_path}"
  if toeplitz_factorization.COLUMNS[2] in arrays:
    return _toeplitz_factorization(arrays, metadata, name)
  a, b, c = arrays["A"], arrays["B"], arrays["C"]
  n = a.shape[0] if a.ndim == 2 else -1
  if metadata.get("n") != n:
    raise CacheError(f"{name}: A is {a.shape}, but its sidecar says n = {metadata.get('n')}")
  strategy = _stored_strategy(metadata, name)
  try:
    checks.factors(a, b, c, name=name, check_product=False)
    _check_product(a, b, c, full_check if full_check is not None else n <= FULL_CHECK_MAX_N,
                   name)
  except checks.CheckError as e:
    raise CacheError(str(e)) from None
  extras = {k: v for k, v in arrays.items() if k not in ("A", "B", "C")}
  return fz.Factorization(a=a, b=b, c=c, strategy=strategy, info=dict(metadata.get("info", {})),
                          extras=extras)


def _stored_strategy(metadata: Dict[str, Any], name: str) -> str:
  strategy = metadata.get("params", {}).get("strategy")
  if strategy not in registry.STRATEGIES:
    raise CacheError(f"{name}: its sidecar names no known strategy ({strategy!r})")
  return strategy


def _toeplitz_factorization(arrays: Dict[str, np.ndarray], metadata: Dict[str, Any],
                            name: str) -> toeplitz_factorization.ToeplitzFactorization:
  """The first columns of a Toeplitz entry, checked: shapes, γ(C) = 1 and B·C = A on every
  entry (the exact Toeplitz identity, within the FFT bound of
  ``toeplitz_factorization.check_product``), whatever ``full_check`` says."""
  columns = {k: arrays[k] for k in toeplitz_factorization.COLUMNS}
  strategy = _stored_strategy(metadata, name)
  try:
    n = toeplitz_factorization.check_columns(columns, name)
    if metadata.get("n") != n:
      raise CacheError(f"{name}: its columns have {n} rounds, but its sidecar says n = "
                       f"{metadata.get('n')}")
    extras = {k: v for k, v in arrays.items() if k not in columns}
    f = toeplitz_factorization.ToeplitzFactorization(
        *(columns[k] for k in toeplitz_factorization.COLUMNS), strategy,
        info=dict(metadata.get("info", {})), extras=extras)
    return f.validate(name=name)
  except checks.CheckError as e:
    raise CacheError(str(e)) from None


def _same_workload(f: fz.Factorization, expected: np.ndarray) -> bool:
  """A of ``f`` is ``expected`` (a dense A, or the first column of a Toeplitz A)."""
  if isinstance(f, toeplitz_factorization.ToeplitzFactorization) and expected.ndim == 1:
    actual = f.columns[toeplitz_factorization.COLUMNS[0]]
  elif expected.ndim == 1:
    actual, expected = f.a, toeplitz_ops.lower_toeplitz(expected)
  else:
    actual = f.a
  return expected.shape == actual.shape and bool(np.allclose(actual, expected, rtol=1e-12,
                                                             atol=1e-12))


def key_schema(params: Any) -> participation_lib.Participation:
  """The participation schema an entry's key names (no ``participation``: single)."""
  if not isinstance(params, dict):
    raise checks.CheckError(f"key parameters must be a dict, got {params!r}")
  schema = params.get("participation")
  return participation_lib.SINGLE if schema is None else participation_lib.from_dict(schema)


def _check_key(directory: str, metadata: Dict[str, Any], json_path: str
               ) -> participation_lib.Participation:
  """The key recomputed from the sidecar's parameters names this folder; returns its schema.

  A sidecar whose parameters, key or folder disagree (an edited schema, folders
  swapped between keys) is refused: what an entry was computed for is its key.
  """
  params = metadata.get("params")
  try:
    schema = key_schema(params)
    expected = entry_name(params)
  except (checks.CheckError, KeyError, TypeError, ValueError) as e:
    raise CacheError(f"cache sidecar {json_path} has invalid key parameters: {e}") from None
  if metadata.get("key") != key_hash(params) or os.path.basename(directory) != expected:
    raise CacheError(f"cache entry {directory}: the key recomputed from its sidecar's "
                     f"parameters names {expected} (sidecar key {metadata.get('key')!r}); the "
                     "entry was moved or its sidecar edited")
  # An entry written before the fixed-bin rename stores its random_allocation schema as
  # balls_in_bins without the fixed-bin marker (``Participation.legacy_dicts``).
  accepted = [schema.as_dict()] + schema.legacy_dicts()
  for where, stored in (("participation", metadata.get("participation")),
                        ("info.participation", (metadata.get("info") or {}).get(
                            "participation"))):
    if stored not in accepted:
      raise CacheError(f"cache sidecar {json_path}: {where} is {stored!r} but its key names "
                       f"{schema.as_dict()!r}")
  return schema


def _check_consistency(f: fz.Factorization, metadata: Dict[str, Any], npz_path: str,
                       expected_workload: Optional[np.ndarray],
                       schema: participation_lib.Participation) -> None:
  """A is the requested workload, the family's parameters rebuild it, every figure matches.

  The figures are recomputed from C under the schema of the entry's key, and checked
  both at the sidecar's top level and in its ``info``.
  """
  name = f"cache file {npz_path}"
  if expected_workload is not None and not _same_workload(f, expected_workload):
    raise CacheError(f"{name}: its A is not the requested workload")
  module = strategies.family_module(f.strategy)
  check_extras = getattr(module, "check_extras", None)
  try:
    if check_extras is not None:
      check_extras(f)
    if isinstance(f, toeplitz_factorization.ToeplitzFactorization):
      # The noise the family streams is C⁻¹ (first columns, its stream's own tables).
      toeplitz_factorization.check_noise(f, *module.noise_column(f),
                                         strategies.stream(f.strategy, f.extras, f.n))
    elif check_extras is None and registry.strategy(f.strategy).streams:
      strategies.stream(f.strategy, f.extras, f.a)
    figures = dict(strategies.error_figures(f, schema),
                   single_participation_sqrt_loss=f.single_participation_sqrt_loss)
  except (checks.CheckError, KeyError, TypeError) as e:
    raise CacheError(f"{name}: its stored parameters do not describe its matrices: {e}") from None
  info = metadata.get("info") or {}
  for where, key in [("", k) for k in _FIGURES] + [("info.", k) for k in _FIGURES if k in info]:
    stored = (info if where else metadata).get(key)
    if not isinstance(stored, (int, float)) or not np.isclose(figures[key], stored, rtol=1e-9):
      raise CacheError(f"{name}: {key} = {figures[key]:.10g} from the arrays, but its sidecar "
                       f"says {where}{key} = {stored!r}")


def _load_entry(directory: str, full_check: Optional[bool],
                expected_workload: Optional[np.ndarray],
                params: Optional[Dict[str, Any]] = None) -> Tuple[fz.Factorization, CacheEntry]:
  """The checked entry in ``directory``; a bad one raises CacheError saying how to
  recompute it (``RECOMPUTE``)."""
  try:
    return _load_entry_once(directory, full_check, expected_workload, params)
  except _Changing:
    raise CacheError(f"cache entry {directory} kept changing while it was read; "
                     "try again") from None
  except CacheError as e:
    raise CacheError(f"{e}; {RECOMPUTE}") from None


class _Changing(Exception):
  """Writers kept replacing the entry while it was read (not a bad entry)."""


def _load_entry_once(directory: str, full_check: Optional[bool],
                     expected_workload: Optional[np.ndarray],
                     params: Optional[Dict[str, Any]]) -> Tuple[fz.Factorization, CacheEntry]:
  json_path = os.path.join(directory, METADATA_FILE)
  for _ in range(_READ_ATTEMPTS):
    try:
      metadata = _read_metadata(json_path)
    except FileNotFoundError as e:
      raise CacheError(f"cache entry {directory} has no sidecar {json_path}") from e
    if params is not None and metadata.get("params") != params:
      raise CacheError(f"cache sidecar {json_path} was written for other parameters "
                       f"({metadata.get('params')})")
    npz_path = os.path.join(directory, metadata["npz_file"])
    try:
      arrays = _load_arrays(npz_path, metadata["npz_sha256"])
    except _Replaced:
      continue  # a writer replaced the entry between our two reads: read the new sidecar
    schema = _check_key(directory, metadata, json_path)
    f = _factorization(arrays, metadata, npz_path, full_check)
    if expected_workload is None:
      expected_workload = _workload_from_params(
          metadata.get("params"), json_path,
          column=isinstance(f, toeplitz_factorization.ToeplitzFactorization))
    _check_consistency(f, metadata, npz_path, expected_workload, schema)
    return f, CacheEntry(npz_path=npz_path, json_path=json_path, metadata=metadata,
                         cache_hit=True)
  raise _Changing()


def load(npz_path: str, full_check: Optional[bool] = None,
         expected_workload: Optional[np.ndarray] = None) -> fz.Factorization:
  """Loads and checks the cached factorization in ``npz_path``'s entry; raises CacheError.

  The sidecar beside the file must name it. A is checked against the workload its
  key names (pass ``expected_workload`` for a user matrix file).
  """
  npz_path = os.path.abspath(npz_path)
  directory = os.path.dirname(npz_path)
  if not os.path.isfile(npz_path):
    raise CacheError(f"cache file {npz_path} does not exist")
  f, entry = _load_entry(directory, full_check, expected_workload)
  if os.path.basename(npz_path) != os.path.basename(entry.npz_path):
    raise CacheError(f"cache file {npz_path} is not the file its sidecar {entry.json_path} "
                     f"names ({os.path.basename(entry.npz_path)})")
  return f


def _workload_from_params(params: Any, json_path: str,
                          column: bool = False) -> Optional[np.ndarray]:
  """A rebuilt from an entry's key parameters (None for a user matrix file); with
  ``column``, the first column of a Toeplitz A instead (``WorkloadSpec.toeplitz_column``)."""
  try:
    w = params["workload"]
    if column and w["kind"] in ("prefix_sum", "momentum"):
      found = workloads.WorkloadSpec(
          kind=w["kind"], n=int(w["n"]), momentum=float(w.get("momentum", 0.0)),
          lr_schedule=w.get("lr_schedule", "constant"),
          schedule_rounds=w.get("schedule_rounds")).toeplitz_column()
      if found is not None:
        return found
    if w["kind"] == "prefix_sum":
      return workloads.prefix_sum(int(w["n"]))
    if w["kind"] == "momentum":
      n = int(w["n"])
      etas = workloads.learning_rates(n, w.get("lr_schedule", "constant"),
                                      w.get("schedule_rounds"))
      return workloads.momentum_matrix(n, float(w["momentum"]), etas)
    if w["kind"] == "file":
      return None
  except (checks.CheckError, KeyError, TypeError, ValueError) as e:
    raise CacheError(f"cache sidecar {json_path} has invalid parameters: {e}") from None
  raise CacheError(f"cache sidecar {json_path} names an unknown workload {w.get('kind')!r}")


# ----------------------------------------------------------------------------- writing


def _package_versions() -> Dict[str, str]:
  from importlib import metadata as importlib_metadata  # pylint: disable=g-import-not-at-top
  import tff_mf  # pylint: disable=g-import-not-at-top
  versions = {"python": sys.version.split()[0], "tff_mf": tff_mf.__version__}
  for package in ("numpy", "scipy"):
    try:
      versions[package] = importlib_metadata.version(package)
    except importlib_metadata.PackageNotFoundError:
      versions[package] = "unknown"
  return versions


def _metadata(params: Dict[str, Any], spec: strategies.FactorizationSpec, f: fz.Factorization,
              sha: str, npz_name: str, npz_bytes: int) -> Dict[str, Any]:
  info = jsonio.jsonable(f.info)
  w = spec.workload
  return {
      "format": FORMAT_VERSION, "key": key_hash(params), "params": params,
      "spec": {"workload": w.kind, "n": w.n, "momentum": w.momentum,
               "lr_schedule": w.lr_schedule, "schedule_rounds": w.schedule_rounds,
               "matrix_file": os.path.abspath(w.matrix_file) if w.matrix_file else None,
               **{k: jsonio.jsonable(v) for k, v in spec.key_params().items()}},
      "strategy": f.strategy, "n": f.n, "m": f.m,
      "single_participation_loss": f.single_participation_loss,
      "single_participation_sqrt_loss": f.single_participation_sqrt_loss,
      "sensitivity": info["sensitivity"], "rmse": info["rmse"], "max_error": info["max_error"],
      "participation": info["participation"],
      "gamma_before_normalization": info.get("gamma_before_normalization"),
      "relative_gap": info.get("relative_gap", info.get("optimal_relative_gap")),
      "iterations": info.get("iterations", info.get("als_iterations")),
      "seconds": info.get("seconds"), "info": info,
      "created_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
      "package_versions": _package_versions(),
      "npz_file": npz_name, "npz_sha256": sha, "npz_bytes": npz_bytes,
  }


def _write_atomically(directory: str, suffix: str, write) -> str:
  fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=suffix, dir=directory)
  try:
    with os.fdopen(fd, "wb") as out:
      write(out)
      out.flush()
      os.fsync(out.fileno())
    os.chmod(tmp, 0o644)
  except BaseException:
    _remove_quietly(tmp)
    raise
  return tmp


def _write_entry(directory: str, params: Dict[str, Any], spec: strategies.FactorizationSpec,
                 f: fz.Factorization) -> CacheEntry:
  os.makedirs(directory, exist_ok=True)
  json_path = os.path.join(directory, METADATA_FILE)
  if isinstance(f, toeplitz_factorization.ToeplitzFactorization):
    arrays = {**f.columns, **f.extras}  # first columns: O(n) bytes
  else:
    arrays = {"A": f.a, "B": f.b, "C": f.c, **f.extras}
  tmp_npz = _write_atomically(directory, ".npz", lambda out: np.savez(
      out, **{k: np.ascontiguousarray(v, dtype=np.float64) for k, v in arrays.items()}))
  tmp_json = None
  try:
    sha = file_sha256(tmp_npz)
    npz_name = f"factorization-{sha[:16]}.npz"
    metadata = _metadata(params, spec, f, sha, npz_name, os.path.getsize(tmp_npz))
    # Check the written bytes before they can replace anything.
    _factorization(_load_arrays(tmp_npz, sha), metadata, tmp_npz, full_check=False)
    npz_path = os.path.join(directory, npz_name)
    os.replace(tmp_npz, npz_path)
    tmp_npz = None
    try:
      old_npz = _read_metadata(json_path)["npz_file"]
    except (FileNotFoundError, CacheError):
      old_npz = None
    text = jsonio.dumps(metadata, indent=2) + "\n"
    tmp_json = _write_atomically(directory, ".json", lambda out: out.write(text.encode()))
    os.replace(tmp_json, json_path)  # the commit point
    tmp_json = None
    if old_npz and old_npz != npz_name:
      _remove_quietly(os.path.join(directory, old_npz))
    return CacheEntry(npz_path=npz_path, json_path=json_path, metadata=metadata, cache_hit=False)
  finally:
    for leftover in (tmp_npz, tmp_json):
      if leftover:
        _remove_quietly(leftover)


def _check_disk(directory: str, spec: strategies.FactorizationSpec, memory: float,
                progress: bool) -> None:
  """Refuses a computation whose result could not be stored; announces a large one."""
  # A, B and C: n² + 2·n·(n·encoder_rows) float64 entries (three first columns when Toeplitz).
  stored = 8.0 * spec.n * (3 if strategies.toeplitz_workload(spec) is not None else spec.n * (
      2 + registry.strategy(spec.strategy).declaration.encoder_rows))
  parent = directory
  while not os.path.isdir(parent) and os.path.dirname(parent) != parent:
    parent = os.path.dirname(parent)
  free = shutil.disk_usage(parent).free
  if stored > 0.9 * free:
    raise CacheError(f"the {spec.strategy} factorization at n = {spec.n} takes about "
                     f"{stored / 2**30:.1f} GiB in the cache, but {parent} has "
                     f"{free / 2**30:.1f} GiB free")
  if progress and memory > 2**30:
    print(f"tff-mf: {spec.strategy} at n = {spec.n} uses about {memory / 2**30:.1f} GiB of "
          f"memory and {stored / 2**30:.1f} GiB in the cache", file=sys.stderr, flush=True)


def _remove_quietly(path: str) -> None:
  try:
    os.remove(path)
  except OSError:
    pass


def load_or_factorize(spec: strategies.FactorizationSpec, cache_dir: Optional[str] = None,
                      force: bool = False, progress: bool = False, strict: bool = False,
                      ) -> Tuple[fz.Factorization, CacheEntry]:
  """The factorization for ``spec``: from the cache if present, else computed and stored.

  A present but corrupt or mismatched entry raises CacheError naming the file (it is
  never used); ``force=True`` recomputes and replaces it. A computation that fails
  (e.g. the solver does not converge) leaves the cache untouched. The info holds the
  solver's outcome (``strategies.solver_outcome``); ``strict=True`` raises
  ``strategies.SolverOutcomeError`` when it differs from the request or did not converge
  (the entry stays in the cache: a rerun without ``strict`` is a hit).
  """
  f, entry = _load_or_factorize(spec, cache_dir, force, progress)
  outcome = f.info[strategies.OUTCOME]
  if strict and strategies.deviates(outcome):
    raise strategies.SolverOutcomeError(
        f"{spec.strategy}: {outcome['why']} (refused by strict; the result stays cached in "
        f"{entry.directory})")
  return f, entry


def _with_outcome(spec: strategies.FactorizationSpec, f: fz.Factorization,
                  entry: CacheEntry) -> bool:
  """Adds the solver outcome to an entry cached before it was recorded (in memory).

  False when its info cannot say what the outcome needs (e.g. why BLT buffers were
  switched off, with both rmses): such an entry is recomputed.
  """
  if strategies.OUTCOME in f.info:
    return True
  outcome = strategies.solver_outcome(spec, f.info)
  if outcome is None:
    return False
  f.info[strategies.OUTCOME] = outcome
  entry.metadata.setdefault("info", {})[strategies.OUTCOME] = outcome
  return True


def _existing_entry(directory: str, params: Dict[str, Any], cache_dir: Optional[str]
                    ) -> Tuple[str, Dict[str, Any]]:
  """(directory, params) of the entry to read: the key's own, or, where it has none, the
  entry an earlier version wrote for the same schema under its old dict
  (``Participation.cache_key_aliases``: a random_allocation C cached as balls_in_bins
  before the fixed-bin rename, a min_sep C cached from Python without its ⌈n/b⌉)."""
  if os.path.exists(os.path.join(directory, METADATA_FILE)) or "participation" not in params:
    return directory, params
  schema = participation_lib.from_dict(params["participation"])
  for legacy in schema.cache_key_aliases(int(params["workload"]["n"])):
    old = dict(params, participation=legacy)
    old_dir = os.path.join(resolve_dir(cache_dir), entry_name(old))
    if os.path.exists(os.path.join(old_dir, METADATA_FILE)):
      return old_dir, old
  return directory, params


def _load_or_factorize(spec: strategies.FactorizationSpec, cache_dir: Optional[str],
                       force: bool, progress: bool) -> Tuple[fz.Factorization, CacheEntry]:
  spec.validate()
  # The schema in its form at n (``Participation.for_rounds``): the key, the computation
  # and the stored record are the same from Python and from the CLI.
  spec = dataclasses.replace(spec, participation=spec.participation.for_rounds(spec.n))
  memory = strategies.check_size(spec)
  directory, params = entry_paths(spec, cache_dir)
  expected = strategies.toeplitz_workload(spec)  # a Toeplitz A's first column, or dense A
  expected = spec.workload.build() if expected is None else expected
  read_dir, read_params = _existing_entry(directory, params, cache_dir)
  if not force and os.path.exists(os.path.join(read_dir, METADATA_FILE)):
    f, entry = _load_entry(read_dir, None, expected, read_params)
    if _with_outcome(spec, f, entry):
      return f, entry
    print(f"tff-mf: cache entry {directory} predates the solver outcome record; recomputing "
          f"it", file=sys.stderr, flush=True)
  _check_disk(directory, spec, memory, progress)

  def optimal():
    optimal_spec = strategies.FactorizationSpec(workload=spec.workload,
                                                strategy=registry.OPTIMAL.name,
                                                target_gap=spec.target_gap,
                                                max_iterations=spec.max_iterations,
                                                allow_unconverged=spec.allow_unconverged)
    return load_or_factorize(optimal_spec, cache_dir=cache_dir, force=force,
                             progress=progress)[0]

  context = families.Context(optimal=optimal, progress=progress)
  f = strategies.factorize(spec, progress=progress, context=context)
  if not _same_workload(f, expected):
    raise CacheError("computed factorization does not match the requested workload")
  return f, _write_entry(directory, params, spec, f)


# ----------------------------------------------------------------------------- listing, verifying


def _being_written(directory: str) -> bool:
  """A first write in progress: no sidecar yet, only a writer's temporary files."""
  names = os.listdir(directory)
  return METADATA_FILE not in names and bool(names) and all(n.startswith(".tmp-") for n in names)


def _entry_dirs(cache_dir: Optional[str], must_exist: bool) -> List[str]:
  root = resolve_dir(cache_dir)
  if not os.path.isdir(root):
    if must_exist:
      raise CacheError(f"cache directory {root} does not exist")
    return []
  dirs = (os.path.join(root, d) for d in sorted(os.listdir(root))
          if not d.startswith(".") and d not in RESERVED_DIRS)
  return [d for d in dirs if os.path.isdir(d) and not _being_written(d)]


def list_entries(cache_dir: Optional[str] = None) -> List[Dict[str, Any]]:
  """One dict per entry directory, its figures verified (``error`` set when it fails).

  Every entry is checked as a load checks it (sha256, the key, B·C = A on secret random
  vectors, every figure recomputed from C under the key's schema: ``verify(full_check=False)``),
  so the figures listed are the arrays' own, never an edited sidecar's; ``verified`` is True
  on each listed row. An entry that fails is listed with ``error`` and no figures.
  """
  rows = []
  for directory in _entry_dirs(cache_dir, must_exist=cache_dir is not None):
    json_path = os.path.join(directory, METADATA_FILE)
    row: Dict[str, Any] = {"directory": directory, "json_path": json_path, "verified": False}
    try:
      _, entry = _load_entry(directory, False, None)
    except CacheError as e:
      rows.append(dict(row, error=str(e)))
      continue
    metadata, npz_path = entry.metadata, entry.npz_path
    spec = metadata.get("spec", {})
    row.update({
        "npz_path": npz_path, "verified": True, "strategy": metadata.get("strategy"),
        "workload": spec.get("workload"), "momentum": spec.get("momentum"),
        "lr_schedule": spec.get("lr_schedule"), "n": metadata.get("n"),
        "bands": spec.get("bands"), "rank": spec.get("rank"), "buffers": spec.get("buffers"),
        "participation": key_schema(metadata.get("params")).label,
        "single_participation_sqrt_loss": metadata.get("single_participation_sqrt_loss"),
        "rmse": metadata.get("rmse"),
        # Not the solver's duality gap: recomputing it needs the dual point, so an edited
        # one would pass every check above.
        "sensitivity": metadata.get("sensitivity"), "seconds": metadata.get("seconds"), "created_utc": metadata.get("created_utc"),
        "bytes": os.path.getsize(npz_path) if os.path.isfile(npz_path) else None,
    })
    rows.append(row)
  return rows


def verify(cache_dir: Optional[str] = None, full_check: bool = True) -> List[Dict[str, Any]]:
  """Checks every entry completely; returns [{directory, path, ok, error}].

  ``full_check=False`` checks B·C = A by a product with secret random vectors
  instead of the full product. A missing cache directory is an error.
  """
  results = []
  for directory in _entry_dirs(cache_dir, must_exist=True):
    path = os.path.join(directory, METADATA_FILE)
    try:
      _, entry = _load_entry(directory, full_check, None)
      results.append({"directory": directory, "path": entry.npz_path, "ok": True,
                      "error": None})
    except CacheError as e:
      results.append({"directory": directory, "path": path, "ok": False, "error": str(e)})
  return results
