"""Sensitivity of a banded lower-triangular Toeplitz C under b-min-separation (numpy core).

The structured bounds of a Toeplitz C with first column f (b coefficients), used by the
Toeplitz-type families and by ``bounds`` for any C that is Toeplitz.

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

import math
from typing import Any, Dict, Optional, Tuple

import numpy as np
import scipy.signal

from tff_mf import checks
from tff_mf.participation import separation

# Alg. 4 on the band of CᵀC costs about n·(2b − 1)·k' operations (k' ≤ k participations fit in
# one row's band); above this it is skipped (the other two bounds still hold).
ALG4_MAX_WORK = 5e7


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

