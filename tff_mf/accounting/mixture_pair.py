"""Below MMCC: a proven lower bound and a Monte-Carlo estimate for b-min-sep Poisson sampling.

Setting of Choquette-Choo, Ganesh, Steinke, Thakurta 2024 (MMCC, arXiv:2310.15526,
App D): C (n x n, lower triangular, non-negative), noise N(0, σ² I), an example that
may join rounds o, o + b, o + 2b, … (k of them, the columns J of residue class o),
each independently with probability q. An adversary that fixes the example's
contribution to 1 in every round of J (a non-adaptive choice allowed by clipping at 1)
faces exactly the pair

  P = N(0, σ² I)  vs  Q = Σ_u π(u) N(C_J u, σ² I),  π(u) = q^|u| (1 − q)^(k − |u|),

over the join patterns u ∈ {0, 1}^k, so ε(P, Q) (either order) is a LOWER bound on the
ε of the mechanism. The likelihood ratio depends on y only through g = C_Jᵀ y, a
k-dimensional Gaussian with covariance σ² X, X = C_Jᵀ C_J (mean X u under Q).

- ``lower_bound``: a proven lower bound, by post-processing the pair to one direction
  v = C_J w / ‖C_J w‖ (w = 1 and w = e_i): X' = vᵀ y is N(0, σ²) under P and the
  mixture Σ_u π(u) N(aᵀ u, σ²), a = X w / √(wᵀ X w), under Q. For any threshold t,
  Q(X' > t) − e^ε P(X' > t) > δ (or the same with P, Q and "<" swapped) proves
  ε(δ) > ε; the largest such ε over a grid of t is returned, from normal tail
  functions alone (no discretization).
- ``monte_carlo_epsilon``: an ESTIMATE of ε(P, Q) itself by sampling g (Monte-Carlo
  accounting, Choquette-Choo, Ganesh, Haque, Steinke, Thakurta 2024,
  arXiv:2410.06266). It carries sampling error and is never an upper bound: it is
  reported next to the bounds, never as a run's ε.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from typing import Dict, Optional

import numpy as np
from scipy import special
from scipy import stats

from tff_mf import checks

MAX_PATTERN_COLUMNS = 12  # 2^12 join patterns at most (the lower bound may use fewer rounds)


class MixturePairError(checks.CheckError):
  """Bad input to the mixture-pair lower bound or estimate."""


def class_gram(c, min_sep: int, offset: int = 0,
               max_columns: Optional[int] = None) -> np.ndarray:
  """X = C_Jᵀ C_J for the columns J = offset, offset + b, … (the first ``max_columns``)."""
  c = np.asarray(c, dtype=np.float64)
  if c.ndim != 2 or c.shape[0] < c.shape[1]:
    raise MixturePairError(f"C must be an m x n matrix with m >= n, got shape {c.shape}")
  if not np.all(np.isfinite(c)) or np.any(c < 0):
    raise MixturePairError("C must be finite and non-negative")
  n = c.shape[1]
  if int(min_sep) != min_sep or not 1 <= min_sep <= n:
    raise MixturePairError(f"min_sep must be an integer in [1, n={n}], got {min_sep}")
  if int(offset) != offset or not 0 <= offset < min_sep:
    raise MixturePairError(f"offset must be an integer in [0, min_sep), got {offset}")
  cols = np.arange(int(offset), n, int(min_sep))[:max_columns]
  cj = c[:, cols]
  return cj.T @ cj


def _patterns(k: int) -> np.ndarray:
  return np.array(list(itertools.product((0, 1), repeat=k)), dtype=np.float64)


def _pattern_weights(u: np.ndarray, q: float) -> np.ndarray:
  """π(u) = Π_j (q if u_j else 1 − q)."""
  return np.prod(np.where(u > 0, q, 1.0 - q), axis=1)


def _check(q, sigma, delta):
  q = checks.probability(q, "sampling_prob")
  sigma = checks.noise_multiplier(sigma)
  delta = checks.delta(delta)
  return q, sigma, delta


def _threshold_epsilon(means: np.ndarray, weights: np.ndarray, sigma: float,
                       delta: float) -> float:
  """Largest ε proven by one threshold set, for N(0, σ²) vs Σ weights·N(means, σ²).

  Scans t on a coarse grid, then on a fine grid around the best t of each side; every t
  tried is a valid test set, so the grid only affects how close to ε(P', Q') we get.
  """
  means, idx = np.unique(means, return_inverse=True)
  weights = np.bincount(idx, weights=weights, minlength=means.size)

  def best_on(t: np.ndarray):
    z = (t[:, None] - means[None, :]) / sigma
    q_up = special.ndtr(-z) @ weights
    q_lo = special.ndtr(z) @ weights
    log_p_up = special.log_ndtr(-t / sigma)
    p_lo = special.ndtr(t / sigma)
    with np.errstate(divide="ignore", invalid="ignore"):
      remove = np.where(q_up > delta, np.log(q_up - delta) - log_p_up, -np.inf)
      add = np.where((p_lo > delta) & (q_lo > 0), np.log(p_lo - delta) - np.log(q_lo), -np.inf)
    return remove, add

  t = np.linspace(-12.0 * sigma, float(np.max(means)) + 40.0 * sigma, 2001)
  step = t[1] - t[0]
  best = 0.0
  for side in best_on(t):
    if not np.any(np.isfinite(side)):
      continue
    centre = t[int(np.argmax(side))]
    fine = np.linspace(centre - step, centre + step, 2001)
    for vals in (side, *best_on(fine)):
      finite = vals[np.isfinite(vals)]
      if finite.size:
        best = max(best, float(np.max(finite)))
  return best


def threshold_epsilon(means, weights, sigma: float, delta: float) -> float:
  """The largest ε proven by threshold tests for N(0, σ²) vs Σ weights·N(means, σ²) (a lower
  bound on that pair's ε(δ), from normal tail functions alone)."""
  return _threshold_epsilon(np.asarray(means, np.float64), np.asarray(weights, np.float64),
                            sigma, delta)


@dataclasses.dataclass(frozen=True)
class LowerBound:
  """A proven lower bound on a run's ε at δ (never a run's ε): ``epsilon``, from the first
  ``columns`` rounds of residue class 0."""
  epsilon: float
  columns: int


def lower_bound(c, sampling_prob: float, noise_multiplier: float, delta: float, *,
                min_sep: int = 1, offset: int = 0) -> LowerBound:
  """A proven lower bound on the (ε, δ) of b-min-sep Poisson sampling with encoder C.

  ``sampling_prob`` is q, the probability of joining each eligible round. Projects the
  pair of the module docstring onto directions v = C_J w (w = 1 and each e_i) and
  returns ``LowerBound(epsilon=the largest ε proven, columns=|J| used)``. Uses the first
  ``MAX_PATTERN_COLUMNS`` rounds of the class at most (fewer rounds: still a valid
  adversary). Float round-off aside, the true ε is at least this.
  """
  q, sigma, delta = _check(sampling_prob, noise_multiplier, delta)
  x = class_gram(c, min_sep, offset, MAX_PATTERN_COLUMNS)
  k = x.shape[0]
  u = _patterns(k)
  weights = _pattern_weights(u, q)
  best = 0.0
  directions = [np.ones(k)] + [np.eye(k)[i] for i in range(k)]
  for w in directions:
    norm = math.sqrt(float(w @ x @ w))
    if norm <= 0:
      continue
    a = (x @ w) / norm
    means = u @ a
    keep = weights > 0
    best = max(best, _threshold_epsilon(means[keep], weights[keep], sigma, delta))
  return LowerBound(epsilon=best, columns=k)


def monte_carlo_epsilon(c, sampling_prob: float, noise_multiplier: float, delta: float, *,
                        min_sep: int = 1, offset: int = 0, samples: int = 1_000_000,
                        seed: int = 0) -> Dict[str, float]:
  """ESTIMATE of ε(P, Q) of the module docstring's pair (Monte-Carlo accounting,
  arXiv:2410.06266): δ(ε) = E_Q[(1 − e^{ε−L})₊] and E_P[(1 − e^{ε+L})₊], L = log dQ/dP,
  each from ``samples`` draws of g; the smallest ε (bisection) where both are ≤ δ.

  Draws under Q are stratified by the number of joins (exact binomial weights), which
  keeps the estimate unbiased for each δ(ε) and puts draws where δ comes from.
  Sampling error only: not an upper bound, never a run's ε. Returns {"epsilon",
  "samples", "seed", "tail_hits" (draws with L > ε under Q: few means a noisy estimate)}.
  """
  q, sigma, delta = _check(sampling_prob, noise_multiplier, delta)
  if int(samples) != samples or samples < 1000:
    raise MixturePairError(f"samples must be an integer >= 1000, got {samples}")
  x = class_gram(c, min_sep, offset, MAX_PATTERN_COLUMNS)
  k = x.shape[0]
  u = _patterns(k)
  with np.errstate(divide="ignore"):
    log_pi = np.log(_pattern_weights(u, q))
  quad = 0.5 * np.einsum("pi,ij,pj->p", u, x, u)
  chol = np.linalg.cholesky(x + 1e-300 * np.eye(k))
  rng = np.random.default_rng(seed)

  def losses(joins: Optional[int], count: int) -> np.ndarray:
    """L at ``count`` draws of g under P (joins None) or under Q given |u| = joins."""
    out = []
    for start in range(0, count, 8192):
      m = min(8192, count - start)
      g = sigma * (rng.standard_normal((m, k)) @ chol.T)
      if joins:
        ranks = np.argsort(rng.uniform(size=(m, k)), axis=1)
        joined = (ranks < joins).astype(np.float64)  # a uniform subset of size ``joins``
        g += joined @ x
      out.append(special.logsumexp(log_pi[None, :] + (g @ u.T - quad[None, :]) / sigma ** 2,
                                   axis=1))
    return np.concatenate(out)

  # Under Q, stratified by the number of joins s (weights Binom(k, q)(s), exact), so the
  # rare many-join patterns that carry δ get as many draws as the others.
  per = max(1, int(samples) // (k + 1))
  strata = [(float(stats.binom.pmf(s, k, q)), losses(s, per)) for s in range(k + 1)]
  l_q = np.concatenate([l for _, l in strata])
  l_p = losses(None, int(samples))

  def delta_at(eps: float) -> float:
    remove = sum(w * float(np.mean(-np.expm1(np.minimum(eps - l, 0.0)))) for w, l in strata)
    add = float(np.mean(-np.expm1(np.minimum(eps + l_p, 0.0))))
    return max(remove, add)

  lo, hi = 0.0, max(1.0, float(np.max(np.abs(np.concatenate([l_q, l_p])))))
  if delta_at(lo) <= delta:
    hi = 0.0
  for _ in range(100):
    if hi - lo <= 1e-6 * max(1.0, hi):
      break
    mid = 0.5 * (lo + hi)
    if delta_at(mid) <= delta:
      hi = mid
    else:
      lo = mid
  return {"epsilon": hi, "samples": int(samples), "seed": int(seed),
          "tail_hits": int(np.count_nonzero(l_q > hi))}
