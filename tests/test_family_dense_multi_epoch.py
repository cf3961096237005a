"""Multi-epoch optimal factorization (Choquette-Choo, McMahan, Rush, Thakurta 2023,
arXiv:2211.06530, Eq. 5) by the Lagrange dual, with a certified duality gap."""

import numpy as np
import pytest

from tff_mf import checks
from tff_mf.factorization import dense_fixed_epoch
from tff_mf.factorization import dense_run
from tff_mf.factorization import dense_single
from tff_mf import participation
from tff_mf.factorization import workloads


def _rmse(b, sens):
  return sens * float(np.linalg.norm(b)) / np.sqrt(b.shape[0])


@pytest.fixture(scope="module")
def solved():
  cache = {}

  def get(n, k, kind="prefix_sum"):
    if (n, k, kind) not in cache:
      if kind == "prefix_sum":
        a = workloads.prefix_sum(n)
      else:
        a = workloads.momentum_matrix(n, 0.95, workloads.learning_rates(n, "cooldown", n // 4))
      cache[n, k, kind] = (a, dense_fixed_epoch.solve_fixed_epoch(a, k))
    return cache[n, k, kind]

  return get


@pytest.mark.parametrize("kind", ["prefix_sum", "momentum"])
def test_one_epoch_is_single_participation(solved, kind):
  a, result = solved(48, 1, kind)
  single = dense_single.solve(a)
  assert result.info["loss"] == pytest.approx(single.info["loss"], rel=3e-6)
  # Both are certified: each loss is above the other's lower bound.
  assert result.info["loss"] >= single.info["dual_lower_bound"] * (1 - 1e-12)
  assert single.info["loss"] >= result.info["dual_lower_bound"] * (1 - 1e-12)
  np.testing.assert_allclose(np.linalg.norm(result.c, axis=0), 1.0, rtol=1e-9)


@pytest.mark.parametrize("n,k,kind", [(64, 4, "prefix_sum"), (48, 3, "prefix_sum"),
                                      (64, 8, "prefix_sum"), (64, 4, "momentum"),
                                      (60, 5, "momentum"), (256, 8, "momentum")])
def test_constraints_gap_and_sensitivity(solved, n, k, kind):
  a, result = solved(n, k, kind)
  info = result.info
  assert info["converged"] and info["relative_gap"] <= 1e-6
  assert info["dual_lower_bound"] <= info["loss"]
  checks.product(a, result.b, result.c, "fixed-epoch")
  assert checks.is_lower_triangular(result.c) and checks.is_lower_triangular(result.b, 1e-9)
  schema = participation.fixed_epoch(k)
  idx = schema.pattern_indices(n)
  # CᵀC: orthogonal columns within each pattern (to rounding), pattern sums ≤ 1.
  x = result.c.T @ result.c
  blocks = x[idx[:, :, None], idx[:, None, :]]
  off = blocks * (1 - np.eye(k))
  assert np.max(np.abs(off)) <= 1e-12
  sums = np.trace(blocks, axis1=1, axis2=2)
  assert np.all(sums <= 1 + 1e-9) and np.max(sums) == pytest.approx(1.0, abs=1e-12)
  # Sensitivity under the schema is 1 (exact: orthogonal within patterns).
  report = participation.sensitivity_report(result.c, schema)
  assert report["exact"] and 1.0 <= report["value"] <= 1 + 1e-11
  assert 1.0 <= info["sensitivity"] <= 1 + 1e-11
  # The reported loss is the loss of the returned factors under the schema.
  assert info["loss"] == pytest.approx(report["value"] ** 2 * np.sum(result.b ** 2), rel=1e-12)
  assert info["rmse"] == pytest.approx(_rmse(result.b, report["value"]), rel=1e-12)
  assert result.dual_blocks.shape == (n // k, k, k) and result.v.shape == (n,)


def test_projected_gram_is_exactly_feasible():
  n, k = 48, 4
  problem = dense_fixed_epoch.FixedEpochDual(workloads.prefix_sum(n), k)
  theta = problem.initial_theta()
  rng = np.random.default_rng(0)
  theta[:, 1:] = 0.05 * rng.normal(size=theta[:, 1:].shape)  # a non-optimal, PD Λ
  ev = problem.evaluate(theta)
  x = problem.projected_gram(ev)
  idx = participation.fixed_epoch(k).pattern_indices(n)
  blocks = x[idx[:, :, None], idx[:, None, :]]
  assert np.all(blocks * (1 - np.eye(k)) == 0.0)  # exactly zero
  assert np.all(np.trace(blocks, axis1=1, axis2=2) <= 1 + 1e-12)
  assert np.linalg.eigvalsh(x)[0] > 0
  # Its loss is the primal value the iteration reports.
  loss = float(np.trace(problem.a.T @ problem.a @ np.linalg.inv(x)))
  assert ev.primal == pytest.approx(loss, rel=1e-9)
  b, c = problem.factors(ev)
  np.testing.assert_allclose(c.T @ c, x, atol=1e-12)


def test_dual_bound_holds_at_arbitrary_multipliers(solved):
  a, result = solved(64, 4)
  problem = dense_fixed_epoch.FixedEpochDual(a, 4)
  rng = np.random.default_rng(2)
  for scale in (1e-3, 1.0, 50.0):
    theta = problem.initial_theta() * scale * np.exp(rng.normal(size=(16, 1)))
    theta[:, 1:] = 0.1 * theta[:, :1] * rng.normal(size=theta[:, 1:].shape)
    ev = problem.evaluate(theta)
    if ev is None:
      continue
    assert ev.dual <= result.info["loss"] * (1 + 1e-12)
    assert ev.primal >= result.info["dual_lower_bound"] * (1 - 1e-12)


def test_gradient_and_hessian_of_the_dual():
  """∇d from the pattern blocks of X(Λ), and the CG Hessian, against finite differences."""
  n, k = 24, 3
  a = workloads.momentum_matrix(n, 0.9)
  problem = dense_fixed_epoch.FixedEpochDual(a, k)
  rng = np.random.default_rng(4)
  theta = problem.initial_theta() * np.exp(0.3 * rng.normal(size=(n // k, 1)))
  theta[:, 1:] = 0.2 * rng.normal(size=theta[:, 1:].shape)

  def d(th):
    ev = problem.evaluate(th, with_primal=False)
    return 2 * ev.trace - ev.v_sum

  ev = problem.evaluate(theta)
  grad = problem.gradient(ev)
  h = 1e-4
  for j in range(n // k):
    for m in range(problem.m):
      e = np.zeros_like(theta)
      e[j, m] = h
      assert (d(theta + e) - d(theta - e)) / (2 * h) == pytest.approx(grad[j, m], rel=1e-6,
                                                                       abs=1e-6)
  # The Newton direction solves (−∇²d) δ = ∇d: check by a finite-difference Hessian product.
  direction, _ = problem.newton_direction(ev, 1.0, max_cg=500)
  eps = 1e-5
  g_plus = problem.gradient(problem.evaluate(theta + eps * direction))
  g_minus = problem.gradient(problem.evaluate(theta - eps * direction))
  hessian_times = -(g_plus - g_minus) / (2 * eps)
  np.testing.assert_allclose(hessian_times, grad, rtol=0, atol=0.1 * np.max(np.abs(grad)))


@pytest.mark.parametrize("kind", ["prefix_sum", "momentum"])
def test_beats_identity_and_single_participation_optimum(solved, kind):
  n, k = 64, 4
  a, result = solved(n, k, kind)
  schema = participation.fixed_epoch(k)
  rmse = result.info["rmse"]
  # 'Fixed-epoch identity': C = I, sensitivity √k.
  identity = _rmse(a, participation.sensitivity(np.eye(n), schema))
  assert participation.sensitivity(np.eye(n), schema) == pytest.approx(np.sqrt(k))
  # Single-participation optimum, evaluated under the fixed-epoch schema.
  single = dense_single.solve(a)
  single_rmse = _rmse(single.b, participation.sensitivity(single.c, schema))
  assert rmse < identity * (1 - 1e-3)
  assert rmse < single_rmse * (1 - 1e-3)


def test_monotone_in_epochs(solved):
  n = 64
  rmses = [solved(n, k)[1].info["rmse"] for k in (1, 2, 4, 8)]
  assert all(later > earlier for earlier, later in zip(rmses[:-1], rmses[1:]))


def test_not_worse_than_jax_privacy_reference(solved):
  # jax_privacy 2.0.0 dense.optimize(64, epochs=4) (projected-gradient L-BFGS on the same
  # feasible set), measured once: rmse = sens·‖B‖_F/√n = 4.4078549571.
  # Ours is within its certified gap g of the optimum, itself at most the reference: rmse²
  # ≤ optimum²/(1 − g). (Compared bare, the 10 digits asked more than the target gap 1e-6
  # guarantees: the margin here is 3.5e-7 relative, the gap allows up to 5e-7.)
  _, result = solved(64, 4)
  assert result.info["rmse"] <= 4.4078549571 / np.sqrt(1.0 - result.info["relative_gap"])


def test_unconverged_and_refusals():
  a = workloads.prefix_sum(32)
  with pytest.raises(dense_run.NotConvergedError, match="did not reach") as err:
    dense_fixed_epoch.solve_fixed_epoch(a, 4, target_gap=1e-12, max_iterations=1)
  assert not err.value.result.info["converged"]
  r = dense_fixed_epoch.solve_fixed_epoch(a, 4, target_gap=1e-12, max_iterations=2,
                                          allow_unconverged=True)
  assert not r.info["converged"] and r.info["stop_reason"] == "max_iterations"
  checks.product(a, r.b, r.c, "unconverged")
  assert r.info["loss"] >= r.info["dual_lower_bound"]
  with pytest.raises(checks.CheckError, match="must divide"):
    dense_fixed_epoch.solve_fixed_epoch(a, 3)
  with pytest.raises(checks.CheckError, match="target_gap"):
    dense_fixed_epoch.solve_fixed_epoch(a, 2, target_gap=0)
  with pytest.raises(ValueError, match="lower triangular"):
    dense_fixed_epoch.solve_fixed_epoch(np.ones((4, 4)), 2)
  with pytest.raises(checks.CheckError, match="epochs must be a positive integer"):
    dense_fixed_epoch.solve_fixed_epoch(a, 0)


def test_progress_and_history():
  records = []
  r = dense_fixed_epoch.solve_fixed_epoch(workloads.prefix_sum(32), 2, progress=True,
                              callback=records.append)
  assert records and records == r.history
  assert records[-1]["relative_gap"] <= 1e-6
  gaps = [rec["relative_gap"] for rec in records]
  assert all(later <= earlier for earlier, later in zip(gaps[:-1], gaps[1:]))
