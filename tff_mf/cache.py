"""On-disk cache of precomputed factorizations (numpy core, no TensorFlow).

An entry is a directory ``<cache_dir>/<strategy>-<workload>-n<N>-<key>/`` where
``key`` is a stable hash of the parameters that determine the factorization
(``key_params``; a user matrix file contributes the sha256 of its contents,
not its path). It holds

- ``factorization-<sha16>.npz``: float64 ``A``, ``B``, ``C`` (normalized so
  that γ(C) = 1, Denisov et al. App I), and for the structured strategy the
  Algorithm 3 pieces ``structured_diagonals``, ``structured_u``,
  ``structured_v`` (Denisov App H);
- ``metadata.json``: every parameter, n, loss, sqrt_loss,
  sensitivity_before_normalization, relative_gap, iterations, seconds, package
  versions and the sha256 of the ``.npz``.

Writes are atomic: the ``.npz`` is written under a new, content-addressed name,
checked by loading it back, and only then does ``os.replace`` swap in the new
``metadata.json`` (the commit point). A crash leaves either the old or the new
entry, never a mix, and a failed computation never touches a good entry.
Loading checks the sha256, keys, dtype, shapes, triangularity, γ(C) = 1, B·C ≈ A
and that A is the requested workload; any problem raises ``CacheError`` naming
the file, and the file is never used.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
import os
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from tff_mf import factorization as fz
from tff_mf import strategies
from tff_mf import workloads

CACHE_ENV = "TFF_MF_CACHE"
FORMAT_VERSION = 1
METADATA_FILE = "metadata.json"
_STRUCTURED_ARRAYS = ("structured_diagonals", "structured_u", "structured_v")


class CacheError(ValueError):
  """A cache file is corrupt, mismatched or unreadable (the message names the file)."""


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


def _resolve_dir(cache_dir: Optional[str]) -> str:
  return os.path.abspath(os.path.expanduser(cache_dir)) if cache_dir else default_cache_dir()


def file_sha256(path: str) -> str:
  digest = hashlib.sha256()
  with open(path, "rb") as f:
    for chunk in iter(lambda: f.read(1 << 22), b""):
      digest.update(chunk)
  return digest.hexdigest()


# ---------------------------------------------------------------------------
# Keys


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
    if not workload.matrix_file:
      raise workloads.WorkloadError("workload 'file' needs matrix_file")
    if not os.path.isfile(workload.matrix_file):
      raise workloads.WorkloadError(f"matrix file {workload.matrix_file!r} does not exist")
    return {"kind": "file", "n": int(workload.n),
            "matrix_sha256": file_sha256(workload.matrix_file)}
  raise workloads.WorkloadError(
      f"unknown workload {workload.kind!r}; expected prefix_sum, momentum or file")


def key_params(spec: strategies.FactorizationSpec) -> Dict[str, Any]:
  """The parameters of ``spec`` that determine the stored matrices (the cache key)."""
  params: Dict[str, Any] = {"format": FORMAT_VERSION, "strategy": spec.strategy,
                            "workload": workload_key_params(spec.workload)}
  if spec.strategy in ("optimal", "structured"):
    params["target_gap"] = float(spec.target_gap)
    if spec.allow_unconverged:  # then the result depends on the iteration limit
      params["allow_unconverged"] = True
      params["max_iterations"] = int(spec.max_iterations)
  if spec.strategy == "structured":
    params["bands"] = int(spec.bands)
    params["rank"] = int(spec.rank)
  return params


def key_hash(params: Dict[str, Any]) -> str:
  canonical = json.dumps(params, sort_keys=True, separators=(",", ":"))
  return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def entry_name(params: Dict[str, Any]) -> str:
  """Human-readable directory name: ``<strategy>-<workload>-n<N>-<key>``."""
  w = params["workload"]
  label = w["kind"]
  if w["kind"] == "momentum":
    label += f"{w['momentum']:g}"
    if w.get("lr_schedule", "constant") != "constant":
      label += f"-{w['lr_schedule']}{w.get('schedule_rounds')}"
  strategy = params["strategy"]
  if strategy == "structured":
    strategy += f"-h{params['bands']}r{params['rank']}"
  return f"{strategy}-{label}-n{w['n']}-{key_hash(params)}"


def entry_paths(spec: strategies.FactorizationSpec,
                cache_dir: Optional[str] = None) -> Tuple[str, Dict[str, Any]]:
  """(entry directory, key params) for ``spec``."""
  params = key_params(spec)
  return os.path.join(_resolve_dir(cache_dir), entry_name(params)), params


# ---------------------------------------------------------------------------
# Loading and checking


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
                     f"expected {FORMAT_VERSION}; recompute with --force")
  return metadata


def _load_arrays(npz_path: str, expected_sha256: Optional[str]) -> Dict[str, np.ndarray]:
  if not os.path.isfile(npz_path):
    raise CacheError(f"cache file {npz_path} is missing")
  if expected_sha256 is not None:
    actual = file_sha256(npz_path)
    if actual != expected_sha256:
      raise CacheError(f"cache file {npz_path} is corrupt: sha256 {actual[:16]}… does not match "
                       f"its sidecar ({expected_sha256[:16]}…)")
  try:
    with np.load(npz_path, allow_pickle=False) as data:
      arrays = {k: data[k] for k in data.files}
  except Exception as e:  # zipfile.BadZipFile, ValueError, EOFError, OSError, ...
    raise CacheError(f"cache file {npz_path} cannot be read as .npz: {type(e).__name__}: {e}") from e
  for key in ("A", "B", "C"):
    if key not in arrays:
      raise CacheError(f"cache file {npz_path} lacks array {key!r} (has {sorted(arrays)})")
  return arrays


def _check_product(a, b, c, full_check: bool, name: str) -> None:
  """B·C ≈ A: exactly (O(n³)) or by a randomized Freivalds check (O(n²))."""
  if full_check:
    err = float(np.max(np.abs(b @ c - a)))
  else:
    probe = np.random.default_rng(0x7FF).standard_normal((a.shape[1], 4))
    err = float(np.max(np.abs(b @ (c @ probe) - a @ probe)) / np.sqrt(a.shape[1]))
  scale = max(1.0, float(np.max(np.abs(a))))
  if not err <= 1e-8 * scale:
    raise CacheError(f"{name}: B·C differs from A by {err:.3g} (tolerance {1e-8 * scale:.3g})")


def _validate_arrays(arrays: Dict[str, np.ndarray], npz_path: str, full_check: bool) -> None:
  a, b, c = arrays["A"], arrays["B"], arrays["C"]
  name = f"cache file {npz_path}"
  for label, x in (("A", a), ("B", b), ("C", c)):
    if x.dtype != np.float64:
      raise CacheError(f"{name}: {label} has dtype {x.dtype}, expected float64")
    if x.ndim != 2:
      raise CacheError(f"{name}: {label} is not a matrix (shape {x.shape})")
  n = a.shape[0]
  m = c.shape[0]
  if a.shape != (n, n) or c.shape != (m, n) or b.shape != (n, m):
    raise CacheError(f"{name}: shapes do not chain: A {a.shape}, B {b.shape}, C {c.shape}")
  for label, x in (("A", a), ("B", b), ("C", c)):
    if not np.all(np.isfinite(x)):
      raise CacheError(f"{name}: {label} has non-finite entries")
  if not fz.is_lower_triangular(a):
    raise CacheError(f"{name}: A is not lower triangular")
  if m == n:
    if not fz.is_lower_triangular(c, atol=1e-12):
      raise CacheError(f"{name}: C is not lower triangular")
    if not fz.is_lower_triangular(b, atol=1e-10 * max(1.0, float(np.max(np.abs(b))))):
      raise CacheError(f"{name}: B is not lower triangular")
  gamma = fz.sensitivity(c)
  if abs(gamma - 1.0) > 1e-9:
    raise CacheError(f"{name}: C is not normalized (largest column norm {gamma:.12g}, expected 1)")
  _check_product(a, b, c, full_check, name)


def load(npz_path: str, full_check: bool = False,
         expected_workload: Optional[np.ndarray] = None) -> fz.Factorization:
  """Loads and checks a cached factorization; raises CacheError naming the file.

  The sidecar ``metadata.json`` beside the file gives the expected sha256 and
  the workload parameters (A must be that workload; pass ``expected_workload``
  for a user matrix). ``full_check`` computes B·C exactly instead of the O(n²)
  randomized check.
  """
  npz_path = os.path.abspath(npz_path)
  json_path = os.path.join(os.path.dirname(npz_path), METADATA_FILE)
  try:
    metadata = _read_metadata(json_path)
  except FileNotFoundError as e:
    raise CacheError(f"cache file {npz_path} has no sidecar {json_path}") from e
  if metadata["npz_file"] != os.path.basename(npz_path):
    raise CacheError(f"cache file {npz_path} is not the file its sidecar {json_path} "
                     f"names ({metadata['npz_file']})")
  if expected_workload is None:
    try:
      expected_workload = _workload_from_params(metadata.get("params"))
    except (ValueError, KeyError, TypeError) as e:
      raise CacheError(f"cache sidecar {json_path} has invalid parameters: {e}") from e
  return _load_checked(npz_path, metadata, full_check, expected_workload)


def _load_checked(npz_path: str, metadata: Dict[str, Any], full_check: bool,
                  expected_workload: Optional[np.ndarray]) -> fz.Factorization:
  arrays = _load_arrays(npz_path, metadata["npz_sha256"])
  _validate_arrays(arrays, npz_path, full_check)
  a = arrays["A"]
  if metadata.get("n") is not None and a.shape[0] != metadata["n"]:
    raise CacheError(f"cache file {npz_path}: n = {a.shape[0]} but its sidecar says {metadata['n']}")
  if expected_workload is not None:
    if expected_workload.shape != a.shape or not np.allclose(a, expected_workload,
                                                             rtol=1e-12, atol=1e-12):
      raise CacheError(f"cache file {npz_path}: its A is not the requested workload")
  info = dict(metadata.get("info", {}))
  return fz.Factorization(a=a, b=arrays["B"], c=arrays["C"],
                          strategy=metadata.get("strategy", "unknown"), info=info)


def load_structured(npz_path: str):
  """The Algorithm 3 pieces of a cached structured entry as a ``StructuredResult``.

  Normalized like the stored B (γ(C) = 1); checks that they rebuild B.
  """
  from tff_mf import structured  # pylint: disable=g-import-not-at-top
  f = load(npz_path)
  metadata = _read_metadata(os.path.join(os.path.dirname(os.path.abspath(npz_path)),
                                         METADATA_FILE))
  arrays = _load_arrays(npz_path, None)
  missing = [k for k in _STRUCTURED_ARRAYS if k not in arrays]
  if missing:
    raise CacheError(f"cache file {npz_path} has no structured pieces {missing}")
  result = structured.StructuredResult(
      b=f.b, c=f.c, bands=int(metadata["params"]["bands"]), rank=int(metadata["params"]["rank"]),
      diagonals=arrays["structured_diagonals"], u=arrays["structured_u"],
      v=arrays["structured_v"], info=f.info)
  rebuilt = result.bands_matrix + np.where(
      structured.low_rank_mask(f.n, result.bands), result.u @ result.v.T, 0.0)
  if not np.allclose(rebuilt, f.b, rtol=1e-10, atol=1e-12):
    raise CacheError(f"cache file {npz_path}: structured pieces do not rebuild B")
  return result


# ---------------------------------------------------------------------------
# Computing and writing


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


def _jsonable(x: Any) -> Any:
  if isinstance(x, dict):
    return {str(k): _jsonable(v) for k, v in x.items()}
  if isinstance(x, (list, tuple)):
    return [_jsonable(v) for v in x]
  if isinstance(x, (np.floating, float)):
    return float(x) if np.isfinite(x) else None
  if isinstance(x, (np.integer,)):
    return int(x)
  if isinstance(x, (np.bool_,)):
    return bool(x)
  if isinstance(x, np.ndarray):
    return _jsonable(x.tolist())
  return x


def _compute(spec: strategies.FactorizationSpec, cache_dir: Optional[str], force: bool,
             progress: bool) -> Tuple[fz.Factorization, Dict[str, np.ndarray]]:
  """Runs the strategy; structured reuses (and caches) the optimal decoder."""
  if spec.strategy != "structured":
    return strategies.factorize(spec, progress=progress), {}
  from tff_mf import structured  # pylint: disable=g-import-not-at-top
  spec.validate()
  start = time.perf_counter()
  optimal_spec = dataclasses.replace(spec, strategy="optimal", bands=0, rank=0)
  try:
    optimal_f, _ = load_or_factorize(optimal_spec, cache_dir=cache_dir, progress=progress)
  except CacheError:
    if not force:
      raise
    optimal_f, _ = load_or_factorize(optimal_spec, cache_dir=cache_dir, force=True,
                                     progress=progress)
  a = optimal_f.a
  result = structured.fit(a, bands=spec.bands, rank=spec.rank, progress=progress, b_opt=optimal_f.b)
  b, c, gamma = fz.normalize(result.b, result.c)
  result = result.scaled(gamma)
  info = dict(result.info)
  for key in ("relative_gap", "iterations", "converged", "dual_lower_bound"):
    if key in optimal_f.info:
      info[f"optimal_{key}"] = optimal_f.info[key]
  info["optimal_sqrt_loss"] = optimal_f.sqrt_loss
  info["sensitivity_before_normalization"] = gamma
  info["seconds"] = time.perf_counter() - start
  f = fz.Factorization(a=a, b=b, c=c, strategy="structured", info=info).validate()
  extras = {"structured_diagonals": result.diagonals, "structured_u": result.u,
            "structured_v": result.v}
  return f, extras


def _spec_description(spec: strategies.FactorizationSpec) -> Dict[str, Any]:
  w = spec.workload
  return {
      "workload": w.kind, "n": w.n, "momentum": w.momentum, "lr_schedule": w.lr_schedule,
      "schedule_rounds": w.schedule_rounds,
      "matrix_file": os.path.abspath(w.matrix_file) if w.matrix_file else None,
      "strategy": spec.strategy, "target_gap": spec.target_gap,
      "max_iterations": spec.max_iterations, "allow_unconverged": spec.allow_unconverged,
      "bands": spec.bands, "rank": spec.rank,
  }


def _write_entry(directory: str, params: Dict[str, Any], spec: strategies.FactorizationSpec,
                 f: fz.Factorization, extras: Dict[str, np.ndarray]) -> CacheEntry:
  os.makedirs(directory, exist_ok=True)
  json_path = os.path.join(directory, METADATA_FILE)
  fd, tmp_npz = tempfile.mkstemp(prefix=".tmp-", suffix=".npz", dir=directory)
  tmp_json = None
  try:
    with os.fdopen(fd, "wb") as out:
      np.savez(out, A=np.ascontiguousarray(f.a, dtype=np.float64),
               B=np.ascontiguousarray(f.b, dtype=np.float64),
               C=np.ascontiguousarray(f.c, dtype=np.float64),
               **{k: np.asarray(v, dtype=np.float64) for k, v in extras.items()})
      out.flush()
      os.fsync(out.fileno())
    sha = file_sha256(tmp_npz)
    npz_name = f"factorization-{sha[:16]}.npz"
    info = _jsonable(f.info)
    metadata = {
        "format": FORMAT_VERSION,
        "key": key_hash(params),
        "params": params,
        "spec": _spec_description(spec),
        "strategy": f.strategy,
        "n": f.n,
        "m": f.m,
        "loss": f.loss,
        "sqrt_loss": f.sqrt_loss,
        "sensitivity_before_normalization": info.get("sensitivity_before_normalization"),
        "relative_gap": info.get("relative_gap", info.get("optimal_relative_gap")),
        "iterations": info.get("iterations", info.get("als_iterations")),
        "seconds": info.get("seconds"),
        "info": info,
        "created_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "package_versions": _package_versions(),
        "npz_file": npz_name,
        "npz_sha256": sha,
        "npz_bytes": os.path.getsize(tmp_npz),
    }
    # Check the written bytes before they can replace anything.
    _validate_arrays(_load_arrays(tmp_npz, sha), tmp_npz, full_check=False)
    npz_path = os.path.join(directory, npz_name)
    os.chmod(tmp_npz, 0o644)
    os.replace(tmp_npz, npz_path)
    tmp_npz = None
    try:
      old_npz = _read_metadata(json_path)["npz_file"]
    except (FileNotFoundError, CacheError):
      old_npz = None
    fd, tmp_json = tempfile.mkstemp(prefix=".tmp-", suffix=".json", dir=directory)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
      json.dump(metadata, out, indent=2, sort_keys=True)
      out.write("\n")
      out.flush()
      os.fsync(out.fileno())
    os.chmod(tmp_json, 0o644)
    os.replace(tmp_json, json_path)  # the commit point
    tmp_json = None
    if old_npz and old_npz != npz_name:
      _remove_quietly(os.path.join(directory, old_npz))
    return CacheEntry(npz_path=npz_path, json_path=json_path, metadata=metadata, cache_hit=False)
  finally:
    for leftover in (tmp_npz, tmp_json):
      if leftover:
        _remove_quietly(leftover)


def _remove_quietly(path: str) -> None:
  try:
    os.remove(path)
  except OSError:
    pass


def load_or_factorize(spec: strategies.FactorizationSpec, cache_dir: Optional[str] = None,
                      force: bool = False, progress: bool = False,
                      ) -> Tuple[fz.Factorization, CacheEntry]:
  """The factorization for ``spec``: from the cache if present, else computed and stored.

  A present but corrupt or mismatched entry raises CacheError naming the file
  (it is never used); ``force=True`` recomputes and replaces it. A computation
  that fails (e.g. ``dense.NotConvergedError``) leaves the cache untouched.
  """
  spec.validate()
  directory, params = entry_paths(spec, cache_dir)
  json_path = os.path.join(directory, METADATA_FILE)
  if not force and os.path.exists(json_path):
    metadata = _read_metadata(json_path)
    if metadata.get("params") != params:
      raise CacheError(f"cache sidecar {json_path} was written for other parameters "
                       f"({metadata.get('params')}); recompute with --force")
    npz_path = os.path.join(directory, metadata["npz_file"])
    f = _load_checked(npz_path, metadata, full_check=False,
                      expected_workload=spec.workload.build())
    return f, CacheEntry(npz_path=npz_path, json_path=json_path, metadata=metadata,
                         cache_hit=True)
  f, extras = _compute(spec, cache_dir, force, progress)
  expected = spec.workload.build()
  if not np.allclose(f.a, expected, rtol=1e-12, atol=1e-12):
    raise CacheError("computed factorization does not match the requested workload")
  entry = _write_entry(directory, params, spec, f, extras)
  return f, entry


# ---------------------------------------------------------------------------
# Listing and verifying


def _entry_dirs(cache_dir: Optional[str]) -> List[str]:
  root = _resolve_dir(cache_dir)
  if not os.path.isdir(root):
    return []
  return sorted(os.path.join(root, d) for d in os.listdir(root)
                if os.path.isdir(os.path.join(root, d)) and not d.startswith("."))


def list_entries(cache_dir: Optional[str] = None) -> List[Dict[str, Any]]:
  """One dict per entry directory (from its sidecar; ``error`` set when unreadable)."""
  rows = []
  for directory in _entry_dirs(cache_dir):
    json_path = os.path.join(directory, METADATA_FILE)
    row: Dict[str, Any] = {"directory": directory, "json_path": json_path}
    try:
      metadata = _read_metadata(json_path)
    except FileNotFoundError:
      row["error"] = f"no sidecar {json_path}"
      rows.append(row)
      continue
    except CacheError as e:
      row["error"] = str(e)
      rows.append(row)
      continue
    npz_path = os.path.join(directory, metadata["npz_file"])
    spec = metadata.get("spec", {})
    row.update({
        "npz_path": npz_path,
        "strategy": metadata.get("strategy"),
        "workload": spec.get("workload"),
        "momentum": spec.get("momentum"),
        "lr_schedule": spec.get("lr_schedule"),
        "n": metadata.get("n"),
        "bands": spec.get("bands") if metadata.get("strategy") == "structured" else None,
        "rank": spec.get("rank") if metadata.get("strategy") == "structured" else None,
        "sqrt_loss": metadata.get("sqrt_loss"),
        "relative_gap": metadata.get("relative_gap"),
        "seconds": metadata.get("seconds"),
        "created_utc": metadata.get("created_utc"),
        "bytes": os.path.getsize(npz_path) if os.path.isfile(npz_path) else None,
    })
    rows.append(row)
  return rows


def _workload_from_params(params: Dict[str, Any]) -> Optional[np.ndarray]:
  """A rebuilt from an entry's key parameters (None for a user matrix file)."""
  w = params.get("workload", {}) if isinstance(params, dict) else {}
  if w.get("kind") == "prefix_sum":
    return workloads.prefix_sum(int(w["n"]))
  if w.get("kind") == "momentum":
    n = int(w["n"])
    etas = workloads.learning_rates(n, w.get("lr_schedule", "constant"), w.get("schedule_rounds"))
    return workloads.momentum_matrix(n, float(w["momentum"]), etas)
  return None


def verify(cache_dir: Optional[str] = None, full_check: bool = True) -> List[Dict[str, Any]]:
  """Checks every entry completely; returns [{directory, path, ok, error}].

  Besides what ``load`` checks, the stored A must be the workload its key
  names and the stored √L must match the sidecar.
  """
  results = []
  for directory in _entry_dirs(cache_dir):
    json_path = os.path.join(directory, METADATA_FILE)
    path = json_path
    try:
      try:
        metadata = _read_metadata(json_path)
      except FileNotFoundError as e:
        raise CacheError(f"cache entry {directory} has no sidecar {json_path}") from e
      path = os.path.join(directory, metadata["npz_file"])
      try:
        expected = _workload_from_params(metadata.get("params"))
      except (ValueError, KeyError, TypeError) as e:
        raise CacheError(f"cache sidecar {json_path} has invalid parameters: {e}") from e
      f = _load_checked(path, metadata, full_check=full_check, expected_workload=expected)
      if metadata.get("sqrt_loss") is not None and not np.isclose(
          f.sqrt_loss, metadata["sqrt_loss"], rtol=1e-9):
        raise CacheError(f"cache file {path}: √L = {f.sqrt_loss:.6g} but its sidecar says "
                         f"{metadata['sqrt_loss']:.6g}")
      results.append({"directory": directory, "path": path, "ok": True, "error": None})
    except CacheError as e:
      results.append({"directory": directory, "path": path, "ok": False, "error": str(e)})
  return results
