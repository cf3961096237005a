"""Operations on banded lower-triangular Toeplitz strategies C (numpy core, no TensorFlow).

The toolkit the Toeplitz-type families (``tff_mf.factorization.families.toeplitz``, the
optimized banded Toeplitz C, and ``tff_mf.factorization.families.blt``, buffered linear
Toeplitz C) share: the workload operators, the evaluation of a first column, and the
packaging of a result.

Every objective evaluation costs O(n·b): h = C⁻¹·e_0 (the first column of the
Toeplitz C⁻¹) comes from the banded recurrence C·h = e_0, and for a Toeplitz
workload A (prefix sum S, momentum with a constant learning rate) B = A·C⁻¹ is
Toeplitz too, with first column β = A·h, so ‖B‖_F² = Σ_i (n − i)·β_i² and the
largest row norm is the last one, Σ_i β_i². A general lower-triangular A (a varying
learning-rate schedule) takes an O(n² log n) path per evaluation. The sensitivity under
b-min-separation is ``tff_mf.participation.toeplitz_bounds`` (participation owns it).
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Any, Dict, Optional, Tuple

import numpy as np
import scipy.linalg
import scipy.signal

from tff_mf import checks
from tff_mf.participation import toeplitz_bounds

ERRORS = ("mean", "max")


@dataclasses.dataclass
class Result:
  """An unnormalized factorization A = B·C of a Toeplitz-type family.

  b, c: n x n float64 (None when the caller asked for no dense matrices);
  info: JSON-able figures (rmse, max_error, objective, iterations, seconds, converged, …);
  extras: float64 family parameters stored beside the factorization;
  columns: the first columns (C[:, 0], B[:, 0]) when the workload is Toeplitz.
  """
  b: Optional[np.ndarray]
  c: Optional[np.ndarray]
  info: Dict[str, Any]
  extras: Dict[str, np.ndarray]
  # (C[:, 0], B[:, 0]) when A is Toeplitz (then B and C are Toeplitz too), else None.
  columns: Optional[Tuple[np.ndarray, np.ndarray]] = None


# ----------------------------------------------------------------------------- workloads


class Workload:
  """A lower-triangular workload A seen through the first column h of a Toeplitz C⁻¹.

  ``loss_and_grad(h, error)`` returns E and dE/dh, with E = ‖A·T(h)‖_F² ('mean') or
  max_i ‖(A·T(h))[i, :]‖² ('max'), T(h) the lower-triangular Toeplitz matrix with first
  column h. ``row_norms_sq(h)`` gives every ‖B[i, :]‖², ``b_matrix(h)`` the dense B.
  """
  kind = "abstract"
  toeplitz = False

  def __init__(self, n: int):
    self.n = n

  def loss_and_grad(self, h: np.ndarray, error: str) -> Tuple[float, np.ndarray]:
    raise NotImplementedError

  def row_norms_sq(self, h: np.ndarray) -> np.ndarray:
    raise NotImplementedError

  def b_matrix(self, h: np.ndarray) -> np.ndarray:
    raise NotImplementedError

  def matrix(self) -> np.ndarray:
    raise NotImplementedError


class ToeplitzWorkload(Workload):
  """A Toeplitz A with first column a; B = A·T(h) = T(a ∗ h) is Toeplitz.

  β = a ∗ h (truncated to n) is computed by a short recursive filter when A has one
  (prefix sum: a running sum; constant-lr momentum: a first-order filter and a running
  sum, Denisov et al. 2022, arXiv:2202.08312, Prop 4.2), else by FFT convolution.
  """
  toeplitz = True

  def __init__(self, column: np.ndarray, kind: str = "toeplitz",
               rational: Optional[Tuple[np.ndarray, np.ndarray]] = None):
    super().__init__(column.shape[0])
    self.column = column
    self.kind = kind
    self.rational = rational

  def apply(self, h: np.ndarray) -> np.ndarray:
    """β = first column of A·T(h)."""
    if self.kind == "prefix_sum":
      return np.cumsum(h)
    if self.rational is not None:
      return scipy.signal.lfilter(self.rational[0], self.rational[1], h)
    return scipy.signal.fftconvolve(self.column, h)[:self.n]

  def adjoint(self, g: np.ndarray) -> np.ndarray:
    """T(a)ᵀ·g: the adjoint of ``apply`` (a reversed causal filter)."""
    return self.apply(g[::-1])[::-1]

  def loss_and_grad(self, h, error):
    beta = self.apply(h)
    if error == "mean":
      w = np.arange(self.n, 0, -1, dtype=np.float64)
      e = float(np.dot(w, beta * beta))
      g_beta = 2.0 * w * beta
    else:
      e = float(np.dot(beta, beta))
      g_beta = 2.0 * beta
    return e, self.adjoint(g_beta)

  def row_norms_sq(self, h):
    beta = self.apply(h)
    return np.cumsum(beta * beta)

  def b_matrix(self, h):
    return lower_toeplitz(self.apply(h))

  def matrix(self):
    return lower_toeplitz(self.column)


class DenseWorkload(Workload):
  """A general lower-triangular A: B = A·T(h) row by row with FFTs, O(n² log n).

  Row r of B is the correlation of A[r, :] with h; the gradient is the summed
  correlation of A's rows with the rows of dE/dB, both done in the Fourier domain.
  """
  kind = "dense"

  def __init__(self, a: np.ndarray):
    super().__init__(a.shape[0])
    n = self.n
    checks.dense_matrices_fit(n, 8, f"the dense workload path (n={n})")
    self.a = a
    self.size = 2 * n
    self._fa_rev = np.fft.rfft(a[:, ::-1], self.size, axis=1)
    self._fa = np.fft.rfft(a, self.size, axis=1)

  def b_matrix(self, h):
    fh = np.fft.rfft(h, self.size)
    conv = np.fft.irfft(self._fa_rev * fh, self.size, axis=1)[:, :self.n]
    return conv[:, ::-1].copy()

  def _grad_h(self, g_b: np.ndarray, rows: Optional[np.ndarray] = None) -> np.ndarray:
    # dE/dh_k = Σ_r Σ_j gB[r, j]·A[r, j + k]
    fa = self._fa if rows is None else self._fa[rows]
    fg = np.fft.rfft(g_b[:, ::-1], self.size, axis=1)
    total = np.fft.irfft(np.sum(fa * fg, axis=0), self.size)
    return total[self.n - 1:2 * self.n - 1].copy()

  def loss_and_grad(self, h, error):
    b = self.b_matrix(h)
    if error == "mean":
      return float(np.sum(b * b)), self._grad_h(2.0 * b)
    rows = np.sum(b * b, axis=1)
    r = int(np.argmax(rows))
    return float(rows[r]), self._grad_h(2.0 * b[r:r + 1], rows=np.array([r]))

  def row_norms_sq(self, h):
    b = self.b_matrix(h)
    return np.sum(b * b, axis=1)

  def matrix(self):
    return self.a


def lower_toeplitz(column: np.ndarray) -> np.ndarray:
  """The n x n lower-triangular Toeplitz matrix with first column ``column``."""
  column = np.asarray(column, dtype=np.float64)
  return scipy.linalg.toeplitz(column, np.zeros_like(column))


def _momentum_filter(column: np.ndarray) -> Optional[Tuple[np.ndarray, np.ndarray]]:
  """(num, den) when column[k] = Σ_{t ≤ k} β^t (constant-lr momentum), else None."""
  n = column.shape[0]
  if n < 2 or column[0] != 1.0:
    return None
  beta = column[1] - 1.0
  if not 0.0 < beta < 1.0:
    return None
  den = np.array([1.0, -(1.0 + beta), beta])
  expected = scipy.signal.lfilter([1.0], den, np.eye(1, n)[0])
  if np.max(np.abs(expected - column)) > 1e-12 * np.max(np.abs(column)):
    return None
  return np.array([1.0]), den


def workload_operator(n: int, a=None) -> Workload:
  """The workload operator for A: None = prefix sum S; a 1-D array = the first column of a
  lower-triangular Toeplitz A; a 2-D array = a lower-triangular A (Toeplitz detected)."""
  n = checks.positive_int(n, "n")
  if a is None:
    return ToeplitzWorkload(np.ones(n), kind="prefix_sum")
  if isinstance(a, Workload):
    if a.n != n:
      raise checks.CheckError(f"workload has {a.n} rounds, expected n={n}")
    return a
  arr = checks.real_array(a, "workload A")
  if arr.ndim == 2:
    arr = checks.workload(arr, "workload A")
    if arr.shape[0] != n:
      raise checks.CheckError(f"workload A is {arr.shape[0]}x{arr.shape[0]}, expected n={n}")
    column = arr[:, 0].copy()
    scale = float(np.max(np.abs(arr)))
    if np.max(np.abs(lower_toeplitz(column) - arr)) > 1e-12 * scale:
      return DenseWorkload(arr)
    arr = column
  if arr.ndim != 1 or arr.shape[0] != n:
    raise checks.CheckError(f"workload column must have shape ({n},), got {arr.shape}")
  if arr[0] == 0:
    raise checks.CheckError("workload A is singular: its diagonal is 0")
  if np.all(arr == 1.0):
    return ToeplitzWorkload(arr, kind="prefix_sum")
  rational = _momentum_filter(arr)
  if rational is not None:
    return ToeplitzWorkload(arr, kind="momentum", rational=rational)
  return ToeplitzWorkload(arr, kind="toeplitz")


# ----------------------------------------------------------------------------- evaluation


def check_coefficients(coeffs, name: str = "Toeplitz coefficients") -> np.ndarray:
  f = checks.real_array(coeffs, name)
  if f.ndim != 1 or f.shape[0] < 1:
    raise checks.CheckError(f"{name} must be a non-empty 1-D array, got shape {f.shape}")
  if not f[0] > 0:
    raise checks.CheckError(f"{name}: f_0 must be positive, got {f[0]:g}")
  return f


def inverse_column(coeffs: np.ndarray, n: int) -> np.ndarray:
  """h = C⁻¹·e_0, the first column of the (Toeplitz) C⁻¹, by the banded recurrence."""
  impulse = np.zeros(n)
  impulse[0] = 1.0
  return scipy.signal.lfilter([1.0], coeffs[:n], impulse)


def evaluate_inverse_column(h: np.ndarray, sens: float, work: Workload) -> Dict[str, float]:
  """rmse = sens·‖B‖_F/√n and max_error = sens·max_i ‖B[i, :]‖ for B = A·T(h)."""
  rows = work.row_norms_sq(h)
  if not np.all(np.isfinite(rows)):
    raise checks.CheckError("A·C⁻¹ overflows: the strategy's inverse is numerically unstable")
  return {"rmse": float(sens * math.sqrt(np.sum(rows) / work.n)),
          "max_error": float(sens * math.sqrt(np.max(rows))),
          "sensitivity": float(sens)}


def evaluate(coeffs, n: int, workload=None, min_sep: Optional[int] = None,
             max_participations: Optional[int] = None) -> Dict[str, Any]:
  """rmse, max_error and sensitivity of the banded Toeplitz C with coefficients ``coeffs``."""
  f = check_coefficients(coeffs)
  work = workload_operator(n, workload)
  sens = toeplitz_bounds.min_sep_sensitivity(f, n, min_sep, max_participations)
  out = evaluate_inverse_column(inverse_column(f, n), sens, work)
  out["sensitivity_exact"] = toeplitz_bounds.sensitivity_is_exact(f, n, min_sep, max_participations)
  return out


def check_error(error: str) -> None:
  if error not in ERRORS:
    raise checks.CheckError(f"error must be one of {ERRORS}, got {error!r}")


def result_from_coefficients(coeffs: np.ndarray, h: np.ndarray, work: Workload, *, error: str,
                             min_sep: Optional[int], max_participations: Optional[int], k: int,
                             family_info: Dict[str, Any], fit: Dict[str, Any], dense: bool,
                             what: str, start: float, extras: Dict[str, np.ndarray]) -> Result:
  """The Result of a Toeplitz-type C (first-column ``coeffs``, h = C⁻¹·e_0).

  The sensitivity under b-min-sep is recomputed from the coefficients; info is
  ``family_info``, the schema, the figures, the objective and the ``fit`` record; B and C
  are dense only when ``dense`` (``what`` names them in the memory check).
  """
  n = work.n
  sens = toeplitz_bounds.min_sep_sensitivity(coeffs, n, min_sep, max_participations)
  figures = evaluate_inverse_column(h, sens, work)
  objective_value = (figures["rmse"] if error == "mean" else figures["max_error"]) ** 2
  info = {
      **family_info, "error": error, "workload": work.kind, "min_sep": min_sep,
      "max_participations": k,
      "sensitivity_exact": toeplitz_bounds.sensitivity_is_exact(coeffs, n, min_sep,
                                                                max_participations),
      **figures, "objective": objective_value, **fit,
  }
  b_mat = c_mat = None
  if dense:
    checks.dense_matrices_fit(n, 3 if work.toeplitz else 5, f"{what} B and C (n={n})")
    c_mat = lower_toeplitz(toeplitz_bounds.padded(coeffs, n))
    b_mat = work.b_matrix(h)
  columns = (toeplitz_bounds.padded(coeffs, n), work.apply(h)) if work.toeplitz else None
  info["seconds"] = time.perf_counter() - start
  return Result(b=b_mat, c=c_mat, info=info, extras=extras, columns=columns)


def rounds_of(n) -> int:
  """n, or the size of a workload A given instead."""
  if isinstance(n, np.ndarray) and n.ndim == 2:
    return checks.positive_int(n.shape[0], "rounds n")
  return checks.positive_int(n, "rounds n")
