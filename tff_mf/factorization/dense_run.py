"""The run loop and linear algebra shared by the two optimal dense solvers (numpy, no TF).

``tff_mf.factorization.dense_single.solve`` (single participation, Denisov et al. 2022,
arXiv:2202.08312) and ``tff_mf.factorization.dense_fixed_epoch.solve_fixed_epoch`` ((k, b)-fixed-epoch
participation, Choquette-Choo et al. 2023, arXiv:2211.06530) both work through the
Lagrange dual of a convex program in X = CᵀC. What they share lives here: the result and
error types; ``Run``, which keeps the best dual and primal points, the history, the
certified factors and the stop rule; the floored eigendecomposition (App E.4), the
reversed-Cholesky factors (Prop 2.2) and preconditioned conjugate gradients.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from typing import Any, Callable, Dict, List, Optional

import numpy as np
import scipy.linalg

# Precision of the Hessian products inside conjugate gradients (search direction only).
CG_DTYPE = np.float32
FORCING_POWER = 1.0
STOP_REASONS = {
    "max_iterations": "iteration limit reached",
    "time_limit": "time limit reached",
    "stalled": "no progress: float64 precision limit for this A, see Denisov App E.4",
    "target_gap": "converged",
}
# Largest change of log v in one accelerated step (a trust region for Anderson).
MAX_LOG_STEP = 5.0


class NotConvergedError(ValueError):
  """The fixed point did not reach the target relative duality gap.

  ``result`` holds the unconverged OptimalResult (with its gap) for callers
  that want to inspect it; ``arguments`` the Python arguments its remedy names (a
  command line spells them as flags, ``tff_mf.clitools.flag_message``).
  """
  arguments = ("max_iterations", "target_gap", "allow_unconverged")

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
  dual_blocks: Optional[np.ndarray] = None  # fixed epoch: the pattern blocks Λ_j of the dual


def relative_gap(primal: float, dual: float) -> float:
  """(p − d)/p, the relative duality gap (≥ 0 up to rounding)."""
  if not np.isfinite(primal) or primal <= 0:
    return float("inf")
  return float((primal - dual) / primal)


def symmetric_gram(a: np.ndarray) -> np.ndarray:
  """G = AᵀA, exactly symmetric."""
  gram = a.T @ a
  return 0.5 * (gram + gram.T)


def gram_eigenvalue_floor(a: np.ndarray) -> float:
  """λ_min(G) = σ_min(A)² ≥ 1/‖A⁻¹‖²_F (Denisov et al. App E.4: a-priori eigenvalue floor)."""
  a_inv = scipy.linalg.solve_triangular(a, np.eye(a.shape[0]), lower=True, check_finite=False)
  return 1.0 / float(np.sum(np.square(a_inv)))


def floored_eigh(m: np.ndarray, floor: float, what: str):
  """(Q, floored √Λ, count of numerically negative eigenvalues) of the symmetric M = ``what``.

  Eigenvalues are floored at the a-priori bound ``floor`` (App E.4), so the square roots
  exist and the dual bound stays valid. numpy's LAPACK ``syevd`` (divide and conquer)
  releases the GIL, scipy's does not: a Ctrl-C is acknowledged during the seconds it
  takes at large n (``tff_mf.interrupt``).
  """
  try:
    lam, q = np.linalg.eigh(m, UPLO="L")
  except np.linalg.LinAlgError as e:
    raise LossOfPositiveDefinitenessError(f"eigendecomposition of {what} failed: {e}") from e
  if not (np.all(np.isfinite(lam)) and np.all(np.isfinite(q))):
    raise LossOfPositiveDefinitenessError(
        f"eigendecomposition of {what} produced non-finite values")
  negative = int(np.sum(lam < -1e-10 * max(abs(float(lam[-1])), 1e-300)))
  return q, np.sqrt(np.maximum(lam, floor)), negative


def encoder_from_gram(x: np.ndarray, message: str) -> np.ndarray:
  """C lower triangular with CᵀC = X (Denisov et al. Prop 2.2; only X's upper triangle is
  read): with J the reversal permutation, J X J = L Lᵀ gives C = J Lᵀ J. ``message`` is the
  error when the Cholesky factorization finds X not positive definite."""
  try:
    chol = scipy.linalg.cholesky(x[::-1, ::-1], lower=True, check_finite=False)
  except np.linalg.LinAlgError as e:
    raise LossOfPositiveDefinitenessError(message) from e
  return np.tril(np.ascontiguousarray(chol.T[::-1, ::-1]))


def factors_from_gram(x: np.ndarray, a: np.ndarray, message: str):
  """(B, C): C = ``encoder_from_gram(x)``, B = A C⁻¹ solved as Cᵀ Bᵀ = Aᵀ (one triangular
  solve)."""
  c = encoder_from_gram(x, message)
  b_t = scipy.linalg.solve_triangular(c, a.T, trans="T", lower=True, check_finite=False)
  return np.tril(b_t.T), c


@dataclasses.dataclass
class Run:
  """What both solvers carry across iterations: the best dual point (highest bound), the
  best primal point (lowest loss), the history, and the certified factors, if any."""
  target_gap: float
  callback: Optional[Callable[[Dict[str, float]], None]]
  start: float = dataclasses.field(default_factory=time.perf_counter)
  cpu_start: float = dataclasses.field(default_factory=time.process_time)
  bar: Any = None
  decades: float = 0.0
  history: List[Dict[str, float]] = dataclasses.field(default_factory=list)
  best: Any = None  # highest dual bound so far
  best_primal: Any = None  # lowest primal so far
  result_factors: Optional[tuple] = None
  final_loss: float = float("inf")
  iterations: int = 0
  last_improvement: int = 0
  negative_total: int = 0
  converged: bool = False
  stop_reason: str = "max_iterations"

  def open_bar(self, progress: bool, desc: str) -> None:
    """tqdm bar on stderr filling with the decades of gap closed: -log10(gap) of -log10(target)."""
    from tqdm import tqdm  # pylint: disable=g-import-not-at-top
    self.decades = round(-np.log10(self.target_gap), 2)
    self.bar = tqdm(total=self.decades, file=sys.stderr, disable=not progress, desc=desc,
                    leave=False,
                    bar_format="{desc}: {percentage:3.0f}%|{bar}| [{elapsed}{postfix}]")

  def out_of_time(self, time_limit: Optional[float]) -> bool:
    if (time_limit is not None and self.iterations > 0
        and time.perf_counter() - self.start > time_limit):
      self.stop_reason = "time_limit"
      return True
    return False

  def update(self, ev, factors, loss, stall_iterations: int) -> bool:
    """Takes one evaluation; True when the solver stops (gap certified, or stalled)."""
    gap = self._observe(ev)
    if gap <= self.target_gap and self._certify(factors, loss):
      self.converged = True
      self.stop_reason = "target_gap"
      return True
    if self.iterations - self.last_improvement >= stall_iterations:
      self.stop_reason = "stalled"
      return True
    return False

  def _observe(self, ev) -> float:
    """Counts the evaluation, keeps the best points, records history; the relative gap."""
    self.iterations += 1
    self.negative_total += ev.negative_eigenvalues
    if self.best is None or ev.dual > self.best.dual:
      if self.best is None or ev.dual > self.best.dual + 1e-13 * abs(self.best.dual):
        self.last_improvement = self.iterations
      self.best = ev
    if self.best_primal is None or ev.primal < self.best_primal.primal:
      if self.best_primal is None or ev.primal < self.best_primal.primal * (1 - 1e-13):
        self.last_improvement = self.iterations
      self.best_primal = ev
    gap = relative_gap(self.best_primal.primal, self.best.dual)
    record = {"iteration": self.iterations, "seconds": time.perf_counter() - self.start,
              "cpu_seconds": time.process_time() - self.cpu_start, "dual": self.best.dual,
              "primal": self.best_primal.primal, "loss": self.best_primal.primal,
              "relative_gap": gap}
    self.history.append(record)
    if self.callback is not None:
      self.callback(record)
    self.bar.n = float(min(self.decades, max(0.0, -np.log10(max(gap, 1e-300)))))
    self.bar.set_postfix_str(f"iteration {self.iterations}, gap={gap:.2e}")
    return gap

  def _certify(self, factors, loss) -> bool:
    """Builds (B, C) at the best primal point; True when their own loss meets the target."""
    b, c = factors(self.best_primal)
    loss_bc = loss(b, c)
    if self.result_factors is None or loss_bc < self.final_loss:
      self.result_factors, self.final_loss = (b, c), loss_bc
    return relative_gap(self.final_loss, self.best.dual) <= self.target_gap

  def finish(self, factors, loss):
    """(B, C, gap): the certified factors, else those of the best primal point."""
    if self.result_factors is None:
      self.result_factors = factors(self.best_primal)
      self.final_loss = loss(*self.result_factors)
    b, c = self.result_factors
    return b, c, relative_gap(self.final_loss, self.best.dual)

  def info(self, gap: float, max_iterations: int, acceleration: str) -> Dict[str, Any]:
    return {
        "relative_gap": gap,
        "iterations": self.iterations,
        "seconds": time.perf_counter() - self.start,
        "cpu_seconds": time.process_time() - self.cpu_start,
        "converged": bool(self.converged),
        "dual_lower_bound": float(self.best.dual),
        "loss": float(self.final_loss),
        "target_gap": float(self.target_gap),
        "max_iterations": int(max_iterations),
        "stop_reason": self.stop_reason,
        "acceleration": acceleration,
    }

  def check_converged(self, result: OptimalResult, allow_unconverged: bool, what: str) -> None:
    """Raises NotConvergedError (holding ``result``) unless converged or allowed."""
    if not self.converged and not allow_unconverged:
      raise NotConvergedError(
          f"{what} did not reach relative duality gap {self.target_gap:g} within "
          f"{self.iterations} iterations ({STOP_REASONS[self.stop_reason]}); gap reached "
          f"{result.info['relative_gap']:.3g}. Raise max_iterations, loosen target_gap, or pass "
          f"allow_unconverged=True to use it anyway.", result)


def forcing_tolerance(grad_norm: float, reference_norm: float) -> float:
  """CG residual target min(0.1, (‖∇‖/‖ref‖)^FORCING_POWER)·‖∇‖ (Eisenstat–Walker style)."""
  return min(0.1, (grad_norm / reference_norm) ** FORCING_POWER) * grad_norm


def conjugate_gradients(apply, precondition, grad, inner, residual_norm, tol: float,
                         max_cg: int):
  """(x, steps): preconditioned conjugate gradients for H x = ``grad`` (H = ``apply``).

  Stops after ``max_cg`` steps, at non-positive curvature, or when ``residual_norm`` of
  the residual is at most ``tol``; a zero or non-finite x falls back to the preconditioned
  gradient.
  """
  x = np.zeros_like(grad)
  r = grad.copy()
  z = precondition(r)
  p = z.copy()
  rz = inner(r, z)
  iterations = 0
  for _ in range(max_cg):
    hp = apply(p)
    iterations += 1
    curvature = inner(p, hp)
    if curvature <= 0:
      break
    alpha = rz / curvature
    x += alpha * p
    r -= alpha * hp
    if residual_norm(r) <= tol:
      break
    z = precondition(r)
    rz_new = inner(r, z)
    p = z + (rz_new / rz) * p
    rz = rz_new
  if not np.any(x) or not np.all(np.isfinite(x)):
    x = precondition(grad)
  return x, iterations
