"""Accounting of a run under a schema (tff_mf.accounting), tested as upper bounds.

Every reference value comes from an independent computation: the Balle & Wang 2018
(arXiv:1805.06530, Thm 8) forward formula δ(ε) evaluated with scipy or 50-digit mpmath,
or dp_accounting called directly. Accountants are checked one-sided where only an
upper bound is promised (ε ≥ a valid lower bound) and two-sided where the value is
exact.
"""

import itertools
import math
import time

import mpmath
import numpy as np
import pytest
from dp_accounting.pld import privacy_loss_distribution as pld_lib
from scipy import stats

from tff_mf import accounting
from tff_mf import checks
from tff_mf.accounting import gaussian
from tff_mf.accounting import mmcc
from tff_mf import participation

import statcheck

DELTA = 1e-6
SINGLE = participation.SINGLE
# A coarser PLD grid than the default 1e-4 keeps the amplified tests fast; the
# references use the same grid (dp_accounting builds subsampled PLDs point by point).
DISC = 1e-3


# ----------------------------------------------------------------------------- references


def _delta_scipy(multiplier, eps):
  """δ(ε) of the Gaussian mechanism (Balle & Wang 2018, Thm 8), the textbook formula."""
  a = 1.0 / (2.0 * multiplier)
  return stats.norm.cdf(a - eps * multiplier) - math.exp(eps) * stats.norm.cdf(
      -a - eps * multiplier)


_delta_mp = statcheck.gaussian_delta


def _epsilon_mp(multiplier, delta, guess=None):
  """ε(δ) by 50-digit bisection on the forward formula (an independent reference)."""
  del guess
  return statcheck.gaussian_epsilon(multiplier, delta)


def _assert_tight(eps, multiplier, delta=DELTA, rel=1e-7):
  """Two-sided: δ(ε) ≤ δ and δ(ε·(1 − rel)) > δ by the scipy forward formula."""
  assert _delta_scipy(multiplier, eps) <= delta * (1 + 1e-9)
  assert _delta_scipy(multiplier, eps * (1 - rel)) > delta


def _one_round_epsilon(sigma, p, delta=DELTA):
  """ε(δ) of ONE Poisson-subsampled Gaussian (sensitivity 1, std σ), remove direction, exactly.

  P = (1−p)·N(0, σ²) + p·N(1, σ²) against Q = N(0, σ²): P/Q > e^ε exactly for
  x > x* = σ²·log((e^ε − 1 + p)/p) + 1/2, so δ(ε) = P(X > x*) − e^ε·Q(X > x*). The
  mechanism's ε is the larger of both directions, and a composition's is at least one
  round's: a valid lower bound, by 50-digit bisection.
  """
  with mpmath.workdps(50):
    s, q = mpmath.mpf(sigma), mpmath.mpf(p)

    def d(e):
      xs = s ** 2 * mpmath.log((mpmath.exp(e) - 1 + q) / q) + mpmath.mpf(1) / 2
      return ((1 - q) * mpmath.ncdf(-xs / s) + q * mpmath.ncdf(-(xs - 1) / s)
              - mpmath.exp(e) * mpmath.ncdf(-xs / s))

    if d(0) <= delta:
      return 0.0
    lo, hi = mpmath.mpf(0), mpmath.mpf(1)
    while d(hi) > delta:
      lo, hi = hi, hi * 2
    for _ in range(100):
      mid = (lo + hi) / 2
      if d(mid) > delta:
        lo = mid
      else:
        hi = mid
    return float(lo)


def _dpsgd_pld(steps, p, sigma, pessimistic=True, delta=DELTA, discretization=1e-4):
  """ε of `steps` Poisson-subsampled Gaussians straight from dp_accounting.

  pessimistic=False (privacy buckets, optimistic rounding) gives a LOWER estimate of
  the true ε: a valid lower bound for one-sided tests.
  """
  pld = pld_lib.from_gaussian_mechanism(
      sigma, pessimistic_estimate=pessimistic, value_discretization_interval=discretization,
      sampling_prob=p, use_connect_dots=pessimistic)
  if steps > 1:
    pld = pld.self_compose(steps)
  return float(pld.get_epsilon_for_delta(delta))


def _random_c(n, seed, density=0.7):
  rng = np.random.default_rng(seed)
  c = np.tril(rng.uniform(0.0, 1.0, (n, n)) * (rng.uniform(size=(n, n)) < density))
  np.fill_diagonal(c, rng.uniform(0.5, 1.0, n))
  return c / np.sqrt(np.max(np.sum(c * c, axis=0)))


def _patterns(n, schema):
  """Every participation pattern the schema allows (rounds a user contributes to)."""
  if schema.kind == "single":
    return [(j,) for j in range(n)]
  if schema.kind == "fixed_epoch":
    b = n // schema.epochs
    return [tuple(range(r, n, b)) for r in range(b)]
  b, k = schema.min_sep, schema.max_participations or n
  out = []

  def extend(pattern, start):
    if pattern:
      out.append(tuple(pattern))
    if len(pattern) == k:
      return
    for j in range(start, n):
      extend(pattern + [j], j + b)

  extend([], 0)
  return out


def _brute_sensitivity(c, schema):
  """sens of a NON-NEGATIVE C by enumeration: max over patterns P of sqrt(1ᵀ X_P 1)."""
  assert np.all(c >= 0)
  x = c.T @ c
  best = max(float(np.sum(x[np.ix_(p, p)])) for p in _patterns(c.shape[1], schema))
  return {"value": math.sqrt(best), "exact": True, "method": "brute force (test)"}


@pytest.fixture
def brute_sensitivity(monkeypatch):
  """tff_mf.participation.sensitivity_report replaced by the brute force above."""
  monkeypatch.setattr(participation, "sensitivity_report", _brute_sensitivity)


def _min_sep(b, k=None):
  return participation.Participation("min_sep", min_sep=b, max_participations=k)


# ----------------------------------------------------------------------------- exact Gaussian


@pytest.mark.parametrize("multiplier", [1e-5, 1e-3, 0.05, 0.5, 1.0, 4.2, 30.0, 1e4])
@pytest.mark.parametrize("delta", [1e-300, 1e-12, 1e-6, 0.1])
def test_exact_is_tight_against_50_digit_reference(multiplier, delta):
  eps = gaussian.gaussian_epsilon_exact(multiplier, delta)
  if eps == 0.0:
    assert _delta_mp(multiplier, 0) <= delta
    return
  ref = _epsilon_mp(multiplier, delta, eps)
  assert ref <= eps <= ref * (1 + 1e-7)  # never below the true ε


@pytest.mark.parametrize("z", [0.3, 0.7, 1.0, 2.5, 8.0])
def test_exact_against_forward_formula_and_other_accountants(z):
  exact = accounting.epsilon(z, DELTA, "exact")
  _assert_tight(exact, z)
  pld = accounting.epsilon(z, DELTA, "pld")
  rdp = accounting.epsilon(z, DELTA, "rdp")
  # PLD and RDP are upper bounds of the exact ε (one-sided), PLD close to it.
  assert exact * (1 - 1e-12) <= pld <= exact * (1 + 1e-4)
  assert pld <= rdp


def test_default_accountant_is_exact():
  assert accounting.DEFAULT_ACCOUNTANT == "exact"
  assert accounting.epsilon(2.0, DELTA) == accounting.epsilon(2.0, DELTA, "exact")


def test_known_value_gaussian_mechanism():
  # z = 1, δ = 1e-5: the analytic Gaussian mechanism gives ε ≈ 4.36 (Balle & Wang 2018).
  exact = gaussian.gaussian_epsilon_exact(1.0, 1e-5)
  assert abs(gaussian.gaussian_delta_exact(1.0, exact) - 1e-5) < 1e-12
  assert 4.3 < exact < 4.45


def test_sensitivity_scales_the_multiplier():
  for accountant in accounting.ACCOUNTANTS:
    a = accounting.epsilon(3.0, DELTA, accountant, sensitivity=2.0)
    b = accounting.epsilon(1.5, DELTA, accountant)
    assert a == pytest.approx(b, rel=1e-12)
  _assert_tight(accounting.epsilon(3.0, DELTA, sensitivity=math.sqrt(3.0)), 3.0 / math.sqrt(3))


@pytest.mark.timeout(60)
def test_tiny_noise_and_huge_epsilon_are_bounded():
  """z = 1e-3 used to ask dp_accounting for ~76 GiB; exp(ε) overflowed for ε ≥ 710."""
  start = time.perf_counter()
  eps = accounting.epsilon(1e-3, DELTA)
  assert eps == pytest.approx(_epsilon_mp(1e-3, DELTA, eps), rel=1e-9)
  assert accounting.epsilon(1e-30, DELTA) == pytest.approx(0.5e60, rel=1e-9)
  assert accounting.epsilon(1e-200, DELTA) == math.inf  # ε ≈ 5e399 exceeds every double
  assert gaussian.gaussian_delta_exact(0.03, 710.0) > 0
  assert time.perf_counter() - start < 10.0  # milliseconds idle; a hang took minutes
  pld = accounting.epsilon(1e-3, DELTA, "pld")  # coarser pessimistic grid, bounded memory
  assert eps <= pld <= eps * (1 + 1e-5)
  assert accounting.epsilon(1e-3, DELTA, "rdp") >= eps
  with pytest.raises(checks.CheckError, match="exact accountant gives epsilon = 5.0"):
    accounting.epsilon(1e-6, DELTA, "pld")


# ----------------------------------------------------------------------------- calibration


@pytest.mark.parametrize("accountant", ["exact", "pld", "rdp"])
@pytest.mark.parametrize("target", [0.5, 2.0])
def test_calibration_returns_the_smallest_noise(accountant, target):
  tol = 1e-3
  z = accounting.calibrate_noise_multiplier(target, DELTA, accountant, tolerance=tol)
  assert accounting.epsilon(z, DELTA, accountant) <= target
  assert accounting.epsilon(z * (1 - tol), DELTA, accountant) > target
  if accountant == "exact":  # against the forward formula, not the function under test
    assert _delta_scipy(z, target) <= DELTA * (1 + 1e-9)
    assert _delta_scipy(z * (1 - tol), target) > DELTA


def test_calibration_absolute_tolerance_and_sensitivity():
  z = accounting.calibrate_noise_multiplier(1.0, DELTA, tolerance=0.01, relative=False)
  assert accounting.epsilon(z, DELTA) <= 1.0 < accounting.epsilon(z - 0.01, DELTA)
  z3 = accounting.calibrate_noise_multiplier(1.0, DELTA, sensitivity=3.0)
  assert accounting.epsilon(z3, DELTA, sensitivity=3.0) <= 1.0
  assert accounting.epsilon(z3 * (1 - 1e-3), DELTA, sensitivity=3.0) > 1.0


@pytest.mark.timeout(60)
@pytest.mark.parametrize("target", [1e-6, 709.0, 710.0, 1000.0, 1e6, 1e12, 1e300])
def test_calibration_to_extreme_targets(target):
  """Targets ≥ 710 overflowed exp(ε) before; 1e-6 needs z ~ 5e6 (above the old search)."""
  z = accounting.calibrate_noise_multiplier(target, DELTA)
  assert accounting.epsilon(z, DELTA) <= target < accounting.epsilon(z * (1 - 1e-3), DELTA)
  if target <= 1e6:
    assert _delta_mp(z, target) <= DELTA


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_pld_calibration_to_huge_target():
  z = accounting.calibrate_noise_multiplier(1000.0, DELTA, "pld")
  assert accounting.epsilon(z, DELTA, "pld") <= 1000.0
  assert accounting.epsilon(z * (1 - 1e-3), DELTA, "pld") > 1000.0


# ----------------------------------------------------------------------------- bad inputs


@pytest.mark.parametrize("delta", [0.0, 1.0, -1e-6, 2.0, float("nan"), float("inf"), "x", None])
def test_bad_delta(delta):
  with pytest.raises(checks.CheckError, match="delta"):
    accounting.epsilon(1.0, delta)


@pytest.mark.parametrize("z", [0.0, -1.0, float("nan"), float("inf"), "1", True])
def test_bad_noise_multiplier(z):
  with pytest.raises(checks.CheckError, match="noise_multiplier"):
    accounting.epsilon(z, DELTA)


def test_bad_accountant_target_sensitivity_tolerance():
  with pytest.raises(checks.CheckError, match="accountant"):
    accounting.epsilon(1.0, DELTA, "moments")
  for target in (0.0, -1.0, float("inf"), float("nan")):
    with pytest.raises(checks.CheckError, match="target_epsilon"):
      accounting.calibrate_noise_multiplier(target, DELTA)
  for sens in (0.0, -1.0, float("nan")):
    with pytest.raises(checks.CheckError, match="sensitivity"):
      accounting.epsilon(1.0, DELTA, sensitivity=sens)
  for tol in (0.0, 1.0, float("nan")):
    with pytest.raises(checks.CheckError, match="tolerance"):
      accounting.calibrate_noise_multiplier(1.0, DELTA, tolerance=tol)


def test_epsilon_for_refuses_bad_combinations():
  c = mmcc.identity_matrix(4)
  with pytest.raises(checks.CheckError, match="sampling_prob applies"):
    accounting.epsilon_for(c, SINGLE, 1.0, DELTA, sampling_prob=0.5)
  with pytest.raises(checks.CheckError, match="needs sampling_prob"):
    accounting.epsilon_for(c, _min_sep(1), 1.0, DELTA, "amplified_banded")
  for p in (0.0, 1.5, -0.1, float("nan")):
    with pytest.raises(checks.CheckError, match="sampling_prob"):
      accounting.epsilon_for(c, _min_sep(1), 1.0, DELTA, "amplified_banded", p)
  with pytest.raises(checks.CheckError, match="min_sep schema"):
    accounting.epsilon_for(c, SINGLE, 1.0, DELTA, "mmcc", 0.5)
  with pytest.raises(checks.CheckError, match="amplification must be"):
    accounting.epsilon_for(c, _min_sep(1), 1.0, DELTA, "shuffle", 0.5)
  with pytest.raises(checks.CheckError, match="cap of 2"):
    accounting.epsilon_for(c, _min_sep(1, 2), 1.0, DELTA, "amplified_banded", 0.5)
  with pytest.raises(checks.CheckError, match="min_sep=8 exceeds the number of rounds"):
    accounting.epsilon_for(c, _min_sep(8), 1.0, DELTA, "amplified_banded", 0.5)
  with pytest.raises(checks.CheckError, match="must divide the number of rounds"):
    accounting.epsilon_for(c, participation.Participation("fixed_epoch", epochs=3), 1.0, DELTA)
  with pytest.raises(checks.CheckError, match="needs the encoder C"):
    accounting.epsilon_for(None, _min_sep(1), 1.0, DELTA, "mmcc", 0.5)
  for bad in (np.ones(3), np.ones((2, 3)), np.zeros((3, 3)), np.array([[1.0, 0], [np.nan, 1]]),
              np.eye(3) * 1j):
    with pytest.raises(checks.CheckError):
      accounting.epsilon_for(bad, SINGLE, 1.0, DELTA)


# ----------------------------------------------------------------------------- unamplified


def test_single_participation_without_and_with_c():
  r = accounting.epsilon_for(None, SINGLE, 2.0, DELTA)
  assert r["sensitivity"] == 1.0 and r["exact"] and r["analysis"] == "none"
  _assert_tight(r["epsilon"], 2.0)
  c = _random_c(6, 0) * 1.7  # not normalized: the sensitivity is γ(C) = 1.7
  r = accounting.epsilon_for(c, SINGLE, 2.0, DELTA)
  assert r["sensitivity"] == pytest.approx(1.7)
  _assert_tight(r["epsilon"], 2.0 / 1.7)


@pytest.mark.parametrize("schema", [
    participation.Participation("fixed_epoch", epochs=2),
    participation.Participation("fixed_epoch", epochs=3),
    _min_sep(2, 2), _min_sep(2, 3), _min_sep(3, 2)])
def test_multi_participation_is_one_gaussian_at_z_over_sensitivity(brute_sensitivity, schema):
  """Choquette-Choo et al. 2023 (arXiv:2211.06530): ε is that of the Gaussian at z/sens.

  Two-sided tight against the forward formula at the brute-force sensitivity;
  one-sided against PLD and RDP (upper bounds of it).
  """
  del brute_sensitivity
  c = _random_c(6, 1)
  sens = _brute_sensitivity(c, schema)["value"]
  assert sens > 1.0  # multiple participations raise the sensitivity above γ(C) = 1
  r = accounting.epsilon_for(c, schema, 3.0, DELTA)
  assert r["sensitivity"] == pytest.approx(sens, rel=1e-12) and r["exact"]
  _assert_tight(r["epsilon"], 3.0 / sens)
  for accountant in ("pld", "rdp"):
    other = accounting.epsilon_for(c, schema, 3.0, DELTA, accountant=accountant)
    assert other["epsilon"] >= r["epsilon"] * (1 - 1e-12) and not other["exact"]


def test_multi_participation_calibration(brute_sensitivity):
  del brute_sensitivity
  c, schema, tol = _random_c(6, 2), _min_sep(2, 3), 1e-3
  r = accounting.calibrate(c, schema, 1.5, DELTA, tolerance=tol)
  z = r["noise_multiplier"]
  assert r["epsilon"] <= 1.5
  assert accounting.epsilon_for(c, schema, z * (1 - tol), DELTA)["epsilon"] > 1.5
  sens = _brute_sensitivity(c, schema)["value"]
  assert _delta_scipy(z / sens, 1.5) <= DELTA * (1 + 1e-9)


@pytest.mark.parametrize("q", [1.0, 0.5, 0.08, 1e-3])
@pytest.mark.parametrize("adjacency", ["ADD", "REMOVE"])
def test_vectorized_gaussian_loss_is_dp_accountings_point_by_point(q, adjacency):
  """gaussian._fast_gaussian_class inverts a whole array of losses with dp_accounting's own
  formulas: the same x and δ as its scalar inverse_privacy_loss, at the special points too
  (ε = 0, ε at and within math.isclose of the boundary ±log(1 − q), ε beyond it)."""
  from dp_accounting.pld import privacy_loss_mechanism as plm
  kind = getattr(plm.AdjacencyType, adjacency)
  fast = gaussian._fast_gaussian_class()(0.8, sampling_prob=q, adjacency_type=kind)
  slow = plm.GaussianPrivacyLoss(0.8, sampling_prob=q, adjacency_type=kind)
  eps = np.concatenate([np.linspace(-6.0, 6.0, 2001), [0.0, -0.0]])
  if q < 1.0:
    edge = -math.log(1 - q) if adjacency == "ADD" else math.log(1 - q)
    eps = np.concatenate([eps, edge * (1 + np.array([-1e-6, -1e-10, 0.0, 1e-10, 1e-6]))])
  got, want = fast.get_delta_for_epsilon(eps), slow.get_delta_for_epsilon(eps)
  # The same elementwise formulas; numpy's vector log/exp may round a last bit differently
  # from its scalar path on some CPUs, which moves δ by float rounding only.
  np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-300)
  assert np.all((got >= 0) & (got <= 1))


@pytest.mark.parametrize("z,q,k", [(0.7, 0.3, 12), (2.0, 0.01, 64), (1.1, 1.0, 9)])
def test_pld_gaussian_epsilon_is_dp_accountings_pessimistic_composition(z, q, k):
  """pld_gaussian_epsilon composes gaussian_pld as dp_accounting's PLDAccountant composes
  PoissonSampledDpEvent(q, GaussianDpEvent(z)) k times (on the same grid), and stays above
  the optimistic PLD of the same composition (a lower estimate of the true ε)."""
  import dp_accounting
  eps, interval = gaussian.pld_gaussian_epsilon(z, DELTA, q, k)
  acc = dp_accounting.pld.PLDAccountant(value_discretization_interval=interval)
  event = dp_accounting.GaussianDpEvent(z)
  acc.compose(event if q == 1.0 else dp_accounting.PoissonSampledDpEvent(q, event), k)
  assert eps == pytest.approx(acc.get_epsilon(DELTA), rel=1e-9)
  assert eps >= _dpsgd_pld(k, q, z, pessimistic=False, discretization=interval)


# ----------------------------------------------------------------------------- amplified banded


@pytest.mark.parametrize("n,height,p,z", [(32, 3, 0.5, 2.0), (24, 2, 0.1, 1.5)])
def test_banded_matches_dp_accounting_and_valid_bounds(n, height, p, z):
  """arXiv:2306.08153 Thm 4: ⌈n/b⌉-fold Poisson-subsampled Gaussian at z / γ(C)."""
  c = mmcc.tree_restart_matrix(n, height)  # 2^(h-1)-banded, γ = 1
  b = 1 << (height - 1)
  r = accounting.epsilon_for(c, _min_sep(b), z, DELTA, "amplified_banded", p, pld_discretization=DISC)
  k = -(-n // b)
  assert r["bands"] == b and r["compositions"] == k
  ref = _dpsgd_pld(k, p, z, discretization=DISC)
  assert ref * (1 - 1e-9) <= r["epsilon"] <= ref * (1 + 1e-9)
  # Valid lower bounds: the optimistic PLD of the same composition, and one round.
  assert r["epsilon"] >= _dpsgd_pld(k, p, z, pessimistic=False, discretization=DISC)
  assert r["epsilon"] >= _one_round_epsilon(z, p)
  # Never above the unamplified Gaussian at z/√k (every round of the class joined).
  unamplified = gaussian.gaussian_epsilon_exact(z / math.sqrt(k), DELTA)
  assert r["unamplified_epsilon"] == pytest.approx(unamplified, rel=1e-12)
  assert r["epsilon"] <= unamplified


def test_banded_counts_partial_classes_and_uses_the_eligible_round_probability():
  n, b, p, z = 10, 4, 0.3, 1.5  # classes of 3, 3 and 2 rounds: ⌈10/4⌉ = 3 compositions
  c = mmcc.tree_restart_matrix(n, 3)
  r = accounting.epsilon_for(c, _min_sep(b), z, DELTA, "amplified_banded", p, pld_discretization=DISC)
  assert r["compositions"] == 3
  assert r["epsilon"] == pytest.approx(_dpsgd_pld(3, p, z, discretization=DISC), rel=1e-9)
  assert r["epsilon"] > _dpsgd_pld(2, p, z, discretization=DISC)
  # fixed_epoch k: b = n / k rounds per epoch.
  r2 = accounting.epsilon_for(mmcc.tree_restart_matrix(8, 3),
                              participation.Participation("fixed_epoch", epochs=2), z, DELTA,
                              "amplified_banded", p, pld_discretization=DISC)
  assert r2["min_sep"] == 4 and r2["compositions"] == 2
  assert r2["epsilon"] == pytest.approx(_dpsgd_pld(2, p, z, discretization=DISC), rel=1e-9)


def test_banded_at_p_one_is_the_exact_gaussian_at_z_over_sqrt_k():
  c = mmcc.tree_restart_matrix(16, 3)
  r = accounting.epsilon_for(c, _min_sep(4), 2.0, DELTA, "amplified_banded", 1.0)
  _assert_tight(r["epsilon"], 2.0 / 2.0)  # k = 4 rounds: z / √4
  assert r["bound"] == "unamplified"


def test_banded_scales_by_the_column_norm_and_accepts_signed_c():
  c = mmcc.tree_restart_matrix(16, 3)
  c = c * np.where(np.arange(16) % 3 == 0, -1.0, 1.0)[None, :]  # signed columns, still banded
  r = accounting.epsilon_for(2.0 * c, _min_sep(4), 4.0, DELTA, "amplified_banded", 0.2,
                             pld_discretization=DISC)
  assert r["column_norm"] == pytest.approx(2.0)
  assert r["epsilon"] == pytest.approx(_dpsgd_pld(4, 0.2, 2.0, discretization=DISC), rel=1e-9)


def test_banded_refuses_c_with_more_bands_than_the_separation():
  with pytest.raises(checks.CheckError, match="at most b = 4 non-zero bands.*has 8"):
    accounting.epsilon_for(mmcc.binary_tree_matrix(8), _min_sep(4), 1.0, DELTA, "amplified_banded", 0.1)
  c = np.tril(np.ones((6, 6)), 0) - np.tril(np.ones((6, 6)), -3)  # 3 bands
  with pytest.raises(checks.CheckError, match="has 3"):
    accounting.epsilon_for(c, _min_sep(2), 1.0, DELTA, "amplified_banded", 0.1)
  assert accounting.band_count(c) == 3
  with pytest.raises(checks.CheckError, match="lower triangular"):
    accounting.epsilon_for(c.T, _min_sep(3), 1.0, DELTA, "amplified_banded", 0.1)


@pytest.mark.timeout(60)
def test_banded_tiny_noise_is_bounded():
  c = mmcc.tree_restart_matrix(16, 3)
  start = time.perf_counter()
  r = accounting.epsilon_for(c, _min_sep(4), 1e-3, DELTA, "amplified_banded", 0.5)
  assert r["pld_discretization"] > 1e-4  # coarsened, still pessimistic
  assert _one_round_epsilon(1e-3, 0.5) <= r["epsilon"] <= r["unamplified_epsilon"]
  with pytest.raises(checks.CheckError, match="unamplified bound is epsilon"):
    accounting.epsilon_for(c, _min_sep(4), 1e-5, DELTA, "amplified_banded", 0.5)
  assert time.perf_counter() - start < 30


def test_banded_calibration():
  c, tol = mmcc.tree_restart_matrix(16, 3), 1e-2
  r = accounting.calibrate(c, _min_sep(4), 1.0, DELTA, "amplified_banded", 0.5, tolerance=tol,
                           pld_discretization=DISC)
  z = r["noise_multiplier"]
  assert r["epsilon"] <= 1.0 and _dpsgd_pld(4, 0.5, z, discretization=DISC) <= 1.0
  assert accounting.epsilon_for(c, _min_sep(4), z * (1 - tol), DELTA, "amplified_banded", 0.5,
                                pld_discretization=DISC)["epsilon"] > 1.0


# ----------------------------------------------------------------------------- MMCC


def test_mmcc_identity_is_dpsgd_one_sided():
  n, p, z = 10, 0.2, 1.5
  r = accounting.epsilon_for(np.eye(n), _min_sep(1), z, DELTA, "mmcc", p,
                             pld_discretization=DISC, mmcc_options={"workers": 1})
  assert r["bound"] == "amplified"
  assert _dpsgd_pld(n, p, z, pessimistic=False, discretization=DISC) <= r["epsilon"]
  assert r["epsilon"] <= _dpsgd_pld(n, p, z, discretization=DISC) * (1 + 1e-6)


def test_mmcc_min_sep_takes_the_eligible_round_probability():
  """App D writes the probability of joining an eligible round as b·p; epsilon_for takes it."""
  c, b, p_avg = mmcc.tree_restart_matrix(32, 3), 4, 1 / 16
  r = accounting.epsilon_for(c, _min_sep(b), 2.0, DELTA, "mmcc", b * p_avg,
                             pld_discretization=DISC, mmcc_options={"workers": 1})
  direct = mmcc.mmcc_epsilon(c, p_avg, 2.0, DELTA, min_sep=b, workers=1, pld_discretization=DISC)
  assert r["amplified_epsilon"] == pytest.approx(direct, rel=1e-12)
  ref = _dpsgd_pld(32 // b, b * p_avg, 2.0, pessimistic=False, discretization=DISC)
  assert ref <= r["epsilon"] <= ref * 1.005


def test_mmcc_tree_lower_bound_from_its_leaf_rows():
  """The leaf rows of the normalized C_T are I/√L: DP-SGD with n steps at z·√L (p < 1).

  Releasing all rows reveals at least as much as the leaves, so ε ≥ that DP-SGD's ε
  (optimistic PLD: a valid lower bound). Monotonicity alone would not catch an
  optimistic implementation.
  """
  n, p, z = 8, 0.25, 2.0
  levels = 4
  r = accounting.epsilon_for(mmcc.binary_tree_matrix(n), _min_sep(1), z, DELTA, "mmcc", p,
                             pld_discretization=DISC, mmcc_options={"workers": 1})
  assert r["epsilon"] >= _dpsgd_pld(n, p, z * math.sqrt(levels), pessimistic=False,
                                    discretization=DISC)
  # The unamplified bound for i.i.d. sampling: every round joined, sens = ‖C·1‖.
  sens = float(np.linalg.norm(mmcc.binary_tree_matrix(n).sum(axis=1)))
  assert r["sensitivity"] == pytest.approx(sens)
  assert r["unamplified_epsilon"] == pytest.approx(
      gaussian.gaussian_epsilon_exact(z / sens, DELTA), rel=1e-12)
  assert r["epsilon"] <= r["unamplified_epsilon"]


@pytest.mark.timeout(60)
def test_mmcc_tiny_noise_is_bounded_or_refused_with_the_unamplified_epsilon():
  c = mmcc.binary_tree_matrix(4)
  r = accounting.epsilon_for(c, _min_sep(1), 1e-3, DELTA, "mmcc", 0.25,
                             mmcc_options={"workers": 1})
  # Lower bound: one round of the leaf rows I/√3 (3 levels), i.e. multiplier z·√3.
  assert _one_round_epsilon(1e-3 * math.sqrt(3), 0.25) <= r["epsilon"]
  assert r["epsilon"] <= r["unamplified_epsilon"]
  with pytest.raises(checks.CheckError, match="unamplified bound is epsilon = 4.66"):
    accounting.epsilon_for(c, _min_sep(1), 1e-5, DELTA, "mmcc", 0.25,
                           mmcc_options={"workers": 1})


def test_mmcc_calibration():
  c, tol = np.eye(4), 1e-2
  r = accounting.calibrate(c, _min_sep(1), 1.0, DELTA, "mmcc", 0.5, tolerance=tol,
                           pld_discretization=DISC, mmcc_options={"workers": 1})
  z = r["noise_multiplier"]
  assert r["epsilon"] <= 1.0 and _dpsgd_pld(4, 0.5, z, discretization=DISC) <= 1.0 * (1 + 1e-6)
  assert accounting.epsilon_for(c, _min_sep(1), z * (1 - tol), DELTA, "mmcc", 0.5,
                                pld_discretization=DISC,
                                mmcc_options={"workers": 1})["epsilon"] > 1.0


def test_mmcc_calibration_shows_one_bar_for_the_whole_search(capsys):
  """One bar with a total and an ETA over the search, not a row-PLD bar per evaluation
  (14 bars and no overall ETA before)."""
  c, tol = np.eye(4), 1e-2
  r = accounting.calibrate(c, _min_sep(1), 1.0, DELTA, "mmcc", 0.5, tolerance=tol,
                           pld_discretization=DISC,
                           mmcc_options={"workers": 1, "progress": True})
  err = capsys.readouterr().err
  assert r["evaluations"] >= 2
  assert "row PLDs" not in err and "tail bounds" not in err, err
  assert "calibrating z to epsilon 1" in err and "<" in err, err  # elapsed<remaining
  assert f"{r['evaluations']} evaluations" in err, err


def test_poisson_sensitivity_brute_force():
  for seed in range(3):
    c = _random_c(6, seed)
    for b in (1, 2, 3):
      sens, exact = accounting.poisson_sensitivity(c, b)
      brute = max(float(np.linalg.norm(c[:, r::b].sum(axis=1))) for r in range(b))
      assert exact and sens == pytest.approx(brute, rel=1e-12)
  signed = np.array([[1.0, 0.0], [-0.5, 1.0]])
  sens, exact = accounting.poisson_sensitivity(signed, 1)
  assert not exact and sens >= np.linalg.norm(signed.sum(axis=1))
  for g in itertools.product([-1.0, 1.0], repeat=2):  # a valid upper bound
    assert sens >= np.linalg.norm(signed @ np.array(g)) - 1e-12
