"""Baseline solvers for Denisov Eq. 4, for the factorization benchmark (numpy core).

Denisov et al. 2022 (arXiv:2202.08312) App E.4 / Fig 4 compare the fixed point φ
with gradient-based methods on their Eq. 4 (after Yuan et al. 2016):

    min tr(AᵀA X⁻¹)  over positive-definite X with X[i, i] ≤ 1.

The optimum has X[i, i] = 1 exactly (Yuan et al., quoted in Denisov Sec 3), so
both baselines work on the affine set diag(X) = 1, where the objective equals
the loss L = γ(C)²‖B‖²_F of the factorization C = ψ(X), B = A C⁻¹.

- ``gradient_descent``: projected gradient (the gradient −X⁻¹GX⁻¹ with its
  diagonal removed) with Armijo backtracking; every trial step is checked for
  positive definiteness by a Cholesky factorization, as Denisov App E.4 (after
  Yuan et al.) describes.
- ``lbfgs``: scipy's L-BFGS-B on the same objective over the strictly lower
  triangle of X; points that are not positive definite get the value +inf
  (the line search backs off), and the method restarts when its line search
  gives up, until the iteration or time limit.

Both start, like Denisov Fig 4, from X(v) of Eq. 6 at v = 1, rescaled to a
unit diagonal, and return a ``BaselineResult`` whose ``history`` records the
loss against wall time.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from typing import Any, Dict, List, Optional

import numpy as np
import scipy.linalg
import scipy.optimize

from tff_mf.factorization import dense_run
from tff_mf.factorization import dense_single
from tff_mf import factorization as fz
from tff_mf.factorization import workloads

METHODS = ("gradient_descent", "lbfgs")
_ARMIJO_C = 1e-4
_LBFGS_SCALE = 100.0


@dataclasses.dataclass
class BaselineResult:
  """B·C = A from a baseline solver; same fields as ``dense_run.OptimalResult`` (no v).

  ``history``: dicts with ``iteration``, ``seconds``, ``loss`` (tr(G X⁻¹) at
  unit diagonal, which is the loss L of the factorization).
  """
  b: np.ndarray
  c: np.ndarray
  info: Dict[str, Any]
  history: List[Dict[str, float]] = dataclasses.field(default_factory=list)


class _Objective:
  """f(X) = tr(G X⁻¹) = ‖L⁻¹Aᵀ‖²_F for X = L Lᵀ, and its gradient −X⁻¹GX⁻¹."""

  def __init__(self, a: np.ndarray):
    self.a = a
    self.evaluations = 0

  def cholesky(self, x: np.ndarray) -> Optional[np.ndarray]:
    """Lower Cholesky factor, or None when X is not (numerically) positive definite."""
    try:
      return scipy.linalg.cholesky(x, lower=True, check_finite=False)
    except np.linalg.LinAlgError:
      return None

  def value(self, chol: np.ndarray) -> float:
    self.evaluations += 1
    w = scipy.linalg.solve_triangular(chol, self.a.T, lower=True, check_finite=False)
    return float(np.sum(np.square(w)))

  def value_and_gradient(self, chol: np.ndarray):
    self.evaluations += 1
    w = scipy.linalg.solve_triangular(chol, self.a.T, lower=True, check_finite=False)
    u = scipy.linalg.solve_triangular(chol, w, lower=True, trans="T", check_finite=False)
    # u = X⁻¹Aᵀ, gradient = −X⁻¹AᵀA X⁻¹ = −u uᵀ.
    grad = -(u @ u.T)
    return float(np.sum(np.square(w))), grad


def initial_x(a: np.ndarray) -> np.ndarray:
  """X(v) of Denisov Eq. 6 at v = 1, rescaled to unit diagonal (the Fig 4 start)."""
  problem = dense_single.DualProblem(a)
  ev = problem.evaluate(np.ones(problem.n), with_primal=False)
  z = ev.q * np.sqrt(ev.sqrt_lam)[None, :]
  z /= np.sqrt(ev.phi)[:, None]
  x = z @ z.T
  return 0.5 * (x + x.T)


def _factors_from_x(a: np.ndarray, x: np.ndarray):
  """ψ: lower-triangular C with CᵀC = X (reversed Cholesky), B = A C⁻¹."""
  chol = scipy.linalg.cholesky(x[::-1, ::-1], lower=True, check_finite=False)
  c = np.tril(np.ascontiguousarray(chol.T[::-1, ::-1]))
  b_t = scipy.linalg.solve_triangular(c, a.T, trans="T", lower=True, check_finite=False)
  return np.tril(b_t.T), c


def gradient_descent(a: np.ndarray, max_iterations: int = 100_000,
                     time_limit: Optional[float] = None,
                     target_loss: Optional[float] = None,
                     progress: bool = False) -> BaselineResult:
  """Projected gradient descent on Eq. 4 with Armijo steps and a PD check."""
  a = workloads.validate_workload(a)
  start = time.perf_counter()
  cpu_start = time.process_time()
  obj = _Objective(a)
  x = initial_x(a)
  chol = obj.cholesky(x)
  if chol is None:
    raise dense_run.LossOfPositiveDefinitenessError("initial X is not positive definite")
  f, grad = obj.value_and_gradient(chol)
  step = 1.0 / max(float(np.max(np.abs(grad))), 1e-300)
  history = [{"iteration": 0, "seconds": time.perf_counter() - start,
                  "cpu_seconds": time.process_time() - cpu_start, "loss": f}]
  rejected_not_pd = 0
  iterations = 0
  stop_reason = "max_iterations"
  from tqdm import tqdm  # pylint: disable=g-import-not-at-top
  bar = tqdm(total=max_iterations, file=sys.stderr, disable=not progress,
             desc=f"gradient descent n={a.shape[0]}", leave=False)
  try:
    while iterations < max_iterations:
      if time_limit is not None and time.perf_counter() - start > time_limit:
        stop_reason = "time_limit"
        break
      if target_loss is not None and f <= target_loss:
        stop_reason = "target_loss"
        break
      direction = -grad
      np.fill_diagonal(direction, 0.0)  # stay on diag(X) = 1
      slope = float(np.sum(direction * direction))
      if slope <= 0:
        stop_reason = "stationary"
        break
      step *= 2.0
      while True:
        x_trial = x + step * direction
        chol_trial = obj.cholesky(x_trial)
        if chol_trial is None:
          rejected_not_pd += 1
        else:
          f_trial = obj.value(chol_trial)
          if f_trial <= f - _ARMIJO_C * step * slope:
            break
        step *= 0.5
        if step < 1e-300:
          stop_reason = "line_search_failed"
          break
      if stop_reason == "line_search_failed":
        break
      x, chol = x_trial, chol_trial
      f, grad = obj.value_and_gradient(chol)
      iterations += 1
      history.append({"iteration": iterations, "seconds": time.perf_counter() - start,
                  "cpu_seconds": time.process_time() - cpu_start, "loss": f})
      bar.update(1)
      bar.set_postfix(loss=f"{f:.8g}")
  finally:
    bar.close()
  b, c = _factors_from_x(a, x)
  info = {"method": "gradient_descent", "iterations": iterations, "loss": fz.single_participation_loss(b, c),
          "seconds": time.perf_counter() - start,
          "cpu_seconds": time.process_time() - cpu_start, "stop_reason": stop_reason,
          "objective_evaluations": obj.evaluations, "steps_rejected_not_pd": rejected_not_pd}
  return BaselineResult(b=b, c=c, info=info, history=history)


def lbfgs(a: np.ndarray, max_iterations: int = 100_000, time_limit: Optional[float] = None,
          target_loss: Optional[float] = None, memory: int = 10,
          progress: bool = False) -> BaselineResult:
  """scipy L-BFGS-B on Eq. 4 over the strictly lower triangle of X (unit diagonal)."""
  a = workloads.validate_workload(a)
  n = a.shape[0]
  start = time.perf_counter()
  cpu_start = time.process_time()
  obj = _Objective(a)
  rows, cols = np.tril_indices(n, -1)
  # L-BFGS-B's first step (and the first after a restart) has unit length in
  # the variables; scaling θ = _LBFGS_SCALE·X[i, j] keeps it inside the PD cone.
  scale = _LBFGS_SCALE
  x0 = initial_x(a)
  history: List[Dict[str, float]] = []
  best = {"loss": np.inf, "theta": scale * x0[rows, cols]}
  not_pd = [0]

  class _Stop(Exception):
    pass

  def to_matrix(theta):
    x = np.eye(n)
    x[rows, cols] = theta / scale
    x[cols, rows] = theta / scale
    return x

  def fun(theta):
    if time_limit is not None and time.perf_counter() - start > time_limit:
      raise _Stop("time_limit")
    chol = obj.cholesky(to_matrix(theta))
    if chol is None:
      not_pd[0] += 1
      return np.inf, np.zeros_like(theta)
    f, grad = obj.value_and_gradient(chol)
    if f < best["loss"]:
      best["loss"], best["theta"] = f, theta.copy()
    history.append({"iteration": len(history), "seconds": time.perf_counter() - start,
                    "cpu_seconds": time.process_time() - cpu_start, "loss": best["loss"]})
    if target_loss is not None and best["loss"] <= target_loss:
      raise _Stop("target_loss")
    # Each off-diagonal entry appears twice in X; chain rule through the scaling.
    return f, (2.0 / scale) * grad[rows, cols]

  stop_reason = "max_iterations"
  restarts = 0
  iterations = 0
  from tqdm import tqdm  # pylint: disable=g-import-not-at-top
  bar = tqdm(total=None, file=sys.stderr, disable=not progress, desc=f"L-BFGS n={n}", leave=False)
  try:
    while iterations < max_iterations:
      res = scipy.optimize.minimize(
          fun, best["theta"], jac=True, method="L-BFGS-B",
          options={"maxiter": max_iterations - iterations, "maxcor": memory,
                   "ftol": 0.0, "gtol": 0.0, "maxfun": 10 ** 9},
          callback=lambda _: bar.update(1))
      iterations += int(res.nit)
      if res.nit == 0:
        stop_reason = "line_search_failed"
        break
      restarts += 1
  except _Stop as e:
    stop_reason = str(e)
  finally:
    bar.close()
  b, c = _factors_from_x(a, to_matrix(best["theta"]))
  info = {"method": "lbfgs", "iterations": iterations, "loss": fz.single_participation_loss(b, c),
          "seconds": time.perf_counter() - start,
          "cpu_seconds": time.process_time() - cpu_start, "stop_reason": stop_reason,
          "objective_evaluations": obj.evaluations, "points_not_pd": not_pd[0],
          "restarts": restarts, "memory": memory}
  return BaselineResult(b=b, c=c, info=info, history=history)


def run(method: str, a: np.ndarray, **kwargs) -> BaselineResult:
  """Dispatches to ``gradient_descent`` or ``lbfgs``."""
  if method == "gradient_descent":
    return gradient_descent(a, **kwargs)
  if method == "lbfgs":
    return lbfgs(a, **kwargs)
  raise ValueError(f"unknown baseline {method!r}; expected one of {METHODS}")
