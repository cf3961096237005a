"""The L2 sensitivity of an encoder C under a participation schema (numpy core).

A user contributes a vector x_t with ‖x_t‖₂ ≤ 1 in every round t of a participation
pattern P (a set of rounds); the L2 sensitivity of C (m x n, columns = rounds) is

  sens(C)² = sup_P sup_{‖x_t‖ ≤ 1} ‖Σ_{t∈P} C[:, t] x_tᵀ‖²_F = sup_P sup Σ_{s,t∈P} X_st ⟨x_s, x_t⟩

with X = CᵀC (Choquette-Choo, McMahan, Rush, Thakurta 2023, arXiv:2211.06530).
Each kind (``tff_mf.participation.kinds``) brackets sens² with its own routine here:
fixed epochs and fixed bins by their b patterns, min_sep by Alg. 4 of arXiv:2306.08153
(exact in the cases below), random allocation by ``random_allocation_bounds``.

For min_sep the value is exact when columns ≥ b apart have disjoint supports, and when C
is lower-triangular Toeplitz with non-negative, non-increasing coefficients (BLT and
banded Toeplitz almost always are): then the earliest pattern {0, b, …, (k−1)b} is the
worst one, O(n·k) (``_earliest_pattern_toeplitz``).

Per pattern P the inner supremum is an SDP; this module brackets it by
  lower(P) = max(1ᵀX_P1, tr X_P, max_{s∈{±1}^|P|} sᵀX_P s)   (explicit contributions)
  upper(P) = min(Σ_{s,t}|X_st|, |P|·λ_max(X_P))              (arXiv:2306.08153 Eq. 5, and
                                                             ⟨X_P, VᵀV⟩ ≤ λ_max·tr VᵀV)
(random_allocation: see ``random_allocation_bounds`` for how the b^k patterns are searched)
and ``sensitivity`` (``kinds``) returns the square root of the maximal upper value, never below the
true sensitivity (up to float64 rounding of CᵀC). The report says ``exact`` when the
largest upper value is attained by an explicit contribution (within 1e-12 relative).
"""

from __future__ import annotations

import itertools
import math
from typing import Callable, List, Optional, Tuple

import numpy as np

from tff_mf import checks
from tff_mf import toeplitz_view
from tff_mf.participation import separation

# Random-allocation patterns (b^k) enumerated for the sensitivity at most.
RANDOM_ALLOCATION_ENUMERATION_LIMIT = 20000
# Admissible min-sep patterns enumerated (to tighten the Alg. 4 bound) at most.
ENUMERATION_LIMIT = 2000
# Blocks up to this size also try every ±1 sign vector for the lower bound.
SIGN_ENUMERATION_MAX = 10
# Upper and lower squared sensitivity within this relative distance count as exact.
EXACT_RTOL = 1e-12
# Relative margin added to every reported sensitivity (float64 rounding of Σ C_ij²).
ROUNDING_MARGIN = 1e-12
# Version of the min_sep analysis (2: exact earliest-pattern value for non-negative,
# non-increasing Toeplitz C; 3: for other Toeplitz C also toeplitz_ops' structured bounds,
# the smallest valid bound used). Part of min_sep cache keys, so that entries whose sidecar
# figures came from an older analysis are recomputed rather than refused as edited.
MIN_SEP_ANALYSIS_VERSION = 3



def _gram(c: np.ndarray) -> np.ndarray:
  m, n = c.shape
  checks.dense_matrices_fit(n, 2.0, f"the Gram matrix CᵀC for n={n}")
  x = c.T @ c
  return 0.5 * (x + x.T)


def toeplitz_gram(coef: np.ndarray) -> np.ndarray:
  """X = CᵀC of the n x n lower-triangular Toeplitz C with first column ``coef``, in O(n²)
  instead of a dense product's O(n³): X[i, j] = Σ_{t ≤ n−1−max(i, j)} c_t·c_{t+|i−j|}, one
  running sum per lag |i − j| (exactly symmetric; exact zeros at lags beyond C's bands)."""
  c = np.ascontiguousarray(coef, dtype=np.float64).reshape(-1)
  n = c.shape[0]
  checks.dense_matrices_fit(n, 2.0, f"the Gram matrix CᵀC for n={n}")
  padded = np.concatenate([c, np.zeros(n)])
  lagged = np.lib.stride_tricks.as_strided(padded, shape=(n, n),
                                           strides=(padded.itemsize,) * 2, writeable=False)
  sums = np.multiply(lagged, c[None, :])  # sums[d, t] = c_t·c_{t+d}
  np.cumsum(sums, axis=1, out=sums)  # sums[d, L] = Σ_{t ≤ L} c_t·c_{t+d}
  x = np.empty((n, n))
  flat = x.reshape(-1)
  for d in range(n):  # lag d: entries (j + d, j) and (j, j + d) hold sums[d, n − 1 − d − j]
    values = sums[d, n - 1 - d::-1]
    flat[d * n::n + 1] = values
    flat[d::n + 1][:n - d] = values
  return x


class Gram:
  """X = CᵀC of one encoder C, computed on first use, and its largest eigenvalue: the
  analyses of one C under several schemas share them (a dense n = 2048 product takes
  about half a second; ``toeplitz_gram`` a tenth of that where C is known to be
  lower-triangular Toeplitz: ``column`` given, or C a ``tff_mf.toeplitz_view``). C must not
  change once it is computed."""

  def __init__(self, c: np.ndarray, column: Optional[np.ndarray] = None):
    self._c = c
    self._column = toeplitz_view.column_of(c) if column is None else column
    self._x: Optional[np.ndarray] = None
    self._lambda_max: Optional[float] = None

  @property
  def matrix(self) -> np.ndarray:
    if self._x is None:
      if self._column is not None:
        # The sensitivity is C's: a column given beside a dense C must be that C's (O(n²)
        # reads, no n x n copy); a Toeplitz view is its column's by its layout.
        if (toeplitz_view.column_of(self._c) is None
            and not np.array_equal(self._c, toeplitz_view.view(self._column))):
          raise checks.CheckError("the first column given for CᵀC is not C's (C is not the "
                                  "lower-triangular Toeplitz matrix of that column)")
        self._x = toeplitz_gram(self._column)
      else:  # a contiguous copy of a strided view (BLAS cannot multiply one)
        self._x = _gram(np.ascontiguousarray(self._c))
    return self._x

  @property
  def lambda_max(self) -> float:
    if self._lambda_max is None:
      self._lambda_max = float(np.linalg.eigvalsh(self.matrix)[-1])
    return self._lambda_max

  @property
  def nbytes(self) -> int:
    return 0 if self._x is None else int(self._x.nbytes)


def _block_bounds(blocks: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
  """(upper, lower) bounds on the SDP value of each [p, p] block (see the module docstring)."""
  size = blocks.shape[-1]
  abs_sum = np.sum(np.abs(blocks), axis=(-2, -1))
  lam_max = np.linalg.eigvalsh(blocks)[..., -1]
  upper = np.minimum(abs_sum, size * np.maximum(lam_max, 0.0))
  lower = np.maximum(np.sum(blocks, axis=(-2, -1)), np.trace(blocks, axis1=-2, axis2=-1))
  if 1 < size <= SIGN_ENUMERATION_MAX:
    signs = np.array(list(itertools.product((1.0, -1.0), repeat=size - 1)))
    signs = np.concatenate([np.ones((signs.shape[0], 1)), signs], axis=1)
    forms = np.einsum("si,...ij,sj->...s", signs, blocks, signs)
    lower = np.maximum(lower, np.max(forms, axis=-1))
  # Never report a lower bound above the upper one (they meet when exact; rounding aside).
  return upper, np.minimum(lower, upper)


def fixed_epoch_bounds(c: np.ndarray, idx: np.ndarray, col_sq: np.ndarray,
                       gram: Optional[Gram] = None):
  """(upper, lower, method) of sens² over the patterns ``idx`` ([b, k]: row j the rounds
  {j, j+b, …}; (k, b)-participation, arXiv:2211.06530): exact when every pattern block
  of X = CᵀC is non-negative or diagonal, else arXiv:2306.08153 Eq. 5 tightened by
  |P|·λ_max (``gram``: C's, shared with other analyses)."""
  epochs = idx.shape[1]
  if epochs == 1:
    value = float(np.max(col_sq))
    return value, value, "max_column_norm"
  x = (gram or Gram(c)).matrix
  blocks = x[idx[:, :, None], idx[:, None, :]]
  upper, lower = _block_bounds(blocks)
  off = blocks * (1.0 - np.eye(epochs))
  if not np.any(off):
    method = "pattern_traces"  # exact: orthogonal columns within every pattern
  elif np.all(blocks >= 0):
    method = "pattern_sums"  # exact: all-equal contributions attain Σ X_st
  else:
    method = "abs_bound"  # arXiv:2306.08153 Eq. 5, tightened by |P|·λ_max
  return float(np.max(upper)), float(np.max(lower)), method


def _disjoint_supports(c: np.ndarray, sep: int) -> bool:
  """Columns of rounds ≥ sep apart have disjoint row supports (so X_st = 0 exactly)."""
  m, n = c.shape
  nonzero = c != 0
  has = np.any(nonzero, axis=0)
  first = np.where(has, np.argmax(nonzero, axis=0), m)
  last = np.where(has, m - 1 - np.argmax(nonzero[::-1], axis=0), -1)
  # Smallest first row among columns t ≥ s + sep (suffix minimum).
  suffix_first = np.minimum.accumulate(first[::-1])[::-1]
  s = np.arange(n - sep)
  # Disjoint intervals need every later column to start after s ends, or s to start after
  # it ends; banded lower-triangular C gives the first case.
  return bool(np.all(last[s] < suffix_first[s + sep])) if n > sep else True


def toeplitz_coefficients(c: np.ndarray) -> Optional[np.ndarray]:
  """c_0..c_{n−1} when C (n x n) is exactly lower-triangular Toeplitz, C[i, j] = c_{i−j}; else None."""
  m, n = c.shape
  if m != n or np.any(np.triu(c, 1)):
    return None
  coef = c[:, 0]
  # Every diagonal equals its first entry: compare C with the Toeplitz matrix of its column.
  idx = np.arange(n)
  diff = idx[:, None] - idx[None, :]
  built = np.where(diff >= 0, coef[np.maximum(diff, 0)], 0.0)
  return coef.copy() if np.array_equal(built, c) else None


def _earliest_pattern_toeplitz(coef: np.ndarray, b: int, k: int) -> Optional[float]:
  """Σ_{i,j<k} X_{ib, jb} for C = Toeplitz(coef), in O(n·k); None unless coef ≥ 0 is non-increasing.

  X_st = Σ_{l=0}^{n−1−max(s,t)} c_l c_{l+|s−t|}. With c_0 ≥ c_1 ≥ … ≥ 0 every X_st is
  non-negative and non-increasing in |s − t| and in max(s, t), so the earliest pattern
  {0, b, …, (k−1)b} dominates every admissible pattern term by term (its i-th and j-th
  rounds are no farther apart and no later), and equal contributions attain Σ X_st
  (X ≥ 0): the value is the exact squared sensitivity (cf. Kalinin, Lampert 2024,
  arXiv:2405.13763, for the same domination argument under b-min-separation).
  """
  if np.any(coef < 0) or np.any(np.diff(coef) > 0):
    return None
  return toeplitz_pattern_sum(coef, b, k)


def toeplitz_pattern_sum(coef: np.ndarray, b: int, k: int) -> float:
  """Σ_{i,j<k} X_{ib, jb}, X = CᵀC for C = Toeplitz(coef), in O(n·k) (no C)."""
  n = coef.shape[0]
  k = min(k, -(-n // b))
  total = 0.0
  for gap in range(k):  # pairs (i, j) with |i − j| = gap, max(i, j) = i
    d = gap * b
    # cum[r] = Σ_{l < r} c_l c_{l+d}; X_{s,s+d} with max = s + d sums l ≤ n − 1 − (s + d).
    prod = coef[:n - d] * coef[d:]
    cum = np.concatenate([[0.0], np.cumsum(prod)])
    rows = np.arange(gap, k) * b  # max(i, j)·b for i = gap..k−1
    terms = cum[n - rows]
    total += (1.0 if gap == 0 else 2.0) * float(np.sum(terms))
  return total


def residue_class_sensitivity_toeplitz(coef: np.ndarray, b: int) -> float:
  """sqrt(max_r Σ_{j,j' ≡ r mod b} |X_jj'|) for the lower-triangular Toeplitz C ≥ 0 with first
  column ``coef`` (every round of a residue class joined), exactly and without C: X ≥ 0, and
  class r's pair (r + ib, r + jb) has class 0's pair (ib, jb)'s lag and a later last round,
  so X sums fewer non-negative terms over it; class 0 is the largest (``toeplitz_pattern_sum``)."""
  if np.any(coef < 0):
    raise checks.CheckError("the residue-class sum of |X| over a Toeplitz C needs C ≥ 0")
  return math.sqrt(toeplitz_pattern_sum(coef, b, coef.shape[0]))


def toeplitz_column_norms_sq(coef: np.ndarray) -> np.ndarray:
  """‖C[:, j]‖² of the lower-triangular Toeplitz C with first column ``coef``: Σ_{l ≤ n−1−j}
  c_l², summed in row order as ``np.sum(C**2, axis=0)`` sums a dense C (O(n))."""
  return np.cumsum(np.square(coef))[::-1].copy()


def _toeplitz_disjoint_supports(coef: np.ndarray, sep: int) -> bool:
  """``_disjoint_supports`` of the lower-triangular Toeplitz C with first column ``coef``:
  column j holds rows j + l for the non-zero lags l ≤ n − 1 − j (O(n log n))."""
  n = coef.shape[0]
  lags = np.nonzero(coef)[0]
  if n <= sep or lags.size == 0:
    return True
  j = np.arange(n)
  first = np.where(j + lags[0] <= n - 1, j + lags[0], n)
  deepest = np.searchsorted(lags, n - 1 - j, side="right") - 1
  last = np.where(deepest >= 0, j + lags[np.maximum(deepest, 0)], -1)
  suffix_first = np.minimum.accumulate(first[::-1])[::-1]
  s = np.arange(n - sep)
  return bool(np.all(last[s] < suffix_first[s + sep]))


def toeplitz_bounds(coef: np.ndarray, kind: str, b: int, k: int
                    ) -> Optional[Tuple[float, float, str]]:
  """(upper, lower, method) of sens² for the lower-triangular Toeplitz C with first column
  ``coef`` (length n) in O(n·k), without C: the same values ``min_sep_bounds`` (kind
  "min_sep", b-min-sep with ≤ k rounds) or single participation gives the dense C where
  its answer is exact (one round, disjoint supports, the earliest pattern of a non-negative
  non-increasing C); None otherwise (the caller uses the dense C, or an upper bound)."""
  col_sq = toeplitz_column_norms_sq(coef)
  if kind == "single" or (kind == "min_sep" and k == 1):
    value = float(np.max(col_sq))
    return value, value, "max_column_norm"
  if kind != "min_sep":
    return None
  if _toeplitz_disjoint_supports(coef, b):
    lower, _ = separation.separated_argmax(col_sq, b, k)
    return lower, lower, "disjoint_supports"
  earliest = _earliest_pattern_toeplitz(coef, b, k)
  if earliest is not None:
    return earliest, earliest, "toeplitz_earliest_pattern"
  return None


def min_sep_bounds(c: np.ndarray, b: int, k: int, col_sq: np.ndarray,
                   patterns: Callable[..., List[Tuple[int, ...]]], gram: Optional[Gram] = None):
  """(upper, lower, method) of sens² under b-min-separation with ≤ k rounds (arXiv:2306.08153
  Alg. 4, tightened as ``sensitivity`` says); ``patterns(n, limit=…)`` lists the maximal
  patterns or refuses more than ``limit``; ``gram``: C's, shared with other analyses."""
  n = c.shape[1]
  # Mutually orthogonal unit contributions attain Σ_{t∈P} X_tt: a lower bound for any C.
  lower, best_set = separation.separated_argmax(col_sq, b, k)
  if k == 1:
    return lower, lower, "max_column_norm"
  if _disjoint_supports(c, b):
    return lower, lower, "disjoint_supports"  # X_st = 0 for |s − t| ≥ b: exact
  coef = toeplitz_coefficients(c)
  earliest = None if coef is None else _earliest_pattern_toeplitz(coef, b, k)
  if earliest is not None:
    return earliest, earliest, "toeplitz_earliest_pattern"
  checks.dense_matrices_fit(n, 6.0, f"the min_sep sensitivity bound for n={n}")
  x = (gram or Gram(c)).matrix
  # arXiv:2306.08153 Alg. 4: best admissible set per row of |X|, then over the row values.
  row_best = separation.separated_max(np.abs(x), b, k)
  upper, row_set = separation.separated_argmax(row_best, b, k)
  method = "alg4_bound"
  for pattern in (best_set, row_set):
    if pattern:
      p = np.asarray(pattern)
      _, low = _block_bounds(x[np.ix_(p, p)])
      lower = max(lower, float(low))
  try:
    listed = patterns(n, limit=ENUMERATION_LIMIT)
  except checks.CheckError:
    listed = None
  if listed is not None:
    enum_upper, enum_lower = 0.0, lower
    for size in sorted({len(p) for p in listed}):
      idx = np.array([p for p in listed if len(p) == size])
      up, low = _block_bounds(x[idx[:, :, None], idx[:, None, :]])
      enum_upper = max(enum_upper, float(np.max(up)))
      enum_lower = max(enum_lower, float(np.max(low)))
    if enum_upper < upper:
      upper, method = enum_upper, "enumerated_patterns"
    lower = enum_lower
  if coef is not None:  # Toeplitz: its structured bounds are valid too; the smaller is used
    from tff_mf.participation import toeplitz_bounds  # pylint: disable=g-import-not-at-top
    structured = toeplitz_bounds.min_sep_sensitivity_report(np.trim_zeros(coef, "b"), n, b, k)
    if structured["value"] ** 2 < upper:
      upper, method = structured["value"] ** 2, "toeplitz_" + structured["method"]
  return upper, min(lower, upper), method


def _best_one_per_block(weights: np.ndarray, k: int, b: int) -> Tuple[float, Tuple[int, ...]]:
  """max over one round per block of Σ_{s,t∈P} weights[s, t], when weights vanish between
  blocks ≥ 2 apart: a chain, so dynamic programming over the blocks is exact; O(k·b²)."""
  w = weights.reshape(k, b, k, b)
  value = np.diagonal(w[0, :, 0, :]).copy()
  back = []
  for j in range(1, k):
    cross = value[:, None] + 2.0 * w[j - 1, :, j, :]  # [previous round, this round]
    back.append(np.argmax(cross, axis=0))
    value = np.max(cross, axis=0) + np.diagonal(w[j, :, j, :])
  t = int(np.argmax(value))
  chosen = [t]
  for j in range(k - 1, 0, -1):
    t = int(back[j - 1][t])
    chosen.append(t)
  return float(np.max(value)), tuple(j * b + t for j, t in enumerate(reversed(chosen)))


def _ascend_one_per_block(x: np.ndarray, pattern: Tuple[int, ...], b: int,
                          sweeps: int = 50) -> Tuple[int, ...]:
  """Block coordinate ascent of 1ᵀX_P1 over one round per block (a local maximum)."""
  p = list(pattern)
  for _ in range(sweeps):
    changed = False
    for j in range(len(p)):
      rows = np.arange(j * b, (j + 1) * b)
      others = [q for i, q in enumerate(p) if i != j]
      gain = np.diag(x)[rows] + 2.0 * np.sum(x[np.ix_(rows, others)], axis=1)
      best = int(rows[np.argmax(gain)])
      if best != p[j] and gain[best - j * b] > gain[p[j] - j * b]:  # strict: it terminates
        p[j], changed = best, True
    if not changed:
      break
  return tuple(p)


def _rayleigh_at_least(x: np.ndarray, level: float, iterations: int = 3) -> bool:
  """Whether a Rayleigh quotient vᵀXv/vᵀv (at most λ_max(X)) of a few power iterations from
  the all-ones vector reaches ``level``: then λ_max ≥ level without an eigendecomposition
  (O(n²) per iteration instead of O(n³))."""
  v = np.ones(x.shape[0]) / math.sqrt(x.shape[0])
  for _ in range(iterations + 1):
    xv = x @ v
    if float(v @ xv) >= level:  # ‖v‖ = 1
      return True
    norm = float(np.linalg.norm(xv))
    if not 0 < norm < math.inf:
      return False
    v = xv / norm
  return False


def random_allocation_bounds(c: np.ndarray, k: int, col_sq: np.ndarray,
                             patterns: Callable[..., List[Tuple[int, ...]]],
                             gram: Optional[Gram] = None):
  """(upper, lower, method) of sens² under random allocation: one round in each of k blocks.

  Patterns: every choice P of one round per block of b = n/k rounds (Chua et al. 2024,
  arXiv:2412.16802). Exact ("block_chain_dp") when X = CᵀC vanishes between rounds
  of blocks ≥ 2 apart (e.g. C with ≤ b + 1 bands): max_P Σ|X_P| by dynamic programming
  over the blocks, attained by equal contributions when X_P ≥ 0 (as for every
  non-negative C). Exact by enumeration ("enumerated_patterns") when b^k ≤
  ``RANDOM_ALLOCATION_ENUMERATION_LIMIT`` and the best pattern's block is non-negative
  or diagonal. Otherwise ("row_bound") the smaller of two upper bounds valid for every
  pattern: Σ_j max_{s∈block j} Σ_i max_{t∈block i} |X_st| (arXiv:2306.08153 Alg. 4
  with one round per block instead of b-separated sets) and k·λ_max(X) (λ_max of a
  principal block ≤ λ_max(X)); the lower value comes from explicit contributions on
  patterns found by block coordinate ascent, and the report says exact only when they
  meet. ``gram``: C's, shared with other analyses.
  """
  n = c.shape[1]
  b = n // k
  # Mutually orthogonal unit contributions, each at its block's longest column.
  lower = float(np.sum(np.max(col_sq.reshape(k, b), axis=1)))
  if k == 1:
    return lower, lower, "max_column_norm"
  gram = gram or Gram(c)
  x = gram.matrix
  if b == 1:
    up, low = _block_bounds(x[None])
    return float(up[0]), float(low[0]), ("pattern_sums" if np.all(x >= 0) else "abs_bound")
  ax = np.abs(x)
  block_of = np.arange(n) // b
  far = np.abs(block_of[:, None] - block_of[None, :]) >= 2
  if not np.any(x[far]):
    upper, pattern = _best_one_per_block(ax, k, b)
    p = np.asarray(pattern)
    _, low = _block_bounds(x[np.ix_(p, p)])
    return upper, max(lower, float(low)), "block_chain_dp"
  row = np.sum(np.max(ax.reshape(n, k, b), axis=2), axis=1)  # per s: best |X_st| per block
  upper = float(np.sum(np.max(row.reshape(k, b), axis=1)))
  if not _rayleigh_at_least(x, upper / k):  # else k·λ_max ≥ the row bound: it cannot win
    upper = min(upper, k * max(gram.lambda_max, 0.0))
  method = "row_bound"
  starts = [tuple(j * b + int(np.argmax(col_sq[j * b:(j + 1) * b])) for j in range(k)),
            tuple(j * b + int(np.argmax(row[j * b:(j + 1) * b])) for j in range(k))]
  for start in starts:
    p = np.asarray(_ascend_one_per_block(x, start, b))
    _, low = _block_bounds(x[np.ix_(p, p)])
    lower = max(lower, float(low))
  if b ** k <= RANDOM_ALLOCATION_ENUMERATION_LIMIT:
    idx = np.asarray(patterns(n))
    up, low = _block_bounds(x[idx[:, :, None], idx[:, None, :]])
    if float(np.max(up)) < upper:
      upper, method = float(np.max(up)), "enumerated_patterns"
    lower = max(lower, float(np.max(low)))
  return upper, min(lower, upper), method
