"""Monte-Carlo accounting with a proof (tff_mf.accounting.monte_carlo, analysis monte_carlo_bound)."""

import itertools
import json
import math
import re

import dp_accounting
from dp_accounting.pld import privacy_loss_distribution as pld_lib
import numpy as np
import pytest
from scipy import special
from scipy import stats

from tff_mf import accounting
from tff_mf.accounting import analyses
from tff_mf import checks
from tff_mf import cli
from tff_mf.accounting import monte_carlo
from tff_mf import participation
from tff_mf.accounting import statement

POISSON = participation.Participation("min_sep", min_sep=1)


def _dpsgd(q, sigma, delta, pessimistic, other=None):
  """ε of the Poisson-subsampled Gaussian (composed with ``other``, a PLD) from
  dp_accounting: pessimistic (above the true ε) or optimistic (below)."""
  pld = pld_lib.from_gaussian_mechanism(sigma, pessimistic_estimate=pessimistic, sampling_prob=q,
                                        value_discretization_interval=1e-4,
                                        use_connect_dots=pessimistic)
  if other is not None:
    pld = pld.compose(other(pessimistic))
  return float(pld.get_epsilon_for_delta(delta))


def _banded_toeplitz(n, bands):
  col = 0.7 ** np.arange(bands)
  col /= np.linalg.norm(col)
  return sum(np.diag(np.full(n - i, v), -i) for i, v in enumerate(col))


# ----------------------------------------------------------------------------- validity


def test_upper_bound_holds_in_at_least_1_minus_beta_of_runs():
  """C = I, one column: the pair is the Poisson-subsampled Gaussian, whose ε lies above
  dp_accounting's optimistic PLD. With β = 0.2 each run's bound may fail with probability
  ≤ 0.2; over 30 pinned runs the binomial count of failures exceeds its 0.999 quantile
  with probability ≤ 0.001 under the claim, while an estimate without its confidence bound (the point estimate)
  falls below the exact ε in about half the runs, so the check tells the two apart."""
  q, z, delta, beta, runs = 0.3, 1.0, 1e-2, 0.2, 30
  exact_low = _dpsgd(q, z, delta, pessimistic=False)
  exact_high = _dpsgd(q, z, delta, pessimistic=True)
  assert exact_high - exact_low < 0.01  # the exact ε is known to two decimals
  bounds, points = [], []
  for seed in range(runs):
    found = monte_carlo.epsilon(np.eye(1), POISSON, z, delta, sampling_prob=q, samples=20_000,
                                failure_probability=beta, seed=seed)
    bounds.append(found["epsilon"])
    points.append(found["point_estimate"])
  failures = sum(b < exact_low for b in bounds)
  limit = int(stats.binom.isf(0.001, runs, beta))  # exceeded with probability <= 0.001
  assert failures <= limit, (failures, limit, exact_low, bounds)
  assert sum(p < exact_high for p in points) >= 5  # an estimate alone fails often
  # The confidence bound costs what its width says: at 20,000 draws within about 0.3.
  assert max(bounds) < exact_high + 0.3


def test_one_sided_pinned_run_is_above_exact_and_tight():
  """One pinned run with β = 1e-6: above the exact ε, and within the bound's width."""
  q, z, delta = 0.05, 0.8, 1e-2
  found = monte_carlo.epsilon(np.eye(1), POISSON, z, delta, sampling_prob=q, samples=200_000,
                              failure_probability=1e-6, seed=11)
  assert found["epsilon"] >= _dpsgd(q, z, delta, pessimistic=True)
  assert found["epsilon"] < _dpsgd(q, z, delta, pessimistic=True) + 0.3
  assert found["seed"] == 11 and found["seed_source"] == "pinned"


def test_kl_upper_is_the_chernoff_hoeffding_bound():
  """δ⁺ solves N·kl(mean ‖ δ⁺) = log(1/β), lies above the mean, and for a zero mean is
  1 − β^(1/N) (the exact binomial bound for no hit)."""
  n, beta = 10_000, 1e-3
  assert monte_carlo.kl_upper(0.0, n, beta) == pytest.approx(1 - beta ** (1 / n), rel=1e-9)
  mean = 0.01
  up = monte_carlo.kl_upper(mean, n, beta)
  kl = special.rel_entr(mean, up) + special.rel_entr(1 - mean, 1 - up)
  assert up > mean and n * kl == pytest.approx(math.log(1 / beta), rel=1e-9)


def test_poisson_loss_is_the_exact_mixture_sum():
  """The dynamic program over interacting joins equals the sum over all 2^k patterns."""
  rng = np.random.default_rng(0)
  n, b, p, sigma = 12, 2, 0.3, 1.3
  band = np.tril(np.ones((n, n))) - np.tril(np.ones((n, n)), -5)
  c = np.tril(rng.random((n, n))) * band
  pairs = monte_carlo.poisson_pairs(c, b, p)
  assert len(pairs) == b and max(pair.width for pair in pairs) == 2
  for pair in pairs:
    g = 2.0 * rng.standard_normal((5, pair.size))
    u = np.array(list(itertools.product((0, 1), repeat=pair.size)), float)
    log_pi = np.sum(np.where(u > 0, math.log(p), math.log(1 - p)), axis=1)
    quad = 0.5 * np.einsum("pi,ij,pj->p", u, pair.gram, u)
    brute = special.logsumexp(log_pi[None, :] + (g @ u.T - quad[None, :]) / sigma ** 2, axis=1)
    np.testing.assert_allclose(monte_carlo._poisson_loss(pair, g, sigma), brute,
                               rtol=1e-12, atol=1e-12)


def test_bins_pair_is_the_mixture_over_bins():
  """The Gram route gives the loss of N(0, σ²I) vs the mean over bins j of N(C 1_{S_j}, σ²I)
  evaluated on y itself."""
  rng = np.random.default_rng(1)
  n, b, sigma = 12, 4, 1.1
  c = _banded_toeplitz(n, 3)
  pair = monte_carlo.bins_pair(c, b)
  means = np.stack([c[:, j::b].sum(axis=1) for j in range(b)], axis=1)
  y = rng.standard_normal((6, n)) * sigma + means[:, 1][None, :]
  direct = special.logsumexp((y @ means - 0.5 * np.sum(means ** 2, axis=0)) / sigma ** 2,
                             axis=1) - math.log(b)
  g = y @ means
  via_gram = special.logsumexp((g - 0.5 * np.diag(pair.gram)) / sigma ** 2, axis=1) - math.log(b)
  np.testing.assert_allclose(via_gram, direct, rtol=1e-12)


def test_toeplitz_c_samples_class_zero_only():
  c = _banded_toeplitz(16, 3)
  assert len(monte_carlo.poisson_pairs(c, 4, 0.5)) == 1
  c[5, 5] = 0.5  # no longer Toeplitz: every class is sampled
  assert len(monte_carlo.poisson_pairs(c, 4, 0.5)) == 4


def test_bins_pair_with_one_bin_is_the_gaussian():
  """b = 1 bin (every round joined): the pair is one Gaussian with sensitivity ‖C 1‖."""
  c = _banded_toeplitz(8, 2)
  sens = float(np.linalg.norm(c.sum(axis=1)))
  schema = participation.Participation("balls_in_bins", epochs=8)
  z, delta = 2.0 * sens, 1e-2
  found = monte_carlo.epsilon(c, schema, z, delta, samples=100_000, failure_probability=1e-3,
                              seed=3)
  exact = analyses.ExactGaussian().epsilon(z, delta, sens)
  assert exact <= found["epsilon"] < exact + 0.3


# ----------------------------------------------------------------------------- calibration


def test_calibration_is_the_sweep_point_before_the_first_failure():
  """The z returned passes its own test on the same draws, the next z of the sweep fails,
  and for C = I the exact ε at it is within the target (one pinned run, β = 1e-6)."""
  q, target, delta = 0.3, 1.0, 1e-2
  z_start = 1.2  # any start works (ε = 0.62 here, by dp_accounting); a near one is quick
  options = dict(sampling_prob=q, samples=30_000, failure_probability=1e-6, seed=4)
  found = monte_carlo.calibrate(np.eye(1), POISSON, target, delta, z_start, **options)
  z = found["noise_multiplier"]
  assert z < z_start and found["sweep_steps"] >= 2
  assert monte_carlo.epsilon(np.eye(1), POISSON, z, delta, **options)["epsilon"] <= target
  assert monte_carlo.epsilon(np.eye(1), POISSON, z / 1.02, delta, **options)["epsilon"] > target
  assert _dpsgd(q, z, delta, pessimistic=False) <= target  # the true ε(z) is at least this


def test_calibrate_through_accounting_labels_the_target():
  c = _banded_toeplitz(16, 2)
  schema = participation.Participation("balls_in_bins", epochs=4)
  analysis = analyses.MonteCarloBound(samples=20_000, failure_probability=1e-3, seed=5)
  record = accounting.calibrate(c, schema, 2.0, 1e-2, analysis)
  assert record["epsilon"] == 2.0 and record["failure_probability"] == 1e-3
  assert "1 - 0.001" in record["epsilon_label"]
  assert record["noise_multiplier"] < accounting.calibrate(c, schema, 2.0, 1e-2)[
      "noise_multiplier"]


# ----------------------------------------------------------------------------- composition


def test_composition_with_a_dp_accounting_event():
  """C = I (Poisson) composed with a Gaussian DpEvent: the bound lies above the exact ε of
  the composition (dp_accounting's PLD of both) and within the bound's width of it."""
  q, z, z2, delta = 0.3, 1.0, 3.0, 1e-2
  found = monte_carlo.epsilon(np.eye(1), POISSON, z, delta, sampling_prob=q, samples=100_000,
                              failure_probability=1e-6, seed=6,
                              other_events=[dp_accounting.GaussianDpEvent(z2)])

  def gaussian(pessimistic):
    return pld_lib.from_gaussian_mechanism(z2, pessimistic_estimate=pessimistic,
                                           value_discretization_interval=1e-4,
                                           use_connect_dots=pessimistic)

  exact = _dpsgd(q, z, delta, True, gaussian)
  alone = monte_carlo.epsilon(np.eye(1), POISSON, z, delta, sampling_prob=q, samples=100_000,
                              failure_probability=1e-6, seed=6)["epsilon"]
  assert exact <= found["epsilon"] < exact + 0.3
  assert found["epsilon"] > alone and found["composed_events"] == 1


# ----------------------------------------------------------------------------- the label


def _record(**options):
  c = _banded_toeplitz(16, 2)
  schema = participation.Participation("balls_in_bins", epochs=4)
  analysis = analyses.MonteCarloBound(samples=20_000, failure_probability=0.01, **options)
  return accounting.epsilon_for(c, schema, 2.0, 1e-2, analysis)


def test_record_and_statement_carry_the_label():
  record = _record(seed=7)
  assert record["failure_probability"] == 0.01 and record["bound"] == "amplified"
  assert "epsilon" not in record["monte_carlo"]  # ε once, beside its β
  out = statement.privacy_statement(record, run=False)
  label = "holds with probability >= 1 - 0.01 over the accountant's own sampling"
  guarantee = [l for l in out["text"].splitlines() if "Guarantee:" in l][0]
  assert label in guarantee and out["failure_probability"] == 0.01
  row = [r for r in out["epsilons"] if r["analysis"] == "monte_carlo_bound"][0]
  assert label in row["label"]


def test_statement_refuses_the_epsilon_without_its_label():
  record = _record(seed=8).without("failure_probability")
  with pytest.raises(checks.CheckError, match="never reported without that label"):
    statement.privacy_statement(record, run=False)


def test_a_bare_epsilon_is_refused():
  """The analysis object's bare-float ε would drop β: refused, naming the labelled way."""
  with pytest.raises(checks.CheckError, match="never given without that label"):
    analyses.MonteCarloBound(samples=20_000).epsilon(
        _banded_toeplitz(16, 2), participation.Participation("balls_in_bins", epochs=4), 2.0,
        1e-2)


def test_seed_from_os_entropy_unless_pinned():
  first, second = _record()["monte_carlo"], _record()["monte_carlo"]
  assert first["seed_source"] == second["seed_source"] == "os_entropy"
  assert first["seed"] != second["seed"]


def test_too_few_samples_is_one_clear_error():
  with pytest.raises(monte_carlo.MonteCarloError, match=r"use samples >= \d+"):
    monte_carlo.epsilon(np.eye(1), POISSON, 1.0, 1e-6, sampling_prob=0.3, samples=1000,
                        failure_probability=1e-3, seed=0)


def test_signed_or_wide_c_is_refused():
  with pytest.raises(monte_carlo.MonteCarloError, match="C >= 0"):
    monte_carlo.poisson_pairs(-np.eye(4), 1, 0.5)
  with pytest.raises(monte_carlo.MonteCarloError, match="lower-triangular"):
    monte_carlo.bins_pair(np.ones((4, 4)), 2)
  with pytest.raises(monte_carlo.MonteCarloError, match="use amplification 'mmcc'"):
    monte_carlo.poisson_pairs(np.tril(np.ones((24, 24))), 2, 0.5)


# ----------------------------------------------------------------------------- the CLI

CLI = ["account", "--mechanism", "gaussian", "--total_rounds", "8", "--participation",
       "balls_in_bins", "--epochs", "2", "--amplification", "monte_carlo_bound",
       "--noise_multiplier", "2", "--delta", "1e-2", "--bound_samples", "20000",
       "--failure_probability", "0.01", "--accountant_seed", "9"]


def test_cli_prints_every_epsilon_with_its_label(capsys):
  assert cli.main(CLI) == 0
  out = capsys.readouterr().out
  label = ("(holds with probability >= 1 - 0.01 over the accountant's own sampling, for an "
           "accountant seed fixed before any result was seen; trying several seeds and keeping "
           "the smallest epsilon voids this)")
  for key in ("epsilon", "amplified_epsilon"):
    line = [l for l in out.splitlines() if l.startswith(f"{key}: ")][0]
    assert line.endswith(label), line
  assert re.search(r"Guarantee: .*holds with probability >= 1 - 0.01", out)
  assert cli.main(CLI + ["--json"]) == 0
  record = json.loads(capsys.readouterr().out)
  assert record["failure_probability"] == 0.01 and record["monte_carlo"]["seed"] == 9
  assert "holds with probability" in record["privacy_statement"]["text"]


@pytest.mark.parametrize("extra,match", [
    (["--failure_probability", "1.5"], r"--failure_probability must be in \(0, 1\)"),
    (["--bound_samples", "10"], r"--bound_samples must be an integer >= 1000"),
])
def test_cli_bad_flags_are_one_line(extra, match, capsys):
  rc = cli.main(CLI + extra)
  err = capsys.readouterr().err.strip().splitlines()
  assert rc == 2 and len(err) == 1 and re.search(match, err[0]), err


@pytest.mark.parametrize("argv,match", [
    (CLI[:-6] + ["--delta", "1e-6", "--bound_samples", "10000"],
     r"--bound_samples = 10000 cannot certify delta = 1e-06 .* use --bound_samples >= \d+, a "
     r"larger delta or a larger --failure_probability"),
    (["account", "--mechanism", "gaussian", "--total_rounds", "8", "--min_sep", "2",
      "--amplification", "monte_carlo_bound", "--noise_multiplier", "2", "--delta", "1e-3"],
     r"needs --sampling_prob$"),
])
def test_cli_library_refusals_name_the_flags(argv, match, capsys):
  rc = cli.main(argv)
  err = capsys.readouterr().err.strip().splitlines()
  assert rc == 2 and len(err) == 1 and re.search(match, err[0]), err


def test_cli_monte_carlo_flags_need_the_analysis(capsys):
  argv = ["account", "--noise_multiplier", "2", "--delta", "1e-2", "--accountant_seed", "3"]
  rc = cli.main(argv)
  err = capsys.readouterr().err.strip().splitlines()
  assert rc == 2 and len(err) == 1 and "--accountant_seed applies to --amplification " \
      "monte_carlo_bound" in err[0], err


# ----------------------------------------------------------------------------- a run's record


def test_run_privacy_uses_it_and_keeps_the_label():
  """A run's record (tff_mf.mechanisms.run_privacy) with the analysis chosen: its ε, its
  candidate and its statement carry β."""
  from tff_mf import mechanisms  # pylint: disable=g-import-not-at-top
  c = _banded_toeplitz(16, 2)
  schema = participation.Participation("balls_in_bins", epochs=4)
  analysis = analyses.MonteCarloBound(samples=20_000, failure_probability=0.01, seed=10)
  record = mechanisms.run_privacy(c, schema, 2.0, None, 1e-2, "exact", amplification=analysis)
  details = record.details
  assert details["analysis"] == "monte_carlo_bound" and details["failure_probability"] == 0.01
  candidate = [k for k in details["candidates"] if k["analysis"] == "monte_carlo_bound"][0]
  assert candidate["failure_probability"] == 0.01
  text = statement.privacy_statement(record)["text"]
  assert "this epsilon holds with probability >= 1 - 0.01" in text
  label = "holds with probability >= 1 - 0.01 over the accountant's own sampling"
  assert label in record.analysis  # the record's words for the analysis behind ε
  info = record.info(clip_norm=1.0)
  assert info["failure_probability"] == 0.01 and info["epsilon_label"].startswith(label)
  assert "seed fixed before any result was seen" in info["epsilon_label"]
