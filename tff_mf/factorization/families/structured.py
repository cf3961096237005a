"""Structured banded + low-rank decoder B̂ and its Algorithm 3 stream (numpy core).

Denisov et al. 2022, arXiv:2202.08312, App H (Table 2, Algorithm 3); McMahan, Rush,
Thakurta, arXiv:2202.08312 v1, Sec 4.2 and App D. The optimal decoder B* is dense,
so adding B*[i, :]·Z in round i costs O(n·d). We replace it by

  B̂ = D⁽ʰ⁾ + (U·Vᵀ) ⊙ M⁽ʰ⁾,

where D⁽ʰ⁾ keeps the first h diagonals of B* (i − j < h), M⁽ʰ⁾ is the 0/1 mask of
the rest of the lower triangle (i − j ≥ h) and U, V are n x r, fitted by
alternating least squares with penalty λ(‖U‖²_F + ‖V‖²_F), λ = 1e-6 (App H). The
paired encoder is C = B̂⁻¹·A, so B̂·C = A exactly.

``pieces_stream`` gives the residual noise N = A⁻¹·B̂ = C⁻¹ as a ``tff_mf.noise.streams.LinearStream``
with h′ + r rows of state (Algorithm 3 applied to N; h′ = h + w − 1 when A⁻¹ has w
nonzero diagonals): a ring of the last h′ Z rows and the low-rank sum in a whitened
basis, so that float32 carries it without cancellation.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Dict, Optional, Tuple

import numpy as np
import scipy.linalg

import math

from tff_mf import checks
from tff_mf.factorization import families
from tff_mf.noise import streams

# Bumped whenever the output for the same inputs changes (part of the cache key).
VERSION = "2"


def default_structure(n: int) -> Tuple[int, int]:
  """(h, r) of the structured mechanism: h + r = ⌈log₂ n⌉ (at least 1), h = ⌈(h + r)/2⌉.

  Denisov et al. 2022 App H, Table 2 ((6, 5) for n = 2048).
  """
  total = max(1, int(math.ceil(math.log2(max(n, 2)))))
  h = (total + 1) // 2
  return h, total - h


def _defaults(n: int, schema) -> Dict[str, int]:
  del schema
  h, r = default_structure(n)
  return {"bands": h, "rank": r}


def _check_spec(spec) -> None:
  checks.positive_int(spec.bands, "structured bands h")
  checks.nonnegative_int(spec.rank, "structured rank r")
  if spec.rank > spec.n:
    raise checks.CheckError(f"structured rank r={spec.rank} exceeds n={spec.n}")


# The optimal decoder's fit needs the optimal factorization (``Context.optimal``).
STRATEGIES = {"structured": families.Declaration(
    parameters=("bands", "rank", "target_gap", "max_iterations", "allow_unconverged",
                "als_iterations"),
    defaults=_defaults, peak_matrices=14, streams=True, check_spec=_check_spec,
    parameter_labels={"bands": "h"})}

ALS_REGULARIZATION = 1e-6  # Denisov et al. App H: penalty on ‖U‖²_F + ‖V‖²_F
DEFAULT_ALS_ITERATIONS = 100
DEFAULT_ALS_TOLERANCE = 1e-7  # relative decrease of the ALS objective at which to stop


@dataclasses.dataclass
class StructuredResult:
  """B̂ = D⁽ʰ⁾ + (u·vᵀ) ⊙ M⁽ʰ⁾ and its paired C = B̂⁻¹·A (not normalized).

  Attributes:
    b: B̂, n x n lower triangular.
    c: C = B̂⁻¹·A, n x n lower triangular.
    bands: h, the number of diagonals kept exactly.
    rank: r, the rank of the low-rank part.
    diagonals: h x n; diagonals[k, i] = B̂[i, i − k] (0 for i < k).
    u: n x r, v: n x r; B̂[i, j] = u[i]·v[j] for i − j ≥ h.
    info: metadata (``als_iterations``, ``approximation_error`` = relative
      Frobenius error ‖B̂ − B*‖/‖B*‖, ``optimal_sqrt_loss``, ``seconds``, ...).
  """
  b: np.ndarray
  c: np.ndarray
  bands: int
  rank: int
  diagonals: np.ndarray
  u: np.ndarray
  v: np.ndarray
  info: Dict[str, Any] = dataclasses.field(default_factory=dict)

  @property
  def n(self) -> int:
    return int(self.b.shape[0])

  @property
  def bands_matrix(self) -> np.ndarray:
    """D⁽ʰ⁾ as a dense n x n matrix."""
    return banded_from_diagonals(self.diagonals)

  def scaled(self, factor: float) -> "StructuredResult":
    """The same mechanism with B̂ scaled by ``factor`` and C by 1/factor (App I normalization)."""
    return dataclasses.replace(
        self, b=self.b * factor, c=self.c / factor, diagonals=self.diagonals * factor,
        u=self.u * factor, info=dict(self.info))


def banded_from_diagonals(diagonals: np.ndarray) -> np.ndarray:
  """Dense D⁽ʰ⁾ from diagonals[k, i] = D[i, i − k]."""
  h, n = diagonals.shape
  d = np.zeros((n, n))
  for k in range(h):
    idx = np.arange(k, n)
    d[idx, idx - k] = diagonals[k, k:]
  return d


def band_diagonals(b: np.ndarray, bands: int) -> np.ndarray:
  """diagonals[k, i] = b[i, i − k] for k < bands (zero-padded at the start)."""
  n = b.shape[0]
  out = np.zeros((bands, n))
  for k in range(min(bands, n)):
    idx = np.arange(k, n)
    out[k, k:] = b[idx, idx - k]
  return out


def low_rank_mask(n: int, bands: int) -> np.ndarray:
  """M⁽ʰ⁾: True where i − j ≥ h (the lower-triangle entries outside the band)."""
  idx = np.arange(n)
  return (idx[:, None] - idx[None, :]) >= bands


def als_low_rank(target: np.ndarray, bands: int, rank: int,
                 regularization: float = ALS_REGULARIZATION,
                 max_iterations: int = DEFAULT_ALS_ITERATIONS,
                 tolerance: float = DEFAULT_ALS_TOLERANCE,
                 progress: bool = False):
  """U, V (n x r) fitting target on the entries i − j ≥ h (App H matrix completion).

  Alternating least squares: row i of U solves a ridge problem over the
  observed columns j ≤ i − h, row j of V one over the observed rows i ≥ j + h.
  Because these sets are nested, the r x r Gram matrices are prefix / suffix
  sums of outer products, so one sweep costs O(n²·r + n·r³).
  Returns (u, v, iterations, objective, relative decrease of the objective in the last
  sweep).
  """
  n = target.shape[0]
  mask = low_rank_mask(n, bands)
  observed = np.where(mask, target, 0.0)
  if rank == 0 or not mask.any():
    return np.zeros((n, rank)), np.zeros((n, rank)), 0, float(np.sum(observed ** 2)), 0.0
  # Initialization: truncated SVD of the masked target.
  left, sing, right_t = np.linalg.svd(observed)
  root = np.sqrt(sing[:rank])
  u = left[:, :rank] * root
  v = right_t[:rank].T * root
  eye = regularization * np.eye(rank)

  def objective(u, v):
    resid = np.where(mask, u @ v.T - target, 0.0)
    return float(np.sum(resid ** 2) + regularization * (np.sum(u ** 2) + np.sum(v ** 2)))

  def solve_rows(other, rhs, prefix):
    # Gram of rows of `other` over the observed index set of each row.
    outer = other[:, :, None] * other[:, None, :]
    if prefix:  # row i observes other[0 .. i − h]
      cum = np.cumsum(outer, axis=0)
      grams = np.zeros((n, rank, rank))
      grams[bands:] = cum[:n - bands]
    else:  # row j observes other[j + h .. n − 1]
      cum = np.cumsum(outer[::-1], axis=0)[::-1]
      grams = np.zeros((n, rank, rank))
      grams[:n - bands] = cum[bands:]
    return np.linalg.solve(grams + eye, rhs[:, :, None])[:, :, 0]

  bar = None
  if progress:
    from tqdm import tqdm  # pylint: disable=g-import-not-at-top
    bar = tqdm(total=max_iterations, desc=f"structured ALS (h={bands}, r={rank})",
               unit="it", leave=False)
  previous = objective(u, v)
  iterations, decrease = 0, 0.0
  try:
    for iterations in range(1, max_iterations + 1):
      u = solve_rows(v, observed @ v, prefix=True)
      v = solve_rows(u, observed.T @ u, prefix=False)
      current = objective(u, v)
      decrease = (previous - current) / max(previous, 1e-300)
      if bar is not None:
        bar.update(1)
        bar.set_postfix(objective=f"{current:.6g}", refresh=False)
      previous = current
      if decrease <= tolerance:
        break
  finally:
    if bar is not None:
      bar.close()
  return u, v, iterations, previous, decrease


def approximate(b_opt: np.ndarray, bands: int, rank: int, **als_kwargs):
  """(B̂, diagonals, u, v, als_iterations, last relative decrease) approximating B* (App H)."""
  n = b_opt.shape[0]
  diagonals = band_diagonals(b_opt, bands)
  u, v, iterations, _, decrease = als_low_rank(b_opt, bands, rank, **als_kwargs)
  b_hat = banded_from_diagonals(diagonals) + np.where(low_rank_mask(n, bands), u @ v.T, 0.0)
  return b_hat, diagonals, u, v, iterations, decrease


def _check_inputs(a: np.ndarray, bands: int, rank: int) -> None:
  if not isinstance(a, np.ndarray) or a.ndim != 2 or a.shape[0] != a.shape[1]:
    raise checks.CheckError(f"A must be a square matrix, got shape {getattr(a, 'shape', None)}")
  n = a.shape[0]
  if int(bands) != bands or bands < 1:
    raise checks.CheckError(f"structured needs bands h >= 1 (the diagonal), got {bands}")
  if int(rank) != rank or rank < 0:
    raise checks.CheckError(f"structured needs rank r >= 0, got {rank}")
  if rank > n:
    raise checks.CheckError(f"rank r={rank} exceeds n={n}")


def fit(a: np.ndarray, bands: int, rank: int, progress: bool = False,
        b_opt: Optional[np.ndarray] = None, target_gap: Optional[float] = None,
        max_iterations: Optional[int] = None, allow_unconverged: bool = False,
        als_iterations: int = DEFAULT_ALS_ITERATIONS,
        als_tolerance: float = DEFAULT_ALS_TOLERANCE) -> StructuredResult:
  """Banded (h) + low-rank (r) approximation B̂ of the optimal decoder for A; C = B̂⁻¹·A.

  Denisov et al. App H / McMahan et al. Sec 4.2. ``b_opt`` is the optimal
  decoder B* for A when the caller already has it (any positive scaling of it
  gives the same mechanism); otherwise it is computed with
  ``tff_mf.factorization.dense_single.solve`` (``target_gap``, ``max_iterations`` and
  ``allow_unconverged`` are passed through). The result is not normalized;
  ``strategies.factorize`` normalizes it so that γ(C) = 1.
  """
  start = time.perf_counter()
  a = np.asarray(a, dtype=np.float64)
  _check_inputs(a, bands, rank)
  bands, rank = int(bands), int(rank)
  n = a.shape[0]
  info: Dict[str, Any] = {"bands": bands, "rank": rank}
  if b_opt is None:
    from tff_mf.factorization import dense_single  # pylint: disable=g-import-not-at-top
    kwargs = {"progress": progress, "allow_unconverged": allow_unconverged}
    if target_gap is not None:
      kwargs["target_gap"] = target_gap
    if max_iterations is not None:
      kwargs["max_iterations"] = max_iterations
    opt = dense_single.solve(a, **kwargs)
    b_opt = opt.b
    for key in ("relative_gap", "iterations", "converged", "dual_lower_bound"):
      if key in opt.info:
        info[f"optimal_{key}"] = opt.info[key]
    info["optimal_sqrt_loss"] = _sqrt_loss(opt.b, opt.c)
  else:
    b_opt = np.asarray(b_opt, dtype=np.float64)
    if b_opt.shape != (n, n):
      raise checks.CheckError(f"optimal decoder must be {n}x{n}, got {b_opt.shape}")
  b_hat, diagonals, u, v, als_used, als_decrease = approximate(
      b_opt, bands, rank, max_iterations=als_iterations, tolerance=als_tolerance,
      progress=progress)
  if np.any(np.abs(np.diag(b_hat)) <= 1e-12 * np.max(np.abs(b_hat))):
    raise checks.CheckError("structured decoder B̂ is singular (zero on its diagonal)")
  c = scipy.linalg.solve_triangular(b_hat, a, lower=True)
  c = np.tril(c)  # exact zeros above the diagonal (B̂ and A are lower triangular)
  info.update({
      "als_iterations": als_used,
      # Stopped by its tolerance, before its iteration limit (read by the solver outcome).
      "als_converged": bool(als_decrease <= als_tolerance),
      "als_iteration_limit": int(als_iterations),
      "als_last_decrease": float(als_decrease),
      "als_regularization": ALS_REGULARIZATION,
      "approximation_error": float(np.linalg.norm(b_hat - b_opt) / np.linalg.norm(b_opt)),
      "seconds": time.perf_counter() - start,
  })
  return StructuredResult(b=b_hat, c=c, bands=bands, rank=rank, diagonals=diagonals,
                          u=u, v=v, info=info)


def why_als_unconverged(info: Dict[str, Any]) -> str:
  """Why the ALS fit is unconverged, and the remedy, in one line (from the fit's info)."""
  last = info.get("als_last_decrease")
  still = "" if last is None else f"; its last sweep still lowered its objective by {last:.1e}"
  return (f"the ALS fit of the low-rank part used all its {info['als_iterations']} sweeps "
          f"before a sweep lowered its objective by less than {DEFAULT_ALS_TOLERANCE:g} "
          f"(relative){still}. C = B̂⁻¹·A is exact and the reported figures are computed "
          f"from it; to fit B* closer, raise --als_iterations (als_iterations= from Python)")


def _sqrt_loss(b: np.ndarray, c: np.ndarray) -> float:
  from tff_mf import factorization as fz  # pylint: disable=g-import-not-at-top
  return fz.single_participation_sqrt_loss(b, c)


def decoder(diagonals: np.ndarray, u: np.ndarray, v: np.ndarray) -> np.ndarray:
  """B̂ = D⁽ʰ⁾ + (U·Vᵀ) ⊙ M⁽ʰ⁾ from its pieces (h = rows of ``diagonals``)."""
  h, n = diagonals.shape
  low = np.where(low_rank_mask(n, h), u @ v.T, 0.0) if u.shape[1] else 0.0
  return banded_from_diagonals(diagonals) + low


def inverse_bandwidth(a: np.ndarray, max_bands: int = 4) -> Tuple[int, np.ndarray]:
  """(w, A⁻¹ exactly w-banded) for a workload whose inverse has w ≤ ``max_bands`` diagonals.

  The prefix sum has w = 2 (first differences), momentum with a learning-rate
  schedule w = 3 (Denisov et al. 2022, Prop 4.2).
  """
  n = a.shape[0]
  a_inv = scipy.linalg.solve_triangular(a, np.eye(n), lower=True)
  scale = max(1.0, float(np.max(np.abs(a_inv))))
  nonzero = [k for k in range(n) if np.any(np.abs(np.diagonal(a_inv, -k)) > 1e-12 * scale)]
  w = max(nonzero) + 1
  if w > max_bands:
    raise checks.CheckError(f"A⁻¹ has {w} nonzero diagonals; the structured stream needs a "
                            "workload with a banded inverse (prefix sum: 2, momentum: 3)")
  return w, np.tril(np.triu(a_inv, -(w - 1)))


def pieces_stream(diagonals: np.ndarray, u: np.ndarray, v: np.ndarray, a: np.ndarray,
                  name: str = "structured B̂") -> streams.LinearStream:
  """N = A⁻¹·B̂ as a LinearStream: Algorithm 3 (Denisov et al. 2022, App H) applied to N.

  With A⁻¹ w-banded, N = D′⁽ʰ′⁾ + (Ũ·Vᵀ) ⊙ M⁽ʰ′⁾ with h′ = h + w − 1 and Ũ = A⁻¹·U, so

    (N·Z)[i] = Σ_{k<h′} N[i, i−k]·Z[i−k] + Ũ[i]·β_i,   β_i = Σ_{j ≤ i−h′} V[j]ᵀ·Z[j].

  State: rows 0..h′−1 are a ring of Z rows (row h′−1 the newest), rows h′..h′+r−1
  hold x_i = L_i⁻¹·β_i with L_i·L_iᵀ = Σ_{j ≤ i−h′} V[j]ᵀV[j] + δI (Cholesky). ALS
  leaves U·Vᵀ free above the band, so U and V are large (entries ~10³ at n = 2048)
  and Ũ[i]·β_i cancels by 10²–10³; in the whitened basis the transition
  L_i⁻¹·L_{i−1} has spectral norm ≤ 1 (the Gram matrices only grow), the injection
  norm ≤ 1 and the output weights Ũ[i]·L_i have the norm of the result, so float32
  carries the stream without growth of rounding errors or cancellation.
  """
  diagonals = checks.real_array(diagonals, f"{name}: diagonals")
  h, n = diagonals.shape
  u = checks.real_array(u, f"{name}: U").reshape(n, -1)
  v = checks.real_array(v, f"{name}: V").reshape(n, -1)
  if u.shape != v.shape:
    raise checks.CheckError(f"{name}: U {u.shape} and V {v.shape} differ in shape")
  a = checks.workload(a, f"{name}: workload A")
  if a.shape != (n, n):
    raise checks.CheckError(f"{name}: workload is {a.shape}, the pieces are for n = {n}")
  b_hat = checks.lower_triangular(decoder(diagonals, u, v), f"{name}: decoder B̂",
                                  nonsingular=True)
  w, a_inv = inverse_bandwidth(a)
  hp = min(h + w - 1, n)
  n_matrix = a_inv @ b_hat
  band, transition, inject, out = _tables(n_matrix, a_inv @ u, v, hp, name)
  r = u.shape[1]
  k = hp + r
  copies = np.full(k, -1, dtype=np.int64)
  copies[:hp - 1] = np.arange(1, hp)
  f = np.zeros((n, k, k))
  g = np.zeros((n, k))
  w_new = np.zeros((n, k))
  g[:, hp - 1] = 1.0  # the newest ring row is Z[i]
  f[:, hp:, hp:] = transition
  f[:, hp:, 0] = inject  # Z[i − h′] is the oldest ring row of the previous state
  w_new[:, hp - 1::-1] = band  # N[i, i − k] weighs ring row h′ − 1 − k
  w_new[:, hp:] = out
  return streams.LinearStream(n=n, copies=copies, f=f, g=g, w_old=np.zeros((n, k)),
                              w_new=w_new, c=np.zeros(n), name=name)


def _tables(n_matrix, u_tilde, v, hp, name):
  """Per-round band [n, h′], transition [n, r, r], inject [n, r], output [n, r] (float64)."""
  n, r = u_tilde.shape
  band = np.zeros((n, hp))
  for k in range(hp):
    band[k:, k] = np.diagonal(n_matrix, -k)
  low = np.tril(u_tilde @ v.T, -hp)
  err = float(np.max(np.abs(np.tril(n_matrix, -hp) - low))) if n > hp else 0.0
  if err > 1e-8 * max(1.0, float(np.max(np.abs(n_matrix)))):
    raise checks.CheckError(f"{name}: A⁻¹·B̂ is not {hp}-banded plus rank {r} (error {err:.3g})")
  transition = np.zeros((n, r, r))
  inject = np.zeros((n, r))
  out = np.zeros((n, r))
  if r == 0 or n <= hp:
    return band, transition, inject, out
  delta = 1e-9 * max(float(np.max(np.sum(v**2, axis=0))), 1e-300)
  gram = delta * np.eye(r)
  chol_prev = np.sqrt(delta) * np.eye(r)
  for i in range(hp, n):
    v_in = v[i - hp]  # V[i − h′] joins β this round
    gram += np.outer(v_in, v_in)
    chol = np.linalg.cholesky(gram)
    transition[i] = scipy.linalg.solve_triangular(chol, chol_prev, lower=True)
    inject[i] = scipy.linalg.solve_triangular(chol, v_in, lower=True)
    out[i] = u_tilde[i] @ chol
    chol_prev = chol
  return band, transition, inject, out


# ----------------------------------------------------------------------------- family interface


def factorize(a: np.ndarray, spec, context) -> "FamilyResult":
  """Fits B̂ to the optimal decoder of A (from ``context.optimal``) and returns its pieces."""
  from tff_mf.factorization.families import FamilyResult  # pylint: disable=g-import-not-at-top
  b_opt, optimal_info = None, {}
  if context is not None and context.optimal is not None:
    optimal_f = context.optimal()
    b_opt = optimal_f.b
    for key in ("relative_gap", "iterations", "converged", "dual_lower_bound"):
      if key in optimal_f.info:
        optimal_info[f"optimal_{key}"] = optimal_f.info[key]
    optimal_info["optimal_sqrt_loss"] = optimal_f.single_participation_sqrt_loss
  result = fit(a, bands=spec.bands, rank=spec.rank, b_opt=b_opt,
               progress=bool(context and context.progress), target_gap=spec.target_gap,
               max_iterations=spec.max_iterations, allow_unconverged=spec.allow_unconverged,
               als_iterations=spec.als_iterations)
  info = dict(result.info, **optimal_info)
  extras = {"structured_diagonals": result.diagonals, "structured_u": result.u,
            "structured_v": result.v}
  return FamilyResult(b=result.b, c=result.c, info=info, extras=extras)


def stream(extras: Dict[str, np.ndarray], a: np.ndarray) -> streams.LinearStream:
  """The stream of the stored (unnormalized) pieces."""
  return pieces_stream(extras["structured_diagonals"], extras["structured_u"], extras["structured_v"],
                a)


def check_extras(f) -> None:
  """The stored pieces, scaled by the stored γ, rebuild the normalized B̂."""
  gamma = float(np.asarray(f.extras["normalization"])[0])
  rebuilt = gamma * decoder(f.extras["structured_diagonals"], f.extras["structured_u"],
                            f.extras["structured_v"])
  err = float(np.max(np.abs(rebuilt - f.b)))
  if err > 1e-8 * max(1.0, float(np.max(np.abs(f.b)))):
    raise checks.CheckError(f"structured pieces do not rebuild B̂ (error {err:.3g})")
