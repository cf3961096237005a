"""Banded Toeplitz strategies C with optimized coefficients (numpy core, no TensorFlow).

C is n x n lower triangular with C[i, i − k] = f_k for 0 ≤ k < b (f_0 > 0) and zero
elsewhere (McKenna 2024, arXiv:2405.15913; Choquette-Choo et al. 2023,
arXiv:2306.08153, Sec 4). The coefficients f minimize sens(f)²·‖A·C⁻¹‖_F² (mean
error, the default) or sens(f)²·max_i ‖(A·C⁻¹)[i, :]‖² (max error).

The toolkit (workload operators, min-sep sensitivity, evaluation) is ``tff_mf.factorization.toeplitz_ops``;
the L-BFGS-B wrapper is ``tff_mf.factorization.lbfgs``.
"""

from __future__ import annotations

import math
import time
from typing import Optional, Tuple

import numpy as np
import scipy.optimize
import scipy.signal

from tff_mf import checks
from tff_mf.factorization import families
from tff_mf.factorization import lbfgs
from tff_mf import participation
from tff_mf.noise import streams
from tff_mf.factorization import toeplitz_factorization
from tff_mf.factorization import toeplitz_ops
from tff_mf.participation import toeplitz_bounds
from tff_mf.factorization import workloads


class _Objective:
  """sens(f)²·E(f)/scale and its gradient in O(n·b) (Toeplitz A)."""

  def __init__(self, work: toeplitz_ops.Workload, n: int, bands: int, error: str, min_sep: int,
               k: int):
    self.work, self.n, self.bands, self.error = work, n, bands, error
    self.min_sep, self.k = min_sep, k
    self.scale = float(n) if error == "mean" else 1.0
    self.evaluations = 0

  def value_and_grad(self, f: np.ndarray) -> Tuple[float, np.ndarray]:
    self.evaluations += 1
    n, b = self.n, self.bands
    h = toeplitz_ops.inverse_column(f, n)
    if not np.all(np.isfinite(h)) or np.max(np.abs(h)) > 1e150:
      return math.inf, np.zeros(b)
    e, g_h = self.work.loss_and_grad(h, self.error)
    lam = scipy.signal.lfilter([1.0], f, g_h[::-1])[::-1]  # C⁻ᵀ·dE/dh
    g_e = np.array([-np.dot(lam[j:], h[:n - j]) for j in range(b)])
    v = toeplitz_bounds.minsep_vector(toeplitz_bounds.padded(f, n), self.min_sep, self.k)
    s = float(np.dot(v, v))
    g_s = 2.0 * toeplitz_bounds.minsep_vector_adjoint(v, self.min_sep, self.k)[:b]
    value = s * e / self.scale
    return value, (e * g_s + s * g_e) / self.scale


def optimize(n: int, bands: int, *, workload=None, error: str = "mean",
             min_sep: Optional[int] = None, max_participations: Optional[int] = None,
             init=None, max_iterations: int = 10_000, tolerance: float = 1e-12,
             dense: bool = True) -> toeplitz_ops.Result:
  """Optimized b-banded Toeplitz C for the workload A (McKenna 2024, arXiv:2405.15913).

  Minimizes rmse² = sens²·‖A·C⁻¹‖_F²/n (error='mean') or max_error² =
  sens²·max_i ‖(A·C⁻¹)[i, :]‖² (error='max') with scipy's L-BFGS-B and an analytic
  gradient, sens under b-min-sep participation (``toeplitz_bounds.min_sep_sensitivity``; single
  participation when min_sep is None). ``workload``: None (prefix sum S), the first
  column of a Toeplitz A, or a lower-triangular A. When bands > min_sep (and more than
  one participation fits) the coefficients are kept non-negative and non-increasing
  (f_k = Σ_{t≥k} g_t, g ≥ 0), where the min-sep sensitivity is exact; otherwise f_0 = 1
  and f_1..f_{b−1} are free. Returns B = A·C⁻¹ and C unnormalized (f_0 = 1), dense only
  when ``dense``; extras = {"toeplitz_coefficients": f}.
  """
  start = time.perf_counter()
  n = checks.positive_int(n, "n")
  bands = min(checks.positive_int(bands, "bands"), n)
  toeplitz_ops.check_error(error)
  ms, k = toeplitz_bounds.participations(n, min_sep, max_participations)
  work = toeplitz_ops.workload_operator(n, workload)
  monotone = k > 1 and bands > ms
  f0 = _initial_coefficients(init, bands, monotone)
  objective = _Objective(work, n, bands, error, ms, k)
  value0, _ = objective.value_and_grad(f0)
  if not math.isfinite(value0) or value0 <= 0:
    raise checks.CheckError(f"the initial coefficients give a non-finite objective ({value0})")
  to_f, fun, x0, bounds = _parametrization(objective, f0, value0, monotone)
  iterations, converged, message, gradient = 0, True, "one band: C = I", 0.0
  if x0.size:
    res = lbfgs.minimize(fun, x0, bounds, max_iterations, tolerance)
    if max_iterations > 0 and _stalled_at_start(res, bounds):
      res = _restart_without_gradient_steps(fun, x0, bounds, max_iterations, tolerance, res)
    x = res.x
    iterations = int(res.nit)
    message, gradient, converged = lbfgs.outcome(res, bounds)
  else:
    x = x0
  f = to_f(x)
  f = f / f[0]
  return toeplitz_ops.result_from_coefficients(
      f, toeplitz_ops.inverse_column(f, n), work, error=error, min_sep=min_sep,
      max_participations=max_participations, k=k,
      family_info={"family": "banded_toeplitz", "n": n, "bands": bands},
      fit={"iterations": iterations, "evaluations": objective.evaluations,
           "converged": converged, "message": message, "gradient_norm": gradient},
      dense=dense, what="banded Toeplitz", start=start,
      extras={"toeplitz_coefficients": f.copy()})


def _stalled_at_start(res, bounds) -> bool:
  """L-BFGS-B made no decrease from its start (value 1 there: the objective is scaled by its
  start value) although the gradient is not small: its first step left the region where
  C⁻¹ stays bounded and the line search gave up (seen at 2 bands, n ≥ 1024, from √S)."""
  return (not float(res.fun) < 1.0 - 1e-12
          and lbfgs.projected_gradient_norm(res, bounds) > lbfgs.GRADIENT_TOLERANCE)


def _restart_without_gradient_steps(fun, x0, bounds, max_iterations, tolerance, stalled):
  """Nelder–Mead from the start (small simplex steps stay where C⁻¹ is bounded), then
  L-BFGS-B from its point; the better of that and the stalled run."""
  def value(x):
    v = float(fun(x)[0])
    return v if math.isfinite(v) else math.inf

  simplex = scipy.optimize.minimize(
      value, x0, method="Nelder-Mead", bounds=bounds,
      options={"maxiter": 400 * x0.size, "xatol": 1e-10, "fatol": 1e-14})
  polished = lbfgs.minimize(fun, simplex.x, bounds, max_iterations, tolerance)
  polished.nit = int(polished.nit) + int(simplex.nit) + int(stalled.nit)
  return polished if float(polished.fun) < float(stalled.fun) else stalled


def _initial_coefficients(init, bands: int, monotone: bool) -> np.ndarray:
  """f_0 = 1 start: the given coefficients (made non-increasing where ``monotone``) or √S."""
  if init is None:
    f0 = workloads.sqrt_prefix_coefficients(bands)
  else:
    f0 = toeplitz_ops.check_coefficients(init, "initial coefficients")
    if f0.shape[0] != bands:
      raise checks.CheckError(f"initial coefficients have {f0.shape[0]} bands, expected {bands}")
    f0 = f0 / f0[0]
  if monotone and not toeplitz_bounds.is_nonincreasing_nonnegative(f0):
    f0 = np.maximum.accumulate(np.abs(f0)[::-1])[::-1]
    f0 = f0 / f0[0]
  return f0


def _parametrization(objective: _Objective, f0: np.ndarray, value0: float, monotone: bool):
  """(to_f, fun, x0, bounds): L-BFGS variables x for f, objective scaled by its start value.

  Monotone: f_k = Σ_{t≥k} x_t with x ≥ 0 (f_0 = 1 held by a penalty); otherwise f_0 = 1
  and x = f_1..f_{b−1} are free.
  """
  def suffix_sums(x):
    return np.cumsum(x[::-1])[::-1]

  def monotone_fun(x):
    f = suffix_sums(x)
    value, g_f = objective.value_and_grad(f)
    penalty = (f[0] - 1.0) ** 2
    return value / value0 + penalty, np.cumsum(g_f) / value0 + 2.0 * (f[0] - 1.0)

  def unit_first(x):
    return np.concatenate([[1.0], x])

  def free_fun(x):
    value, g_f = objective.value_and_grad(unit_first(x))
    return value / value0, g_f[1:] / value0

  if monotone:
    return suffix_sums, monotone_fun, f0 - np.append(f0[1:], 0.0), [(0.0, None)] * f0.shape[0]
  return unit_first, free_fun, f0[1:].copy(), None


# ----------------------------------------------------------------------------- streaming


def _coefficients_from(params) -> np.ndarray:
  if isinstance(params, dict):
    if "toeplitz_coefficients" not in params:
      raise checks.CheckError("stored parameters lack 'toeplitz_coefficients'")
    params = params["toeplitz_coefficients"]
  return toeplitz_ops.check_coefficients(params)


def stream(params, n) -> streams.LinearStream:
  """C⁻¹·Z as a LinearStream: b − 1 model rows of state (the last b − 1 outputs).

  ``params``: the coefficients f (or the extras dict holding them); ``n``: the rounds
  (or the workload A, whose size is used). Forward substitution, Choquette-Choo et al.
  2023, arXiv:2306.08153, Sec 4.
  """
  f = _coefficients_from(params)
  n = toeplitz_ops.rounds_of(n)
  return streams.lower_banded_inverse(f[None, :min(f.shape[0], n)], n,
                                      name="banded Toeplitz C⁻¹")


# ----------------------------------------------------------------------------- family interface

# Bumped whenever the output for the same inputs changes (part of the cache key).
VERSION = "2"  # 2: restart without gradient steps when L-BFGS-B stalls at its start

STRATEGIES = {"banded_toeplitz": families.Declaration(
    parameters=("bands", "error"), defaults=families.separation_bands,
    participations=participation.KINDS, schema_dependent=True, peak_matrices=6, streams=True,
    check_spec=lambda spec: families.check_bands(spec, at_most_separation=True))}


def factorize(a: np.ndarray, spec, context):
  """The optimized b-banded Toeplitz C for A under the spec's schema (``optimize``)."""
  from tff_mf.factorization.families import FamilyResult  # pylint: disable=g-import-not-at-top
  del context
  min_sep, k = toeplitz_bounds.schema_arguments(spec.participation, a.shape[0])
  result = optimize(a.shape[0], spec.bands, workload=a, error=spec.error, min_sep=min_sep,
                    max_participations=k)
  return FamilyResult(b=result.b, c=result.c, info=dict(result.info), extras=dict(result.extras))


def factorize_toeplitz(a_column: np.ndarray, spec, context):
  """``factorize`` for the Toeplitz workload with first column ``a_column``: the same
  optimization, returning first columns only (O(n·b) memory)."""
  del context
  return families.toeplitz_family_result(optimize, spec.bands, a_column, spec)


def check_extras(f) -> None:
  """The stored coefficients, divided by the stored γ, rebuild the normalized C (its first
  column for a ``ToeplitzFactorization``)."""
  gamma = float(np.asarray(f.extras["normalization"])[0])
  coeffs = checks.real_array(f.extras["toeplitz_coefficients"], "Toeplitz coefficients")
  column = np.zeros(f.n)
  column[:min(coeffs.size, f.n)] = coeffs[:f.n]
  if isinstance(f, toeplitz_factorization.ToeplitzFactorization):
    c = f.columns["C_column"]
    err = float(np.max(np.abs(column / gamma - c)))
  else:
    c = f.c
    err = float(np.max(np.abs(toeplitz_ops.lower_toeplitz(column) / gamma - c)))
  if err > 1e-12 * max(1.0, float(np.max(np.abs(c)))):
    raise checks.CheckError(f"Toeplitz coefficients do not rebuild C (error {err:.3g})")


def noise_column(f) -> Tuple[np.ndarray, int]:
  """(C⁻¹·e_0 of the normalized C from the stored coefficients, the order b − 1 of the
  recurrence it obeys): ``toeplitz_factorization.check_noise``."""
  gamma = float(np.asarray(f.extras["normalization"])[0])
  coeffs = _coefficients_from(f.extras)
  return gamma * toeplitz_ops.inverse_column(coeffs, f.n), max(0, min(coeffs.size, f.n) - 1)
