"""b-banded column-normalized C optimized for ‖A·C⁻¹‖²_F (Choquette-Choo et al. 2023,
arXiv:2306.08153; McKenna 2024, arXiv:2405.15913)."""

import numpy as np
import pytest

from tff_mf import checks
from tff_mf.factorization import dense_single
from tff_mf.accounting import mmcc
from tff_mf import participation
from tff_mf.factorization import workloads
from tff_mf.factorization.families import banded


def _workloads(n):
  return {
      "prefix_sum": workloads.prefix_sum(n),
      "momentum": workloads.momentum_matrix(n, 0.9),
      "momentum_cooldown": workloads.momentum_matrix(
          n, 0.95, workloads.learning_rates(n, "cooldown", n // 4)),
  }


@pytest.mark.parametrize("kind", ["prefix_sum", "momentum", "momentum_cooldown"])
@pytest.mark.parametrize("n,bands", [(48, 1), (48, 5), (64, 16), (33, 7)])
def test_factorization_is_banded_unit_columns_and_exact(kind, n, bands):
  a = _workloads(n)[kind]
  result = banded.optimize(a, bands)
  b, c = result.b, result.c
  assert b.dtype == np.float64 and c.dtype == np.float64
  checks.product(a, b, c, "banded")
  assert np.max(np.abs(b @ c - a)) <= 1e-10 * np.max(np.abs(a))
  assert checks.is_lower_triangular(c) and checks.is_lower_triangular(b, atol=1e-9)
  i, j = np.indices((n, n))
  assert np.all(c[i - j >= bands] == 0)
  np.testing.assert_allclose(np.linalg.norm(c, axis=0), 1.0, rtol=1e-12)
  assert result.info["objective"] == pytest.approx(np.sum(b * b), rel=1e-12)
  assert result.info["converged"]
  coeffs = result.extras["banded_coefficients"]
  assert coeffs.shape == (n, bands) and coeffs.dtype == np.float64
  np.testing.assert_array_equal(banded.banded_matrix(coeffs), c)
  # Unit columns and bands ≤ b: sensitivity √k under b-min-separation, exactly.
  report = participation.sensitivity_report(c, participation.min_sep(bands, 3))
  assert report["exact"] and report["method"] in ("disjoint_supports", "max_column_norm")
  expected_k = min(3, -(-n // bands))
  assert np.sqrt(expected_k) * (1 - 1e-12) <= report["value"] <= np.sqrt(expected_k) * (1 + 1e-11)


@pytest.mark.parametrize("kind", ["prefix_sum", "momentum", "momentum_cooldown"])
@pytest.mark.parametrize("bands", [2, 4, 8])
def test_beats_banded_toeplitz_square_root(kind, bands):
  n = 64
  a = _workloads(n)[kind]
  c0 = mmcc.truncated_sqrt_prefix_matrix(n, bands)  # truncated √S, γ = 1
  b0 = a @ np.linalg.inv(c0)
  loss0 = checks.gamma(c0) ** 2 * float(np.sum(b0 * b0))
  result = banded.optimize(a, bands)
  assert result.info["objective"] < loss0 * (1 - 1e-3)
  assert result.info["objective"] <= result.info["initial_objective"]


def test_monotone_in_bands():
  a = workloads.prefix_sum(96)
  values = [banded.optimize(a, bands).info["objective"] for bands in (1, 2, 4, 8, 16)]
  assert all(later < earlier for earlier, later in zip(values[:-1], values[1:]))
  assert values[0] == pytest.approx(96 * 97 / 2)  # identity: ‖S‖²_F


def test_one_band_is_identity_and_full_bands_match_optimal():
  n = 64
  a = workloads.prefix_sum(n)
  ident = banded.optimize(a, 1)
  np.testing.assert_array_equal(ident.c, np.eye(n))
  np.testing.assert_array_equal(ident.b, a)
  full = banded.optimize(a, n)
  opt = dense_single.solve(a)
  sqrt_banded = np.sqrt(full.info["objective"])
  sqrt_opt = np.sqrt(opt.info["loss"])
  assert sqrt_banded <= sqrt_opt * 1.01
  # The optimum is certified: nothing beats its dual bound.
  assert full.info["objective"] >= opt.info["dual_lower_bound"] * (1 - 1e-9)
  # bands beyond n mean dense.
  assert banded.optimize(a, 10 * n).bands == n


@pytest.mark.parametrize("kind", ["prefix_sum", "momentum_cooldown"])
def test_gradient_matches_finite_differences(kind):
  n, bands = 18, 5
  a = _workloads(n)[kind]
  rng = np.random.default_rng(7)
  params = rng.uniform(0.3, 1.5, size=(n, bands))
  params *= (np.arange(n)[:, None] + np.arange(bands)[None, :]) < n
  value, grad = banded.objective_and_gradient(a, params)
  assert value == pytest.approx(banded.objective(a, banded.column_to_row_bands(params)))
  # The objective of the normalized dense C, computed independently.
  unit = params / np.linalg.norm(params, axis=1, keepdims=True)
  c = banded.banded_matrix(banded.column_to_row_bands(unit))
  assert value == pytest.approx(float(np.sum(np.square(a @ np.linalg.inv(c)))), rel=1e-12)
  h = 1e-6
  for j in range(n):
    for k in range(bands):
      if j + k >= n:
        assert grad[j, k] == 0
        continue
      up, down = params.copy(), params.copy()
      up[j, k] += h
      down[j, k] -= h
      fd = (banded.objective_and_gradient(a, up)[0] -
            banded.objective_and_gradient(a, down)[0]) / (2 * h)
      assert fd == pytest.approx(grad[j, k], rel=1e-5, abs=1e-6 * abs(value))


@pytest.mark.parametrize("bands", [1, 3, 8])
def test_stream_equals_c_inverse_times_z(bands):
  n = 40
  a = workloads.momentum_matrix(n, 0.9)
  result = banded.optimize(a, bands)
  z = np.random.default_rng(1).normal(size=(n, 3))
  expected = np.linalg.solve(result.c, z)
  for source in (result, result.extras, result.extras["banded_coefficients"]):
    s = banded.stream(source)
    np.testing.assert_allclose(s.run(z), expected, rtol=1e-10, atol=1e-12)
  assert banded.stream(result).k == bands - 1
  np.testing.assert_allclose(banded.stream(result).noise_matrix() @ result.c, np.eye(n),
                             atol=1e-10)


def test_blocked_solves_match_dense():
  rng = np.random.default_rng(3)
  n = 150  # several blocks of BLOCK_ROWS rows, and a partial one
  for bands in (1, 2, 7, 70, 150):
    coeffs = rng.uniform(0.2, 1.0, size=(n, bands)) + np.eye(n, bands) * 0
    coeffs[:, 0] += 1.0
    c = banded.banded_matrix(coeffs)
    r = rng.normal(size=(n, 9))
    np.testing.assert_allclose(banded._solve_lower(c, r, bands), np.linalg.solve(c, r),
                               rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(banded._solve_upper_t(c, r, bands), np.linalg.solve(c.T, r),
                               rtol=1e-9, atol=1e-9)
    up = np.triu(rng.normal(size=(n, n)))
    np.testing.assert_allclose(banded._solve_upper_t(c, up, bands, upper_rhs=True),
                               np.linalg.solve(c.T, up), rtol=1e-9, atol=1e-9)
    # Only the part at or right of each block's first row: exactly what the full solve gives
    # there (the rows above at the same columns are all it needs), zero elsewhere.
    part = banded._solve_lower(c, up, bands, upper_part=True)
    s = max(banded.BLOCK_ROWS, bands)
    kept = np.arange(n)[None, :] >= (np.arange(n) // s * s)[:, None]
    np.testing.assert_allclose(part[kept], np.linalg.solve(c, up)[kept], rtol=1e-9, atol=1e-9)
    assert not np.any(part[~kept])


def test_initial_and_limits():
  n, bands = 64, 4
  a = workloads.prefix_sum(n)
  first = banded.optimize(a, bands)
  again = banded.optimize(a, bands, initial=first.extras["banded_coefficients"])
  assert again.info["objective"] <= first.info["objective"] * (1 + 1e-10)
  assert again.info["iterations"] < first.info["iterations"]
  short = banded.optimize(a, bands, max_iterations=2)
  assert not short.info["converged"]
  assert short.info["objective"] < short.info["initial_objective"]
  timed = banded.optimize(a, 16, time_limit=0.0)
  assert not timed.info["converged"] and timed.info["message"] == "time limit reached"
  checks.product(a, timed.b, timed.c, "timed")


def test_progress_bar_promises_no_total_it_will_not_reach(capsys):
  """The stop rule ends the search long before the iteration limit: the bar shows the
  iterations and how far the objective still falls against the stop rule, no total/ETA
  (its total was the limit: "1 h 21 min" left, then done after 86 iterations)."""
  result = banded.optimize(workloads.prefix_sum(64), 4, max_iterations=5000, progress=True)
  assert result.info["converged"] and result.info["iterations"] < 5000
  bar = capsys.readouterr().err
  assert "banded n=64 b=4" in bar and "/5000" not in bar and "<" not in bar, bar
  assert f"stops at {banded.DEFAULT_RELATIVE_TOLERANCE:.0e}" in bar, bar


@pytest.mark.parametrize("call,match", [
    (lambda: banded.optimize(workloads.prefix_sum(8), 0), "bands must be a positive integer"),
    (lambda: banded.optimize(np.ones((4, 4)), 2), "lower triangular"),
    (lambda: banded.optimize(workloads.prefix_sum(8), 2, initial=np.ones((8, 3))),
     "shape \\(8, 2\\)"),
    (lambda: banded.optimize(workloads.prefix_sum(8), 2, tolerance=0), "tolerance"),
    (lambda: banded.stream(np.ones(5)), "must be \\[n, b\\]"),
    (lambda: banded.stream({"other": np.ones((3, 1))}), "lack banded_coefficients"),
])
def test_refusals(call, match):
  with pytest.raises(ValueError, match=match) as err:
    call()
  assert "\n" not in str(err.value)


def test_row_signs_of_the_initial_point_do_not_matter():
  n, bands = 32, 4
  a = workloads.momentum_matrix(n, 0.9)
  coeffs = np.broadcast_to(banded.sqrt_prefix_coefficients(bands), (n, bands)).copy()
  flipped = coeffs * np.where(np.arange(n) % 3 == 0, -1.0, 1.0)[:, None]  # rows of C negated
  for k in range(bands):
    flipped[:k, k] = 0.0
    coeffs[:k, k] = 0.0
  assert banded.objective(a, flipped) == pytest.approx(banded.objective(a, coeffs), rel=1e-12)
  one = banded.optimize(a, bands, initial=coeffs)
  two = banded.optimize(a, bands, initial=flipped)
  assert one.info["initial_objective"] == pytest.approx(two.info["initial_objective"], rel=1e-12)
  assert np.all(np.diag(two.c) > 0)
  assert two.info["objective"] == pytest.approx(one.info["objective"], rel=1e-7)
