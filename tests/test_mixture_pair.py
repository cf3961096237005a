"""The mixture pair of b-min-sep Poisson sampling: proven lower bound and Monte-Carlo estimate."""

import dp_accounting
from dp_accounting.pld import privacy_loss_distribution as pld_lib
import numpy as np
import pytest

from tff_mf.accounting import mixture_pair
from tff_mf.accounting import mmcc

DELTA = 1e-6


def _dpsgd(steps, q, sigma, pessimistic):
  """DP-SGD ε from dp_accounting: pessimistic PLD (above the true ε) or optimistic (below)."""
  pld = pld_lib.from_gaussian_mechanism(sigma, pessimistic_estimate=pessimistic, sampling_prob=q,
                                        value_discretization_interval=1e-3,
                                        use_connect_dots=pessimistic)
  return float((pld.self_compose(steps) if steps > 1 else pld).get_epsilon_for_delta(DELTA))


@pytest.mark.parametrize("q,sigma", [(0.3, 1.0), (0.05, 0.8)])
def test_single_participation_lower_bound_is_dpsgd(q, sigma):
  """k = 1, C = I: the pair is one Poisson-subsampled Gaussian and the threshold test is
  optimal, so the bound sits between dp_accounting's optimistic and pessimistic PLDs."""
  lb = mixture_pair.lower_bound(np.eye(1), q, sigma, DELTA).epsilon
  assert _dpsgd(1, q, sigma, False) * (1 - 1e-6) <= lb <= _dpsgd(1, q, sigma, True)


def test_lower_bound_below_dpsgd_for_k_rounds():
  """C = I, b = 8, n = 64: k = 8 DP-SGD steps; the projection is a lower bound on them."""
  lb = mixture_pair.lower_bound(np.eye(64), 0.25, 2.0, DELTA, min_sep=8)
  assert lb.columns == 8
  assert 0.8 * _dpsgd(8, 0.25, 2.0, False) <= lb.epsilon <= _dpsgd(8, 0.25, 2.0, True)


def test_lower_bound_below_mmcc_for_blt():
  from tff_mf.factorization.families import blt  # pylint: disable=g-import-not-at-top
  c = blt.from_theta_pair(np.array([0.99, 0.8]), np.array([0.95, 0.5]))[0].matrix(32)
  c = c / np.sqrt(np.max(np.sum(c * c, axis=0)))
  upper = mmcc.mmcc_epsilon(c, 0.3 / 4, 1.5, DELTA, min_sep=4, workers=1, grid_resolution=8,
                            pld_discretization=1e-3)
  lb = mixture_pair.lower_bound(c, 0.3, 1.5, DELTA, min_sep=4).epsilon
  assert 0 < lb <= upper


def test_monte_carlo_is_an_estimate_near_dpsgd():
  """The estimate (not a bound) lands near the exact ε for k = 1 (seeded)."""
  est = mixture_pair.monte_carlo_epsilon(np.eye(1), 0.3, 1.0, 1e-3, samples=100_000, seed=1)
  exact = pld_lib.from_gaussian_mechanism(1.0, sampling_prob=0.3).get_epsilon_for_delta(1e-3)
  assert est["epsilon"] == pytest.approx(exact, rel=0.05)
  assert est["samples"] == 100_000 and est["tail_hits"] > 100


def test_bad_inputs():
  with pytest.raises(mixture_pair.MixturePairError, match="non-negative"):
    mixture_pair.lower_bound(-np.eye(2), 0.5, 1.0, DELTA)
  with pytest.raises(mixture_pair.MixturePairError, match="min_sep"):
    mixture_pair.lower_bound(np.eye(2), 0.5, 1.0, DELTA, min_sep=3)
  with pytest.raises(mixture_pair.MixturePairError, match="samples"):
    mixture_pair.monte_carlo_epsilon(np.eye(2), 0.5, 1.0, DELTA, samples=10)
