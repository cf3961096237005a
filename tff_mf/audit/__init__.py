"""Empirical privacy audit of a Gaussian matrix mechanism from its outputs (numpy core).

The audit runs a mechanism on two neighbouring datasets, with and without one
canary user, many times, and turns the two samples of a test statistic into an
empirical LOWER bound on ε at δ (and on the Gaussian-DP parameter μ) that holds
with probability at least 1 − α over the trials (Jagielski, Ullman, Oprea 2020,
arXiv:2006.07709; Nasr et al. 2023, arXiv:2302.07956; DP-Auditorium, Kong et al.
2023, arXiv:2307.05608). A bound above the claimed ε refutes the claim at that
confidence; a bound below it proves nothing about the claim (an audit never
certifies privacy).

Model (``docs/notation.md``). After undoing the server's workload, the release of
a residual-form matrix mechanism is X = G + σ·N·Z per model coordinate, N = A⁻¹·B
the per-round noise matrix the aggregator reports. In units of the clip norm a
canary contributing ±1 in the rounds of a pattern P shifts X by p = Σ_{t∈P} s_t e_t,
so X ~ N(p·1[canary], z²·N·Nᵀ), and the Neyman–Pearson optimal statistic is the
projection ⟨X, Σ⁻¹p⟩. Everything here is computed from N, z and the outputs, and
nothing from ``tff_mf.participation`` or ``tff_mf.accounting``: the canary's
pattern is the schema's worst by brute force, on the covariance estimated from
canary-free releases (``observed_canary``, so a fault the reported N hides still
draws the canary) or on N (``worst_canary``), and the Gaussian-DP conversions are
our own (Dong, Roth, Su 2019, arXiv:1905.02383, Cor 2.13; equal to Balle & Wang 2018,
arXiv:1805.06530, Thm 8).

One run (``one_run_epsilon``, ``one_run_audit``): m canaries each included with
probability 1/2 in a single run, the k_in highest scores guessed included and the k_out
lowest excluded (counts planned on a model, ``plan_one_run``), and the ε refuted by the
number of correct guesses (Steinke, Nasr, Jagielski 2023, arXiv:2305.08846, Thm 3.1), or
by its f-DP refinement, which tests the claimed trade-off curve itself (Mahloujifar, Melis,
Chaudhuri 2024, arXiv:2410.22235; ``one_run_fdp_refutes``).

Confidence. Every threshold t of the test "score > t" gets a one-sided Clopper–Pearson
upper bound on its false positive rate and on its false negative rate, all valid
simultaneously with probability ≥ 1 − α (``tradeoff_points``), so every point (FPR_hi,
FNR_hi) is an upper bound on a point of the mechanism's trade-off curve. A threshold with
c false positives has FPR ≤ U_(c+1), an order statistic of uniforms, so one event per
count covers every threshold the data could pick. α is split before the scores are seen
(``planned_thresholds``), from the claim's score laws and the numbers of trials:
EPSILON_SHARE (0.7) on bands of counts around those expected at the thresholds with the
largest expected ε bound at δ (half for each direction, split between the false-positive
and false-negative side as the plan expects best), their failure probability computed
exactly (``order_statistic_band_failure``); MU_SHARE (0.1) on the threshold with the
largest expected μ bound; the rest on every count by a union bound, so that score laws
the plan did not foresee (broken mechanisms) are still caught. Then
ε ≥ log((1 − FNR_hi − δ)/FPR_hi) (and the same with the roles exchanged), and the
mechanism is not μ'-GDP for μ' < Φ⁻¹(1 − FPR_hi) − Φ⁻¹(FNR_hi).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
import scipy.linalg
import scipy.optimize
import scipy.special
import scipy.stats

from tff_mf import checks
from tff_mf import registry

# Enumerated (pattern, sign vector) pairs at most, in ``worst_canary``.
ENUMERATION_LIMIT = 2_000_000
# Evenly spaced thresholds of ``threshold_grid``.
THRESHOLDS = 40
PLAN_SEED = 20231011
# Shares of the failure probability alpha (``planned_thresholds``): the ε-planned band, the
# μ-planned threshold; the rest goes to every count by a union bound.
EPSILON_SHARE = 0.7
MU_SHARE = 0.1
# Splits (false-positive share) of a planned threshold's budget that the plan tries.
PLAN_SPLITS = np.linspace(0.1, 0.9, 9)
# Counts in the band around the count expected at the ε-planned threshold, and the share
# of its weight spread evenly over them (the rest follows the binomial pmf).
BAND_WIDTH = 64
BAND_FLOOR = 0.2
# Order-statistic counts (false positives, false negatives) that get a larger share of
# the union bound.
TAIL_COUNTS = 32
# Ridge added to an estimated covariance, relative to its mean eigenvalue.
RIDGE = 1e-10
# δ' grid on which a violation of the claimed privacy profile is looked for.
DELTA_GRID = np.logspace(-12, math.log10(0.5), 80)
# The audit reports the smallest true μ / claimed μ it flags with this probability
# (``detectable_mu_ratio``), from this many fixed thresholds besides the planned ones.
POWER = 0.9
POWER_GRID = 48


# Noise kinds whose seed is drawn at every ``initialize`` (fresh seeds per run); TFF's tree
# fixes its seed when it is built.
AUDITABLE_NOISE = tuple(k.name for k in registry.NOISE_KIND_CLASSES.values() if k.auditable)

# Faults ``tff_mf.tf.audit.plant_fault`` plants in a copy of a mechanism (the audit's own
# check of its power); the last three sit away from the reported worst canary.
FAULTS = ("under_reported_sensitivity", "noise_divided", "repeated_noise_row",
          "schema_ignored", "repeated_noise_row_elsewhere", "noise_row_scaled",
          "noise_row_dropped")


def check_auditable(mechanism: str) -> str:
  """The canonical name of a mechanism the audit can run, or a one-line CheckError."""
  m = registry.mechanism(mechanism)
  if not m.private:
    raise checks.CheckError(f"mechanism {m.name!r} adds no noise: nothing to audit")
  if not m.trainable or not m.noise_kind.auditable:
    raise checks.CheckError(f"mechanism {m.name!r} cannot be audited: its noise seed is fixed "
                            f"when it is built or it cannot be trained (audit the "
                            f"{', '.join(AUDITABLE_NOISE)} noise kinds)")
  return m.name


@dataclasses.dataclass(frozen=True)
class AuditOptions:
  """How many trials, at what confidence.

  Attributes:
    trials: trials per world (with and without the canary).
    trials_per_run: trials packed into one run's coordinates (T).
    calibration_trials: extra canary-free trials that estimate Σ (0: reported Σ only).
    delta: δ of the reported ε lower bound.
    alpha: the bounds hold with probability ≥ 1 − alpha (false-alarm rate of a flag).
    others: "zero" or "random" updates of the other clients of each round.
    sampling_prob: None (the canary joins every round of its pattern), or p: it joins
      each round of its residue class with probability p (Poisson, min_sep only).
  """
  trials: int = 2048
  trials_per_run: int = 256
  calibration_trials: int = 1024
  delta: float = checks.DEFAULT_DELTA
  alpha: float = 0.01
  others: str = "zero"
  sampling_prob: Optional[float] = None

  def checked(self) -> "AuditOptions":
    if self.others not in ("zero", "random"):
      raise checks.CheckError(f"others must be 'zero' or 'random', got {self.others!r}")
    checks.positive_int(self.trials, "trials")
    checks.positive_int(self.trials_per_run, "trials_per_run")
    checks.nonnegative_int(self.calibration_trials, "calibration_trials")
    checks.delta(self.delta)
    checks.in_range(self.alpha, "alpha", 0.0, 0.5, low_open=True)
    if self.sampling_prob is not None:
      checks.probability(self.sampling_prob, "sampling_prob")
    return self


# ----------------------------------------------------------------------------- canary


def canary_patterns(kind: str, n: int, epochs: Optional[int] = None,
                    min_sep: Optional[int] = None,  # pylint: disable=redefined-outer-name
                    max_participations: Optional[int] = None) -> List[Tuple[int, ...]]:
  """Every non-empty set of rounds one user may join under the schema (enumerated here).

  ``single``: one round; ``fixed_epoch``: {j, j + n/k, …} (k = epochs); ``min_sep``:
  every set of ≤ k rounds pairwise ≥ b apart (subsets too: the canary's contributions
  are ±1, never 0); ``balls_in_bins`` (fixed bin): {j, j + n/k, …} as fixed_epoch;
  ``random_allocation``: one round in each of the k epochs of n/k rounds.
  """
  n = checks.positive_int(n, "rounds n")
  if kind == "single":
    return [(t,) for t in range(n)]
  if kind in ("fixed_epoch", "balls_in_bins"):
    k = checks.positive_int(epochs, "epochs")
    if n % k:
      raise checks.CheckError(f"{kind}: epochs={k} must divide n={n}")
    b = n // k
    return [tuple(range(j, n, b)) for j in range(b)]
  if kind == "min_sep":
    b = checks.positive_int(min_sep, "min_sep")
    k = -(-n // b) if max_participations is None else checks.positive_int(
        max_participations, "max_participations")
    out: List[Tuple[int, ...]] = []

    def extend(prefix: Tuple[int, ...], start: int) -> None:
      if prefix:
        out.append(prefix)
        if len(out) > ENUMERATION_LIMIT:
          raise checks.CheckError(f"min_sep(b={b}) has more than {ENUMERATION_LIMIT} patterns "
                                  f"at n={n}; audit fewer rounds")
      if len(prefix) < k:
        for t in range(start, n):
          extend(prefix + (t,), t + b)

    extend((), 0)
    return out
  if kind == "random_allocation":
    k = checks.positive_int(epochs, "epochs")
    if n % k:
      raise checks.CheckError(f"random_allocation: epochs={k} must divide n={n}")
    b = n // k
    if b ** k > ENUMERATION_LIMIT:
      raise checks.CheckError(f"random_allocation(k={k}) has {b ** k} patterns at n={n}, more than "
                              f"{ENUMERATION_LIMIT}; audit fewer rounds")
    return list(itertools.product(*(range(e * b, (e + 1) * b) for e in range(k))))
  raise checks.CheckError(f"unknown participation {kind!r}")


def precision_matrix(noise_matrix: np.ndarray) -> np.ndarray:
  """(N·Nᵀ)⁻¹ for the n x m per-round noise matrix N (full row rank)."""
  nm = checks.matrix(noise_matrix, "noise matrix N")
  cov = nm @ nm.T
  cov = 0.5 * (cov + cov.T)
  chol = scipy.linalg.cho_factor(cov, lower=True)
  prec = scipy.linalg.cho_solve(chol, np.eye(cov.shape[0]))
  return 0.5 * (prec + prec.T)


def worst_pattern(precision: np.ndarray,
                  patterns: Sequence[Tuple[int, ...]]) -> Dict[str, Any]:
  """The pattern P and signs s maximizing pᵀΣ⁻¹p, p = Σ_{t∈P} s_t e_t (brute force), for
  the precision Σ⁻¹ of the per-round release; ``value`` is the maximum (μ² of the best
  ±1 canary when Σ is in units of the canary's contribution)."""
  prec = np.asarray(precision, np.float64)
  n = prec.shape[0]
  total = sum(2 ** (len(p) - 1) for p in patterns)
  if total > ENUMERATION_LIMIT:
    raise checks.CheckError(f"{total} canary patterns and signs exceed {ENUMERATION_LIMIT}; "
                            "audit fewer rounds")
  best = (-math.inf, None, None)
  for size in sorted({len(p) for p in patterns}):
    idx = np.array([p for p in patterns if len(p) == size], dtype=np.int64)
    if idx.size and idx.max() >= n:
      raise checks.CheckError(f"pattern round {idx.max()} is past the n={n} rounds of N")
    signs = np.array([(1.0,) + s for s in itertools.product((1.0, -1.0), repeat=size - 1)])
    blocks = prec[idx[:, :, None], idx[:, None, :]]
    forms = np.einsum("si,pij,sj->ps", signs, blocks, signs)
    i, j = np.unravel_index(int(np.argmax(forms)), forms.shape)
    if forms[i, j] > best[0]:
      best = (float(forms[i, j]), tuple(int(t) for t in idx[i]), tuple(signs[j]))
  value, pattern, sign = best
  vector = np.zeros(n)
  vector[list(pattern)] = sign
  return {"pattern": list(pattern), "signs": [int(s) for s in sign], "vector": vector,
          "value": max(value, 0.0), "patterns_searched": total}


def worst_canary(noise_matrix: np.ndarray, patterns: Sequence[Tuple[int, ...]]) -> Dict[str, Any]:
  """``worst_pattern`` of the reported noise: Σ ∝ N·Nᵀ.

  ``sensitivity``, √ of the maximum, is the sensitivity of the released Gaussian
  mechanism for a canary whose update is ±(one fixed direction), i.e. the largest μ·z
  such a canary attains.
  """
  out = worst_pattern(precision_matrix(noise_matrix), patterns)
  out["sensitivity"] = math.sqrt(out["value"])
  return out


def observed_canary(calibration: np.ndarray,
                    patterns: Sequence[Tuple[int, ...]]) -> Dict[str, Any]:
  """``worst_pattern`` of the covariance estimated from canary-free releases (rows, in
  units of the canary's contribution): where the noise observed is weakest against a
  canary, whatever the mechanism reports. ``mu`` is the estimated μ there; the
  selection depends on these trials only, so a test on fresh trials keeps its level."""
  cov = estimated_covariance(calibration)
  if np.asarray(calibration).shape[0] <= cov.shape[0]:
    raise checks.CheckError(f"{np.asarray(calibration).shape[0]} calibration trials cannot "
                            f"estimate a {cov.shape[0]} x {cov.shape[0]} covariance")
  chol = scipy.linalg.cho_factor(cov, lower=True)
  prec = scipy.linalg.cho_solve(chol, np.eye(cov.shape[0]))
  out = worst_pattern(0.5 * (prec + prec.T), patterns)
  out.update(mu=math.sqrt(out["value"]), covariance=cov)
  return out


# ----------------------------------------------------------------------------- scores


def projection_scores(x: np.ndarray, shift: np.ndarray, cov: np.ndarray) -> np.ndarray:
  """⟨x, Σ⁻¹p⟩ / √(pᵀΣ⁻¹p) for each row x (trials x n): N(0, 1) vs N(√(pᵀΣ⁻¹p), 1)."""
  w = scipy.linalg.solve(cov, shift, assume_a="pos")
  return np.asarray(x, dtype=np.float64) @ w / math.sqrt(float(shift @ w))


def estimated_covariance(samples: np.ndarray) -> np.ndarray:
  """Sample covariance of held-out canary-free trials (rows), with a tiny ridge."""
  samples = np.asarray(samples, dtype=np.float64)
  centered = samples - samples.mean(axis=0)
  cov = centered.T @ centered / max(samples.shape[0] - 1, 1)
  ridge = RIDGE * max(float(np.trace(cov)) / cov.shape[0], 1e-300)
  return 0.5 * (cov + cov.T) + ridge * np.eye(cov.shape[0])


def mixture_log_likelihood_ratio(x: np.ndarray, rounds: Sequence[int], prob: float,
                                 cov: np.ndarray) -> np.ndarray:
  """log of Σ_S p^|S|(1−p)^(|R|−|S|) exp(⟨x, Σ⁻¹1_S⟩ − ½ 1_SᵀΣ⁻¹1_S) over S ⊆ R.

  The optimal statistic when the canary joins each round of R with probability p
  (Poisson sampling) and contributes +1 in the rounds it joins.
  """
  x = np.asarray(x, dtype=np.float64)
  n = cov.shape[0]
  rounds = list(rounds)
  subsets = np.array(list(itertools.product((0.0, 1.0), repeat=len(rounds))))
  vectors = np.zeros((len(subsets), n))
  vectors[:, rounds] = subsets
  w = scipy.linalg.solve(cov, vectors.T, assume_a="pos")  # n x S
  quad = np.einsum("ns,ns->s", vectors.T, w)
  k = subsets.sum(axis=1)
  log_prior = k * math.log(prob) + (len(rounds) - k) * math.log1p(-prob) if prob < 1 else \
      np.where(k == len(rounds), 0.0, -np.inf)
  return scipy.special.logsumexp(x @ w - 0.5 * quad + log_prior, axis=1)


# ----------------------------------------------------------------------------- Gaussian DP


def gdp_delta(mu: float, eps: float) -> float:
  """δ(ε) of μ-GDP: Φ(−ε/μ + μ/2) − e^ε Φ(−ε/μ − μ/2) (Dong, Roth, Su Cor 2.13)."""
  if mu <= 0:
    return 0.0
  a = scipy.special.log_ndtr(-eps / mu + mu / 2)
  b = eps + scipy.special.log_ndtr(-eps / mu - mu / 2)
  return float(math.exp(a) * -math.expm1(min(b - a, 0.0)))


def gdp_epsilon(mu: float, delta: float) -> float:
  """The smallest ε with δ(ε) ≤ δ for μ-GDP (bisection on ``gdp_delta``)."""
  if mu <= 0 or gdp_delta(mu, 0.0) <= delta:
    return 0.0
  hi = 1.0
  while gdp_delta(mu, hi) > delta:
    hi *= 2.0
  return float(scipy.optimize.brentq(lambda e: gdp_delta(mu, e) - delta, 0.0, hi,
                                     xtol=1e-12, rtol=1e-12))


def gdp_tradeoff(mu: float, alpha: np.ndarray) -> np.ndarray:
  """The μ-GDP trade-off curve β = Φ(Φ⁻¹(1 − α) − μ)."""
  return scipy.stats.norm.cdf(scipy.stats.norm.ppf(1.0 - np.asarray(alpha)) - mu)


# ----------------------------------------------------------------------------- bounds


def clopper_pearson_upper(k: np.ndarray, trials: int, alpha: float) -> np.ndarray:
  """One-sided (1 − alpha) Clopper–Pearson upper bound on a binomial rate, k successes."""
  k = np.asarray(k, dtype=np.float64)
  out = scipy.stats.beta.ppf(1.0 - alpha, k + 1, trials - k)
  return np.where(k >= trials, 1.0, out)


def clopper_pearson_lower(k: np.ndarray, trials: int, alpha: float) -> np.ndarray:
  """One-sided (1 − alpha) Clopper–Pearson lower bound on a binomial rate, k successes."""
  k = np.asarray(k, dtype=np.float64)
  out = scipy.stats.beta.ppf(alpha, k, trials - k + 1)
  return np.where(k <= 0, 0.0, out)


def threshold_grid(mu_reference: float, count: int = THRESHOLDS) -> np.ndarray:
  """Evenly spaced thresholds for a score that is N(0, 1) without and N(μ, 1) with the
  canary (a simple plan; ``planned_thresholds`` is the audit's)."""
  mu = min(max(float(mu_reference), 0.0), 50.0)
  return np.linspace(-2.0, mu + 4.0, count)


def gaussian_model(mu_reference: float, draws: int = 400_000) -> Tuple[np.ndarray, np.ndarray]:
  """Model scores N(0, 1) and N(μ, 1) (fixed seed), for ``planned_thresholds``."""
  rng = np.random.default_rng(PLAN_SEED)
  mu = min(max(float(mu_reference), 0.0), 50.0)
  return rng.standard_normal(draws), rng.standard_normal(draws) + mu


def order_statistic_band_failure(trials: int, first: int, levels: np.ndarray) -> float:
  """P(U_(j) > b_j for some j = first + 1, …, first + len(levels)), exactly.

  U_(j) is the j-th smallest of ``trials`` independent uniforms and b_j the one-sided
  (1 − levels[j − first − 1]) Clopper–Pearson upper bound at j − 1 successes (the
  Beta(j, trials − j + 1) quantile). A rate bounded at count c is at most U_(c+1) (the
  probability integral transform of the (c+1)-th order statistic), so this is the
  probability that any of the band's bounds fails: the union bound's Σ levels without
  its slack for the strongly dependent neighbouring counts. Dynamic programming on
  N(b_j) = #{U ≤ b_j}, which must stay ≥ j (the boundary-crossing recursion of Steck
  1971, Ann. Math. Statist. 42(1)); states ≥ the last j are absorbed.
  """
  levels = np.asarray(levels, np.float64)
  j = first + 1 + np.arange(levels.size)
  b = np.where(j > trials, 1.0, scipy.stats.beta.isf(levels, j, np.maximum(trials - j + 1, 1)))
  # U_(j) ≤ b_i for some i > j is implied by U_(i) ≤ b_i: the effective boundary is the
  # running minimum from the right (the same event, and nondecreasing).
  b = np.minimum.accumulate(b[::-1])[::-1]
  last = int(j[-1])
  states = np.arange(first + 1, last)  # N(b) exactly; N(b) ≥ last is absorbed
  prob = scipy.stats.binom.pmf(states, trials, b[0])
  prob[states < j[0]] = 0.0
  good = float(scipy.stats.binom.sf(last - 1, trials, b[0]))
  for step in range(1, levels.size):
    p = min(max((b[step] - b[step - 1]) / (1.0 - b[step - 1]), 0.0), 1.0) if b[step - 1] < 1 else 0.0
    rest = trials - states
    move = _binomial_pmf(states[None, :] - states[:, None], rest[:, None], p)
    good += float(prob @ scipy.stats.binom.sf(last - 1 - states, rest, p))
    prob = prob @ move
    prob[states < j[step]] = 0.0
  return float(max(0.0, 1.0 - good - prob.sum()))


def _binomial_pmf(k: np.ndarray, n: np.ndarray, p: float) -> np.ndarray:
  """Binomial(n, p) pmf at k (0 outside 0..n), from log-gamma (vectorized, fast)."""
  k, n = np.broadcast_arrays(np.asarray(k, np.float64), np.asarray(n, np.float64))
  inside = (k >= 0) & (k <= n)
  kk, nn = np.where(inside, k, 0.0), np.where(inside, n, 0.0)
  with np.errstate(divide="ignore", invalid="ignore"):
    log = (scipy.special.gammaln(nn + 1) - scipy.special.gammaln(kk + 1)
           - scipy.special.gammaln(nn - kk + 1) + scipy.special.xlogy(kk, p)
           + scipy.special.xlog1py(nn - kk, -p))
  return np.where(inside, np.exp(log), 0.0)


def calibrated_band(trials: int, first: int, weights: np.ndarray, budget: float) -> np.ndarray:
  """Levels c·weights with ``order_statistic_band_failure`` ≤ budget (c as large as a few
  proportional steps find; the returned levels always meet the budget)."""
  w = np.asarray(weights, np.float64) / np.sum(weights)
  scale = budget
  for _ in range(8):
    fail = order_statistic_band_failure(trials, first, np.minimum(scale * w, 0.5))
    if fail <= budget and fail >= 0.995 * budget:
      break
    scale *= 0.999 * budget / max(fail, 1e-300)
  while order_statistic_band_failure(trials, first, np.minimum(scale * w, 0.5)) > budget:
    scale *= 0.99
  return np.minimum(scale * w, 0.5)


@dataclasses.dataclass(frozen=True)
class Plan:
  """The audit's confidence plan, fixed before its scores are seen (``planned_thresholds``).

  Attributes:
    thresholds: planned thresholds (ε forward, ε reverse, μ).
    fp_levels, fn_levels: their Clopper–Pearson levels (false positive rate upper bound;
      false negative rate upper bound).
    fp_count_levels: (trials0 + 1,) level of the false-positive-rate bound of every
      threshold with c false positives (every threshold the data allow).
    fn_count_levels: (trials1 + 1,) the same for c false negatives.
    alpha: the total failure probability the levels spend.
  """
  thresholds: np.ndarray
  fp_levels: np.ndarray
  fn_levels: np.ndarray
  fp_count_levels: np.ndarray
  fn_count_levels: np.ndarray
  alpha: float


def _count_windows(trials: int, rate: np.ndarray, width: float = 10.0):
  """Binomial(trials, rate) pmfs on windows of counts (one row per rate) and the counts
  (log-gamma pmfs: exact at rates of 0, 1 or 1e-300)."""
  rate = np.asarray(rate, np.float64)
  sd = np.sqrt(trials * rate * (1 - rate)) + 1.0
  lo = np.clip(np.floor(trials * rate - width * sd - 5), 0, trials).astype(np.int64)
  span = int(np.max(np.ceil(2 * width * sd + 11)))
  counts = lo[:, None] + np.arange(span)[None, :]
  pmf = _binomial_pmf(counts, np.full(counts.shape, trials), rate[:, None])
  return np.minimum(counts, trials), pmf


def _best_planned_threshold(model0, model1, trials0, trials1, budget, delta, target):
  """The candidate threshold and split (fp level, fn level) of ``budget`` with the largest
  expected bound (ε at δ, or μ) under the model's score laws, exact binomial counts."""
  m0, m1 = np.sort(model0), np.sort(model1)
  candidates = np.unique(np.quantile(np.concatenate([m0, m1]), np.linspace(0.0005, 0.9995, 600)))
  q0 = 1.0 - np.searchsorted(m0, candidates, side="right") / len(m0)
  q1 = 1.0 - np.searchsorted(m1, candidates, side="right") / len(m1)
  c0, p0 = _count_windows(trials0, q0)
  c1, p1 = _count_windows(trials1, 1.0 - q1)  # false negatives
  best = (-math.inf, 0.0, budget / 2, budget / 2)
  with np.errstate(divide="ignore", invalid="ignore"):
    for f in PLAN_SPLITS:
      fpr_hi = clopper_pearson_upper(np.arange(trials0 + 1), trials0, f * budget)
      fnr_hi = clopper_pearson_upper(np.arange(trials1 + 1), trials1, (1 - f) * budget)
      if target == "epsilon":
        g0, g1 = -np.log(fpr_hi), np.log(np.maximum(1.0 - fnr_hi - delta, 1e-300))
      else:
        g0, g1 = scipy.stats.norm.isf(fpr_hi), -scipy.stats.norm.ppf(fnr_hi)
      value = (p0 * np.clip(g0, -50, 50)[c0]).sum(1) + (p1 * np.clip(g1, -50, 50)[c1]).sum(1)
      i = int(np.argmax(value))
      if value[i] > best[0]:
        best = (float(value[i]), float(candidates[i]), f * budget, (1 - f) * budget)
  return best[1:]


def _band_levels(trials: int, rate: float, budget: float) -> Tuple[int, np.ndarray]:
  """A band of BAND_WIDTH counts around Binomial(trials, rate)'s mode, levels weighted by
  its pmf (BAND_FLOOR of the weight spread evenly), calibrated exactly to ``budget``."""
  width = min(BAND_WIDTH, trials + 1)
  first = int(min(max(round(trials * rate) - width // 2, 0), trials + 1 - width))
  counts = first + np.arange(width)
  pmf = scipy.stats.binom.pmf(counts, trials, rate)
  pmf = pmf / pmf.sum() if pmf.sum() > 0 else np.full(width, 1.0 / width)
  weights = (1 - BAND_FLOOR) * pmf + BAND_FLOOR / width
  return first, calibrated_band(trials, first, weights, budget)


def planned_thresholds(model0: np.ndarray, model1: np.ndarray, trials0: int, trials1: int,
                       alpha: float, delta: float, epsilon_share: float = EPSILON_SHARE,
                       mu_share: float = MU_SHARE) -> Plan:
  """How the audit spends its failure probability alpha, fixed before its scores are seen.

  From the model's score laws (samples ``model0``/``model1``, the claim's or the
  release's, never the audit's data) and the numbers of trials:

  - EPSILON_SHARE of alpha: the threshold t_ε with the largest expected ε lower bound at
    δ (exact binomial counts), and the split of this share between its false-positive
    and false-negative bounds that maximizes it. Each side's share is a band of
    BAND_WIDTH counts around the count expected at t_ε (``_band_levels``), so the bound
    holds for every threshold whose count falls there, calibrated exactly
    (``order_statistic_band_failure``): nearby counts cost little more than one;
  - MU_SHARE: the threshold with the largest expected μ lower bound, one bound per side;
  - the rest: every count of every side, by a union bound over order statistics
    (``_order_levels``), so that score laws the plan did not foresee are still caught.

  ``epsilon_share`` and ``mu_share`` change the first two shares (their sum below 1): the
  ε and μ bounds share one alpha, so more on one loosens the other.
  """
  if not (epsilon_share > 0 and mu_share > 0 and epsilon_share + mu_share < 1):
    raise checks.CheckError(f"shares of alpha {epsilon_share:g} (epsilon) and {mu_share:g} "
                            "(mu) must be positive with a sum below 1")
  m0, m1 = np.asarray(model0, np.float64), np.asarray(model1, np.float64)
  union = (1 - epsilon_share - mu_share) * alpha / 2
  levels = [_order_levels(np.arange(t + 1), t, union, "low") for t in (trials0, trials1)]
  windows = []  # (side: 0 false positives, 1 false negatives; expected rate; budget)
  # Forward: log((1 − FNR − δ)/FPR) at t; reverse: log((1 − FPR − δ)/FNR), the forward
  # bound of the negated scores with the worlds exchanged (false negatives ↔ positives).
  t_fwd, fp_fwd, fn_fwd = _best_planned_threshold(m0, m1, trials0, trials1,
                                                  epsilon_share * alpha / 2, delta, "epsilon")
  windows += [(0, np.mean(m0 > t_fwd), fp_fwd), (1, np.mean(m1 <= t_fwd), fn_fwd)]
  t_rev, fn_rev, fp_rev = _best_planned_threshold(-m1, -m0, trials1, trials0,
                                                  epsilon_share * alpha / 2, delta, "epsilon")
  windows += [(1, np.mean(m1 < -t_rev), fn_rev), (0, np.mean(m0 >= -t_rev), fp_rev)]
  for side, rate, budget in windows:
    trials = (trials0, trials1)[side]
    first, band = _band_levels(trials, float(rate), budget)
    window = slice(first, first + band.size)
    levels[side][window] = np.maximum(levels[side][window], band)
  t_mu, fp_mu, fn_mu = _best_planned_threshold(m0, m1, trials0, trials1, mu_share * alpha,
                                               delta, "mu")
  return Plan(thresholds=np.array([t_fwd, -t_rev, t_mu]), fp_levels=np.array([0.0, 0.0, fp_mu]),
              fn_levels=np.array([0.0, 0.0, fn_mu]), fp_count_levels=levels[0],
              fn_count_levels=levels[1], alpha=float(alpha))


def tradeoff_points(s0: np.ndarray, s1: np.ndarray, plan: Plan,
                    alpha: float) -> Dict[str, np.ndarray]:
  """Simultaneous (1 − alpha) upper bounds on (FPR, FNR) of the tests "score > t", at the
  planned thresholds and at every threshold the data allow (``planned_thresholds``).

  A threshold with c false positives has FPR ≤ U_(c+1) (an order statistic of uniforms,
  the worst threshold with that count being at a score), so per count one event covers
  every threshold with that count; the plan's per-count levels (the band and the union
  bound; the larger where both apply, its failure is one of theirs) and its planned
  thresholds' levels spend alpha in all. The same for the false negatives.
  """
  s0, s1 = np.sort(np.asarray(s0, np.float64)), np.sort(np.asarray(s1, np.float64))
  t0, t1 = len(s0), len(s1)
  if plan.fp_count_levels.size != t0 + 1 or plan.fn_count_levels.size != t1 + 1:
    raise checks.CheckError(f"the plan is for {plan.fp_count_levels.size - 1} + "
                            f"{plan.fn_count_levels.size - 1} trials, the scores have {t0} + {t1}")
  if not math.isclose(plan.alpha, alpha, rel_tol=1e-9):
    raise checks.CheckError(f"the plan spends alpha={plan.alpha:g}, not {alpha:g}")
  planned = plan.thresholds
  every = np.concatenate([[-np.inf], np.unique(np.concatenate([s0, s1]))])
  thresholds = np.concatenate([planned, every])
  fp = t0 - np.searchsorted(s0, thresholds, side="right")
  fn = np.searchsorted(s1, thresholds, side="right")
  level_fp = plan.fp_count_levels[fp]
  level_fn = plan.fn_count_levels[fn]
  k = planned.size
  level_fp[:k] = np.maximum(level_fp[:k], plan.fp_levels)
  level_fn[:k] = np.maximum(level_fn[:k], plan.fn_levels)
  return {"thresholds": thresholds, "planned": np.arange(thresholds.size) < k,
          "fpr": fp / t0, "fnr": fn / t1,
          "fpr_hi": clopper_pearson_upper(fp, t0, level_fp),
          "fnr_hi": clopper_pearson_upper(fn, t1, level_fn)}


def _order_levels(counts: np.ndarray, trials: int, budget: float, tail: str) -> np.ndarray:
  """Per-count levels of the order-statistic events: half of ``budget`` over all trials + 1
  counts, half over the TAIL_COUNTS + 1 extreme ones (smallest counts for tail "low")."""
  extreme = min(TAIL_COUNTS, trials) + 1
  in_tail = counts <= TAIL_COUNTS if tail == "low" else counts >= trials - TAIL_COUNTS
  return budget / 2 / (trials + 1) + np.where(in_tail, budget / 2 / extreme, 0.0)


def epsilon_lower_bound(fpr_hi: np.ndarray, fnr_hi: np.ndarray, delta: float) -> float:
  """max over points of log((1 − FNR − δ)/FPR) and log((1 − FPR − δ)/FNR), at least 0."""
  with np.errstate(divide="ignore", invalid="ignore"):
    a = np.log(np.maximum(1.0 - fnr_hi - delta, 0.0)) - np.log(fpr_hi)
    b = np.log(np.maximum(1.0 - fpr_hi - delta, 0.0)) - np.log(fnr_hi)
  values = np.concatenate([a, b])
  values = values[np.isfinite(values) | (values > 0)]
  return float(max(0.0, np.max(values))) if values.size else 0.0


def gdp_mu_lower_bound(fpr_hi: np.ndarray, fnr_hi: np.ndarray) -> float:
  """The largest μ' whose GDP trade-off curve passes above one of the points (≥ 0)."""
  with np.errstate(divide="ignore", invalid="ignore"):
    mu = scipy.stats.norm.ppf(1.0 - fpr_hi) - scipy.stats.norm.ppf(fnr_hi)
  mu = mu[~np.isnan(mu)]
  return float(max(0.0, np.max(mu))) if mu.size else 0.0


def flag_probability(plan: Plan, trials0: int, trials1: int, claimed_mu: float,
                     true_mu: float) -> float:
  """A lower bound on the probability that the μ lower bound refutes ``claimed_mu`` when
  the scores are N(0, 1) without and N(true_mu, 1) with the canary.

  For each fixed threshold (the planned ones and a grid), the exact probability that its
  confidence point alone lies below the claimed GDP curve, from the independent
  binomial laws of its false positives and false negatives and the plan's levels; the
  audit's points include every such threshold's (a fixed threshold has the counts of
  the largest score below it), so the largest of these probabilities bounds its power
  from below.
  """
  m = float(true_mu)
  grid = np.concatenate([plan.thresholds, np.linspace(-3.0, min(m, 50.0) + 3.0, POWER_GRID)])
  k = plan.thresholds.size
  q0, q1 = scipy.stats.norm.sf(grid), scipy.stats.norm.cdf(grid - m)
  c0, p0 = _count_windows(trials0, q0, width=8.0)
  c1, p1 = _count_windows(trials1, q1, width=8.0)
  best = 0.0
  with np.errstate(divide="ignore", invalid="ignore"):
    for i in range(grid.size):
      lev0, lev1 = plan.fp_count_levels[c0[i]], plan.fn_count_levels[c1[i]]
      if i < k:
        lev0, lev1 = np.maximum(lev0, plan.fp_levels[i]), np.maximum(lev1, plan.fn_levels[i])
      g0 = scipy.stats.norm.isf(clopper_pearson_upper(c0[i], trials0, lev0))
      g1 = -scipy.stats.norm.ppf(clopper_pearson_upper(c1[i], trials1, lev1))
      refutes = (g0[:, None] + g1[None, :]) > claimed_mu
      best = max(best, float(p0[i] @ refutes @ p1[i]))
  return min(best, 1.0)


def detectable_mu_ratio(plan: Plan, trials0: int, trials1: int, claimed_mu: float,
                        power: float = POWER) -> float:
  """The smallest true μ / claimed μ that the audit flags with probability ≥ ``power``
  (by ``flag_probability``, a lower bound on its power), to 1 %; inf if none up to
  μ = 50."""
  claimed_mu = float(claimed_mu)
  hi = 50.0 / claimed_mu
  if claimed_mu <= 0 or hi <= 1 or flag_probability(plan, trials0, trials1, claimed_mu,
                                                     hi * claimed_mu) < power:
    return math.inf
  lo = 1.0
  while hi / lo > 1.005:
    mid = math.sqrt(lo * hi)
    if flag_probability(plan, trials0, trials1, claimed_mu, mid * claimed_mu) >= power:
      hi = mid
    else:
      lo = mid
  return hi


def mu_estimate(s0: np.ndarray, s1: np.ndarray) -> Tuple[float, float]:
  """(mean difference / pooled standard deviation, its standard error): the GDP μ if
  both samples are Gaussian with one variance."""
  s0, s1 = np.asarray(s0, np.float64), np.asarray(s1, np.float64)
  n0, n1 = len(s0), len(s1)
  pooled = math.sqrt(((n0 - 1) * s0.var(ddof=1) + (n1 - 1) * s1.var(ddof=1)) / (n0 + n1 - 2))
  mu = float((s1.mean() - s0.mean()) / pooled) if pooled > 0 else math.inf
  se = math.sqrt(1.0 / n0 + 1.0 / n1 + mu * mu / (2.0 * (n0 + n1 - 2))) if pooled > 0 else 0.0
  return mu, se


def score_report(s0: np.ndarray, s1: np.ndarray, thresholds: np.ndarray, alpha: float,
                 delta: float) -> Dict[str, Any]:
  """Lower bounds from one score: ε at δ, the GDP μ, and the profile ε_lb(δ') on a grid."""
  pts = tradeoff_points(s0, s1, thresholds, alpha)
  mu_hat, mu_se = mu_estimate(s0, s1)
  return {"epsilon_lower_bound": epsilon_lower_bound(pts["fpr_hi"], pts["fnr_hi"], delta),
          "mu_lower_bound": gdp_mu_lower_bound(pts["fpr_hi"], pts["fnr_hi"]),
          "mu_estimate": mu_hat, "mu_standard_error": mu_se,
          "profile": [epsilon_lower_bound(pts["fpr_hi"], pts["fnr_hi"], d) for d in DELTA_GRID],
          "points": pts}


def compare_with_claim(reports: Dict[str, Dict[str, Any]], delta: float,
                       claimed_mu: Optional[float],
                       claimed_epsilon: Optional[float]) -> Dict[str, Any]:
  """The verdict: the largest lower bounds over the scores, and whether they refute the claim.

  A GDP claim μ is refuted when a point lies below its trade-off curve, i.e. when
  ε_lb(δ') > ε_μ(δ') at some δ'; the δ' with the largest excess is reported. An
  (ε, δ) claim (amplified runs) is refuted when ε_lb(δ) > ε.

  ``decided_by`` names the statistic with the largest bound (μ for a GDP claim, ε
  otherwise): the one that refutes the claim when any does.

  ``epsilon_of_mu_lower_bound`` is ε(δ) of μ_lb-GDP (the estimate of Nasr et al. 2023,
  arXiv:2302.07956): a lower bound on the mechanism's ε(δ) only if its trade-off curve is
  Gaussian, as an unamplified Gaussian mechanism's is; ``epsilon_lower_bound`` assumes
  nothing.
  """
  eps_lb = max(r["epsilon_lower_bound"] for r in reports.values())
  mu_lb = max(r["mu_lower_bound"] for r in reports.values())
  # The statistic that decided: the one whose bound is largest against the claim (it
  # refutes the claim if any does).
  key = "mu_lower_bound" if claimed_mu is not None else "epsilon_lower_bound"
  decided = max(reports, key=lambda name: reports[name][key])
  out: Dict[str, Any] = {"epsilon_lower_bound": eps_lb, "mu_lower_bound": mu_lb,
                         "epsilon_of_mu_lower_bound": gdp_epsilon(mu_lb, delta),
                         "delta": delta, "violation": False, "decided_by": decided}
  if claimed_epsilon is not None:
    out["claimed_epsilon"] = claimed_epsilon
    out["violation"] = bool(eps_lb > claimed_epsilon)
  if claimed_mu is not None:
    out["claimed_mu"] = claimed_mu
    profile = np.max([r["profile"] for r in reports.values()], axis=0)
    claimed = np.array([gdp_epsilon(claimed_mu, d) for d in DELTA_GRID])
    k = int(np.argmax(profile - claimed))
    out["worst_delta"] = {"delta": float(DELTA_GRID[k]), "epsilon_lower_bound": float(profile[k]),
                          "claimed_epsilon": float(claimed[k])}
    out["violation"] = bool(out["violation"] or mu_lb > claimed_mu)
  return out


# ----------------------------------------------------------------------------- plot


def epsilon_delta_tradeoff(eps: float, delta: float, alpha: np.ndarray) -> np.ndarray:
  """The trade-off curve of (ε, δ)-DP: max(0, 1 − δ − e^ε α, e^−ε (1 − δ − α))."""
  alpha = np.asarray(alpha, dtype=np.float64)
  return np.maximum.reduce([np.zeros_like(alpha), 1 - delta - math.exp(eps) * alpha,
                            math.exp(-eps) * (1 - delta - alpha)])


def plot_audit(report: Dict[str, Any], path: str, statistic: Optional[str] = None) -> str:
  """Two panels: the statistic's two distributions, and the trade-off curves (claimed, the
  empirical one, its confidence points, and GDP at the estimated μ); by default the
  statistic that decided."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  statistic = statistic or report["decided_by"]
  mu_hat = report["statistics"][statistic]["mu_estimate"]
  s0, s1 = report["scores"][statistic]
  pts = report["points"][statistic]
  fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.8))
  lo, hi = np.percentile(np.concatenate([s0, s1]), [0.1, 99.9])
  bins = np.linspace(lo, hi, 60)
  left.hist(s0, bins=bins, alpha=0.6, density=True, label=f"without canary ({len(s0)} trials)")
  left.hist(s1, bins=bins, alpha=0.6, density=True, label=f"with canary ({len(s1)} trials)")
  left.set_xlabel("test statistic (projection on Σ⁻¹μ)" if report.get("claimed_mu")
                  else "test statistic (log likelihood ratio of the Poisson canary)")
  left.set_ylabel("density")
  left.set_title(f"{report['mechanism']}, {report['participation']['label']}, "
                 f"n={report['total_rounds']}")
  left.legend()
  a = np.linspace(0.0, 1.0, 401)
  if report.get("claimed_mu"):
    right.plot(a, gdp_tradeoff(report["claimed_mu"], a), "k-",
               label=f"claimed: {report['claimed_mu']:.3g}-GDP (sens/z)")
    right.plot(a, gdp_tradeoff(mu_hat, a), "C2--",
               label=f"GDP at estimated μ = {mu_hat:.3g} ({statistic})")
  else:
    right.plot(a, epsilon_delta_tradeoff(report["claimed_epsilon"], report["delta"], a), "k-",
               label=f"claimed: ε = {report['claimed_epsilon']:.3g} at δ = {report['delta']:g}")
  order = np.argsort(pts["fpr"])
  right.plot(pts["fpr"][order], pts["fnr"][order], "C0-", label="empirical (FPR, FNR)")
  every = ~pts["planned"]
  order = np.argsort(pts["fpr_hi"][every])
  right.plot(pts["fpr_hi"][every][order], pts["fnr_hi"][every][order], "C3-", linewidth=0.8,
             label="upper confidence bounds, every threshold")
  right.plot(pts["fpr_hi"][pts["planned"]], pts["fnr_hi"][pts["planned"]], "C3x",
             label="upper confidence bounds, planned thresholds")
  right.set_xlabel("false positive rate α (type I error)")
  right.set_ylabel("false negative rate β (type II error)")
  right.set_xlim(0, 1)
  right.set_ylim(0, 1)
  right.set_title(f"trade-off: ε lower bound {report['epsilon_lower_bound']:.3g} at "
                  f"δ = {report['delta']:g} (claimed {report['claimed_epsilon']:.3g})")
  right.legend(fontsize=8, title=f"confidence {report['confidence']:g} (simultaneous)",
               title_fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)
  return path


# ----------------------------------------------------------------------------- one run


def one_run_tail(canaries: int, guesses: int, correct: int, epsilon: float,
                 delta: float) -> float:
  """An upper bound on P(W ≥ ``correct``) for an (ε, δ)-DP mechanism audited in one run.

  m = ``canaries`` canaries, each included independently with probability 1/2; the
  auditor guesses the inclusion of r = ``guesses`` of them from the output and W counts
  its correct guesses. With f(v) = P(Binomial(r, e^ε/(1 + e^ε)) ≥ v), Steinke, Nasr,
  Jagielski 2023 (arXiv:2305.08846, Thm 3.1) bound P(W ≥ v) by
  f(v) + 2mδ·max_{1≤i≤v} (f(v − i) − f(v))/i (the maximum over i > v is at i = v).
  """
  q = scipy.special.expit(epsilon)

  def f(v):  # P(Binomial(r, q) ≥ v)
    return scipy.stats.binom.sf(np.asarray(v) - 1, guesses, q)

  tail = float(f(correct))
  if delta <= 0 or correct <= 0:
    return tail
  i = np.arange(1, correct + 1)
  slope = float(np.max((f(correct - i) - tail) / i))
  return min(1.0, tail + 2.0 * canaries * delta * slope)


def one_run_epsilon(canaries: int, guesses: int, correct: int, alpha: float,
                    delta: float) -> float:
  """The one-run ε lower bound at δ: every ε below it is refuted at confidence 1 − alpha
  (``one_run_tail`` ≤ alpha, the tail increasing in ε); 0 when ε = 0 is not refuted."""
  if one_run_tail(canaries, guesses, correct, 0.0, delta) > alpha:
    return 0.0
  lo, hi = 0.0, 1.0
  while one_run_tail(canaries, guesses, correct, hi, delta) <= alpha:
    lo, hi = hi, 2.0 * hi
    if hi > 200:
      return lo
  return float(scipy.optimize.brentq(
      lambda e: one_run_tail(canaries, guesses, correct, e, delta) - alpha, lo, hi,
      xtol=1e-9))


def one_run_fdp_refutes(canaries: int, guesses: int, correct: int, alpha: float,
                        least_wrong) -> bool:
  """Whether ``correct`` of ``guesses`` right refutes an f-DP claim at confidence 1 − alpha
  (Mahloujifar, Melis, Chaudhuri 2024, arXiv:2410.22235, the one-run f-DP audit).

  ``least_wrong(x) = f(1 − x)``, f the claimed (symmetric, convex) trade-off curve: the
  smallest probability of a wrong guess about one canary, on any event, when a right one
  has probability x. Derivation: for canary j (included with probability 1/2, the others
  fixed) and an event E of the output, the test "guess in on E" bounds the wrong mass
  by f(1 − ·) of the right mass in each world; averaged (f convex), over canaries too,
  h_v ≥ least_wrong(r_v), where W counts right guesses, r_v = E[W·1{W ≥ v}]/m and
  h_v = E[(g − W)·1{W ≥ v}]/m. If P(W ≥ c) ≥ alpha, the least mass puts alpha at W = c
  (r = alpha·c/m, h = alpha·(g − c)/m); going down v = c − 1, …, 0, level v must add at
  least h' − h = least_wrong(r) − h of wrong mass (taken at the previous r, a lower
  bound on what the level needs), with right mass v/(g − v) of it. The levels' masses sum
  to (r_0 + h_0)·m/g; above 1 the hypothesis P(W ≥ c) ≥ alpha is impossible, and the
  claim is refuted.
  """
  m, g, c = int(canaries), int(guesses), int(correct)
  if not 0 <= c <= g <= m:
    raise checks.CheckError(f"{c} right of {g} guesses about {m} canaries: need "
                            "0 <= right <= guesses <= canaries")
  if c <= 0 or g <= 0:
    return False
  r, h = alpha * c / m, alpha * (g - c) / m
  for v in range(c - 1, -1, -1):
    need = max(h, float(least_wrong(r)))
    if need == h:  # nothing changes at the lower levels either
      break
    r, h = min(r + v / (g - v) * (need - h), 1.0), need
  return r + h > g / m


def gdp_least_wrong(mu: float):
  """``least_wrong`` of μ-GDP: Φ(Φ⁻¹(x) − μ) (Dong, Roth, Su 2019, arXiv:1905.02383)."""
  return lambda x: scipy.special.ndtr(scipy.special.ndtri(x) - mu)


def epsilon_delta_least_wrong(eps: float, delta: float):
  """``least_wrong`` of (ε, δ)-DP: f(1 − x) of ``epsilon_delta_tradeoff``'s curve, on
  floats (the recursion calls it once per level)."""
  up, down = math.exp(eps), math.exp(-eps)
  return lambda x: max(0.0, 1.0 - delta - up * (1.0 - x), down * (x - delta))


def _largest_refuted(refutes, cap: float) -> float:
  """The largest θ in [0, cap] with ``refutes(θ)`` (monotone: refuted below it), to 1e-6."""
  if not refutes(0.0):
    return 0.0
  lo, hi = 0.0, 1.0
  while refutes(hi):
    lo, hi = hi, 2.0 * hi
    if hi > cap:
      return lo
  while hi - lo > 1e-6 * max(1.0, lo):
    mid = 0.5 * (lo + hi)
    lo, hi = (mid, hi) if refutes(mid) else (lo, mid)
  return lo


def one_run_mu(canaries: int, guesses: int, correct: int, alpha: float) -> float:
  """The one-run f-DP lower bound on the GDP μ: every μ-GDP claim below it is refuted at
  confidence 1 − alpha (``one_run_fdp_refutes`` with the Gaussian curve)."""
  return _largest_refuted(lambda mu: one_run_fdp_refutes(
      canaries, guesses, correct, alpha, gdp_least_wrong(mu)), 50.0)


def one_run_fdp_epsilon(canaries: int, guesses: int, correct: int, alpha: float,
                        delta: float) -> float:
  """The one-run f-DP lower bound on ε at δ: (ε, δ)-DP's own trade-off curve in
  ``one_run_fdp_refutes``, so no Gaussian shape is assumed."""
  return _largest_refuted(lambda e: one_run_fdp_refutes(
      canaries, guesses, correct, alpha, epsilon_delta_least_wrong(e, delta)), 200.0)


def one_run_guesses(scores: np.ndarray, included: np.ndarray, k_in: int,
                    k_out: int) -> Tuple[int, int]:
  """(guesses, correct) when the ``k_in`` highest scores are guessed included and the
  ``k_out`` lowest excluded (ties broken by position; the rule is fixed in advance)."""
  scores = np.asarray(scores, np.float64)
  included = np.asarray(included, bool)
  if k_in + k_out > scores.size:
    raise checks.CheckError(f"{k_in} + {k_out} guesses exceed the {scores.size} canaries")
  order = np.argsort(scores, kind="stable")
  correct = int(np.sum(included[order[scores.size - k_in:]])) if k_in else 0
  correct += int(np.sum(~included[order[:k_out]]))
  return k_in + k_out, correct


def plan_one_run(model_in: np.ndarray, model_out: np.ndarray, canaries: int, alpha: float,
                 delta: float, draws: int = 4, target: str = "epsilon") -> Tuple[int, int]:
  """The guess counts (k_in, k_out) with the largest mean bound on simulated audits of
  the model's score laws (fixed seed, before and independently of the audit's scores),
  searched on a grid of fractions of the canaries guessed on each side: ε at δ
  (``one_run_epsilon``) for target "epsilon", the GDP μ (``one_run_mu``) for "mu", the f-DP
  ε at δ (``one_run_fdp_epsilon``) for "fdp_epsilon"."""
  bound = {"epsilon": lambda g, c: one_run_epsilon(canaries, g, c, alpha, delta),
           "mu": lambda g, c: one_run_mu(canaries, g, c, alpha),
           "fdp_epsilon": lambda g, c: one_run_fdp_epsilon(canaries, g, c, alpha, delta)}[target]
  rng = np.random.default_rng(PLAN_SEED)
  model_in, model_out = np.asarray(model_in), np.asarray(model_out)
  sims = []
  for _ in range(draws):
    inc = rng.random(canaries) < 0.5
    s = np.where(inc, rng.choice(model_in, canaries), rng.choice(model_out, canaries))
    sims.append((s, inc))
  fractions = np.unique(np.concatenate([[0.0], np.geomspace(0.005, 0.5, 12)]))
  best, choice = -1.0, (max(1, canaries // 100), 0)
  for a in fractions:
    for b in fractions:
      k_in, k_out = int(round(a * canaries)), int(round(b * canaries))
      if k_in + k_out == 0 or k_in + k_out > canaries:
        continue
      mean = np.mean([bound(*one_run_guesses(s, inc, k_in, k_out)) for s, inc in sims])
      if mean > best:
        best, choice = mean, (k_in, k_out)
  return choice


def one_run_audit(scores: np.ndarray, included: np.ndarray, alpha: float, delta: float,
                  plan: Tuple[int, int]) -> Dict[str, Any]:
  """One-run lower bounds of canaries with these scores and inclusions, guessing with the
  planned counts: ε at δ by Steinke et al. (``one_run_epsilon``) and by the f-DP audit with
  (ε, δ)-DP's curve (``one_run_fdp_epsilon``), and the GDP μ (``one_run_mu``) with its ε(δ)
  (an ε lower bound only for a Gaussian trade-off curve). Each holds alone at confidence
  1 − alpha: a claim is checked with the one bound that matches its kind."""
  scores = np.asarray(scores, np.float64)
  k_in, k_out = plan
  guesses, correct = one_run_guesses(scores, included, k_in, k_out)
  mu_lb = one_run_mu(scores.size, guesses, correct, alpha)
  return {"epsilon_lower_bound": one_run_epsilon(scores.size, guesses, correct, alpha, delta),
          "fdp_epsilon_lower_bound": one_run_fdp_epsilon(scores.size, guesses, correct,
                                                         alpha, delta),
          "mu_lower_bound": mu_lb, "epsilon_of_mu_lower_bound": gdp_epsilon(mu_lb, delta),
          "canaries": int(scores.size), "guessed_in": k_in, "guessed_out": k_out,
          "guesses": guesses, "correct": correct, "alpha": alpha, "delta": delta}
