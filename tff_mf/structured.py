"""Structured banded + low-rank approximation of the optimal decoder (numpy core).

Denisov et al. App H (``000_…``, Table 2, Algorithm 3); McMahan et al. Sec 4.2
and App D (``002_…``, Table 1 "Efficient" column). The optimal decoder B* is
dense, so adding B*[i, :]·Z in round i costs O(n·d). We replace it by

  B̂ = D⁽ʰ⁾ + (U·Vᵀ) ⊙ M⁽ʰ⁾,

where D⁽ʰ⁾ keeps the first h diagonals of B* (i − j < h), M⁽ʰ⁾ is the 0/1 mask
of the remaining lower triangle (i − j ≥ h) and U, V are n x r. U, V minimize
‖((U·Vᵀ) − B*) ⊙ M⁽ʰ⁾‖²_F + λ(‖U‖²_F + ‖V‖²_F) with λ = 1e-6 (a matrix
completion problem, solved by alternating least squares as in App H). The
paired encoder is C = B̂⁻¹·A (App H, last paragraph), so B̂·C = A exactly and
the loss L = γ(C)²·‖B̂‖²_F (Eq. 2) can be compared with the optimum.

With these pieces round i's noise B̂[i, :]·Z costs O((h + r)·d): h multiplies
for the band and r for the low-rank part, whose running sum Vᵀ·Z over rounds
≤ i − h is kept in an r x d buffer (Algorithm 3; ``StructuredNoiseStream``).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Dict, Optional

import numpy as np
import scipy.linalg

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

  def noise_stream(self, num_columns: int) -> "StructuredNoiseStream":
    """A streaming evaluator of B̂·Z row by row (Denisov Algorithm 3)."""
    return StructuredNoiseStream(self.diagonals, self.u, self.v, num_columns)


class StructuredNoiseStream:
  """Denisov et al. App H, Algorithm 3: row i of B̂·Z in O((h + r)·d) time and memory.

  Call ``next(z_i)`` once per round with that round's noise row Z[i, :] (length
  d); it returns B̂[i, :]·Z. It keeps the last h noise rows (for the band) and
  the buffer β = Σ_{j ≤ i−h} v[j]ᵀ·Z[j, :] (r x d) for the low-rank part.
  Calling it more than n times raises, since B̂ was built for n rounds.
  """

  def __init__(self, diagonals: np.ndarray, u: np.ndarray, v: np.ndarray, num_columns: int):
    self._diagonals = np.asarray(diagonals, dtype=np.float64)
    self._u = np.asarray(u, dtype=np.float64)
    self._v = np.asarray(v, dtype=np.float64)
    self.bands = int(self._diagonals.shape[0])
    self.rank = int(self._u.shape[1])
    self.n = int(self._u.shape[0])
    self.num_columns = int(num_columns)
    self._recent = np.zeros((max(self.bands, 1), self.num_columns))  # ring buffer of Z rows
    self._beta = np.zeros((self.rank, self.num_columns))
    self.round = 0

  def next(self, z_row: np.ndarray) -> np.ndarray:
    i = self.round
    if i >= self.n:
      raise ValueError(f"structured noise built for n={self.n} rounds; round {i + 1} requested")
    z_row = np.asarray(z_row, dtype=np.float64)
    if z_row.shape != (self.num_columns,):
      raise ValueError(f"noise row must have shape ({self.num_columns},), got {z_row.shape}")
    h = self.bands
    y = np.zeros(self.num_columns)
    if i >= h and self.rank > 0:  # low-rank part: 2r multiplies of length d
      # Z[i − h] leaves the band this round; it sits in ring slot (i − h) % h = i % h.
      z_old = self._recent[i % h] if h > 0 else z_row
      self._beta += np.outer(self._v[i - h], z_old)
      y += self._u[i] @ self._beta
    if h > 0:
      self._recent[i % h] = z_row
    for k in range(min(i + 1, h)):  # band: h multiplies of length d
      y += self._diagonals[k, i] * self._recent[(i - k) % h]
    self.round += 1
    return y


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
  Returns (u, v, iterations, objective).
  """
  n = target.shape[0]
  mask = low_rank_mask(n, bands)
  observed = np.where(mask, target, 0.0)
  if rank == 0 or not mask.any():
    return np.zeros((n, rank)), np.zeros((n, rank)), 0, float(np.sum(observed ** 2))
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
  iterations = 0
  try:
    for iterations in range(1, max_iterations + 1):
      u = solve_rows(v, observed @ v, prefix=True)
      v = solve_rows(u, observed.T @ u, prefix=False)
      current = objective(u, v)
      if bar is not None:
        bar.update(1)
        bar.set_postfix(objective=f"{current:.6g}", refresh=False)
      if previous - current <= tolerance * max(previous, 1e-300):
        previous = current
        break
      previous = current
  finally:
    if bar is not None:
      bar.close()
  return u, v, iterations, previous


def approximate(b_opt: np.ndarray, bands: int, rank: int, **als_kwargs):
  """(B̂, diagonals, u, v, als_iterations) approximating B* (App H)."""
  n = b_opt.shape[0]
  diagonals = band_diagonals(b_opt, bands)
  u, v, iterations, _ = als_low_rank(b_opt, bands, rank, **als_kwargs)
  b_hat = banded_from_diagonals(diagonals) + np.where(low_rank_mask(n, bands), u @ v.T, 0.0)
  return b_hat, diagonals, u, v, iterations


def _check_inputs(a: np.ndarray, bands: int, rank: int) -> None:
  if not isinstance(a, np.ndarray) or a.ndim != 2 or a.shape[0] != a.shape[1]:
    raise ValueError(f"A must be a square matrix, got shape {getattr(a, 'shape', None)}")
  n = a.shape[0]
  if int(bands) != bands or bands < 1:
    raise ValueError(f"structured needs bands h >= 1 (the diagonal), got {bands}")
  if int(rank) != rank or rank < 0:
    raise ValueError(f"structured needs rank r >= 0, got {rank}")
  if rank > n:
    raise ValueError(f"rank r={rank} exceeds n={n}")


def fit(a: np.ndarray, bands: int, rank: int, progress: bool = False,
        b_opt: Optional[np.ndarray] = None, target_gap: Optional[float] = None,
        max_iterations: Optional[int] = None, allow_unconverged: bool = False,
        als_iterations: int = DEFAULT_ALS_ITERATIONS,
        als_tolerance: float = DEFAULT_ALS_TOLERANCE) -> StructuredResult:
  """Banded (h) + low-rank (r) approximation B̂ of the optimal decoder for A; C = B̂⁻¹·A.

  Denisov et al. App H / McMahan et al. Sec 4.2. ``b_opt`` is the optimal
  decoder B* for A when the caller already has it (any positive scaling of it
  gives the same mechanism); otherwise it is computed with
  ``tff_mf.dense.solve`` (``target_gap``, ``max_iterations`` and
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
    from tff_mf.families import dense  # pylint: disable=g-import-not-at-top
    kwargs = {"progress": progress, "allow_unconverged": allow_unconverged}
    if target_gap is not None:
      kwargs["target_gap"] = target_gap
    if max_iterations is not None:
      kwargs["max_iterations"] = max_iterations
    opt = dense.solve(a, **kwargs)
    b_opt = opt.b
    for key in ("relative_gap", "iterations", "converged", "dual_lower_bound"):
      if key in opt.info:
        info[f"optimal_{key}"] = opt.info[key]
    info["optimal_sqrt_loss"] = _sqrt_loss(opt.b, opt.c)
  else:
    b_opt = np.asarray(b_opt, dtype=np.float64)
    if b_opt.shape != (n, n):
      raise ValueError(f"optimal decoder must be {n}x{n}, got {b_opt.shape}")
  b_hat, diagonals, u, v, als_used = approximate(
      b_opt, bands, rank, max_iterations=als_iterations, tolerance=als_tolerance,
      progress=progress)
  if np.any(np.abs(np.diag(b_hat)) <= 1e-12 * np.max(np.abs(b_hat))):
    raise ValueError("structured decoder B̂ is singular (zero on its diagonal)")
  c = scipy.linalg.solve_triangular(b_hat, a, lower=True)
  c = np.tril(c)  # exact zeros above the diagonal (B̂ and A are lower triangular)
  info.update({
      "als_iterations": als_used,
      "als_regularization": ALS_REGULARIZATION,
      "approximation_error": float(np.linalg.norm(b_hat - b_opt) / np.linalg.norm(b_opt)),
      "seconds": time.perf_counter() - start,
  })
  return StructuredResult(b=b_hat, c=c, bands=bands, rank=rank, diagonals=diagonals,
                          u=u, v=v, info=info)


def _sqrt_loss(b: np.ndarray, c: np.ndarray) -> float:
  from tff_mf import factorization as fz  # pylint: disable=g-import-not-at-top
  return fz.sqrt_loss(b, c)
