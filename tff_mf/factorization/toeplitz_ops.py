"""Operations on banded lower-triangular Toeplitz strategies C (numpy core, no TensorFlow).

The toolkit the Toeplitz-type families (``tff_mf.factorization.families.toeplitz``, the optimized banded
Toeplitz C, and ``tff_mf.factorization.families.blt``, buffered linear Toeplitz C) share: the workload
operators, the min-sep sensitivity, the evaluation of a first column, and the packaging of
a result.

Every objective evaluation costs O(n·b): h = C⁻¹·e_0 (the first column of the
Toeplitz C⁻¹) comes from the banded recurrence C·h = e_0, and for a Toeplitz
workload A (prefix sum S, momentum with a constant learning rate) B = A·C⁻¹ is
Toeplitz too, with first column β = A·h, so ‖B‖_F² = Σ_i (n − i)·β_i² and the
largest row norm is the last one, Σ_i β_i². A general lower-triangular A (a varying
learning-rate schedule) takes an O(n² log n) path per evaluation.

Sensitivity (``min_sep_sensitivity``), with k participations at least ``min_sep``
rounds apart (Choquette-Choo et al. 2023, arXiv:2306.08153, Sec 2):
- single participation: ‖f‖₂, the first (largest) column norm;
- b ≤ min_sep: columns of participations are disjoint, so sens² is the sum of the
  k largest feasible column norms², attained by rounds 0, min_sep, 2·min_sep, … (exact);
- f non-negative and non-increasing: rounds 0, min_sep, … are the worst pattern for any
  b (Kalinin & Lampert 2024, arXiv:2405.13763, Thm 2; proof sketch in
  ``min_sep_sensitivity``), so sens² = ‖C·Σ_p e_{p·min_sep}‖² (exact);
- otherwise a valid upper bound: the smallest of (i) the exact value for the
  non-increasing majorant of |f|, (ii) k·ρ with ρ a per-round bound on one row of
  |CᵀC| (the absolute-value bound of Choquette-Choo et al. 2023, Eq. 5), maximized
  by a dynamic program over the band, and (iii) Alg. 4 of Choquette-Choo et al. 2023
  (each row's best admissible set of |CᵀC|, then the best admissible set of those row
  values; the bound jax_privacy computes as ``get_min_sep_sensitivity_upper_bound``), on
  the band of CᵀC built from the coefficients in O(n·b). None of the three dominates the
  others (Alg. 4 is up to 30% tighter on random signed 8-band C, the others win elsewhere), so
  all are computed and the smallest is returned; ``min_sep_sensitivity_report`` names it.
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
from tff_mf.participation import separation

ERRORS = ("mean", "max")
# Alg. 4 on the band of CᵀC costs about n·(2b − 1)·k' operations (k' ≤ k participations fit in
# one row's band); above this it is skipped (the other two bounds still hold).
ALG4_MAX_WORK = 5e7


@dataclasses.dataclass
class Result:
  """An unnormalized factorization A = B·C of a Toeplitz-type family.

  b, c: n x n float64 (None when the caller asked for no dense matrices);
  info: JSON-able figures (rmse, max_error, objective, iterations, seconds, converged, …);
  extras: float64 family parameters stored beside the factorization.
  """
  b: Optional[np.ndarray]
  c: Optional[np.ndarray]
  info: Dict[str, Any]
  extras: Dict[str, np.ndarray]


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


# ----------------------------------------------------------------------------- sensitivity


def participations(n: int, min_sep: Optional[int],
                   max_participations: Optional[int]) -> Tuple[int, int]:
  """(min_sep, k): k = the largest number of participations that fit in n rounds.

  min_sep None means single participation (returned as (n, 1)).
  """
  n = checks.positive_int(n, "n")
  if min_sep is None:
    if max_participations not in (None, 1):
      raise checks.CheckError("max_participations needs min_sep (the separation in rounds)")
    return n, 1
  min_sep = checks.positive_int(min_sep, "min_sep")
  fit = -(-n // min_sep)
  if max_participations is None:
    return min_sep, fit
  return min_sep, min(checks.positive_int(max_participations, "max_participations"), fit)


def minsep_vector(c: np.ndarray, min_sep: int, k: int) -> np.ndarray:
  """C·Σ_{p<k} e_{p·min_sep} for the lower-triangular Toeplitz C with first column c (O(n))."""
  n = c.shape[0]
  rows = -(-n // min_sep)
  w = np.cumsum(np.pad(c, (0, rows * min_sep - n)).reshape(rows, min_sep), axis=0)
  if k < rows:
    w[k:] -= w[:-k].copy()
  return w.ravel()[:n]


def minsep_vector_adjoint(g: np.ndarray, min_sep: int, k: int) -> np.ndarray:
  """The adjoint of ``minsep_vector`` (a map from the output back to c)."""
  n = g.shape[0]
  rows = -(-n // min_sep)
  w = np.pad(g, (0, rows * min_sep - n)).reshape(rows, min_sep).copy()
  if k < rows:
    w[:-k] -= w[k:].copy()
  return np.cumsum(w[::-1], axis=0)[::-1].ravel()[:n]


def padded(coeffs: np.ndarray, n: int) -> np.ndarray:
  out = np.zeros(n)
  m = min(n, coeffs.shape[0])
  out[:m] = coeffs[:m]
  return out


def is_nonincreasing_nonnegative(coeffs: np.ndarray) -> bool:
  return bool(np.all(coeffs >= 0) and np.all(np.diff(coeffs) <= 0))


def _row_bound(coeffs: np.ndarray, min_sep: int, k: int) -> float:
  """ρ ≥ max over rounds i and patterns π ∋ i of Σ_{j∈π} |X_ij| (X = CᵀC).

  |X_ij| ≤ r(|i − j|) with r(d) = Σ_t |f_t|·|f_{t+d}| (zero for d ≥ b). The other k − 1
  rounds of π lie on both sides of i, each side a min_sep-separated set within the
  band; a dynamic program over distances gives the best such set with t rounds.
  """
  a = np.abs(coeffs)
  b = a.shape[0]
  r = scipy.signal.fftconvolve(a, a[::-1])[b - 1:] if b > 256 else \
      np.correlate(a, a, mode="full")[b - 1:]
  others = min(k - 1, 2 * ((b - 1) // min_sep))
  per_side = min(others, (b - 1) // min_sep)
  if per_side == 0:
    return float(r[0])
  neg = -np.inf
  # best[t][d]: t rounds at distances in [min_sep, d], pairwise ≥ min_sep apart.
  prev = np.zeros(b)  # t = 0
  side = [0.0]
  for t in range(1, per_side + 1):
    candidate = np.full(b, neg)
    candidate[t * min_sep:] = prev[(t - 1) * min_sep:b - min_sep] + r[t * min_sep:]
    cur = np.maximum.accumulate(candidate)
    side.append(max(side[-1], float(cur[b - 1])))
    prev = cur
  best = max(side[tl] + side[tr] for tl in range(per_side + 1)
             for tr in range(per_side + 1) if tl + tr <= others)
  return float(r[0] + best)


def min_sep_sensitivity(coeffs, n: int, min_sep: Optional[int],
                        max_participations: Optional[int] = None) -> float:
  """ℓ2 sensitivity of the banded Toeplitz C (first column ``coeffs``) under b-min-sep.

  Up to k = max_participations rounds (as many as fit when None), pairwise at least
  ``min_sep`` apart (Choquette-Choo et al. 2023, arXiv:2306.08153); min_sep None is single
  participation. sens² = max_π max_{‖g_p‖≤1} ‖Σ_{p∈π} C[:, p]·g_pᵀ‖_F² ≤ max_π Σ_{p,q∈π}
  |X_pq| with X = CᵀC. ``min_sep_sensitivity_report``'s value (which bound: its method).
  """
  return min_sep_sensitivity_report(coeffs, n, min_sep, max_participations)["value"]


def min_sep_sensitivity_report(coeffs, n: int, min_sep: Optional[int],
                               max_participations: Optional[int] = None) -> Dict[str, Any]:
  """{value, exact, method} of ``min_sep_sensitivity`` (see it and the module docstring).

  Exact ("single", "disjoint_columns", "earliest_pattern") when k = 1, when b ≤ min_sep
  (disjoint columns) or when the coefficients are non-negative and non-increasing
  (Kalinin & Lampert 2024, arXiv:2405.13763, Thm 2). Proof of the latter: X ≥ 0
  entrywise, so equal contributions are worst; for i ≤ j, X_ij = Σ_{s=0}^{n−1−j}
  f_s·f_{s+j−i} falls as j − i grows and as j grows, and the a-th and c-th rounds
  p_a ≤ p_c of any pattern satisfy p_c − p_a ≥ (c − a)·min_sep and p_c ≥ (c − 1)·min_sep,
  so replacing π by {0, min_sep, …, (k−1)·min_sep} raises every term. Otherwise the
  smallest of three valid upper bounds: "majorant_bound" (the exact value for the
  non-increasing majorant of |f|, which dominates |X| entrywise), "row_bound" (k·ρ,
  ``_row_bound``, Choquette-Choo et al. 2023, Eq. 5) and "alg4_bound" (``alg4_bound``).
  """
  f = checks.real_array(coeffs, "Toeplitz coefficients")
  if f.ndim != 1 or f.shape[0] < 1:
    raise checks.CheckError(f"Toeplitz coefficients must be a non-empty 1-D array, got "
                            f"shape {f.shape}")
  n = checks.positive_int(n, "n")
  min_sep, k = participations(n, min_sep, max_participations)
  f = f[:n]
  if k == 1:
    return {"value": float(np.linalg.norm(f)), "exact": True, "method": "single"}
  b = f.shape[0]
  if b <= min_sep or is_nonincreasing_nonnegative(f):
    return {"value": float(np.linalg.norm(minsep_vector(padded(f, n), min_sep, k))),
            "exact": True, "method": "disjoint_columns" if b <= min_sep else "earliest_pattern"}
  majorant = np.maximum.accumulate(np.abs(f)[::-1])[::-1]
  bounds = {"majorant_bound": float(np.linalg.norm(minsep_vector(padded(majorant, n),
                                                                 min_sep, k))),
            "row_bound": math.sqrt(k * _row_bound(f, min_sep, k))}
  alg4 = alg4_bound(f, n, min_sep, k)
  if alg4 is not None:
    bounds["alg4_bound"] = alg4
  method = min(bounds, key=bounds.get)
  return {"value": bounds[method], "exact": False, "method": method}


def gram_band(coeffs: np.ndarray, n: int) -> np.ndarray:
  """|X| on its band, X = CᵀC for the lower-triangular Toeplitz C (n x n) with first column
  ``coeffs`` (b of them): W[i, b − 1 + d] = |X_{i, i+d}| for |d| < b (0 outside 0..n−1).

  X_{i, i+d} = Σ_{s=0}^{n−1−i−d} f_s·f_{s+d} for d ≥ 0 (X is symmetric), from one cumulative
  sum per diagonal: O(n·b).
  """
  f = padded(np.asarray(coeffs, dtype=np.float64), n)
  b = min(int(np.asarray(coeffs).shape[0]), n)
  w = np.zeros((n, 2 * b - 1))
  for d in range(b):
    cum = np.concatenate([[0.0], np.cumsum(f[:n - d] * f[d:])])
    i = np.arange(n - d)
    diagonal = np.abs(cum[n - d - i])  # X_{i, i+d}
    w[i, b - 1 + d] = diagonal
    w[i + d, b - 1 - d] = diagonal  # X_{i+d, i}
  return w


def alg4_bound(coeffs: np.ndarray, n: int, min_sep: int, k: int) -> Optional[float]:
  """Alg. 4 of Choquette-Choo et al. 2023 (arXiv:2306.08153) for the banded Toeplitz C.

  sens² ≤ max_π Σ_{i∈π} max_{π'} Σ_{j∈π'} |X_ij| (the rows' admissible sets need not be π),
  each maximum a ``separation.separated_max``; row i of |X| vanishes outside its band
  |i − j| < b, where at most ⌈(2b − 1)/min_sep⌉ rounds fit. None when that costs more than
  ``ALG4_MAX_WORK``.
  """
  b = min(int(np.asarray(coeffs).shape[0]), n)
  width = 2 * b - 1
  k_row = min(k, -(-width // min_sep))
  if n * width * k_row > ALG4_MAX_WORK:
    return None
  row_best = separation.separated_max(gram_band(coeffs, n), min_sep, k_row)
  return math.sqrt(float(separation.separated_max(row_best, min_sep, k)))


def sensitivity_is_exact(coeffs: np.ndarray, n: int, min_sep: Optional[int],
                         max_participations: Optional[int] = None) -> bool:
  """Whether ``min_sep_sensitivity`` is exact (not just an upper bound) for these inputs."""
  f = np.asarray(coeffs, dtype=np.float64)[:n]
  min_sep, k = participations(n, min_sep, max_participations)
  return k == 1 or f.shape[0] <= min_sep or is_nonincreasing_nonnegative(f)


def schema_arguments(schema, n: int) -> Tuple[Optional[int], Optional[int]]:
  """(min_sep, max_participations) a schema is optimized under: fixed-epoch (k, b) patterns
  are b-separated with k rounds, so b-min-sep with ≤ k participations covers them."""
  cover = schema.cyclic_cover(n)
  return (None, None) if cover is None else cover


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
  sens = min_sep_sensitivity(f, n, min_sep, max_participations)
  out = evaluate_inverse_column(inverse_column(f, n), sens, work)
  out["sensitivity_exact"] = sensitivity_is_exact(f, n, min_sep, max_participations)
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
  sens = min_sep_sensitivity(coeffs, n, min_sep, max_participations)
  figures = evaluate_inverse_column(h, sens, work)
  objective_value = (figures["rmse"] if error == "mean" else figures["max_error"]) ** 2
  info = {
      **family_info, "error": error, "workload": work.kind, "min_sep": min_sep,
      "max_participations": k,
      "sensitivity_exact": sensitivity_is_exact(coeffs, n, min_sep, max_participations),
      **figures, "objective": objective_value, **fit,
  }
  b_mat = c_mat = None
  if dense:
    checks.dense_matrices_fit(n, 3 if work.toeplitz else 5, f"{what} B and C (n={n})")
    c_mat = lower_toeplitz(padded(coeffs, n))
    b_mat = work.b_matrix(h)
  info["seconds"] = time.perf_counter() - start
  return Result(b=b_mat, c=c_mat, info=info, extras=extras)


def rounds_of(n) -> int:
  """n, or the size of a workload A given instead."""
  if isinstance(n, np.ndarray) and n.ndim == 2:
    return checks.positive_int(n.shape[0], "rounds n")
  return checks.positive_int(n, "rounds n")
