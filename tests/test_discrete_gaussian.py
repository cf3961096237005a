"""The discrete Gaussian on the integer release (numpy core): the sampler against the pmf of
Canonne, Kamath, Steinke 2020 (arXiv:2004.00010, Def. 1), the sensitivity of the rounded
encoder against brute force, the post-processing s = C⁻¹·Y/γ, and the zCDP accounting
(Thm 14, Cor. 13) against the continuous Gaussian and a direct evaluation.
"""

import dataclasses
import decimal
import fractions
import math

import numpy as np
import pytest
import scipy.linalg
import scipy.stats

from tff_mf.accounting import analyses
from tff_mf import checks
from tff_mf.noise import discrete_gaussian as dg
from tff_mf import mechanisms
from tff_mf import participation
from tff_mf import spec as spec_lib

KEY = (12345, 678)
DRAWS = 200_000
# False-alarm rate of each statistical check below.
ALPHA = 1e-4


def _chi_square_p(draws: np.ndarray, sigma: float) -> float:
  """p-value of H0: draws ~ N_ℤ(0, σ²), bins |x| ≤ 4σ and the two tails lumped."""
  top = int(4 * sigma) + 1
  support = np.arange(-top, top + 1)
  expected = dg.pmf(sigma, support) * draws.size
  tail = (draws.size - expected.sum()) / 2
  observed = np.array([np.sum(draws == x) for x in support], dtype=np.float64)
  obs = np.concatenate([[np.sum(draws < -top)], observed, [np.sum(draws > top)]])
  exp = np.concatenate([[tail], expected, [tail]])
  keep = exp >= 5  # the χ² approximation's usual condition; the rest lumped into one bin
  obs = np.concatenate([obs[keep], [obs[~keep].sum()]])
  exp = np.concatenate([exp[keep], [exp[~keep].sum()]])
  if exp[-1] < 5:
    obs, exp = obs[:-1], exp[:-1]
    exp = exp * obs.sum() / exp.sum()
  return float(scipy.stats.chisquare(obs, exp).pvalue)


@pytest.mark.parametrize("sigma", [0.7, 2.5, 6.0])
def test_sampler_matches_the_pmf(sigma):
  draws = dg.sample(KEY, 3, DRAWS, sigma)
  assert draws.dtype == np.int64
  assert _chi_square_p(draws, sigma) > ALPHA
  # Power on these very draws: a 5% wider discrete Gaussian is rejected.
  assert _chi_square_p(draws, sigma * 1.05) < ALPHA


@pytest.mark.parametrize("sigma", [0.7, 3.0, 1000.0])
def test_sampler_variance(sigma):
  """Sample variance within 5 standard errors of Var N_ℤ(0, σ²) (SE from its 4th moment)."""
  draws = dg.sample(KEY, 0, DRAWS, sigma).astype(np.float64)
  var = dg.variance(sigma)
  top = int(60 * sigma + 60)
  grid = np.arange(-top, top + 1, dtype=np.float64)
  fourth = float(np.sum(grid**4 * dg.pmf(sigma, grid)))
  se = math.sqrt((fourth - var**2) / DRAWS)
  assert abs(np.mean(draws**2) - var) < 5 * se
  assert var <= sigma**2  # CKS Cor. 9
  assert abs(np.mean(draws)) < 5 * math.sqrt(var / DRAWS)


def test_sampler_is_deterministic_from_the_seed():
  a = dg.sample(KEY, 5, 1000, 4.0)
  assert np.array_equal(a, dg.sample(KEY, 5, 1000, 4.0))
  assert not np.array_equal(a, dg.sample(KEY, 6, 1000, 4.0))
  assert not np.array_equal(a, dg.sample((KEY[0] + 1, KEY[1]), 5, 1000, 4.0))


def _banded_c(n: int, b: int, seed: int = 0) -> np.ndarray:
  rng = np.random.default_rng(seed)
  c = np.zeros((n, n))
  for k in range(b):
    c += np.diag(rng.uniform(0.2, 1.0, n - k), -k)
  return c / np.max(np.linalg.norm(c, axis=0))


def _rounded(c, x, gamma):
  return np.rint(gamma * (c @ x)).astype(np.int64)


@pytest.mark.parametrize("schema,patterns", [
    (participation.SINGLE, [(j,) for j in range(6)]),
    (participation.fixed_epoch(2), [(j, j + 3) for j in range(3)]),
])
def test_integer_sensitivity_bounds_brute_force(schema, patterns):
  """‖round(γCx) − round(γCx')‖₂ ≤ Δ for random neighbours; an adversarial pair shows the
  rounding term is needed (it exceeds γ·ζ·sens)."""
  n, b, d, zeta, gamma = 6, 3, 4, 1.0, 3.0
  c = _banded_c(n, b)
  sens = participation.sensitivity_report(c, schema)["value"]
  k = max(len(p) for p in patterns)
  delta = dg.integer_sensitivity(sens, zeta, gamma, d, dg.touched_rows(b, k, n), b, 1)
  rng = np.random.default_rng(1)
  worst = 0.0
  for _ in range(3000):
    x = rng.normal(size=(n, d)) * 3
    pattern = patterns[rng.integers(len(patterns))]
    v = rng.normal(size=(len(pattern), d))
    v *= zeta * rng.uniform(0, 1, (len(pattern), 1)) / np.linalg.norm(v, axis=1, keepdims=True)
    x2 = x.copy()
    x2[list(pattern)] += v
    worst = max(worst, float(np.linalg.norm(_rounded(c, x, gamma) - _rounded(c, x2, gamma))))
  assert worst <= delta
  # Adversarial: every coordinate of γ·C·x just below 1/2 and a neighbour's tiny step up:
  # each touched coordinate rounds one unit higher, while γ·‖C·Δx‖ is almost 0.
  pattern = list(patterns[0])
  x = np.linalg.solve(c, np.full((n, d), (0.5 - 1e-9) / gamma))
  x2 = x.copy()
  x2[pattern] += 1e-6
  jump = _rounded(c, x2, gamma) - _rounded(c, x, gamma)
  touched = np.count_nonzero(np.any(c[:, pattern] != 0, axis=1)) * d
  assert np.count_nonzero(jump) == touched
  assert np.linalg.norm(jump) > 100 * gamma * np.linalg.norm(c @ (x2 - x))
  assert np.linalg.norm(jump) <= delta


def test_release_is_c_inverse_of_y_over_gamma():
  """s = C⁻¹·Y/γ (from Y alone) and equals x + C⁻¹·N/γ up to the rounding, ‖C⁻¹‖_∞/(2γ)."""
  n, b, d = 8, 3, 50
  c = _banded_c(n, b, seed=2)
  sens = participation.sensitivity_report(c, participation.SINGLE)["value"]
  plan = dg.plan(sensitivity=sens, clip_norm=1.0, noise_multiplier=0.8, model_size=d,
                 bands=b, participations=1, n=n, records=1, encoder=c)
  assert plan.inflation <= dg.ROUNDING_INFLATION
  stream = dg.IntegerRelease(c, plan, KEY)
  x = np.random.default_rng(3).normal(size=(n, d))
  s, y = zip(*[stream.step(x[t]) for t in range(n)])
  s, y = np.array(s), np.array(y)
  assert y.dtype == np.int64
  from_y = scipy.linalg.solve_triangular(c, y / plan.granularity, lower=True)
  assert np.max(np.abs(s - from_y)) <= 1e-9 * np.max(np.abs(from_y))
  noise = y - _rounded(c, x, plan.granularity)
  expected = x + scipy.linalg.solve_triangular(c, noise / plan.granularity, lower=True)
  c_inv = np.linalg.inv(c)
  bound = np.max(np.sum(np.abs(c_inv), axis=1)) * 0.5 / plan.granularity
  assert np.max(np.abs(s - expected)) <= bound * (1 + 1e-6) + 1e-9 * np.max(np.abs(s))
  # The noise is the plan's N_ℤ(0, σ²): its second moment within 5 standard errors.
  ratio = np.mean(noise.astype(float)**2) / dg.variance(plan.sigma)
  assert abs(ratio - 1) < 5 * math.sqrt(2 / noise.size)


def test_epsilon_is_cor13_and_above_the_continuous_gaussian():
  delta = 1e-6
  for z, sens in [(0.6, 1.0), (1.0, 1.0), (2.0, math.sqrt(3)), (8.0, 1.0)]:
    eps = dg.epsilon(z, delta, sens)
    rho = dg.rho(z, sens)
    grid = 1 + np.geomspace(1e-4, 1e4, 20001)
    direct = min(dg.cor13_epsilon(rho, delta, a) for a in grid)
    assert eps <= direct + 1e-9
    assert eps >= direct - 1e-4 * direct
    _, order = dg.zcdp_epsilon(rho, delta)
    assert dg.cor13_delta(rho, eps, order) <= delta * (1 + 1e-9)
    # Bun & Steinke 2016, Prop 1.3 (a looser valid conversion).
    assert eps <= rho + 2 * math.sqrt(rho * math.log(1 / delta))
    # The continuous Gaussian at the same z/sens (ρ-zCDP too) has the smaller exact ε.
    accounted = sens * (1 + dg.ROUNDING_INFLATION)
    assert eps >= analyses.ExactGaussian().epsilon(z, delta, accounted)


def test_calibration_is_the_smallest_z():
  delta, sens = 1e-6, 1.3
  for target in (0.5, 2.0, 8.0):
    z = dg.calibrate(target, delta, sens)
    assert dg.epsilon(z, delta, sens) <= target
    assert dg.epsilon(z / (1 + 2e-3), delta, sens) > target


def _spec(**overrides):
  kw = dict(total_rounds=8, clients_per_round=4, clip_norm=1.0, noise_multiplier=1.0,
            delta=1e-6, noise_distribution="discrete_gaussian")
  mechanism = overrides.pop("mechanism", "banded")
  kw.update(overrides)
  return spec_lib.MechanismSpec.from_args(mechanism, **kw)


def test_record_and_statement_name_the_discrete_gaussian():
  resolved, record = mechanisms.build(_spec(bands=3, participation=participation.fixed_epoch(2)))
  assert record.bound == "discrete_gaussian"
  assert record.epsilon == pytest.approx(dg.epsilon(1.0, 1e-6, resolved.sensitivity), rel=1e-12)
  assert record.epsilon >= analyses.ExactGaussian().epsilon(1.0, 1e-6, record.sensitivity)
  by_round = record.epsilon_by_round()
  assert by_round[-1] == record.epsilon and all(np.diff(by_round) >= 0)
  text = str(record)
  assert "discrete Gaussian" in text and "arXiv:2004.00010" in text and "0.1%" in text
  calibrated = mechanisms.build(_spec(mechanism="gaussian", noise_multiplier=None,
                                      target_epsilon=2.0))[1]
  assert calibrated.epsilon <= 2.0


@pytest.mark.parametrize("overrides,words", [
    (dict(mechanism="blt"), "would keep every past sum"),
    (dict(sampling_prob=0.5, participation=participation.min_sep(2)), "without amplification"),
    (dict(clip_norm="adaptive"), "adaptive clipping with the discrete Gaussian"),
    (dict(noise_distribution="laplace"), "noise_distribution must be one of"),
    (dict(noise_distribution="gaussian", granularity=4.0), "granularity goes with"),
    (dict(granularity=0.0), "granularity must be positive"),
    (dict(noise_stream="stateless"), "does not apply"),
    (dict(noise_multiplier=0.0, allow_no_noise=True), "adds no noise"),
])
def test_refusals_are_one_line(overrides, words):
  with pytest.raises(checks.CheckError) as e:
    _spec(**overrides)
  assert words in str(e.value) and "\n" not in str(e.value)


def test_plan_refuses_a_coarse_granularity_and_the_float_range():
  with pytest.raises(checks.CheckError, match="inflates the sensitivity") as e:
    dg.plan(sensitivity=1.0, clip_norm=1.0, noise_multiplier=1.0, model_size=4_050_000,
            bands=1, participations=1, n=10, records=1, encoder=np.eye(10), granularity=1024.0)
  assert "\n" not in str(e.value)
  with pytest.raises(checks.CheckError, match="2\\^52"):
    dg.plan(sensitivity=1.0, clip_norm=1.0, noise_multiplier=1e9, model_size=10, bands=1,
            participations=1, n=10, records=1, encoder=np.eye(10), granularity=2.0**40)
  plan = dg.plan(sensitivity=1.0, clip_norm=1.0, noise_multiplier=1.0, model_size=4_050_000,
                 bands=1, participations=1, n=10, records=1, encoder=np.eye(10))
  assert plan.inflation <= dg.ROUNDING_INFLATION and plan.sigma == plan.granularity


def test_unpinned_stream_draws_its_key_from_os_entropy():
  """Without a key two streams add different noise; a pinned key replays the same release."""
  c = np.eye(4)
  plan = dg.plan(sensitivity=1.0, clip_norm=1.0, noise_multiplier=1.0, model_size=200,
                 bands=1, participations=1, n=4, records=1, encoder=c)
  x = np.zeros(200)
  a, b = dg.IntegerRelease(c, plan).step(x)[1], dg.IntegerRelease(c, plan).step(x)[1]
  assert not np.array_equal(a, b)
  key = dg.seed_key(99)
  np.testing.assert_array_equal(dg.IntegerRelease(c, plan, key).step(x)[1],
                                dg.IntegerRelease(c, plan, key).step(x)[1])


@pytest.mark.parametrize("flags,words", [
    (dict(mechanism="banded", granularity=4.0),
     "--granularity goes with --noise_distribution"),
    (dict(mechanism="blt", noise_distribution="discrete_gaussian"), "every past sum"),
    (dict(mechanism="banded", noise_distribution="discrete_gaussian", participation="min_sep",
          min_sep=2, sampling_prob=0.5), "without amplification by sampling"),
    # Without --sampling_prob the refusal is the same (not "needs --sampling_prob", which the
    # next try would be refused for).
    (dict(mechanism="banded", noise_distribution="discrete_gaussian", participation="min_sep",
          min_sep=2), "without amplification by sampling"),
    (dict(mechanism="gaussian", noise_distribution="discrete_gaussian",
          participation="cyclic_poisson", min_sep=1), "samples clients (cyclic Poisson)"),
])
def test_training_flags_are_refused_in_one_line_naming_them(flags, words):
  from training import config as config_lib  # pylint: disable=g-import-not-at-top
  with pytest.raises(config_lib.TrainingError) as e:
    config_lib.TrainingConfig(noise_multiplier=1.0, **flags).validate()
  assert words in str(e.value) and "\n" not in str(e.value)


def test_epsilon_by_round_covers_the_rounding_of_a_prefix():
  """A prefix's rounding term is bounded by the whole run's (η·γ·ζ·sens), not by η times the
  prefix's own sensitivity: with a small diagonal (C₀₀ = 0.1 against a column norm √1.01) two
  neighbours whose first release differs by ⌊δa⌋ + 1 on every coordinate (δa = γ·C₀₀·ζ/√d)
  exceed γ·ζ·C₀₀·(1 + η); ε after round 1 must still cover them."""
  n, d, zeta, delta = 4, 1000, 1.0, 1e-6
  c = np.eye(n) * 0.1 + np.eye(n, k=-1)
  report = participation.sensitivity_report(c, participation.SINGLE)
  sens = report["value"]
  privacy = spec_lib.Privacy(1.0, None, delta, noise_distribution="discrete_gaussian")
  record = mechanisms.discrete_record(c, participation.SINGLE, report, privacy)
  rows = dg.touched_rows(2, 1, n)
  # γ with the whole run's rounding share just under the accounted η.
  gamma = (math.sqrt(d * rows) * (1 + 2 * dg.float_allowance(2))
           / (dg.ROUNDING_INFLATION * zeta * sens)) * (1 + 1e-9)
  plan = dg.plan(sensitivity=sens, clip_norm=zeta, noise_multiplier=1.0, model_size=d, bands=2,
                 participations=1, n=n, records=1, encoder=c, granularity=gamma)
  x = np.full(d, (0.5 - 1e-6) / (gamma * c[0, 0]))
  x2 = x + zeta / math.sqrt(d)  # the neighbour's clipped record, ‖·‖₂ = ζ
  y = dg.IntegerRelease(c, plan, KEY).step(x)[1]
  y2 = dg.IntegerRelease(c, plan, KEY).step(x2)[1]
  jump = float(np.linalg.norm(y2 - y))
  assert jump > gamma * zeta * c[0, 0] * (1 + dg.ROUNDING_INFLATION)
  realized = dg.zcdp_epsilon((jump / plan.sigma)**2 / 2, delta)[0]
  assert record.epsilon_by_round()[0] >= realized


def test_release_refuses_a_non_finite_sum():
  """A NaN sum would round to int64's minimum and release the noise in the clear (and pass
  the range check through |int64 min| < 0): refused in one line, before any state changes."""
  c = np.eye(3)
  plan = dg.plan(sensitivity=1.0, clip_norm=1.0, noise_multiplier=1.0, model_size=5, bands=1,
                 participations=1, n=3, records=1, encoder=c)
  stream = dg.IntegerRelease(c, plan, KEY)
  stream.step(np.ones(5))
  for bad in (np.nan, np.inf, -np.inf):
    x = np.ones(5)
    x[2] = bad
    with pytest.raises(checks.CheckError, match="not finite") as e:
      stream.step(x)
    assert "\n" not in str(e.value) and stream.round_index == 1


@pytest.mark.parametrize("granularity,words", [
    (0.0, "--granularity must be positive"), (-2.0, "--granularity must be positive"),
    (float("nan"), "--granularity must be a finite"),
])
def test_training_granularity_errors_name_the_flag(granularity, words):
  from training import config as config_lib  # pylint: disable=g-import-not-at-top
  with pytest.raises(config_lib.TrainingError) as e:
    config_lib.TrainingConfig(mechanism="banded", noise_multiplier=1.0,
                              noise_distribution="discrete_gaussian",
                              granularity=granularity).validate()
  assert str(e.value).startswith(words) and "\n" not in str(e.value)


def test_epsilon_at_extreme_noise_multipliers():
  """z whose ρ = (sens/z)²/2 over- or underflows: ε = ∞ or 0 (as the continuous Gaussian's),
  never an OverflowError or ZeroDivisionError; and non-increasing in z across the range."""
  delta = 1e-6
  zs = [1e-200, 1e-100, 1e-15, 1e-3, 1.0, 1e3, 1e12, 1e300]
  eps = [dg.epsilon(z, delta, 1.0) for z in zs]
  assert eps[0] == math.inf and eps[-1] == 0.0
  assert all(math.isfinite(e) for e in eps[1:])
  assert eps[1] >= dg.rho(1e-100, 1.0)
  assert all(a >= b for a, b in zip(eps, eps[1:]))
  for z in (1e-200, 1e300):
    record = mechanisms.discrete_record(
        np.eye(1), participation.SINGLE, participation.sensitivity_report(np.eye(1),
                                                                         participation.SINGLE),
        spec_lib.Privacy(z, None, delta, noise_distribution="discrete_gaussian"))
    assert record.epsilon == (math.inf if z < 1 else 0.0)
    assert not math.isnan(record.details["order"])  # JSON output refuses a NaN


def test_release_keeps_its_own_copy_of_the_sums():
  """The state's past sums are the stream's own: a caller that refills one buffer each round
  gets the release of fresh arrays (else (C·x)_t would use this round's sum as the last one's,
  another C than the accounted one)."""
  n, b, d = 5, 3, 7
  c = _banded_c(n, b, seed=4)
  plan = dg.plan(sensitivity=participation.sensitivity_report(c, participation.SINGLE)["value"],
                 clip_norm=1.0, noise_multiplier=1.0, model_size=d, bands=b, participations=1,
                 n=n, records=1, encoder=c)
  x = np.random.default_rng(5).normal(size=(n, d))
  fresh = dg.IntegerRelease(c, plan, KEY)
  reused = dg.IntegerRelease(c, plan, KEY)
  buffer = np.empty(d)
  for t in range(n):
    buffer[:] = x[t]
    np.testing.assert_array_equal(reused.step(buffer)[1], fresh.step(x[t].copy())[1])


def _adversarial_neighbour_sums(dtype, k: int, rng) -> float:
  """Exact difference of the computed sums of neighbours in one coordinate (records in
  [−1, 1], ζ = 1): D = the user's record 1 and k − 1 others, D′ = the others, summed left to
  right in ``dtype``. The first m − 1 others are 1 (m = 2^⌊log2(k/2)⌋), so D's partial sum
  starts at m and D′'s at m − 1, in binades whose ulps differ by 2; each later record is
  the one of 4096 random candidates that keeps them there and rounds D's sum up the most
  against D′'s (about ulp(m)/2 a record, K²·u/4 in all, against the bound's 2·K²·u)."""
  m = 2 ** int(math.log2(k // 2))
  with_user, without = dtype(m), dtype(m - 1)
  for _ in range(k - m):
    candidates = rng.uniform(-1.0, 1.0, 4096).astype(dtype)
    a, b = with_user + candidates, without + candidates  # ``dtype`` arithmetic
    gain = a.astype(np.float64) - b.astype(np.float64)  # exact: both within 2^10 of 2^k
    gain[(a < m) | (b >= m)] = -np.inf
    best = candidates[np.argmax(gain)]
    with_user, without = dtype(with_user + best), dtype(without + best)
  return float(fractions.Fraction(float(with_user)) - fractions.Fraction(float(without)))


def test_clip_allowance_covers_an_adversarial_float64_sum_and_float32_breaks_the_bound():
  """Neighbouring sums of K = 400 records (ζ = 1), the user's record exactly 1: summed in
  float64 they differ by more than ζ (the allowance is needed) and by at most ζ·(1 + κ)
  (``clip_allowance``: Higham 2002, Sec 4.2); summed in float32, as TFF summed the records
  before, by more than the whole accounted inflation 10⁻³, so the integer release of that
  pair moves by more than Δ, while the float64 pair stays within it."""
  k, gamma = 400, 2.0**12
  kappa = dg.clip_allowance(1, k)
  rng = np.random.default_rng(7)
  wide = _adversarial_neighbour_sums(np.float64, k, rng)
  narrow = _adversarial_neighbour_sums(np.float32, k, rng)
  assert 1.0 < wide <= 1.0 + kappa
  assert wide - 1.0 > 0.05 * kappa  # the bound is within a small factor of what is reached
  assert narrow > 1.0 + dg.ROUNDING_INFLATION
  plan = dg.plan(sensitivity=1.0, clip_norm=1.0, noise_multiplier=1.0, model_size=1, bands=1,
                 participations=1, n=1, records=k, encoder=np.eye(1), granularity=gamma)
  assert plan.clip_allowance == kappa and plan.inflation <= dg.ROUNDING_INFLATION

  def release_gap(difference):
    base = 123.4567  # the other records' sum: any value
    y = [dg.IntegerRelease(np.eye(1), plan, KEY).step(np.array([x]))[1][0]
         for x in (base + difference, base)]  # the same key: the same noise
    return abs(int(y[0]) - int(y[1]))

  assert release_gap(narrow) > plan.integer_sensitivity
  assert release_gap(wide) <= plan.integer_sensitivity


def test_plan_counts_the_records_of_a_round():
  """κ grows with K (the summation term 2·K·γ_{K−1} ≈ 2K²u) and d (clipping, ≈ (d + 6)·u);
  the default γ leaves room for it, and a K whose κ alone exceeds 10⁻³ is refused in one
  line."""
  kappas = [dg.clip_allowance(1000, k) for k in (1, 100, 10**4)]
  assert kappas[0] < kappas[1] < kappas[2]
  assert dg.clip_allowance(10, 4) < dg.clip_allowance(10**6, 4)
  u = 2.0**-53
  k, d = 1000, 10**6
  first_order = 2 * k * (k - 1) * u + (d + 6) * u
  assert first_order <= dg.clip_allowance(d, k) <= 1.01 * first_order + 10 * u
  plan = dg.plan(sensitivity=1.0, clip_norm=1.0, noise_multiplier=1.0, model_size=d, bands=1,
                 participations=1, n=10, records=k, encoder=np.eye(10))
  assert plan.inflation <= dg.ROUNDING_INFLATION
  assert plan.integer_sensitivity >= plan.granularity * (1 + plan.clip_allowance)
  with pytest.raises(checks.CheckError, match="float64 clipping and summation alone") as e:
    dg.plan(sensitivity=1.0, clip_norm=1.0, noise_multiplier=1.0, model_size=d, bands=1,
            participations=1, n=10, records=3 * 10**6, encoder=np.eye(10))
  assert "\n" not in str(e.value)


def _signed_banded_c(n: int, b: int, seed: int) -> np.ndarray:
  """``_banded_c`` with random signs off the diagonal (|C_tj| is what the range check sums)."""
  c = _banded_c(n, b, seed)
  signs = np.where(np.random.default_rng(seed + 100).random((n, n)) < 0.5, -1.0, 1.0)
  np.fill_diagonal(signs, 1.0)
  return c * signs


def _plan_args(c, d, zeta, z, k):
  return dict(sensitivity=participation.sensitivity_report(c, participation.SINGLE)["value"],
              clip_norm=zeta, noise_multiplier=z, model_size=d,
              bands=dg.band_coefficients(c).shape[1], participations=1, n=c.shape[0],
              records=k, encoder=c)


def _largest_granularity(c, d, zeta, k):
  """The γ at which ``worst_magnitude`` meets 2⁴⁰ (the plan's boundary)."""
  b = dg.band_coefficients(c).shape[1]
  return dg.MAGNITUDE_LIMIT / dg.worst_magnitude(1.0, zeta, k, d, b, dg.row_sum(c))


def _run_worst_case(c, plan, zeta, k):
  """Every row t* of C in turn: rounds j ≤ t* sum K records ζ·sign(C_t*j)·e₀ (each clipped to
  ζ, summed in float64), so γ·Σ_j |C_t*j|·|x_j,0| = γ·K·ζ·Σ_j |C_t*j|, the most any clipped
  data reaches; every round must release (CheckError otherwise)."""
  n, d = c.shape[0], plan.model_size
  for target in range(n):
    stream = dg.IntegerRelease(c, plan, KEY)
    for j in range(target + 1):
      v = np.zeros(d)
      v[0] = 1e6 * (1.0 if c[target, j] >= 0 else -1.0)
      record = v * min(1.0, zeta / np.linalg.norm(v))  # clipped to ζ in float64
      stream.step(np.sum(np.tile(record, (k, 1)), axis=0))


def test_plan_refuses_a_granularity_a_round_could_halt_at():
  """Issue 46, item 6: at γ = 2^38 (C = I, ζ = 1) a sum of 4 in one coordinate passed the
  round's 2⁴⁰ check and a sum of 5 refused the round, so whether a run halted depended on
  one client's data. The plan now refuses γ for the worst case of its K records, in one line
  naming γ, the bound and the largest γ that fits; that γ plans and its worst case runs."""
  for k in (5, dg.records_covered(10)):
    args = _plan_args(np.eye(4), 10, 1.0, 1.0, k)
    with pytest.raises(checks.CheckError) as e:
      dg.plan(granularity=2.0**38, **args)
    message = str(e.value)
    assert "\n" not in message and "granularity 2.74878e+11" in message
    assert "2^40" in message and "or less" in message
    top = float(message.rsplit("use granularity ", 1)[1].split(" or less")[0])
    plan = dg.plan(granularity=top, **args)
    assert dg.worst_magnitude(top, 1.0, k, 10, 1, 1.0) <= dg.MAGNITUDE_LIMIT < 2 * top * k
    _run_worst_case(np.eye(4), plan, 1.0, k)
  # The released sum of 4 still releases where K = 4 records are planned at 2^37.
  plan = dg.plan(granularity=2.0**37, **_plan_args(np.eye(4), 10, 1.0, 1.0, 4))
  x = np.zeros(10)
  x[3] = -4.0
  dg.IntegerRelease(np.eye(4), plan, KEY).step(x)


def test_default_granularity_still_plans():
  """The default γ plans for the benchmark's model (d = 4,050,748, 4 bands, K = 2^16) and a
  small one, with room under 2⁴⁰; where no γ fits both bounds the refusal says so."""
  for c, d in ((_banded_c(16, 4, seed=1), 4_050_748), (np.eye(16), 4_050_748),
               (_banded_c(8, 3, seed=2), 50)):
    args = _plan_args(c, d, 1.0, 1.0, dg.records_covered(100))
    plan = dg.plan(**args)
    assert plan.inflation <= dg.ROUNDING_INFLATION and plan.row_sum == dg.row_sum(c)
    assert dg.worst_magnitude(plan.granularity, 1.0, plan.records, d, plan.bands,
                              plan.row_sum) <= dg.MAGNITUDE_LIMIT
  with pytest.raises(checks.CheckError, match="no granularity keeps both") as e:
    dg.plan(**_plan_args(np.eye(4) * 3.0, 10**10, 1.0, 1.0, dg.records_covered(10)))
  assert "\n" not in str(e.value)


@pytest.mark.parametrize("seed", range(6))
def test_planned_worst_case_never_reaches_the_round_checks(seed):
  """Property over random b-banded C (signed), d, ζ, z and K: at the default γ and at the
  largest γ the plan accepts (just under its boundary), the worst case of K records clipped
  to ζ in every row releases every round; 10⁻⁶ above the boundary the plan refuses."""
  rng = np.random.default_rng(seed)
  n = int(rng.integers(2, 7))
  c = _signed_banded_c(n, int(rng.integers(1, n + 1)), seed)
  d, zeta = int(rng.integers(1, 12)), float(rng.uniform(0.3, 4.0))
  z, k = float(rng.uniform(0.5, 3.0)), int(rng.choice([1, 3, 64, 1000]))
  args = _plan_args(c, d, zeta, z, k)
  _run_worst_case(c, dg.plan(**args), zeta, k)
  edge = _largest_granularity(c, d, zeta, k)
  plan = dg.plan(granularity=edge * (1 - 1e-12), **args)
  _run_worst_case(c, plan, zeta, k)
  with pytest.raises(checks.CheckError, match="above the 2\\^40"):
    dg.plan(granularity=edge * (1 + 1e-6), **args)
  # The worst case is tight: 10⁻³ past the boundary (a plan built around the check) it halts.
  with pytest.raises(checks.CheckError, match="exceeds 2\\^40"):
    _run_worst_case(c, dataclasses.replace(plan, granularity=edge * 1.001), zeta, k)


def test_noise_bound_covers_the_samplers_extreme_draw():
  """The largest |N| a sampler can draw (u = the float64 below 1 in one geometric, 0 in the
  other) is at most ``noise_bound``, the headroom the plan keeps under 2⁵²."""
  top = np.nextafter(1.0, 0.0)
  for sigma in (0.7, 3.0, 1e6, 1e13):
    for u in (np.array([[top], [0.0], [0.0]]), np.array([[0.0], [top], [0.0]])):
      y, _ = dg.candidates(u, sigma)
      assert abs(int(y[0])) <= dg.noise_bound(sigma)
      assert abs(int(y[0])) >= dg.noise_bound(sigma) * (1 - 2e-6) - 2  # and not far above it


def test_release_refuses_a_c_beyond_its_plan():
  """A plan checked for C = I does not cover 2·I (twice the reach): refused at construction."""
  plan = dg.plan(**_plan_args(np.eye(3), 4, 1.0, 1.0, 1))
  with pytest.raises(checks.CheckError, match="largest row sum") as e:
    dg.IntegerRelease(2.0 * np.eye(3), plan, KEY)
  assert "\n" not in str(e.value)


@pytest.mark.parametrize("delta", [1e-6, 1e-100, 1e-320])
@pytest.mark.parametrize("z", [1e3, 1e6, 1e100, 1e300])
def test_zcdp_epsilon_is_a_bound_past_float64s_range(z, delta):
  """Issue 46, item 8: ε is Cor. 13's bound at the returned order plus its float64 error, so
  never below it; 0 only where Cor. 13 at that order proves (0, δ)-DP; an underflowed ρ is
  accounted as ``RHO_FLOOR`` (not as ρ = 0, which read as ε = 0 at every δ), and a subnormal
  δ (1/δ = inf) no longer turns the search into NaN and ε into 0."""
  eps, alpha = dg.zcdp_epsilon(dg.rho(z, 1.0), delta)
  assert math.isfinite(alpha) and alpha > 1
  with decimal.localcontext() as ctx:
    ctx.prec = 400  # 1/α is ~1e-150 at most: 1 − 1/α keeps 250 digits
    ratio = (1 + decimal.Decimal(dg.ROUNDING_INFLATION)) / decimal.Decimal(z)
    rho = ratio**2 / 2  # the true ρ, not floored
    a, d = decimal.Decimal(alpha), decimal.Decimal(delta)
    keep = (1 - 1 / a).ln()
    at = a * rho + keep - (d.ln() + a.ln()) / (a - 1)
    assert eps >= at
    if eps == 0.0:
      assert ((a - 1) * a * rho - (a - 1).ln() + a * keep).exp() <= d
  if delta == 1e-320 and z < 1e100:
    assert eps > 0.0
  assert dg.rho(z, 1.0) >= dg.RHO_FLOOR
