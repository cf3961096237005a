"""Optimal factorization (Denisov et al. 2022, arXiv:2202.08312, Eq. 4-8) and the App E.4 baselines.

Paper numbers: McMahan, Rush, Thakurta (arXiv:2202.08312 v1) Table 1 — √L of the optimal
factorization and of the Honaker online (streaming) tree estimator of the
prefix sum S.
"""

import numpy as np
import pytest

from benchmarks import baselines
from tff_mf.factorization import dense_run
from tff_mf.factorization import dense_single
from tff_mf import factorization as fz
from tff_mf.factorization import strategies
from tff_mf.factorization import workloads

# McMahan et al. Table 1 (√L): n -> (optimal, Honaker online).
TABLE_1 = {
    256: (40.4, 74.4),
    512: (62.0, 116.5),
    1024: (94.6, 180.8),
    2048: (143.6, 278.3),
    4096: (217.3, 425.6),
}
FAST_N = (256, 512, 1024)
SLOW_N = (2048, 4096)


@pytest.fixture(scope="module")
def prefix_factorizations():
  """Optimal prefix-sum factorizations shared by the tests of this module (computed on demand)."""
  cache = {}

  def get(n):
    if n not in cache:
      spec = strategies.FactorizationSpec(
          workload=workloads.WorkloadSpec(kind="prefix_sum", n=n), strategy="optimal")
      cache[n] = strategies.factorize(spec)
    return cache[n]

  return get


def _tree(n, strategy="honaker_online"):
  spec = strategies.FactorizationSpec(
      workload=workloads.WorkloadSpec(kind="prefix_sum", n=n), strategy=strategy)
  return strategies.factorize(spec)


def _check_factorization(f: fz.Factorization, target_gap=1e-6):
  a, b, c = f.a, f.b, f.c
  assert b.dtype == c.dtype == np.float64
  assert np.max(np.abs(b @ c - a)) <= 1e-8 * max(1.0, np.max(np.abs(a)))
  assert np.all(np.triu(c, 1) == 0), "C must be lower triangular"
  assert np.all(np.triu(b, 1) == 0), "B must be lower triangular"
  assert f.gamma == pytest.approx(1.0, abs=1e-9)
  info = f.info
  assert info["converged"] is True
  assert 0 <= info["relative_gap"] <= target_gap
  assert info["dual_lower_bound"] <= f.single_participation_loss
  # The gap is measured against the loss of the returned factors.
  assert (f.single_participation_loss - info["dual_lower_bound"]) / f.single_participation_loss == pytest.approx(
      info["relative_gap"], abs=1e-9)


@pytest.mark.parametrize("n", FAST_N)
def test_optimal_prefix_sum_matches_mcmahan_table_1(prefix_factorizations, n):
  f = prefix_factorizations(n)
  assert abs(f.single_participation_sqrt_loss - TABLE_1[n][0]) <= 0.1, f.single_participation_sqrt_loss
  _check_factorization(f)


@pytest.mark.parametrize("n", FAST_N)
def test_honaker_online_matches_mcmahan_table_1(n):
  f = _tree(n)
  assert abs(f.single_participation_sqrt_loss - TABLE_1[n][1]) <= 0.1, f.single_participation_sqrt_loss


@pytest.mark.slow
@pytest.mark.parametrize("n", SLOW_N)
def test_optimal_prefix_sum_matches_table_1_large(n):
  spec = strategies.FactorizationSpec(
      workload=workloads.WorkloadSpec(kind="prefix_sum", n=n), strategy="optimal")
  f = strategies.factorize(spec)
  _check_factorization(f)
  assert f.single_participation_loss >= fz.lower_bound_nuclear(f.a)
  if n == 4096:
    # Table 1's 217.3 is not the optimum: we return a valid factorization with
    # √L ≈ 216.95 and certify (Eq. 8) that nothing is below it by more than the
    # gap; Table 1's value is 0.16% above (its solver stopped early). Check
    # that Table 1 is an upper bound within 0.2% of the certified optimum.
    certified = np.sqrt(f.info["dual_lower_bound"])
    assert f.single_participation_sqrt_loss <= TABLE_1[n][0]
    assert TABLE_1[n][0] <= certified * 1.002
  else:
    assert abs(f.single_participation_sqrt_loss - TABLE_1[n][0]) <= 0.1, f.single_participation_sqrt_loss


@pytest.mark.slow
@pytest.mark.parametrize("n", SLOW_N)
def test_honaker_online_matches_table_1_large(n):
  f = _tree(n)
  assert abs(f.single_participation_sqrt_loss - TABLE_1[n][1]) <= 0.1, f.single_participation_sqrt_loss


@pytest.mark.parametrize("n", (256, 1024))
def test_optimum_is_never_below_the_lower_bounds(prefix_factorizations, n):
  f = prefix_factorizations(n)
  assert f.single_participation_loss >= fz.lower_bound_prop_c1(f.a)
  assert f.single_participation_loss >= fz.lower_bound_nuclear(f.a)
  assert f.single_participation_loss >= f.info["dual_lower_bound"]
  # The optimum is the best factorization: the tree (any B with B·C_T = S) is worse.
  assert _tree(n, "honaker_full").single_participation_loss >= f.single_participation_loss
  assert _tree(n).single_participation_loss >= f.info["dual_lower_bound"]


def test_eq8_bound_at_arbitrary_v_is_below_the_optimum(prefix_factorizations):
  """Denisov Thm 3.2: tr(diag(v)(2X(v) − I)) ≤ optimum for every v > 0."""
  f = prefix_factorizations(256)
  problem = dense_single.DualProblem(f.a)
  rng = np.random.default_rng(1)
  for scale in (1e-3, 1.0, 30.0):
    v = scale * np.exp(rng.normal(size=256))
    ev = problem.evaluate(v)
    assert ev.dual <= f.single_participation_loss * (1 + 1e-12)
    # The rescaled primal is the loss of a feasible factorization: never below the optimum.
    assert ev.primal >= f.single_participation_loss * (1 - 1e-12)
    # The Eq. 8 expression itself (without the free rescaling of v) is lower still.
    eq8 = 2 * np.sum(ev.sqrt_lam) - np.sum(v)
    assert eq8 <= ev.dual + 1e-9 * abs(ev.dual)


@pytest.mark.parametrize("kind", ("prefix_sum", "cooldown"))
def test_every_acceleration_reaches_the_same_optimum(kind):
  n = 64
  if kind == "prefix_sum":
    a = workloads.prefix_sum(n)
  else:
    a = workloads.momentum_matrix(n, 0.95, workloads.learning_rates(n, "cooldown", n // 4))
  results = {acc: dense_single.solve(a, acceleration=acc, max_iterations=2000)
             for acc in dense_single.ACCELERATIONS}
  plain = results["none"]
  for acc, r in results.items():
    assert r.info["converged"] and r.info["acceleration"] == acc
    assert r.info["iterations"] <= plain.info["iterations"]
    assert r.info["loss"] == pytest.approx(plain.info["loss"], rel=2e-6)
    # Every certificate is below every loss.
    assert r.info["dual_lower_bound"] <= min(x.info["loss"] for x in results.values())
  assert results["newton"].info["iterations"] < plain.info["iterations"]


def test_not_converged_is_an_error():
  a = workloads.prefix_sum(64)
  with pytest.raises(dense_run.NotConvergedError, match="did not reach relative duality gap") as e:
    dense_single.solve(a, target_gap=1e-10, max_iterations=2)
  assert isinstance(e.value, ValueError)
  assert e.value.result.info["converged"] is False
  assert e.value.result.info["relative_gap"] > 1e-10


def test_opt_in_unconverged_reports_the_gap():
  a = workloads.prefix_sum(64)
  r = dense_single.solve(a, target_gap=1e-10, max_iterations=2, allow_unconverged=True)
  assert r.info["converged"] is False
  assert r.info["iterations"] == 2
  gap = r.info["relative_gap"]
  assert 1e-10 < gap < 1
  loss = fz.single_participation_loss(r.b, r.c)
  assert (loss - r.info["dual_lower_bound"]) / loss == pytest.approx(gap, rel=1e-9)
  assert np.max(np.abs(r.b @ r.c - a)) < 1e-10


def test_strategies_unconverged_opt_in_reaches_the_factorization_info():
  spec = strategies.FactorizationSpec(
      workload=workloads.WorkloadSpec(kind="prefix_sum", n=32), strategy="optimal",
      target_gap=1e-12, max_iterations=1, allow_unconverged=True)
  f = strategies.factorize(spec)
  assert f.info["converged"] is False and f.info["relative_gap"] > 1e-12
  with pytest.raises(dense_run.NotConvergedError):
    strategies.factorize(dataclass_replace(spec, allow_unconverged=False))


def dataclass_replace(spec, **changes):
  import dataclasses  # pylint: disable=g-import-not-at-top
  return dataclasses.replace(spec, **changes)


@pytest.mark.parametrize("schedule", ("constant", "decay", "cooldown"))
def test_momentum_workloads_converge(schedule):
  n = 128
  spec = strategies.FactorizationSpec(
      workload=workloads.WorkloadSpec(kind="momentum", n=n, momentum=0.95, lr_schedule=schedule,
                                      schedule_rounds=None if schedule == "constant" else n // 4),
      strategy="optimal")
  f = strategies.factorize(spec)
  _check_factorization(f)
  assert f.single_participation_loss >= fz.lower_bound_nuclear(f.a)
  # Optimal beats the tree post-processed for momentum (Denisov Table 1).
  tree_spec = dataclass_replace(spec, strategy="honaker_online")
  assert strategies.factorize(tree_spec).single_participation_loss > f.single_participation_loss


def test_random_user_workload_converges(tmp_path):
  n = 96
  rng = np.random.default_rng(7)
  a = np.tril(rng.normal(size=(n, n))) + 3 * np.eye(n)
  path = tmp_path / "a.npy"
  np.save(path, a)
  spec = strategies.FactorizationSpec(
      workload=workloads.WorkloadSpec(kind="file", n=n, matrix_file=str(path)), strategy="optimal")
  f = strategies.factorize(spec)
  _check_factorization(f)
  np.testing.assert_array_equal(f.a, a)


def test_ill_conditioned_workload_stops_instead_of_spinning():
  """A random triangular A is so ill-conditioned that float64 limits the gap (App E.4)."""
  rng = np.random.default_rng(0)
  a = np.tril(rng.normal(size=(256, 256))) + 3 * np.eye(256)
  with pytest.raises(dense_run.NotConvergedError, match="no progress") as e:
    dense_single.solve(a, target_gap=1e-9, stall_iterations=5, max_cg_iterations=20)
  assert e.value.result.info["stop_reason"] == "stalled"
  assert e.value.result.info["iterations"] < 100


def test_bad_workloads_are_rejected():
  with pytest.raises(workloads.WorkloadError, match="lower triangular"):
    dense_single.solve(np.ones((4, 4)))
  with pytest.raises(workloads.WorkloadError, match="square"):
    dense_single.solve(np.ones((4, 3)))
  with pytest.raises(workloads.WorkloadError, match="singular"):
    dense_single.solve(np.diag([1.0, 0.0, 1.0]))
  with pytest.raises(ValueError, match="target_gap"):
    dense_single.solve(np.eye(3), target_gap=0)


def test_progress_bar_shows_the_gap(capsys):
  dense_single.solve(workloads.prefix_sum(32), progress=True)
  err = capsys.readouterr().err
  assert "gap=" in err


@pytest.mark.parametrize("method", baselines.METHODS)
def test_baselines_descend_but_stay_above_the_optimum(method):
  a = workloads.prefix_sum(48)
  opt = dense_single.solve(a, target_gap=1e-9)
  r = baselines.run(method, a, max_iterations=60)
  losses = [h["loss"] for h in r.history]
  seconds = [h["seconds"] for h in r.history]
  assert losses[-1] < losses[0]
  assert all(np.diff(seconds) >= 0)
  assert r.info["loss"] >= opt.info["dual_lower_bound"] * (1 - 1e-12)
  assert r.info["loss"] == pytest.approx(losses[-1] if method == "gradient_descent"
                                         else min(losses), rel=1e-8)
  assert np.max(np.abs(r.b @ r.c - a)) < 1e-9
  assert np.all(np.triu(r.c, 1) == 0)
