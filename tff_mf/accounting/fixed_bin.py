"""Amplified ε of fixed-bin balls-in-bins for lower-triangular C ≥ 0 (numpy).

Setting (Choquette-Choo, Ganesh, Haque, Steinke, Thakurta 2024, arXiv:2410.06266; Chua
et al. 2024, arXiv:2412.16802; the ``balls_in_bins`` participation schema): n = k·b
rounds, a user draws one bin j of b uniformly, once, and joins rounds
S_j = {j, j + b, …, j + (k − 1)b}, contributions clipped to norm 1; the run releases C·G + Z, Z ~ N(0, z² I). For C ≥ 0 the
adaptive run is dominated by the pair (as for random allocation, arXiv:2410.06266; and
for contributions fixed in advance every inner product below is at most its all-ones value)

  P = N(0, z² I)   vs   Q = (1/b) Σ_j N(m_j, z² I),   m_j = C·1_{S_j},

a mixture over b bins (Schuchardt & Kalinin 2026, arXiv:2601.21636, bound the Rényi
divergences of such pairs; what follows is derived here, every step proven). With
G_ij = ⟨m_i, m_j⟩ / z² (b x b, rounded up by ``participation.ROUNDING_MARGIN``) and
y ~ P, the likelihood ratio is W = Q/P(y) = (1/b) Σ_j exp(Y_j − G_jj / 2) with
Y ~ N(0, G): everything depends on C only through G.

- Remove, Rényi (Q‖P): e^{(α−1)D_α} = E_P W^α = E exp(Σ_{i<l} G_{j_i j_l}) over α
  independent uniform bins (expand W^α; Gaussian moment generating function).
  (a) Hoeffding (1963, Sec 5) decoupling into blocks of r = 2 or 3 balls: the U-statistic
  is c·E_σ Σ_blocks (a uniform random permutation σ splits the balls into h = ⌊α/r⌋
  blocks; c = C(α,2) / (h·C(r,2))), so by Jensen over σ
  (α−1)D_α ≤ h·log E exp(c·Σ_{pairs of one block} G), exactly (1/b²) Σ_ij e^{cG_ij} for
  r = 2 and (1/b³) Σ_ij E_ij (E E)_ij, E = e^{cG}, for r = 3: O(b³) per order.
  (b) Collisions: G_ij ≤ A (i ≠ j), G_jj ≤ A + B gives
  (α−1)D_α ≤ C(α,2)·A + log E e^{B·coll} (``random_allocation.log_collision_mgf``;
  exact for C = I).
- Add, Rényi (P‖Q): Jensen on the mixture, D_α ≤ ((α−1)‖m̄‖² + E‖m_j‖²) / (2z²).
- Both directions: the unamplified α·sens² / (2z²).
- Comparison pair (both directions, the whole privacy profile). Kahane's convexity
  inequality (Kahane 1985, Ann. Sci. Math. Québec 9, 105–150): for covariances G ≤ G'
  entrywise and F convex, E F(W_G) ≤ E F(W_G'). Both hockey-stick divergences are such an
  E F (F(w) = (w − e^ε)₊ remove, (1 − e^ε w)₊ add), so the pair of any PSD G' ≥ G
  dominates ours. G' = A·11ᵀ + B·I is the product of the Gaussian N(0, 1) vs N(√A, 1) and
  one epoch of random allocation of b bins at noise multiplier 1/√B, whose PLDs
  ``tff_mf.accounting.allocation_pld`` composes (exact, up to its rounding, for C = I).

Per order the smallest bound of each direction and the larger direction; ε(δ) by the
conversion of Canonne, Kamath, Steinke 2020 (arXiv:2004.00010, Prop 12) minimized over the
orders (``random_allocation.best_order``); the PLD bound where it applies, the smaller one
reported. ``lower_bound``: a proven lower bound, threshold tests on projections.
"""

from __future__ import annotations

import math
from typing import Any, Dict, Optional, Sequence

import numpy as np
from scipy import special

from tff_mf.accounting import allocation_pld
from tff_mf import checks
from tff_mf import participation
from tff_mf.accounting import random_allocation

SCHEME = "balls_in_bins"
# Smallest exponent kept in the moment sums (raising a term only raises the bound).
_FLOOR = -200.0


def bin_gram(c, epochs: int, noise_multiplier: float) -> np.ndarray:
  """G = MᵀM / z², M = [C·1_{S_0}, …, C·1_{S_{b−1}}] (C checked as for random allocation),
  rounded up so that float64 sums stay upper bounds."""
  z = checks.noise_multiplier(noise_multiplier)
  m = bin_means(c, epochs)
  g = (m.T @ m) / (z * z)
  return 0.5 * (g + g.T) * (1.0 + participation.ROUNDING_MARGIN)


def bin_means(c, epochs: int) -> np.ndarray:
  """M = [C·1_{S_0}, …, C·1_{S_{b−1}}] (n x b), C checked as for random allocation."""
  c, k, b = random_allocation.check_encoder(c, epochs, SCHEME)
  n = c.shape[0]
  checks.dense_matrices_fit(n, 2.0, f"the bin patterns of C for n={n}")
  return c.reshape(n, k, b).sum(axis=1)


def _sum_slack(terms: int) -> float:
  """log(1 + terms·2⁻⁵²): a float64 sum of ``terms`` non-negative numbers is within this
  (in log) of the exact sum, so adding it keeps a computed moment an upper bound."""
  return math.log1p(terms * 2.0 ** -52)


def _log_mean_exp(x: np.ndarray) -> float:
  top = float(x.max())
  return (top + math.log(float(np.mean(np.exp(np.maximum(x - top, _FLOOR))))) +
          _sum_slack(x.size))


def log_block_moment(g: np.ndarray, scale: float, block: int) -> float:
  """An upper bound on log E exp(scale·Σ_{pairs of ``block`` balls} G) over independent
  uniform bins (exact up to the floor and the float slack, which only raise it); block 2
  or 3."""
  b = g.shape[0]
  if block == 2:
    return _log_mean_exp(scale * g)
  if block != 3:
    raise ValueError("block must be 2 or 3")
  local = scale * g
  top = float(local.max())
  e = np.exp(np.maximum(local - top, _FLOOR))
  return (3.0 * top + math.log(float(np.sum(e * (e @ e)))) - 3.0 * math.log(b) +
          _sum_slack(b ** 3))


def rdp(c, epochs: int, noise_multiplier: float, *, sensitivity: Optional[float] = None,
        orders: Sequence[int] = random_allocation.ORDERS) -> Dict[str, np.ndarray]:
  """Rényi-DP bounds (module docstring) at integer ``orders`` ≥ 2: arrays
  ``remove_pairs``, ``remove_triples``, ``remove_collisions``, ``add``, ``unamplified``
  (inf without ``sensitivity``) and ``rdp`` (per order the smallest bound of each
  direction, then the larger direction)."""
  g = bin_gram(c, epochs, noise_multiplier)
  alphas = random_allocation.check_orders(orders)
  a = alphas.astype(np.float64)
  b = g.shape[0]
  pairs = a * (a - 1) / 2.0
  blocks = {}
  for r in (2, 3):
    h = np.floor(a / r)
    blocks[r] = np.array([
        hh * log_block_moment(g, p / (hh * r * (r - 1) / 2.0), r) / (al - 1) if hh else np.inf
        for hh, p, al in zip(h, pairs, a)])
  diag = np.diagonal(g)
  parts = comparison(g)
  log_mgf = random_allocation.log_collision_mgf(parts["hidden"], b, int(alphas.max()))[alphas]
  collisions = (pairs * parts["common"] + log_mgf) / (a - 1)
  slack = 1.0 + b * b * 2.0 ** -52  # float64 means of b² and b non-negative terms
  add = ((a - 1) * float(np.mean(g)) + float(np.mean(diag))) * slack / 2.0
  z = checks.noise_multiplier(noise_multiplier)
  unamplified = (a * sensitivity ** 2 / (2.0 * z * z) if sensitivity is not None
                 else np.full_like(a, np.inf))
  remove = np.minimum.reduce([blocks[2], blocks[3], collisions, unamplified])
  return {"orders": alphas, "remove_pairs": blocks[2], "remove_triples": blocks[3],
          "remove_collisions": collisions, "add": add, "unamplified": unamplified,
          "remove": remove, "added": np.minimum(add, unamplified),
          "rdp": np.maximum(remove, np.minimum(add, unamplified))}


def comparison(g: np.ndarray) -> Dict[str, float]:
  """A ("common") and B ("hidden") of the comparison covariance A·11ᵀ + B·I ≥ G."""
  b = g.shape[0]
  off = float(np.max(np.where(np.eye(b, dtype=bool), -np.inf, g))) if b > 1 else 0.0
  off = max(off, 0.0)
  return {"common": off, "hidden": max(float(np.max(np.diagonal(g))) - off, 0.0)}


def epsilon(c, epochs: int, noise_multiplier: float, delta: float, *,
            sensitivity: Optional[float] = None, orders: Optional[Sequence[int]] = None,
            pld: Optional[bool] = None) -> Dict[str, Any]:
  """An upper bound on ε(δ) of fixed-bin balls-in-bins with encoder C, k = ``epochs``, z.

  ``sensitivity``: the fixed-bin sensitivity (``tff_mf.participation``), adding the
  unamplified Rényi bound per order. ``pld``: also the comparison pair's PLD (None: where
  its hidden part B is at least its common part A, where it can win; it costs seconds).
  Returns ``random_allocation.combine``'s fields (each direction the smaller of its Rényi
  and PLD ε) and "epochs", "bins".
  """
  delta = checks.delta(delta)
  if sensitivity is not None:
    sensitivity = checks.positive_float(sensitivity, "sensitivity")
  z = checks.noise_multiplier(noise_multiplier)
  parts = comparison(bin_gram(c, epochs, 1.0))  # in units of X = CᵀC, as random allocation's
  bins = np.asarray(c).shape[0] // int(epochs)
  found = random_allocation.comparison_pld(bins, 1, z, delta, parts, pld)
  out = random_allocation.combine(
      lambda a: rdp(c, epochs, z, sensitivity=sensitivity, orders=a), delta, orders, found)
  return dict(out, epochs=int(epochs), bins=int(bins))


def lower_bound(c, epochs: int, noise_multiplier: float, delta: float) -> float:
  """A proven LOWER bound on the ε(δ) of fixed-bin balls-in-bins with encoder C.

  An adversary contributing 1 in every round of its bin faces the pair of the module
  docstring; projecting y on v = M·w (post-processing; w = 1 and w = e_0) leaves
  N(0, z²‖v‖²) against (1/b) Σ_j N(⟨m_j, v⟩, z²‖v‖²), and each threshold test proves an
  ε below the true one (``tff_mf.accounting.mixture_pair.threshold_epsilon``).
  """
  from tff_mf.accounting import mixture_pair  # pylint: disable=g-import-not-at-top
  z = checks.noise_multiplier(noise_multiplier)
  delta = checks.delta(delta)
  m = bin_means(c, epochs)
  g = m.T @ m
  b = g.shape[0]
  best = 0.0
  for w in (np.ones(b), np.eye(b)[0]):
    norm = math.sqrt(float(w @ g @ w))
    if norm > 0:
      best = max(best, mixture_pair.threshold_epsilon(g @ w / norm, np.full(b, 1.0 / b), z,
                                                      delta))
  return best
