"""b-banded encoders C, column-normalized and optimized for a workload A (numpy core).

C is lower triangular with C[i, j] = 0 for i − j ≥ b and unit column norms. Under
b-min-separation (any rounds of one user ≥ b apart) columns of different
participations have disjoint row supports, so sensitivity = √k for k participations
with unit columns (Choquette-Choo, Ganesh, McMahan, Rush, Steinke, Thakurta 2023,
arXiv:2306.08153); with b = 1 C is the identity, with b = n a dense optimum
of the single-participation problem (Denisov et al. 2022, arXiv:2202.08312, Eq. 4).

Optimization: minimize the total squared error ‖A·C⁻¹‖²_F directly over the band
entries of C (as McKenna 2024, arXiv:2405.15913, recommends over optimizing
X = CᵀC), with the column normalization built into the parametrization
C[:, j] = P[:, j]/‖P[:, j]‖, by L-BFGS (scipy). With B = A·C⁻¹ and Y = B·C⁻ᵀ the
gradient is ∂/∂C ‖A C⁻¹‖²_F = −2·BᵀY on the band; B and Y come from blocked
banded triangular solves (BLAS-3 blocks of the b − 1 coupled rows; Bᵀ is upper
triangular, and of Yᵀ only the upper triangle is read), and the band of BᵀY from block
products, so one evaluation costs O(n²·b) flops.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

import numpy as np
import scipy.linalg
import scipy.optimize

from tff_mf import checks
from tff_mf.factorization import families
from tff_mf import participation
from tff_mf.noise import streams
from tff_mf.factorization import workloads

# Rows per block of the banded triangular solves (at least b).
BLOCK_ROWS = 64
DEFAULT_MAX_ITERATIONS = 10_000
# L-BFGS stops when the objective fell by less than this (relative) over STOP_WINDOW
# iterations: measured, the objective is then within ~1e-7 (momentum with a learning-rate
# cooldown) to ~1e-9 (prefix sums) of where L-BFGS ends.
DEFAULT_RELATIVE_TOLERANCE = 1e-8
STOP_WINDOW = 20
LBFGS_MEMORY = 20


@dataclasses.dataclass
class BandedResult:
  """A = B·C with C b-banded, lower triangular, unit columns (float64).

  Attributes:
    b: decoder B = A·C⁻¹ (n x n, lower triangular).
    c: encoder C (n x n).
    info: ``objective`` (‖B‖²_F, the loss at unit columns), ``initial_objective``,
      ``iterations``, ``function_evaluations``, ``seconds``, ``converged``,
      ``message``, ``bands``, ``n``.
    extras: ``banded_coefficients`` [n, b] with coeffs[i, k] = C[i, i − k]
      (0 where i − k < 0).
  """
  b: np.ndarray
  c: np.ndarray
  info: Dict[str, Any]
  extras: Dict[str, np.ndarray]

  @property
  def bands(self) -> int:
    return int(self.extras["banded_coefficients"].shape[1])


# ----------------------------------------------------------------------------- band storage


def _check_bands(bands, n: int) -> int:
  return min(checks.positive_int(bands, "bands"), n)


def _column_mask(n: int, bands: int) -> np.ndarray:
  """[n, b] booleans: column-band entry (j, k) = C[j + k, j] exists (j + k < n)."""
  return (np.arange(n)[:, None] + np.arange(bands)[None, :]) < n


def column_to_row_bands(p: np.ndarray) -> np.ndarray:
  """Column-band storage p[j, k] = C[j + k, j] to row-band coeffs[i, k] = C[i, i − k]."""
  n, bands = p.shape
  out = np.zeros_like(p)
  for k in range(bands):
    out[k:, k] = p[:n - k, k]
  return out


def row_to_column_bands(coeffs: np.ndarray) -> np.ndarray:
  """The inverse of ``column_to_row_bands``."""
  n, bands = coeffs.shape
  out = np.zeros_like(coeffs)
  for k in range(bands):
    out[:n - k, k] = coeffs[k:, k]
  return out


def banded_matrix(coeffs: np.ndarray) -> np.ndarray:
  """Dense C (n x n) from row-band coefficients coeffs[i, k] = C[i, i − k]."""
  coeffs = checks.real_array(coeffs, "banded coefficients")
  if coeffs.ndim != 2:
    raise checks.CheckError(f"banded coefficients must be [n, b], got shape {coeffs.shape}")
  n, bands = coeffs.shape
  checks.dense_matrices_fit(n, 1.0, f"a banded C with n={n}")
  c = np.zeros((n, n))
  for k in range(min(bands, n)):
    idx = np.arange(k, n)
    c[idx, idx - k] = coeffs[k:, k]
  return c


def _dense_from_columns(p: np.ndarray) -> np.ndarray:
  n, bands = p.shape
  c = np.zeros((n, n))
  for k in range(bands):
    idx = np.arange(n - k)
    c[idx + k, idx] = p[:n - k, k]
  return c


# ----------------------------------------------------------------------------- banded solves


def _solve_lower(c: np.ndarray, rhs: np.ndarray, bands: int,
                 upper_part: bool = False) -> np.ndarray:
  """C⁻¹·R for C lower triangular with ``bands`` bands: block forward substitution.

  With ``upper_part`` only the entries (j, r) with r ≥ the first row of j's block are
  computed (the rest are zero): row j of C⁻¹·R at columns r ≥ j needs only the rows above it
  at the same columns, so the upper triangle (all ``_band_of_product`` reads) costs half.
  """
  n = c.shape[0]
  s = max(BLOCK_ROWS, bands)
  out = np.zeros_like(rhs) if upper_part else np.empty_like(rhs)
  for r0 in range(0, n, s):
    r1 = min(n, r0 + s)
    t0 = max(0, r0 - bands + 1)
    c0 = r0 if upper_part else 0
    block = rhs[r0:r1, c0:]
    if t0 < r0:
      block = block - c[r0:r1, t0:r0] @ out[t0:r0, c0:]
    out[r0:r1, c0:] = scipy.linalg.solve_triangular(c[r0:r1, r0:r1], block, lower=True,
                                                    check_finite=False)
  return out


def _solve_upper_t(c: np.ndarray, rhs: np.ndarray, bands: int,
                   upper_rhs: bool = False) -> np.ndarray:
  """C⁻ᵀ·R for C lower triangular with ``bands`` bands: block back substitution.

  With ``upper_rhs`` R (and so the result) is upper triangular, and block rows skip
  the columns left of the block.
  """
  n = c.shape[0]
  s = max(BLOCK_ROWS, bands)
  out = np.zeros_like(rhs) if upper_rhs else np.empty_like(rhs)
  starts = list(range(0, n, s))
  for r0 in reversed(starts):
    r1 = min(n, r0 + s)
    t1 = min(n, r1 + bands - 1)
    c0 = r0 if upper_rhs else 0
    block = rhs[r0:r1, c0:]
    if r1 < t1:
      block = block - c[r1:t1, r0:r1].T @ out[r1:t1, c0:]
    out[r0:r1, c0:] = scipy.linalg.solve_triangular(c[r0:r1, r0:r1], block, trans="T",
                                                    lower=True, check_finite=False)
  return out


def _band_of_product(bt: np.ndarray, yt: np.ndarray, bands: int) -> np.ndarray:
  """g[j, k] = Σ_r bt[j + k, r]·yt[j, r] (bt upper triangular), for j + k < n."""
  n = bt.shape[0]
  s = max(BLOCK_ROWS, bands)
  g = np.zeros((n, bands))
  for j0 in range(0, n, s):
    j1 = min(n, j0 + s)
    i1 = min(n, j1 + bands - 1)
    prod = bt[j0:i1, j0:] @ yt[j0:j1, j0:].T  # rows i, columns j (local)
    jj = np.arange(j1 - j0)
    for k in range(bands):
      ok = jj + k < i1 - j0
      g[j0 + jj[ok], k] = prod[jj[ok] + k, jj[ok]]
  return g


# ----------------------------------------------------------------------------- objective


class _Objective:
  """‖A·C⁻¹‖²_F and its gradient in the column-band parameters P (unnormalized)."""

  def __init__(self, a: np.ndarray, bands: int):
    self.a_t = np.ascontiguousarray(a.T)
    self.n = a.shape[0]
    self.bands = bands
    self.mask = _column_mask(self.n, bands)
    self.evaluations = 0

  def unpack(self, x: np.ndarray) -> np.ndarray:
    p = np.zeros((self.n, self.bands))
    p[self.mask] = x
    return p

  def normalized(self, p: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    norms = np.sqrt(np.sum(np.square(p), axis=1))
    if not np.all(norms > 0) or not np.all(np.isfinite(norms)):
      raise checks.CheckError("banded optimization produced a zero or non-finite column of C")
    return p / norms[:, None], norms

  def value_and_gradient(self, x: np.ndarray) -> Tuple[float, np.ndarray]:
    self.evaluations += 1
    p = self.unpack(x)
    u, norms = self.normalized(p)
    if np.any(np.abs(u[:, 0]) < 1e-300):
      return float("inf"), np.zeros_like(x)
    c = _dense_from_columns(u)
    bt = _solve_upper_t(c, self.a_t, self.bands, upper_rhs=True)  # Bᵀ = C⁻ᵀAᵀ
    value = float(np.sum(np.square(bt)))
    yt = _solve_lower(c, bt, self.bands, upper_part=True)  # Yᵀ = C⁻¹Bᵀ, where it is read
    g = -2.0 * _band_of_product(bt, yt, self.bands)  # ∂f/∂C on the band (column storage)
    g[~self.mask] = 0.0
    # Chain rule through u = p/‖p‖: (I − uuᵀ)·g/‖p‖ per column.
    g = (g - u * np.sum(u * g, axis=1, keepdims=True)) / norms[:, None]
    return value, g[self.mask]


def objective(a: np.ndarray, coeffs: np.ndarray) -> float:
  """‖A·C⁻¹‖²_F for C given by row-band coefficients (columns normalized first)."""
  a = workloads.validate_workload(a)
  coeffs = checks.real_array(coeffs, "banded coefficients")
  obj = _Objective(a, coeffs.shape[1])
  value, _ = obj.value_and_gradient(row_to_column_bands(coeffs)[obj.mask])
  return value


def objective_and_gradient(a: np.ndarray, params: np.ndarray) -> Tuple[float, np.ndarray]:
  """The optimizer's objective at column-band parameters P ([n, b], P[j, k] = C̃[j + k, j],
  columns normalized inside) and its gradient in P (entries with j + k ≥ n are zero)."""
  a = workloads.validate_workload(a)
  params = checks.real_array(params, "banded parameters")
  obj = _Objective(a, params.shape[1])
  value, grad = obj.value_and_gradient(params[obj.mask])
  return value, obj.unpack(grad)


# The Toeplitz square root of S (first ``bands`` coefficients): the optimization's start.
sqrt_prefix_coefficients = workloads.sqrt_prefix_coefficients


# ----------------------------------------------------------------------------- optimize


def _gauge(p: np.ndarray) -> np.ndarray:
  """Column-band parameters with unit diagonal, describing the same normalized C up to row
  signs (a row sign of C changes neither X = CᵀC, nor ‖A·C⁻¹‖_F, nor the band)."""
  n, bands = p.shape
  diag = p[:, 0]
  if np.any(diag == 0):
    raise checks.CheckError("banded C has a zero on its diagonal (singular)")
  signs = np.sign(diag)  # row i of C has diagonal entry p[i, 0]
  out = np.zeros_like(p)
  for k in range(bands):
    out[:n - k, k] = p[:n - k, k] * signs[k:]
  return out / np.abs(diag)[:, None]


def optimize(a: np.ndarray,
             bands: int,
             max_iterations: int = DEFAULT_MAX_ITERATIONS,
             tolerance: float = DEFAULT_RELATIVE_TOLERANCE,
             initial: Optional[np.ndarray] = None,
             time_limit: Optional[float] = None,
             progress: bool = False,
             callback: Optional[Callable[[Dict[str, float]], None]] = None) -> BandedResult:
  """The b-banded, column-normalized lower-triangular C minimizing ‖A·C⁻¹‖²_F.

  The free parameters are the sub-diagonal band entries of C̃ with unit diagonal (the
  scale of each column is fixed by the normalization, so this removes n flat
  directions); L-BFGS stops when the objective fell by less than ``tolerance``
  (relative) over the last STOP_WINDOW iterations. A local method: no certificate (for
  bands = n compare with ``dense_single.solve``, whose gap is certified).

  Args:
    a: workload, n x n lower triangular, full rank (validated).
    bands: b ≥ 1 (b ≥ n gives a dense lower-triangular C; b = 1 the identity).
    max_iterations: L-BFGS iteration limit.
    tolerance: relative decrease of the objective over STOP_WINDOW iterations at which
      to stop (the objective is then typically within a few times this of the limit).
    initial: optional row-band coefficients [n, b] to start from (default: the banded
      Toeplitz square root of S, normalized).
    time_limit: optional wall-clock limit in seconds (checked after each iteration).
    progress: tqdm bar on stderr.
    callback: called with {"iteration", "objective", "seconds"} after each iteration.

  Returns:
    BandedResult (B·C = A; unit columns; ``info['converged']`` is False when an
    iteration or time limit stopped it).
  """
  start = time.perf_counter()
  a = workloads.validate_workload(a)
  n = a.shape[0]
  bands = _check_bands(bands, n)
  checks.positive_int(max_iterations, "max_iterations")
  checks.in_range(tolerance, "tolerance", 0.0, 1.0, low_open=True)
  checks.dense_matrices_fit(n, 5.0, f"banded optimization for n={n}")
  obj = _Objective(a, bands)
  search = _GaugedSearch(obj, _start_parameters(initial, obj), start)
  initial_value, _ = search.value_and_gradient(search.p[search.free])
  search.history.append(initial_value)
  message = "bands = 1: C = I"
  converged = True
  if bands > 1:
    message, converged = search.minimize(max_iterations, tolerance, time_limit, progress,
                                         callback)
  return _banded_result(a, obj, search, initial_value, message, converged, tolerance)


def _start_parameters(initial: Optional[np.ndarray], obj: _Objective) -> np.ndarray:
  """Gauged column-band start: the given row-band coefficients or the Toeplitz √S."""
  n, bands = obj.n, obj.bands
  if initial is None:
    p0 = np.broadcast_to(sqrt_prefix_coefficients(bands), (n, bands)).copy()
  else:
    init = checks.real_array(initial, "initial banded coefficients")
    if init.shape != (n, bands):
      raise checks.CheckError(f"initial banded coefficients must have shape ({n}, {bands}), "
                              f"got {init.shape}")
    p0 = row_to_column_bands(init)
  p0[~obj.mask] = 0.0
  return _gauge(p0)


class _Stop(Exception):
  """Ends L-BFGS early: the objective stopped falling, or the time limit passed."""


@dataclasses.dataclass
class _GaugedSearch:
  """L-BFGS over the free (sub-diagonal) band entries of a unit-diagonal C̃; ``p`` holds the
  current column-band parameters (the start until ``minimize`` writes the result)."""
  obj: _Objective
  p: np.ndarray
  start: float
  free: np.ndarray = dataclasses.field(init=False)  # the entries L-BFGS moves
  x: np.ndarray = dataclasses.field(init=False)  # the last accepted iterate
  iterations: int = 0
  value: Optional[float] = None  # objective at the point evaluated last
  reason: Optional[str] = None  # why _Stop was raised
  history: List[float] = dataclasses.field(default_factory=list)

  def __post_init__(self):
    self.free = self.obj.mask.copy()
    self.free[:, 0] = False  # the unit diagonal is fixed
    self.x = self.p[self.free]

  def value_and_gradient(self, y: np.ndarray) -> Tuple[float, np.ndarray]:
    p = self.p.copy()
    p[self.free] = y
    value, grad = self.obj.value_and_gradient(p[self.obj.mask])
    self.value = value
    return value, self.obj.unpack(grad)[self.free]

  def minimize(self, max_iterations, tolerance, time_limit, progress, callback):
    """Runs L-BFGS-B from ``p`` and stores the result there; (message, converged)."""
    from tqdm import tqdm  # pylint: disable=g-import-not-at-top
    # No total: the stop rule (not the iteration limit, far above it) ends the search, after
    # an iteration count nobody can tell in advance; the postfix shows how near it is.
    bar = tqdm(total=None, file=sys.stderr, disable=not progress, unit="it",
               desc=f"banded n={self.obj.n} b={self.obj.bands}", leave=False)
    try:
      res = scipy.optimize.minimize(
          self.value_and_gradient, self.p[self.free], jac=True, method="L-BFGS-B",
          callback=lambda xk: self._on_iteration(xk, bar, tolerance, time_limit, callback),
          options={"maxiter": int(max_iterations), "ftol": 1e-15, "gtol": 0.0,
                   "maxcor": LBFGS_MEMORY, "maxfun": 4 * int(max_iterations)})
      x = res.x
      message = str(res.message)
      converged = bool(res.success) and "ITERATIONS" not in message.upper()
    except _Stop:
      x = self.x
      message = self.reason
      converged = message == "tolerance"
    finally:
      bar.close()
    self.p[self.free] = x
    return message, converged

  def _on_iteration(self, xk, bar, tolerance, time_limit, callback) -> None:
    # L-BFGS-B accepts the point it evaluated last, so self.value is f(xk).
    self.iterations += 1
    self.x = xk.copy()
    self.history.append(self.value)
    record = {"iteration": self.iterations, "objective": self.value,
              "seconds": time.perf_counter() - self.start}
    decrease = None
    if len(self.history) > STOP_WINDOW:
      decrease = (self.history[-1 - STOP_WINDOW] - self.value) / abs(self.value)
    bar.update(1)
    bar.set_postfix_str(f"objective {self.value:.8g}" + (
        "" if decrease is None else
        f", fell {decrease:.1e} in {STOP_WINDOW} iterations (stops at {tolerance:.0e})"))
    if callback is not None:
      callback(record)
    if decrease is not None:
      if decrease <= tolerance:
        self.reason = "tolerance"
        raise _Stop()
    if time_limit is not None and record["seconds"] > time_limit:
      self.reason = "time limit reached"
      raise _Stop()


def _banded_result(a: np.ndarray, obj: _Objective, search: _GaugedSearch, initial_value: float,
                   message: str, converged: bool, tolerance: float) -> BandedResult:
  """Normalized C from the final parameters, B = A·C⁻¹, and the info record."""
  u, _ = obj.normalized(search.p)
  c = _dense_from_columns(u)
  b_t = scipy.linalg.solve_triangular(c, a.T, trans="T", lower=True, check_finite=False)
  b = np.tril(b_t.T)
  value = float(np.sum(np.square(b)))
  if value > initial_value * (1 + 1e-9):  # never worse than the start (rounding aside)
    raise checks.CheckError(f"banded optimization ended above its starting objective "
                            f"({value:.6g} > {initial_value:.6g})")
  info = {
      "objective": value,
      "initial_objective": float(initial_value),
      "iterations": int(search.iterations),
      "function_evaluations": obj.evaluations,
      "seconds": time.perf_counter() - search.start,
      "converged": bool(converged),
      "message": message,
      "bands": int(obj.bands),
      "n": int(obj.n),
      "tolerance": float(tolerance),
  }
  return BandedResult(b=b, c=c, info=info,
                      extras={"banded_coefficients": column_to_row_bands(u)})


def stream(source: Union[BandedResult, Dict[str, np.ndarray], np.ndarray],
           a: Optional[np.ndarray] = None, name: str = "banded C⁻¹") -> streams.LinearStream:
  """The LinearStream of C⁻¹·Z for a banded C (``streams.lower_banded_inverse``).

  ``source``: a BandedResult, its ``extras`` dict, or the row-band coefficients
  [n, b] themselves. ``a`` is not needed (accepted for the family interface).
  """
  del a
  if isinstance(source, BandedResult):
    coeffs = source.extras["banded_coefficients"]
  elif isinstance(source, dict):
    if "banded_coefficients" not in source:
      raise checks.CheckError(f"{name}: stored parameters lack banded_coefficients")
    coeffs = checks.real_array(source["banded_coefficients"], "banded coefficients")
  else:
    coeffs = checks.real_array(source, "banded coefficients")
  if coeffs.ndim != 2:
    raise checks.CheckError(f"banded coefficients must be [n, b], got shape {coeffs.shape}")
  return streams.lower_banded_inverse(coeffs, coeffs.shape[0], name=name)


# ----------------------------------------------------------------------------- family interface

# Bumped whenever the output for the same inputs changes (part of the cache key).
VERSION = "1"

STRATEGIES = {"banded": families.Declaration(
    parameters=("bands",), defaults=families.separation_bands,
    participations=participation.KINDS, schema_dependent=True, schema_free=True,
    peak_matrices=8, streams=True,
    check_spec=lambda spec: families.check_bands(spec, at_most_separation=True))}


def factorize(a: np.ndarray, spec, context):
  """The optimized b-banded C for A (``optimize``)."""
  from tff_mf.factorization.families import FamilyResult  # pylint: disable=g-import-not-at-top
  result = optimize(a, spec.bands, progress=bool(context and context.progress))
  return FamilyResult(b=result.b, c=result.c, info=dict(result.info), extras=dict(result.extras))


def check_extras(f) -> None:
  """The stored band coefficients, divided by the stored γ, rebuild the normalized C."""
  gamma = float(np.asarray(f.extras["normalization"])[0])
  rebuilt = banded_matrix(checks.real_array(f.extras["banded_coefficients"],
                                            "banded coefficients")) / gamma
  err = float(np.max(np.abs(rebuilt - f.c)))
  if err > 1e-12 * max(1.0, float(np.max(np.abs(f.c)))):
    raise checks.CheckError(f"banded coefficients do not rebuild C (error {err:.3g})")
