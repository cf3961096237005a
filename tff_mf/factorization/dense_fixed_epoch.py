"""Optimal dense factorization A = B·C under (k, b)-fixed-epoch participation, with a
duality-gap certificate (numpy/scipy, no TF).

``solve_fixed_epoch`` (Choquette-Choo, McMahan, Rush, Thakurta 2023, arXiv:2211.06530,
Eq. 5): the objective of the single-participation solver (``tff_mf.factorization.dense_single``) with
columns of one user's rounds orthogonal and their squared norms summing to at most 1;
see the comment block before ``FixedEpochDual``. The run loop, the floored
eigendecomposition and conjugate gradients are shared with the single-participation
solver (``tff_mf.factorization.dense_run``).
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Callable, Dict, Optional

import numpy as np
from scipy.linalg import blas as scipy_blas

from tff_mf import checks
from tff_mf.factorization import dense_run
from tff_mf.factorization import workloads

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
    gram = dense_run.symmetric_gram(self.a)
    self.gram = np.ascontiguousarray(gram[np.ix_(self.perm, self.perm)])
    self.gram_eigenvalue_floor = dense_run.gram_eigenvalue_floor(self.a)
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
    q, sqrt_lam, negative = dense_run.floored_eigh(
        m, float(np.min(lam_min)) * self.gram_eigenvalue_floor, "Lᵀ AᵀA L (fixed-epoch dual)")
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
    v_new = np.where(dv >= 0, v + dv, v * np.exp(np.maximum(dv / v, -dense_run.MAX_LOG_STEP)))
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
    kernel = ((s[:, None] * s[None, :]) / (s[:, None] + s[None, :])).astype(dense_run.CG_DTYPE)
    q = ev.q.astype(dense_run.CG_DTYPE)
    q3 = q.reshape(b, k, n)
    chol_inv = ev.chol_inv / root
    chol_inv_t = chol_inv.transpose(0, 2, 1)

    def apply_h(x):  # −∇²d · x
      delta_p = np.matmul(np.matmul(chol_inv, self.blocks(x)),
                          chol_inv_t).astype(dense_run.CG_DTYPE)
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
    tol = dense_run.forcing_tolerance(float(np.linalg.norm(weight * grad)),
                                      float(np.linalg.norm(weight)))
    return dense_run.conjugate_gradients(
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
    kp = (prods.reshape(-1, n) @ factor.astype(dense_run.CG_DTYPE)).reshape(b, -1, factor.shape[1])
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
      raise dense_run.LossOfPositiveDefinitenessError(
          "a pattern block of X(Λ) is not positive definite")
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
    return dense_run.factors_from_gram(
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
                      ) -> dense_run.OptimalResult:
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
  run = dense_run.Run(target_gap=target_gap, callback=callback)
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


def _fixed_epoch_result(run: dense_run.Run, problem: FixedEpochDual, steps: _EpochSteps,
                        max_iterations: int, allow_unconverged: bool) -> dense_run.OptimalResult:
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
  result = dense_run.OptimalResult(b=b, c=c, v=v, info=info, history=run.history,
                                   dual_blocks=lam_blocks)
  run.check_converged(result, allow_unconverged,
                      f"fixed-epoch optimal factorization (n={n}, k={k})")
  return result
