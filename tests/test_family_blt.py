"""Buffered linear Toeplitz family (Dvijotham et al. 2024, arXiv:2404.16706; McMahan, Xu,
Zhang 2024, arXiv:2408.08868): conversions, gradients, sensitivity, stream."""

import itertools

import numpy as np
import pytest

from tff_mf import checks
from tff_mf.accounting import mmcc
from tff_mf.factorization import toeplitz_ops
from tff_mf.participation import toeplitz_bounds
from tff_mf.factorization import workloads
from tff_mf.factorization.families import blt
from tff_mf.factorization.families import toeplitz

THETA = np.array([0.995, 0.9, 0.5])
THETA_HAT = np.array([0.97, 0.7, 0.2])


def _fd_gradient(fun, x, eps=1e-6):
  return np.array([(fun(x + eps * e) - fun(x - eps * e)) / (2 * eps) for e in np.eye(x.size)])


def test_inverse_round_trip_and_closed_form():
  c_blt, inv = blt.from_theta_pair(THETA, THETA_HAT)
  assert np.all(c_blt.omega > 0) and np.all(inv.omega < 0)
  # C⁻¹ from (θ, ω) alone (eigenvalues) equals the closed-form pair, and back again.
  computed = c_blt.inverse()
  np.testing.assert_allclose(np.sort(computed.theta), np.sort(THETA_HAT), rtol=1e-13)
  np.testing.assert_allclose(computed.omega[np.argsort(computed.theta)],
                             inv.omega[np.argsort(inv.theta)], rtol=1e-12)
  back = computed.inverse()
  np.testing.assert_allclose(back.theta[np.argsort(back.theta)], np.sort(THETA), rtol=1e-13)
  np.testing.assert_allclose(back.omega[np.argsort(back.theta)],
                             c_blt.omega[np.argsort(c_blt.theta)], rtol=1e-12)
  # The coefficient sequences are inverse to each other (C·C⁻¹ = I), checked densely too.
  n = 200
  c, c_inv = c_blt.coefficients(n), inv.coefficients(n)
  np.testing.assert_allclose(np.convolve(c, c_inv)[:n], np.eye(1, n)[0], atol=1e-14)
  np.testing.assert_allclose(c_blt.matrix(n) @ inv.matrix(n), np.eye(n), atol=1e-13)
  # Coefficients by definition: c_0 = 1, c_k = Σ ω θ^{k−1}.
  assert c[0] == 1.0 and c[5] == pytest.approx(np.sum(c_blt.omega * THETA ** 4), rel=1e-14)
  # Interlacing makes c positive and non-increasing.
  assert toeplitz_bounds.is_nonincreasing_nonnegative(c)


def test_inverse_refuses_complex_decays():
  with pytest.raises(checks.CheckError, match="complex"):
    blt.inverse([0.9, 0.8], [0.5, -0.5])


N = 40
WORKLOADS = {
    "prefix": None,
    "momentum": workloads.momentum_matrix(N, 0.8),
    "cooldown": workloads.momentum_matrix(N, 0.8, workloads.learning_rates(N, "cooldown", 10)),
}


@pytest.mark.parametrize("name", sorted(WORKLOADS))
@pytest.mark.parametrize("error", ["mean", "max"])
@pytest.mark.parametrize("min_sep,k,m", [(N, 1, 1), (N, 1, 3), (5, 4, 2), (3, None, 3)])
def test_gradient_matches_finite_differences(name, error, min_sep, k, m):
  work = toeplitz_ops.workload_operator(N, WORKLOADS[name])
  k = toeplitz_bounds.participations(N, min_sep, k)[1]
  objective = blt._Objective(work, N, m, error, min_sep, k)  # pylint: disable=protected-access
  y = blt._log_gaps(blt.initial_points(N, m))  # pylint: disable=protected-access
  y = y + 0.2 * np.random.default_rng(m).normal(size=y.size)
  _, grad = objective.value_and_grad(y)
  fd = _fd_gradient(lambda x: objective.value_and_grad(x)[0], y)
  np.testing.assert_allclose(grad, fd, rtol=0, atol=1e-6 * np.max(np.abs(grad)))


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_factors_and_extras(name):
  a = WORKLOADS[name]
  result = blt.optimize(N, 3, workload=a, min_sep=6, max_participations=4)
  a_dense = workloads.prefix_sum(N) if a is None else a
  checks.product(a_dense, result.b, result.c, "BLT", atol=1e-10)
  ex = result.extras
  assert set(ex) == set(blt.EXTRAS) and all(v.dtype == np.float64 for v in ex.values())
  c_blt = blt.BLT(ex["blt_theta"], ex["blt_omega"])
  np.testing.assert_allclose(result.c, c_blt.matrix(N), atol=1e-15)
  np.testing.assert_allclose(
      np.linalg.inv(result.c), blt.BLT(ex["blt_inverse_theta"], ex["blt_inverse_omega"]).matrix(N),
      atol=1e-12)
  assert np.all((ex["blt_theta"] > 0) & (ex["blt_theta"] < 1))
  assert result.info["sensitivity_exact"]
  assert result.info["sensitivity"] == pytest.approx(
      toeplitz_bounds.min_sep_sensitivity(result.c[:, 0], N, 6, 4), rel=1e-14)
  assert result.info["rmse"] == pytest.approx(
      result.info["sensitivity"] * np.linalg.norm(result.b) / np.sqrt(N), rel=1e-12)


def _float32_run(st, z):
  """The LinearStream recurrence evaluated entirely in float32."""
  state = np.zeros((st.k, z.shape[1]), np.float32)
  tables = [np.asarray(t, np.float32) for t in st.tables(0)]
  f, g, w_old, w_new, c = tables
  out = np.empty(z.shape, np.float32)
  copied = st.copies >= 0
  for i in range(z.shape[0]):
    new = f @ state + g[:, None] * z[i][None, :]
    new[copied] = state[st.copies[copied]]
    out[i] = w_old @ state + w_new @ new + c * z[i]
    state = new
  return out


def test_stream_matches_inverse_and_is_float32_stable():
  result = blt.optimize(256, 4)
  st = blt.stream(result.extras, 256)
  assert st.k == result.info["buffers"] and not st.time_varying
  c_inv = np.linalg.inv(result.c)
  np.testing.assert_allclose(st.noise_matrix(), c_inv, rtol=0,
                             atol=1e-10 * np.max(np.abs(c_inv)))
  c_blt = blt.BLT(result.extras["blt_theta"], result.extras["blt_omega"])
  np.testing.assert_allclose(blt.stream(c_blt, 256).noise_matrix(), c_inv, atol=1e-10)
  # float32: relative row error stays at float32 rounding over 2048 rounds.
  n = 2048
  long = blt.optimize(n, 4, dense=False)
  st = blt.stream(long.extras, n)
  z = np.random.default_rng(0).normal(size=(n, 16))
  exact = st.run(z)
  approx = _float32_run(st, z.astype(np.float32)).astype(np.float64)
  rel = np.linalg.norm(approx - exact, axis=1) / np.linalg.norm(exact, axis=1)
  assert np.max(rel) < 2e-6
  assert np.max(rel[-256:]) < 4 * np.max(rel[:256]) + 1e-7  # not growing with the round


def _patterns(n, min_sep, k):
  for size in range(1, k + 1):
    for rounds in itertools.combinations(range(n), size):
      if all(b - a >= min_sep for a, b in zip(rounds, rounds[1:])):
        yield rounds


@pytest.mark.parametrize("n,min_sep,k", [(12, 3, 4), (11, 2, 3), (10, 4, None), (9, 1, 9)])
def test_sensitivity_against_brute_force(n, min_sep, k):
  c_blt, _ = blt.from_theta_pair(THETA, THETA_HAT)
  c = c_blt.matrix(n)
  k_fit = toeplitz_bounds.participations(n, min_sep, k)[1]
  best_rounds, best = None, 0.0
  for rounds in _patterns(n, min_sep, k_fit):
    for signs in itertools.product((1.0, -1.0), repeat=len(rounds)):
      value = np.linalg.norm(c[:, rounds] @ np.array(signs))
      if value > best + 1e-12:
        best_rounds, best = rounds, value
  sens = blt.sensitivity(c_blt, n, min_sep, k)
  assert sens == pytest.approx(best, rel=1e-12)
  # The worst pattern is 0, min_sep, 2·min_sep, … (non-negative non-increasing coefficients).
  assert best_rounds == tuple(range(0, min_sep * k_fit, min_sep))[:len(best_rounds)]
  assert np.linalg.norm(c[:, best_rounds].sum(axis=1)) == pytest.approx(best, rel=1e-12)
  rng = np.random.default_rng(2)
  patterns = list(_patterns(n, min_sep, k_fit))
  for _ in range(200):
    rounds = patterns[rng.integers(len(patterns))]
    g = rng.normal(size=(len(rounds), 4))
    g /= np.linalg.norm(g, axis=1, keepdims=True)
    assert np.linalg.norm(c[:, rounds] @ g) <= sens * (1 + 1e-12)


def test_sensitivity_upper_bound_without_monotone_coefficients():
  n, min_sep, k = 10, 2, 4
  odd = blt.BLT([0.9, 0.3], [0.9, -0.6])  # coefficients rise then fall: not monotone
  c = odd.matrix(n)
  assert not toeplitz_bounds.is_nonincreasing_nonnegative(c[:, 0])
  x = np.abs(c.T @ c)
  worst = max(np.sum(x[np.ix_(r, r)]) for r in _patterns(n, min_sep, k))
  assert blt.sensitivity(odd, n, min_sep, k) >= np.sqrt(worst) * (1 - 1e-12)


def test_optimized_beats_truncation_identity_and_improves_with_buffers():
  n = 512
  identity = toeplitz_ops.evaluate([1.0], n)["rmse"]
  previous = identity
  for m in range(1, 6):
    result = blt.optimize(n, m, dense=False)
    rmse = result.info["rmse"]
    same_memory = toeplitz_ops.evaluate(mmcc.sqrt_prefix_coefficients(m + 1), n)["rmse"]
    assert result.info["converged"] and rmse < same_memory and rmse < identity
    assert rmse <= previous * (1 + 1e-7)  # more buffers never hurt (up to L-BFGS accuracy)
    previous = rmse
  # Close to the best banded Toeplitz C with all n bands (a 1% margin).
  full = toeplitz.optimize(n, n, dense=False).info["rmse"]
  assert full * (1 - 1e-9) <= previous <= 1.01 * full


def test_min_sep_optimization_and_max_error():
  n, min_sep, k = 256, 16, 8
  result = blt.optimize(n, 3, min_sep=min_sep, max_participations=k, dense=False)
  assert result.info["sensitivity_exact"] and result.info["max_participations"] == k
  assert result.info["rmse"] < toeplitz_ops.evaluate([1.0], n, None, min_sep, k)["rmse"]
  single = blt.optimize(n, 3, dense=False)
  assert blt.evaluate(blt.BLT(single.extras["blt_theta"], single.extras["blt_omega"]), n, None,
                      min_sep, k)["rmse"] >= result.info["rmse"] * (1 - 1e-9)
  worst = blt.optimize(n, 3, error="max", dense=False)
  assert worst.info["max_error"] <= single.info["max_error"] * (1 + 1e-9)


def test_init_and_refusals():
  start, _ = blt.from_theta_pair(THETA, THETA_HAT)
  result = blt.optimize(64, 3, init=start, dense=False)
  assert result.info["rmse"] <= blt.evaluate(start, 64)["rmse"]
  with pytest.raises(checks.CheckError):
    blt.optimize(64, 2, init=start)
  with pytest.raises(checks.CheckError, match="interlaced"):
    blt.optimize(64, 1, init=blt.BLT([0.9], [2.0]))  # θ̂ = −1.1
  with pytest.raises(checks.CheckError, match="diverges"):
    blt.stream(blt.BLT([0.5], [-1.0]), 8)  # C⁻¹ decays by 1.5
  with pytest.raises(checks.CheckError, match="lack"):
    blt.stream({"blt_theta": THETA}, 8)
  identity = blt.optimize(8, 0)
  np.testing.assert_array_equal(identity.c, np.eye(8))
  assert blt.stream(identity.extras, 8).k == 0


def _assert_valid_blt(f, n, buffers_requested):
  """A BLT factorization: distinct decays in (0, 1] (a decay the optimizer drove to 1 within
  rounding is valid for C), at most the requested buffers (fewer only with the reason
  recorded), C its coefficients' Toeplitz matrix, C⁻¹'s stored BLT its inverse with a
  noise stream that does not diverge, B·C = A."""
  theta = f.extras["blt_theta"]
  assert theta.size == f.info["buffers"] <= buffers_requested
  assert np.all((theta > 0) & (theta <= 1)) and len(set(theta.tolist())) == theta.size
  assert np.all(np.isfinite(f.extras["blt_omega"]))
  assert blt.stream(f.extras, n).n == n  # refuses C⁻¹ decays of modulus ≥ 1
  inv = blt.BLT(f.extras["blt_inverse_theta"], f.extras["blt_inverse_omega"]).matrix(n)
  np.testing.assert_allclose(inv @ f.c / f.c[0, 0], np.eye(n), atol=1e-9)
  if f.info["buffers"] < buffers_requested:
    assert "switches" in f.info["returned_why"]
  c_blt = blt.BLT(theta, f.extras["blt_omega"]).matrix(n)
  np.testing.assert_allclose(f.c, f.c[0, 0] * c_blt, rtol=1e-12, atol=1e-12 * abs(f.c[0, 0]))
  scale = np.linalg.norm(f.a)
  np.testing.assert_allclose(f.b @ f.c, f.a, atol=1e-10 * scale)


@pytest.mark.parametrize("n,momentum,schedule", [
    (16, 0.99, "constant"), (16, 0.99, "cooldown"), (24, 0.8, "cooldown"),
    (24, 0.95, "constant")])
def test_momentum_fixed_epoch_gives_a_valid_blt(n, momentum, schedule):
  """These workloads once failed ("BLT buffer decays must be distinct"): the optimizer may
  push pole/zero pairs to θ = 1 in float64. Whether it does depends on the BLAS's rounding,
  so the property is checked: a valid BLT comes back, whatever the buffer count."""
  from tff_mf import participation  # pylint: disable=g-import-not-at-top
  from tff_mf.factorization import strategies  # pylint: disable=g-import-not-at-top
  kw = {} if schedule == "constant" else {"schedule_rounds": n // 2}
  spec = strategies.FactorizationSpec(
      workload=workloads.WorkloadSpec(kind="momentum", n=n, momentum=momentum,
                                      lr_schedule=schedule, **kw),
      strategy="blt", participation=participation.Participation("fixed_epoch", epochs=2),
      buffers=4)
  _assert_valid_blt(strategies.factorize(spec), n, 4)


def _collapse(points, pair):
  """``points`` (interlaced 1 − u, decreasing) with the pair ``pair`` (0-based; the last
  pair when −1) driven together as the optimizer may: in the middle to within 1e-14
  relative, at the end below the rounding of 1, where their decays θ = 1 − e are equal."""
  out = points.copy()
  if pair == -1:
    out[-2:] = [4e-17, 2e-17]
    assert 1.0 - out[-2] == 1.0 - out[-1]
  else:
    out[2 * pair] = out[2 * pair + 1] * (1 + 1e-14)
  return out


def test_prune_drops_constructed_collapsed_pairs():
  points = blt.initial_points(64, 4)
  for pair in (-1, 1):
    pruned = blt._prune(_collapse(points, pair))  # pylint: disable=protected-access
    np.testing.assert_array_equal(pruned, np.delete(points, [2 * pair, 2 * pair + 1]))
    c_blt, inv = blt.from_theta_pair(1.0 - pruned[1::2], 1.0 - pruned[0::2])  # distinct
    assert c_blt.buffers == inv.buffers == 3
  both = blt._prune(_collapse(_collapse(points, -1), 1))  # pylint: disable=protected-access
  np.testing.assert_array_equal(both, points[[0, 1, 4, 5]])
  # An interlaced sequence with no coinciding pair is kept whole.
  np.testing.assert_array_equal(blt._prune(points), points)  # pylint: disable=protected-access
  # Dropping a pair within 1e-14 changes the coefficients by no more than that (docstring).
  n = 64
  close = _collapse(points, 1)
  full, _ = blt.from_theta_pair(1.0 - close[1::2], 1.0 - close[0::2])
  kept = blt._prune(close)  # pylint: disable=protected-access
  fewer, _ = blt.from_theta_pair(1.0 - kept[1::2], 1.0 - kept[0::2])
  np.testing.assert_allclose(fewer.coefficients(n), full.coefficients(n), rtol=1e-11,
                             atol=1e-12)


@pytest.mark.parametrize("pair", [-1, 1])
def test_optimize_returns_a_smaller_valid_blt_when_its_optimum_collapses(monkeypatch, pair):
  """The optimizer's result with a collapsed pair (constructed, not left to one BLAS's
  rounding) is pruned to a valid smaller BLT that says why it has fewer buffers."""
  real = blt._best_of_starts  # pylint: disable=protected-access

  def collapsing(*args):
    points, res, iterations = real(*args)
    return _collapse(points, pair), res, iterations
  monkeypatch.setattr(blt, "_best_of_starts", collapsing)
  n = 32
  result = blt.optimize(n, 4)
  assert result.info["buffers"] == 3 and result.info["buffers_requested"] == 4
  assert "switches 1 buffer(s) off" in result.info["returned_why"]
  # The pair cancels: the 4-buffer rmse (None where no 4-buffer BLT can be evaluated) is
  # the returned one, up to the pruning's 1e-14 change of the coefficients.
  at_four = result.info["rmse_at_buffers_requested"]
  assert at_four is None or at_four == pytest.approx(result.info["rmse"], rel=1e-9)
  assert result.info["rmse"] == pytest.approx(blt.evaluate(
      blt.BLT(result.extras["blt_theta"], result.extras["blt_omega"]), n)["rmse"], rel=1e-12)
