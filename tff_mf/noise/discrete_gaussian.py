"""The discrete Gaussian on the integer encoder release (numpy core, no TensorFlow).

Canonne, Kamath, Steinke 2020 (CKS), arXiv:2004.00010. Round t releases the integer vector
Y_t = round(γ·(C·x)_t) + N_t, N_t i.i.d. N_ℤ(0, σ²) (Def. 1), γ the granularity; training
sees only s = C⁻¹·Y/γ, streamed from Y and earlier s (post-processing). For neighbours,
‖ΔY‖₂ ≤ Δ = γ·ζ·(1 + κ)·sens(C) + √(d·rows)·(1 + 2ε_f) (rounding moves each of the d·rows
touched coordinates by < 1, plus ε_f of float64 error), so with σ = z·γ·ζ the run is
ρ-zCDP with ρ = Δ²/(2σ²) (Thm 14), converted to (ε, δ) by Cor. 13. κ covers the sum x_t
as computed: the K records clipped and summed in float64, in any order, so one record moves
the computed sum by at most ζ·(1 + κ) (``clip_allowance``; Higham 2002, Sec 4.2). The
sampler is Alg. 1-3 (discrete Laplace proposal, Bernoulli acceptance), vectorized, in
floating point. ``plan`` refuses a γ at which some K records clipped to ζ could fail a round's
range checks (γ·|C·x| ≤ 2⁴⁰, |Y| < 2⁵²): a halt that depends on the data is a release the
accounting does not cover.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Optional, Tuple

import numpy as np
from scipy import optimize

from tff_mf import checks
from tff_mf import entropy

DISTRIBUTIONS = ("gaussian", "discrete_gaussian")
# Mechanisms whose C-domain encoder streams with small state (C = I; b-banded C).
MECHANISMS = ("gaussian", "banded", "banded_toeplitz")
# The sensitivity is accounted at sens·(1 + ROUNDING_INFLATION): the default granularity
# keeps the share of the rounding and of κ (``clip_allowance``) below it, and a given one is
# refused above it.
ROUNDING_INFLATION = 1e-3
# Per coordinate, γ·Σ_j |C_tj|·|x_j| must stay below this (refused in the round otherwise):
# it bounds the float64 error ε_f of computing γ·(C·x)_t (``float_allowance``).
MAGNITUDE_LIMIT = 2.0**40
# |Y| stays below this: Y (int64) converts to float64 exactly for s = C⁻¹·Y/γ.
INTEGER_LIMIT = 2.0**52
# The samplers' largest |N| per unit of the proposal scale t: a geometric draw is
# ⌊−t·log(1 − u)⌋ with u a float64 in [0, 1), so 1 − u ≥ 2⁻⁵³ and each draw is at most
# t·53·log 2 (``noise_bound``): a hard bound, not a tail.
NOISE_REACH = 53.0 * math.log(2.0)
# Rejection rounds before the sampler gives up with an error (never reached in practice:
# each round accepts a fixed fraction of the pending coordinates).
MAX_ATTEMPTS = 10_000
_UNIT_ROUNDOFF = 2.0**-53
# The fewest records per round a run's plan covers (``records_covered``; the summation term
# of ``clip_allowance`` is then about 2⁻²⁰): balls-in-bins and random allocation put a random
# number of clients in a round, not the K the mean divides by.
RECORDS_FLOOR = 2**16


def float_allowance(bands: int) -> float:
  """ε_f: the float64 error of γ·Σ_{j} C_tj·x_j over ``bands`` terms when every
  γ·Σ|C_tj|·|x_j| ≤ ``MAGNITUDE_LIMIT`` (Higham 2002, Sec 3.1: (b+1)·u·Σ|terms|, u = 2⁻⁵³)."""
  b = checks.positive_int(bands, "bands")
  return (b + 1) * _UNIT_ROUNDOFF * MAGNITUDE_LIMIT * (1.0 + 1e-6)


def touched_rows(bands: int, participations: int, n: int) -> int:
  """Rows of a b-banded C that one user's k participations touch: at most min(n, k·b)."""
  return min(int(n), int(participations) * int(bands))


def noise_bound(sigma: float) -> int:
  """The largest |N| either sampler (``candidates``, ``tff_mf.tf.noise.discrete_gaussian_row``)
  can return at σ: both geometrics lie in [0, t·``NOISE_REACH``] (10⁻⁶ slack for log1p)."""
  return int(math.floor(proposal_scale(sigma) * NOISE_REACH * (1.0 + 1e-6))) + 1


def row_sum(encoder: np.ndarray) -> float:
  """max_t Σ_j |C_tj| of a b-banded C, over its band table as the release reads it."""
  return float(np.max(np.sum(np.abs(band_coefficients(encoder)), axis=1)))


def worst_magnitude(granularity: float, clip_norm: float, records: int, model_size: int,
                    bands: int, encoder_row_sum: float) -> float:
  """The largest γ·max_i Σ_j |C_tj|·|x_j,i| the release's in-round check can compute when each
  x_j is a float64 sum of at most K = ``records`` records clipped to ζ (in any order): a
  coordinate of x_j is at most K·ζ·(1 + κ) (``clip_allowance``), and forming the b-term sum
  and its product with γ in float64 errs by at most γ_{b+2} (Higham 2002, Lemma 3.1)."""
  k = checks.positive_int(records, "records")
  return (granularity * clip_norm * k * (1.0 + clip_allowance(model_size, k)) * encoder_row_sum
          * (1.0 + _gamma_n(int(bands) + 2)) * (1.0 + 1e-9))


def _gamma_n(m: int) -> float:
  """γ_m = m·u/(1 − m·u) (Higham 2002, Lemma 3.1), ∞ where m·u ≥ 1/2."""
  mu = m * _UNIT_ROUNDOFF
  return math.inf if mu >= 0.5 else mu / (1.0 - mu)


def clip_allowance(model_size: int, records: int) -> float:
  """κ: one record moves a round's computed float64 sum by at most ζ·(1 + κ).

  Clipping a d-entry record in float64 (its squares summed in any order, one sqrt, the
  factor ζ·min(1/‖x‖, 1/ζ), d products) leaves ‖x̂_k‖ ≤ ζ·(1 + κ_c),
  1 + κ_c = (1 + u)⁴/((1 − u)²·√(1 − γ_2d)), u = 2⁻⁵³. Summing K records in any order errs
  by ‖fl(Σ_k x̂_k) − Σ_k x̂_k‖₂ ≤ γ_{K−1}·Σ_k‖x̂_k‖ (Higham 2002, Sec 4.2: γ_{K−1}·Σ_k|x̂_k,i|
  per coordinate), so two neighbours' computed sums (K and K − 1 records, or K each)
  differ by at most ζ·(1 + κ_c)·(1 + 2·K·γ_{K−1}) = ζ·(1 + κ) (with 10⁻⁶ relative slack for
  evaluating κ). Rounds without the user sum the same records in the same order: equal."""
  d = checks.positive_int(model_size, "model size")
  k = checks.positive_int(records, "records")
  g = _gamma_n(2 * d)
  if not g < 1.0:
    return math.inf
  u = _UNIT_ROUNDOFF
  clip = math.expm1(4.0 * math.log1p(u) - 2.0 * math.log1p(-u) - 0.5 * math.log1p(-g))
  summation = 2.0 * k * _gamma_n(k - 1)
  return (clip + summation + clip * summation) * (1.0 + 1e-6)


def records_covered(clients_per_round: float) -> int:
  """The most records a run's round may sum: K clients and as many planted canary updates (a
  one-run audit plants at most K a round), and at least ``RECORDS_FLOOR``."""
  k = checks.positive_float(clients_per_round, "clients_per_round")
  return max(2 * math.ceil(k), RECORDS_FLOOR)


def integer_sensitivity(sensitivity: float, clip_norm: float, granularity: float,
                        model_size: int, rows: int, bands: int, records: int) -> float:
  """Δ = γ·ζ·(1 + κ)·sens + √(d·rows)·(1 + 2ε_f): ‖ΔY‖₂ of neighbours (module docstring),
  κ = ``clip_allowance`` of ``records`` (K) per round."""
  return (granularity * clip_norm * (1.0 + clip_allowance(model_size, records)) * sensitivity
          + math.sqrt(model_size * rows) * (1.0 + 2.0 * float_allowance(bands)))


def default_granularity(sensitivity: float, clip_norm: float, model_size: int, rows: int,
                        bands: int, records: int) -> float:
  """The smallest power of two γ whose inflation (rounding and κ) is at most
  ROUNDING_INFLATION (a power of two: Y/γ is exact in float64)."""
  room = ROUNDING_INFLATION - clip_allowance(model_size, records)
  if not room > 0.0:
    raise checks.CheckError(
        f"{records} records per round of a {model_size}-entry model: float64 clipping and "
        f"summation alone inflate the sensitivity by {clip_allowance(model_size, records):.3g}, "
        f"above the {ROUNDING_INFLATION:g} accounted")
  need = (math.sqrt(model_size * rows) * (1.0 + 2.0 * float_allowance(bands))
          / (room * clip_norm * sensitivity))
  return 2.0 ** math.ceil(math.log2(need))


@dataclasses.dataclass(frozen=True)
class Plan:
  """The integer release of one run: what the stream and the query add, checked.

  Attributes:
    granularity: γ, integer units per unit of x.
    sigma: σ = z·γ·ζ of N_ℤ(0, σ²), integer units.
    integer_sensitivity: Δ (``integer_sensitivity``).
    inflation: Δ/(γ·ζ·sens) − 1 ≤ ROUNDING_INFLATION.
    model_size, rows, bands: d, rows touched, bands of C.
    records: K, the most records one round sums (the query refuses more).
    clip_allowance: κ of d and K (``clip_allowance``), part of the inflation.
    row_sum: max_t Σ_j |C_tj| of the C it was checked for (``row_sum``); a release of a C
      with a larger one is refused.
  """
  granularity: float
  sigma: float
  integer_sensitivity: float
  inflation: float
  model_size: int
  rows: int
  bands: int
  records: int
  clip_allowance: float
  row_sum: float

  def as_dict(self):
    return dataclasses.asdict(self)


def plan(*, sensitivity: float, clip_norm: float, noise_multiplier: float, model_size: int,
         bands: int, participations: int, n: int, records: int, encoder: np.ndarray,
         granularity: Optional[float] = None, flag: str = "granularity") -> Plan:
  """The checked ``Plan`` for sums of at most ``records`` clipped records a round through the
  b-banded ``encoder`` C: γ given or ``default_granularity``; CheckError (one line) when its
  inflation exceeds ROUNDING_INFLATION, or when some sums of K records clipped to ζ could fail
  a round's range checks (γ·|C·x| ≤ 2⁴⁰, |Y| < 2⁵²): a refusal in the round would depend on
  the data, a release the accounting does not cover, so it is refused here for the worst
  case (``worst_magnitude``, ``noise_bound``)."""
  sens = checks.positive_float(sensitivity, "sensitivity")
  zeta = checks.positive_float(clip_norm, "clip_norm")
  z = checks.positive_float(noise_multiplier, "noise_multiplier")
  d = checks.positive_int(model_size, "model size")
  b = checks.positive_int(bands, "bands")
  k = checks.positive_int(records, "records")
  found_bands = band_coefficients(encoder).shape[1]
  if found_bands != b:
    raise checks.CheckError(f"the plan is for {b} bands, the encoder C has {found_bands}")
  reach = row_sum(encoder)
  rows = touched_rows(b, checks.positive_int(participations, "participations"), n)
  kappa = clip_allowance(d, k)
  gamma = (default_granularity(sens, zeta, d, rows, b, k) if granularity is None
           else checks.positive_float(granularity, flag))
  delta = integer_sensitivity(sens, zeta, gamma, d, rows, b, k)
  inflation = delta / (gamma * zeta * sens) - 1.0
  if inflation > ROUNDING_INFLATION:
    raise checks.CheckError(
        f"{flag} {gamma:g} inflates the sensitivity by {inflation:.3g} for rounding at model "
        f"size {d}, above the {ROUNDING_INFLATION:g} accounted: give at least "
        f"{default_granularity(sens, zeta, d, rows, b, k):g} or leave it out",
        arguments=(flag,))
  sigma = z * gamma * zeta
  # |Y| ≤ round(γ·|C·x|) + |N| ≤ 2⁴⁰·(1 + 10⁻⁶) + 1 + noise_bound(σ) once the first check passed.
  if MAGNITUDE_LIMIT * (1.0 + 1e-6) + 1.0 + noise_bound(sigma) >= INTEGER_LIMIT:
    raise checks.CheckError(
        f"{flag} {gamma:g} with noise_multiplier {z:g}: the noise (sigma {sigma:.3g} integer "
        f"units) would leave the range where the integer release converts to float64 exactly "
        f"(2^52); use a smaller {flag}", arguments=(flag,))
  worst = worst_magnitude(gamma, zeta, k, d, b, reach)
  if worst > MAGNITUDE_LIMIT:
    top = 2.0 ** math.floor(math.log2(gamma * MAGNITUDE_LIMIT / worst))
    fits = (integer_sensitivity(sens, zeta, top, d, rows, b, k) / (top * zeta * sens) - 1.0
            <= ROUNDING_INFLATION)
    remedy = (f"use {flag} {top:g} or less" if fits else
              f"no {flag} keeps both this and the rounding within bounds (rounding needs at "
              f"least {default_granularity(sens, zeta, d, rows, b, k):g}): use a smaller model, "
              f"fewer bands or fewer records a round")
    raise checks.CheckError(
        f"{flag} {gamma:g}: {k} records a round clipped to {zeta:g} can reach "
        f"gamma*zeta*records*max_t sum_j|C_tj| = {worst:.4g}, above the 2^40 the round checks, "
        f"so a round's data could halt the run; {remedy}", arguments=(flag,))
  return Plan(granularity=float(gamma), sigma=float(sigma), integer_sensitivity=float(delta),
              inflation=float(inflation), model_size=d, rows=rows, bands=b, records=k,
              clip_allowance=float(kappa), row_sum=reach)


# ----------------------------------------------------------------------------- accounting


# The smallest ρ accounted (a ρ below it is accounted as RHO_FLOOR: an upper bound).
RHO_FLOOR = 1e-300


def rho(noise_multiplier: float, sensitivity: float,
        rounding_sensitivity: Optional[float] = None) -> float:
  """ρ = (sens + η·sens_R)² / (2z²): Thm 14 with Δ/σ ≤ (sens + η·sens_R)/z, η = ROUNDING_INFLATION.

  ``plan`` keeps the whole run's rounding term below η·γ·ζ·sens_R, sens_R its sensitivity
  (the default, ``sensitivity``). A prefix of the run rounds a subset of those coordinates,
  so its rounding term has the same bound: pass the run's sensitivity as sens_R there."""
  extra = sensitivity if rounding_sensitivity is None else rounding_sensitivity
  ratio = (sensitivity + ROUNDING_INFLATION * extra) / noise_multiplier
  # inf where z underflows, never an OverflowError; at least RHO_FLOOR where z is huge (a
  # larger ρ is still a valid bound, and ε grows with ρ): an underflow never makes ε 0.
  return max(0.5 * ratio * ratio, RHO_FLOOR)


def cor13_epsilon(rho_value: float, delta: float, alpha: float) -> float:
  """ε of ρ-zCDP at δ through order α > 1 (Cor. 13, solved for ε):
  αρ + log(1 − 1/α) − (log δ + log α)/(α − 1). Valid at every α > 1."""
  return (alpha * rho_value + math.log1p(-1.0 / alpha)
          - (math.log(delta) + math.log(alpha)) / (alpha - 1.0))


def cor13_delta(rho_value: float, epsilon: float, alpha: float) -> float:
  """δ of ρ-zCDP at ε through order α (Cor. 13): e^{(α−1)(αρ−ε)}/(α−1)·(1 − 1/α)^α."""
  return math.exp((alpha - 1.0) * (alpha * rho_value - epsilon) - math.log(alpha - 1.0)
                  + alpha * math.log1p(-1.0 / alpha))


def zcdp_epsilon(rho_value: float, delta: float) -> Tuple[float, float]:
  """(ε, α): ρ-zCDP as (ε, δ)-DP by Cor. 13 at the order α found by a bounded search over
  log(α − 1) (any α gives an upper bound; the search only tightens it). The ε returned is
  Cor. 13's at α plus the float64 error of evaluating it (``_cor13_slack``), so never below
  the bound; 0 only where that sum is ≤ 0, i.e. Cor. 13 at α proves (0, δ)-DP. ρ = ∞ (z
  underflowed): ε = ∞; a ρ below ``RHO_FLOOR`` is accounted as RHO_FLOOR."""
  delta = checks.delta(delta)
  if rho_value == math.inf:
    return math.inf, math.inf
  rho_value = max(checks.finite_float(rho_value, "rho"), RHO_FLOOR)
  f = lambda u: cor13_epsilon(rho_value, delta, 1.0 + math.exp(u))
  # The minimizer is near α ≈ 1 + √(log(1/δ)/ρ); search around it.
  centre = math.log(math.sqrt(-math.log(delta) / rho_value) + 1e-9)  # 1/δ may overflow
  found = optimize.minimize_scalar(f, bounds=(centre - 12.0, centre + 12.0), method="bounded",
                                   options={"xatol": 1e-10})
  alpha = 1.0 + math.exp(float(found.x))
  bound = cor13_epsilon(rho_value, delta, alpha) + _cor13_slack(rho_value, delta, alpha)
  if math.isnan(bound):  # never read as a certified 0
    return math.inf, math.inf
  return (bound if bound > 0.0 else 0.0), alpha


def _cor13_slack(rho_value: float, delta: float, alpha: float) -> float:
  """An upper bound on the float64 error of ``cor13_epsilon`` at α: 16 unit roundoffs of each
  term's magnitude (each term is a few correctly rounded operations)."""
  terms = (alpha * rho_value + abs(math.log1p(-1.0 / alpha))
           + (abs(math.log(delta)) + abs(math.log(alpha))) / (alpha - 1.0))
  return 16.0 * _UNIT_ROUNDOFF * terms + 1e-300


def epsilon(noise_multiplier: float, delta: float, sensitivity: float,
            rounding_sensitivity: Optional[float] = None) -> float:
  """ε at δ of a run adding N_ℤ(0, (z·γ·ζ)²) to the integer release of C with sens
  (``rounding_sensitivity``: as for ``rho``)."""
  z = checks.noise_multiplier(noise_multiplier, allow_zero=True)
  if z == 0.0:
    return math.inf
  return zcdp_epsilon(rho(z, sensitivity, rounding_sensitivity), delta)[0]


def calibrate(target_epsilon: float, delta: float, sensitivity: float,
              rtol: float = 1e-3) -> float:
  """The smallest z (within ``rtol``, rounded up) whose ``epsilon`` is at most the target
  (ε decreases in z)."""
  target = checks.positive_float(target_epsilon, "target_epsilon")
  rtol = checks.in_range(rtol, "tolerance", 0.0, 1.0, low_open=True, high_open=True)
  lo, hi = 1e-3, 1.0
  while epsilon(hi, delta, sensitivity) > target:
    lo, hi = hi, hi * 2.0
    if hi > 1e9:
      raise checks.CheckError(f"target_epsilon {target} is out of reach")
  while hi / lo > 1.0 + rtol:
    mid = math.sqrt(lo * hi)
    if epsilon(mid, delta, sensitivity) > target:
      lo = mid
    else:
      hi = mid
  return hi


# ----------------------------------------------------------------------------- the distribution


def pmf(sigma: float, support: np.ndarray) -> np.ndarray:
  """N_ℤ(0, σ²) at the integers ``support`` (Def. 1), normalized over |x| ≤ 60σ + 60."""
  sigma = checks.positive_float(sigma, "sigma")
  top = int(60 * sigma + 60)
  grid = np.arange(-top, top + 1, dtype=np.float64)
  norm = np.sum(np.exp(-grid**2 / (2 * sigma**2)))
  x = np.asarray(support, dtype=np.float64)
  return np.exp(-x**2 / (2 * sigma**2)) / norm


def variance(sigma: float) -> float:
  """Var of N_ℤ(0, σ²) (≤ σ², CKS Cor. 9), summed over |x| ≤ 60σ + 60."""
  top = int(60 * sigma + 60)
  grid = np.arange(-top, top + 1, dtype=np.float64)
  return float(np.sum(grid**2 * pmf(sigma, grid)))


def proposal_scale(sigma: float) -> int:
  """t = ⌊σ⌋ + 1, the discrete Laplace scale of Alg. 3."""
  return int(math.floor(sigma)) + 1


def candidates(u: np.ndarray, sigma: float) -> Tuple[np.ndarray, np.ndarray]:
  """(values, accepted) from uniforms ``u`` [3, k] in [0, 1): a discrete Laplace draw as the
  difference of two geometrics (P(G ≥ j) = e^{−j/t}), accepted with probability
  exp(−(|Y| − σ²/t)²/(2σ²)) (Alg. 3); accepted values are N_ℤ(0, σ²)."""
  t = proposal_scale(sigma)
  g1 = np.floor(-t * np.log1p(-u[0]))
  g2 = np.floor(-t * np.log1p(-u[1]))
  y = g1 - g2
  accept = u[2] < np.exp(-(np.abs(y) - sigma**2 / t)**2 / (2.0 * sigma**2))
  return y.astype(np.int64), accept


def _generator(key: Tuple[int, int], round_index: int, attempt: int) -> np.random.Generator:
  """Philox-4x64 keyed by the secret 128-bit key, its counter at (round, attempt): a
  counter-based stream, so a replayed round draws the same values."""
  counter = np.array([0, 0, attempt, round_index], dtype=np.uint64)
  return np.random.Generator(np.random.Philox(key=np.array(key, dtype=np.uint64),
                                              counter=counter))


def sample(key: Tuple[int, int], round_index: int, size: int, sigma: float) -> np.ndarray:
  """``size`` i.i.d. N_ℤ(0, σ²) (int64) of round ``round_index`` under the secret ``key``:
  rejection rounds over the pending coordinates until every one is accepted (an error after
  MAX_ATTEMPTS, never a truncated draw)."""
  sigma = checks.positive_float(sigma, "sigma")
  out = np.zeros(int(size), dtype=np.int64)
  pending = np.arange(int(size))
  for attempt in range(MAX_ATTEMPTS):
    if pending.size == 0:
      return out
    u = _generator(key, round_index, attempt).random((3, pending.size))
    y, accept = candidates(u, sigma)
    out[pending[accept]] = y[accept]
    pending = pending[~accept]
  raise RuntimeError(f"discrete Gaussian sampler: {pending.size} coordinates still pending "
                     f"after {MAX_ATTEMPTS} rejection rounds")


def seed_key(seed: int) -> Tuple[int, int]:
  """The Philox key of a 63-bit seed (the seed and a tag word)."""
  return (checks.seed(seed), 0x6467617573730000)  # "dgauss"


# ----------------------------------------------------------------------------- the encoder


def band_coefficients(c: np.ndarray) -> np.ndarray:
  """[n, b]: entry [t, k] = C[t, t − k] (0 where t < k) of a lower-triangular square C."""
  c = checks.matrix(c, "encoder C")
  n = c.shape[0]
  if c.shape != (n, n) or np.any(np.triu(c, 1)):
    raise checks.CheckError("the discrete Gaussian needs a square lower-triangular encoder C")
  rows, cols = np.nonzero(c)
  bands = int(np.max(rows - cols)) + 1
  out = np.zeros((n, bands))
  for k in range(bands):
    out[k:, k] = np.diagonal(c, -k)
  if np.any(out[:, 0] == 0):
    raise checks.CheckError("encoder C has a zero on its diagonal (singular)")
  return out


class IntegerRelease:
  """The numpy stream of the integer release: ``step(x_t)`` returns (s_t, Y_t).

  ``key``: the secret Philox key (``seed_key`` of a pinned seed); None draws one from OS
  entropy.

  State: the last b − 1 real sums x_j (float64: as secret as the seed, which regenerates
  the noise) and the last b − 1 outputs s_j. s_t is computed from Y_t and earlier s only.
  """

  def __init__(self, c: np.ndarray, run_plan: Plan, key: Optional[Tuple[int, int]] = None):
    self.bands_table = band_coefficients(c)
    self.n, self.b = self.bands_table.shape
    if self.b != run_plan.bands:
      raise checks.CheckError(f"the plan is for {run_plan.bands} bands, C has {self.b}")
    if not run_plan.inflation <= ROUNDING_INFLATION:  # what the record accounts for
      raise checks.CheckError(f"the plan's rounding inflation {run_plan.inflation:.3g} exceeds "
                              f"the {ROUNDING_INFLATION:g} accounted; build it with plan()")
    found = float(np.max(np.sum(np.abs(self.bands_table), axis=1)))
    if not found <= run_plan.row_sum:  # what plan()'s range check covered
      raise checks.CheckError(f"C's largest row sum {found:.6g} exceeds the {run_plan.row_sum:.6g} "
                              "the plan checked; build it with plan(encoder=C)")
    self.plan = run_plan
    # The secret Philox key: pinned (``seed_key``), else 126 bits of OS entropy (HKDF).
    self.key = key if key is not None else entropy.new_key_pair("discrete-gaussian-key")
    self.round_index = 0
    self._sums = []  # newest first
    self._outputs = []

  def step(self, x: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    t = self.round_index
    if t >= self.n:
      raise checks.CheckError(f"round {t} is past the n={self.n} rounds of this stream")
    x = np.array(x, dtype=np.float64).ravel()  # a copy: the state keeps it for b − 1 rounds
    if x.size != self.plan.model_size:
      raise checks.CheckError(f"the sum has {x.size} entries, the plan {self.plan.model_size}")
    if not np.all(np.isfinite(x)):  # NaN would pass the range checks and round to int64 min
      raise checks.CheckError(f"round {t}: the sum is not finite (NaN or Inf); nothing released")
    coef = self.bands_table[t]
    gamma = self.plan.granularity
    past = range(1, min(self.b, t + 1))
    a = coef[0] * x
    size = abs(coef[0]) * np.abs(x)
    for k in past:
      a += coef[k] * self._sums[k - 1]
      size += abs(coef[k]) * np.abs(self._sums[k - 1])
    if gamma * float(np.max(size)) > MAGNITUDE_LIMIT:
      raise checks.CheckError(f"round {t}: gamma * |C x| exceeds 2^40, where the float64 "
                              "allowance of the sensitivity holds: the sum is larger than the "
                              "plan's records clipped to clip_norm can make (plan())")
    y = np.rint(gamma * a).astype(np.int64) + sample(self.key, t, x.size, self.plan.sigma)
    if np.max(np.abs(y)) >= INTEGER_LIMIT:
      raise checks.CheckError(f"round {t}: the integer release left 2^52, where it converts to "
                              "float64 exactly; use a smaller granularity")
    s = y.astype(np.float64) / gamma
    for k in past:
      s -= coef[k] * self._outputs[k - 1]
    s /= coef[0]
    self._sums = ([x] + self._sums)[:self.b - 1]
    self._outputs = ([s] + self._outputs)[:self.b - 1]
    self.round_index = t + 1
    return s, y
