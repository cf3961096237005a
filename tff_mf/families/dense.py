"""Optimal factorization A = B·C by the fixed point φ with a duality-gap certificate.

Numpy/scipy core, no TensorFlow. References (``/work/shared/papers``):

- Denisov et al. ``001_…`` Sec 3: the problem min tr(AᵀA X⁻¹) over PD X with
  X[i, i] ≤ 1 (Eq. 4), the map φ(v) = diagpart((V^½ AᵀA V^½)^½) (Eq. 5), X(v)
  (Eq. 6) and the lower bound tr(V(2X(v) − I)) (Eq. 8) valid for every v > 0.
- Denisov et al. ``000_…`` App E.4: float64 throughout, a-priori eigenvalue
  floors for the square roots.
- McMahan et al. ``002_…`` Thm 2.1 / Denisov Prop 2.2: a lower-triangular C
  with CᵀC = X (ψ, here a reversed Cholesky factorization).

How the solver is made fast (see benchmarks/results/factorization.md; BLAS
threads follow the usual OPENBLAS_NUM_THREADS / OMP_NUM_THREADS settings):

1. The certificate. With M = V^½ G V^½ = Q Λ Qᵀ (G = AᵀA) one ``eigh`` gives
   φ(v) = (Q∘Q)·Λ^½, the Eq. 8 bound d(v) = 2·tr Λ^½ − Σv, and — with one
   extra triangular matrix product — the exact loss of the *feasible* point
   X̃ = diag(φ)^-½ Q Λ^½ Qᵀ diag(φ)^-½ (X(v) rescaled to a unit diagonal):
   tr(G X̃⁻¹) = Σ_k ‖A·diag(√φ)·q_k‖² / √λ_k. This primal value approaches the
   optimum much faster than γ(C)²‖B‖²_F of the unscaled X(v), so the relative
   gap (p − d)/p reaches a target in a third of the iterations.
2. Fewer iterations. d(v) is concave in v and its gradient is φ(v)/v − 1, so
   the fixed point of φ is the dual optimum. The default (``newton``) takes
   truncated Newton steps on d: the Hessian-vector products come from the same
   eigendecomposition (Daleckii–Krein divided differences of √·), cost two
   matrix products each (in float32: they only steer the search direction),
   and are solved by preconditioned conjugate gradients; a step that would
   lower the dual bound is halved (backtracking), and after four halvings
   replaced by a plain φ step. 4 ``eigh`` reach gap 1e-6 for S, about 10 for
   the momentum workloads, where the plain iteration needs hundreds.
   ``anderson`` (Anderson mixing of log v) is the lighter alternative; it is
   safeguarded by discarding steps that lower the bound by more than the gap.

The certificate stays a true lower bound whatever the iterates do: d(v) is
evaluated from the eigenvalues of M, floored at the a-priori bound
λ_min(M) ≥ min(v)·λ_min(G) ≥ min(v)/‖A⁻¹‖²_F (a valid bound, so the floor
only removes rounding error), and the reported gap is measured against the
loss of the (B, C) actually returned.
"""

from __future__ import annotations

import dataclasses
import sys
import time
import warnings
from typing import Any, Callable, Dict, List, Optional

import numpy as np
import scipy.linalg
from scipy.linalg import blas as scipy_blas

from tff_mf import factorization as fz
from tff_mf import workloads

ACCELERATIONS = ("newton", "anderson", "none")
DEFAULT_ANDERSON_MEMORY = 10
# Precision of the Hessian products inside conjugate gradients (search direction only).
CG_DTYPE = np.float32
FORCING_POWER = 1.0
_STOP_REASONS = {
    "max_iterations": "iteration limit reached",
    "time_limit": "time limit reached",
    "stalled": "no progress: float64 precision limit for this A, see Denisov App E.4",
    "target_gap": "converged",
}
# Smallest fraction of a Newton step tried before falling back to a plain φ step.
_MIN_NEWTON_SCALE = 1.0 / 16
# Largest change of log v in one accelerated step (a trust region for Anderson).
_MAX_LOG_STEP = 5.0


class NotConvergedError(ValueError):
  """The fixed point did not reach the target relative duality gap.

  ``result`` holds the unconverged OptimalResult (with its gap) for callers
  that want to inspect it.
  """

  def __init__(self, message: str, result: "OptimalResult"):
    super().__init__(message)
    self.result = result


class LossOfPositiveDefinitenessError(ArithmeticError, ValueError):
  """The matrix square root or ψ met a numerically indefinite matrix (App E.4)."""


@dataclasses.dataclass
class OptimalResult:
  """B·C = A with C lower triangular (not normalized; γ(C) ≈ 1 by construction).

  Attributes:
    b: decoder B (n x n, lower triangular).
    c: encoder C (n x n, lower triangular), CᵀC = X̃ with unit diagonal.
    v: the final dual variable (diagonal scaling) of Eq. 5.
    info: ``relative_gap``, ``iterations``, ``seconds``, ``converged``,
      ``dual_lower_bound``, ``loss``, ``target_gap``, ``acceleration`` ...
    history: one dict per iteration (``iteration``, ``seconds``,
      ``cpu_seconds``, ``dual``, ``primal`` = ``loss``, ``relative_gap``; the
      best values so far) for benchmarks and plots.
  """
  b: np.ndarray
  c: np.ndarray
  v: np.ndarray
  info: Dict[str, Any]
  history: List[Dict[str, float]] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class _Evaluation:
  """Everything one eigendecomposition of M(v) yields."""
  v: np.ndarray
  q: np.ndarray  # eigenvectors of M
  sqrt_lam: np.ndarray  # floored square roots of the eigenvalues of M
  phi: np.ndarray  # φ(v), Eq. 5
  dual: float  # Eq. 8 lower bound
  primal: float  # tr(G X̃⁻¹) of the unit-diagonal rescaling of X(v)
  negative_eigenvalues: int  # eigenvalues numerically below zero before flooring

  @property
  def gap(self) -> float:
    return relative_gap(self.primal, self.dual)


def relative_gap(primal: float, dual: float) -> float:
  """(p − d)/p, the relative duality gap (≥ 0 up to rounding)."""
  if not np.isfinite(primal) or primal <= 0:
    return float("inf")
  return float((primal - dual) / primal)


class DualProblem:
  """The Eq. 4 problem for one workload A, evaluated through its dual in v (Eq. 5-8)."""

  def __init__(self, a: np.ndarray):
    self.a = workloads.validate_workload(a)
    self.n = self.a.shape[0]
    gram = self.a.T @ self.a
    self.gram = 0.5 * (gram + gram.T)  # G = AᵀA, exactly symmetric
    # λ_min(G) = σ_min(A)² ≥ 1/‖A⁻¹‖²_F (App E.4: a-priori eigenvalue floor).
    a_inv = scipy.linalg.solve_triangular(self.a, np.eye(self.n), lower=True, check_finite=False)
    self.gram_eigenvalue_floor = 1.0 / float(np.sum(np.square(a_inv)))

  def evaluate(self, v: np.ndarray, with_primal: bool = True) -> _Evaluation:
    """φ(v), the Eq. 8 bound and the rescaled primal from one ``eigh`` of M(v)."""
    r = np.sqrt(v)
    m = self.gram * r[:, None]
    m *= r[None, :]
    lam, q = scipy.linalg.eigh(m, lower=True, driver="evd", overwrite_a=True,
                               check_finite=False)
    if not (np.all(np.isfinite(lam)) and np.all(np.isfinite(q))):
      raise LossOfPositiveDefinitenessError(
          "eigendecomposition of diag(v)^½ AᵀA diag(v)^½ produced non-finite values")
    floor = float(np.min(v)) * self.gram_eigenvalue_floor
    negative = int(np.sum(lam < -1e-10 * max(abs(float(lam[-1])), 1e-300)))
    sqrt_lam = np.sqrt(np.maximum(lam, floor))
    phi = np.square(q) @ sqrt_lam
    trace = float(np.sum(sqrt_lam))
    # Eq. 8 at the best multiple t·v: d(t·v) = 2√t·tr Λ^½ − t·Σv is maximal at
    # √t = tr Λ^½ / Σv, where it equals (tr Λ^½)² / Σv ≥ d(v).
    dual = trace * trace / float(np.sum(v))
    primal = self._rescaled_primal(q, sqrt_lam, phi) if with_primal else float("inf")
    return _Evaluation(v=v, q=q, sqrt_lam=sqrt_lam, phi=phi, dual=dual, primal=primal,
                       negative_eigenvalues=negative)

  def _rescaled_primal(self, q, sqrt_lam, phi) -> float:
    """tr(G X̃⁻¹) for X̃ = W⁻¹ Q Λ^½ Qᵀ W⁻¹, W = diag(√φ): Σ_k ‖A W q_k‖² / √λ_k."""
    wq = q * np.sqrt(phi)[:, None]
    awq = scipy_blas.dtrmm(1.0, self.a, wq, side=0, lower=1, overwrite_b=1)
    return float(np.sum(np.sum(np.square(awq), axis=0) / sqrt_lam))

  def factors(self, ev: _Evaluation):
    """(B, C) from X̃ = W⁻¹ Q Λ^½ Qᵀ W⁻¹ (unit diagonal) via ψ (McMahan Thm 2.1).

    C is the lower-triangular factor with CᵀC = X̃: with J the reversal
    permutation, J X̃ J = L Lᵀ gives C = J Lᵀ J. B = A C⁻¹ by a triangular solve.
    """
    z = ev.q * np.sqrt(ev.sqrt_lam)[None, :]
    z /= np.sqrt(ev.phi)[:, None]
    x = z @ z.T
    x = 0.5 * (x + x.T)
    x_rev = x[::-1, ::-1]
    try:
      chol = scipy.linalg.cholesky(x_rev, lower=True, check_finite=False)
    except np.linalg.LinAlgError as e:
      raise LossOfPositiveDefinitenessError(
          "X = CᵀC lost positive definiteness in the Cholesky factorization (ψ)") from e
    c = np.ascontiguousarray(chol.T[::-1, ::-1])
    c = np.tril(c)
    # B C = A  <=>  Cᵀ Bᵀ = Aᵀ.
    b_t = scipy.linalg.solve_triangular(c, self.a.T, trans="T", lower=True, check_finite=False)
    b = np.tril(b_t.T)
    return b, c


def solve(a: np.ndarray,
          target_gap: float = 1e-6,
          max_iterations: int = 10_000,
          allow_unconverged: bool = False,
          progress: bool = False,
          acceleration: str = "newton",
          anderson_memory: int = DEFAULT_ANDERSON_MEMORY,
          initial_v: Optional[np.ndarray] = None,
          max_cg_iterations: int = 200,
          stall_iterations: int = 30,
          time_limit: Optional[float] = None,
          callback: Optional[Callable[[Dict[str, float]], None]] = None) -> OptimalResult:
  """Optimal A = B·C (Denisov Eq. 3-4) to a certified relative duality gap.

  Args:
    a: workload, n x n lower triangular, full rank (validated).
    target_gap: stop when (loss − Eq. 8 bound)/loss ≤ target_gap.
    max_iterations: limit on evaluations of φ (one ``eigh`` each).
    allow_unconverged: return a result whose ``info['converged']`` is False
      instead of raising NotConvergedError when the gap is not reached.
    progress: tqdm progress bar on stderr showing the gap.
    acceleration: ``newton`` (default: truncated Newton-CG steps on the Eq. 8
      dual, safeguarded), ``anderson`` (Anderson mixing of φ in log v), or
      ``none`` (plain iteration of φ, Denisov Eq. 5 — the benchmark's baseline).
    anderson_memory: number of past iterates Anderson mixing uses.
    max_cg_iterations: limit on conjugate-gradient steps per Newton step.
    stall_iterations: stop (as not converged) after this many iterations
      without improving the primal or the dual by a relative 1e-13 — the
      precision floor of float64 for badly conditioned A (App E.4).
    initial_v: starting dual point (default: all ones).
    time_limit: optional wall-clock limit in seconds, checked between
      iterations (treated like running out of iterations).
    callback: called with each history record.

  Returns:
    OptimalResult with lower-triangular B, C (B·C = A).

  Raises:
    workloads.WorkloadError: A is not square / lower triangular / full rank / finite.
    NotConvergedError: target gap not reached and allow_unconverged is False.
    LossOfPositiveDefinitenessError: the square roots broke down numerically.
  """
  if not 0 < target_gap < 1:
    raise ValueError(f"target_gap must be in (0, 1), got {target_gap}")
  if int(max_iterations) < 1:
    raise ValueError(f"max_iterations must be at least 1, got {max_iterations}")
  if acceleration not in ACCELERATIONS:
    raise ValueError(f"unknown acceleration {acceleration!r}; expected one of {ACCELERATIONS}")
  if anderson_memory < 1:
    raise ValueError(f"anderson_memory must be at least 1, got {anderson_memory}")
  start = time.perf_counter()
  cpu_start = time.process_time()
  problem = DualProblem(a)
  n = problem.n
  if initial_v is None:
    v = np.ones(n)
  else:
    v = np.asarray(initial_v, dtype=np.float64).copy()
    if v.shape != (n,) or not np.all(np.isfinite(v)) or np.any(v <= 0):
      raise ValueError(f"initial_v must be {n} finite positive numbers")

  from tqdm import tqdm  # pylint: disable=g-import-not-at-top
  # The bar fills with the decades of duality gap closed: -log10(gap) of -log10(target).
  decades = round(-np.log10(target_gap), 2)
  bar = tqdm(total=decades, file=sys.stderr, disable=not progress, desc=f"optimal n={n}",
             leave=False, bar_format="{desc}: {percentage:3.0f}%|{bar}| [{elapsed}{postfix}]")
  history: List[Dict[str, float]] = []
  best: Optional[_Evaluation] = None  # highest dual bound so far
  best_primal: Optional[_Evaluation] = None  # lowest primal so far
  result_factors = None
  final_loss = float("inf")
  s_hist: List[np.ndarray] = []
  f_hist: List[np.ndarray] = []
  restarts = 0
  backtracks = 0
  line: Optional[_NewtonLine] = None
  cg_total = 0
  negative_total = 0
  iterations = 0
  last_improvement = 0
  converged = False
  stop_reason = "max_iterations"
  try:
    while iterations < max_iterations:
      if (time_limit is not None and iterations > 0
          and time.perf_counter() - start > time_limit):
        stop_reason = "time_limit"
        break
      ev = problem.evaluate(v)
      iterations += 1
      negative_total += ev.negative_eigenvalues
      if best is None or ev.dual > best.dual:
        if best is None or ev.dual > best.dual + 1e-13 * abs(best.dual):
          last_improvement = iterations
        best = ev
      if best_primal is None or ev.primal < best_primal.primal:
        if best_primal is None or ev.primal < best_primal.primal * (1 - 1e-13):
          last_improvement = iterations
        best_primal = ev
      gap = relative_gap(best_primal.primal, best.dual)
      record = {"iteration": iterations, "seconds": time.perf_counter() - start,
                "cpu_seconds": time.process_time() - cpu_start, "dual": best.dual,
                "primal": best_primal.primal, "loss": best_primal.primal, "relative_gap": gap}
      history.append(record)
      if callback is not None:
        callback(record)
      bar.n = float(min(decades, max(0.0, -np.log10(max(gap, 1e-300)))))
      bar.set_postfix_str(f"iteration {iterations}, gap={gap:.2e}")
      if gap <= target_gap:
        b, c = problem.factors(best_primal)
        loss_bc = fz.loss(b, c)
        if result_factors is None or loss_bc < final_loss:
          result_factors, final_loss = (b, c), loss_bc
        if relative_gap(final_loss, best.dual) <= target_gap:
          converged = True
          stop_reason = "target_gap"
          break
      if iterations - last_improvement >= stall_iterations:
        stop_reason = "stalled"
        break
      if acceleration == "newton":
        # Backtracking on the dual bound: a Newton step must not lower it.
        if line is not None and ev.dual < line.base.dual - 1e-14 * abs(line.base.dual):
          line.scale *= 0.5
          backtracks += 1
          if line.scale >= _MIN_NEWTON_SCALE:
            v = line.point()
            continue
          line = None
          v = None
        else:
          line = _newton_line(ev, max_cg_iterations)
          cg_total += line.cg_iterations
          v = line.point()
      else:
        v = _next_v(ev, best, s_hist, f_hist, acceleration, anderson_memory)
      if v is None:  # safeguard triggered: plain step from the best dual point
        restarts += 1
        s_hist.clear()
        f_hist.clear()
        v = best.phi.copy()
  finally:
    bar.close()

  if result_factors is None:
    result_factors = problem.factors(best_primal)
    final_loss = fz.loss(*result_factors)
  b, c = result_factors
  gap = relative_gap(final_loss, best.dual)
  info = {
      "relative_gap": gap,
      "iterations": iterations,
      "seconds": time.perf_counter() - start,
      "cpu_seconds": time.process_time() - cpu_start,
      "converged": bool(converged),
      "dual_lower_bound": float(best.dual),
      "loss": float(final_loss),
      "target_gap": float(target_gap),
      "max_iterations": int(max_iterations),
      "stop_reason": stop_reason,
      "acceleration": acceleration,
      "anderson_memory": int(anderson_memory) if acceleration == "anderson" else 0,
      "safeguard_restarts": restarts,
      "cg_iterations": cg_total,
      "newton_backtracks": backtracks,
      "negative_eigenvalues_floored": negative_total,
  }
  if negative_total:
    warnings.warn(
        f"optimal factorization (n={n}): {negative_total} eigenvalues of "
        "diag(v)^½ AᵀA diag(v)^½ came out negative (loss of positive definiteness by "
        "rounding) and were floored at the a-priori bound; the certificate accounts for it",
        RuntimeWarning)
  result = OptimalResult(b=b, c=c, v=best.v.copy(), info=info, history=history)
  if not converged and not allow_unconverged:
    raise NotConvergedError(
        f"optimal factorization (n={n}) did not reach relative duality gap {target_gap:g} "
        f"within {iterations} iterations ({_STOP_REASONS[stop_reason]}); gap reached {gap:.3g}. "
        f"Raise max_iterations, loosen target_gap, or pass allow_unconverged=True to use "
        f"it anyway.", result)
  return result


def _next_v(ev: _Evaluation, best: _Evaluation, s_hist, f_hist, acceleration: str,
            memory: int) -> Optional[np.ndarray]:
  """Next dual point: φ(v) (plain) or an Anderson-mixed step in log v.

  Returns None when the safeguard rejects the current iterate: its dual bound
  fell below the best by more than the best's own gap.
  """
  if acceleration == "none":
    return ev.phi.copy()
  if ev is not best and best.dual - ev.dual > max(best.primal - best.dual, 0.0) + 1e-12 * abs(best.dual):
    return None
  s = np.log(ev.v)
  f = np.log(ev.phi) - s  # fixed-point residual of log φ
  s_hist.append(s)
  f_hist.append(f)
  if len(s_hist) > memory + 1:
    s_hist.pop(0)
    f_hist.pop(0)
  step = f
  if len(s_hist) > 1:
    d_f = np.diff(np.asarray(f_hist), axis=0).T
    d_s = np.diff(np.asarray(s_hist), axis=0).T
    coeffs, *_ = np.linalg.lstsq(d_f, f, rcond=1e-12)
    step = f - (d_s + d_f) @ coeffs
    if not np.all(np.isfinite(step)):
      return None
  step = np.clip(step, -_MAX_LOG_STEP, _MAX_LOG_STEP)
  return np.exp(s + step)


@dataclasses.dataclass
class _NewtonLine:
  """The Newton direction from an accepted point, and the step fraction tried."""
  base: _Evaluation
  v_base: np.ndarray  # base point moved to its best multiple
  direction: np.ndarray  # step in log v
  cg_iterations: int
  scale: float = 1.0

  def point(self) -> np.ndarray:
    return self.v_base * np.exp(self.scale * self.direction)


def _newton_line(ev: _Evaluation, max_cg: int) -> _NewtonLine:
  """A truncated Newton step on the Eq. 8 dual d(v) = 2·tr M(v)^½ − Σv.

  With e = ½·δ log v, M changes by E M + M E (E = diag(e)); in the eigenbasis
  of M the square root changes by (QᵀEQ)_kl·K_kl with
  K_kl = (λ_k + λ_l)/(√λ_k + √λ_l) (Daleckii–Krein), so φ changes by
  ½·H δ with H_ij = Σ_kl Q_ik Q_il K_kl Q_jk Q_jl. The dual is concave in v,
  which makes P = diag(φ) − ½H positive semi-definite, and the Newton step
  for v (written as v·(1 + δ)) solves P δ = φ − v; δ is an ascent direction
  of d in log v. A product P·x costs two n×n matrix products; conjugate
  gradients with the Jacobi preconditioner solve to a relative residual
  min(0.1, (‖φ − v‖/‖v‖)^FORCING_POWER) (Eisenstat–Walker style). The caller
  steps to v·exp(t·δ), halving t while the dual bound would decrease.
  """
  # Move to the best multiple of v first (free: φ(t·v) = √t·φ(v)).
  root_t = float(np.sum(ev.sqrt_lam)) / float(np.sum(ev.v))
  v = ev.v * root_t * root_t
  phi = ev.phi * root_t
  sqrt_lam = ev.sqrt_lam * root_t
  lam = np.square(sqrt_lam)
  kernel = (lam[:, None] + lam[None, :]) / (sqrt_lam[:, None] + sqrt_lam[None, :])
  # Products with P only steer the search direction; the certificate is always
  # evaluated in float64, so they may run in CG_DTYPE (float32 halves their cost).
  q = ev.q.astype(CG_DTYPE)
  kernel = kernel.astype(CG_DTYPE)
  q_sq = np.square(q)
  precond = phi - 0.5 * np.sum((q_sq @ kernel) * q_sq, axis=1, dtype=np.float64)
  precond = np.maximum(precond, 1e-12 * float(np.max(phi)))
  grad = phi - v

  def apply_p(x):
    e_tilde = (q.T * (0.5 * x).astype(CG_DTYPE)[None, :]) @ q
    e_tilde *= kernel
    return phi * x - np.sum((q @ e_tilde) * q, axis=1, dtype=np.float64)

  grad_norm = float(np.linalg.norm(grad))
  tol = min(0.1, (grad_norm / float(np.linalg.norm(v))) ** FORCING_POWER) * grad_norm
  x = np.zeros_like(grad)
  r = grad.copy()
  z = r / precond
  p = z.copy()
  rz = float(r @ z)
  iterations = 0
  for _ in range(max_cg):
    ap = apply_p(p)
    iterations += 1
    curvature = float(p @ ap)
    if curvature <= 0:
      break
    alpha = rz / curvature
    x += alpha * p
    r -= alpha * ap
    if float(np.linalg.norm(r)) <= tol:
      break
    z = r / precond
    rz_new = float(r @ z)
    p = z + (rz_new / rz) * p
    rz = rz_new
  if not np.any(x) or not np.all(np.isfinite(x)):
    x = grad / precond
  return _NewtonLine(base=ev, v_base=v, direction=np.clip(x, -_MAX_LOG_STEP, _MAX_LOG_STEP),
                     cg_iterations=iterations)
