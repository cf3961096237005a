"""Square-root factorizations in closed form: BSR, BISR and DP-λCGD (numpy core).

All three start from the workload's square root A^{1/2} (lower triangular, positive
diagonal). For a Toeplitz A with first column a (prefix sums: a = 1; momentum β with a
constant learning rate) A^{1/2} is Toeplitz and its coefficients are the power series
√(Σ a_k x^k); otherwise the triangular square root is computed (scipy's Schur method).

- ``bsr`` (banded square root, Kalinin & Lampert 2024, arXiv:2405.13763): C = the first
  b diagonals of A^{1/2}, B = A·C⁻¹. No optimization; C is b-banded, so its noise is the
  banded-C stream of ``families.banded`` (b − 1 rows of state).
- ``bisr`` (banded inverse square root, Kalinin, Lampert et al. 2025, arXiv:2505.12128):
  C⁻¹ = the first b diagonals of A^{−1/2}, B = A·C⁻¹ (b-banded for Toeplitz A). Round i
  adds Σ_{j<b} C⁻¹[i, i−j]·Z[i−j]: the last b rows of Z, regenerated from the seed or kept
  as b − 1 rows of state (``fir_stream``).
- ``banded_inverse`` (BandInvMF): the b Toeplitz taps of C⁻¹ optimized for the schema's
  rmse, starting from BISR's (Toeplitz workloads).
- ``lambda_cgd`` (DP-λCGD, Kalinin, McKenna, Pagh, Lampert 2026, arXiv:2601.22334): round
  i adds Z[i] − λ·Z[i−1], i.e. C⁻¹ = I − λ·(shift), C[i, j] = λ^{i−j}; λ ∈ [0, 1) minimizes
  the rmse under the participation schema (a bounded scalar search).

For non-negative, non-increasing Toeplitz C (λCGD always; BSR and BISR of prefix sums)
the min-sep sensitivity is exact (``participation``'s earliest-pattern path).

For a Toeplitz workload every C here is Toeplitz, and ``factorize_toeplitz`` computes first
columns only (O(n·b) time, O(n) memory; the cache stores them): BSR's C is then a banded
Toeplitz C, streamed as ``families.toeplitz`` streams one; the others' C⁻¹ is the FIR filter
of their b taps (``inverse_taps``). Other workloads take the dense path (``factorize``).
"""

from __future__ import annotations

from typing import Dict, Optional, Tuple

import numpy as np
import scipy.linalg
import scipy.optimize

from tff_mf import checks
from tff_mf.factorization import families
from tff_mf import factorization as fz
from tff_mf import participation as participation_lib
from tff_mf.noise import streams
from tff_mf.factorization import toeplitz_factorization
from tff_mf.factorization import toeplitz_ops
from tff_mf.factorization.families import FamilyResult
from tff_mf.factorization.families import banded
from tff_mf.factorization.families import toeplitz
from tff_mf.participation import toeplitz_bounds

# Bumped whenever the output for the same inputs changes (part of the cache key).
# 2: BandInvMF with closed-form gradients, L-BFGS-B restarts, Nelder-Mead polish;
# 3: Toeplitz workloads as first columns (``factorize_toeplitz``).
VERSION = "3"


def _banded(schema_dependent: bool) -> families.Declaration:
  return families.Declaration(
      parameters=("bands",), defaults=families.separation_bands,
      participations=participation_lib.KINDS, schema_dependent=schema_dependent,
      schema_free=not schema_dependent, peak_matrices=8, streams=True,
      check_spec=families.check_bands)


# BSR and BISR are closed forms of A alone; BandInvMF and λCGD optimize for the schema.
STRATEGIES = {
    "bsr": _banded(schema_dependent=False),
    "bisr": _banded(schema_dependent=False),
    "banded_inverse": _banded(schema_dependent=True),
    "lambda_cgd": families.Declaration(participations=participation_lib.KINDS,
                                       schema_dependent=True, peak_matrices=8, streams=True),
}
# λCGD's search stops when λ is known to this absolute precision.
LAMBDA_XTOL = 1e-6
# A C whose first column's norm exceeds this is numerically unstable (BandInvMF's search).
_UNSTABLE = 1e100
# BandInvMF's L-BFGS-B stops when an iteration lowers log rmse² by less than this (relative).
_FTOL = 1e-12
# At most this many L-BFGS-B runs per start (each restarted from the last one's end point).
_RESTARTS = 20
# A line search stopped at a kink is followed by a Nelder-Mead polish up to this many free taps.
_POLISH_MAX_FREE_TAPS = 16


def toeplitz_column(a: np.ndarray) -> Optional[np.ndarray]:
  """The first column of A when A is exactly lower-triangular Toeplitz, else None."""
  return participation_lib.toeplitz_coefficients(a)


def series_sqrt(a: np.ndarray) -> np.ndarray:
  """Coefficients of √(Σ a_k x^k) (a_0 > 0): the first column of Toeplitz(a)^{1/2}."""
  n = a.shape[0]
  c = np.zeros(n)
  c[0] = np.sqrt(a[0])
  for k in range(1, n):
    c[k] = (a[k] - np.dot(c[1:k], c[k - 1:0:-1])) / (2.0 * c[0])
  return c


def series_inverse(h: np.ndarray, n: int) -> np.ndarray:
  """The first n coefficients of 1/(Σ h_j x^j) (h_0 ≠ 0): the first column of Toeplitz(h)⁻¹."""
  x = np.zeros(n)
  x[0] = 1.0 / h[0]
  taps = h[1:]
  for k in range(1, n):
    m = min(k, taps.shape[0])
    x[k] = -np.dot(taps[:m], x[k - 1::-1][:m]) / h[0]
  return x


def toeplitz_matrix(column: np.ndarray) -> np.ndarray:
  """Lower-triangular Toeplitz matrix with the given first column (exactly Toeplitz)."""
  n = column.shape[0]
  idx = np.arange(n)
  diff = idx[:, None] - idx[None, :]
  return np.where(diff >= 0, column[np.maximum(diff, 0)], 0.0)


def triangular_sqrt(a: np.ndarray) -> np.ndarray:
  """The lower-triangular square root of A with positive diagonal."""
  if np.any(np.diag(a) <= 0):
    raise checks.CheckError("the workload's square root needs a positive diagonal")
  root = scipy.linalg.sqrtm(a)
  if np.iscomplexobj(root):
    if np.max(np.abs(root.imag)) > 1e-8 * max(1.0, np.max(np.abs(root.real))):
      raise checks.CheckError("the workload has no real square root")
    root = root.real
  return np.tril(root)


def band(x: np.ndarray, bands: int) -> np.ndarray:
  """The first ``bands`` diagonals of a lower-triangular matrix (the rest zeroed)."""
  n = x.shape[0]
  return x * (np.tri(n) - np.tri(n, k=-bands))


def constant_taps(h_rows: np.ndarray) -> bool:
  """Every row's taps equal the last row's on the entries it has: a Toeplitz banded matrix."""
  n, bands = h_rows.shape
  valid = np.arange(bands)[None, :] <= np.arange(n)[:, None]
  return bool(np.all(np.where(valid, h_rows == h_rows[-1], True)))


def row_band_coefficients(x: np.ndarray, bands: int) -> np.ndarray:
  """coeffs[i, k] = X[i, i − k] for k < bands (0 where i < k): the banded families' format."""
  n = x.shape[0]
  out = np.zeros((n, bands))
  for k in range(min(bands, n)):
    idx = np.arange(k, n)
    out[k:, k] = x[idx, idx - k]
  return out


# ----------------------------------------------------------------------------- BSR


def factorize_bsr(a: np.ndarray, bands: int) -> FamilyResult:
  """C = band_b(A^{1/2}), B = A·C⁻¹ (Kalinin & Lampert 2024, arXiv:2405.13763)."""
  column = toeplitz_column(a)
  if column is not None:
    c = band(toeplitz_matrix(series_sqrt(column)), bands)
  else:
    c = band(triangular_sqrt(a), bands)
  b = scipy.linalg.solve_triangular(c.T, a.T, lower=False).T  # B = A·C⁻¹
  coeffs = row_band_coefficients(c, bands)
  return FamilyResult(b=b, c=c, info={"family": "square_root", "form": "bsr",
                                      "toeplitz_workload": column is not None},
                      extras={"banded_coefficients": coeffs})


# ----------------------------------------------------------------------------- BISR, λCGD


def _inverse_banded(a: np.ndarray, h_rows: np.ndarray, info: Dict) -> FamilyResult:
  """C from the row-band coefficients of C⁻¹ (exact Toeplitz when the taps do not vary)."""
  n, bands = h_rows.shape
  c_inv = banded.banded_matrix(h_rows)
  if constant_taps(h_rows):
    c = toeplitz_matrix(series_inverse(h_rows[-1], n))  # exactly Toeplitz
  else:
    c = scipy.linalg.solve_triangular(c_inv, np.eye(n), lower=True)
  b = a @ c_inv
  return FamilyResult(b=b, c=c, info=info, extras={"inverse_band_coefficients": h_rows})


def bisr_taps(a_column: np.ndarray, bands: int) -> np.ndarray:
  """The first min(b, n) coefficients of 1/√(Σ a_k x^k): BISR's Toeplitz C⁻¹ taps
  (O(b²); a power series' first b coefficients need only a's first b)."""
  m = min(bands, a_column.shape[0])
  return series_inverse(series_sqrt(np.asarray(a_column[:m], dtype=np.float64)), m)


def factorize_bisr(a: np.ndarray, bands: int) -> FamilyResult:
  """C⁻¹ = band_b(A^{−1/2}) (Kalinin, Lampert et al. 2025, arXiv:2505.12128)."""
  n = a.shape[0]
  column = toeplitz_column(a)
  if column is not None:
    h_rows = np.tile(bisr_taps(column, bands), (n, 1))
    for k in range(min(bands, n)):
      h_rows[:k, k] = 0.0
  else:
    root = triangular_sqrt(a)
    inv_root = scipy.linalg.solve_triangular(root, np.eye(n), lower=True)
    h_rows = row_band_coefficients(inv_root, bands)
  return _inverse_banded(a, h_rows, {"family": "square_root", "form": "bisr",
                                     "toeplitz_workload": column is not None})


def lambda_cgd_result(a: np.ndarray, lam: float) -> FamilyResult:
  """C⁻¹ = I − λ·shift for a given λ."""
  n = a.shape[0]
  h_rows = np.zeros((n, 2))
  h_rows[:, 0] = 1.0
  h_rows[1:, 1] = -lam
  return _inverse_banded(a, h_rows, {"family": "square_root", "form": "lambda_cgd",
                                     "lambda": float(lam)})


def _normalized_rmse(result: FamilyResult, schema) -> float:
  gamma = checks.gamma(result.c)
  sens = participation_lib.sensitivity(result.c / gamma, schema)
  return fz.rmse(result.b * gamma, sens)


def _lambda_search(objective):
  return scipy.optimize.minimize_scalar(objective, bounds=(0.0, 1.0 - 1e-9), method="bounded",
                                        options={"xatol": LAMBDA_XTOL})


def optimal_lambda(a_column: np.ndarray, schema):
  """λCGD's λ for the Toeplitz workload with first column a, in O(n·k) per evaluation
  (``banded_inverse_objective``): the bounded Brent search's result."""
  return _lambda_search(lambda lam: banded_inverse_objective(np.array([-lam]), a_column, schema))


def factorize_lambda_cgd(a: np.ndarray, schema) -> FamilyResult:
  """λ ∈ [0, 1) minimizing the rmse under ``schema`` (bounded Brent search), and its C.

  Toeplitz workloads evaluate the rmse in O(n·k) (``optimal_lambda``), others from the
  dense matrices.
  """
  column = toeplitz_column(a)
  if column is not None:
    search = optimal_lambda(column, schema)
  else:
    search = _lambda_search(lambda lam: _normalized_rmse(lambda_cgd_result(a, lam), schema))
  result = lambda_cgd_result(a, float(search.x))
  result.info.update(lambda_search_evaluations=int(search.nfev))
  return result


# ----------------------------------------------------------------------------- BandInvMF


def _schema_separation(schema, n: int):
  """(min_sep, k) whose earliest-pattern value bounds the schema (exact for C ≥ 0 non-increasing).

  Fixed-epoch patterns {j, j + n/k, …} are min-sep patterns with separation n/k.
  """
  from tff_mf.participation import toeplitz_bounds  # pylint: disable=g-import-not-at-top
  cover = schema.cyclic_cover(n)
  return (None, None) if cover is None else toeplitz_bounds.participations(n, *cover)


def _correlate_head(g: np.ndarray, u: np.ndarray, m: int) -> np.ndarray:
  """out[j] = Σ_{i≥j} g_i·u_{i−j} for j < m (g, u of length n; FFT, O(n log n))."""
  n = g.shape[0]
  size = 1 << (2 * n - 1).bit_length()
  full = np.fft.irfft(np.fft.rfft(g[::-1], size) * np.fft.rfft(u, size), size)
  return full[n - m:n][::-1]


def _self_convolution(v: np.ndarray) -> np.ndarray:
  """(v ∗ v)[:n] by FFT."""
  n = v.shape[0]
  size = 1 << (2 * n - 1).bit_length()
  spectrum = np.fft.rfft(v, size)
  return np.fft.irfft(spectrum * spectrum, size)[:n]


def banded_inverse_value_and_gradient(free_taps: np.ndarray, a_column: np.ndarray, schema):
  """rmse² of C⁻¹ = Toeplitz(1, free_taps) for the Toeplitz workload with first column a,
  and its gradient in the free taps (closed form).

  C's first column c is the power series 1/h (O(n·b)); with v = c/‖c‖,
  rmse² = s(v)²·‖c‖²·Σ_i (n − i)·β_i²/n, β = a ∗ h (B = A·C⁻¹ is Toeplitz). The
  sensitivity s(v) is the min-sep value of the non-increasing majorant of |v|
  (``toeplitz_bounds.min_sep_sensitivity``'s earliest pattern; exact when v is non-negative
  and non-increasing, which it then equals, else an upper bound; Kalinin & Lampert 2024,
  arXiv:2405.13763, Thm 2); s = 1 under single participation. The gradient uses
  dc = −c ∗ c ∗ dh (from c ∗ h = e_0) and the majorant's subgradient.
  """
  from tff_mf.factorization import toeplitz_ops  # pylint: disable=g-import-not-at-top
  from tff_mf.participation import toeplitz_bounds  # pylint: disable=g-import-not-at-top
  n = a_column.shape[0]
  free = np.asarray(free_taps, dtype=np.float64)
  taps = np.concatenate([[1.0], free])
  bands = taps.shape[0]
  with np.errstate(over="ignore", invalid="ignore"):
    c = toeplitz_ops.inverse_column(taps, n)
    gamma = float(np.linalg.norm(c))
  if not np.isfinite(gamma) or gamma > _UNSTABLE:
    # 1/h grows without bound (a root of h inside the unit disk): far worse than any start.
    return _UNSTABLE * (1.0 + float(np.sum(np.square(free)))), 2.0 * _UNSTABLE * free
  v = c / gamma
  sep, k = _schema_separation(schema, n)
  if sep is None or k is None or k <= 1 or sep >= n:
    sens_sq, grad_v = 1.0, 2.0 * v  # s(c)² = ‖c‖², homogeneous of degree 2
  else:
    absv = np.abs(v)
    majorant = np.maximum.accumulate(absv[::-1])[::-1]
    # majorant[i] = |v[r(i)]|, r(i) the first position ≥ i where |v| equals its majorant.
    positions = np.where(absv >= majorant, np.arange(n), n)
    r = np.minimum.accumulate(positions[::-1])[::-1]
    pattern = toeplitz_bounds.minsep_vector(majorant, sep, k)
    sens_sq = float(pattern @ pattern)
    g_major = 2.0 * toeplitz_bounds.minsep_vector_adjoint(pattern, sep, k)
    grad_v = np.bincount(r, weights=g_major * np.sign(v[r]), minlength=n)
  beta = np.convolve(a_column, taps)[:n]
  weights = (n - np.arange(n)) / n
  error = gamma ** 2 * float(np.sum(weights * beta ** 2))  # ‖c‖²·Σ wβ², γ² folded in
  value = sens_sq * error
  # s(c)² = ‖c‖²·s(v)² is homogeneous of degree 2: ∇_c = ‖c‖·∇_v s(v)²; with
  # dc = −c ∗ c ∗ dh: ∂/∂h_j = −Σ_i ∇_c[i]·(c ∗ c)[i − j].
  grad_sens = -gamma * _correlate_head(grad_v, _self_convolution(v), bands)
  grad_error = 2.0 * _correlate_head(weights * beta, a_column, bands)
  grad = error * grad_sens + sens_sq * gamma ** 2 * grad_error
  return value, grad[1:]


def bound_value(free_taps: np.ndarray, a_column: np.ndarray, schema) -> float:
  """rmse² of C⁻¹ = Toeplitz(1, free_taps) with ``toeplitz_bounds.min_sep_sensitivity`` (exact
  for non-negative non-increasing C, else the smaller of its two upper bounds)."""
  from tff_mf.factorization import toeplitz_ops  # pylint: disable=g-import-not-at-top
  from tff_mf.participation import toeplitz_bounds  # pylint: disable=g-import-not-at-top
  n = a_column.shape[0]
  free = np.asarray(free_taps, dtype=np.float64)
  taps = np.concatenate([[1.0], free])
  with np.errstate(over="ignore", invalid="ignore"):
    c = toeplitz_ops.inverse_column(taps, n)
    gamma = float(np.linalg.norm(c))
  if not np.isfinite(gamma) or gamma > _UNSTABLE:
    return _UNSTABLE * (1.0 + float(np.sum(np.square(free))))
  sep, k = _schema_separation(schema, n)
  sens = 1.0 if sep is None else toeplitz_bounds.min_sep_sensitivity(c / gamma, n, sep, k)
  beta = np.convolve(a_column, taps)[:n] * gamma
  return sens ** 2 * float(np.sum((n - np.arange(n)) * beta ** 2)) / n


def banded_inverse_objective(free_taps: np.ndarray, a_column: np.ndarray, schema) -> float:
  """rmse² of C⁻¹ = Toeplitz(1, free_taps) (``banded_inverse_value_and_gradient``'s value)."""
  return banded_inverse_value_and_gradient(free_taps, a_column, schema)[0]


def _log_value_and_gradient(free_taps, a_column, schema):
  value, grad = banded_inverse_value_and_gradient(free_taps, a_column, schema)
  return np.log(value), grad / value


def _lbfgs_with_restarts(start, a_column, schema):
  """L-BFGS-B on log rmse², restarted from its end point (a fresh curvature memory) until a
  run makes at most one step: the objective has kinks where C's coefficients stop being
  non-negative and non-increasing, where one run can stop early. ``nit`` counts all runs."""
  total, search = 0, None
  for _ in range(_RESTARTS):
    search = scipy.optimize.minimize(_log_value_and_gradient, start, jac=True,
                                     args=(a_column, schema), method="L-BFGS-B",
                                     options={"maxiter": 1000, "ftol": _FTOL, "gtol": 0.0})
    total += int(search.nit)
    if search.nit <= 1:
      break
    start = search.x
  search.nit = total
  return search


def optimize_banded_inverse_taps(a_column: np.ndarray, bands: int, schema):
  """BandInvMF's taps h (h_0 = 1) of the Toeplitz C⁻¹ and a record of the search.

  L-BFGS-B (restarted until it stalls) on log rmse² over the b − 1 free taps with the
  closed-form gradient (``banded_inverse_value_and_gradient``), from BISR's taps (Kalinin, Lampert et al. 2025,
  arXiv:2505.12128) and from λCGD's; the better end point is kept. The logarithm keeps
  the line search's steps sane near the instability wall of 1/h. No dense matrices.
  """
  a_column = np.asarray(a_column, dtype=np.float64)
  bisr = bisr_taps(a_column, bands)
  bisr = bisr[1:] / bisr[0]
  if bisr.shape[0] == 0:  # one band: C = I
    return np.ones(1), {"optimizer": "none (one band: C = I)"}
  lam = float(optimal_lambda(a_column, schema).x)
  starts = {"bisr": bisr, "lambda_cgd": np.concatenate([[-lam], np.zeros(bisr.shape[0] - 1)])}
  best = None
  for name, start in starts.items():
    if best is not None and best[1].fun <= np.log(banded_inverse_objective(start, a_column,
                                                                           schema)):
      continue  # already better than this start: no worse than BISR and λCGD either way
    search = _lbfgs_with_restarts(start, a_column, schema)
    if best is None or search.fun < best[1].fun:
      best = (name, search)
  name, search = best
  optimizer = "L-BFGS-B"
  if not search.success and search.x.shape[0] <= _POLISH_MAX_FREE_TAPS:
    # The line search failed at a kink of the majorant's sensitivity: a derivative-free
    # simplex from there still finds descent (few taps only: its cost grows with their number).
    polish = scipy.optimize.minimize(
        lambda x: _log_value_and_gradient(x, a_column, schema)[0], search.x,
        method="Nelder-Mead", options={"maxfev": 500 * search.x.shape[0], "xatol": 1e-10,
                                       "fatol": 1e-14})
    if polish.fun < search.fun:
      search.x, search.fun, optimizer = polish.x, polish.fun, "L-BFGS-B, then Nelder-Mead"
  if search.x.shape[0] <= _POLISH_MAX_FREE_TAPS and bound_value(search.x, a_column, schema) < \
      np.exp(search.fun) * (1 - 1e-12):
    # C's coefficients are not non-increasing and the row bound is tighter than the majorant's:
    # a short simplex on the rmse² under the smaller of the two bounds.
    polish = scipy.optimize.minimize(
        lambda x: np.log(bound_value(x, a_column, schema)), search.x, method="Nelder-Mead",
        options={"maxfev": 40 * search.x.shape[0], "xatol": 1e-10, "fatol": 1e-14})
    if polish.fun < np.log(bound_value(search.x, a_column, schema)):
      search.x, optimizer = polish.x, optimizer + ", then Nelder-Mead on the tighter bound"
  bisr_value = banded_inverse_objective(bisr, a_column, schema)
  return np.concatenate([[1.0], search.x]), {
      "optimizer": optimizer, "start": name, "iterations": int(search.nit),
      "converged": bool(search.success), "solver_message": str(search.message),
      "rmse_improvement_over_bisr": float(np.sqrt(bisr_value / np.exp(search.fun)))}


def factorize_banded_inverse(a: np.ndarray, bands: int, schema) -> FamilyResult:
  """BandInvMF: the b Toeplitz taps of C⁻¹ minimizing the rmse under the schema
  (``optimize_banded_inverse_taps``). Only for Toeplitz workloads (prefix sums, momentum
  with a constant learning rate).
  """
  column = toeplitz_column(a)
  if column is None:
    raise checks.CheckError("banded_inverse optimizes Toeplitz workloads (prefix sums, momentum "
                            "with a constant learning rate); use bisr for a learning-rate "
                            "schedule")
  n = a.shape[0]
  taps, info = optimize_banded_inverse_taps(column, bands, schema)
  h_rows = np.tile(taps, (n, 1))
  for k in range(min(bands, n)):
    h_rows[:k, k] = 0.0
  return _inverse_banded(a, h_rows, dict(info, family="square_root", form="banded_inverse"))


def factorize(a: np.ndarray, spec, context) -> FamilyResult:
  del context
  if spec.strategy == "bsr":
    return factorize_bsr(a, spec.bands)
  if spec.strategy == "bisr":
    return factorize_bisr(a, spec.bands)
  if spec.strategy == "banded_inverse":
    return factorize_banded_inverse(a, spec.bands, spec.participation)
  return factorize_lambda_cgd(a, spec.participation)


def _inverse_taps(a_column: np.ndarray, spec):
  """(the taps h, h_0 ≠ 0, of the Toeplitz C⁻¹, info) of BISR, BandInvMF or λCGD for the
  Toeplitz workload with first column ``a_column``: what their dense paths compute."""
  if spec.strategy == "bisr":
    return bisr_taps(a_column, spec.bands), {"family": "square_root", "form": "bisr",
                                             "toeplitz_workload": True}
  if spec.strategy == "banded_inverse":
    taps, info = optimize_banded_inverse_taps(a_column, spec.bands, spec.participation)
    return taps, dict(info, family="square_root", form="banded_inverse")
  search = optimal_lambda(a_column, spec.participation)
  lam = float(search.x)
  return np.array([1.0, -lam]), {"family": "square_root", "form": "lambda_cgd", "lambda": lam,
                                 "lambda_search_evaluations": int(search.nfev)}


def factorize_toeplitz(a_column: np.ndarray, spec, context) -> families.ToeplitzFamilyResult:
  """``factorize`` for the Toeplitz workload with first column ``a_column``: the first
  columns of C and of B = A·C⁻¹ (module docstring), never an n x n matrix."""
  del context
  n = a_column.shape[0]
  if spec.strategy == "bsr":
    coeffs = series_sqrt(np.asarray(a_column[:min(spec.bands, n)], dtype=np.float64))
    c_column = toeplitz_bounds.padded(coeffs, n)
    h = toeplitz_ops.inverse_column(coeffs, n)
    info = {"family": "square_root", "form": "bsr", "toeplitz_workload": True}
    extras = {"toeplitz_coefficients": coeffs}
  else:
    taps, info = _inverse_taps(a_column, spec)
    c_column, h = toeplitz_ops.inverse_column(taps, n), toeplitz_bounds.padded(taps, n)
    extras = {"inverse_taps": taps}
  b_column = toeplitz_ops.workload_operator(n, a_column).apply(h)
  return families.ToeplitzFamilyResult(b_column=b_column, c_column=c_column, info=info,
                                       extras=extras)


# ----------------------------------------------------------------------------- streams


def fir_stream(h_rows: np.ndarray, name: str = "banded C⁻¹ (FIR)",
               n: Optional[int] = None) -> streams.LinearStream:
  """y_i = Σ_{j<b} C⁻¹[i, i−j]·Z[i−j], keeping the last b − 1 rows of Z (newest first);
  ``h_rows`` [n, b], or one row [1, b] of Toeplitz taps for ``n`` rounds."""
  h = checks.real_array(h_rows, f"{name}: taps")
  rows, bands = h.shape
  n = rows if n is None else n
  k = bands - 1
  table = h[-1:] if constant_taps(h) else h
  t = table.shape[0]
  if k == 0:
    return streams.LinearStream(n=n, copies=np.zeros(0, np.int64), f=np.zeros((t, 0, 0)),
                                g=np.zeros((t, 0)), w_old=np.zeros((t, 0)),
                                w_new=np.zeros((t, 0)), c=table[:, 0], name=name)
  copies = np.concatenate([[-1], np.arange(k - 1)]).astype(np.int64)
  g = np.zeros((t, k))
  g[:, 0] = 1.0
  # Before round k the missing older rows of Z are zero, so Toeplitz taps are valid there too.
  return streams.LinearStream(n=n, copies=copies, f=np.zeros((t, k, k)), g=g,
                              w_old=table[:, 1:].copy(), w_new=np.zeros((t, k)),
                              c=table[:, 0].copy(), name=name)


def stream(extras: Dict[str, np.ndarray], a: np.ndarray) -> streams.LinearStream:
  """The stream of the unnormalized C⁻¹: banded C (BSR) or banded C⁻¹ (BISR, λCGD); for a
  Toeplitz workload, banded Toeplitz C (BSR) or the FIR filter of C⁻¹'s taps (``a``: n)."""
  if "toeplitz_coefficients" in extras:
    return toeplitz.stream(extras, a)
  if "inverse_taps" in extras:
    return fir_stream(_checked_taps(extras)[None, :], n=toeplitz_ops.rounds_of(a))
  if "banded_coefficients" in extras:
    return banded.stream(extras, a, name="BSR: banded C⁻¹")
  if "inverse_band_coefficients" not in extras:
    raise checks.CheckError("square-root factorization: stored parameters lack its bands")
  return fir_stream(extras["inverse_band_coefficients"])


def check_extras(f) -> None:
  """The stored bands, with the stored γ, rebuild the normalized C (BSR) or C⁻¹ (BISR, λCGD);
  for first columns, the stored coefficients (BSR) or taps rebuild C's first column."""
  gamma = float(np.asarray(f.extras["normalization"])[0])
  if "toeplitz_coefficients" in f.extras:
    toeplitz.check_extras(f)
    return
  if "inverse_taps" in f.extras:
    if not isinstance(f, toeplitz_factorization.ToeplitzFactorization):
      raise checks.CheckError("C⁻¹'s taps describe a Toeplitz C held as first columns")
    c = f.columns["C_column"]
    err = float(np.max(np.abs(toeplitz_ops.inverse_column(_checked_taps(f.extras), f.n)
                              / gamma - c)))
    if err > 1e-12 * max(1.0, float(np.max(np.abs(c)))):
      raise checks.CheckError(f"stored C⁻¹ taps do not rebuild C (error {err:.3g})")
    return
  if "banded_coefficients" in f.extras:
    banded.check_extras(f)
    return
  c_inv = banded.banded_matrix(checks.real_array(f.extras["inverse_band_coefficients"],
                                                 "inverse band coefficients")) * gamma
  err = float(np.max(np.abs(c_inv @ f.c - np.eye(f.c.shape[0]))))
  if err > 1e-9:
    raise checks.CheckError(f"stored C⁻¹ bands do not invert C (error {err:.3g})")


def _checked_taps(extras: Dict[str, np.ndarray]) -> np.ndarray:
  taps = checks.real_array(extras["inverse_taps"], "C⁻¹ taps")
  if taps.ndim != 1 or taps.shape[0] < 1 or taps[0] == 0:
    raise checks.CheckError(f"C⁻¹ taps must be a 1-D array with a non-zero first tap, got "
                            f"shape {taps.shape}")
  return taps


def noise_column(f) -> Tuple[np.ndarray, int]:
  """(C⁻¹·e_0 of the normalized C from the stored parameters, the order of the recurrence it
  obeys after its first entry): ``toeplitz_factorization.check_noise``. FIR taps: b − 1."""
  if "toeplitz_coefficients" in f.extras:
    return toeplitz.noise_column(f)
  gamma = float(np.asarray(f.extras["normalization"])[0])
  taps = _checked_taps(f.extras)
  return gamma * toeplitz_bounds.padded(taps, f.n), max(0, min(taps.shape[0], f.n) - 1)
