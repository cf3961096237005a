"""Buffered linear Toeplitz (BLT) strategies C (numpy core, no TensorFlow).

A BLT with m buffers is the lower-triangular Toeplitz C with c_0 = 1 and
c_k = Σ_j ω_j·θ_j^{k−1} for k ≥ 1 (Dvijotham, McMahan, Pillutla, Steinke, Thakurta
2024, arXiv:2404.16706, Sec 5): its generating function is the rational function
C(x) = Π_j (1 − θ̂_j x) / Π_j (1 − θ_j x). C⁻¹ has generating function 1/C(x), so it is
again a BLT, with buffer decays θ̂ (the eigenvalues of diag(θ) − 𝟙ωᵀ) and output
scales from the partial-fraction residues (arXiv:2404.16706, Lemma 5.2):

  ω_i = Π_j (θ_i − θ̂_j) / Π_{j≠i} (θ_i − θ_j),   ω̂_i = Π_j (θ̂_i − θ_j) / Π_{j≠i} (θ̂_i − θ̂_j).

The noise C⁻¹·Z streams with m model-sized buffers: s_i = diag(θ̂)·s_{i−1} + Z[i],
y_i = Z[i] + ω̂ᵀ·s_{i−1}.

Optimization (McMahan, Xu, Zhang 2024, "A Hassle-free Algorithm for Private Learning in
Practice: Don't Use Tree Aggregation, Use BLTs", arXiv:2408.08868) is over the pair
(θ, θ̂) kept strictly interlaced, 0 < θ̂_1 < θ_1 < θ̂_2 < θ_2 < … < θ̂_m < θ_m < 1,
through unconstrained log-gaps of 1 − θ. Interlacing gives ω > 0 and ω̂ < 0, and then
c is positive and non-increasing (c_k − c_{k+1} = Σ_j ω_j θ_j^{k−1}(1 − θ_j) > 0 and
c_1 = Σ_j (θ_j − θ̂_j) < 1), the condition under which the min-sep sensitivity of
``toeplitz_bounds.min_sep_sensitivity`` is exact; it is the class of well-behaved BLTs of
McMahan & Pillutla 2025, arXiv:2504.21413, Thm 1. Each evaluation costs O(n·m) for
Toeplitz workloads (the coefficients of C and C⁻¹, then the Toeplitz-workload path of
``tff_mf.factorization.toeplitz_ops``).
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Any, Dict, Optional, Sequence, Tuple

import numpy as np

from tff_mf import checks
from tff_mf.factorization import families
from tff_mf.factorization import lbfgs
from tff_mf import participation
from tff_mf.noise import streams
from tff_mf.factorization import toeplitz_factorization
from tff_mf.factorization import toeplitz_ops
from tff_mf.participation import toeplitz_bounds

LOG_GAP_BOUNDS = (-30.0, math.log(20.0))
EXTRAS = ("blt_theta", "blt_omega", "blt_inverse_theta", "blt_inverse_omega")


@dataclasses.dataclass(frozen=True)
class BLT:
  """c_0 = 1, c_k = Σ_j omega_j·theta_j^{k−1} (k ≥ 1); m = len(theta) buffers."""
  theta: np.ndarray
  omega: np.ndarray

  def __post_init__(self):
    theta = checks.real_array(self.theta, "BLT buffer decays θ").reshape(-1)
    omega = checks.real_array(self.omega, "BLT output scales ω").reshape(-1)
    if theta.shape != omega.shape:
      raise checks.CheckError(f"BLT θ and ω differ in length: {theta.shape[0]} vs "
                              f"{omega.shape[0]}")
    object.__setattr__(self, "theta", theta)
    object.__setattr__(self, "omega", omega)

  @property
  def buffers(self) -> int:
    return int(self.theta.shape[0])

  def coefficients(self, n: int) -> np.ndarray:
    return coefficients(self.theta, self.omega, n)

  def inverse(self) -> "BLT":
    return BLT(*inverse(self.theta, self.omega))

  def matrix(self, n: int) -> np.ndarray:
    """The dense n x n C."""
    return toeplitz_ops.lower_toeplitz(self.coefficients(n))


def coefficients(theta, omega, n: int) -> np.ndarray:
  """The n Toeplitz coefficients c_0 = 1, c_k = Σ_j ω_j θ_j^{k−1} (O(n·m))."""
  n = checks.positive_int(n, "n")
  theta = np.asarray(theta, dtype=np.float64).reshape(-1)
  omega = np.asarray(omega, dtype=np.float64).reshape(-1)
  out = np.zeros(n)
  out[0] = 1.0
  if n > 1 and theta.size:
    powers = np.power(theta[None, :], np.arange(n - 1, dtype=np.float64)[:, None])
    out[1:] = powers @ omega
  return out


def output_scales(theta, theta_hat) -> np.ndarray:
  """ω of the BLT whose generating function is Π(1 − θ̂_j x)/Π(1 − θ_j x) (Lemma 5.2 of
  arXiv:2404.16706): ω_i = Π_j (θ_i − θ̂_j) / Π_{j≠i} (θ_i − θ_j)."""
  theta = np.asarray(theta, dtype=np.float64).reshape(-1)
  theta_hat = np.asarray(theta_hat, dtype=np.float64).reshape(-1)
  diff = theta[:, None] - theta[None, :]
  np.fill_diagonal(diff, 1.0)
  if np.any(diff == 0):
    raise checks.CheckError("BLT buffer decays must be distinct")
  return np.prod(theta[:, None] - theta_hat[None, :], axis=1) / np.prod(diff, axis=1)


def from_theta_pair(theta, theta_hat) -> Tuple[BLT, BLT]:
  """(C, C⁻¹) as BLTs from the buffer decays θ of C and θ̂ of C⁻¹."""
  return (BLT(theta, output_scales(theta, theta_hat)),
          BLT(theta_hat, output_scales(theta_hat, theta)))


def inverse(theta, omega) -> Tuple[np.ndarray, np.ndarray]:
  """(θ̂, ω̂) of C⁻¹ for the BLT C = (θ, ω); the same map takes C⁻¹ back to C.

  θ̂ are the eigenvalues of diag(θ) − 𝟙ωᵀ (the roots of 1 + Σ_j ω_j/(λ − θ_j)); for ω > 0
  and distinct θ they are real and interlace with θ. ω̂ then follows from
  ``output_scales`` (arXiv:2404.16706, Lemma 5.2).
  """
  blt = BLT(theta, omega)
  m = blt.buffers
  if m == 0:
    return np.zeros(0), np.zeros(0)
  evals = np.linalg.eigvals(np.diag(blt.theta) - np.outer(np.ones(m), blt.omega))
  scale = max(1.0, float(np.max(np.abs(blt.theta))))
  if np.max(np.abs(evals.imag)) > 1e-9 * scale:
    raise checks.CheckError("this BLT's inverse has complex buffer decays (not a real BLT)")
  theta_hat = np.sort(evals.real)[::-1]
  gaps = np.abs(theta_hat[:, None] - blt.theta[None, :])
  if np.min(gaps) == 0 or (m > 1 and np.min(np.abs(np.diff(theta_hat))) == 0):
    raise checks.CheckError("BLT inverse: repeated buffer decays (degenerate BLT)")
  return theta_hat, output_scales(theta_hat, blt.theta)


def sensitivity(blt: BLT, n: int, min_sep: Optional[int] = None,
                max_participations: Optional[int] = None) -> float:
  """Sensitivity of C under b-min-sep (single participation when min_sep is None).

  The worst pattern is rounds 0, min_sep, 2·min_sep, … when the coefficients are
  non-negative and non-increasing (always so for interlaced θ̂ < θ); otherwise a valid
  upper bound (``toeplitz_bounds.min_sep_sensitivity``).
  """
  return toeplitz_bounds.min_sep_sensitivity(blt.coefficients(n), n, min_sep, max_participations)


def evaluate(blt: BLT, n: int, workload=None, min_sep: Optional[int] = None,
             max_participations: Optional[int] = None) -> Dict[str, Any]:
  """rmse, max_error and sensitivity of the BLT C (O(n·m) for Toeplitz A)."""
  work = toeplitz_ops.workload_operator(n, workload)
  c = blt.coefficients(n)
  sens = toeplitz_bounds.min_sep_sensitivity(c, n, min_sep, max_participations)
  out = toeplitz_ops.evaluate_inverse_column(blt.inverse().coefficients(n), sens, work)
  out["sensitivity_exact"] = toeplitz_bounds.sensitivity_is_exact(c, n, min_sep, max_participations)
  return out


# ----------------------------------------------------------------------------- optimization


def _points(y: np.ndarray) -> np.ndarray:
  """e_i = 1 − u_i for the interlaced points u (decreasing e), from log-gaps y."""
  return np.exp(-np.cumsum(np.exp(y)))


def _log_gaps(e: np.ndarray) -> np.ndarray:
  s = np.log(e)
  return np.log(-np.diff(np.concatenate([[0.0], s])))


def _scales_and_grad_factors(e_num: np.ndarray, e_den: np.ndarray):
  """ω for decays θ = 1 − e_den and inverse decays 1 − e_num, with d log ω / d e.

  ω_i = Π_j (e_num_j − e_den_i) / Π_{j≠i} (e_den_j − e_den_i).
  """
  d_num = e_num[None, :] - e_den[:, None]  # [i, j]
  d_den = e_den[None, :] - e_den[:, None]
  np.fill_diagonal(d_den, 1.0)
  omega = np.prod(d_num, axis=1) / np.prod(d_den, axis=1)
  inv_num = 1.0 / d_num
  inv_den = 1.0 / d_den
  np.fill_diagonal(inv_den, 0.0)
  # ∂ log ω_i / ∂ e_num_j = 1/d_num[i, j]; ∂/∂ e_den_l (l ≠ i) = −1/d_den[i, l];
  # ∂/∂ e_den_i = −Σ_j 1/d_num[i, j] + Σ_{l≠i} 1/d_den[i, l].
  self_term = -np.sum(inv_num, axis=1) + np.sum(inv_den, axis=1)
  return omega, inv_num, inv_den, self_term


class _Objective:
  """sens(c)²·E(ĉ)/scale over interlaced (θ̂, θ), O(n·m) per call for Toeplitz A."""

  def __init__(self, work: toeplitz_ops.Workload, n: int, m: int, error: str, min_sep: int,
               k: int):
    self.work, self.n, self.m, self.error = work, n, m, error
    self.min_sep, self.k = min_sep, k
    self.scale = float(n) if error == "mean" else 1.0
    self.exponents = np.arange(max(n - 1, 0), dtype=np.float64)
    self.evaluations = 0

  def pair(self, y: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """(e_hat, e) = (1 − θ̂, 1 − θ) from the log-gaps y."""
    e = _points(y)
    return e[0::2], e[1::2]

  def _coefficients(self, omega, e):
    """c_k for k ≥ 1 with the power table reused by the adjoint."""
    log_theta = np.log1p(-e)
    powers = np.exp(self.exponents[:, None] * log_theta[None, :])  # [k−1, j]
    c = np.ones(self.n)
    c[1:] = powers @ omega
    return c, powers

  def _coeff_adjoint(self, g_coef, powers, omega, e):
    """(dL/dω, direct dL/de) through c_k = Σ_j ω_j (1 − e_j)^{k−1}, k ≥ 1."""
    g_omega = g_coef[1:] @ powers
    g_e = -omega * ((g_coef[1:] * self.exponents) @ powers) / (1.0 - e)
    return g_omega, g_e

  def value_and_grad(self, y: np.ndarray) -> Tuple[float, np.ndarray]:
    self.evaluations += 1
    m = self.m
    e_hat, e = self.pair(y)
    omega, in_c, id_c, self_c = _scales_and_grad_factors(e_hat, e)
    omega_hat, in_i, id_i, self_i = _scales_and_grad_factors(e, e_hat)
    c, p_c = self._coefficients(omega, e)
    c_hat, p_i = self._coefficients(omega_hat, e_hat)
    err, g_chat = self.work.loss_and_grad(c_hat, self.error)
    v = toeplitz_bounds.minsep_vector(c, self.min_sep, self.k)
    s = float(np.dot(v, v))
    g_c = 2.0 * toeplitz_bounds.minsep_vector_adjoint(v, self.min_sep, self.k)
    value = s * err / self.scale
    g_c *= err / self.scale
    g_chat *= s / self.scale

    g_omega, ge = self._coeff_adjoint(g_c, p_c, omega, e)
    g_omega_hat, ge_hat = self._coeff_adjoint(g_chat, p_i, omega_hat, e_hat)
    # ω has numerator points e_hat and denominator points e; ω̂ the reverse.
    a = g_omega * omega
    ge_hat += a @ in_c
    ge += -(a @ id_c) + a * self_c
    a = g_omega_hat * omega_hat
    ge += a @ in_i
    ge_hat += -(a @ id_i) + a * self_i
    g_points = np.empty(2 * m)
    g_points[0::2], g_points[1::2] = ge_hat, ge
    # e_i = exp(s_i), s_i = −Σ_{t≤i} exp(y_t)
    g_s = g_points * _points(y)
    g_y = -np.exp(y) * np.cumsum(g_s[::-1])[::-1]
    return value, g_y


def _prune(points: np.ndarray, rtol: float = 1e-12) -> np.ndarray:
  """Drops adjacent (θ̂, θ) points that (nearly) coincide: a pole cancelling a zero.

  Removing u_i ≈ u_{i+1} keeps the sequence alternating and changes the coefficients by
  at most (u_{i+1} − u_i)/(1 − u_{i+1}) ≤ rtol in total (a buffer the optimizer turned off).
  Points whose decays θ = 1 − e coincide in float64 (e below the rounding of 1, where the
  optimizer may push a pole and its zero together) are such a pair as well: kept, they
  would make the buffer decays equal.
  """
  points = np.asarray(points, dtype=np.float64)
  while points.size:
    with np.errstate(divide="ignore", invalid="ignore"):
      rel = -np.diff(points) / points[:-1]
    rel[~np.isfinite(rel) | ((1.0 - points[:-1]) == (1.0 - points[1:]))] = 0.0
    i = int(np.argmin(rel))
    if rel[i] > rtol:
      break
    points = np.delete(points, [i, i + 1])
  return points


def initial_points(n: int, m: int, smallest: Optional[float] = None) -> np.ndarray:
  """Interlaced 1 − θ̂_1 > 1 − θ_1 > … > 1 − θ_m on a geometric grid from 0.5 down to
  ``smallest`` (default 1/n).

  A geometric grid with zeros midway between poles approximates the generating function
  (1 − x)^{−1/2} of the square-root factorization (cf. arXiv:2404.16706, Sec 4).
  """
  smallest = 1.0 / max(n, 4) if smallest is None else smallest
  return np.exp(np.linspace(math.log(0.5), math.log(min(smallest, 0.25)), 2 * m))


def _start_points(n: int, m: int, starts: int) -> list:
  """Geometric grids ending at 1/n, 4/n, 16/n, …: several starts against local minima."""
  return [initial_points(n, m, 4.0 ** s / n) for s in range(starts)]


def _insert_pair(points: np.ndarray, n: int) -> np.ndarray:
  """A start for m + 1 buffers: the m-buffer points plus two in the widest log gap."""
  ends = np.concatenate([[0.9], points, [0.25 / n]])
  logs = np.log(ends)
  i = int(np.argmax(logs[:-1] - logs[1:]))
  new = np.exp(logs[i] + (logs[i + 1] - logs[i]) * np.array([1 / 3, 2 / 3]))
  return np.concatenate([points[:i], new, points[i:]])


def _interlaced_points(init: BLT, m: int) -> np.ndarray:
  if init.buffers != m:
    raise checks.CheckError(f"initial BLT has {init.buffers} buffers, expected {m}")
  theta_hat, _ = inverse(init.theta, init.omega)
  u = np.empty(2 * m)
  u[0::2], u[1::2] = np.sort(theta_hat), np.sort(init.theta)
  if not (u[0] > 0 and u[-1] < 1 and np.all(np.diff(u) > 0)):
    raise checks.CheckError("initial BLT must have interlaced decays 0 < θ̂_1 < θ_1 < … "
                            "< θ_m < 1")
  return 1.0 - u


def _minimize(objective: _Objective, points: np.ndarray, max_iterations: int,
              tolerance: float):
  """L-BFGS-B from one start; (objective value, final points, scipy result)."""
  y0 = _log_gaps(points)
  # Log-gaps in [e^−30, 20]: adjacent points stay distinct (a collapsed pair is pruned
  # afterwards) and 1 − θ stays far above underflow.
  y0 = np.clip(y0, LOG_GAP_BOUNDS[0], LOG_GAP_BOUNDS[1])
  value0, _ = objective.value_and_grad(y0)
  if not math.isfinite(value0) or value0 <= 0:
    return math.inf, points, None

  def fun(y):
    value, grad = objective.value_and_grad(y)
    if not math.isfinite(value):
      return 1e30, np.zeros_like(y)
    return value / value0, grad / value0
  res = lbfgs.minimize(fun, y0, [LOG_GAP_BOUNDS] * y0.size, max_iterations, tolerance)
  return float(res.fun) * value0, _points(res.x), res


def optimize(n: int, buffers: int = 4, *, min_sep: Optional[int] = None,
             max_participations: Optional[int] = None, error: str = "mean",
             workload=None, init: Optional[BLT] = None, starts: int = 4,
             max_iterations: int = 2000, tolerance: float = 1e-12, dense: bool = True,
             extra_starts: Sequence[np.ndarray] = ()) -> toeplitz_ops.Result:
  """BLT C with m = ``buffers`` buffers minimizing rmse² (or max_error²) under min-sep.

  rmse² = sens²·‖A·C⁻¹‖_F²/n, max_error² = sens²·max_i ‖(A·C⁻¹)[i, :]‖², sens under
  b-min-sep with ≤ k participations (single participation when min_sep is None),
  minimized by L-BFGS over interlaced (θ̂, θ) (McMahan, Xu, Zhang 2024, arXiv:2408.08868)
  from ``starts`` geometric initial grids (the objective has local minima under
  multiple participations) or from ``init`` alone, plus ``extra_starts`` (interlaced
  points 1 − u, decreasing); the best result is kept. ``workload``: None (prefix sum),
  a Toeplitz first column, or a lower-triangular A. The reported sensitivity is
  recomputed from the final coefficients. B = A·C⁻¹ and C are dense only when
  ``dense``; extras hold θ, ω, θ̂, ω̂.
  """
  start = time.perf_counter()
  n = checks.positive_int(n, "n")
  m = checks.nonnegative_int(buffers, "buffers")
  starts = checks.positive_int(starts, "starts")
  toeplitz_ops.check_error(error)
  ms, k = toeplitz_bounds.participations(n, min_sep, max_participations)
  work = toeplitz_ops.workload_operator(n, workload)
  iterations, converged, message, evaluations, gradient = 0, True, "no buffers: C = I", 0, 0.0
  if m == 0:
    blt = inv = BLT(np.zeros(0), np.zeros(0))
  else:
    objective = _Objective(work, n, m, error, ms, k)
    candidates = [_interlaced_points(init, m)] if init is not None else \
        _start_points(n, m, starts)
    candidates += [np.asarray(p, dtype=np.float64) for p in extra_starts]
    unpruned, res, iterations = _best_of_starts(objective, candidates, m, max_iterations,
                                                tolerance)
    points = _prune(unpruned)
    blt, inv = from_theta_pair(1.0 - points[1::2], 1.0 - points[0::2])
    message, gradient, converged = lbfgs.outcome(res, [LOG_GAP_BOUNDS] * (2 * m))
    evaluations = objective.evaluations
  extras = {"blt_theta": blt.theta.copy(), "blt_omega": blt.omega.copy(),
            "blt_inverse_theta": inv.theta.copy(), "blt_inverse_omega": inv.omega.copy()}
  result = toeplitz_ops.result_from_coefficients(
      blt.coefficients(n), inv.coefficients(n), work, error=error, min_sep=min_sep,
      max_participations=max_participations, k=k,
      family_info={"family": "blt", "n": n, "buffers": blt.buffers, "buffers_requested": m},
      fit={"iterations": iterations, "evaluations": evaluations, "converged": converged,
           "message": message, "gradient_norm": gradient},
      dense=dense, what="BLT", start=start, extras=extras)
  if blt.buffers < m:
    result.info.update(_fewer_buffers(unpruned, m, result.info, n, work, min_sep,
                                      max_participations))
  return result


def _fewer_buffers(unpruned: np.ndarray, m: int, info: Dict[str, Any], n: int, work,
                   min_sep: Optional[int], max_participations: Optional[int]) -> Dict[str, Any]:
  """Why the best m-buffer BLT is returned with fewer buffers, with both rmses.

  ``unpruned`` are the optimizer's 2m interlaced points before ``_prune`` dropped the pairs
  θ̂_j ≈ θ_j it drove together (a pole cancelling a zero: a buffer switched off).
  """
  try:
    full, full_inv = from_theta_pair(1.0 - unpruned[1::2], 1.0 - unpruned[0::2])
    sens = toeplitz_bounds.min_sep_sensitivity(full.coefficients(n), n, min_sep, max_participations)
    rmse_requested = float(toeplitz_ops.evaluate_inverse_column(
        full_inv.coefficients(n), sens, work)["rmse"])
  except checks.CheckError:  # decays equal in float64: no distinct m-buffer BLT to evaluate
    rmse_requested = None
  returned = info["buffers"]
  at_m = "n/a (its cancelled decays coincide in float64)" if rmse_requested is None else \
      f"{rmse_requested:.10g}"
  return {"rmse_at_buffers_requested": rmse_requested,
          "returned_why": f"the best {m}-buffer BLT found switches {m - returned} buffer(s) off "
                          f"(a decay pair θ̂ = θ cancels): rmse {at_m} with {m} buffers, "
                          f"{info['rmse']:.10g} with {returned}; fewer buffers keep the error "
                          f"and need less state"}


def _best_of_starts(objective: _Objective, candidates, m: int, max_iterations: int,
                    tolerance: float):
  """(points, scipy result, total L-BFGS iterations) of the best start (points unpruned).

  Several starts are screened with a loose tolerance; the best one is then polished.
  """
  best = None
  iterations = 0
  screen = len(candidates) > 1
  for points0 in candidates:
    if points0.shape != (2 * m,):
      raise checks.CheckError(f"a start needs {2 * m} interlaced points, got {points0.shape}")
    value, points, res = _minimize(objective, points0,
                                   min(max_iterations, 300) if screen else max_iterations,
                                   max(tolerance, 1e-9) if screen else tolerance)
    if res is not None:
      iterations += int(res.nit)
      if best is None or value < best[0]:
        best = (value, points, res)
  if best is None:
    raise checks.CheckError("every initial BLT gives a non-finite objective")
  if screen:
    value, points, res = _minimize(objective, best[1], max_iterations, tolerance)
    iterations += int(res.nit) if res is not None else 0
    if res is not None and value <= best[0]:
      best = (value, points, res)
  return best[1], best[2], iterations


# ----------------------------------------------------------------------------- streaming


def _inverse_from(params) -> BLT:
  if isinstance(params, BLT):
    return params.inverse() if params.buffers else params
  if isinstance(params, dict):
    missing = [key for key in EXTRAS if key not in params]
    if missing:
      raise checks.CheckError(f"stored BLT parameters lack {', '.join(missing)}")
    return BLT(params["blt_inverse_theta"], params["blt_inverse_omega"])
  raise checks.CheckError(f"BLT stream needs a BLT or its stored parameters, got "
                          f"{type(params).__name__}")


def stream(params, n) -> streams.LinearStream:
  """C⁻¹·Z as a LinearStream with m computed state rows (the buffers).

  With C⁻¹ = (θ̂, ω̂): s_i = diag(θ̂)·s_{i−1} + Z[i] and y_i = Z[i] + ω̂ᵀ·s_{i−1}
  (Dvijotham et al. 2024, arXiv:2404.16706, Sec 5). ``params``: a BLT for C or the stored
  extras; ``n``: the rounds (or the workload A, whose size is used).
  """
  inv = _inverse_from(params)
  n = toeplitz_ops.rounds_of(n)
  m = inv.buffers
  if m and not np.max(np.abs(inv.theta)) < 1.0:
    raise checks.CheckError(f"BLT C⁻¹ has a buffer decay of modulus ≥ 1 "
                            f"({np.max(np.abs(inv.theta)):.6g}): its noise stream diverges")
  return streams.LinearStream(
      n=n, copies=-np.ones(m, np.int64), f=np.diag(inv.theta)[None, :, :],
      g=np.ones((1, m)), w_old=inv.omega[None, :].copy(), w_new=np.zeros((1, m)),
      c=np.ones(1), name=f"BLT C⁻¹ ({m} buffers)")


def optimize_buffers(n: int, max_buffers: int = 8, rtol: float = 1.01,
                     **kwargs) -> toeplitz_ops.Result:
  """``optimize`` with m = 1, 2, … buffers, stopping when one more buffer improves the
  objective by less than the factor ``rtol`` (or at ``max_buffers``); the best result.

  kwargs go to ``optimize`` (min_sep, max_participations, error, workload, dense, …).
  """
  max_buffers = checks.positive_int(max_buffers, "max_buffers")
  rtol = checks.finite_float(rtol, "rtol")
  dense = kwargs.pop("dense", True)
  start = time.perf_counter()
  best, tried = None, []
  for m in range(1, max_buffers + 1):
    extra = ()
    if best is not None and best.info["buffers"] == m - 1:
      previous = np.empty(2 * (m - 1))
      previous[0::2] = 1.0 - best.extras["blt_inverse_theta"]
      previous[1::2] = 1.0 - best.extras["blt_theta"]
      extra = (_insert_pair(np.sort(previous)[::-1], n),)
    result = optimize(n, m, dense=False, extra_starts=extra, **kwargs)
    tried.append({"buffers": m, "objective": result.info["objective"]})
    if best is not None and result.info["objective"] * rtol >= best.info["objective"]:
      if result.info["objective"] < best.info["objective"]:
        best = result
      break
    best = result
  if dense:  # rebuild the dense factors from the chosen BLT (it is its own optimum)
    best = optimize(n, best.info["buffers"], dense=True,
                    init=BLT(best.extras["blt_theta"], best.extras["blt_omega"]), **kwargs)
  best.info["buffers_tried"] = tried
  best.info["seconds"] = time.perf_counter() - start
  return best


# ----------------------------------------------------------------------------- family interface

# Bumped whenever the output for the same inputs changes (part of the cache key).
VERSION = "1"
DEFAULT_BUFFERS = 4

STRATEGIES = {"blt": families.Declaration(
    parameters=("buffers", "error"), defaults=lambda n, schema: {"buffers": DEFAULT_BUFFERS},
    participations=participation.KINDS, schema_dependent=True, peak_matrices=6, streams=True,
    check_spec=lambda spec: checks.positive_int(spec.buffers, "blt buffers m"))}


def factorize(a: np.ndarray, spec, context):
  """The optimized BLT C with ``spec.buffers`` buffers for A under the spec's schema."""
  from tff_mf.factorization.families import FamilyResult  # pylint: disable=g-import-not-at-top
  del context
  min_sep, k = toeplitz_bounds.schema_arguments(spec.participation, a.shape[0])
  result = optimize(a.shape[0], spec.buffers, min_sep=min_sep, max_participations=k,
                    error=spec.error, workload=a)
  return FamilyResult(b=result.b, c=result.c, info=dict(result.info), extras=dict(result.extras))


def factorize_toeplitz(a_column: np.ndarray, spec, context):
  """``factorize`` for the Toeplitz workload with first column ``a_column``: the same
  optimization, returning first columns only (O(n·m) memory)."""
  del context
  return families.toeplitz_family_result(optimize, spec.buffers, a_column, spec)


def check_extras(f) -> None:
  """(θ, ω), divided by the stored γ, rebuild the normalized C, and (θ̂, ω̂) is its inverse."""
  gamma = float(np.asarray(f.extras["normalization"])[0])
  blt = BLT(f.extras["blt_theta"], f.extras["blt_omega"])
  if isinstance(f, toeplitz_factorization.ToeplitzFactorization):
    # First columns: C's here; C⁻¹'s by ``noise_column`` and ``check_noise`` (the cache).
    c = f.columns["C_column"]
    err = float(np.max(np.abs(blt.coefficients(f.n) / gamma - c)))
    if err > 1e-10 * max(1.0, float(np.max(np.abs(c)))):
      raise checks.CheckError(f"BLT parameters do not rebuild C (error {err:.3g})")
    return
  scale = max(1.0, float(np.max(np.abs(f.c))))
  err = float(np.max(np.abs(blt.matrix(f.n) / gamma - f.c)))
  if err > 1e-10 * scale:
    raise checks.CheckError(f"BLT parameters do not rebuild C (error {err:.3g})")
  inv = BLT(f.extras["blt_inverse_theta"], f.extras["blt_inverse_omega"])
  err = float(np.max(np.abs(inv.matrix(f.n) @ blt.matrix(f.n) - np.eye(f.n))))
  if err > 1e-8:
    raise checks.CheckError(f"stored BLT inverse is not C⁻¹ (error {err:.3g})")


def noise_column(f) -> Tuple[np.ndarray, int]:
  """(C⁻¹·e_0 of the normalized C from the stored (θ̂, ω̂), the order m of the recurrence it
  obeys): ``toeplitz_factorization.check_noise``."""
  gamma = float(np.asarray(f.extras["normalization"])[0])
  inv = BLT(f.extras["blt_inverse_theta"], f.extras["blt_inverse_omega"])
  return gamma * inv.coefficients(f.n), inv.buffers
