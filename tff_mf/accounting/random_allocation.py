"""Sampling-free amplification for random-allocation matrix mechanisms (numpy).

Setting (Schuchardt & Kalinin 2026, "Sampling-Free Privacy Accounting for Matrix
Mechanisms under Random Allocation", arXiv:2601.21636, Sec 2; the ``random_allocation``
participation schema): n = k·b rounds in k epochs of b rounds, a user in exactly one
uniformly random round of each epoch, independently across epochs (not the fixed-bin
balls-in-bins of arXiv:2410.06266, where the round repeats every b rounds); the run
releases C·G + Z, Z ~ N(0, z² I) per entry, C (n x n) lower triangular and non-negative,
contributions clipped to norm 1. The pair analyzed is

  P = N(0, z² I)   vs   Q = E_π N(C·1_π, z² I),   π = (π¹, …, πᵏ) uniform,

a user contributing 1 in each of its rounds: for such C it dominates the adaptive run
(Choquette-Choo, Ganesh, Haque, Steinke, Thakurta 2024, arXiv:2410.06266; the pair
arXiv:2601.21636 bounds), and for contributions fixed in advance every bound below holds
directly, since each inner product of two allocations' means is at most its all-ones
value (X ≥ 0). Following arXiv:2601.21636 Sec 3 we bound the Rényi divergences of this
pair in both directions at integer orders α and convert to (ε, δ). Every step below is
proven here (X = CᵀC ≥ 0, rounded up by ``participation.ROUNDING_MARGIN``; m_π = C·1_π;
units of z):

- Q‖P ("remove"). For integer α, e^{(α−1)D_α(Q‖P)} = E exp(Σ_{i<j} m_{π_i}ᵀm_{π_j} / z²)
  over α independent allocations π_1..π_α (expand (dQ/dP)^α; Gaussian moment
  generating function). With A_ee' = max of X over rounds of epochs e ≠ e', A_ee = max
  of X over distinct rounds of epoch e and B_e = (max_t X_tt − A_ee)₊, every pair obeys
  m_{π_i}ᵀm_{π_j} ≤ Σ_{e,e'} A_ee' + Σ_e B_e·[π_iᵉ = π_jᵉ], so
  (α−1)D_α ≤ C(α,2)·ΣA/z² + Σ_e log E exp(B_e·coll_e / z²), coll_e the number of pairs
  of the α balls thrown into the same of b bins. That moment generating function is
  α!/b^α · [x^α] (Σ_m e^{β·m(m−1)/2} x^m/m!)^b (multinomial counts), computed by a
  dynamic program over the b bins (a truncated power series raised to the b-th power by
  squaring, in log space): O(α_max² log b) per epoch, polynomial, never b^k. For C = I
  (A = 0, B = 1) this is exact: the k-fold composition of the random-allocation
  Gaussian's Rényi divergence (Feldman & Shenfeld 2025, arXiv:2502.08202, Sec 5).
  A second bound for the same quantity, tighter for correlated C (BLT): Hoeffding's
  (1963, Sec 5) decoupling of the U-statistic Σ_{i<j} f(π_i, π_j), f(π, π') = 1_πᵀX1_π',
  into ⌊α/2⌋ independent pairs (Jensen over the permutations) gives
  (α−1)D_α ≤ ⌊α/2⌋·log E_{π,π'} exp(c·f(π, π')/z²), c = C(α,2)/⌊α/2⌋. In f, the terms
  of the same or adjacent epochs are kept exactly, and a term X[πᵃ, π'ᵉ] of epochs
  ≥ 2 apart is bounded by the largest X between epoch a and the later round (a function
  of the later epoch's round alone). The expectation is then a chain over the epochs with
  state (πᵉ, π'ᵉ), and the adjacent-epoch factor e^{c(X[s,t'] + X[t,s'])} splits into two
  b x b kernels: a dynamic program of two b x b matrix products per epoch, O(k·b³) per
  order.
- P‖Q ("add"). log E_π e^{f_π} ≥ E_π f_π (Jensen) gives dQ/dP(y) ≥
  exp(m̄ᵀy/z² − E‖m_π‖²/(2z²)), m̄ = E m_π, hence
  D_α(P‖Q) ≤ ((α−1)‖m̄‖² + E‖m_π‖²) / (2z²) for every α > 1.
- Both directions are also bounded by the unamplified Gaussian, α·sens²/(2z²), sens the
  random-allocation sensitivity (``tff_mf.participation``). Per order, the smallest bound of
  each direction; each direction's ε(δ) = min_α [D_α + log(1 − 1/α) − log(α·δ)/(α − 1)]
  at its own best order (Canonne, Kamath, Steinke 2020, arXiv:2004.00010, Prop 12; Balle
  et al. 2020, arXiv:1905.09982, Thm 21; dp_accounting's ``compute_epsilon``), since
  add/remove (ε, δ)-DP bounds each direction's hockey-stick divergence on its own; ε is the
  larger direction (``combine``).
- Comparison pair, both directions (``comparison_pld``). With Y_π = 1_πᵀCᵀy/z² ~ N(0, G),
  G = (1_πᵀX1_π')/z², the likelihood ratio is E_π exp(Y_π − G_ππ/2), and both hockey-stick
  divergences are E F of it for a convex F; by Kahane's convexity inequality (Kahane 1985,
  Ann. Sci. Math. Québec 9, 105–150) a covariance G' ≥ G entrywise gives a dominating
  pair. G' = (ΣA)·11ᵀ + B·Σ_e [πᵉ = π'ᵉ] (A, B as above, B = max_e B_e) is a Gaussian at
  squared sensitivity ΣA composed with k epochs of C = I random allocation at B, whose PLD
  ``tff_mf.accounting.allocation_pld`` computes (after Feldman & Shenfeld 2026, arXiv:2602.17284);
  for C = a·I it is the pair itself. Computed where B ≥ ΣA (near-diagonal C); each
  direction takes the smaller of its PLD and Rényi ε.

What is not here: the paper's own dynamic program (its Lemma 3.2 / Algorithm 3, exact for
banded C at a cost exponential in the bands) and its conditional-composition bound
(Sec 4). Their text could not be checked, so they are not transcribed; the bounds above
are weaker for strongly correlated C (BLT), where the smaller unamplified bound is then
reported. Each is still an upper bound.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from typing import Any, Dict, Optional, Sequence, Tuple

import numpy as np
from scipy import special

from tff_mf.accounting import allocation_pld
from tff_mf.accounting import encoder_facts
from tff_mf import checks
from tff_mf import participation

# Integer Rényi orders: every α ≤ 64, then geometric up to 1024.
ORDERS = tuple(sorted(set(range(2, 65)) | {
    int(round(a)) for a in np.geomspace(64.0, 1024.0, 33)}))
# ``epsilon`` first tries these, then every order of ORDERS within a factor
# ``REFINE_FACTOR`` of the best (the minimum over any set of orders is a valid ε).
COARSE_ORDERS = (2, 3, 4, 5, 6, 8, 10, 12, 16, 20, 24, 32, 40, 48, 64, 96, 128, 192, 256,
                 384, 512, 768, 1024)
REFINE_FACTOR = 1.4
# Points of a projected mixture ``lower_bound`` keeps exactly (beyond: rounded down).
LOWER_BOUND_MAX_POINTS = 4096


class RandomAllocationError(checks.CheckError):
  """Bad input to the random-allocation accountant."""


def check_encoder(c, epochs, scheme: str = "random_allocation") -> Tuple[np.ndarray, int, int]:
  """(C, k, b): C square, lower triangular, non-negative and finite; k divides n (the
  messages name ``scheme``, the participation whose bound is asked for). Checked once per
  ``encoder_facts.same_encoder`` block of C."""
  return encoder_facts.derived(c, ("random_allocation_encoder", epochs, scheme),
                               lambda: _check_encoder(c, epochs, scheme))


def _check_encoder(c, epochs, scheme: str) -> Tuple[np.ndarray, int, int]:
  c = np.asarray(c, dtype=np.float64)
  if c.ndim != 2 or c.shape[0] != c.shape[1] or c.shape[0] < 1:
    raise RandomAllocationError(f"{scheme} amplification needs a square encoder C (one row per "
                                f"round), got shape {c.shape}")
  if not np.all(np.isfinite(c)):
    raise RandomAllocationError("C has non-finite entries")
  if np.any(c < 0):
    raise RandomAllocationError(f"{scheme} amplification needs a non-negative C (the dominating "
                                "pair of arXiv:2410.06266); this C has negative entries")
  if np.any(np.triu(c, 1)):
    raise RandomAllocationError(f"{scheme} amplification needs a lower-triangular C (rows "
                                "released in round order)")
  if not np.any(c):
    raise RandomAllocationError("C is all zeros")
  n = c.shape[0]
  k = checks.positive_int(epochs, "epochs")
  if k > n or n % k:
    raise RandomAllocationError(f"{scheme}: epochs={k} must divide the number of rounds "
                                f"n={n}")
  return c, k, n // k


@dataclasses.dataclass(frozen=True)
class _Gram:
  """What the bounds need of X = CᵀC (independent of z)."""
  k: int
  b: int
  cross: float  # Σ_{e≠e'} A_ee' (ordered pairs of epochs)
  within: np.ndarray  # A_ee per epoch
  excess: np.ndarray  # B_e per epoch
  blocks: np.ndarray  # [k, b, b] diagonal blocks X_ee
  adjacent: np.ndarray  # [k − 1, b, b] blocks X[epoch e, epoch e + 1]
  far: np.ndarray  # [k, b]: Σ_{a ≤ e−2} max_{s∈a} X[s, t] for the rounds t of epoch e
  mean_sq: float  # ‖m̄‖²
  mean_norm_sq: float  # E‖m_π‖²


_CACHE: Dict[Tuple, _Gram] = {}


def _gram(c: np.ndarray, k: int, b: int) -> _Gram:
  """The Gram summary of C, once per ``encoder_facts.same_encoder`` block of C (a calibration's
  evaluations), and otherwise for the C last seen, by its contents."""
  return encoder_facts.derived(c, ("random_allocation_gram", k, b), lambda: _gram_of(c, k, b))


def _gram_of(c: np.ndarray, k: int, b: int) -> _Gram:
  key = (c.shape, k, hashlib.sha1(np.ascontiguousarray(c).tobytes()).hexdigest())
  if key in _CACHE:
    return _CACHE[key]
  n = c.shape[0]
  checks.dense_matrices_fit(n, 3.0, f"the Gram matrix of C for n={n}")
  x = c.T @ c
  # Every bound grows with each entry of X: rounding X up keeps float64 sums safe.
  x = 0.5 * (x + x.T) * (1.0 + participation.ROUNDING_MARGIN)
  xb = x.reshape(k, b, k, b)
  block_max = xb.max(axis=(1, 3))
  blocks = np.stack([x[e * b:(e + 1) * b, e * b:(e + 1) * b] for e in range(k)])
  diag = np.diagonal(blocks, axis1=1, axis2=2)
  if b > 1:
    off = np.where(np.eye(b, dtype=bool)[None], -np.inf, blocks).max(axis=(1, 2))
  else:
    off = np.zeros(k)
  excess = np.maximum(diag.max(axis=1) - off, 0.0)
  block_sums = xb.sum(axis=(1, 3))
  total = float(np.sum(block_sums))
  column_max = xb.max(axis=1)  # [a, e, t]: max over the rounds s of epoch a of X[s, (e, t)]
  far = np.zeros((k, b))
  for e in range(2, k):
    far[e] = np.sum(column_max[:e - 1, e], axis=0)
  adjacent = np.stack([xb[e, :, e + 1, :] for e in range(k - 1)]) if k > 1 else \
      np.zeros((0, b, b))
  gram = _Gram(k=k, b=b, cross=float(np.sum(block_max) - np.trace(block_max)),
               within=off, excess=excess, blocks=blocks, adjacent=adjacent, far=far,
               mean_sq=total / b ** 2,
               mean_norm_sq=float(np.trace(x)) / b + (total - float(np.trace(block_sums)))
               / b ** 2)
  _CACHE.clear()
  _CACHE[key] = gram
  return gram


# ----------------------------------------------------------------------------- collisions


def _log_convolve(a: np.ndarray, b: np.ndarray) -> np.ndarray:
  """log of the coefficients of the product of two series given by log coefficients
  (truncated at the same degree)."""
  deg = a.shape[0]
  padded = np.concatenate([np.full(deg - 1, -np.inf), np.asarray(b, dtype=np.float64)])
  # lagged[i, m] = b_{m − i} (−inf for m < i): a read-only strided view, no gather.
  lagged = np.lib.stride_tricks.as_strided(padded[deg - 1:], shape=(deg, deg),
                                           strides=(-padded.itemsize, padded.itemsize),
                                           writeable=False)
  terms = a[:, None] + lagged
  # logsumexp over i, as scipy.special.logsumexp computes it (max shifted out).
  top = np.max(terms, axis=0)
  top[~np.isfinite(top)] = 0.0
  return np.log(np.sum(np.exp(terms - top), axis=0)) + top


def log_collision_mgf(beta: float, bins: int, max_order: int) -> np.ndarray:
  """log E exp(β·coll) for α = 0..max_order balls thrown uniformly into ``bins`` bins.

  coll = Σ_bins C(count, 2); E = α!/b^α · [x^α] f(x)^b with f(x) = Σ_m e^{β m(m−1)/2}
  x^m/m! (multinomial counts), f^b by repeated squaring of the truncated series (a
  dynamic program over the bins, exact in exact arithmetic).
  """
  m = np.arange(max_order + 1, dtype=np.float64)
  log_f = beta * m * (m - 1) / 2.0 - special.gammaln(m + 1)
  result = np.full(max_order + 1, -np.inf)
  result[0] = 0.0
  power, e = log_f, int(bins)
  while e:
    if e & 1:
      result = _log_convolve(result, power)
    e >>= 1
    if e:
      power = _log_convolve(power, power)
  return result + special.gammaln(m + 1) - m * math.log(bins)


# Smallest exponent of a factor in ``log_pair_moment`` (three factors a step stay > 1e-300).
_FLOOR = -200.0


def log_pair_moment(g: _Gram, scale: float) -> float:
  """An upper bound on log E_{π,π'} exp(scale·1_πᵀX1_π') (the chain of the module docstring).

  Each factor is shifted by its largest exponent (added back in log space), so nothing
  overflows, and its exponents are raised to at least ``_FLOOR`` (raising a term only
  raises the bound), so nothing underflows; the mass is renormalized after every epoch.
  """
  log_total, v = 0.0, None
  for e in range(g.k):
    local = scale * (g.blocks[e] + g.far[e][:, None] + g.far[e][None, :])
    top = float(local.max())
    local = np.exp(np.maximum(local - top, _FLOOR))
    log_total += top
    if v is None:
      v = local
    else:
      kernel = scale * g.adjacent[e - 1]
      shift = float(kernel.max())
      kernel = np.exp(np.maximum(kernel - shift, _FLOOR))
      log_total += 2.0 * shift
      v = (kernel.T @ v @ kernel).T * local
    mass = float(v.sum())
    v = v / mass
    log_total += math.log(mass) - 2.0 * math.log(g.b)
  return log_total


# ----------------------------------------------------------------------------- the bound


def check_orders(orders) -> np.ndarray:
  """``orders`` as a non-empty 1-D int64 array of integers ≥ 2 (RandomAllocationError)."""
  alphas = np.asarray(orders)
  if alphas.ndim != 1 or alphas.size == 0 or np.any(alphas < 2) or np.any(
      alphas != np.round(alphas)):
    raise RandomAllocationError("orders must be integers >= 2")
  return alphas.astype(np.int64)


def rdp(c, epochs: int, noise_multiplier: float, *, sensitivity: Optional[float] = None,
        orders: Sequence[int] = ORDERS) -> Dict[str, np.ndarray]:
  """Rényi-DP bounds (see the module docstring) at integer ``orders`` ≥ 2.

  Returns arrays over the orders: ``remove_collisions``, ``remove_decoupled``, ``add``,
  ``unamplified`` (inf without ``sensitivity``) and ``rdp`` (per order the smallest bound
  of each direction, then the larger direction).
  """
  c, k, b = check_encoder(c, epochs)
  z = checks.noise_multiplier(noise_multiplier)
  alphas = check_orders(orders)
  a = alphas.astype(np.float64)
  g = _gram(c, k, b)
  s2 = z * z
  pairs = a * (a - 1) / 2.0
  # Remove direction, collision bound.
  log_mgf = np.zeros_like(a)
  for beta in np.unique(g.excess):
    count = int(np.sum(g.excess == beta))
    log_mgf += count * log_collision_mgf(float(beta) / s2, b, int(alphas.max()))[alphas]
  collisions = (pairs * (g.cross + float(np.sum(g.within))) / s2 + log_mgf) / (a - 1)
  # Remove direction, Hoeffding-decoupled bound (the chain over epochs).
  halves = np.floor(a / 2.0)
  decoupled = np.array([h * log_pair_moment(g, p / h / s2) / (al - 1)
                        for h, p, al in zip(halves, pairs, a)])
  add = ((a - 1) * g.mean_sq + g.mean_norm_sq) / (2.0 * s2)
  unamplified = (a * sensitivity ** 2 / (2.0 * s2) if sensitivity is not None
                 else np.full_like(a, np.inf))
  remove = np.minimum(np.minimum(collisions, decoupled), unamplified)
  return {"orders": alphas, "remove_collisions": collisions, "remove_decoupled": decoupled,
          "add": add, "unamplified": unamplified, "remove": remove,
          "added": np.minimum(add, unamplified),
          "rdp": np.maximum(remove, np.minimum(add, unamplified))}


def epsilon(c, epochs: int, noise_multiplier: float, delta: float, *,
            sensitivity: Optional[float] = None,
            orders: Optional[Sequence[int]] = None, pld: Optional[bool] = None
            ) -> Dict[str, Any]:
  """An upper bound on ε(δ) of random allocation with encoder C, k = ``epochs``, z.

  ``sensitivity``: C's random-allocation sensitivity (``tff_mf.participation``), when known;
  it adds the unamplified Gaussian's Rényi bound per order. ``orders``: the integer
  orders to minimize over (default: ``COARSE_ORDERS``, then ``ORDERS`` near the best).
  ``pld``: also the comparison pair's PLD (``comparison_pld``; None: where its hidden part
  is at least its common part, C = a·I included; False: Rényi only). Returns
  ``combine``'s fields and "epochs", "rounds_per_epoch".
  """
  delta = checks.delta(delta)
  if sensitivity is not None:
    sensitivity = checks.positive_float(sensitivity, "sensitivity")
  c, k, b = check_encoder(c, epochs)
  g = _gram(c, k, b)
  parts = {"common": g.cross + float(np.sum(g.within)), "hidden": float(np.max(g.excess))}
  found = comparison_pld(b, k, noise_multiplier, delta, parts, pld)
  out = combine(lambda a: rdp(c, epochs, noise_multiplier, sensitivity=sensitivity,
                              orders=a), delta, orders, found)
  return dict(out, epochs=k, rounds_per_epoch=b)


def comparison_pld(bins: int, epochs: int, noise_multiplier: float, delta: float,
                   parts: Dict[str, float], pld: Optional[bool]) -> Optional[Dict[str, Any]]:
  """ε(δ) by PLD of the comparison pair of covariance common·11ᵀ + hidden·Σ_e [same round
  in epoch e] (in units of z²·(C-units)², i.e. X = CᵀC's units): a Gaussian composed with
  ``epochs`` epochs of random allocation of ``bins`` rounds (Kahane's convexity inequality,
  docs/mechanisms.md); None where not computed (``pld`` False, or None and hidden < common,
  or hidden = 0)."""
  common, hidden = parts["common"], parts["hidden"]
  if pld is False or hidden <= 0 or (pld is None and hidden < common):
    return None
  z = checks.noise_multiplier(noise_multiplier)
  found = allocation_pld.epsilon(
      bins, epochs, z / math.sqrt(hidden), delta,
      gaussian_noise_multiplier=z / math.sqrt(common) if common > 0 else None)
  return dict(found, common=common / (z * z), hidden=hidden / (z * z))


def combine(bounds_at, delta: float, orders: Optional[Sequence[int]],
            pld: Optional[Dict[str, Any]]) -> Dict[str, Any]:
  """ε(δ) from Rényi bounds and an optional PLD bound, each direction on its own.

  (ε, δ)-DP under add/remove adjacency bounds the hockey-stick divergence of each direction
  separately: each direction's ε is the smaller of its Rényi ε (``bounds_at(orders)``'s
  ``remove`` / ``added`` arrays, each at its own best order) and the PLD's, and ε is the
  larger direction. Returns {"epsilon", "method" (renyi or pld, of the larger direction),
  "direction", "order" (its Rényi order), "epsilon_remove", "epsilon_add", "methods" (per
  direction), "renyi_epsilon", and "pld" where given}.
  """
  cache: Dict[Tuple[int, ...], Dict[str, np.ndarray]] = {}

  def at(a):
    key = tuple(int(x) for x in a)
    if key not in cache:
      cache[key] = bounds_at(a)
    return cache[key]

  out: Dict[str, Any] = {"methods": {}, "orders": {}}
  renyi = {}
  for direction, key in (("remove", "remove"), ("add", "added")):
    best = best_order(at, delta, orders, key)
    renyi[direction] = best["epsilon"]
    out[f"epsilon_{direction}"], out["methods"][direction] = best["epsilon"], "renyi"
    out["orders"][direction] = best["order"]
    if pld is not None and pld[f"epsilon_{direction}"] < best["epsilon"]:
      out[f"epsilon_{direction}"], out["methods"][direction] = pld[f"epsilon_{direction}"], "pld"
  direction = "remove" if out["epsilon_remove"] >= out["epsilon_add"] else "add"
  out.update(epsilon=float(out[f"epsilon_{direction}"]), direction=direction,
             method=out["methods"][direction], order=int(out["orders"][direction]),
             renyi_epsilon=float(max(renyi.values())))
  if pld is not None:
    out["pld"] = pld
  return out


def best_order(bounds_at, delta: float, orders: Optional[Sequence[int]] = None,
               key: str = "rdp") -> Dict[str, Any]:
  """The Rényi bounds ``bounds_at(orders)`` (a dict with ``orders`` and the array ``key``)
  at the order whose ε(δ) is smallest: over ``orders``, or (None) over ``COARSE_ORDERS``
  and then the orders of ``ORDERS`` within ``REFINE_FACTOR`` of the best (any set of
  orders gives a valid ε). Returns the bounds with ``epsilon``, ``order`` and ``index``."""
  bounds = _best(bounds_at(COARSE_ORDERS if orders is None else orders), delta, key)
  if orders is None:
    near = [a for a in ORDERS if bounds["order"] / REFINE_FACTOR <= a <= bounds["order"] *
            REFINE_FACTOR and a not in COARSE_ORDERS]
    if near:
      refined = _best(bounds_at(near), delta, key)
      if refined["epsilon"] < bounds["epsilon"]:
        bounds = refined
  return bounds


def _best(bounds: Dict[str, np.ndarray], delta: float, key: str = "rdp") -> Dict[str, Any]:
  """``bounds`` with the ε at δ of its best order for the array ``key`` (dp_accounting's
  conversion)."""
  from dp_accounting.rdp import rdp_privacy_accountant  # pylint: disable=g-import-not-at-top
  eps, order = rdp_privacy_accountant.compute_epsilon(
      [float(a) for a in bounds["orders"]], [float(v) for v in bounds[key]], delta)
  return dict(bounds, epsilon=float(eps), order=int(order),
              index=int(np.flatnonzero(bounds["orders"] == order)[0]))


# ----------------------------------------------------------------------------- lower bound


def lower_bound(c, epochs: int, noise_multiplier: float, delta: float,
                directions: Optional[Sequence[np.ndarray]] = None) -> float:
  """A proven LOWER bound on the ε(δ) of random allocation with encoder C.

  An adversary contributing 1 in each of its rounds faces the pair of the module
  docstring; projecting y on v = C·w (post-processing) leaves N(0, z²‖v‖²) against the
  mixture over π of N(wᵀX·1_π, z²‖v‖²), whose means are sums over epochs of independent
  uniform picks, and each threshold test then proves ε below the true one
  (``tff_mf.accounting.mixture_pair.threshold_epsilon``). Where the sums take more than
  ``LOWER_BOUND_MAX_POINTS`` values they are rounded DOWN to a grid: a mixture with smaller
  means puts less mass above every threshold and more below it, so both tests then prove
  less, still a lower bound. Directions: w = 1 and w = e_t for the first round of each
  epoch, unless given.
  """
  from tff_mf.accounting import mixture_pair  # pylint: disable=g-import-not-at-top
  c, k, b = check_encoder(c, epochs)
  z = checks.noise_multiplier(noise_multiplier)
  delta = checks.delta(delta)
  n = c.shape[0]
  x = c.T @ c
  if directions is None:
    directions = [np.ones(n)] + [np.eye(n)[e * b] for e in range(k)]
  best = 0.0
  for w in directions:
    w = np.asarray(w, dtype=np.float64)
    if w.shape != (n,) or not np.all(w >= 0):  # non-negative means: rounding down stays below
      raise RandomAllocationError(f"lower_bound: each direction must be a non-negative vector "
                                  f"of length n = {n}")
    norm = math.sqrt(float(w @ x @ w))
    if norm <= 0:
      continue
    row = (x @ w) / norm
    means, weights = np.zeros(1), np.ones(1)
    for e in range(k):
      vals, counts = np.unique(row[e * b:(e + 1) * b], return_counts=True)
      means = np.add.outer(means, vals).ravel()
      weights = np.outer(weights, counts / b).ravel()
      if means.size > LOWER_BOUND_MAX_POINTS:
        step = (means.max() - means.min()) / LOWER_BOUND_MAX_POINTS
        means = means.min() + np.floor((means - means.min()) / step) * step
      means, idx = np.unique(means, return_inverse=True)
      weights = np.bincount(idx.ravel(), weights=weights, minlength=means.size)
    best = max(best, mixture_pair.threshold_epsilon(means, weights, z, delta))
  return best
