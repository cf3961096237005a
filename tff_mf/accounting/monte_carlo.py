"""Monte-Carlo accounting with a proven high-probability guarantee (numpy core, no TensorFlow).

**The pairs.** For lower-triangular C ≥ 0 (m x n) and noise N(0, σ² I), the adaptive
matrix mechanism under each schema below is dominated by the non-adaptive pair that
fixes the user's contribution to 1 in every round it joins (Choquette-Choo, Ganesh,
Haque, Steinke, Thakurta 2024, arXiv:2410.06266; MMCC App D, arXiv:2310.15526):

  P = N(0, σ² I)  vs  Q = Σ_s w_s N(C x_s, σ² I),   L(y) = log dQ/dP(y).

- cyclic Poisson (``min_sep`` b as this library samples it: a user keeps one residue class
  mod b and joins each of its rounds with probability p; or ``fixed_epoch`` with b = n/k
  sampled that way). Not the general b-min-sep Poisson of arXiv:2410.06266, where a user
  may move to another class after a gap longer than b: this pair does not dominate that
  one: x = Σ_t u_t e_{r + tb}
  over the class r's columns J, u ~ Bernoulli(p)^k. The class may be known: the
  worst class counts, so every class is sampled (a Toeplitz C: class 0 alone, since
  every other class's pair is class 0's with rows dropped, a post-processing).
  L depends on y through g = C_Jᵀ y only; X = C_Jᵀ C_J is banded with width h in t
  (h = 0 when C has at most b bands: L is a sum over t), and
  L = log Σ_u π(u) exp((uᵀ g − ½ uᵀ X u)/σ²) is summed exactly by a dynamic program
  over the last h bits of u (2^h states).
- fixed-bin balls-in-bins (``balls_in_bins``, b bins, arXiv:2410.06266, arXiv:2412.16802):
  x = 1_{S_j}, S_j = {j, j + b, …}, j uniform: with A = C S (column j = C 1_{S_j}),
  G = AᵀA and g = Aᵀ y, L = logsumexp_j((g_j − G_jj/2)/σ²) − log b.

g is drawn as X u + σ R ξ (or G e_j + σ R ξ; under P without the mean) with R Rᵀ the
Gram and ξ standard normal, so a draw costs O(k²) (b² for bins) once the Gram is
known; the Gram costs O(nnz(C)·k) (O(m n b) dense).

**The bound.** For each direction (remove: Y ~ Q, V = (1 − e^{ε−L})₊; add: Y ~ P,
V = (1 − e^{ε+L})₊) δ(ε) = E V with V ∈ [0, 1]. From N i.i.d. draws with mean V̄,
the Chernoff–Hoeffding bound (Hoeffding 1963, Thm 1: P(V̄ ≤ μ − t) ≤
exp(−N kl(μ − t ‖ μ))) makes δ⁺ = max{μ ≥ V̄ : N kl(V̄ ‖ μ) ≤ log(1/β')} an upper
confidence bound failing with probability ≤ β'. β is split evenly over the directions
and classes sampled (union bound). ε̂ is the smallest ε with every δ⁺(ε) ≤ δ.

**Reusing the draws for every ε (calibration from samples).** V is non-increasing in ε
for every draw, so the passing set of ε is an interval [ε̂, ∞). ε̂ fails only if ε̂ < ε°,
the true ε at δ; then every ε in [ε̂, ε°) passed, in particular ε° − η for all small η,
and each of those fixed points passes with probability ≤ β' (δ(ε° − η) > δ, δ continuous):
one fixed point carries the whole failure probability, no union over ε. The noise is
calibrated by the ordered sweep of Dong & Ganesh 2026 (arXiv:2602.09338, Alg. 5):
z_0 > z_1 > … (z_0 the deterministic unamplified calibration), stop at the first z that
fails, report the one before. True δ grows as z falls (less noise is post-processing
of more), so a wrong report needs the first z whose true δ exceeds the target to pass
its own test: probability ≤ β, whatever draws the other z share (they reuse ξ and u).

**Composition with dp_accounting events.** For M₁ (sampled) and M₂ (a PLD, both
directions), H_{e^ε}(Q₁×Q₂ ‖ P₁×P₂) = E_{Q₁}[H_{e^{ε−L₁}}(Q₂ ‖ P₂)] and likewise for
the add direction with −L₁ under P₁. So V = δ₂(ε − L) ∈ [0, 1] with δ₂ the composed
events' pessimistic PLD δ (dp_accounting, max over its two directions, read at the grid
point at or below ε − L: δ₂ is non-increasing) and the same bound applies.

**One seed, fixed before looking.** The probability ≥ 1 − β is over the draws of one run
whose seed was fixed before any result was seen (a seed chosen in advance, or OS
entropy). Rerunning with new seeds until a small ε̂ appears and keeping it is a search over
k runs: each fails with probability ≤ β, so the smallest fails with probability up to
min(1, k·β) and the stated β no longer holds. Every label of the ε says so
(``SEED_CONDITION``, in ``tff_mf.accounting.analyses.high_probability_words``).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
from scipy import special

from tff_mf import checks

# The condition under which β holds, printed with every ε this analysis gives.
SEED_CONDITION = ("for an accountant seed fixed before any result was seen; trying several "
                  "seeds and keeping the smallest epsilon voids this")

DEFAULT_SAMPLES = 1_000_000
DEFAULT_FAILURE_PROBABILITY = 1e-3
MAX_WIDTH = 10  # 2^10 states at most in the Poisson pair's dynamic program
_CHUNK = 1 << 21  # floats per block of draws
_GRID = 1e-3  # grid of ε − L where a composed PLD's δ is read (rounded down: δ rounded up)


class MonteCarloError(checks.CheckError):
  """Bad input to, or an impossible request of, the Monte-Carlo accountant."""


@dataclasses.dataclass(frozen=True)
class Pair:
  """One dominating pair, by its Gram matrix: ``poisson`` (X = C_Jᵀ C_J of one residue
  class, join probability ``sampling_prob``, interaction ``width`` h) or ``bins``
  (G = AᵀA over the b bins)."""
  kind: str
  gram: np.ndarray
  root: np.ndarray  # R with R Rᵀ = gram
  sampling_prob: float = 1.0
  width: int = 0
  offset: int = 0

  @property
  def size(self) -> int:
    return self.gram.shape[0]


def _root(gram: np.ndarray) -> np.ndarray:
  """R with R Rᵀ = gram (symmetric PSD), by eigendecomposition (negative round-off → 0)."""
  w, v = np.linalg.eigh(0.5 * (gram + gram.T))
  return v * np.sqrt(np.maximum(w, 0.0))[None, :]


def _is_toeplitz(c: np.ndarray) -> bool:
  m, n = c.shape
  if m != n:
    return False
  first = c[:, 0]
  return all(np.array_equal(c[j:, j], first[:n - j]) for j in range(1, n))


def _check_schema(schema):
  """``schema`` as a ``tff_mf.participation.Participation`` (a dict is read)."""
  from tff_mf import participation  # pylint: disable=g-import-not-at-top
  if isinstance(schema, dict):
    schema = participation.from_dict(schema)
  if not isinstance(schema, participation.Participation):
    raise MonteCarloError(f"schema must be a tff_mf.participation.Participation, got {schema!r}")
  return schema


def check_encoder(c) -> np.ndarray:
  """C as a finite non-negative lower-triangular float64 matrix (m ≥ n)."""
  c = checks.matrix(c, "C")
  m, n = c.shape
  if m < n:
    raise MonteCarloError(f"C must have at least as many rows as columns, got shape {c.shape}")
  if np.any(c < 0):
    raise MonteCarloError("Monte-Carlo accounting needs C >= 0 (arXiv:2410.06266's dominating "
                          "pair); this C has a negative entry")
  from tff_mf.accounting import mmcc  # pylint: disable=g-import-not-at-top
  try:  # square: lower triangular; taller: rows in release order (MMCC's rule)
    mmcc.release_rounds(c)
  except mmcc.MMCCError as e:
    raise MonteCarloError(f"Monte-Carlo accounting needs a lower-triangular C: {e}") from None
  return c


def poisson_pairs(c: np.ndarray, min_sep: int, sampling_prob: float) -> List[Pair]:
  """The residue-class pairs of b-min-sep Poisson sampling (class 0 alone for Toeplitz C)."""
  c = check_encoder(c)
  p = checks.probability(sampling_prob, "sampling_prob")
  n = c.shape[1]
  b = int(min_sep)
  offsets = [0] if _is_toeplitz(c) else range(min(b, n))
  pairs = []
  for r in offsets:
    cj = c[:, r::b]
    x = cj.T @ cj
    rows, cols = np.nonzero(x)
    width = int(np.max(np.abs(rows - cols))) if rows.size else 0
    if width > MAX_WIDTH:
      raise MonteCarloError(
          f"Monte-Carlo accounting under min_sep {b} Poisson sampling sums 2^{width} join "
          f"patterns per draw for this C (columns {b} apart overlap over {width} later ones; "
          f"at most {MAX_WIDTH}): use amplification 'mmcc', or fewer bands")
    pairs.append(Pair("poisson", x, _root(x), p, width, r))
  return pairs


def bins_pair(c: np.ndarray, bins: int) -> Pair:
  """The fixed-bin balls-in-bins pair over ``bins`` bins (rounds j, j + b, … of bin j)."""
  c = check_encoder(c)
  n = c.shape[1]
  b = int(bins)
  a = np.stack([c[:, j::b].sum(axis=1) for j in range(min(b, n))], axis=1)
  g = a.T @ a
  return Pair("bins", g, _root(g), 1.0 / b)


def pairs_for(c, schema, sampling_prob: Optional[float]) -> List[Pair]:
  """The dominating pairs of C under ``schema`` (a ``tff_mf.participation.Participation``)."""
  n = np.shape(c)[1]
  if schema.marks_fixed_bin:
    if sampling_prob is not None:
      raise MonteCarloError("sampling_prob does not apply to balls_in_bins (a user joins every "
                            "round of its bin)")
    return [bins_pair(c, schema.rounds_per_epoch(n))]
  if schema.not_poisson is not None:
    raise MonteCarloError(f"Monte-Carlo accounting covers min_sep / fixed_epoch Poisson sampling "
                          f"and balls_in_bins, not {schema.describe()}")
  if sampling_prob is None:
    raise MonteCarloError("Monte-Carlo accounting of Poisson sampling needs sampling_prob")
  b = schema.poisson_period(n, MonteCarloError)
  return poisson_pairs(c, b, sampling_prob)


# ----------------------------------------------------------------------------- draws and losses


def _poisson_loss(pair: Pair, g: np.ndarray, sigma: float) -> np.ndarray:
  """L = log Σ_u π(u) exp((uᵀg − ½uᵀXu)/σ²) per row of g, exactly (dynamic program)."""
  p, x, h = pair.sampling_prob, pair.gram, pair.width
  k = x.shape[0]
  s2 = sigma * sigma
  log_q = math.log1p(-p) if p < 1.0 else -math.inf
  log_p = math.log(p)
  a = (g - 0.5 * np.diag(x)[None, :]) / s2 + log_p  # log weight of joining t, alone
  if h == 0:
    return np.sum(np.logaddexp(log_q, a), axis=1)
  states = 1 << h
  idx = np.arange(states)
  bits = ((idx[:, None] >> np.arange(h)[None, :]) & 1).astype(np.float64)  # bit d-1: u_{t-d}
  f = np.full((g.shape[0], states), -np.inf)
  f[:, 0] = 0.0
  top = 1 << (h - 1)
  for t in range(k):
    coupling = np.zeros(h)
    for d in range(1, min(h, t) + 1):
      coupling[d - 1] = x[t, t - d] / s2
    join = f + a[:, t:t + 1] - (bits @ coupling)[None, :]
    skip = f + log_q
    new = np.empty_like(f)
    for v, src in ((0, skip), (1, join)):
      targets = idx[(idx & 1) == v]
      pred = targets >> 1
      new[:, targets] = np.logaddexp(src[:, pred], src[:, pred | top])
    f = new
  return special.logsumexp(f, axis=1)


def _losses(pair: Pair, sigma: float, count: int, entropy: int, key: Tuple[int, ...],
            remove: bool) -> np.ndarray:
  """``count`` privacy losses of ``pair`` at noise σ: log dQ/dP under Q (``remove``) or
  log dP/dQ under P. Draws are a function of (entropy, key, block): the same at every σ."""
  k = pair.size
  block = max(1, _CHUNK // (k * max(1, 1 << pair.width)))
  out = np.empty(count)
  for i, start in enumerate(range(0, count, block)):
    size = min(block, count - start)
    rng = np.random.default_rng(np.random.SeedSequence(entropy, spawn_key=key + (i,)))
    if pair.kind == "bins":
      mean = pair.gram[rng.integers(k, size=size)] if remove else 0.0
      g = mean + sigma * (rng.standard_normal((size, k)) @ pair.root.T)
      loss = (special.logsumexp((g - 0.5 * np.diag(pair.gram)[None, :]) / sigma ** 2, axis=1)
              - math.log(k))
    else:
      mean = ((rng.random((size, k)) < pair.sampling_prob).astype(np.float64) @ pair.gram
              if remove else 0.0)
      g = mean + sigma * (rng.standard_normal((size, k)) @ pair.root.T)
      loss = _poisson_loss(pair, g, sigma)
    out[start:start + size] = loss if remove else -loss
  return out


# ----------------------------------------------------------------------------- the bound


def kl_upper(mean: float, count: int, failure_probability: float) -> float:
  """max{μ ∈ [mean, 1] : count·kl(mean ‖ μ) ≤ log(1/β)}: an upper confidence bound on the
  mean of [0, 1] variables failing with probability ≤ β (Hoeffding 1963, Thm 1)."""
  mean = min(max(float(mean), 0.0), 1.0)
  budget = math.log(1.0 / failure_probability) / count
  if mean >= 1.0:
    return 1.0

  def kl(mu):
    return float(special.rel_entr(mean, mu) + special.rel_entr(1.0 - mean, 1.0 - mu))

  lo, hi = mean, 1.0
  if kl(1.0 - 1e-300) <= budget:
    return 1.0
  for _ in range(200):
    mid = 0.5 * (lo + hi)
    if kl(mid) <= budget:
      lo = mid
    else:
      hi = mid
    if hi - lo <= 1e-15 * hi:
      break
  return hi


class _Composed:
  """δ₂(x) of dp_accounting events (pessimistic PLD, max of both directions), tabulated on
  a grid and read at the grid point at or below x (δ₂ is non-increasing: rounded up)."""

  def __init__(self, events):
    import dp_accounting  # pylint: disable=g-import-not-at-top
    acc = dp_accounting.pld.PLDAccountant()
    for event in events:
      acc.compose(event)
    self.pld = acc._pld  # pylint: disable=protected-access
    self.lo, self.table = 0, np.zeros(0)

  def __call__(self, x: np.ndarray) -> np.ndarray:
    cells = np.floor(x / _GRID).astype(np.int64)
    lo, hi = int(cells.min()), int(cells.max())
    if lo < self.lo or hi >= self.lo + self.table.size:  # widen the table, by 1 (ε) at least
      margin = max(1000, self.table.size)
      lo = min(lo, self.lo) - margin if self.table.size else lo - margin
      hi = max(hi, self.lo + self.table.size - 1) + margin
      grid = np.arange(lo, hi + 1) * _GRID
      self.lo = lo
      self.table = np.minimum(np.asarray(self.pld.get_delta_for_epsilon(grid), float), 1.0)
    return self.table[cells - self.lo]


def _delta_mean(losses: np.ndarray, eps: float, composed: Optional[_Composed]) -> float:
  if composed is not None:
    return float(np.mean(composed(eps - losses)))
  tail = losses[losses > eps]
  return float(np.sum(-np.expm1(eps - tail))) / losses.size


def _upper(sets, eps, beta_each, composed) -> float:
  return max(kl_upper(_delta_mean(l, eps, composed), l.size, beta_each) for l in sets)


def check_failure_probability(beta, name: str = "failure_probability") -> float:
  beta = checks.finite_float(beta, name)
  if not 0.0 < beta < 1.0:
    raise MonteCarloError(f"{name} must be in (0, 1), got {beta}")
  return beta


def _check_samples(samples) -> int:
  if isinstance(samples, bool) or int(samples) != samples or samples < 1000:
    raise MonteCarloError(f"samples must be an integer >= 1000, got {samples}")
  return int(samples)


def _all_losses(pairs: Sequence[Pair], sigma: float, samples: int, seed: int):
  return [_losses(pair, sigma, samples, seed, (i, int(remove)), remove)
          for i, pair in enumerate(pairs) for remove in (True, False)]


def _epsilon_from(sets, delta: float, beta_each: float, composed) -> float:
  """The smallest ε (bisection, the passing end) with every set's δ⁺(ε) ≤ δ."""
  if _upper(sets, 0.0, beta_each, composed) <= delta:
    return 0.0
  hi = max(1.0, max(float(np.max(l)) for l in sets) + 1.0)
  if composed is not None:
    while _upper(sets, hi, beta_each, composed) > delta and hi < 1e4:
      hi *= 2.0
  if _upper(sets, hi, beta_each, composed) > delta:
    need = math.ceil(math.log(1.0 / beta_each) / delta)
    raise MonteCarloError(
        f"samples = {sets[0].size} cannot certify delta = {delta:g} at failure probability "
        f"{beta_each:g} per direction (the confidence bound alone is about log(1/beta)/N): "
        f"use samples >= {need}, a larger delta or a larger failure_probability",
        arguments=("samples", "failure_probability"))
  return _passing_end(lambda eps: _upper(sets, eps, beta_each, composed) <= delta, hi)


def _passing_end(ok, hi: float) -> float:
  """Bisection on [0, hi] (``ok(hi)`` holds, ``ok(0)`` does not) for the smallest ε with
  ``ok``, to 1e-7 relative; returns the passing end, never a failing point."""
  lo = 0.0
  for _ in range(100):
    if hi - lo <= 1e-7 * max(1.0, hi):
      break
    mid = 0.5 * (lo + hi)
    if ok(mid):
      hi = mid
    else:
      lo = mid
  return hi


def epsilon(c, schema, noise_multiplier: float, delta: float, *,
            sampling_prob: Optional[float] = None, samples: int = DEFAULT_SAMPLES,
            failure_probability: float = DEFAULT_FAILURE_PROBABILITY,
            seed: Optional[int] = None, other_events: Sequence[Any] = ()) -> Dict[str, Any]:
  """ε at δ that, with probability ≥ 1 − β over this function's own draws, upper-bounds
  the ε of C under ``schema`` at noise multiplier z, composed with ``other_events``
  (dp_accounting DpEvents). Returns {epsilon, failure_probability, samples, seed,
  seed_source, pairs, point_estimate (ε where the sample means, without their confidence
  bound, meet δ: not a bound), method}."""
  z = checks.noise_multiplier(noise_multiplier, "noise_multiplier")
  delta, beta, samples, seed, pinned, pairs = _checked_run(
      c, schema, delta, failure_probability, samples, seed, sampling_prob)
  sets = _all_losses(pairs, z, samples, seed)
  beta_each = beta / len(sets)
  composed = _Composed(other_events) if other_events else None
  eps = _epsilon_from(sets, delta, beta_each, composed)
  point = _point(sets, delta, composed)
  return {"epsilon": eps, "failure_probability": beta, "samples": samples, "seed": seed,
          "seed_source": "pinned" if pinned else "os_entropy", "pairs": len(pairs),
          "pair": pairs[0].kind, "point_estimate": point, "composed_events": len(other_events),
          "method": METHOD}


def _checked_run(c, schema, delta, failure_probability, samples, seed, sampling_prob):
  """The checked inputs of a Monte-Carlo run: (δ, β, samples, seed, pinned, pairs); the
  seed from OS entropy unless pinned."""
  delta = checks.delta(delta, "delta")
  beta = check_failure_probability(failure_probability)
  samples = _check_samples(samples)
  schema = _check_schema(schema)
  c = check_encoder(c)
  schema.check(c.shape[1])
  pinned = seed is not None
  seed = checks.seed(seed, "seed") if pinned else checks.new_seed("monte-carlo-accountant")
  return delta, beta, samples, seed, pinned, pairs_for(c, schema, sampling_prob)


METHOD = ("Monte-Carlo accounting of the dominating pair (arXiv:2410.06266), delta by the "
          "Chernoff-Hoeffding bound on the mean of (1 - e^(eps - L))_+ in [0, 1] (Hoeffding "
          "1963, Thm 1), failure probability split over directions and classes")


def _point(sets, delta: float, composed) -> float:
  """ε where the sample means meet δ (no confidence bound): an estimate, for comparison."""
  def ok(eps):
    return max(_delta_mean(l, eps, composed) for l in sets) <= delta
  hi = max(1.0, max(float(np.max(l)) for l in sets) + 1.0)
  if ok(0.0):
    return 0.0
  if not ok(hi):
    return math.inf
  return _passing_end(ok, hi)


def calibrate(c, schema, target_epsilon: float, delta: float, z_start: float, *,
              sampling_prob: Optional[float] = None, samples: int = DEFAULT_SAMPLES,
              failure_probability: float = DEFAULT_FAILURE_PROBABILITY,
              seed: Optional[int] = None, other_events: Sequence[Any] = (),
              ratio: float = 1.02, max_steps: int = 200) -> Dict[str, Any]:
  """The smallest z of the sweep z_start / ratio^i (i = 1, 2, …) before the first that fails
  (Dong & Ganesh 2026, arXiv:2602.09338, Alg. 5): with probability ≥ 1 − β its ε at δ is
  ≤ target. ``z_start`` must be valid without sampling (the unamplified calibration);
  None for z when the first step already fails. Draws are shared across z."""
  target = checks.positive_float(target_epsilon, "target_epsilon")
  delta, beta, samples, seed, pinned, pairs = _checked_run(
      c, schema, delta, failure_probability, samples, seed, sampling_prob)
  composed = _Composed(other_events) if other_events else None
  beta_each = beta / (2 * len(pairs))
  best, steps = None, 0
  z = float(z_start)
  for steps in range(1, max_steps + 1):
    z = z / ratio
    sets = _all_losses(pairs, z, samples, seed)
    if _upper(sets, target, beta_each, composed) > delta:
      break
    best = z
  return {"noise_multiplier": best, "failure_probability": beta, "samples": samples,
          "seed": seed, "seed_source": "pinned" if pinned else "os_entropy",
          "pairs": len(pairs), "pair": pairs[0].kind, "sweep_ratio": ratio,
          "sweep_steps": steps, "method": METHOD}
