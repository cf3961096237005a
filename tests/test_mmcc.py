"""MMCC (Choquette-Choo et al. 2024, arXiv:2310.15526): amplification for matrix mechanisms."""

import dataclasses
import itertools

import dp_accounting
from dp_accounting.pld import privacy_loss_distribution as pld_lib
import numpy as np
import pytest
from scipy import stats

from tff_mf.accounting import gaussian
from tff_mf.accounting import mmcc
from tff_mf.factorization.families import tree

DELTA = 1e-6
FAST = dict(workers=1, grid_resolution=8)


def _dpsgd_epsilon(n, p, sigma, delta=DELTA):
  """DP-SGD ε straight from dp_accounting (pessimistic PLD, an upper estimate)."""
  acc = dp_accounting.pld.PLDAccountant(value_discretization_interval=1e-4)
  acc.compose(dp_accounting.PoissonSampledDpEvent(p, dp_accounting.GaussianDpEvent(sigma)), n)
  return acc.get_epsilon(delta)


def _dpsgd_lower(n, p, sigma, delta=DELTA, discretization=1e-3):
  """DP-SGD ε from dp_accounting's optimistic PLD: a valid LOWER bound on the true ε.

  (Optimistic rounding on any grid under-estimates ε; 1e-3 keeps it fast and still
  within about 0.1% of the true value.)
  """
  pld = pld_lib.from_gaussian_mechanism(sigma, pessimistic_estimate=False, sampling_prob=p,
                                        value_discretization_interval=discretization,
                                        use_connect_dots=False)
  return float((pld.self_compose(n) if n > 1 else pld).get_epsilon_for_delta(delta))


def _random_c(n, seed, density=0.7):
  rng = np.random.default_rng(seed)
  c = np.tril(rng.uniform(0.0, 1.0, (n, n)) * (rng.uniform(size=(n, n)) < density))
  np.fill_diagonal(c, rng.uniform(0.5, 1.0, n))
  return c / np.sqrt(np.max(np.sum(c * c, axis=0)))


def _no_amplification_epsilon(c, sigma, delta=DELTA):
  """Same mechanism, every example in every round: Gaussian with sensitivity ‖C·1‖ (Lemma B.2)."""
  return gaussian.gaussian_epsilon_exact(sigma / np.linalg.norm(c.sum(axis=1)), delta)


@pytest.mark.parametrize("n,p,sigma", [(10, 0.2, 1.5), (40, 0.05, 1.0), (100, 0.01, 0.8)])
def test_identity_is_dpsgd(n, p, sigma):
  """C = I reduces to DP-SGD with Poisson sampling (Sec 2.2).

  Privacy side: never below a valid lower bound on the true ε (dp_accounting's
  optimistic PLD), with no tolerance. Tightness side: at most 1e-6 relative above
  dp_accounting's pessimistic PLD of the same mechanism on the same 1e-4 grid; the
  two pessimistic PLDs are the same discretized mechanism and differ only in where
  the inverse privacy loss is located on the grid (about 1e-9 relative either way,
  depending on the platform's libm), so there is no lower check against it.
  """
  eps = mmcc.mmcc_epsilon(mmcc.identity_matrix(n), p, sigma, DELTA, workers=1)
  assert _dpsgd_lower(n, p, sigma) <= eps <= _dpsgd_epsilon(n, p, sigma) * (1 + 1e-6)


@pytest.mark.parametrize("seed", [0, 1])
def test_random_matrices_amplification_properties(seed):
  n = 6
  c = _random_c(n, seed)
  p = 0.1
  eps = [mmcc.mmcc_epsilon(c, p, s, DELTA, **FAST) for s in (3.0, 6.0, 12.0)]
  # ε decreases as σ grows.
  assert eps[0] > eps[1] > eps[2]
  # Never above the same mechanism analyzed without amplification.
  for s, e in zip((3.0, 6.0, 12.0), eps):
    assert e <= _no_amplification_epsilon(c, s) * (1 + 1e-6)
  # At p = 1 (no sampling) ε is at least the single-participation ε (Denisov Thm 4.1) and
  # equals the deterministic composition of the rows (every p̃ = 1).
  full = mmcc.mmcc(c, 1.0, 4.0, DELTA, **FAST)
  assert full.delta_tail == 0.0  # p̃ = 1 needs no tail bound
  assert full.epsilon >= full.unamplified_epsilon
  assert full.epsilon >= gaussian.gaussian_epsilon_exact(4.0, DELTA)
  # Rounding C up to the grid is the only slack at p = 1.
  rounded = mmcc.round_up_to_grid(c, full.grid_step) * full.grid_step * (c > 0)
  assert full.epsilon == pytest.approx(_no_amplification_epsilon(rounded, 4.0), rel=2e-3)


def test_amplification_beats_single_participation_at_large_noise():
  """Sec 6.1: with σ = c·√(log₂n+1) and p = 1/n the binary tree's ε drops below unamplified."""
  r = mmcc.mmcc(mmcc.binary_tree_matrix(16), 1 / 16, 16.0, DELTA, workers=1)
  assert r.unamplified_epsilon / r.epsilon > 1.1


@pytest.mark.parametrize("seed", [3, 4])
def test_finer_grid_never_raises_epsilon(seed):
  c = _random_c(4, seed)
  step = float(np.max(c)) / 4
  eps = [mmcc.mmcc_epsilon(c, 0.2, 4.0, DELTA, grid_step=step / k, workers=1)
         for k in (1, 2, 4)]
  assert all(b <= a for a, b in zip(eps, eps[1:])), eps


def test_workers_and_dedupe_do_not_change_epsilon():
  c = mmcc.binary_tree_matrix(8)
  a = mmcc.mmcc(c, 0.125, 6.0, DELTA, workers=1, dedupe=False)
  b = mmcc.mmcc(c, 0.125, 6.0, DELTA, workers=2, dedupe=True)
  assert b.distinct_rows == 4 and a.distinct_rows == 15  # tree rows repeat by level (F.4)
  assert a.epsilon == pytest.approx(b.epsilon, rel=1e-6)


def test_truncated_sqrt_prefix_rows_repeat_after_2b_minus_1():
  c = mmcc.truncated_sqrt_prefix_matrix(24, 4)
  r = mmcc.mmcc(c, 0.1, 4.0, DELTA, workers=1, grid_resolution=8)
  assert r.distinct_rows <= 2 * 4 - 1


def test_min_sep_on_banded_matrix_is_dpsgd():
  """App D: for a b-banded C (TreeRestart, b = 2^(h-1)) b-min-sep MMCC is DP-SGD with n/b
  steps at sampling probability b·p (Choquette-Choo et al. 2023a)."""
  n, h, p, sigma = 32, 3, 1 / 16, 2.0
  b = 1 << (h - 1)
  eps = mmcc.mmcc_epsilon(mmcc.tree_restart_matrix(n, h), p, sigma, DELTA, min_sep=b, workers=1)
  # One-sided: at least a valid lower bound; at most 0.5% above (entries of C are
  # rounded up to multiples of max|C|/64).
  assert _dpsgd_lower(n // b, b * p, sigma) * (1 - 1e-9) <= eps
  assert eps <= _dpsgd_epsilon(n // b, b * p, sigma) * 1.005


@pytest.mark.parametrize("n,p,sigma", [(16, 1 / 16, 4.0)])
def test_binary_tree_is_at_least_dpsgd_on_its_leaf_rows(n, p, sigma):
  """A valid lower bound for p < 1 and a non-trivial C.

  The leaf rows of the normalized C_T are I/√L (L = log₂n + 1 levels): on their own
  they are DP-SGD with n steps at noise multiplier σ·√L. Releasing every row reveals
  at least as much, so MMCC's ε is at least that DP-SGD's (optimistic PLD, a lower
  bound). Monotonicity alone would let an optimistic implementation pass.
  """
  levels = int(np.log2(n)) + 1
  eps = mmcc.mmcc_epsilon(mmcc.binary_tree_matrix(n), p, sigma, DELTA, workers=1)
  assert eps >= _dpsgd_lower(n, p, sigma * np.sqrt(levels))


def test_tiny_noise_coarsens_the_grid_and_refuses_beyond(monkeypatch):
  """σ = 1e-3 used to need a PLD grid of ~1e10 points per row; now bounded, then refused.

  (A smaller row budget than the default 2^20 points keeps the test fast; the bounds
  of the result are tested in test_accounting.)
  """
  monkeypatch.setattr(mmcc, "MAX_ROW_POINTS", 1 << 16)
  r = mmcc.mmcc(mmcc.identity_matrix(2), 0.5, 1e-3, DELTA, workers=1)
  assert r.pld_discretization > 3e4 * mmcc.DEFAULT_PLD_DISCRETIZATION
  eps_gaussian = gaussian.gaussian_epsilon_exact(1e-3, DELTA)
  assert eps_gaussian * 0.99 <= r.epsilon <= 2 * eps_gaussian  # two rounds, each ≈ ε_G + log p
  with pytest.raises(mmcc.MMCCNumericError, match="grid points"):
    mmcc.mmcc(mmcc.identity_matrix(2), 0.5, 1e-4, DELTA, workers=1)


def test_left_tail_search_failure_is_handled():
  """dp_accounting's left-truncation search for a REMOVE mixture fails when the cdf at the
  left end of its interval exceeds the truncated mass by rounding (ppf/cdf round trip;
  a deterministic row, p̃ = 1, at small σ, seen in MMCC of the binary tree at σ = 0.1).
  The fast class then truncates at that end: the mass left of it counts as infinite
  loss, which is pessimistic."""
  from dp_accounting.pld import privacy_loss_mechanism as plm  # pylint: disable=g-import-not-at-top
  args = (0.1, np.array([7.15541753]), np.array([1.0]))
  kwargs = dict(pessimistic_estimate=True, adjacency_type=plm.AdjacencyType.REMOVE)
  fast = mmcc._fast_mog_class()(*args, **kwargs)  # pylint: disable=protected-access
  tail = fast.privacy_loss_tail()
  assert np.isfinite(tail.lower_x_truncation) and np.isfinite(fast.connect_dots_bounds().epsilon_upper)
  try:
    upstream = plm.MixtureGaussianPrivacyLoss(*args, **kwargs).privacy_loss_tail()
  except TypeError:  # the upstream failure this works around
    return
  assert tail.lower_x_truncation <= upstream.lower_x_truncation


def test_inverse_privacy_loss_with_negligible_components():
  """Mixture weights of 1e-17 put kinks in the privacy loss where Newton stalls; the
  inverse falls back to bisection instead of failing (it used to raise after 1000 steps)."""
  sens, probs = np.array([0.0, 0.5, 1.0]), np.array([1e-17, 1e-17, 1.0 - 2e-17])
  pld = mmcc.mixture_pld(0.1, sens, probs, discretization=1e-2)
  eps = pld.get_epsilon_for_delta(DELTA)
  assert eps >= gaussian.gaussian_epsilon_exact(0.1, DELTA) * (1 - 1e-3)


def test_iid_sampling_beats_min_sep_tree_restart():
  """Fig 4 (small): TreeRestart h = 4, p = 1/16: MMCC's i.i.d. ε < b-min-sep ε.

  Holds once σ is large enough for the tail bounds to be tight (Sec 4); here
  (n = 64) the crossover is near σ ≈ 12 (see benchmarks/results/mmcc.md).
  """
  c = mmcc.tree_restart_matrix(64, 4)
  for sigma in (16.0, 32.0):
    iid = mmcc.mmcc_epsilon(c, 1 / 16, sigma, DELTA, workers=1)
    sep = mmcc.mmcc_epsilon(c, 1 / 16, sigma, DELTA, min_sep=8, workers=1)
    assert iid < sep


def test_strategy_matrices():
  for c in (mmcc.identity_matrix(8), mmcc.binary_tree_matrix(8), mmcc.tree_restart_matrix(16, 3),
            mmcc.truncated_sqrt_prefix_matrix(16, 5)):
    assert np.all(c >= 0)
    assert np.max(np.sum(c * c, axis=0)) == pytest.approx(1.0)
    mmcc.release_rounds(c)  # valid release order
  t = mmcc.binary_tree_matrix(8)
  assert np.allclose(t * 2.0, tree.tree_encoder(8))  # 4 levels
  r = mmcc.tree_restart_matrix(16, 3)
  assert r.shape == (4 * 7, 16) and np.allclose(r[:7, :4] * np.sqrt(3), tree.tree_encoder(4))
  assert np.all(r[:7, 4:] == 0)
  band = mmcc.truncated_sqrt_prefix_matrix(10, 3)
  assert np.all(np.tril(band, -3) == 0) and np.all(np.diag(band, -2) > 0)
  dense = mmcc.truncated_sqrt_prefix_matrix(12, 12)
  full = dense / dense[0, 0]
  assert np.allclose(full @ full, np.tril(np.ones((12, 12))))  # square root of S (App E)
  with pytest.raises(ValueError, match="height"):
    mmcc.strategy_matrix("tree_restart", 8)
  with pytest.raises(ValueError, match="bands"):
    mmcc.strategy_matrix("truncated_sqrt_prefix", 8)
  assert np.array_equal(mmcc.strategy_matrix("truncated_sqrt_prefix", 10, bands=3), band)
  # "banded_toeplitz" is the registry's optimized banded Toeplitz strategy, never the
  # truncated √S (one name, one meaning).
  with pytest.raises(ValueError, match="unknown strategy 'banded_toeplitz'"):
    mmcc.strategy_matrix("banded_toeplitz", 10, bands=3)
  with pytest.raises(ValueError, match="unknown strategy"):
    mmcc.strategy_matrix("fft", 8)


def test_sensitivity_pmf_matches_enumeration():
  units = np.array([1, 2, 2, 3])
  probs = np.array([0.1, 0.5, 0.3, 0.9])
  values, masses = mmcc.sensitivity_pmf(units, probs, tail_mass=0.0)
  brute = {}
  for bits in itertools.product([0, 1], repeat=4):
    v = int(np.dot(bits, units))
    w = np.prod([pp if b else 1 - pp for b, pp in zip(bits, probs)])
    brute[v] = brute.get(v, 0.0) + w
  assert dict(zip(values.tolist(), masses.tolist())) == pytest.approx(brute)
  # Tail truncation moves mass UP to the maximum (stochastic dominance).
  v2, m2 = mmcc.sensitivity_pmf(units, probs, tail_mass=0.05)
  assert v2[-1] == units.sum() and m2.sum() == pytest.approx(1.0)
  for t in range(0, 9):
    assert m2[v2 >= t].sum() >= masses[values >= t].sum() - 1e-15
  cv, cm = mmcc.coarsen_support(values, masses, 3)
  assert cv.size <= 3 and cm.sum() == pytest.approx(1.0)
  for t in range(0, 9):
    assert cm[cv >= t].sum() >= masses[values >= t].sum() - 1e-15


def test_round_up_to_grid_never_rounds_down():
  x = np.array([0.1, 0.3, 1 / 3, 0.7, 1.0])
  for step in (0.1, 1 / 3, 0.07):
    k = mmcc.round_up_to_grid(x, step)
    assert np.all(k * step >= x) and np.all((k - 1) * step < x)


def test_binomial_tail_is_exact():
  cache = {}
  for k in (1, 5, 40):
    t = mmcc._binomial_tail_counts(np.array([k]), 0.1, 1e-6, cache)[0]
    assert stats.binom.sf(t, k, 0.1) <= 1e-6
    if t > 0:
      assert stats.binom.sf(t - 1, k, 0.1) > 1e-6


@pytest.mark.parametrize("p", [0.0, -0.1, 1.5, float("nan")])
def test_bad_sampling_prob(p):
  with pytest.raises(ValueError, match="sampling_prob"):
    mmcc.mmcc_epsilon(np.eye(3), p, 1.0, DELTA)


@pytest.mark.parametrize("sigma", [0.0, -1.0])
def test_bad_sigma(sigma):
  with pytest.raises(ValueError, match="noise_multiplier"):
    mmcc.mmcc_epsilon(np.eye(3), 0.1, sigma, DELTA)


@pytest.mark.parametrize("delta", [0.0, 1.0, 1.5])
def test_bad_delta(delta):
  with pytest.raises(ValueError, match="delta"):
    mmcc.mmcc_epsilon(np.eye(3), 0.1, 1.0, delta)


def test_bad_shapes_and_structure():
  with pytest.raises(ValueError, match="2-D"):
    mmcc.mmcc_epsilon(np.ones(3), 0.1, 1.0, DELTA)
  with pytest.raises(ValueError, match="m >= n"):
    mmcc.mmcc_epsilon(np.ones((2, 3)), 0.1, 1.0, DELTA)
  with pytest.raises(ValueError, match="non-finite"):
    mmcc.mmcc_epsilon(np.array([[1.0, 0], [np.nan, 1]]), 0.1, 1.0, DELTA)
  with pytest.raises(ValueError, match="negative"):
    mmcc.mmcc_epsilon(np.array([[1.0, 0], [-0.5, 1]]), 0.1, 1.0, DELTA)
  with pytest.raises(ValueError, match="not lower triangular"):
    mmcc.mmcc_epsilon(np.array([[1.0, 0.5], [0, 1]]), 0.1, 1.0, DELTA)
  # Tree rows out of release order.
  c = tree.tree_encoder(4)[::-1]
  with pytest.raises(ValueError, match="release order"):
    mmcc.mmcc_epsilon(c, 0.1, 1.0, DELTA)
  with pytest.raises(ValueError, match="min_sep"):
    mmcc.mmcc_epsilon(np.eye(4), 0.5, 1.0, DELTA, min_sep=4)
  # The caller may assert the non-adaptive setting.
  eps = mmcc.mmcc_epsilon(np.array([[1.0, -0.5], [0, 1]]), 0.1, 2.0, DELTA, non_adaptive=True,
                          workers=1)
  same = mmcc.mmcc_epsilon(np.array([[1.0, 0.5], [0, 1]]), 0.1, 2.0, DELTA, non_adaptive=True,
                           workers=1)
  assert eps == pytest.approx(same) and np.isfinite(eps)


@pytest.mark.slow
def test_fig2_binary_tree_ratio_grows_with_n():
  """Sec 6.1 / Fig 2 (c = 32): unamplified ε / MMCC ε exceeds 1 and grows with n = 2..1024."""
  ratios = []
  for k in range(1, 11):
    n = 1 << k
    r = mmcc.mmcc(mmcc.binary_tree_matrix(n), 1.0 / n, 32.0, DELTA)
    ratios.append(r.unamplified_epsilon / r.epsilon)
  assert min(ratios) > 1.0
  assert all(b > a for a, b in zip(ratios, ratios[1:])), ratios


@pytest.mark.slow
def test_fig4_tree_restart_n512():
  """Sec 6.3 / Fig 4: n = 512, p = 1/16, h = 4: i.i.d. sampling beats b-min-sep at σ = 24."""
  c = mmcc.tree_restart_matrix(512, 4)
  iid = mmcc.mmcc_epsilon(c, 1 / 16, 24.0, DELTA)
  sep = mmcc.mmcc_epsilon(c, 1 / 16, 24.0, DELTA, min_sep=8)
  assert iid < sep


def _toeplitz(coefficients, n):
  c = np.zeros((n, n))
  for k, f in enumerate(coefficients[:n]):
    c[np.arange(k, n), np.arange(n - k)] = f
  return c / np.sqrt(np.sum(np.asarray(coefficients[:n]) ** 2))


def _toeplitz_cases(n):
  """BLT (Dvijotham et al. 2024, arXiv:2404.16706), optimized banded Toeplitz (McKenna
  2024, arXiv:2405.15913) and a random non-negative Toeplitz C, all n x n."""
  from tff_mf.factorization.families import blt  # pylint: disable=g-import-not-at-top
  from tff_mf.factorization.families import toeplitz  # pylint: disable=g-import-not-at-top
  c_blt = blt.from_theta_pair(np.array([0.995, 0.9, 0.5]), np.array([0.97, 0.7, 0.2]))[0]
  banded = toeplitz.optimize(n, 6, min_sep=8, max_participations=n // 8, dense=False)
  rng = np.random.default_rng(7)
  return {"blt": _toeplitz(c_blt.coefficients(n), n),
          "banded_toeplitz": _toeplitz(banded.extras["toeplitz_coefficients"], n),
          "random_toeplitz": _toeplitz(rng.uniform(0.0, 1.0, n), n)}


@pytest.mark.parametrize("name", ["blt", "banded_toeplitz", "random_toeplitz"])
def test_toeplitz_fast_path_is_an_upper_bound(name):
  """b-min-sep MMCC composes one residue class for a Toeplitz C (the others are dominated,
  ``mmcc.dominates``); its ε is never below the ε of composing every class (App D)."""
  n, b = 32, 8
  c = _toeplitz_cases(n)[name]
  kwargs = dict(min_sep=b, workers=1, grid_resolution=8, pld_discretization=1e-3)
  fast = mmcc.mmcc(c, 0.3 / b, 1.5, DELTA, **kwargs)
  slow = mmcc.mmcc(c, 0.3 / b, 1.5, DELTA, prune_offsets=False, **kwargs)
  assert fast.composed_offsets == 1 and slow.composed_offsets == b
  assert fast.epsilon >= slow.epsilon
  assert fast.epsilon < slow.unamplified_epsilon * 5  # not trivially large


def test_pruning_keeps_undominated_offsets():
  """A non-Toeplitz C keeps the residue classes that no other class dominates; ε is
  never below composing every class."""
  c = _random_c(24, 11)
  kwargs = dict(min_sep=4, workers=1, grid_resolution=8, pld_discretization=1e-3)
  fast = mmcc.mmcc(c, 0.05, 2.0, DELTA, **kwargs)
  slow = mmcc.mmcc(c, 0.05, 2.0, DELTA, prune_offsets=False, **kwargs)
  assert 1 < fast.composed_offsets <= 4
  assert fast.epsilon >= slow.epsilon


def test_dominates_compares_the_values_merge_small_may_merge():
  """Equal rounded units do not make a class of ten 0.1-step entries dominate one of ten
  0.9-step entries: merge_small turns the first into one unit and leaves the second at ten."""
  columns = np.arange(10)
  kept = [mmcc.RowMixture(np.ones(10, np.int64), np.full(10, 0.5), 0, columns,
                          values=np.full(10, 0.1))]
  dropped = [mmcc.RowMixture(np.ones(10, np.int64), np.full(10, 0.5), 0, columns,
                             values=np.full(10, 0.9))]
  assert not mmcc.dominates(kept, dropped)
  assert mmcc.dominates(dropped, kept)
  assert mmcc.merge_small(kept[0], 1.0).units.sum() <= 2 < 10  # ten entries, two groups
  assert not mmcc.dominates(kept, [dataclasses.replace(dropped[0], values=None)])


def test_dominates_is_componentwise():
  big = [mmcc.RowMixture(np.array([3, 2]), np.array([0.5, 0.25]), 0, np.array([0, 1]))]
  assert mmcc.dominates(big, [mmcc.RowMixture(np.array([3]), np.array([0.5]), 0, np.array([1]))]) is False
  assert mmcc.dominates(big, [mmcc.RowMixture(np.array([2]), np.array([0.25]), 0, np.array([1]))])
  assert not mmcc.dominates(big, [mmcc.RowMixture(np.array([2]), np.array([0.25]), 1,
                                                  np.array([1]))])
  assert not mmcc.dominates(big, [mmcc.RowMixture(np.array([1]), np.array([0.6]), 0,
                                                  np.array([0]))])


@pytest.mark.parametrize("n,b,p,sigma", [(64, 8, 0.5, 2.0)])
def test_identity_min_sep_fast_path_is_dpsgd(n, b, p, sigma):
  """C = I under b-min-sep sampling is DP-SGD with n/b steps at probability b·p per class;
  the fast path composes one class and stays between valid lower and upper DP-SGD values."""
  r = mmcc.mmcc(mmcc.identity_matrix(n), p / b, sigma, DELTA, min_sep=b, workers=1)
  assert r.composed_offsets == 1
  assert _dpsgd_lower(n // b, p, sigma) <= r.epsilon <= _dpsgd_epsilon(n // b, p, sigma) * (1 + 1e-6)


@pytest.mark.parametrize("name", ["blt", "banded_toeplitz", "random_toeplitz"])
def test_toeplitz_tail_bounds_are_bit_identical(name):
  """b = 1: the tail bounds of a Toeplitz C from its shared Gram sequence
  (``_toeplitz_row_mixtures``) equal the row-by-row ones bit for bit, and so does ε."""
  n = 40
  c = _toeplitz_cases(n)[name]
  assert mmcc.toeplitz_coefficients(c) is not None
  rounds = mmcc.release_rounds(c)
  grid = mmcc._grid_step(c, None, 8)  # pylint: disable=protected-access
  fast, fast_info = mmcc.row_mixtures(c, rounds, 0.1, 1.5, DELTA / 2, grid_step=grid)
  slow, slow_info = mmcc.row_mixtures(c, rounds, 0.1, 1.5, DELTA / 2, grid_step=grid,
                                      toeplitz=False)
  assert fast_info == slow_info and len(fast) == len(slow) == n
  for a, b in zip(fast, slow):
    for field in ("units", "probs", "columns", "values"):
      assert np.array_equal(getattr(a, field), getattr(b, field))
  c = _toeplitz_cases(16)[name]
  kwargs = dict(workers=1, grid_resolution=8, pld_discretization=1e-3)
  assert (mmcc.mmcc(c, 0.1, 8.0, DELTA, **kwargs).epsilon
          == mmcc.mmcc(c, 0.1, 8.0, DELTA, toeplitz_tail_bounds=False, **kwargs).epsilon)


def test_toeplitz_coefficients_only_for_exact_toeplitz():
  c = _toeplitz_cases(12)["blt"]
  assert np.array_equal(mmcc.toeplitz_coefficients(c), c[:, 0])
  near = c.copy()
  near[7, 3] *= 1 + 1e-12
  assert mmcc.toeplitz_coefficients(near) is None
  assert mmcc.toeplitz_coefficients(_random_c(12, 3)) is None
  assert mmcc.toeplitz_coefficients(mmcc.binary_tree_matrix(8)) is None  # not square


def test_merge_small_is_between_rounding_and_the_true_row():
  """Entries below Δ2 merged into groups worth ≤ Δ2: one unit with probability
  1 − Π(1 − p̃), never more than the unmerged rounding (one unit each)."""
  mix = mmcc.RowMixture(np.array([8, 1, 1, 1, 1]), np.array([0.1, 0.5, 0.5, 0.2, 0.3]), 3,
                        np.arange(5), np.array([1.0, 0.01, 0.05, 0.07, 0.125]))
  merged = mmcc.merge_small(mix, 0.125)
  # 0.01 + 0.05 ≤ 0.125 < 0.01 + 0.05 + 0.07; then 0.07 alone; 0.125 is one step already.
  pairs = sorted(zip(merged.units.tolist(), merged.probs.tolist()))
  assert [u for u, _ in pairs] == [1, 1, 1, 8]
  assert [p for _, p in pairs][:2] == [0.2, 0.3] and pairs[3][1] == 0.1
  assert 0.75 <= pairs[2][1] <= 0.75 + 1e-11
  v_m, p_m = mmcc.sensitivity_pmf(merged.units, merged.probs, 0.0)
  v_u, p_u = mmcc.sensitivity_pmf(mix.units, mix.probs, 0.0)
  # Stochastically below the unmerged rounding: its upper tails are no larger, up to the
  # group probability's own rounding up (1e-12 relative plus one 2^-40 quantum).
  slack = 1e-12 + mmcc.PROBABILITY_QUANTUM
  for x in range(int(v_u.max()) + 1):
    assert p_m[v_m >= x].sum() <= p_u[v_u >= x].sum() + slack
  assert p_m[v_m >= 2].sum() < p_u[v_u >= 2].sum() - 0.1  # strictly better: 2 joins, 1 unit
  alone = mmcc.RowMixture(np.array([8, 1]), np.array([0.1, 0.5]), 0, np.arange(2),
                          np.array([1.0, 0.01]))
  assert mmcc.merge_small(alone, 0.125) is alone


@pytest.mark.parametrize("name", ["blt_tail", "random"])
def test_merging_small_entries_never_raises_epsilon(name):
  """b = 1: merging the entries below Δ2 never raises ε and stays above a proven lower
  bound (``mixture_pair.lower_bound``); a C whose far lags are tiny (as the registry's
  BLT optimized for b = 1) gains most."""
  from tff_mf.accounting import mixture_pair  # pylint: disable=g-import-not-at-top
  if name == "random":
    n, sigma = 10, 4.0
    c = _random_c(n, 5, density=0.3)
  else:
    n, sigma = 10, 2.0
    c = _toeplitz(np.concatenate([[1.0], 1e-6 * 0.5 ** np.arange(n - 1)]), n)
  kwargs = dict(workers=1, grid_resolution=8, pld_discretization=1e-3)
  merged = mmcc.mmcc(c, 0.1, sigma, DELTA, **kwargs)
  unmerged = mmcc.mmcc(c, 0.1, sigma, DELTA, merge_small_entries=False, **kwargs)
  lower = mixture_pair.lower_bound(c, 0.1, sigma, DELTA).epsilon
  assert lower <= merged.epsilon <= unmerged.epsilon
  if name == "blt_tail":
    assert merged.epsilon < 0.8 * unmerged.epsilon


def test_optimistic_pmf_is_dp_accountings_buckets_from_below():
  """``optimistic_pmf`` (vectorized inverses) gives the privacy-buckets PMF with optimistic
  rounding: its δ(ε) is at most dp_accounting's own optimistic one (one scalar inverse per
  bucket) and within 1e-6 of it, and below the pessimistic connect-the-dots PMF's."""
  from dp_accounting.pld import privacy_loss_mechanism as plm
  eps = np.array([0.0, 0.1, 0.5, 1.0, 2.0])
  for sens, probs, sigma, interval in (([0.0, 1.0, 2.0], [0.5, 0.3, 0.2], 1.0, 0.05),
                                       ([1.0, 3.0], [0.9, 0.1], 0.7, 0.01)):
    for adjacency in (plm.AdjacencyType.REMOVE, plm.AdjacencyType.ADD):
      def loss(pessimistic):
        return mmcc._fast_mog_class()(sigma, np.array(sens), np.array(probs),
                                      pessimistic_estimate=pessimistic,
                                      adjacency_type=adjacency)
      ours = np.array(mmcc.optimistic_pmf(loss(False), interval).get_delta_for_epsilon(eps))
      theirs = np.array(pld_lib._create_pld_pmf_from_monotone_privacy_loss(  # pylint: disable=protected-access
          loss(False), pessimistic_estimate=False, value_discretization_interval=interval,
          use_connect_dots=False).get_delta_for_epsilon(eps))
      upper = np.array(pld_lib._create_pld_pmf_from_monotone_privacy_loss(  # pylint: disable=protected-access
          loss(True), pessimistic_estimate=True, value_discretization_interval=1e-4,
          use_connect_dots=True).get_delta_for_epsilon(eps))
      assert np.all(ours <= theirs) and np.all(theirs - ours <= 1e-6)
      assert np.all(ours <= upper)


def test_the_lower_bound_is_below_mmcc():
  """``lower_bound_epsilon`` never exceeds MMCC's ε (b = 1 and b = 4, the identity, a
  banded, a BLT-like Toeplitz and a non-Toeplitz non-negative C, MMCC on its coarse test
  grid or its default one), and is near it for the identity, where MMCC is DP-SGD, and
  for a banded and a dense C under i.i.d. sampling, where its tail bounds p̃ make MMCC's ε."""
  n = 16
  band = _toeplitz(np.array([1.0, 0.5, 0.25]), n)
  blt = _toeplitz(0.7 ** np.arange(n), n)
  dense = np.tril(np.ones((n, n))) + np.diag(np.arange(n) % 3 / 4.0)
  # (C, b, σ, MMCC's options, the least ratio of the bound to MMCC's ε asserted)
  cases = [(np.eye(n), 1, 1.0, {}, 0.95), (np.eye(n), 4, 2.0, FAST, 0.0),
           (band, 1, 1.0, {}, 0.9), (band, 1, 2.0, FAST, 0.0), (band, 4, 1.0, {}, 0.0),
           (blt, 4, 1.0, FAST, 0.0), (blt, 4, 2.0, {}, 0.0), (dense, 4, 2.0, FAST, 0.0)]
  for c, b, sigma, options, ratio in cases:
    c = c / np.sqrt(np.max(np.sum(c * c, axis=0)))
    p = 0.25 / b if b > 1 else 0.25
    low = mmcc.lower_bound_epsilon(c, p, sigma, DELTA, min_sep=b)
    upper = mmcc.mmcc_epsilon(c, p, sigma, DELTA, min_sep=b, **options)
    assert 0.0 < low <= upper and low >= ratio * upper, (b, sigma, low, upper)
  # A dense non-negative C under i.i.d. sampling: p̃'s inner-product term s_ij (Fig 5)
  # makes most of MMCC's ε there; the bound keeps it (without it, 0.81 of MMCC's ε).
  small = np.tril(np.ones((8, 8))) + np.diag(np.arange(8) % 3 / 4.0)
  small = small / np.sqrt(np.max(np.sum(small * small, axis=0)))
  low = mmcc.lower_bound_epsilon(small, 0.25, 3.0, DELTA)
  upper = mmcc.mmcc_epsilon(small, 0.25, 3.0, DELTA)
  assert 0.9 * upper <= low <= upper, (low, upper)
  # A tree under i.i.d. sampling with fewer runs than blocks: runs of alike blocks keep its
  # leaves (one column each) apart from its inner nodes (with consecutive runs: 0.06 of it).
  tree = mmcc.binary_tree_matrix(n)
  low = mmcc.lower_bound_epsilon(tree, 0.25, 3.0, DELTA, groups=4)
  upper = mmcc.mmcc_epsilon(tree, 0.25, 3.0, DELTA)
  assert 0.9 * upper <= low <= upper, (low, upper)
  # MMCC told to analyze class 0 only: so does the bound, though another class is larger.
  skewed = np.diag([0.05, 1.0] * 3)
  low = mmcc.lower_bound_epsilon(skewed, 0.1, 0.7, DELTA, min_sep=2, all_offsets=False)
  upper = mmcc.mmcc_epsilon(skewed, 0.1, 0.7, DELTA, min_sep=2, all_offsets=False)
  assert 0.0 < low <= upper < mmcc.lower_bound_epsilon(skewed, 0.1, 0.7, DELTA, min_sep=2)
  # At a δ below the mass that composition truncates (1e-15 each time), still finite and
  # below: the truncated mass is not counted as infinite loss.
  for b in (1, 4):
    low = mmcc.lower_bound_epsilon(band, 0.25 / b, 2.0, 1e-14, min_sep=b)
    assert 0.0 < low <= mmcc.mmcc_epsilon(band, 0.25 / b, 2.0, 1e-14, min_sep=b, **FAST)
