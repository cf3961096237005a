"""Optimal dense factorization A = B·C for single participation, with a duality-gap
certificate (numpy/scipy, no TF).

``solve`` works through the Lagrange dual of the convex program in X = CᵀC (Denisov,
McMahan, Rush, Smith, Thakurta 2022, arXiv:2202.08312): min tr(AᵀA X⁻¹) over PD X with
X[i, i] ≤ 1 (Eq. 4), the map φ(v) = diagpart((V^½ AᵀA V^½)^½) (Eq. 5), X(v) (Eq. 6) and
the lower bound tr(V(2X(v) − I)) (Eq. 8) valid for every v > 0; float64 throughout with
a-priori eigenvalue floors for the square roots (App E.4); a lower-triangular C with
CᵀC = X (Prop 2.2, here a reversed Cholesky factorization). The run loop is shared with
the fixed-epoch solver (``tff_mf.factorization.dense_run``).

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

3. Cheaper evaluations where A⁻¹ is lower bidiagonal (the prefix sum; S·diag(η)).
   M(v)⁻¹ = V^-½ A⁻¹A⁻ᵀ V^-½ is then tridiagonal and ``TridiagonalDualProblem`` takes
   its eigenpairs from LAPACK ``stemr`` (Dhillon & Parlett 2004) in O(n²) memory-bound
   work, the primal from a bidiagonal solve: an evaluation costs less than one Hessian
   product, so Anderson steps (more, cheaper evaluations) replace Newton there; ψ
   (one Cholesky factorization and one triangular solve) is the only O(n³) work left.

The certificate stays a true lower bound whatever the iterates do: d(v) is
evaluated from the eigenvalues of M, floored at the a-priori bound
λ_min(M) ≥ min(v)·λ_min(G) ≥ min(v)/‖A⁻¹‖²_F (a valid bound, so the floor
only removes rounding error), and the reported gap is measured against the
loss of the (B, C) actually returned.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Callable, Dict, List, Optional

import numpy as np
import scipy.linalg
from scipy.linalg import blas as scipy_blas

from tff_mf import checks
from tff_mf.factorization import dense_run
from tff_mf import factorization as fz
from tff_mf.factorization import workloads

ACCELERATIONS = ("newton", "anderson", "none")  # and "auto", which picks one of them
EIGENSOLVERS = ("auto", "dense", "tridiagonal")
DEFAULT_ANDERSON_MEMORY = 10
# Smallest fraction of a Newton step tried before falling back to a plain φ step.
_MIN_NEWTON_SCALE = 1.0 / 16


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
    return dense_run.relative_gap(self.primal, self.dual)


class DualProblem:
  """The Eq. 4 problem for one workload A, evaluated through its dual in v (Eq. 5-8)."""

  def __init__(self, a: np.ndarray):
    self.a = workloads.validate_workload(a)
    self.n = self.a.shape[0]
    self.gram = dense_run.symmetric_gram(self.a)
    self.gram_eigenvalue_floor = dense_run.gram_eigenvalue_floor(self.a)

  def evaluate(self, v: np.ndarray, with_primal: bool = True) -> _Evaluation:
    """φ(v), the Eq. 8 bound and the rescaled primal from one ``eigh`` of M(v)."""
    r = np.sqrt(v)
    m = self.gram * r[:, None]
    m *= r[None, :]
    q, sqrt_lam, negative = dense_run.floored_eigh(
        m, float(np.min(v)) * self.gram_eigenvalue_floor, "diag(v)^½ AᵀA diag(v)^½")
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
    return dense_run.factors_from_gram(_feasible_gram(ev), self.a, _PSI_ERROR)


_PSI_ERROR = "X = CᵀC lost positive definiteness in the Cholesky factorization (ψ)"


def _feasible_gram(ev: _Evaluation) -> np.ndarray:
  """The upper triangle of X̃ = Z Zᵀ, Z = W⁻¹ Q Λ^¼ (all ψ reads; one ``syrk``)."""
  z = ev.q * np.sqrt(ev.sqrt_lam)[None, :]
  z /= np.sqrt(ev.phi)[:, None]
  return scipy_blas.dsyrk(1.0, z, lower=0)


class TridiagonalDualProblem(DualProblem):
  """``DualProblem`` for an A whose inverse L is lower bidiagonal (the prefix sum S).

  Then M(v)⁻¹ = V^-½ L Lᵀ V^-½ is tridiagonal: its eigenpairs (μ_k, q_k) — those of M with
  λ_k = 1/μ_k — come from LAPACK ``stemr`` (multiple relatively robust representations,
  Dhillon & Parlett 2004) in O(n²) instead of a dense ``eigh`` of M, and A·W·Q of the
  primal is a bidiagonal solve. The Eq. 8 bound is scaled by (1 − ‖A·L − I‖_F)², so it
  is a bound for A itself (AᵀA ⪰ (1 − ‖A L − I‖₂)²·L⁻ᵀL⁻¹); ψ and the loss use A.
  """

  def __init__(self, a: np.ndarray, inverse=None):  # pylint: disable=super-init-not-called
    self.a = workloads.validate_workload(a)
    self.n = self.a.shape[0]
    inverse = workloads.bidiagonal_inverse(self.a) if inverse is None else inverse
    if inverse is None:
      raise checks.CheckError("eigensolver 'tridiagonal' needs a workload whose inverse is "
                              "lower bidiagonal (such as the prefix sum)")
    d, s, residual = inverse
    self.band = np.vstack([d, np.append(s, 0.0)])  # LAPACK lower band storage of L
    self.inverse_diagonal = np.square(d)  # diag(L Lᵀ)
    self.inverse_diagonal[1:] += np.square(s)
    self.inverse_offdiagonal = d[:-1] * s  # subdiagonal of L Lᵀ
    self.bound_factor = (1.0 - residual) ** 2
    self.exact_inverse = residual == 0.0
    self.gram_eigenvalue_floor = 1.0 / float(np.sum(np.square(d)) + np.sum(np.square(s)))

  def evaluate(self, v: np.ndarray, with_primal: bool = True) -> _Evaluation:
    """φ(v), the Eq. 8 bound and the rescaled primal from ``stemr`` of M(v)⁻¹."""
    r = 1.0 / np.sqrt(v)
    try:
      mu, q = scipy.linalg.eigh_tridiagonal(
          self.inverse_diagonal * np.square(r), self.inverse_offdiagonal * r[:-1] * r[1:],
          lapack_driver="stemr", check_finite=False)
    except (np.linalg.LinAlgError, ValueError) as e:
      raise dense_run.LossOfPositiveDefinitenessError(
          f"tridiagonal eigendecomposition of diag(v)^-½ (AᵀA)⁻¹ diag(v)^-½ failed: {e}") from e
    if not (np.all(np.isfinite(mu)) and np.all(np.isfinite(q))):
      raise dense_run.LossOfPositiveDefinitenessError(
          "tridiagonal eigendecomposition of diag(v)^-½ (AᵀA)⁻¹ diag(v)^-½ produced non-finite values")
    negative = int(np.sum(mu <= 0))
    floor = float(np.min(v)) * self.gram_eigenvalue_floor
    lam = np.divide(1.0, mu, out=np.full_like(mu, floor), where=mu > 0)
    sqrt_lam = np.sqrt(np.maximum(lam, floor))
    phi = np.square(q) @ sqrt_lam
    trace = float(np.sum(sqrt_lam))
    dual = self.bound_factor * trace * trace / float(np.sum(v))  # see DualProblem.evaluate
    primal = self._rescaled_primal(q, sqrt_lam, phi) if with_primal else float("inf")
    return _Evaluation(v=v, q=q, sqrt_lam=sqrt_lam, phi=phi, dual=dual, primal=primal,
                       negative_eigenvalues=negative)

  def _rescaled_primal(self, q, sqrt_lam, phi) -> float:
    """Σ_k ‖A W q_k‖² / √λ_k with A W Q = L⁻¹ W Q (a bidiagonal solve)."""
    awq = self._solve_inverse(q * np.sqrt(phi)[:, None])
    return float(np.sum(np.sum(np.square(awq), axis=0) / sqrt_lam))

  def _solve_inverse(self, y: np.ndarray) -> np.ndarray:
    """L⁻¹ y (LAPACK ``tbtrs``, O(n) a column), overwriting y."""
    x, info = scipy.linalg.lapack.dtbtrs(self.band, y, uplo="L", overwrite_b=1)
    if info != 0:
      raise dense_run.LossOfPositiveDefinitenessError(f"bidiagonal solve failed (info {info})")
    return x

  def factors(self, ev: _Evaluation):
    """ψ as in ``DualProblem.factors``; when A·L = I holds exactly in float64 (the prefix
    sum), B = A C⁻¹ = L⁻¹ C⁻¹ from a triangular inverse (n³/3) and a bidiagonal solve,
    instead of a triangular solve with n right-hand sides (n³)."""
    if not self.exact_inverse:
      return super().factors(ev)
    c = dense_run.encoder_from_gram(_feasible_gram(ev), _PSI_ERROR)
    c_inv, info = scipy.linalg.lapack.dtrtri(c, lower=1)
    if info != 0:
      raise dense_run.LossOfPositiveDefinitenessError(_PSI_ERROR)
    return np.tril(self._solve_inverse(np.tril(c_inv))), c


def make_problem(a: np.ndarray, eigensolver: str = "auto") -> DualProblem:
  """The Eq. 4 problem for A: ``TridiagonalDualProblem`` when A⁻¹ is lower bidiagonal
  (``auto`` or ``tridiagonal``), else the dense ``DualProblem`` (``auto`` or ``dense``)."""
  if eigensolver not in EIGENSOLVERS:
    raise checks.CheckError(f"unknown eigensolver {eigensolver!r}; expected one of {EIGENSOLVERS}")
  if eigensolver == "dense":
    return DualProblem(a)
  a = workloads.validate_workload(a)
  inverse = workloads.bidiagonal_inverse(a)
  if inverse is None and eigensolver == "auto":
    return DualProblem(a)
  return TridiagonalDualProblem(a, inverse)


def solve(a: np.ndarray,
          target_gap: float = 1e-6,
          max_iterations: int = 10_000,
          allow_unconverged: bool = False,
          progress: bool = False,
          acceleration: str = "auto",
          anderson_memory: int = DEFAULT_ANDERSON_MEMORY,
          initial_v: Optional[np.ndarray] = None,
          max_cg_iterations: int = 200,
          stall_iterations: int = 30,
          time_limit: Optional[float] = None,
          callback: Optional[Callable[[Dict[str, float]], None]] = None,
          eigensolver: str = "auto"
          ) -> dense_run.OptimalResult:
  """Optimal A = B·C (Denisov Eq. 3-4) to a certified relative duality gap.

  Args:
    a: workload, n x n lower triangular, full rank (validated).
    target_gap: stop when (loss − Eq. 8 bound)/loss ≤ target_gap.
    max_iterations: limit on evaluations of φ (one ``eigh`` each).
    allow_unconverged: return a result whose ``info['converged']`` is False
      instead of raising NotConvergedError when the gap is not reached.
    progress: tqdm progress bar on stderr showing the gap.
    acceleration: ``newton`` (truncated Newton-CG steps on the Eq. 8 dual,
      safeguarded), ``anderson`` (Anderson mixing of φ in log v), ``none`` (plain
      iteration of φ, Denisov Eq. 5 — the benchmark's baseline), or ``auto``
      (default: ``anderson`` with the tridiagonal eigensolver, whose evaluations cost
      O(n²) against O(n³) per Hessian product, else ``newton``).
    anderson_memory: number of past iterates Anderson mixing uses.
    max_cg_iterations: limit on conjugate-gradient steps per Newton step.
    stall_iterations: stop (as not converged) after this many iterations
      without improving the primal or the dual by a relative 1e-13 — the
      precision floor of float64 for badly conditioned A (App E.4).
    initial_v: starting dual point (default: all ones).
    time_limit: optional wall-clock limit in seconds, checked between
      iterations (treated like running out of iterations).
    callback: called with each history record.
    eigensolver: ``auto`` (default: ``tridiagonal`` when A⁻¹ is lower bidiagonal,
      else ``dense``), ``dense`` (``eigh`` of M(v)) or ``tridiagonal``
      (``TridiagonalDualProblem``; an error for other A).

  Returns:
    OptimalResult with lower-triangular B, C (B·C = A).

  Raises:
    workloads.WorkloadError: A is not square / lower triangular / full rank / finite.
    NotConvergedError: target gap not reached and allow_unconverged is False.
    LossOfPositiveDefinitenessError: the square roots broke down numerically.
  """
  _check_solve_arguments(target_gap, max_iterations, acceleration, anderson_memory)
  run = dense_run.Run(target_gap=target_gap, callback=callback)
  problem = make_problem(a, eigensolver)
  if acceleration == "auto":
    acceleration = "anderson" if isinstance(problem, TridiagonalDualProblem) else "newton"
  v = _initial_v(initial_v, problem.n)
  steps = _SingleSteps(acceleration, anderson_memory, max_cg_iterations)
  run.open_bar(progress, f"optimal n={problem.n}")
  try:
    while run.iterations < max_iterations:
      if run.out_of_time(time_limit):
        break
      ev = problem.evaluate(v)
      if run.update(ev, problem.factors, fz.single_participation_loss, stall_iterations):
        break
      v = steps.next_v(ev, run.best)
  finally:
    run.bar.close()
  return _single_result(run, problem, steps, max_iterations, allow_unconverged)


def _check_solve_arguments(target_gap, max_iterations, acceleration, anderson_memory) -> None:
  if not 0 < target_gap < 1:
    raise checks.CheckError(f"target_gap must be in (0, 1), got {target_gap}")
  if int(max_iterations) < 1:
    raise checks.CheckError(f"max_iterations must be at least 1, got {max_iterations}")
  if acceleration not in ACCELERATIONS + ("auto",):
    raise checks.CheckError(
        f"unknown acceleration {acceleration!r}; expected one of {ACCELERATIONS + ('auto',)}")
  if anderson_memory < 1:
    raise checks.CheckError(f"anderson_memory must be at least 1, got {anderson_memory}")


def _initial_v(initial_v: Optional[np.ndarray], n: int) -> np.ndarray:
  """The starting dual point: all ones, or a validated copy of ``initial_v``."""
  if initial_v is None:
    return np.ones(n)
  v = np.asarray(initial_v, dtype=np.float64).copy()
  if v.shape != (n,) or not np.all(np.isfinite(v)) or np.any(v <= 0):
    raise checks.CheckError(f"initial_v must be {n} finite positive numbers")
  return v


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


def _single_result(run: dense_run.Run, problem: DualProblem, steps: _SingleSteps,
                   max_iterations: int, allow_unconverged: bool) -> dense_run.OptimalResult:
  """Packages ``solve``: factors, info, the rounding warning, NotConvergedError."""
  b, c, gap = run.finish(problem.factors, fz.single_participation_loss)
  info = {
      **run.info(gap, max_iterations, steps.acceleration),
      "anderson_memory": int(steps.anderson_memory) if steps.acceleration == "anderson" else 0,
      "safeguard_restarts": steps.restarts,
      "cg_iterations": steps.cg_total,
      "newton_backtracks": steps.backtracks,
      "negative_eigenvalues_floored": run.negative_total,
      "eigensolver": "tridiagonal" if isinstance(problem, TridiagonalDualProblem) else "dense",
  }
  if run.negative_total:
    warnings.warn(
        f"optimal factorization (n={problem.n}): {run.negative_total} eigenvalues of "
        "diag(v)^½ AᵀA diag(v)^½ came out negative (loss of positive definiteness by "
        "rounding) and were floored at the a-priori bound; the certificate accounts for it",
        RuntimeWarning)
  result = dense_run.OptimalResult(b=b, c=c, v=run.best.v.copy(), info=info, history=run.history)
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
  step = np.clip(step, -dense_run.MAX_LOG_STEP, dense_run.MAX_LOG_STEP)
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
  q = ev.q.astype(dense_run.CG_DTYPE)
  kernel = kernel.astype(dense_run.CG_DTYPE)
  q_sq = np.square(q)
  precond = phi - 0.5 * np.sum((q_sq @ kernel) * q_sq, axis=1, dtype=np.float64)
  precond = np.maximum(precond, 1e-12 * float(np.max(phi)))
  grad = phi - v

  def apply_p(x):
    e_tilde = (q.T * (0.5 * x).astype(dense_run.CG_DTYPE)[None, :]) @ q
    e_tilde *= kernel
    return phi * x - np.sum((q @ e_tilde) * q, axis=1, dtype=np.float64)

  tol = dense_run.forcing_tolerance(float(np.linalg.norm(grad)), float(np.linalg.norm(v)))
  x, iterations = dense_run.conjugate_gradients(
      apply_p, lambda r: r / precond, grad, inner=lambda x, y: float(x @ y),
      residual_norm=lambda r: float(np.linalg.norm(r)), tol=tol, max_cg=max_cg)
  return _NewtonLine(base=ev, v_base=v,
                     direction=np.clip(x, -dense_run.MAX_LOG_STEP, dense_run.MAX_LOG_STEP),
                     cg_iterations=iterations)
