"""The tridiagonal eigensolver of the optimal dense factorization (A⁻¹ lower bidiagonal).

Properties: it detects exactly the workloads whose inverse is bidiagonal; at the same dual
point it yields the same φ(v), Eq. 8 bound and rescaled primal as the dense ``eigh`` path
(Denisov et al. 2022, arXiv:2202.08312, Eq. 5-8); and the two paths' solutions certify
each other (every bound below every loss, √L equal to the gap).
"""

import numpy as np
import pytest

from tff_mf import checks
from tff_mf.factorization import dense_single
from tff_mf.factorization import workloads


def _random_bidiagonal_inverse_workload(n, seed=0):
  rng = np.random.default_rng(seed)
  inverse = np.diag(rng.uniform(1.0, 2.0, n)) + np.diag(rng.uniform(-1.0, 0.5, n - 1), -1)
  return np.tril(np.linalg.inv(inverse)), inverse


def test_bidiagonal_inverse_detection():
  d, s, r = workloads.bidiagonal_inverse(workloads.prefix_sum(50))
  assert np.all(d == 1.0) and np.all(s == -1.0) and r == 0.0
  a, inverse = _random_bidiagonal_inverse_workload(60)
  d, s, r = workloads.bidiagonal_inverse(a)
  np.testing.assert_allclose(d, np.diag(inverse), rtol=1e-12)
  np.testing.assert_allclose(s, np.diag(inverse, -1), rtol=1e-10)
  assert r <= workloads.BIDIAGONAL_INVERSE_TOLERANCE
  # Learning rates without momentum: S·diag(η) has a bidiagonal inverse; momentum does not.
  etas = workloads.learning_rates(40, "cooldown", 10)
  assert workloads.bidiagonal_inverse(workloads.momentum_matrix(40, 0.0, etas)) is not None
  assert workloads.bidiagonal_inverse(workloads.momentum_matrix(40, 0.9, etas)) is None
  rng = np.random.default_rng(1)
  dense = np.tril(rng.uniform(0.5, 1.0, (30, 30))) + 30 * np.eye(30)
  assert workloads.bidiagonal_inverse(dense) is None


@pytest.mark.parametrize("kind", ("prefix_sum", "random"))
def test_same_evaluation_as_the_dense_path(kind):
  n = 96
  a = workloads.prefix_sum(n) if kind == "prefix_sum" else _random_bidiagonal_inverse_workload(n)[0]
  v = np.exp(np.random.default_rng(2).normal(size=n))
  dense = dense_single.DualProblem(a).evaluate(v)
  tri = dense_single.TridiagonalDualProblem(a).evaluate(v)
  np.testing.assert_allclose(tri.phi, dense.phi, rtol=1e-9)
  assert tri.dual == pytest.approx(dense.dual, rel=1e-10)
  assert tri.primal == pytest.approx(dense.primal, rel=1e-9)
  np.testing.assert_allclose(np.sort(tri.sqrt_lam), np.sort(dense.sqrt_lam), rtol=1e-9)


@pytest.mark.parametrize("kind,n", (("prefix_sum", 64), ("prefix_sum", 257), ("random", 80)))
def test_fast_and_dense_paths_certify_each_other(kind, n):
  a = workloads.prefix_sum(n) if kind == "prefix_sum" else _random_bidiagonal_inverse_workload(n)[0]
  gap = 1e-7
  fast = dense_single.solve(a, target_gap=gap)
  dense = dense_single.solve(a, target_gap=gap, eigensolver="dense")
  assert fast.info["eigensolver"] == "tridiagonal" and fast.info["acceleration"] == "anderson"
  assert dense.info["eigensolver"] == "dense" and dense.info["acceleration"] == "newton"
  for r in (fast, dense):
    assert r.info["converged"] and r.info["relative_gap"] <= gap
    np.testing.assert_allclose(r.b @ r.c, a, atol=1e-10 * np.abs(a).max())
    assert np.allclose(r.c, np.tril(r.c)) and np.allclose(r.b, np.tril(r.b))
  # Every certified bound is below every loss, and the losses agree to the gap.
  assert fast.info["dual_lower_bound"] <= dense.info["loss"]
  assert dense.info["dual_lower_bound"] <= fast.info["loss"]
  assert fast.info["loss"] == pytest.approx(dense.info["loss"], rel=gap)


def test_bound_is_scaled_for_an_inverse_bidiagonal_only_to_rounding():
  n = 64
  a = workloads.prefix_sum(n)
  a[n - 1, 0] += 1e-11  # A⁻¹ now has tiny entries off the band
  r = workloads.bidiagonal_inverse(a)[2]
  assert 0 < r <= workloads.BIDIAGONAL_INVERSE_TOLERANCE
  problem = dense_single.TridiagonalDualProblem(a)
  assert problem.bound_factor == pytest.approx((1 - r) ** 2)
  fast = dense_single.solve(a)
  dense = dense_single.solve(a, eigensolver="dense", target_gap=1e-9)
  assert fast.info["dual_lower_bound"] <= dense.info["loss"]
  np.testing.assert_allclose(fast.b @ fast.c, a, atol=1e-12)


def test_auto_keeps_the_dense_path_for_momentum_and_refuses_bad_choices():
  a = workloads.momentum_matrix(32, 0.9)
  assert dense_single.solve(a).info["eigensolver"] == "dense"
  with pytest.raises(checks.CheckError, match="bidiagonal"):
    dense_single.solve(a, eigensolver="tridiagonal")
  with pytest.raises(checks.CheckError, match="eigensolver"):
    dense_single.solve(a, eigensolver="qr")
  with pytest.raises(checks.CheckError, match="acceleration"):
    dense_single.solve(a, acceleration="fast")


def test_decoder_from_the_exact_inverse_matches_the_triangular_solve():
  """For S (A·L = I exactly) ψ's B = L⁻¹C⁻¹; the same B, C as B = A C⁻¹ by a solve."""
  n = 128
  a = workloads.prefix_sum(n)
  problem = dense_single.TridiagonalDualProblem(a)
  assert problem.exact_inverse
  assert not dense_single.TridiagonalDualProblem(_random_bidiagonal_inverse_workload(n)[0]).exact_inverse
  ev = problem.evaluate(np.exp(np.random.default_rng(3).normal(size=n)))
  b, c = problem.factors(ev)
  b_solve, c_solve = dense_single.DualProblem.factors(problem, ev)
  np.testing.assert_array_equal(c, c_solve)
  np.testing.assert_allclose(b, b_solve, atol=1e-12 * np.abs(b_solve).max())
  np.testing.assert_allclose(b @ c, a, atol=1e-12)
  assert np.array_equal(b, np.tril(b))
