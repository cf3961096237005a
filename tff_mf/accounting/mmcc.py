"""MMCC: privacy amplification by sampling for matrix mechanisms (numpy + dp_accounting).

Choquette-Choo, Ganesh, Steinke, Thakurta, *Privacy Amplification for Matrix
Mechanisms* (ICLR 2024, arXiv:2310.15526). A matrix mechanism releases C·x + z,
z ~ N(0, σ²) per entry, where each example joins each round independently with
probability p and contributes at most 1 in L2 norm. ``mmcc`` returns an ε such
that the mechanism is (ε, δ)-DP with δ = δ1 + δ2 (Thm 4.3):

1. ``ProbabilityTailBounds`` (Fig 5): with probability ≥ 1 − δ1, the posterior
   probability that the sensitive example joined round j, given the outputs of
   rows 1..i−1, is at most p̃_ij.
2. Each row i is then dominated by the product-mixture-of-Gaussians mechanism
   PMoG({p̃_ij}_j, {C_ij}_j) (Lemma C.3); its PLD is built with dp_accounting's
   ``MixtureGaussianPrivacyLoss`` (App F.1).
3. The row PLDs are composed (conditional composition, Thm 3.1 / C.2), and ε is
   read off at δ2 (Fig 1).

The b-min-sep generalization (App D, Figs 6-7) covers sampling schemes where
an example may join only every b-th round with probability b·p (DP-FTRL-
TreeRestart, banded matrices of Choquette-Choo et al. 2023, arXiv:2306.08153).
Here, as in App D, ``sampling_prob`` p is the average rate; ``tff_mf.accounting``
takes the probability b·p of joining an eligible round instead. ε is the worst
over the b residue classes of examples; a class whose every row block is
dominated, column by column, by the same block of another class (sensitivity
and p̃ no larger: a stochastically smaller PMoG, Cor B.3) cannot be the worst
and is not composed (``dominates``). For a lower-triangular Toeplitz C (BLT,
banded Toeplitz) class o is class 0 with its last o rows cut off, so only class
0 is composed and the cost no longer grows with b: BLT at n = 2048, k = 8
takes under a minute on 2 cores (BENCHMARKS.md, MMCC). For b = 1 and a
lower-triangular Toeplitz C, the Gram entry of columns i − d and i − e over rows
< i depends on the lags (d, e) only, so the tail bounds of every row are read off
one sequence per lag (``_toeplitz_row_mixtures``, bit-identical to the row-by-row
computation).

EVERY APPROXIMATION HERE ONLY OVER-ESTIMATES ε (App F):
- entries of C are rounded UP to a grid of step Δ2 (F.2; Lemma B.2 / B.4:
  larger non-negative sensitivities give a dominating PLD). Refining the grid by
  an integer factor never raises ε. A row's entries below Δ2 are first merged
  into groups of sum ≤ Δ2, each one step joined with probability 1 − Π(1 − p̃)
  (``merge_small``: dominates the row, Cor B.3, and is dominated by rounding each
  entry up), which makes the rows of a Toeplitz C with tiny far lags equal;
- s_ij is over-estimated by the sum of the t largest inner products, t an
  exact binomial tail bound (F.3; any over-estimate of s_ij is valid);
- each p̃_ij is rounded UP to a multiple of 2⁻⁴⁰ (larger participation
  probabilities give a stochastically larger sensitivity, Cor B.3), which
  makes equal rows bit-identical so each distinct row PLD is computed once
  (F.4);
- when a row's sensitivity distribution has more than ``max_components``
  support points they are rounded UP to a coarser power-of-two multiple of
  Δ2 (stochastic dominance, Cor B.3);
- the far tail of each row's sensitivity distribution (total mass at most
  ``mixture_tail_mass``) is MOVED UP to the row's largest possible sensitivity
  (stochastic dominance, Cor B.3), which keeps mixtures small;
- PLDs use dp_accounting's pessimistic connect-the-dots discretization and
  its pessimistic tail truncation (truncated mass counts as infinite loss).
  The grid step is ``pld_discretization`` unless some row's privacy-loss range
  would need more than ``MAX_ROW_POINTS`` points (tiny σ); then all rows use
  the coarser step that fits (still pessimistic, so still an upper bound), and
  a range that needs a step above ``gaussian.PLD_MAX_DISCRETIZATION`` is
  refused (MMCCNumericError). Where dp_accounting's search for the left
  truncation point fails by one ulp, the end of its search interval is used
  (all mass left of it counts as infinite loss);
- the inverse privacy loss (App F.1) is, as in dp_accounting, the smallest
  point x of a fine grid (step 1e-9) whose loss is ≤ ℓ; we find it by a
  vectorized safeguarded Newton search instead of dp_accounting's recursive
  scalar bisection. Since δ(ε) = max_x [P(X ≤ x) − e^ε Q(X ≤ x)] is stationary
  at the exact inverse, this grid offset changes δ only at second order
  (≲ 1e-18), i.e. at floating-point level;
- PLD composition truncates tails pessimistically (dp_accounting).
What remains is floating-point round-off (≈1e-16 relative) in the mixture
probabilities and PLD arithmetic.

Adaptivity (footnote 7, Lemma B.4) needs C lower triangular with rows in
release order and non-negative entries (Lemma C.3 uses non-negativity). C may
have more rows than columns when its rows are in release order (the binary
tree: a node is released in the round of its last leaf, ``tff_mf.factorization.families.tree``).
Other matrices are rejected unless the caller asserts ``non_adaptive=True``
(data fixed in advance), where any row order is valid (Observation 3.2) and
negative entries are replaced by their absolute values (the triangle
inequality in Step 1 of the proof of Thm 4.3 and Lemma B.4 bound the row
norms of Σ_j C_{:,j}x_j by Σ_j |C_{:,j}|).

Noise: ``noise_multiplier`` σ is the noise std relative to the clip norm; the
matrix C is used as given (built-in strategies are normalized to γ(C) = 1, so
there σ is the usual noise multiplier z of Denisov Thm 4.1).
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import math
import multiprocessing
import sys
import time
import warnings
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
from scipy import special
from scipy import stats

from tff_mf.accounting import gaussian
from tff_mf import checks
from tff_mf import registry
from tff_mf import toeplitz_view
from tff_mf.factorization import workloads
from tff_mf.factorization.families import tree

# The encoders of the MMCC paper's figures: C = I (the registry's identity strategy), the
# binary tree, restarted trees and the truncated √S. (The truncated √S was once also spelled
# "banded_toeplitz", which names the registry's optimized banded Toeplitz strategy: one name,
# one meaning, so only "truncated_sqrt_prefix" is accepted.)
STRATEGIES = (registry.IDENTITY.name, "binary_tree", "tree_restart", "truncated_sqrt_prefix")

DEFAULT_GRID_RESOLUTION = 64  # Δ2 = max entry of C / 64 unless grid_step is given
DEFAULT_PLD_DISCRETIZATION = 1e-4  # Δ of the privacy-loss grid
DEFAULT_MIXTURE_TAIL_MASS = 1e-30
DEFAULT_INVERSE_PRECISION = 1e-9  # x-precision of the inverse privacy loss (App F.1 Δ1)
PROBABILITY_QUANTUM = 2.0 ** -40
DEFAULT_WORKERS = 2
DEFAULT_MAX_COMPONENTS = 128
# Largest number of privacy-loss grid points of one row's PLD. At tiny σ the loss
# range grows like (max sensitivity / σ)²; the grid is then coarsened for all rows
# (a coarser pessimistic grid is still an upper bound), which bounds memory and time.
MAX_ROW_POINTS = 1 << 19
# A row's mass at sensitivity 0 below this moves to its smallest positive sensitivity
# (``_row_pld_task``).
MIN_ZERO_MASS = 1e-9
# Standard deviations of noise on either side of a row's support that a PLD's
# privacy-loss range is estimated to cover (dp_accounting truncates at mass e^-50).
_TAIL_SIGMAS = 12.0


class MMCCError(checks.CheckError):
  """Bad input to the MMCC accountant."""


class MMCCNumericError(MMCCError):
  """The inputs are valid but their privacy loss exceeds what MMCC can represent."""


# ---------------------------------------------------------------------------
# Built-in strategy matrices (all normalized to γ(C) = 1).


def _normalized(c: np.ndarray) -> np.ndarray:
  gamma = checks.gamma(c)
  return c / gamma


def identity_matrix(n: int) -> np.ndarray:
  """C = I: DP-SGD with independent noise."""
  _check_n(n)
  return np.eye(n)


def binary_tree_matrix(n: int) -> np.ndarray:
  """Binary tree C_T (``tff_mf.tree``, rows in release order), divided by √(levels)."""
  _check_n(n)
  return _normalized(tree.tree_encoder(n))


def tree_restart_matrix(n: int, height: int) -> np.ndarray:
  """DP-FTRL-TreeRestart (Kairouz et al. 2021; MMCC Sec 6.3).

  n / 2^(height−1) consecutive height-``height`` binary trees, each over
  2^(height−1) rounds (the last one shorter when n is not a multiple). Block
  diagonal, rows in release order, 2^(height−1)-banded; normalized to γ = 1.
  """
  _check_n(n)
  if int(height) != height or height < 1:
    raise MMCCError(f"tree_restart height must be a positive integer, got {height}")
  leaves = 1 << (int(height) - 1)
  blocks = []
  for start in range(0, n, leaves):
    blocks.append(tree.tree_encoder(min(leaves, n - start)))
  m = sum(b.shape[0] for b in blocks)
  c = np.zeros((m, n))
  r = 0
  for k, b in enumerate(blocks):
    c[r:r + b.shape[0], k * leaves:k * leaves + b.shape[1]] = b
    r += b.shape[0]
  return _normalized(c)


# The Toeplitz square root of the prefix-sum matrix (MMCC App E; Fichtenberger et al. 2023;
# Henzinger et al. 2023).
sqrt_prefix_coefficients = workloads.sqrt_prefix_coefficients


def truncated_sqrt_prefix_matrix(n: int, bands: int) -> np.ndarray:
  """The square root of the prefix-sum matrix truncated to b bands (a b-banded Toeplitz C;
  not the registry's optimized ``banded_toeplitz`` strategy).

  C_ij = f(i − j) for 0 ≤ i − j < b (f from ``sqrt_prefix_coefficients``),
  normalized to γ = 1. Non-negative and lower triangular, so MMCC's adaptive
  analysis applies; with b = n it is the dense App E matrix; b = 1 is the
  identity. A prefix-sum decoder exists since C is invertible (unit diagonal).
  """
  _check_n(n)
  if int(bands) != bands or bands < 1:
    raise MMCCError(f"truncated_sqrt_prefix bands must be a positive integer, got {bands}")
  bands = min(int(bands), n)
  f = sqrt_prefix_coefficients(bands)
  c = np.zeros((n, n))
  for k in range(bands):
    idx = np.arange(k, n)
    c[idx, idx - k] = f[k]
  return _normalized(c)


def strategy_matrix(strategy: str, n: int, height: Optional[int] = None,
                    bands: Optional[int] = None) -> np.ndarray:
  """Built-in encoder C for ``strategy`` in STRATEGIES, normalized to γ = 1."""
  if strategy == registry.IDENTITY.name:
    return identity_matrix(n)
  if strategy == "binary_tree":
    return binary_tree_matrix(n)
  if strategy == "tree_restart":
    if height is None:
      raise MMCCError("tree_restart needs a height (--height)")
    return tree_restart_matrix(n, height)
  if strategy == "truncated_sqrt_prefix":
    if bands is None:
      raise MMCCError("truncated_sqrt_prefix needs a number of bands (--bands)")
    return truncated_sqrt_prefix_matrix(n, bands)
  raise MMCCError(f"unknown strategy {strategy!r}; expected one of {STRATEGIES}")


def _check_n(n) -> None:
  if int(n) != n or n < 1:
    raise MMCCError(f"n must be a positive integer, got {n}")


# ---------------------------------------------------------------------------
# Input checks.


def check_sampling_prob(p) -> float:
  """p in (0, 1] (raises MMCCError otherwise)."""
  try:
    return checks.probability(p, "sampling_prob")
  except checks.CheckError as e:
    raise MMCCError(str(e)) from None


def release_rounds(c: np.ndarray, non_adaptive: bool = False) -> np.ndarray:
  """Round in which each row of C is released (0-based); validates the structure.

  Square C: row i is released in round i, and C must be lower triangular.
  m > n: rows are in release order, row i released in the round of its last
  non-zero column, which must not decrease down the rows. Raises MMCCError
  naming the offending entry/row, unless ``non_adaptive``.
  """
  m, n = c.shape
  if toeplitz_view.column_of(c) is not None:  # square, lower triangular by construction
    return np.arange(n)
  nonzero = c != 0
  any_nz = nonzero.any(axis=1)
  last = np.where(any_nz, n - 1 - np.argmax(nonzero[:, ::-1], axis=1), -1)
  if m == n:
    if not non_adaptive and np.any(np.triu(nonzero, 1)):
      i, j = np.argwhere(np.triu(nonzero, 1))[0]
      raise MMCCError(
          f"C is not lower triangular: C[{i}, {j}] = {c[i, j]:g} lies above the diagonal. "
          "MMCC's adaptive analysis needs lower-triangular C (rows in release order); "
          "pass non_adaptive=True (--non-adaptive) only if the data are fixed in advance")
    rounds = np.arange(n)
    if non_adaptive:
      rounds = np.maximum.accumulate(np.maximum(rounds, last))
    return rounds
  rounds = np.maximum.accumulate(np.maximum(last, 0))
  if not non_adaptive:
    bad = np.nonzero(any_nz & (last < rounds))[0]
    if bad.size:
      i = int(bad[0])
      raise MMCCError(
          f"C ({m} x {n}) is not lower triangular in release order: row {i} ends at "
          f"column {int(last[i])} but an earlier row already ends at column {int(rounds[i])}. "
          "Rows of a non-square C must be sorted by release round (last non-zero column)")
  return rounds


def check_encoder(c, non_adaptive: bool = False) -> np.ndarray:
  """Validates C (2-D, finite, m ≥ n, non-negative unless non-adaptive); returns float64 |C|
  (for a lower-triangular Toeplitz view, ``toeplitz_view``, checked on its first column and
  returned as the view of |column|)."""
  c = np.asarray(c, dtype=np.float64) if not isinstance(c, np.ndarray) else c
  column = toeplitz_view.column_of(c)
  if column is None:
    if c.ndim != 2:
      raise MMCCError(f"C must be a 2-D matrix, got shape {np.shape(c)}")
    m, n = c.shape
    if n < 1 or m < n:
      raise MMCCError(
          f"C must be m x n with m >= n >= 1 (one column per round, at least one row per "
          f"round), got shape {c.shape}")
    c = c.astype(np.float64, copy=False)
  values = c if column is None else column  # T(column) holds column's numbers and zeros
  if not np.all(np.isfinite(values)):
    raise MMCCError("C has non-finite (NaN or inf) entries")
  if np.any(values < 0):
    if not non_adaptive:
      i, j = np.argwhere(c < 0)[0] if column is None else (int(np.argmax(column < 0)), 0)
      raise MMCCError(
          f"C has negative entries (C[{i}, {j}] = {c[i, j]:g}); MMCC's adaptive analysis "
          "(Lemma C.3) needs non-negative C. Pass non_adaptive=True (--non-adaptive) if the "
          "data are fixed in advance; |C| is then used")
    values = np.abs(values)
  if not np.any(values > 0):
    raise MMCCError("C is all zeros")
  return values if column is None else toeplitz_view.view(values)


class _TooWide(Exception):
  """A row's privacy-loss range needs more than MAX_ROW_POINTS points on the current grid."""

  def __init__(self, width: float):
    super().__init__(width)
    self.width = width


# ---------------------------------------------------------------------------
# Row mixtures.


@dataclasses.dataclass
class RowMixture:
  """PMoG of one row (or one block of rows): integer grid sensitivities and their p̃."""
  units: np.ndarray  # int64, C_ij rounded up to multiples of grid_step, in grid units
  probs: np.ndarray  # float64, p̃_ij rounded up to multiples of PROBABILITY_QUANTUM
  # Where the components sit (not part of ``key``): the block's index among its offset's
  # row blocks and the kept-column index j of each component (``dominates``).
  block: int = -1
  columns: Optional[np.ndarray] = None
  # The sensitivities C_ij before rounding to the grid (``merge_small``); None: unknown.
  values: Optional[np.ndarray] = None

  def key(self) -> bytes:
    order = np.lexsort((self.probs, self.units))
    return self.units[order].tobytes() + b"|" + self.probs[order].tobytes()


def round_up_to_grid(values: np.ndarray, step: float) -> np.ndarray:
  """Smallest integers k with k·step ≥ value (exact check, never rounds down)."""
  k = np.ceil(values / step).astype(np.int64)
  k = np.where(k * step < values, k + 1, k)
  return np.maximum(k, 1)


def round_up_probability(p: np.ndarray) -> np.ndarray:
  q = np.ceil(np.asarray(p, dtype=np.float64) / PROBABILITY_QUANTUM) * PROBABILITY_QUANTUM
  return np.minimum(q, 1.0)


def merge_small(mix: RowMixture, grid_step: float) -> RowMixture:
  """The row with its entries below one grid step Δ2 merged into groups worth at most Δ2.

  Rounding every C_ij < Δ2 up to Δ2 (App F.2) counts each tiny entry as a full step, so a
  row with many tiny entries (the far lags of a Toeplitz C) carries a large spurious
  sensitivity, and one distinct row PLD per row length. Here the entries below Δ2, in
  ascending order, are cut into consecutive groups G of sum ≤ Δ2, and G becomes one
  component of one grid unit with probability 1 − Π_{j∈G}(1 − p̃_j). Coupling the
  Bernoullis, Σ_{j∈G} C_ij·Bern(p̃_j) ≤ Δ2·1{some j ∈ G joins} ≤ Σ_{j∈G} Δ2·Bern(p̃_j)
  pointwise, so the merged PMoG dominates the row's PMoG and is dominated by the
  unmerged rounding (Choquette-Choo et al. 2024, arXiv:2310.15526, Cor B.3): ε is an
  upper bound and, but for the group probability's rounding up (float slack of 1e-12
  relative, then a 2⁻⁴⁰ quantum), never above the unmerged one. A row without two such
  entries is returned unchanged.
  """
  if mix.values is None:
    return mix
  small = np.nonzero(mix.values < grid_step)[0]
  if small.size < 2:
    return mix
  small = small[np.argsort(mix.values[small], kind="stable")]
  cum = np.cumsum(mix.values[small])
  limit = grid_step * (1.0 - 1e-12)  # float slack on the group sums
  units, probs = [], []
  start = 0
  while start < small.size:
    base = cum[start - 1] if start else 0.0
    stop = max(start + 1, int(np.searchsorted(cum, base + limit, side="right")))
    group = small[start:stop]
    if group.size == 1:
      p = float(mix.probs[group[0]])
    else:
      p = -math.expm1(float(np.sum(np.log1p(-np.minimum(mix.probs[group], 1.0)))))
      p = float(round_up_probability(np.array([min(1.0, p * (1.0 + 1e-12))]))[0])
    units.append(1)
    probs.append(p)
    start = stop
  keep = np.ones(mix.units.size, dtype=bool)
  keep[small] = False
  return RowMixture(units=np.concatenate([mix.units[keep], np.array(units, dtype=np.int64)]),
                    probs=np.concatenate([mix.probs[keep], np.array(probs)]), block=mix.block)


def sensitivity_pmf(units: np.ndarray, probs: np.ndarray,
                    tail_mass: float) -> Tuple[np.ndarray, np.ndarray]:
  """PMF of Σ_j units_j·Bern(probs_j) (App F.2), tail moved up pessimistically.

  Convolves the two-point PMFs one entry at a time. When ``tail_mass`` > 0,
  upper-tail mass (at most tail_mass in total) is cut off as it appears and
  placed on the largest possible value Σ_j units_j: a stochastically larger
  sensitivity, so a dominating PMoG (Cor B.3). Returns (values, probabilities)
  with zero-probability values dropped.
  """
  order = np.argsort(units, kind="stable")
  units = units[order]
  probs = probs[order]
  total = int(np.sum(units))
  pmf = np.ones(1)
  moved = 0.0
  budget = tail_mass / max(1, len(units))
  for k, p in zip(units.tolist(), probs.tolist()):
    if p >= 1.0:
      pmf = np.concatenate([np.zeros(k), pmf])
      continue
    new = np.zeros(pmf.size + k)
    new[:pmf.size] = pmf * (1.0 - p)
    new[k:] += pmf * p
    pmf = new
    if budget > 0.0:
      suffix = np.cumsum(pmf[::-1])[::-1]  # suffix[i] = mass at >= i
      cut = int(np.searchsorted(-suffix, -budget, side="left"))
      # smallest index whose suffix mass is <= budget
      if cut < pmf.size:
        moved += float(suffix[cut])
        pmf = pmf[:cut]
  values = np.nonzero(pmf)[0]
  masses = pmf[values]
  if moved > 0.0:
    if values.size and values[-1] == total:
      masses[-1] += moved
    else:
      values = np.append(values, total)
      masses = np.append(masses, moved)
  return values.astype(np.int64), masses


# ---------------------------------------------------------------------------
# PLD of a mixture of Gaussians (vectorized inverse privacy loss).


def _fast_mog_class():
  from dp_accounting.pld import privacy_loss_mechanism as plm  # pylint: disable=g-import-not-at-top

  class FastMixtureGaussianPrivacyLoss(plm.MixtureGaussianPrivacyLoss):
    """dp_accounting's MoG privacy loss with a vectorized inverse (App F.1).

    dp_accounting bisects recursively with one scalar privacy-loss call per
    node; here every loss value is bisected at once. Same output convention:
    the smallest multiple of ``precision`` whose loss is at most ℓ, which
    over-estimates x and hence ε (App F.1).
    """

    inverse_precision = DEFAULT_INVERSE_PRECISION

    def __init__(self, *args, **kwargs):
      super().__init__(*args, **kwargs)
      if np.all(self.sensitivities > 0):
        # No mass at sensitivity 0: the envelope's sampling probability is exactly 1, not
        # the float sum of the weights (1 − 1 ulp makes dp_accounting's inversion fail).
        self._sampling_prob = 1.0

    def privacy_loss_tail(self, precision: float = 1e-4):
      """dp_accounting's tail, also when its REMOVE-side search finds no point
      (``_remove_side_tail``)."""
      if self.adjacency_type != plm.AdjacencyType.REMOVE or not self._pessimistic_estimate:
        return super().privacy_loss_tail(precision)
      return _remove_side_tail(self, precision)

    def _loss_and_slope(self, x):
      """Privacy loss at x and its derivative in x (vectorized over x, chunked)."""
      x = np.asarray(x, dtype=np.float64)
      chunk = max(1, (1 << 21) // max(1, self.sensitivities.size))
      if x.size > chunk:
        parts = [self._loss_and_slope(x[i:i + chunk]) for i in range(0, x.size, chunk)]
        return (np.concatenate([a for a, _ in parts]), np.concatenate([b for _, b in parts]))
      sens = self.sensitivities
      const = self._precompute_privacy_loss_constants
      sign = 1.0 if self.adjacency_type == plm.AdjacencyType.ADD else -1.0
      a = const[None, :] + sign * np.multiply.outer(x, sens) / self._variance
      amax = np.max(a, axis=1, keepdims=True)
      e = np.exp(a - amax)
      total = np.sum(e, axis=1)
      lse = amax[:, 0] + np.log(total)
      dlse = sign * (e @ sens) / total / self._variance
      if sign > 0:  # ADD: loss = −logsumexp(const + s·x/σ²)
        return -lse, -dlse
      return lse, dlse

    def inverse_privacy_losses(self, privacy_losses, precision=None):
      return super().inverse_privacy_losses(
          privacy_losses, self.inverse_precision if precision is None else precision)

    def _inverse_privacy_losses_with_range(self, privacy_losses, bounds, precision=1e-6):
      """Smallest multiple x of ``precision`` in ``bounds`` with loss(x) ≤ ℓ, for every ℓ."""
      return _inverse_losses(self._loss_and_slope, privacy_losses, bounds, precision)

  return FastMixtureGaussianPrivacyLoss


def _remove_side_tail(loss, precision: float):
  """The REMOVE-side tail of a pessimistic MoG privacy loss, valid where dp_accounting's fails.

  dp_accounting bisects [t − max s, t] (t the noise quantile at half the truncated mass)
  for the left truncation point and fails when the cdf at t − max s already exceeds that
  mass, which happens by one ulp when a component at max s carries almost all weight
  (p̃ ≈ 1 at small σ). Then t − max s itself is used: the mass left of it is counted as
  infinite loss (pessimistic), so any left truncation point is valid.
  """
  from dp_accounting.pld import common  # pylint: disable=g-import-not-at-top
  from dp_accounting.pld import privacy_loss_mechanism as plm  # pylint: disable=g-import-not-at-top
  # pylint: disable=protected-access
  tail_mass = 0.5 * np.exp(loss._log_mass_truncation_bound)
  z_value = loss._gaussian_random_variable.ppf(tail_mass)
  lower = common.inverse_monotone_function(
      loss.mu_upper_cdf, tail_mass,
      common.BinarySearchParameters(z_value - loss._max_sens, z_value, tolerance=precision),
      increasing=True)
  if lower is None:
    lower = z_value - loss._max_sens
  # pylint: enable=protected-access
  upper = -z_value
  return plm.TailPrivacyLossDistribution(
      lower, upper, {math.inf: loss.mu_upper_cdf(lower),
                     loss.privacy_loss(upper): 1 - loss.mu_upper_cdf(upper)})


def _inverse_losses(loss_and_slope, privacy_losses, bounds, precision: float) -> np.ndarray:
  """Smallest multiple x of ``precision`` in ``bounds`` with loss(x) ≤ ℓ, for every ℓ.

  Brackets each ℓ on a table of the (non-increasing) loss, then refines with
  safeguarded Newton steps to near machine precision, rounds up to the precision
  grid and steps up until loss(x) ≤ ℓ holds exactly.
  """
  target = np.asarray(privacy_losses, dtype=np.float64)
  if target.size == 0:
    return target
  lo_b, hi_b = float(bounds[0]), float(bounds[1])
  grid = np.linspace(lo_b, hi_b, 4097)
  table = np.concatenate([loss_and_slope(grid[i:i + 8192])[0]
                          for i in range(0, grid.size, 8192)])
  # table is non-increasing; bracket index k with table[k] > ℓ >= table[k+1].
  k = np.searchsorted(-table, -target, side="left") - 1
  k = np.clip(k, 0, grid.size - 2)
  x, lo, hi = _refine_inverse(loss_and_slope, target, grid[k], grid[k + 1], precision)
  out = np.ceil(np.maximum(x, lo) / precision) * precision
  bad = np.nonzero(loss_and_slope(out)[0] > target)[0]
  for _ in range(64):
    if bad.size == 0:
      break
    out[bad] += precision
    bad = bad[loss_and_slope(out[bad])[0] > target[bad]]
  if bad.size:
    # Rounding noise on a flat stretch of the loss: the bracket's upper end had loss
    # ≤ ℓ when evaluated, so (monotone loss) its grid point upward is the inverse.
    out[bad] = np.maximum(out[bad], np.ceil(hi[bad] / precision) * precision)
  return out


def _refine_inverse(loss_and_slope, target, lo, hi, precision: float):
  """(x, lo, hi): safeguarded Newton steps for loss(x) = ℓ inside brackets [lo, hi] with
  loss(lo) > ℓ ≥ loss(hi), to a bracket or step of 0.01·``precision``."""
  x = 0.5 * (lo + hi)
  for _ in range(80):
    loss, slope = loss_and_slope(x)
    above = loss > target
    lo = np.where(above, x, lo)
    hi = np.where(above, hi, x)
    with np.errstate(divide="ignore", invalid="ignore"):
      newton = x - (loss - target) / slope
    ok = np.isfinite(newton)
    converged = ok & (np.abs(newton - x) <= 0.01 * precision)
    inside = ok & (newton >= lo) & (newton <= hi)
    x = np.where(inside, newton, 0.5 * (lo + hi))
    done = converged | (hi - lo <= 0.01 * precision)
    if np.all(done):
      return x, lo, hi
  # Newton stalled somewhere (kinks where mixture components trade dominance):
  # plain bisection there until the bracket is tight; hi keeps loss ≤ ℓ.
  idx = np.nonzero(~done)[0]
  for _ in range(200):
    idx = idx[hi[idx] - lo[idx] > 0.01 * precision]
    if idx.size == 0:
      break
    mid = 0.5 * (lo[idx] + hi[idx])
    above = loss_and_slope(mid)[0] > target[idx]
    lo[idx] = np.where(above, mid, lo[idx])
    hi[idx] = np.where(above, hi[idx], mid)
  return np.where(done, x, hi), lo, hi


def mixture_pld(sigma: float, sensitivities: np.ndarray, probs: np.ndarray,
                discretization: float = DEFAULT_PLD_DISCRETIZATION,
                fast_inverse: bool = True, max_points: Optional[int] = None,
                optimistic: bool = False):
  """PLD (add and remove adjacency) of M_MoG(probs, sensitivities) with noise std σ.

  ``fast_inverse=False`` uses dp_accounting's own MixtureGaussianPrivacyLoss
  (recursive scalar bisection), the baseline of the speed benchmark. With
  ``max_points``, raises _TooWide (before building anything) when the privacy-loss
  range (dp_accounting's connect-the-dots bounds) needs more grid points than that.
  ``optimistic``: rounded toward lower loss instead (``optimistic_pmf``, fast inverse
  only), a PLD whose ε is below the mixture's, for ``lower_bound_epsilon``.
  """
  from dp_accounting.pld import privacy_loss_distribution as pld_lib  # pylint: disable=g-import-not-at-top
  from dp_accounting.pld import privacy_loss_mechanism as plm  # pylint: disable=g-import-not-at-top
  cls = _fast_mog_class() if fast_inverse or optimistic else plm.MixtureGaussianPrivacyLoss

  def pmf(adjacency):
    loss = cls(sigma, sensitivities, probs, pessimistic_estimate=not optimistic,
               adjacency_type=adjacency)
    if max_points is not None:
      bounds = loss.connect_dots_bounds()
      width = float(bounds.epsilon_upper) - float(bounds.epsilon_lower)
      if not math.isfinite(width):
        raise MMCCNumericError(f"a row's privacy loss at noise multiplier {sigma:g} exceeds "
                               "the floating-point range")
      if width > max_points * discretization:
        raise _TooWide(width)
    if optimistic:
      return optimistic_pmf(loss, discretization)
    return pld_lib._create_pld_pmf_from_monotone_privacy_loss(  # pylint: disable=protected-access
        loss, pessimistic_estimate=True, value_discretization_interval=discretization,
        use_connect_dots=True)

  return pld_lib.PrivacyLossDistribution(
      pmf(plm.AdjacencyType.REMOVE), pmf(plm.AdjacencyType.ADD))


def coarsen_support(values: np.ndarray, masses: np.ndarray, max_components: int,
                    down: bool = False) -> Tuple[np.ndarray, np.ndarray]:
  """Rounds support points UP to multiples of 2^k (smallest k giving ≤ max_components).

  Moving mass to larger sensitivities gives a dominating mixture (Cor B.3), so
  this only over-estimates ε; it bounds the cost of each privacy-loss
  evaluation (linear in the number of components, App F.1). ``down``: rounds DOWN
  instead (a dominated mixture, for ``lower_bound_epsilon``).
  """
  factor = 1
  while True:
    coarse = (values // factor if down else -(-values // factor)) * factor
    distinct = np.unique(coarse)
    if distinct.size <= max_components:
      break
    factor *= 2
  if factor == 1:
    return values, masses
  idx = np.searchsorted(distinct, coarse)
  return distinct, np.bincount(idx, weights=masses, minlength=distinct.size)


def _row_pld_task(args):
  """Worker: PLD of one distinct row mixture, self-composed ``count`` times.

  Returns None for a row that releases nothing about the example, or the float
  width of its privacy-loss range when that needs more than ``max_points`` points
  on the grid given (nothing is built then).
  """
  (units, probs, count, grid_step, sigma, discretization, tail_mass, fast_inverse,
   max_components) = args[:9]
  max_points = args[9] if len(args) > 9 else None
  values, masses = sensitivity_pmf(units, probs, tail_mass)
  values, masses = coarsen_support(values, masses, max_components)
  positive = values > 0
  if not np.any(positive):
    return None
  masses = masses / np.sum(masses)
  if values[0] == 0 and values.size > 1 and masses[0] < MIN_ZERO_MASS:
    # dp_accounting inverts the mixture's loss through its sampled-Gaussian envelope at
    # sampling probability 1 − (mass at 0), which fails in floating point when that mass
    # is tiny; the mass moves up to the smallest positive sensitivity (Cor B.3: a
    # stochastically larger sensitivity, so the PLD still dominates).
    zero_mass = masses[0]
    masses = masses[1:].copy()
    masses[0] += zero_mass
    values = values[1:]
  try:
    pld = mixture_pld(sigma, values * grid_step, masses, discretization, fast_inverse,
                      max_points)
  except _TooWide as e:
    return e.width
  if count > 1:
    pld = pld.self_compose(count)
  return pld


# ---------------------------------------------------------------------------
# ProbabilityTailBounds (Fig 5 / Fig 7) and the row mixtures.


def _binomial_tail_counts(counts: np.ndarray, q: float, delta_prime: float,
                          cache: Dict[int, int]) -> np.ndarray:
  """Smallest t with Pr[Binom(K, q) > t] ≤ δ' for each K in ``counts`` (exact tail, F.3)."""
  out = np.empty(counts.shape, dtype=np.int64)
  for idx, k in enumerate(counts.tolist()):
    t = cache.get(k)
    if t is None:
      if q >= 1.0:
        t = k
      else:
        t = int(stats.binom.isf(delta_prime, k, q))
        t = min(max(t, 0), k)
        while t < k and stats.binom.sf(t, k, q) > delta_prime:
          t += 1
        while t > 0 and stats.binom.sf(t - 1, k, q) <= delta_prime:
          t -= 1
      cache[k] = t
    out[idx] = t
  return out


def _blocks(rounds: np.ndarray, min_sep: int, offset: int) -> List[np.ndarray]:
  """Consecutive row groups: single rows for b = 1, else rows released in b-round windows."""
  m = rounds.size
  if min_sep == 1:
    return [np.array([i]) for i in range(m)]
  ids = np.maximum(rounds - offset, 0) // min_sep
  splits = np.nonzero(np.diff(ids))[0] + 1
  return np.split(np.arange(m), splits)


def _block_sensitivities(rows: np.ndarray) -> np.ndarray:
  """‖C[block, j]‖₂ for every kept column j (App D's C^(b)), summed over the block's
  non-zero rows only, so that equal blocks give bit-identical values."""
  if rows.shape[0] == 1:
    return rows[0]
  rows = rows[np.any(rows != 0, axis=1)]
  return np.sqrt(np.sum(rows ** 2, axis=0))


def dominates(big: Sequence[RowMixture], small: Sequence[RowMixture]) -> bool:
  """True if every row block of ``small`` is dominated by the block of ``big`` with the
  same index, column by column: same kept column, sensitivity and p̃ at least as large.
  Where ``big`` keeps its sensitivities before rounding (``values``, which ``merge_small``
  may merge below one grid step), those must be at least ``small``'s too: equal rounded
  units alone would let a merged ``big`` fall below an unmerged ``small``.

  Then Σ_j units_j·Bern(p̃_j) of ``big`` is, block by block, stochastically at least that
  of ``small`` (couple the Bernoullis), so its PMoG dominates (Choquette-Choo et al. 2024,
  arXiv:2310.15526, Cor B.3), and so does the composition over blocks: the ε that MMCC
  computes for ``big`` bounds that of ``small``. (Used across the residue classes of
  b-min-sep sampling, App D: for a Toeplitz C, class o is class 0 truncated at the end.)
  """
  by_block = {m.block: m for m in big}
  for mix in small:
    ref = by_block.get(mix.block)
    if ref is None or mix.columns is None or ref.columns is None:
      return False
    idx = np.searchsorted(ref.columns, mix.columns)
    if np.any(idx >= ref.columns.size):
      return False
    if not (np.array_equal(ref.columns[idx], mix.columns)
            and np.all(ref.units[idx] >= mix.units) and np.all(ref.probs[idx] >= mix.probs)):
      return False
    if ref.values is not None and (mix.values is None
                                   or not np.all(ref.values[idx] >= mix.values)):
      return False
  return True


def toeplitz_coefficients(c: np.ndarray) -> Optional[np.ndarray]:
  """(c_0, …, c_{n−1}) if C is square, lower-triangular Toeplitz (C_ij = c_{i−j}, exactly)
  with c_0 > 0; else None."""
  m, n = c.shape
  if m != n or not c[0, 0] > 0:
    return None
  coef = np.ascontiguousarray(c[:, 0])
  lag = np.subtract.outer(np.arange(n), np.arange(n))
  expected = np.where(lag >= 0, coef[np.maximum(lag, 0)], 0.0)
  return coef if np.array_equal(c, expected) else None


def _toeplitz_gram(coef: np.ndarray) -> np.ndarray:
  """H[d, e] = Σ_{s=1}^{min(d,e)} c_{d−s} c_{e−s}: the Gram entry of columns i − d and i − e
  over rows 0..i−1 of a lower-triangular Toeplitz C, the same for every row i.

  Summed along each diagonal oldest row first, the order in which ``row_mixtures`` adds
  the rows into its Gram matrix, so the entries are bit-identical to it.
  """
  n = coef.size
  h = np.zeros((n, n))
  for off in range(n - 1):
    vals = np.cumsum(coef[:n - 1 - off] * coef[off:n - 1])
    idx = np.arange(1, n - off)
    h[idx, idx + off] = vals
    h[idx + off, idx] = vals
  return h


def _toeplitz_row_mixtures(coef: np.ndarray, q: float, sigma: float, delta_tail: float,
                           grid_step: float, progress: bool = False
                           ) -> Tuple[List[RowMixture], dict]:
  """``row_mixtures`` for b = 1 and a lower-triangular Toeplitz C, bit-identical, in
  O(n²·T) time instead of O(n³ log n) (T the largest tail count t).

  Row i's Gram row for column j = i − d over rows < i is (H[d, e])_{e=1..i}
  (``_toeplitz_gram``): the same sequence for every row, truncated at i. So each lag d
  keeps the T largest entries of its growing prefix, sorted; the sum of the t largest
  (Fig 5's s_ij, F.3) is read off without sorting the Gram matrix row by row.
  """
  n = coef.size
  positive_lags = np.cumsum(coef[1:] > 0)  # lags 1..i with c_d > 0, for i = 1..n−1
  nontrivial_total = int(np.sum(positive_lags))
  delta_prime = delta_tail / (2.0 * nontrivial_total) if nontrivial_total else 1.0
  z_tail = float(stats.norm.isf(delta_prime)) if nontrivial_total else 0.0
  tail_cache: Dict[int, int] = {}
  width = max(1, int(_binomial_tail_counts(np.array([n]), q, delta_prime, tail_cache)[0]))
  h = _toeplitz_gram(coef)
  top = np.zeros((n, width))  # top[d]: the largest H[d, e] over e <= i, descending
  count = np.zeros(n, dtype=np.int64)  # positive H[d, e] over e <= i
  slots = np.arange(width)
  q_quant = float(round_up_probability(np.array([q]))[0])
  log_odds = math.log(q) - math.log1p(-q)
  mixtures: List[RowMixture] = []
  max_ratio = 1.0
  rows = range(n)
  if progress:
    from tqdm import tqdm  # pylint: disable=g-import-not-at-top
    rows = tqdm(rows, desc="tail bounds (Toeplitz)", file=sys.stderr, leave=False)
  for i in rows:
    if i > 0:  # column i − i = 0 (lag e = i) enters every lag's prefix
      v = h[:, i]
      count += v > 0
      upd = np.nonzero(v > top[:, -1])[0]  # the others keep their T largest
      if upd.size:
        sub, new = top[upd], v[upd, None]
        pos = np.count_nonzero(sub >= new, axis=1)[:, None]
        shifted = np.concatenate([sub[:, :1], sub[:, :-1]], axis=1)
        top[upd] = np.where(slots < pos, sub, np.where(slots == pos, new, shifted))
    lags = np.nonzero(coef[:i + 1] > 0)[0][::-1]  # columns j = i − d, ascending
    probs = np.full(lags.size, q_quant)
    hard = np.nonzero(lags > 0)[0]
    if hard.size:
      d = lags[hard]
      t = _binomial_tail_counts(count[d], q, delta_prime, tail_cache)
      if int(np.max(t)) > width:
        raise AssertionError("tail count above the kept width")  # t is monotone in K <= n
      csum = np.concatenate([np.zeros((d.size, 1)), np.cumsum(top[d, :int(np.max(t))], axis=1)],
                            axis=1)
      s_ij = csum[np.arange(d.size), t]
      norm_sq = h[d, d]
      eps_ij = z_tail * np.sqrt(norm_sq) / sigma + (2.0 * s_ij - norm_sq) / (2.0 * sigma ** 2)
      probs[hard] = round_up_probability(special.expit(eps_ij + log_odds))
      max_ratio = max(max_ratio, float(np.max(probs) / q))
    values = coef[lags]
    mixtures.append(RowMixture(units=round_up_to_grid(values, grid_step), probs=probs,
                               block=i, columns=(i - lags).astype(np.int64), values=values))
  info = {"nontrivial_pairs": nontrivial_total, "delta_prime": delta_prime,
          "max_prob_ratio": max_ratio, "blocks": n}
  return mixtures, info


def _tail_quantile(ck: np.ndarray, blocks: Sequence[np.ndarray], block_sens: Sequence,
                   q: float, delta_tail: float) -> Tuple[np.ndarray, int, float, float]:
  """(each kept column's first non-zero row (its row count where it has none), N, δ′, z′):
  δ′ = δ1/(2·N), N the non-trivial (block, column) pairs, those with a positive
  sensitivity in a block after the column's first non-zero row (the union bound over
  exactly the bad events used, App D), and z′ the standard normal's upper δ′ quantile. At
  q = 1 every p̃ is 1: no tail bound (N = 0, δ′ = 1, z′ = 0)."""
  nz = ck != 0
  first_row = np.where(nz.any(axis=0), np.argmax(nz, axis=0), ck.shape[0])
  pairs = 0
  if q < 1.0:
    for rows, sens in zip(blocks, block_sens):
      pairs += int(np.count_nonzero((sens > 0) & (first_row < rows[0])))
  delta_prime = delta_tail / (2.0 * pairs) if pairs else 1.0
  return first_row, pairs, delta_prime, float(stats.norm.isf(delta_prime)) if pairs else 0.0


def row_mixtures(c: np.ndarray, rounds: np.ndarray, sampling_prob: float, sigma: float,
                 delta_tail: float, min_sep: int = 1, offset: int = 0,
                 grid_step: float = 1.0, progress: bool = False, toeplitz: bool = True
                 ) -> Tuple[List[RowMixture], dict]:
  """p̃ by (Generalized)ProbabilityTailBounds and the PMoG of every row block.

  Fig 5 (b = 1) and Figs 6-7 (b-min-sep, examples of the residue class
  ``offset``): keep columns offset, offset + b, ...; sampling probability q =
  b·p; block sensitivities C^(b)_ij = ‖C[block i, j]‖₂; p̃ for block i is the
  tail bound at the block's first row. δ' = δ1 / (2·N), N the number of
  non-trivial (block, column) pairs actually used (a union bound over exactly
  the bad events used, App D). ``toeplitz``: ``_toeplitz_row_mixtures`` where it applies.
  """
  q = min_sep * sampling_prob
  coef = toeplitz_coefficients(c) if (toeplitz and min_sep == 1 and q < 1.0) else None
  if coef is not None:  # b = 1, lower-triangular Toeplitz C: the same mixtures, faster
    return _toeplitz_row_mixtures(coef, q, sigma, delta_tail, grid_step, progress)
  cols = np.arange(offset, c.shape[1], min_sep)
  ck = c[:, cols]
  nk = ck.shape[1]
  blocks = _blocks(rounds, min_sep, offset)
  block_sens = [_block_sensitivities(ck[b]) for b in blocks]
  first_row, nontrivial_total, delta_prime, z_tail = _tail_quantile(ck, blocks, block_sens, q,
                                                                    delta_tail)

  gram = np.zeros((nk, nk))
  active_end = 0  # columns >= active_end have not appeared yet
  tail_cache: Dict[int, int] = {}
  mixtures: List[RowMixture] = []
  max_ratio = 1.0
  q_quant = float(round_up_probability(np.array([q]))[0])
  iterator = zip(blocks, block_sens)
  if progress:
    from tqdm import tqdm  # pylint: disable=g-import-not-at-top
    iterator = tqdm(iterator, total=len(blocks), desc=f"tail bounds (offset {offset})",
                    file=sys.stderr, leave=False)
  for block_index, (b, s) in enumerate(iterator):
    support = np.nonzero(s > 0)[0]
    if support.size:
      probs = np.full(support.size, q_quant)
      trivial = (first_row[support] >= b[0]) | (q >= 1.0)
      hard = support[~trivial]
      if hard.size:
        rows_g = gram[hard, :active_end]
        counts = np.count_nonzero(rows_g > 0, axis=1)
        t = _binomial_tail_counts(counts, q, delta_prime, tail_cache)
        sorted_desc = -np.sort(-rows_g, axis=1)
        csum = np.concatenate([np.zeros((hard.size, 1)), np.cumsum(sorted_desc, axis=1)], axis=1)
        s_ij = csum[np.arange(hard.size), t]
        norm_sq = gram[hard, hard]
        eps_ij = z_tail * np.sqrt(norm_sq) / sigma + (2.0 * s_ij - norm_sq) / (2.0 * sigma ** 2)
        if q >= 1.0:
          p_tilde = np.ones(hard.size)
        else:
          # p̃ = q e^ε / (q e^ε + 1 − q), computed stably.
          p_tilde = special.expit(eps_ij + math.log(q) - math.log1p(-q))
        probs[~trivial] = round_up_probability(p_tilde)
        max_ratio = max(max_ratio, float(np.max(probs) / q))
      units = round_up_to_grid(s[support], grid_step)
      mixtures.append(RowMixture(units=units, probs=probs, block=block_index,
                                 columns=support.astype(np.int64), values=s[support]))
    # The block's rows enter the Gram matrix at once (only its non-zero rows and columns,
    # so equal blocks of shifted offsets give bit-identical sums).
    rows_b = ck[b]
    rows_b = rows_b[np.any(rows_b != 0, axis=1)]
    if rows_b.size:
      nz_cols = np.nonzero(np.any(rows_b != 0, axis=0))[0]
      v = rows_b[:, nz_cols]
      gram[np.ix_(nz_cols, nz_cols)] += v.T @ v
      active_end = max(active_end, int(nz_cols[-1]) + 1)
  info = {"nontrivial_pairs": nontrivial_total, "delta_prime": delta_prime,
          "max_prob_ratio": max_ratio, "blocks": len(blocks)}
  return mixtures, info


# ---------------------------------------------------------------------------
# MMCC.


@dataclasses.dataclass
class MMCCResult:
  epsilon: float
  delta: float
  delta_tail: float  # δ1, for ProbabilityTailBounds
  delta_pld: float  # δ2, for the composed PLD
  sampling_prob: float
  noise_multiplier: float
  min_sep: int
  n: int
  m: int
  distinct_rows: int
  row_blocks: int
  grid_step: float
  sensitivity: float  # γ(C) of the matrix as given
  # ε of the same C under SINGLE participation without sampling (Denisov Thm 4.1; exact
  # Gaussian at σ/γ(C)): the reference of MMCC Fig 2, NOT a bound for the sampled run (an
  # example may join many rounds); tff_mf.accounting.epsilon_for reports the valid one.
  unamplified_epsilon: float
  max_prob_ratio: float  # max p̃/p: MMCC's ε is at most ~ this factor from tight (Sec 4)
  seconds: float
  offsets: int
  pld_discretization: float = DEFAULT_PLD_DISCRETIZATION  # grid step used (coarsened at tiny σ)
  # Residue classes whose PLDs were composed: the others are dominated by one of these
  # (``dominates``; a Toeplitz C needs only class 0).
  composed_offsets: int = 1

  def as_dict(self) -> dict:
    out = dataclasses.asdict(self)
    out["accountant"] = "mmcc"
    return out


def _compose_all(plds: Sequence):
  """Composes a list of PLDs pairwise (balanced, so sizes grow evenly)."""
  items = [p for p in plds if p is not None]
  if not items:
    return None
  while len(items) > 1:
    nxt = []
    for i in range(0, len(items) - 1, 2):
      nxt.append(items[i].compose(items[i + 1]))
    if len(items) % 2:
      nxt.append(items[-1])
    items = nxt
  return items[0]


def _run_jobs(jobs, workers: int, progress: bool) -> dict:
  """Runs _row_pld_task on every job (in ``workers`` processes); {key: result}."""
  results = {}
  bar = None
  if progress:
    from tqdm import tqdm  # pylint: disable=g-import-not-at-top
    bar = tqdm(total=len(jobs), desc="row PLDs", file=sys.stderr, leave=False)
  try:
    if workers == 1 or len(jobs) == 1:
      for key, args in jobs:
        results[key] = _row_pld_task(args)
        if bar is not None:
          bar.update(1)
    else:
      ctx = multiprocessing.get_context("fork") if sys.platform.startswith("linux") else None
      with concurrent.futures.ProcessPoolExecutor(max_workers=int(workers),
                                                  mp_context=ctx) as pool:
        futures = {pool.submit(_row_pld_task, args): key for key, args in jobs}
        try:
          for fut in concurrent.futures.as_completed(futures):
            results[futures[fut]] = fut.result()
            if bar is not None:
              bar.update(1)
        except KeyboardInterrupt:  # Ctrl-C: stop the workers now rather than at their task's end
          for process in list((getattr(pool, "_processes", None) or {}).values()):
            process.terminate()
          pool.shutdown(wait=False, cancel_futures=True)
          raise
  finally:  # also on Ctrl-C: the bar clears its line
    if bar is not None:
      bar.close()
  return results


def mmcc(c, sampling_prob: float, noise_multiplier: float, delta: float, *,
         min_sep: int = 1, delta_split: float = 0.5, non_adaptive: bool = False,
         grid_step: Optional[float] = None,
         grid_resolution: int = DEFAULT_GRID_RESOLUTION,
         pld_discretization: float = DEFAULT_PLD_DISCRETIZATION,
         mixture_tail_mass: float = DEFAULT_MIXTURE_TAIL_MASS,
         all_offsets: bool = True, dedupe: bool = True,
         max_components: int = DEFAULT_MAX_COMPONENTS,
         workers: int = DEFAULT_WORKERS, fast_inverse: bool = True,
         prune_offsets: bool = True, merge_small_entries: bool = True,
         toeplitz_tail_bounds: bool = True, progress: bool = False) -> MMCCResult:
  """MMCC(C, p, σ, δ1, δ2) (Fig 1), or Generalized-MMCC (Fig 6) when min_sep b > 1.

  Args:
    c: encoder C (m x n, m ≥ n), lower triangular / rows in release order,
      non-negative (unless ``non_adaptive``). Used as given (not normalized).
    sampling_prob: p, each example's per-round participation probability. For
      b-min-sep sampling an example joins each of its rounds with prob b·p.
    noise_multiplier: σ, noise std in units of the clip norm.
    delta: δ = δ1 + δ2; δ1 = delta_split·δ goes to the tail bounds. When no
      tail bound is needed (e.g. C = I) all of δ goes to the PLD.
    min_sep: b of b-min-sep sampling (App D); 1 is i.i.d. sampling.
    grid_step: Δ2 (App F.2); default max|C| / grid_resolution.
    pld_discretization: privacy-loss grid of the PLDs.
    mixture_tail_mass: upper-tail mass of each row's sensitivity PMF moved up
      to the row's maximum (pessimistic).
    all_offsets: for b > 1, analyze every residue class of examples and report
      the worst (App D); False analyzes only D1 (worst for Toeplitz C).
    dedupe: compute each distinct row PLD once (F.4).
    max_components: at most this many mixture components per row; support
      points are rounded up to a coarser grid beyond that (pessimistic).
    workers: processes computing distinct row PLDs in parallel (F.4).
    fast_inverse: vectorized inverse privacy loss (False: dp_accounting's own).
    prune_offsets: compose only the residue classes not dominated by another one
      (``dominates``; never raises ε). False composes every class (the reference the
      tests compare with).
    merge_small_entries: merge each row's entries below Δ2 into groups worth Δ2
      (``merge_small``; never raises ε). False rounds each one up to Δ2.
    toeplitz_tail_bounds: for b = 1 and a lower-triangular Toeplitz C, compute the tail
      bounds from the shared Gram sequence (``_toeplitz_row_mixtures``; bit-identical).
    progress: tqdm progress on stderr.

  Returns an MMCCResult; ``epsilon`` is an upper bound: every approximation
  over-estimates ε (see the module docstring).
  """
  start = time.time()
  c = check_encoder(c, non_adaptive=non_adaptive)
  p = check_sampling_prob(sampling_prob)
  sigma = checks.noise_multiplier(noise_multiplier)
  delta = checks.delta(delta)
  m, n = c.shape
  min_sep, pld_discretization = _check_options(
      n, p, delta_split, min_sep, max_components, workers, pld_discretization, mixture_tail_mass)
  rounds = release_rounds(c, non_adaptive=non_adaptive)
  grid_step = _grid_step(c, grid_step, grid_resolution)
  offsets = list(range(min_sep)) if (min_sep > 1 and all_offsets) else [0]
  delta_tail = delta_split * delta
  per_offset, max_ratio, blocks_total, needs_tail = _offset_mixtures(
      c, rounds, p, sigma, delta_tail, min_sep, offsets, grid_step, progress, prune_offsets,
      toeplitz_tail_bounds)
  if not needs_tail:
    delta_tail = 0.0
  delta_pld = delta - delta_tail
  tasks, counts, multiplicity = _distinct_rows(per_offset, dedupe,
                                               grid_step if merge_small_entries else None)
  results, discretization = _row_plds(
      tasks, multiplicity, grid_step, sigma, float(pld_discretization), mixture_tail_mass,
      fast_inverse, max_components, workers, progress)
  eps = _worst_offset_epsilon(counts, results, multiplicity, delta_pld)
  gamma = checks.gamma(c)
  unamplified = gaussian.gaussian_epsilon_exact(sigma / gamma, delta)
  return MMCCResult(
      epsilon=eps, delta=delta, delta_tail=delta_tail, delta_pld=delta_pld,
      sampling_prob=p, noise_multiplier=sigma, min_sep=min_sep, n=n, m=m,
      distinct_rows=len(tasks), row_blocks=blocks_total, grid_step=float(grid_step),
      sensitivity=gamma, unamplified_epsilon=unamplified, max_prob_ratio=max_ratio,
      seconds=time.time() - start, offsets=len(offsets), pld_discretization=discretization,
      composed_offsets=len(per_offset))


def _check_options(n: int, p: float, delta_split, min_sep, max_components, workers,
                   pld_discretization, mixture_tail_mass) -> Tuple[int, float]:
  """Validates ``mmcc``'s options; (min_sep, pld_discretization) as int and float."""
  if not (0.0 < delta_split < 1.0):
    raise MMCCError(f"delta_split must be in (0, 1), got {delta_split}")
  if int(min_sep) != min_sep or not (1 <= min_sep <= n):
    raise MMCCError(f"min_sep must be an integer in [1, n={n}], got {min_sep}")
  min_sep = int(min_sep)
  if min_sep * p > 1.0 + 1e-12:
    raise MMCCError(
        f"b-min-sep sampling joins rounds with probability b·p = {min_sep * p:g} > 1; "
        f"need sampling_prob <= 1/min_sep = {1.0 / min_sep:g}")
  if int(max_components) != max_components or max_components < 2:
    raise MMCCError(f"max_components must be an integer >= 2, got {max_components}")
  if int(workers) != workers or workers < 1:
    raise MMCCError(f"workers must be a positive integer, got {workers}")
  try:
    pld_discretization = checks.positive_float(pld_discretization, "pld_discretization")
  except checks.CheckError as e:
    raise MMCCError(str(e)) from None
  if not (0.0 <= mixture_tail_mass < 1e-6):
    raise MMCCError(f"mixture_tail_mass must be in [0, 1e-6), got {mixture_tail_mass}")
  return min_sep, pld_discretization


def _grid_step(c: np.ndarray, grid_step: Optional[float], grid_resolution: int) -> float:
  """Δ2 of App F.2: ``grid_step``, or max|C| / ``grid_resolution`` (validated)."""
  if grid_step is None:
    if int(grid_resolution) != grid_resolution or grid_resolution < 1:
      raise MMCCError(f"grid_resolution must be a positive integer, got {grid_resolution}")
    column = toeplitz_view.column_of(c)  # T(column) also holds zeros above the diagonal
    largest = float(np.max(c)) if column is None else float(
        max(np.max(column), 0.0) if column.size > 1 else column[0])
    grid_step = largest / grid_resolution
  if not (grid_step > 0) or not math.isfinite(grid_step):
    raise MMCCError(f"grid_step must be positive, got {grid_step}")
  return grid_step


def _offset_mixtures(c, rounds, p, sigma, delta_tail, min_sep, offsets, grid_step, progress,
                     prune: bool = True, toeplitz: bool = True):
  """(per offset [(mixtures, info)], max p̃/p, total row blocks, needs a tail bound) over the
  residue classes, without the classes dominated by another one (``dominates``).

  A dominated class's ε is at most the dominating class's, so only the others are
  composed; for a Toeplitz C every class o > 0 is class 0 truncated at the end and is
  dropped, which removes the factor b from the cost of the PLDs.
  """
  if prune and len(offsets) > 1 and offsets[0] == 0 and toeplitz_view.column_of(c) is not None:
    return _toeplitz_class_zero(c, rounds, p, sigma, delta_tail, min_sep, offsets, grid_step,
                                progress, toeplitz)
  kept = []
  max_ratio = 1.0
  blocks_total = 0
  needs_tail = False
  iterator = offsets
  if progress and len(offsets) > 1:
    from tqdm import tqdm  # pylint: disable=g-import-not-at-top
    iterator = tqdm(offsets, desc="tail bounds (residue classes)", file=sys.stderr, leave=False)
  for offset in iterator:
    mixtures, info = row_mixtures(c, rounds, p, sigma, delta_tail, min_sep, offset,
                                  grid_step, progress and len(offsets) == 1, toeplitz)
    max_ratio = max(max_ratio, info["max_prob_ratio"])
    blocks_total += info["blocks"]
    needs_tail = needs_tail or bool(info["nontrivial_pairs"])
    if not (prune and any(dominates(other, mixtures) for other, _ in kept)):
      kept.append((mixtures, info))
  return kept, max_ratio, blocks_total, needs_tail


def _toeplitz_class_zero(c, rounds, p, sigma, delta_tail, min_sep, offsets, grid_step,
                         progress, toeplitz):
  """``_offset_mixtures`` for a lower-triangular Toeplitz view C (``toeplitz_view``): class 0
  alone, without computing the others, which it dominates (``dominates``).

  Class o keeps columns o, o + b, …; for a Toeplitz C its non-zero rows o + r hold the entries
  class 0's rows r hold, and its blocks ((row − o) // b) are class 0's shifted by o, so each
  block sensitivity is class 0's or, in the last block that the end of C truncates, at most
  it; its Gram sums over earlier blocks, and so its tail counts, are class 0's shifted; it has
  at most class 0's non-trivial pairs, so its δ' is at least class 0's and every p̃ at most
  class 0's (the tail bound falls as δ' grows). So class 0 dominates column by column, as
  ``dominates`` finds it for the dense C (the tests compare both). Its figures: blocks summed
  over every class (class o has ⌊(n − 1 − o)/b⌋ + 1), the largest p̃/p (class 0's).
  """
  mixtures, info = row_mixtures(c, rounds, p, sigma, delta_tail, min_sep, 0, grid_step,
                                progress, toeplitz)
  n = c.shape[1]
  blocks_total = int(sum((n - 1 - o) // min_sep + 1 for o in offsets if o < n))
  return ([(mixtures, info)], info["max_prob_ratio"], blocks_total,
          bool(info["nontrivial_pairs"]))


def _distinct_rows(per_offset, dedupe: bool, merge_step: Optional[float] = None):
  """(tasks, counts, multiplicity): the distinct row mixtures (F.4), how often each occurs
  per offset, and the self-composition each one's worker applies.

  A row that belongs to a single offset is self-composed by its count inside the worker;
  one shared between offsets is built once (multiplicity 1) and composed per offset.
  With ``merge_step`` Δ2, each row's entries below Δ2 are merged first (``merge_small``).
  """
  tasks: Dict[bytes, RowMixture] = {}
  counts: List[collections.Counter] = []
  for mixtures, _ in per_offset:
    counter = collections.Counter()
    for idx, mix in enumerate(mixtures):
      if merge_step is not None:
        mix = merge_small(mix, merge_step)
      key = mix.key() if dedupe else f"{len(counts)}:{idx}".encode()
      tasks.setdefault(key, mix)
      counter[key] += 1
    counts.append(counter)
  multiplicity = {}
  for key in tasks:
    uses = [cnt[key] for cnt in counts if key in cnt]
    multiplicity[key] = uses[0] if len(uses) == 1 else 1
  return tasks, counts, multiplicity


def _row_plds(tasks, multiplicity, grid_step, sigma, discretization, mixture_tail_mass,
              fast_inverse, max_components, workers, progress):
  """({key: PLD or None}, grid step used): every distinct row's PLD on one common grid.

  PLDs compose only on a common grid. A row whose privacy loss would need more than
  MAX_ROW_POINTS points (tiny σ) reports its range instead; the grid is then coarsened
  to fit the widest row and every row rebuilt (a coarser pessimistic grid is still an
  upper bound).
  """
  for _ in range(3):
    jobs = [(key, (tasks[key].units, tasks[key].probs, multiplicity[key], grid_step, sigma,
                   discretization, mixture_tail_mass, fast_inverse, max_components,
                   MAX_ROW_POINTS))
            for key in tasks]
    # Largest first, so the pool stays busy.
    jobs.sort(key=lambda kv: -int(np.sum(kv[1][0])))
    results = _run_jobs(jobs, workers, progress)
    widths = [r for r in results.values() if isinstance(r, float)]
    if not widths:
      return results, discretization
    discretization = max(discretization, 1.05 * max(widths) / MAX_ROW_POINTS)
    if discretization > gaussian.PLD_MAX_DISCRETIZATION:
      raise MMCCNumericError(
          f"the row privacy losses at noise multiplier {sigma:g} span {max(widths):.3g}, more "
          f"than {MAX_ROW_POINTS} grid points of step {gaussian.PLD_MAX_DISCRETIZATION:g}")
  raise MMCCNumericError("the row PLDs did not fit on a common grid")


def _worst_offset_epsilon(counts, results, multiplicity, delta_pld: float) -> float:
  """max over offsets of ε at δ2 of the composition of that offset's row PLDs (0 if none)."""
  eps = 0.0
  for counter in counts:
    parts = []
    for key, cnt in counter.items():
      pld = results[key]
      if pld is None:
        continue
      if multiplicity[key] != cnt:  # shared between offsets: composed here
        pld = pld.self_compose(cnt) if cnt > 1 else pld
      parts.append(pld)
    total = _compose_all(parts)
    if total is not None:
      eps = max(eps, float(total.get_epsilon_for_delta(delta_pld)))
  return eps


def optimistic_epsilon(pld, delta: float) -> float:
  """ε at δ of a PLD built with optimistic rounding and then composed, as a lower bound:
  dp_accounting's composition moves the tail mass it truncates (1e-15 per composition by
  default) to infinite loss even for an optimistic PLD, which adds that mass a to δ(ε)
  (at δ ≤ 1e-15 the ε would be infinite). Reading ε at δ + a, a its infinity mass (the
  larger of its two adjacencies'), undoes it: every infinite loss is counted as if it
  were none, which only lowers ε."""
  extra = max(float(getattr(pmf, "_infinity_mass", 0.0) or 0.0)
              for pmf in (pld._pmf_remove, pld._pmf_add))  # pylint: disable=protected-access
  eps = float(pld.get_epsilon_for_delta(delta + extra))
  return 0.0 if math.isnan(eps) else eps


def optimistic_pmf(loss, interval: float):
  """dp_accounting's privacy-buckets PMF of a continuous monotone privacy loss with
  optimistic rounding (``_create_pld_pmf_from_monotone_privacy_loss`` with
  ``pessimistic_estimate=False``: the mass of losses in [Δv, Δ(v + 1)] at Δv), the same
  buckets with every inverse privacy loss computed in one vectorized call rather than one
  scalar call each (``loss``: ``_fast_mog_class``'s, whose inverses are one grid step from
  the true ones, on the side that this moves toward a lower loss)."""
  from dp_accounting.pld import pld_pmf  # pylint: disable=g-import-not-at-top
  tail = loss.privacy_loss_tail()
  lower_x, upper_x = tail.lower_x_truncation, tail.upper_x_truncation
  buckets: Dict[int, float] = collections.defaultdict(float)
  infinity = tail.tail_probability_mass_function.get(math.inf, 0.0)
  for value, mass in tail.tail_probability_mass_function.items():
    if value != math.inf:
      buckets[math.floor(value / interval)] += mass
  if lower_x < upper_x:
    top = math.floor(loss.privacy_loss(lower_x) / interval)
    bottom = loss.privacy_loss(upper_x)
    last = math.floor(bottom / interval)  # the largest v with Δ·v ≤ the loss at upper_x
    while interval * last > bottom:
      last -= 1
    while interval * (last + 1) <= bottom:
      last += 1
    inner = np.arange(top, last, -1) if top > last else np.zeros(0, np.int64)
    inverse = np.asarray(loss.inverse_privacy_losses(interval * inner[::-1]),
                         dtype=np.float64).reshape(-1)[::-1]  # it takes losses ascending
    # The inverse is the smallest multiple of its precision whose (non-increasing) loss is
    # at most Δ·v, at or right of the true point: one step left of it is left of the true
    # point, so a bucket boundary moves only toward the lower loss (the optimistic side).
    inverse = np.clip(inverse - loss.inverse_precision, lower_x, upper_x)
    xs = np.maximum.accumulate(np.concatenate([[lower_x], inverse, [upper_x]]))
    cdf = np.asarray(loss.mu_upper_cdf(xs), dtype=np.float64)
    for v, mass in zip(np.append(inner, min(top, last)).tolist(), np.diff(cdf).tolist()):
      buckets[int(v)] += mass
  return pld_pmf.create_pmf(dict(buckets), interval, infinity, pessimistic_estimate=False)


def lower_bound_epsilon(c, sampling_prob: float, noise_multiplier: float, delta: float, *,
                        min_sep: int = 1, delta_split: float = 0.5, groups: int = 32,
                        grid_resolution: int = 64, max_components: int = 32,
                        target: Optional[float] = None, all_offsets: bool = True) -> float:
  """A lower bound on the ε that ``mmcc`` reports for C, p, σ, δ, b, ``delta_split`` and
  ``all_offsets`` (its other options at any value), or 0.0 where it cannot tell; seconds
  where ``mmcc`` takes minutes.

  ``mmcc``'s ε is, over the worst residue class, a pessimistic PLD's ε at δ2 ≤ δ of the
  composition over row blocks of PMoG(p̃, units·Δ2), every approximation rounding up (the
  module docstring), so it is at least the exact ε at δ of the composition, for any one
  class, of PMoGs that these dominate (Cor B.3, Thm 3.1). Here: the class of largest
  Σ_j ‖C[:, j]‖² (class 0 without ``all_offsets``, the one MMCC then analyzes); each
  block's sensitivities before rounding (``_block_sensitivities``, no larger than
  units·Δ2); for a column first seen in the block, probability q = b·p (p̃'s own), else
  Fig 5's p̃ = expit(ε_ij + logit q), ε_ij = z'·√N_j/σ + (2·s_ij − N_j)/(2σ²) with MMCC's
  own quantile z' (δ' = δ1/(2·N), N the class's non-trivial pairs), N_j the column's
  squared norm over the earlier blocks' rows, and s_ij lowered to its value at the first
  block of the block's run (``_least_inner_sums``; for C ≥ 0 it only grows), and ε_ij
  lowered by 1e-9 of itself for summation order; in about ``groups`` runs
  (``_lower_groups``: blocks that release alike numbers of columns, consecutive within each
  kind), each block replaced by the run's least (sensitivity, probability) at each rank of
  its sensitivities (a block's law depends on its columns only as a multiset of these
  pairs: with a coin per rank, stochastically smaller), so each run is one PMoG
  self-composed; its support rounded down to a grid of
  max|C|/``grid_resolution`` and to at most ``max_components`` points (mass moved down);
  and a PLD with optimistic rounding (``optimistic_pmf``, on a grid of at most 1/blocks,
  coarser where a run's loss range would need more points than MMCC's rows may have).
  The runs are composed most sensitive first, stopping once above ``target``.
  """
  c = check_encoder(c)
  sigma = checks.noise_multiplier(noise_multiplier)
  delta = checks.delta(delta)
  b = checks.positive_int(min_sep, "min_sep")
  q = b * check_sampling_prob(sampling_prob)
  if q >= 1.0 or not 0.0 < delta_split < 1.0:
    return 0.0
  runs, step, blocks = _lower_runs(c, q, sigma, delta_split * delta, b, groups,
                                   grid_resolution, all_offsets)
  interval = min(1e-2, 1.0 / blocks)
  for _ in range(3):  # a grid too fine for a run's loss range: coarser (still optimistic)
    try:
      return _lower_composed(runs, sigma, step, interval, max_components, delta, target)
    except _TooWide as e:
      interval = max(interval, 1.05 * e.width / MAX_ROW_POINTS)
    except MMCCNumericError:
      break
    if interval > gaussian.PLD_MAX_DISCRETIZATION:
      break
  return 0.0


def _lower_composed(runs, sigma: float, step: float, interval: float, max_components: int,
                    delta: float, target: Optional[float]) -> float:
  """``lower_bound_epsilon``'s ε: the runs' optimistic PLDs composed most sensitive first,
  stopping once above ``target``; _TooWide where a run's grid would exceed MMCC's limit."""
  total = None
  eps = 0.0
  for _, units, probs, count in sorted(runs, key=lambda r: -r[0]):
    pld = _lower_run_pld(units, probs, sigma, step, interval, max_components)
    if pld is None:
      continue
    with warnings.catch_warnings(), np.errstate(all="ignore"):
      warnings.simplefilter("ignore", RuntimeWarning)
      pld = pld.self_compose(count) if count > 1 else pld
      total = pld if total is None else total.compose(pld)
      eps = optimistic_epsilon(total, delta)
    if target is not None and eps > target:
      break
  return eps


def _lower_runs(c: np.ndarray, q: float, sigma: float, delta_tail: float, b: int,
                groups: int, grid_resolution: int, all_offsets: bool = True):
  """(runs [(weight, units, probabilities, blocks in the run)], grid step, blocks) of
  ``lower_bound_epsilon``: the class of largest Σ_j ‖C[:, j]‖² (class 0 without
  ``all_offsets``), each block's (sensitivity, probability) pairs largest first, and each
  run's least per rank."""
  squares = np.sum(c * c, axis=0)
  offset = int(np.argmax([np.sum(squares[r::b]) for r in range(b)])) if all_offsets else 0
  ck = c[:, np.arange(offset, c.shape[1], b)]
  before = np.vstack([np.zeros((1, ck.shape[1])), np.cumsum(ck * ck, axis=0)])
  blocks = _blocks(release_rounds(c), b, offset)
  values = np.stack([np.broadcast_to(_block_sensitivities(ck[rows]), ck.shape[1:])
                     for rows in blocks])
  _, _, delta_prime, z_tail = _tail_quantile(ck, blocks, values, q, delta_tail)
  starts = np.array([rows[0] for rows in blocks])
  step = float(np.max(c)) / grid_resolution
  runs = []
  gram = np.zeros((ck.shape[1], ck.shape[1]))
  done = 0
  tail_cache: Dict[int, int] = {}
  for part in _lower_groups(np.count_nonzero(values, axis=1), groups):
    start = int(starts[part[0]])  # the run's earliest block: its s_ij is the least
    gram += ck[done:start].T @ ck[done:start]
    done = start
    inner = _least_inner_sums(gram, q, delta_prime, tail_cache)
    seen = before[starts[part]]  # N_j: the rows of the earlier blocks, one row per block
    low = z_tail * np.sqrt(seen) / sigma + (2.0 * inner - seen) / (2.0 * sigma ** 2)
    low -= 1e-9 * np.abs(low)  # N_j and s_ij summed in another order than MMCC's
    probs = np.where(seen > 0, special.expit(low + math.log(q) - math.log1p(-q)), q)
    order = np.argsort(-values[part], axis=1, kind="stable")
    units = np.floor(np.min(np.take_along_axis(values[part], order, axis=1), axis=0)
                     / step).astype(np.int64)
    least = np.min(np.take_along_axis(probs, order, axis=1), axis=0)
    keep = (units > 0) & (least > 0)
    if np.any(keep):
      runs.append((float(np.sum(units[keep] * least[keep])), units[keep], least[keep],
                   part.size))
  return runs, step, len(blocks)


def _lower_groups(support: np.ndarray, groups: int) -> List[np.ndarray]:
  """The runs of ``_lower_runs``, in order of their first block: the blocks that release
  something, by ⌊log2⌋ of their number of non-zero sensitivities (alike blocks together, so
  that each rank's least loses little: a tree's leaves apart from its inner nodes), each
  such kind cut into runs of consecutive blocks, about ``groups`` runs in all."""
  used = np.nonzero(support > 0)[0]
  if not used.size:
    return []
  kind = np.floor(np.log2(support[used])).astype(np.int64)
  runs = []
  for k in np.unique(kind):
    members = used[kind == k]
    pieces = max(1, int(round(groups * members.size / used.size)))
    runs += np.array_split(members, min(pieces, members.size))
  return sorted(runs, key=lambda r: int(r[0]))


def _least_inner_sums(gram: np.ndarray, q: float, delta_prime: float,
                      tail_cache: Dict[int, int]) -> np.ndarray:
  """s_ij of Fig 5 at a run's first block (the sum of the t largest entries of column j's
  row of the Gram matrix of the earlier rows, t the binomial tail count of its positive
  entries), shaved by 1e-9 for summation order: for C ≥ 0 no later block has a smaller one
  (the Gram entries, their count and so t only grow)."""
  out = np.zeros(gram.shape[0])
  hard = np.nonzero(np.diag(gram) > 0)[0]
  if hard.size:
    rows = gram[hard]
    t = _binomial_tail_counts(np.count_nonzero(rows > 0, axis=1), q, delta_prime, tail_cache)
    most = int(np.max(t))
    if most:
      top = -np.sort(np.partition(-rows, most - 1, axis=1)[:, :most], axis=1)
      csum = np.concatenate([np.zeros((hard.size, 1)), np.cumsum(top, axis=1)], axis=1)
      out[hard] = csum[np.arange(hard.size), t] * (1.0 - 1e-9)
  return out


def _lower_run_pld(units: np.ndarray, probs: np.ndarray, sigma: float, step: float,
                   interval: float, max_components: int):
  """The optimistic PLD of one run's PMoG (support rounded down), or None if it is 0;
  _TooWide beyond MMCC's own limit on a row's grid (tiny σ)."""
  values, masses = sensitivity_pmf(units, probs, 0.0)
  values, masses = coarsen_support(values, masses, max_components, down=True)
  masses = masses / np.sum(masses)
  while values.size > 1 and values[0] == 0 and masses[0] < MIN_ZERO_MASS:
    masses = np.concatenate([[masses[0] + masses[1]], masses[2:]])  # moved down
    values = np.concatenate([[0], values[2:]])
  if values[0] == 0 and values.size == 1:
    return None
  with warnings.catch_warnings(), np.errstate(all="ignore"):
    warnings.simplefilter("ignore", RuntimeWarning)
    return mixture_pld(sigma, values * step, masses, interval, max_points=MAX_ROW_POINTS,
                       optimistic=True)


def mmcc_epsilon(c, sampling_prob: float, noise_multiplier: float, delta: float,
                 **kwargs) -> float:
  """ε of MMCC(C, p, σ, δ/2, δ/2) (Fig 1); an upper bound. See ``mmcc`` for options."""
  return mmcc(c, sampling_prob, noise_multiplier, delta, **kwargs).epsilon
