"""Optimal dense factorizations A = B·C with a duality-gap certificate (numpy/scipy, no TF).

Two solvers, both through the Lagrange dual of the convex program in X = CᵀC:

- ``solve``: single participation (Denisov, McMahan, Rush, Smith, Thakurta 2022,
  arXiv:2202.08312): min tr(AᵀA X⁻¹) over PD X with X[i, i] ≤ 1 (Eq. 4), the map
  φ(v) = diagpart((V^½ AᵀA V^½)^½) (Eq. 5), X(v) (Eq. 6) and the lower bound
  tr(V(2X(v) − I)) (Eq. 8) valid for every v > 0; float64 throughout with a-priori
  eigenvalue floors for the square roots (App E.4); a lower-triangular C with
  CᵀC = X (Prop 2.2, here a reversed Cholesky factorization).
- ``solve_fixed_epoch``: (k, b)-fixed-epoch participation (Choquette-Choo, McMahan,
  Rush, Thakurta 2023, arXiv:2211.06530, Eq. 5): the same objective with columns of
  one user's rounds orthogonal and their squared norms summing to at most 1; see the
  comment block before ``FixedEpochDual``.

How ``solve`` is made fast (see benchmarks/results/factorization.md; BLAS
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

from tff_mf import checks
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
  dual_blocks: Optional[np.ndarray] = None  # fixed epoch: the pattern blocks Λ_j of the dual


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


def _symmetric_gram(a: np.ndarray) -> np.ndarray:
  """G = AᵀA, exactly symmetric."""
  gram = a.T @ a
  return 0.5 * (gram + gram.T)


def _gram_eigenvalue_floor(a: np.ndarray) -> float:
  """λ_min(G) = σ_min(A)² ≥ 1/‖A⁻¹‖²_F (Denisov et al. App E.4: a-priori eigenvalue floor)."""
  a_inv = scipy.linalg.solve_triangular(a, np.eye(a.shape[0]), lower=True, check_finite=False)
  return 1.0 / float(np.sum(np.square(a_inv)))


def _floored_eigh(m: np.ndarray, floor: float, what: str):
  """(Q, floored √Λ, count of numerically negative eigenvalues) of the symmetric M = ``what``.

  M is overwritten. Eigenvalues are floored at the a-priori bound ``floor`` (App E.4), so
  the square roots exist and the dual bound stays valid.
  """
  lam, q = scipy.linalg.eigh(m, lower=True, driver="evd", overwrite_a=True,
                             check_finite=False)
  if not (np.all(np.isfinite(lam)) and np.all(np.isfinite(q))):
    raise LossOfPositiveDefinitenessError(
        f"eigendecomposition of {what} produced non-finite values")
  negative = int(np.sum(lam < -1e-10 * max(abs(float(lam[-1])), 1e-300)))
  return q, np.sqrt(np.maximum(lam, floor)), negative


def _factors_from_gram(x: np.ndarray, a: np.ndarray, message: str):
  """(B, C): C lower triangular with CᵀC = X (Denisov et al. Prop 2.2), B = A C⁻¹.

  With J the reversal permutation, J X J = L Lᵀ gives C = J Lᵀ J; B C = A is solved as
  Cᵀ Bᵀ = Aᵀ (one triangular solve). ``message`` is the error when the Cholesky
  factorization finds X not positive definite.
  """
  try:
    chol = scipy.linalg.cholesky(x[::-1, ::-1], lower=True, check_finite=False)
  except np.linalg.LinAlgError as e:
    raise LossOfPositiveDefinitenessError(message) from e
  c = np.tril(np.ascontiguousarray(chol.T[::-1, ::-1]))
  b_t = scipy.linalg.solve_triangular(c, a.T, trans="T", lower=True, check_finite=False)
  return np.tril(b_t.T), c


class DualProblem:
  """The Eq. 4 problem for one workload A, evaluated through its dual in v (Eq. 5-8)."""

  def __init__(self, a: np.ndarray):
    self.a = workloads.validate_workload(a)
    self.n = self.a.shape[0]
    self.gram = _symmetric_gram(self.a)
    self.gram_eigenvalue_floor = _gram_eigenvalue_floor(self.a)

  def evaluate(self, v: np.ndarray, with_primal: bool = True) -> _Evaluation:
    """φ(v), the Eq. 8 bound and the rescaled primal from one ``eigh`` of M(v)."""
    r = np.sqrt(v)
    m = self.gram * r[:, None]
    m *= r[None, :]
    q, sqrt_lam, negative = _floored_eigh(m, float(np.min(v)) * self.gram_eigenvalue_floor,
                                          "diag(v)^½ AᵀA diag(v)^½")
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
    """(B, C) from X̃ = W⁻¹ Q Λ^½ Qᵀ W⁻¹ (unit diagonal) via ψ (Denisov et al. Prop 2.2).

    C is the lower-triangular factor with CᵀC = X̃: with J the reversal
    permutation, J X̃ J = L Lᵀ gives C = J Lᵀ J. B = A C⁻¹ by a triangular solve.
    """
    z = ev.q * np.sqrt(ev.sqrt_lam)[None, :]
    z /= np.sqrt(ev.phi)[:, None]
    x = z @ z.T
    x = 0.5 * (x + x.T)
    return _factors_from_gram(
        x, self.a, "X = CᵀC lost positive definiteness in the Cholesky factorization (ψ)")


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
  _check_solve_arguments(target_gap, max_iterations, acceleration, anderson_memory)
  run = _Run(target_gap=target_gap, callback=callback)
  problem = DualProblem(a)
  v = _initial_v(initial_v, problem.n)
  steps = _SingleSteps(acceleration, anderson_memory, max_cg_iterations)
  run.open_bar(progress, f"optimal n={problem.n}")
  try:
    while run.iterations < max_iterations:
      if run.out_of_time(time_limit):
        break
      ev = problem.evaluate(v)
      if run.update(ev, problem.factors, fz.loss, stall_iterations):
        break
      v = steps.next_v(ev, run.best)
  finally:
    run.bar.close()
  return _single_result(run, problem, steps, max_iterations, allow_unconverged)


def _check_solve_arguments(target_gap, max_iterations, acceleration, anderson_memory) -> None:
  if not 0 < target_gap < 1:
    raise ValueError(f"target_gap must be in (0, 1), got {target_gap}")
  if int(max_iterations) < 1:
    raise ValueError(f"max_iterations must be at least 1, got {max_iterations}")
  if acceleration not in ACCELERATIONS:
    raise ValueError(f"unknown acceleration {acceleration!r}; expected one of {ACCELERATIONS}")
  if anderson_memory < 1:
    raise ValueError(f"anderson_memory must be at least 1, got {anderson_memory}")


def _initial_v(initial_v: Optional[np.ndarray], n: int) -> np.ndarray:
  """The starting dual point: all ones, or a validated copy of ``initial_v``."""
  if initial_v is None:
    return np.ones(n)
  v = np.asarray(initial_v, dtype=np.float64).copy()
  if v.shape != (n,) or not np.all(np.isfinite(v)) or np.any(v <= 0):
    raise ValueError(f"initial_v must be {n} finite positive numbers")
  return v


@dataclasses.dataclass
class _Run:
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
          f"{self.iterations} iterations ({_STOP_REASONS[self.stop_reason]}); gap reached "
          f"{result.info['relative_gap']:.3g}. Raise max_iterations, loosen target_gap, or pass "
          f"allow_unconverged=True to use it anyway.", result)


@dataclasses.dataclass
class _SingleSteps:
  """The step rule of ``solve``: plain φ, Anderson mixing, or safeguarded Newton lines."""
  acceleration: str
  anderson_memory: int
  max_cg_iterations: int
  s_hist: List[np.ndarray] = dataclasses.field(default_factory=list)
  f_hist: List[np.ndarray] = dataclasses.field(default_factory=list)
  line: Optional["_NewtonLine"] = None
  restarts: int = 0
  backtracks: int = 0
  cg_total: int = 0

  def next_v(self, ev: _Evaluation, best: _Evaluation) -> np.ndarray:
    """The next dual point; a plain step from the best dual point when a safeguard fires."""
    if self.acceleration == "newton":
      v = self._newton(ev)
    else:
      v = _next_v(ev, best, self.s_hist, self.f_hist, self.acceleration, self.anderson_memory)
    if v is None:  # safeguard triggered: plain step from the best dual point
      self.restarts += 1
      self.s_hist.clear()
      self.f_hist.clear()
      v = best.phi.copy()
    return v

  def _newton(self, ev: _Evaluation) -> Optional[np.ndarray]:
    # Backtracking on the dual bound: a Newton step must not lower it.
    line = self.line
    if line is not None and ev.dual < line.base.dual - 1e-14 * abs(line.base.dual):
      line.scale *= 0.5
      self.backtracks += 1
      if line.scale >= _MIN_NEWTON_SCALE:
        return line.point()
      self.line = None
      return None
    self.line = _newton_line(ev, self.max_cg_iterations)
    self.cg_total += self.line.cg_iterations
    return self.line.point()


def _single_result(run: _Run, problem: DualProblem, steps: _SingleSteps, max_iterations: int,
                   allow_unconverged: bool) -> OptimalResult:
  """Packages ``solve``: factors, info, the rounding warning, NotConvergedError."""
  b, c, gap = run.finish(problem.factors, fz.loss)
  info = {
      **run.info(gap, max_iterations, steps.acceleration),
      "anderson_memory": int(steps.anderson_memory) if steps.acceleration == "anderson" else 0,
      "safeguard_restarts": steps.restarts,
      "cg_iterations": steps.cg_total,
      "newton_backtracks": steps.backtracks,
      "negative_eigenvalues_floored": run.negative_total,
  }
  if run.negative_total:
    warnings.warn(
        f"optimal factorization (n={problem.n}): {run.negative_total} eigenvalues of "
        "diag(v)^½ AᵀA diag(v)^½ came out negative (loss of positive definiteness by "
        "rounding) and were floored at the a-priori bound; the certificate accounts for it",
        RuntimeWarning)
  result = OptimalResult(b=b, c=c, v=run.best.v.copy(), info=info, history=run.history)
  run.check_converged(result, allow_unconverged, f"optimal factorization (n={problem.n})")
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


def _forcing_tolerance(grad_norm: float, reference_norm: float) -> float:
  """CG residual target min(0.1, (‖∇‖/‖ref‖)^FORCING_POWER)·‖∇‖ (Eisenstat–Walker style)."""
  return min(0.1, (grad_norm / reference_norm) ** FORCING_POWER) * grad_norm


def _conjugate_gradients(apply, precondition, grad, inner, residual_norm, tol: float,
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

  tol = _forcing_tolerance(float(np.linalg.norm(grad)), float(np.linalg.norm(v)))
  x, iterations = _conjugate_gradients(
      apply_p, lambda r: r / precond, grad, inner=lambda x, y: float(x @ y),
      residual_norm=lambda r: float(np.linalg.norm(r)), tol=tol, max_cg=max_cg)
  return _NewtonLine(base=ev, v_base=v, direction=np.clip(x, -_MAX_LOG_STEP, _MAX_LOG_STEP),
                     cg_iterations=iterations)


# ============================================================================= fixed epoch
#
# Multi-epoch optimum (Choquette-Choo, McMahan, Rush, Thakurta 2023, arXiv:2211.06530,
# Eq. 5): under (k, b)-participation (n = k·b rounds; user j takes rounds
# P_j = {j, j+b, …, j+(k−1)b}) minimize tr(G X⁻¹), G = AᵀA, over PD X with
#   X_st = 0 for s ≠ t in the same pattern   (columns of one user orthogonal), and
#   Σ_{t∈P_j} X_tt ≤ 1 for every pattern j    (then sensitivity² = max_j Σ X_tt ≤ 1).
#
# Lagrange dual. The multiplier is a symmetric Λ supported on same-pattern entries,
# with diagonal v_j on pattern j (the constraint Σ X_tt ≤ 1 has one multiplier) and free
# off-diagonal entries. For Λ ≻ 0, min_X tr(G X⁻¹) + ⟨Λ, X⟩ is attained at
#   X(Λ) = Λ^-½ (Λ^½ G Λ^½)^½ Λ^-½ = L⁻ᵀ M^½ L⁻¹,   M = Lᵀ G L, Λ = L Lᵀ,
# so d(Λ) = 2·tr M^½ − Σ_j v_j ≤ every feasible loss (weak duality), and — as in Eq. 8
# of Denisov et al. for k = 1 — its best multiple d(tΛ) gives (tr M^½)²/Σ_j v_j.
# Ordering the rounds pattern by pattern makes Λ block diagonal with b blocks of k x k,
# so M costs O(n²k) and one ``eigh`` of M gives: the bound; the pattern blocks of X(Λ),
# which are the gradient of d (∂d/∂v_j = tr X_jj − 1, ∂d/∂Λ_ac = 2 X_ac); Hessian
# products by the Daleckii–Krein formula (two n x n products each); and a FEASIBLE
# primal point X̃ = R X(Λ) Rᵀ with R_j = D_j^½ X_jj^-½ (block diagonal, D_j = the
# diagonal of X_jj divided by its trace), whose pattern blocks are exactly the diagonal
# D_j of trace 1; its loss tr(G X̃⁻¹) = ‖A R⁻ᵀ L Q Λ_M^-¼‖²_F costs one triangular product.
# Newton steps on the concave dual close the gap in 4-6 ``eigh`` for prefix sums and
# 10-20 for momentum workloads with learning-rate cooldowns: conjugate gradients
# preconditioned by the within-pattern Hessian blocks (the Daleckii–Krein kernel
# replaced there by a low-rank pivoted Cholesky factor), steps that keep Λ ≻ 0 (v_j
# shrinks multiplicatively, as the log-v steps of ``solve``), halved while Λ is not PD
# or the bound would decrease.

# Low-rank approximation of the Daleckii–Krein kernel κ used by the block preconditioner.
PRECONDITIONER_RANK = 64
PRECONDITIONER_RTOL = 1e-6


def _pivoted_cholesky_kernel(s: np.ndarray, max_rank: int, rtol: float) -> np.ndarray:
  """F (n x r) with F Fᵀ ≈ κ, κ_kl = s_k s_l/(s_k + s_l), by pivoted Cholesky (O(n r²)).

  Stops when the trace of the remainder is below rtol·tr κ (or at max_rank).
  """
  n = s.shape[0]
  diag = 0.5 * s.copy()
  total = float(np.sum(diag))
  rank = min(max_rank, n)
  f = np.zeros((n, rank))
  for r in range(rank):
    i = int(np.argmax(diag))
    if diag[i] <= 0 or float(np.sum(diag)) <= rtol * total:
      return f[:, :r]
    col = s[i] * s / (s[i] + s) - f[:, :r] @ f[i, :r]
    f[:, r] = col / np.sqrt(diag[i])
    diag = np.maximum(diag - np.square(f[:, r]), 0.0)
  return f


# Largest number of step halvings before a block-scaling fallback step.
_MAX_HALVINGS = 30
_MAX_DUAL_HALVINGS = 5


@dataclasses.dataclass
class _EpochEvaluation:
  """What one eigendecomposition of M(Λ) yields (pattern-major coordinates)."""
  theta: np.ndarray  # [b, m]: v_j, then the upper off-diagonal entries of Λ_j
  chol: np.ndarray  # [b, k, k] lower Cholesky factors L_j of Λ_j
  chol_inv: np.ndarray  # [b, k, k] L_j⁻¹
  q: np.ndarray  # eigenvectors of M
  sqrt_lam: np.ndarray  # floored square roots of the eigenvalues of M
  dual: float  # best-multiple dual bound (tr M^½)² / Σ v_j
  x_blocks: np.ndarray  # [b, k, k] pattern blocks of X(Λ)
  primal: float  # tr(G X̃⁻¹) of the feasible projection X̃
  r_inv_t: Optional[np.ndarray]  # [b, k, k] R_j⁻ᵀ = D_j^-½ X_jj^½ (None if X_jj singular)
  d_blocks: Optional[np.ndarray]  # [b, k] the diagonal D_j of X̃'s pattern blocks
  negative_eigenvalues: int

  @property
  def trace(self) -> float:
    return float(np.sum(self.sqrt_lam))

  @property
  def v_sum(self) -> float:
    return float(np.sum(self.theta[:, 0]))


class FixedEpochDual:
  """The arXiv:2211.06530 Eq. 5 problem for one workload A and k epochs, through its dual."""

  def __init__(self, a: np.ndarray, epochs: int):
    self.a = workloads.validate_workload(a)
    n = self.n = self.a.shape[0]
    from tff_mf import participation  # pylint: disable=g-import-not-at-top
    self.schema = participation.fixed_epoch(epochs).check(n)
    k = self.k = self.schema.epochs
    b = self.b = n // k
    checks.dense_matrices_fit(n, 14.0, f"fixed-epoch optimal factorization for n={n}")
    # Position j·k + e holds round j + e·b (pattern j is a contiguous block).
    self.perm = self.schema.pattern_indices(n).reshape(-1)
    gram = _symmetric_gram(self.a)
    self.gram = np.ascontiguousarray(gram[np.ix_(self.perm, self.perm)])
    self.gram_eigenvalue_floor = _gram_eigenvalue_floor(self.a)
    self.upper = np.triu_indices(k, 1)
    self.m = 1 + len(self.upper[0])  # dual coordinates per pattern
    # Basis of the θ coordinates as k x k matrices (I for v_j; e_a e_cᵀ + e_c e_aᵀ).
    self.basis = np.zeros((self.m, k, k))
    self.basis[0] = np.eye(k)
    for i, (r, c) in enumerate(zip(*self.upper)):
      self.basis[i + 1, r, c] = self.basis[i + 1, c, r] = 1.0
    self.pairs = np.triu_indices(k)  # unique (a, a') with a ≤ a'
    self.pair_index = np.zeros((k, k), dtype=np.int64)
    self.pair_index[self.pairs] = np.arange(len(self.pairs[0]))
    self.pair_index[self.pairs[1], self.pairs[0]] = np.arange(len(self.pairs[0]))

  # -- coordinates

  def initial_theta(self) -> np.ndarray:
    theta = np.zeros((self.b, self.m))
    theta[:, 0] = 1.0
    return theta

  def blocks(self, theta: np.ndarray) -> np.ndarray:
    """Λ_j (b x k x k) from θ (b x m)."""
    return np.einsum("jm,mac->jac", theta, self.basis)

  def to_theta(self, blocks: np.ndarray) -> np.ndarray:
    """The adjoint of ``blocks``: ⟨blocks, Λ(θ)⟩ = ⟨to_theta(blocks), θ⟩."""
    return np.einsum("jac,mac->jm", blocks, self.basis)

  def per_round(self, values: np.ndarray) -> np.ndarray:
    """[b, k] pattern-major values -> length-n array in round order."""
    out = np.empty(self.n)
    out[self.perm] = np.asarray(values).reshape(-1)
    return out

  # -- evaluation

  def evaluate(self, theta: np.ndarray, with_primal: bool = True) -> Optional[_EpochEvaluation]:
    """Bound, gradient blocks and feasible primal at Λ(θ); None when Λ is not PD."""
    n, b, k = self.n, self.b, self.k
    lam_blocks = self.blocks(theta)
    lam_min = np.linalg.eigvalsh(lam_blocks)[:, 0]
    if not np.all(lam_min > 0) or not np.all(np.isfinite(theta)):
      return None
    try:
      chol = np.linalg.cholesky(lam_blocks)
    except np.linalg.LinAlgError:
      return None
    chol_inv = np.linalg.inv(chol)
    # M = Lᵀ G L for L = blockdiag(L_j): O(n²k).
    gl = np.matmul(self.gram.reshape(n, b, k).transpose(1, 0, 2), chol)  # G L, [b, n, k]
    gl = gl.transpose(1, 0, 2).reshape(n, n)  # columns in pattern-major order
    m = np.matmul(chol.transpose(0, 2, 1), gl.reshape(b, k, n)).reshape(n, n)  # Lᵀ (G L)
    m = 0.5 * (m + m.T)
    # λ_min(M) ≥ λ_min(Λ)·λ_min(G): an a-priori floor (Denisov et al. App E.4).
    q, sqrt_lam, negative = _floored_eigh(m, float(np.min(lam_min)) * self.gram_eigenvalue_floor,
                                          "Lᵀ AᵀA L (fixed-epoch dual)")
    trace = float(np.sum(sqrt_lam))
    dual = trace * trace / float(np.sum(theta[:, 0]))
    q3 = q.reshape(b, k, n)
    s_blocks = np.matmul(q3 * sqrt_lam, q3.transpose(0, 2, 1))  # pattern blocks of M^½
    x_blocks = np.matmul(np.matmul(chol_inv.transpose(0, 2, 1), s_blocks), chol_inv)
    x_blocks = 0.5 * (x_blocks + x_blocks.transpose(0, 2, 1))
    ev = _EpochEvaluation(theta=theta, chol=chol, chol_inv=chol_inv, q=q, sqrt_lam=sqrt_lam,
                          dual=dual, x_blocks=x_blocks, primal=float("inf"), r_inv_t=None,
                          d_blocks=None, negative_eigenvalues=negative)
    if with_primal:
      self._primal(ev)
    return ev

  def _primal(self, ev: _EpochEvaluation) -> None:
    """Feasible X̃ = R X(Λ) Rᵀ and its loss ‖A R⁻ᵀ L Q Λ_M^-¼‖²_F (one triangular product)."""
    n, b, k = self.n, self.b, self.k
    w, u = np.linalg.eigh(ev.x_blocks)
    if not np.all(w > 0):
      return
    d = np.diagonal(ev.x_blocks, axis1=1, axis2=2)
    d = d / np.sum(d, axis=1, keepdims=True)
    x_half = np.matmul(u * np.sqrt(w)[:, None, :], u.transpose(0, 2, 1))
    r_inv_t = x_half / np.sqrt(d)[:, :, None]  # D_j^-½ X_jj^½
    w_blocks = np.matmul(r_inv_t, ev.chol)  # R_j⁻ᵀ L_j
    wq = np.matmul(w_blocks, ev.q.reshape(b, k, n)).reshape(n, n)
    rounds = np.empty_like(wq)
    rounds[self.perm] = wq
    rounds *= (1.0 / np.sqrt(ev.sqrt_lam))[None, :]
    aw = scipy_blas.dtrmm(1.0, self.a, rounds, side=0, lower=1, overwrite_b=1)
    ev.primal = float(np.sum(np.square(aw)))
    ev.r_inv_t = r_inv_t
    ev.d_blocks = d

  def gradient(self, ev: _EpochEvaluation, scale: float = 1.0) -> np.ndarray:
    """∇_θ d at t·Λ(θ) (t = ``scale``): X(tΛ) = X(Λ)/√t."""
    g = self.to_theta(ev.x_blocks / np.sqrt(scale))
    g[:, 0] -= 1.0
    return g

  def step(self, theta: np.ndarray, direction: np.ndarray, t: float) -> np.ndarray:
    """θ moved by t·δ. v_j grows linearly and shrinks multiplicatively (v·exp(t·δv/v), like
    the log-v steps of ``solve``), so it stays positive; the off-diagonal correlations
    Γ_j = Λ_j/v_j − I move by their first-order change t·(δμ − Γ·δv)/v."""
    v = theta[:, :1]
    dv = t * direction[:, :1]
    v_new = np.where(dv >= 0, v + dv, v * np.exp(np.maximum(dv / v, -_MAX_LOG_STEP)))
    gamma = theta[:, 1:] / v
    gamma_new = gamma + t * (direction[:, 1:] - gamma * direction[:, :1]) / v
    return np.concatenate([v_new, v_new * gamma_new], axis=1)

  # -- Newton direction

  def newton_direction(self, ev: _EpochEvaluation, scale: float, max_cg: int):
    """Solves (−∇²d) δ = ∇d at t·Λ(θ) by preconditioned CG; returns (δ, CG steps).

    With F = Qᵀ L⁻¹ΔL⁻ᵀ Q (Δ = Λ(δ)) the second derivative of 2·tr M^½ along Δ is
    −Σ_kl F_kl²·κ_kl with κ_kl = s_k s_l/(s_k + s_l), s = √eig(M) (Daleckii–Krein, first
    divided differences of x ↦ 1/(2√x)); products run in CG_DTYPE. The preconditioner
    is the Hessian restricted to each pattern's own coordinates, with κ ≈ F Fᵀ of low
    rank (``_pivoted_cholesky_kernel``).
    """
    n, b, k = self.n, self.b, self.k
    root = np.sqrt(scale)
    s = ev.sqrt_lam * root
    kernel = ((s[:, None] * s[None, :]) / (s[:, None] + s[None, :])).astype(CG_DTYPE)
    q = ev.q.astype(CG_DTYPE)
    q3 = q.reshape(b, k, n)
    chol_inv = ev.chol_inv / root
    chol_inv_t = chol_inv.transpose(0, 2, 1)

    def apply_h(x):  # −∇²d · x
      delta_p = np.matmul(np.matmul(chol_inv, self.blocks(x)), chol_inv_t).astype(CG_DTYPE)
      f = q.T @ np.matmul(delta_p, q3).reshape(n, n)
      f *= kernel
      u = (q @ f).reshape(b, k, n)
      y = np.matmul(u, q3.transpose(0, 2, 1)).astype(np.float64)
      return self.to_theta(np.matmul(np.matmul(chol_inv_t, y), chol_inv))

    pre_inv = self._block_preconditioner(q3, s, chol_inv, chol_inv_t)

    def precondition(r):
      return np.matmul(pre_inv, r[:, :, None])[:, :, 0]

    grad = self.gradient(ev, scale)
    # Residuals are measured relative to v (as φ − v = v·∂d/∂log v for k = 1).
    weight = ev.theta[:, :1] * scale
    tol = _forcing_tolerance(float(np.linalg.norm(weight * grad)), float(np.linalg.norm(weight)))
    return _conjugate_gradients(
        apply_h, precondition, grad, inner=lambda x, y: float(np.sum(x * y)),
        residual_norm=lambda r: float(np.linalg.norm(weight * r)), tol=tol, max_cg=max_cg)

  def _block_preconditioner(self, q3, s, chol_inv, chol_inv_t) -> np.ndarray:
    """[b, m, m] inverses of the within-pattern blocks of −∇²d (the CG preconditioner).

    The blocks are T[(a,a'),(c,c')] = (q_a∘q_a')ᵀ κ (q_c∘q_c') with κ replaced by a
    low-rank F Fᵀ (pivoted Cholesky; κ is Cauchy-like, its spectrum decays fast).
    """
    n, b, k = self.n, self.b, self.k
    ia, ib = self.pairs
    prods = q3[:, ia, :] * q3[:, ib, :]  # [b, P, n]
    factor = _pivoted_cholesky_kernel(s, PRECONDITIONER_RANK, PRECONDITIONER_RTOL)
    kp = (prods.reshape(-1, n) @ factor.astype(CG_DTYPE)).reshape(b, -1, factor.shape[1])
    t_pairs = np.matmul(kp, kp.transpose(0, 2, 1)).astype(np.float64)  # [b, P, P]
    idx = self.pair_index
    # 𝒯[(a,c),(a',c')] = T[(a,a'),(c,c')]
    t4 = t_pairs[:, idx[:, None, :, None], idx[None, :, None, :]]  # [b, a, c, a', c']
    t4 = np.ascontiguousarray(t4.reshape(b, k * k, k * k))  # (BLAS needs contiguous blocks)
    e = np.matmul(np.matmul(chol_inv[:, None], self.basis[None]), chol_inv_t[:, None])
    e = e.reshape(b, self.m, k * k)
    pre = np.matmul(np.matmul(e, t4), e.transpose(0, 2, 1))
    pre = 0.5 * (pre + pre.transpose(0, 2, 1))
    diag = np.maximum(np.einsum("jmm->jm", pre), 0.0)
    pre += (1e-10 * np.max(diag, axis=1) + 1e-300)[:, None, None] * np.eye(self.m)
    try:
      return np.linalg.inv(pre)
    except np.linalg.LinAlgError:
      return np.eye(self.m)[None] / np.maximum(diag, 1e-300)[:, :, None]

  # -- factors

  def projected_gram(self, ev: _EpochEvaluation) -> np.ndarray:
    """X̃ = R X(Λ) Rᵀ in round order, its pattern blocks set exactly to diag(D_j)."""
    if ev.r_inv_t is None:
      raise LossOfPositiveDefinitenessError("a pattern block of X(Λ) is not positive definite")
    n, b, k = self.n, self.b, self.k
    r_blocks = np.linalg.inv(ev.r_inv_t).transpose(0, 2, 1)  # R_j
    # X̃ = Zᵀ Z with Z = Λ_M^¼ Qᵀ L⁻¹ Rᵀ (pattern-major).
    lr = np.matmul(ev.chol_inv, r_blocks.transpose(0, 2, 1))  # L_j⁻¹ R_jᵀ
    z = np.matmul(ev.q.reshape(b, k, n).transpose(2, 0, 1)[:, :, None, :],
                  lr[None]).reshape(n, n)  # Qᵀ·blockdiag, rows = eigen index
    z *= np.sqrt(ev.sqrt_lam)[:, None]
    x = z.T @ z
    x = 0.5 * (x + x.T)
    d = ev.d_blocks / np.sum(ev.d_blocks, axis=1, keepdims=True)
    blocks = x.reshape(b, k, b, k)
    jj = np.arange(b)
    blocks[jj, :, jj, :] = d[:, :, None] * np.eye(k)[None]
    out = np.empty_like(x)
    out[np.ix_(self.perm, self.perm)] = x
    return out

  def factors(self, ev: _EpochEvaluation):
    """(B, C): C lower triangular with CᵀC = X̃ (reversed Cholesky), B = A C⁻¹."""
    return _factors_from_gram(
        self.projected_gram(ev), self.a,
        "the projected X = CᵀC lost positive definiteness in the Cholesky factorization")

  def loss(self, b: np.ndarray, c: np.ndarray) -> float:
    """sens²·‖B‖²_F with the fixed-epoch sensitivity of the C returned (an upper bound)."""
    from tff_mf import participation  # pylint: disable=g-import-not-at-top
    sens = participation.sensitivity(c, self.schema)
    return sens * sens * float(np.sum(np.square(b)))


def solve_fixed_epoch(a: np.ndarray,
                      epochs: int,
                      target_gap: float = 1e-6,
                      max_iterations: int = 1000,
                      allow_unconverged: bool = False,
                      progress: bool = False,
                      max_cg_iterations: int = 200,
                      stall_iterations: int = 30,
                      time_limit: Optional[float] = None,
                      callback: Optional[Callable[[Dict[str, float]], None]] = None
                      ) -> OptimalResult:
  """Optimal A = B·C under (k, b)-fixed-epoch participation, to a certified gap.

  Solves arXiv:2211.06530 Eq. 5 (see the comment block above) through its dual. The
  returned C has Σ_{t∈P_j} ‖C[:, t]‖² = 1 on every pattern and orthogonal columns within
  each pattern, so its fixed-epoch sensitivity is 1 (``info['sensitivity']``); the gap
  (loss − bound)/loss is measured with loss = sensitivity²·‖B‖²_F of the (B, C) returned.
  k = 1 is the single-participation problem (Denisov et al. 2022, arXiv:2202.08312, Eq. 4).

  Args:
    a: workload, n x n lower triangular, full rank (validated).
    epochs: k ≥ 1, dividing n.
    target_gap: stop when the relative duality gap is at most this.
    max_iterations: limit on eigendecompositions.
    allow_unconverged: return (``info['converged']`` False) instead of raising
      NotConvergedError when the gap is not reached.
    progress: tqdm bar on stderr showing the gap.
    max_cg_iterations: conjugate-gradient steps per Newton step at most.
    stall_iterations: stop after this many evaluations without a relative 1e-13 gain.
    time_limit: optional wall-clock limit in seconds, checked between iterations.
    callback: called with each history record.

  Returns:
    OptimalResult; ``v`` holds the per-round diagonal of Λ and ``dual_blocks`` the
    pattern blocks Λ_j ([b, k, k], pattern j = rounds j, j+b, …).
  """
  if not 0 < target_gap < 1:
    raise checks.CheckError(f"target_gap must be in (0, 1), got {target_gap}")
  max_iterations = checks.positive_int(max_iterations, "max_iterations")
  run = _Run(target_gap=target_gap, callback=callback)
  problem = FixedEpochDual(a, epochs)
  steps = _EpochSteps(problem, max_cg_iterations, theta=problem.initial_theta())
  run.open_bar(progress, f"fixed-epoch optimal n={problem.n} k={problem.k}")
  try:
    while run.iterations < max_iterations:
      if run.out_of_time(time_limit):
        break
      ev = problem.evaluate(steps.theta)
      if ev is None:  # Λ not PD: shorten the step without an eigendecomposition
        steps.not_positive_definite(run.best)
        continue
      if run.update(ev, problem.factors, problem.loss, stall_iterations):
        break
      steps.advance(ev, run.best)
  finally:
    run.bar.close()
  return _fixed_epoch_result(run, problem, steps, max_iterations, allow_unconverged)


@dataclasses.dataclass
class _EpochSteps:
  """The step rule of ``solve_fixed_epoch``: Newton steps from the best multiple t·Λ, halved
  while Λ is not PD or the bound would decrease, else a block-scaling fallback step."""
  problem: "FixedEpochDual"
  max_cg_iterations: int
  theta: np.ndarray  # the next point to evaluate
  base: Optional[_EpochEvaluation] = None  # the point the current Newton step starts from
  base_theta: Optional[np.ndarray] = None
  direction: Optional[np.ndarray] = None
  step: float = 1.0
  halvings: int = 0
  backtracks: int = 0
  fallbacks: int = 0
  cg_total: int = 0

  def not_positive_definite(self, best: _EpochEvaluation) -> None:
    self.halvings += 1
    self.backtracks += 1
    if self.base is None or self.halvings > _MAX_HALVINGS:
      self._fall_back(best)
    else:
      self._halve()

  def advance(self, ev: _EpochEvaluation, best: _EpochEvaluation) -> None:
    if self.base is not None and ev.dual < self.base.dual - 1e-14 * abs(self.base.dual):
      # The step lowered the bound: halve it (the Newton model overshot).
      self.halvings += 1
      self.backtracks += 1
      if self.halvings <= _MAX_DUAL_HALVINGS:
        self._halve()
      else:
        self._fall_back(best)
      return
    # Newton step from the best multiple t·Λ (free: d(tΛ) is maximal there).
    scale = (ev.trace / ev.v_sum) ** 2
    self.direction, cg = self.problem.newton_direction(ev, scale, self.max_cg_iterations)
    self.cg_total += cg
    self.base, self.base_theta, self.step, self.halvings = ev, ev.theta * scale, 1.0, 0
    self.theta = self.problem.step(self.base_theta, self.direction, 1.0)

  def _halve(self) -> None:
    self.step *= 0.5
    self.theta = self.problem.step(self.base_theta, self.direction, self.step)

  def _fall_back(self, best: _EpochEvaluation) -> None:
    # Scale each block Λ_j by tr X_jj (stays PD): the φ step of Denisov Eq. 5 for k = 1.
    self.fallbacks += 1
    self.theta = best.theta * np.trace(best.x_blocks, axis1=1, axis2=2)[:, None]
    self.base, self.halvings = None, 0


def _fixed_epoch_result(run: _Run, problem: FixedEpochDual, steps: _EpochSteps,
                        max_iterations: int, allow_unconverged: bool) -> OptimalResult:
  """Packages ``solve_fixed_epoch``: factors, sensitivity, info, warning, NotConvergedError."""
  b, c, gap = run.finish(problem.factors, problem.loss)
  n, k = problem.n, problem.k
  from tff_mf import participation  # pylint: disable=g-import-not-at-top
  report = participation.sensitivity_report(c, problem.schema)
  info = {
      **run.info(gap, max_iterations, "newton"),
      "epochs": int(k),
      "participation": problem.schema.as_dict(),
      "sensitivity": float(report["value"]),
      "sensitivity_exact": bool(report["exact"]),
      "rmse": float(report["value"] * np.sqrt(np.sum(np.square(b)) / n)),
      "cg_iterations": steps.cg_total,
      "newton_backtracks": steps.backtracks,
      "fallback_steps": steps.fallbacks,
      "negative_eigenvalues_floored": run.negative_total,
  }
  if run.negative_total:
    warnings.warn(
        f"fixed-epoch optimal factorization (n={n}, k={k}): {run.negative_total} eigenvalues "
        "of Lᵀ AᵀA L came out negative (rounding) and were floored at the a-priori bound; the "
        "certificate accounts for it", RuntimeWarning)
  lam_blocks = problem.blocks(run.best.theta)
  v = problem.per_round(np.repeat(run.best.theta[:, :1], k, axis=1))
  result = OptimalResult(b=b, c=c, v=v, info=info, history=run.history, dual_blocks=lam_blocks)
  run.check_converged(result, allow_unconverged,
                      f"fixed-epoch optimal factorization (n={n}, k={k})")
  return result


# ----------------------------------------------------------------------------- family interface

# Bumped whenever the output for the same inputs changes (part of the cache key).
VERSION = "3"


def factorize(a: np.ndarray, spec, context):
  """The optimal C for A: ``solve`` (single participation) or ``solve_fixed_epoch``."""
  from tff_mf.families import FamilyResult  # pylint: disable=g-import-not-at-top
  progress = bool(context and context.progress)
  if a.shape[0] == 1:  # one round: C = [1] is optimal for every schema, with gap 0
    return FamilyResult(b=a.copy(), c=np.ones((1, 1)),
                        info={"relative_gap": 0.0, "iterations": 0, "converged": True})
  kwargs = dict(target_gap=spec.target_gap, max_iterations=spec.max_iterations,
                allow_unconverged=spec.allow_unconverged, progress=progress)
  if spec.participation.kind == "fixed_epoch":
    result = solve_fixed_epoch(a, spec.participation.epochs, **kwargs)
  else:
    result = solve(a, **kwargs)
  return FamilyResult(b=result.b, c=result.c, info=dict(result.info))
