"""Workload matrices A (numpy core; imports no TensorFlow).

Notation is fixed in ``docs/notation.md``. Every workload is an n x n
lower-triangular, full-rank float64 matrix A; the released quantity is A·G for
the n x d matrix G of clipped per-round gradient sums.

- Prefix sum S (Denisov et al. 2022, arXiv:2202.08312, App A): S[i, j] = 1 for i >= j.
- Momentum SGD with per-round learning rates: M = M(η) M(β)
  (Denisov et al. 2022, Prop 4.2, Eq. 9).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Optional

import numpy as np

from tff_mf import checks

LR_SCHEDULES = ("constant", "decay", "cooldown")

# Step decay multiplies the learning rate by this factor for the last k rounds,
# and the linear cooldown goes from 1.0 to COOLDOWN_FINAL over the last k rounds
# (Denisov et al. Sec 5 / Fig 3, k = 512 of n = 2048).
DECAY_FACTOR = 0.15
COOLDOWN_FINAL = 0.05


class WorkloadError(checks.CheckError):
  """A workload matrix or its parameters are invalid."""


def prefix_sum(n: int) -> np.ndarray:
  """The prefix-sum matrix S (n x n lower-triangular ones)."""
  _check_n(n)
  checks.dense_matrices_fit(n, 1, f"the {n} x {n} prefix-sum matrix")
  return np.tril(np.ones((n, n), dtype=np.float64))


def learning_rates(n: int, schedule: str = "constant",
                   schedule_rounds: Optional[int] = None) -> np.ndarray:
  """Per-round learning-rate multipliers η_1..η_n (a-priori schedules).

  ``constant``: all ones. ``decay``: ×DECAY_FACTOR for the last k rounds.
  ``cooldown``: linear from 1.0 (first of the last k rounds) to COOLDOWN_FINAL
  (the last round). k = ``schedule_rounds``.
  """
  _check_n(n)
  if schedule not in LR_SCHEDULES:
    raise WorkloadError(
        f"unknown learning-rate schedule {schedule!r}; expected one of {LR_SCHEDULES}")
  eta = np.ones(n, dtype=np.float64)
  if schedule == "constant":
    return eta
  if schedule_rounds is None:
    raise WorkloadError(f"lr schedule {schedule!r} needs schedule_rounds (k)")
  k = int(schedule_rounds)
  if not 1 <= k <= n:
    raise WorkloadError(f"schedule_rounds must be in [1, n={n}], got {k}")
  if schedule == "decay":
    eta[n - k:] = DECAY_FACTOR
  else:  # cooldown
    eta[n - k:] = np.linspace(1.0, COOLDOWN_FINAL, k)
  return eta


def momentum_matrix(n: int, beta: float, etas: Optional[np.ndarray] = None) -> np.ndarray:
  """M = M(η) M(β) of Denisov et al. Prop 4.2 (Eq. 9).

  M(η)[i, j] = η_j for i >= j; M(β)[i, j] = β^(i-j) for i >= j. With β = 0 and
  η = 1 this is the prefix-sum matrix S.
  """
  _check_n(n)
  if not 0.0 <= beta < 1.0:
    raise WorkloadError(f"momentum β must be in [0, 1), got {beta}")
  checks.dense_matrices_fit(n, 3, f"the {n} x {n} momentum matrix")
  etas = np.ones(n) if etas is None else np.asarray(etas, dtype=np.float64)
  if etas.shape != (n,):
    raise WorkloadError(f"learning rates must have shape ({n},), got {etas.shape}")
  if not np.all(np.isfinite(etas)) or np.any(etas <= 0):
    raise WorkloadError("learning rates must be finite and positive")
  idx = np.arange(n)
  powers = idx[:, None] - idx[None, :]
  m_beta = np.where(powers >= 0, float(beta) ** np.maximum(powers, 0), 0.0)
  # M[i, j] = Σ_{j <= k <= i} η_k β^(k-j): a running sum down the rows of
  # diag(η)·M(β), O(n²) instead of the O(n³) product M(η)·M(β).
  return np.cumsum(etas[:, None] * m_beta, axis=0)


def sqrt_prefix_coefficients(n: int) -> np.ndarray:
  """f(0) = 1, f(k) = f(k−1)·(1 − 1/(2k)) for k < n: the first column of the Toeplitz square
  root C_f of the prefix-sum matrix (C_f·C_f = S; Fichtenberger, Henzinger, Upadhyay 2023;
  MMCC App E). All positive and decreasing."""
  k = np.arange(1, n)
  return np.concatenate([[1.0], np.cumprod(1.0 - 0.5 / k)])


# Largest ‖A·L − I‖_F for which L is taken as A⁻¹ (rounding level; the solver's bound
# is scaled by (1 − ‖A·L − I‖_F)², so it stays a bound for A itself).
BIDIAGONAL_INVERSE_TOLERANCE = 1e-8


def bidiagonal_inverse(a: np.ndarray):
  """(d, s, r) when A⁻¹ = L is lower bidiagonal (L[j, j] = d[j], L[j + 1, j] = s[j]), else None.

  The band of A⁻¹ depends only on A's band: d = 1/diag(A), s[j] = −A[j+1, j]·d[j]·d[j+1];
  L is accepted when r = ‖A·L − I‖_F ≤ BIDIAGONAL_INVERSE_TOLERANCE (O(n²), no inverse is
  formed). The prefix sum S has S⁻¹ = I − Z (r = 0); momentum with β > 0 has a
  bandwidth-2 inverse and is not bidiagonal.
  """
  n = a.shape[0]
  d = 1.0 / np.diagonal(a)
  s = -np.diagonal(a, -1) * d[:-1] * d[1:]
  residual = a * d[None, :]
  residual[:, :-1] += a[:, 1:] * s[None, :]
  residual[np.diag_indices(n)] -= 1.0
  r = float(np.linalg.norm(residual))
  if not r <= BIDIAGONAL_INVERSE_TOLERANCE:
    return None
  return d, s, r


def validate_workload(a, name: str = "A") -> np.ndarray:
  """A finite, real, square, lower-triangular, full-rank float64 matrix (``checks.workload``)."""
  try:
    return checks.workload(a, name)
  except checks.CheckError as e:
    raise WorkloadError(str(e)) from None


def load_workload(path: str) -> np.ndarray:
  """Loads a user-supplied lower-triangular full-rank A from a ``.npy`` file."""
  if not os.path.isfile(path):
    raise WorkloadError(f"matrix file {path!r} does not exist")
  try:
    with open(path, "rb") as f:  # refuse a huge file before reading it
      version = np.lib.format.read_magic(f)
      read_header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                     else np.lib.format.read_array_header_2_0)
      shape, _, _ = read_header(f)
    if len(shape) == 2:
      checks.dense_matrices_fit(shape[0], 1, f"the matrix in {path}", m=shape[1])
    a = np.load(path, allow_pickle=False)
  except checks.CheckError:
    raise
  except Exception as e:  # numpy raises several types for corrupt files
    raise WorkloadError(f"cannot read matrix file {path!r}: {e}") from e
  return validate_workload(a, name=f"matrix in {path}")


@dataclasses.dataclass(frozen=True)
class WorkloadSpec:
  """Parameters that determine a workload matrix A (part of the cache key)."""
  kind: str = "prefix_sum"  # prefix_sum | momentum | file
  n: int = 0
  momentum: float = 0.0
  lr_schedule: str = "constant"
  schedule_rounds: Optional[int] = None
  matrix_file: Optional[str] = None

  def toeplitz_column(self) -> Optional[np.ndarray]:
    """A's first column when A is lower-triangular Toeplitz (prefix sum; momentum at a
    constant learning rate: Σ_{t ≤ i} β^t), equal to ``build()[:, 0]``; else None."""
    if self.kind == "prefix_sum":
      _check_n(self.n)
      return np.ones(self.n, dtype=np.float64)
    if self.kind == "momentum" and self.lr_schedule == "constant":
      _check_n(self.n)
      if not 0.0 <= self.momentum < 1.0:
        raise WorkloadError(f"momentum β must be in [0, 1), got {self.momentum}")
      return np.cumsum(float(self.momentum) ** np.arange(self.n))
    return None

  def build(self) -> np.ndarray:
    if self.kind == "prefix_sum":
      return prefix_sum(self.n)
    if self.kind == "momentum":
      etas = learning_rates(self.n, self.lr_schedule, self.schedule_rounds)
      return momentum_matrix(self.n, self.momentum, etas)
    if self.kind == "file":
      if not self.matrix_file:
        raise WorkloadError("workload 'file' needs matrix_file")
      a = load_workload(self.matrix_file)
      if self.n and a.shape[0] != self.n:
        raise WorkloadError(
            f"matrix in {self.matrix_file} is {a.shape[0]}x{a.shape[0]}, but n={self.n}")
      return a
    raise WorkloadError(f"unknown workload {self.kind!r}; expected prefix_sum, momentum or file")


def _check_n(n: int) -> None:
  try:
    checks.positive_int(n, "n")
  except checks.CheckError as e:
    raise WorkloadError(str(e)) from None
