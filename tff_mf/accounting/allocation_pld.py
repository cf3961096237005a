"""Privacy-loss distribution of random allocation with C = I (numpy, dp_accounting).

Random allocation (Feldman & Shenfeld 2026, "Efficient privacy loss accounting for
subsampling and random allocation", arXiv:2602.17284): k epochs of b rounds, a user in one
uniformly random round of each epoch, drawn anew each epoch; the run releases every round
with Gaussian noise of multiplier z (C = I, DP-SGD). One epoch is dominated by the pair

  Q = N(0, z² I_b)   and   P = (1/b) Σ_i N(e_i, z² I_b)

(arXiv:2602.17284, Sec 5; Feldman & Shenfeld 2025, arXiv:2502.08202), whose likelihood
ratio is dP/dQ(y) = S/b with S = Σ_i X_i, X_i = exp(y_i/z² − 1/(2z²)):

- remove (P first): loss log(S/b), with log X_1 ~ N(+1/(2z²), 1/z²) (the user's round)
  and log X_i ~ N(−1/(2z²), 1/z²) for the b − 1 others, all independent;
- add (Q first): loss −log(S/b), the b terms i.i.d. N(−1/(2z²), 1/z²) in log.

The law of S is computed on the geometric grid x_j = e^{j·h} (h = ``grid_step``). Each X
is rounded to the grid, and each sum of two grid values is rounded to the grid, UP for
remove and DOWN for add, so that in a coupling the computed S is ≥ (remove) or ≤ (add)
the true one: every loss is rounded up. X above the grid counts as infinite loss
(remove) or is rounded down to the top (add); X below it is rounded up to the bottom
(remove) or down to 0 (add, infinite loss when the whole sum is 0). The losses are rounded
up again to dp_accounting's grid and the k epochs composed there (pessimistic PLDs, as
``tff_mf.accounting.gaussian``): ε is an upper bound on the true ε. The sum of b terms is built by
doubling, at most ⌈log₂ b⌉ + 1 roundings deep: the loss is overstated by at most that many
grid steps per epoch. One sum of two laws on n grid points costs O(n·log(2)/h): the
rounding offset of a pair depends only on the distance of its indices and is constant on
runs of distances, each run a window sum.

At b = 64, k = 4, z = 2, δ = 1e-8 (C = I): 0.679 in about 5 s on 2 cores (opake's
``random_allocation_gaussian_pld``: 0.677 in 134 s, issue 39); Poisson sampling at p = 1/64
over the same 256 rounds gives 0.731, the Rényi bound of ``tff_mf.accounting.random_allocation`` 1.15.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from typing import Any, Dict, Optional

import numpy as np
from scipy import special

from tff_mf import checks
from tff_mf.accounting import gaussian
from tff_mf.accounting.gaussian import AccountingError

# Step h of the geometric grid of S (log scale). At b = 64, k = 4, z = 2, δ = 1e-8 the
# bound is 0.686, 0.679 and 0.675 at h = 1e-3, 5e-4 and 2.5e-4 (2 s, 5 s and 18 s on 2
# cores): about 14·h above the limit.
GRID_STEP = 5e-4
# dp_accounting's privacy-loss grid.
LOSS_STEP = 1e-4
# Standard deviations of log X kept on the grid (outside: rounded, or infinite loss).
TAIL_SIGMAS = 8.0
# Grid cells whose probability is below this are merged into a neighbour (rounding the
# value the pessimistic way) or counted as infinite loss.
PRUNE_MASS = 1e-30


@dataclasses.dataclass
class _Law:
  """A distribution on {0} ∪ {e^{(lo + i)·h}} ∪ {∞}: ``probs[i]`` at index lo + i."""
  lo: int
  probs: np.ndarray
  zero: float = 0.0
  inf: float = 0.0


def _cell_masses(mean: float, sd: float, edges: np.ndarray) -> np.ndarray:
  """P(edges[i] < log X ≤ edges[i + 1]) for log X ~ N(mean, sd²), accurate in both tails."""
  u = (edges - mean) / sd
  upper = special.ndtr(u[1:]) - special.ndtr(u[:-1])
  tail = special.ndtr(-u[:-1]) - special.ndtr(-u[1:])
  return np.where(u[1:] <= 0, upper, tail).clip(min=0.0)


def _lognormal(mean: float, sd: float, h: float, up: bool) -> _Law:
  """log X ~ N(mean, sd²) rounded to the grid: up (remove) or down (add)."""
  lo = math.floor((mean - TAIL_SIGMAS * sd) / h)
  hi = math.ceil((mean + TAIL_SIGMAS * sd) / h)
  idx = np.arange(lo, hi + 1)
  below = float(special.ndtr((lo * h - mean) / sd))
  above = float(special.ndtr(-(hi * h - mean) / sd))
  if up:  # (x_{j−1}, x_j] → x_j; below the grid → its bottom; above → infinite loss
    probs = np.concatenate([[below], _cell_masses(mean, sd, idx * h)])
    return _Law(lo=lo, probs=probs, inf=above)
  # [x_j, x_{j+1}) → x_j; above the grid → its top; below → 0
  probs = np.concatenate([_cell_masses(mean, sd, idx * h), [above]])
  return _Law(lo=lo, probs=probs, zero=below)


def _prune(law: _Law, up: bool) -> _Law:
  """Drops negligible cells at both ends, moving their mass the pessimistic way."""
  keep = np.flatnonzero(law.probs >= PRUNE_MASS)
  if keep.size == 0:
    raise AccountingError("random-allocation PLD: the grid lost all its mass")
  first, last = int(keep[0]), int(keep[-1])
  probs = law.probs[first:last + 1].copy()
  low, high = float(np.sum(law.probs[:first])), float(np.sum(law.probs[last + 1:]))
  zero, inf = law.zero, law.inf
  if up:  # remove: small values rounded up into the first cell, large ones to ∞
    probs[0] += low
    inf += high
  else:  # add: large values rounded down into the last cell, small ones to 0
    probs[-1] += high
    zero += low
  return _Law(lo=law.lo + first, probs=probs, zero=zero, inf=inf)


def _shifts(count: int, h: float, up: bool) -> np.ndarray:
  """G(d), d = 0..count−1: x_I + x_J = x_{max(I,J)} · (1 + e^{−d·h}) lies at index
  max(I, J) + log1p(e^{−d·h})/h, rounded up (remove) or down (add) by G. The margin is far
  above float rounding, so that every sum is rounded the pessimistic way."""
  raw = np.log1p(np.exp(-np.arange(count) * h)) / h
  return (np.ceil(raw + 1e-9) if up else np.floor(raw - 1e-9).clip(min=0)).astype(np.int64)


class _Windows:
  """Sliding window sums Σ x[j − last .. j − first] for every j = 0..n−1 (indices below 0
  empty), from the prefix or the suffix sums, whichever is smaller, so that windows in the
  tails keep their relative precision; slices only, into buffers allocated once (a call
  returns a buffer the next call overwrites)."""

  def __init__(self, x: np.ndarray):
    n = x.size
    self.n = n
    # prefix[n + k] = Σ x[:k] (0 for k ≤ 0); suffix[n + k] = Σ x[max(k, 0):]
    self.prefix = np.concatenate([np.zeros(n + 1), np.cumsum(x)])
    tail = np.concatenate([np.cumsum(x[::-1])[::-1], [0.0]])
    self.suffix = np.concatenate([np.full(n, tail[0]), tail])
    self._left, self._right = np.empty(n), np.empty(n)
    self._mask = np.empty(n, dtype=bool)

  def __call__(self, first: int, last: int) -> np.ndarray:
    n = self.n
    hi, lo = slice(2 * n - first + 1 - n, 2 * n - first + 1), slice(n - last, 2 * n - last)
    pre_hi, suf_lo = self.prefix[hi], self.suffix[lo]
    left = np.subtract(pre_hi, self.prefix[lo], out=self._left)
    right = np.subtract(suf_lo, self.suffix[hi], out=self._right)
    np.copyto(right, left, where=np.less_equal(pre_hi, suf_lo, out=self._mask))
    return np.maximum(right, 0.0, out=right)


def _sum(a: _Law, b: _Law, h: float, up: bool) -> _Law:
  """The law of A + B (independent), each sum of two grid values rounded to the grid.

  The pair (I, J) lands at max(I, J) + G(|I − J|) (``_shifts``). G is constant on runs of
  |I − J|, so per run the mass landing at J + g is B_J times a window sum of A (and
  symmetrically): O(n) per run, about log(2)/h runs.
  """
  lo = min(a.lo, b.lo)
  size = max(a.lo + a.probs.size, b.lo + b.probs.size) - lo
  pa, pb = np.zeros(size), np.zeros(size)
  pa[a.lo - lo:a.lo - lo + a.probs.size] = a.probs
  pb[b.lo - lo:b.lo - lo + b.probs.size] = b.probs
  g = _shifts(size, h, up)
  starts = np.flatnonzero(np.concatenate([[True], g[1:] != g[:-1]]))
  ends = np.concatenate([starts[1:] - 1, [size - 1]])
  out = np.zeros(size + int(g.max()) + 1)
  wa = _Windows(pa)
  wb = wa if a is b else _Windows(pb)
  for first, last, shift in zip(starts.tolist(), ends.tolist(), g[starts].tolist()):
    target = out[shift:shift + size]
    # J = I + d with d in [first, last]: B_J · Σ_{I = J − last}^{J − first} A_I at J + shift
    window = wa(first, last)
    target += np.multiply(pb, window, out=window)
    if last >= 1:  # I = J + d with d in [max(first, 1), last]: the other way round
      if a is not b or first == 0:
        window = wb(max(first, 1), last)
        np.multiply(pa, window, out=window)
      target += window  # A + A: the same terms as the first way round
  # A zero term leaves the other unchanged; an infinite one makes the sum infinite.
  out[:size] += pa * b.zero + pb * a.zero
  inf = a.inf + b.inf - a.inf * b.inf
  return _prune(_Law(lo=lo, probs=out, zero=a.zero * b.zero, inf=inf), up)


def _sum_of(law: _Law, count: int, h: float, up: bool, first: _Law = None) -> _Law:
  """The law of ``first`` (if given) plus ``count`` independent copies of ``law``, summed
  in binary (doubling) so that no term passes through more than ⌈log₂ count⌉ + 1 sums."""
  total, power = first, law
  while count:
    if count & 1:
      total = power if total is None else _sum(total, power, h, up)
    count >>= 1
    if count:
      power = _sum(power, power, h, up)
  return total


def _loss_pmf(law: _Law, h: float, bins: int, remove: bool, loss_step: float):
  """dp_accounting's pessimistic PMF of log(S/b) (remove) or −log(S/b) (add)."""
  from dp_accounting.pld import pld_pmf  # pylint: disable=g-import-not-at-top
  index = law.lo + np.arange(law.probs.size)
  loss = index * h - math.log(bins)
  if not remove:
    loss = -loss
  rounded = np.ceil(loss / loss_step + 1e-9).astype(np.int64)
  low = int(rounded.min())
  probs = np.bincount(rounded - low, weights=law.probs)
  infinity = law.inf if remove else law.zero  # S = ∞ (remove) or S = 0 (add)
  return pld_pmf.DensePLDPmf(loss_step, low, probs, float(infinity), True)


def epsilon(bins: int, epochs: int, noise_multiplier: float, delta: float, *,
            grid_step: float = GRID_STEP, loss_step: float = LOSS_STEP,
            gaussian_noise_multiplier: Optional[float] = None) -> Dict[str, Any]:
  """An upper bound on ε(δ) of random allocation with C = I: ``epochs`` epochs of ``bins``
  rounds, one round per epoch, Gaussian noise multiplier z (add/remove adjacency).

  ``gaussian_noise_multiplier``: one more Gaussian mechanism (sensitivity 1, this noise
  multiplier) composed with the epochs, its PLD dp_accounting's pessimistic one (the
  common part of the comparison pairs of ``tff_mf.accounting.fixed_bin``).

  Returns {"epsilon", "epsilon_remove", "epsilon_add", "bins", "epochs", "grid_step",
  "loss_step", "max_loss_overstatement"} (the last: the most the grid's rounding can add to
  one epoch's privacy loss).
  """
  from dp_accounting.pld import privacy_loss_distribution as pld_lib  # pylint: disable=g-import-not-at-top
  bins = checks.positive_int(bins, "rounds per epoch b")
  epochs = checks.positive_int(epochs, "epochs")
  z = checks.positive_float(noise_multiplier, "noise_multiplier")
  delta = checks.delta(delta)
  h = checks.positive_float(grid_step, "grid_step")
  loss_step = checks.positive_float(loss_step, "loss_step")
  sd, mean = 1.0 / z, 0.5 / z ** 2
  remove = _sum_of(_lognormal(-mean, sd, h, True), bins - 1, h, True,
                   first=_lognormal(mean, sd, h, True))
  add = _sum_of(_lognormal(-mean, sd, h, False), bins, h, False)
  pmf_remove = _loss_pmf(remove, h, bins, True, loss_step)
  pmf_add = _loss_pmf(add, h, bins, False, loss_step)
  out: Dict[str, Any] = {"bins": bins, "epochs": epochs, "grid_step": h, "loss_step": loss_step,
                         "max_loss_overstatement": (math.ceil(math.log2(bins)) + 2) * h +
                                                   loss_step}
  with warnings.catch_warnings(), np.errstate(all="ignore"):
    warnings.simplefilter("ignore", RuntimeWarning)
    for name, pmf in (("remove", pmf_remove), ("add", pmf_add)):
      composed = pld_lib.PrivacyLossDistribution(pmf).self_compose(epochs)
      if gaussian_noise_multiplier is not None:
        composed = composed.compose(gaussian.gaussian_pld(
            checks.positive_float(gaussian_noise_multiplier, "gaussian_noise_multiplier"),
            loss_step))
      out[f"epsilon_{name}"] = max(float(composed.get_epsilon_for_delta(delta)), 0.0)
  if any(math.isnan(out[f"epsilon_{k}"]) for k in ("remove", "add")):
    raise AccountingError("the random-allocation PLD returned NaN")
  out["epsilon"] = max(out["epsilon_remove"], out["epsilon_add"])
  return out
