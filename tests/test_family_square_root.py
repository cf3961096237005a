"""Square-root factorizations: BSR, BISR and DP-λCGD, against their definitions.

BSR: C = the first b diagonals of A^{1/2} (Kalinin & Lampert 2024, arXiv:2405.13763).
BISR: C⁻¹ = the first b diagonals of A^{−1/2} (Kalinin, Lampert et al. 2025,
arXiv:2505.12128). λCGD: C⁻¹ = I − λ·shift (arXiv:2601.22334). The square roots are
checked against scipy's matrix square root and the closed form of S^{1/2}
(coefficients C(2k, k)/4^k), the streams against C⁻¹·Z in float64.
"""

import json
import math
import subprocess
import sys

import numpy as np
import pytest
import scipy.linalg
import scipy.special

import userenv
from tff_mf.factorization import cache
from tff_mf import participation as pa
from tff_mf.factorization import strategies
from tff_mf.factorization import workloads
from tff_mf.factorization.families import square_root as sr

PREFIX = workloads.WorkloadSpec(kind="prefix_sum", n=48)
MOMENTUM = workloads.WorkloadSpec(kind="momentum", n=48, momentum=0.9, lr_schedule="constant")
COOLDOWN = workloads.WorkloadSpec(kind="momentum", n=48, momentum=0.9, lr_schedule="cooldown",
                                  schedule_rounds=12)


def _factorize(workload, strategy, schema=pa.SINGLE, **kw):
  return strategies.factorize(strategies.FactorizationSpec(workload, strategy=strategy,
                                                           participation=schema, **kw))


def test_square_root_of_the_prefix_sum_is_the_closed_form():
  n = 40
  k = np.arange(n)
  closed = scipy.special.comb(2 * k, k) / 4.0 ** k
  np.testing.assert_allclose(sr.series_sqrt(np.ones(n)), closed, rtol=1e-12)
  root = sr.toeplitz_matrix(closed)
  np.testing.assert_allclose(root @ root, np.tril(np.ones((n, n))), atol=1e-12)
  inv = sr.series_inverse(closed, n)
  np.testing.assert_allclose(sr.toeplitz_matrix(inv) @ root, np.eye(n), atol=1e-12)


@pytest.mark.parametrize("workload", [PREFIX, MOMENTUM, COOLDOWN], ids=lambda w: w.lr_schedule
                         + str(w.momentum))
def test_bsr_is_the_banded_square_root(workload):
  a = workload.build()
  root = scipy.linalg.sqrtm(a).real
  np.testing.assert_allclose(root @ root, a, atol=1e-8 * np.max(a))
  f = _factorize(workload, "bsr", bands=5)
  gamma = f.info["gamma_before_normalization"]
  expected = sr.band(np.tril(root), 5)
  np.testing.assert_allclose(f.c * gamma, expected, atol=1e-8)
  assert np.all(np.tril(f.c, -5) == 0)  # exactly banded
  np.testing.assert_allclose(f.b @ f.c, a, atol=1e-8 * np.max(a))


@pytest.mark.parametrize("workload", [PREFIX, MOMENTUM, COOLDOWN], ids=lambda w: w.lr_schedule
                         + str(w.momentum))
def test_bisr_inverse_is_the_banded_inverse_square_root(workload):
  a = workload.build()
  inv_root = np.linalg.inv(np.tril(scipy.linalg.sqrtm(a).real))
  f = _factorize(workload, "bisr", bands=4)
  gamma = f.info["gamma_before_normalization"]
  c_inv = np.linalg.inv(f.c) / gamma
  np.testing.assert_allclose(c_inv, sr.band(inv_root, 4), atol=1e-7)
  if "inverse_taps" in f.extras:  # a Toeplitz workload: C⁻¹'s b taps, C as first columns
    np.testing.assert_allclose(f.extras["inverse_taps"], [c_inv[9, 9 - k] for k in range(4)],
                               atol=1e-9)
  else:
    stored = f.extras["inverse_band_coefficients"]
    np.testing.assert_array_equal(sr.row_band_coefficients(sr.band(c_inv, 4), 4) != 0,
                                  stored != 0)
  np.testing.assert_allclose(f.b @ f.c, a, atol=1e-8 * np.max(a))


def test_bisr_and_lambda_cgd_of_prefix_sums_have_exact_min_sep_sensitivity():
  """Their C is non-negative, non-increasing Toeplitz: the earliest pattern is the worst.

  Checked against brute force over every admissible pattern at n = 12 (X ≥ 0, so the
  SDP value of a pattern is Σ X_st).
  """
  n, sep, k = 12, 3, 3
  schema = pa.min_sep(sep, k)
  import itertools  # pylint: disable=g-import-not-at-top
  for strategy, kw in (("bisr", {"bands": 4}), ("lambda_cgd", {})):
    f = _factorize(workloads.WorkloadSpec(kind="prefix_sum", n=n), strategy, schema, **kw)
    assert f.info["sensitivity_method"] == "toeplitz_earliest_pattern"
    x = f.c.T @ f.c
    assert np.all(x >= 0)
    brute = max(float(np.sum(x[np.ix_(p, p)]))
                for size in range(1, k + 1) for p in itertools.combinations(range(n), size)
                if all(q - r >= sep for r, q in zip(p[:-1], p[1:])))
    assert brute <= f.info["sensitivity"] ** 2 <= brute * (1 + 1e-11)


@pytest.mark.parametrize("schema", [pa.SINGLE, pa.fixed_epoch(4), pa.min_sep(6, 4)],
                         ids=lambda s: s.kind)
def test_lambda_cgd_minimizes_the_rmse_over_lambda(schema):
  a = PREFIX.build()
  f = _factorize(PREFIX, "lambda_cgd", schema)
  lam = f.info["lambda"]
  assert 0.0 < lam < 1.0
  gamma = f.info["gamma_before_normalization"]
  k = np.arange(48)
  i, j = np.indices((48, 48))
  np.testing.assert_allclose(f.c * gamma, np.where(i >= j, lam ** np.maximum(i - j, 0), 0.0),
                             rtol=1e-12)

  def rmse(value):
    result = sr.lambda_cgd_result(a, value)
    return sr._normalized_rmse(result, schema)  # pylint: disable=protected-access

  best = f.info["rmse"]
  assert best == pytest.approx(rmse(lam), rel=1e-12)
  grid = np.linspace(0.0, 0.99, 100)
  assert best <= min(rmse(v) for v in grid) * (1 + 1e-9)  # no grid point does better
  assert best < rmse(0.0)  # better than independent noise
  del k


@pytest.mark.parametrize("strategy,kw,workload", [
    ("bsr", {"bands": 4}, PREFIX), ("bsr", {"bands": 4}, COOLDOWN),
    ("bisr", {"bands": 3}, PREFIX), ("bisr", {"bands": 3}, COOLDOWN),
    ("lambda_cgd", {}, MOMENTUM)])
def test_stream_equals_c_inverse_times_z(strategy, kw, workload):
  f = _factorize(workload, strategy, **kw)
  stream = strategies.stream(strategy, f.extras, f.a)
  z = np.random.default_rng(0).normal(size=(48, 5))
  np.testing.assert_allclose(stream.run(z), np.linalg.solve(f.c, z), atol=1e-9)
  bands = kw.get("bands", 2)
  assert stream.k == bands - 1  # b − 1 rows of state


def test_factorize_cli_caches_and_reloads_bisr(tmp_path):
  cmd = [sys.executable, "-m", "tff_mf.cli", "factorize", "--mechanism", "bisr", "--bands", "4",
         "--total_rounds", "64", "--participation", "min_sep", "--min-sep", "8", "--json",
         "--cache-dir", str(tmp_path)]
  first = subprocess.run(cmd, capture_output=True, text=True, env=userenv.env(pythonpath=True),
                         cwd=userenv.REPO, timeout=300)
  assert first.returncode == 0, first.stderr
  out = json.loads(first.stdout)
  assert out["strategy"] == "bisr"
  second = subprocess.run(cmd, capture_output=True, text=True, env=userenv.env(pythonpath=True),
                          cwd=userenv.REPO, timeout=300)
  assert second.returncode == 0, second.stderr
  again = json.loads(second.stdout)
  assert again["rmse"] == out["rmse"]
  assert again.get("cache_hit", True)
  # A full load applies check_extras: the stored bands rebuild C⁻¹.
  spec = strategies.FactorizationSpec(workloads.WorkloadSpec(kind="prefix_sum", n=64),
                                      strategy="bisr", bands=4, participation=pa.min_sep(8, 8))
  f, entry = cache.load_or_factorize(spec, cache_dir=str(tmp_path))
  assert entry.cache_hit and math.isclose(f.info["rmse"], out["rmse"], rel_tol=1e-12)


@pytest.mark.parametrize("n,schema", [(64, pa.SINGLE), (128, pa.fixed_epoch(4)),
                                      (128, pa.min_sep(16, 4))], ids=lambda x: str(x))
def test_banded_inverse_is_no_worse_than_bisr_and_lambda_cgd(n, schema):
  """BandInvMF optimizes the taps of C⁻¹ from BISR's and λCGD's: never worse than either."""
  w = workloads.WorkloadSpec(kind="prefix_sum", n=n)
  f = _factorize(w, "banded_inverse", schema, bands=6)
  bisr = _factorize(w, "bisr", schema, bands=6)
  lam = _factorize(w, "lambda_cgd", schema)
  assert f.info["rmse"] <= min(bisr.info["rmse"], lam.info["rmse"]) * (1 + 1e-9)
  c_inv = np.linalg.inv(f.c)
  assert np.max(np.abs(np.tril(c_inv, -6))) < 1e-9 * np.max(np.abs(c_inv))  # 6 bands
  stream = strategies.stream("banded_inverse", f.extras, f.a)
  z = np.random.default_rng(1).normal(size=(n, 3))
  np.testing.assert_allclose(stream.run(z), np.linalg.solve(f.c, z), atol=1e-8)


@pytest.mark.parametrize("schema,free", [
    (pa.SINGLE, [-0.45, -0.1, -0.05]),
    (pa.min_sep(16, 4), [-0.45, -0.1, -0.05]),
    (pa.fixed_epoch(4), [-0.6, 0.05]),
    (pa.min_sep(16, 4), [0.5, -0.3]),  # C's coefficients change sign: the majorant's bound
], ids=str)
def test_banded_inverse_gradient_matches_finite_differences(schema, free):
  """The closed-form gradient of rmse² in C⁻¹'s taps equals central differences.

  Step 1e-6: truncation O(1e-12·f‴) and rounding O(1e-16·f/1e-6) are both below 1e-6
  of the gradient's scale here (f ~ 10-1000).
  """
  free = np.array(free)
  for column in (np.ones(64), np.cumsum(0.9 ** np.arange(64))):  # prefix sums, momentum
    value, grad = sr.banded_inverse_value_and_gradient(free, column, schema)
    assert math.isclose(value, sr.banded_inverse_objective(free, column, schema))
    step = 1e-6
    numeric = np.array([
        (sr.banded_inverse_objective(free + e, column, schema)
         - sr.banded_inverse_objective(free - e, column, schema)) / (2 * step)
        for e in np.eye(free.shape[0]) * step])
    np.testing.assert_allclose(grad, numeric, rtol=1e-6, atol=1e-6 * np.max(np.abs(numeric)))


def test_banded_inverse_refuses_a_schedule_workload_in_one_line():
  from tff_mf import checks  # pylint: disable=g-import-not-at-top
  with pytest.raises(checks.CheckError, match="use bisr") as e:
    _factorize(COOLDOWN, "banded_inverse", bands=4)
  assert "\n" not in str(e.value)
