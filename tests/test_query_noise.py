"""Streaming noise, MatrixFactorizationQuery and build_mechanism without TFF processes.

Denisov et al. Algorithm 1 / App H Algorithm 3 / Thm 4.1 (``001_…``, ``000_…``).
"""

import dp_accounting
from dp_accounting.pld import pld_privacy_accountant
from dp_accounting.rdp import rdp_privacy_accountant
import numpy as np
import pytest
import scipy.linalg
import scipy.stats
import tensorflow as tf

from tff_mf import factorization as fz
from tff_mf import strategies
from tff_mf import workloads
from tff_mf.tf import aggregators
from tff_mf.tf import noise as noise_lib
from tff_mf.tf import query as query_lib

SPECS = [tf.TensorSpec([3, 2], tf.float32), tf.TensorSpec([2], tf.float32)]
D = 8
N = 8
SIGMA = 0.7 * 1.5


def _factorization(strategy, n=N, workload=None):
  w = workload or workloads.WorkloadSpec("prefix_sum", n)
  return strategies.factorize(strategies.FactorizationSpec(workload=w, strategy=strategy))


def _random_square_factorization(n=N, seed=0):
  """A random lower-triangular C (normalized) with B = S·C⁻¹."""
  rng = np.random.default_rng(seed)
  c = np.tril(rng.normal(size=(n, n)) * 0.3)
  c[np.diag_indices(n)] = 1.0 + rng.random(n)
  s = workloads.prefix_sum(n)
  b = scipy.linalg.solve_triangular(c.T, s.T, lower=False).T
  b, c, _ = fz.normalize(b, c)
  return fz.Factorization(a=s, b=b, c=c, strategy="random").validate(atol=1e-8)


def _random_structured(n=N, h=2, r=2, seed=3):
  rng = np.random.default_rng(seed)
  d_mat = np.tril(np.triu(rng.normal(size=(n, n)) * 0.3, -(h - 1)))
  d_mat[np.diag_indices(n)] = 1.5 + rng.random(n)
  return d_mat, rng.normal(size=(n, r)) * 0.3, rng.normal(size=(n, r)) * 0.3


def _run_rounds(query, rounds, specs=SPECS, state=None):
  """Noise rows of ``rounds`` rounds (zero records): list of flat float64 vectors, final state."""
  step = tf.function(query.get_noised_result)
  zeros = tf.nest.map_structure(lambda s: tf.zeros(s.shape, s.dtype), specs)
  state = query.initial_global_state() if state is None else state
  rows, events = [], []
  for _ in range(rounds):
    result, state, event = step(zeros, state)
    rows.append(np.concatenate([np.asarray(x, np.float64).ravel() for x in tf.nest.flatten(result)]))
    events.append(event)
  return rows, state, events


def _streams():
  """(name, StreamingNoise) for each implementation, small enough for exact checks."""
  d_mat, u, v = _random_structured()
  mom = workloads.momentum_matrix(N, 0.9, workloads.learning_rates(N, "decay", 3))
  return [
      ("dense_tree", noise_lib.DenseNoise.from_factorization(_factorization("honaker_online"))),
      ("dense_square", noise_lib.DenseNoise.from_factorization(_random_square_factorization())),
      ("structured_prefix", noise_lib.StructuredNoise(d_mat, u, v, 2, workloads.prefix_sum(N))),
      ("structured_momentum", noise_lib.StructuredNoise(d_mat, u, v, 2, mom)),
      ("structured_h1_r0", noise_lib.StructuredNoise(np.diag(np.arange(1.0, N + 1)),
                                                     np.zeros((N, 0)), np.zeros((N, 0)), 1,
                                                     workloads.prefix_sum(N))),
      ("precomputed", noise_lib.PrecomputedNoise.from_factorization(
          _factorization("honaker_full"), 11, SPECS)),
  ]


@pytest.mark.parametrize("name,stream", _streams(), ids=lambda x: x if isinstance(x, str) else "")
def test_noise_rows_equal_numpy_n_times_z(name, stream):
  seed = 11
  q = query_lib.MatrixFactorizationQuery(stream, l2_norm_clip=1.5, noise_multiplier=0.7,
                                         record_specs=SPECS, noise_seed=seed)
  rows, state, _ = _run_rounds(q, N)
  z = SIGMA * noise_lib.standard_normal_matrix(noise_lib.seed_pair(seed), stream.m, SPECS)
  expected = stream.noise_matrix() @ z
  np.testing.assert_allclose(np.array(rows), expected, rtol=1e-5, atol=1e-5, err_msg=name)
  assert int(state.round_index) == N
  assert np.all(np.abs(np.array(rows)).sum(axis=1) > 0)  # never silently zero


def test_structured_matches_dense_for_same_decoder():
  """StructuredNoise and DenseNoise of the same B̂ give the same stream (to float32 rounding)."""
  d_mat, u, v = _random_structured()
  s = workloads.prefix_sum(N)
  stream = noise_lib.StructuredNoise(d_mat, u, v, 2, s)
  b = stream.decoder()
  c = scipy.linalg.solve_triangular(b, s, lower=True)
  f = fz.Factorization(a=s, b=b, c=np.tril(c), strategy="structured").validate(atol=1e-8)
  np.testing.assert_allclose(stream.noise_matrix(), f.noise_matrix(), atol=1e-10)
  assert abs(stream.sensitivity - 1.0) < 1e-12 and abs(f.sensitivity - 1.0) < 1e-9
  kw = dict(l2_norm_clip=1.0, noise_multiplier=1.0, record_specs=SPECS, noise_seed=5)
  a_rows, _, _ = _run_rounds(query_lib.MatrixFactorizationQuery(stream, **kw), N)
  b_rows, _, _ = _run_rounds(query_lib.MatrixFactorizationQuery(
      noise_lib.DenseNoise.from_factorization(f), **kw), N)
  np.testing.assert_allclose(a_rows, b_rows, rtol=1e-5, atol=1e-5)


def test_structured_stream_is_float32_accurate_for_cancelling_factors():
  """The low-rank factors may be huge and cancel (ALS leaves U·Vᵀ free above the band):
  U·T, V·T⁻ᵀ with T a shear of size 300 give the same B̂, with cancellation like that of
  the n = 2048 fit. A float32 β = Σ V[j]ᵀZ[j] then loses ~4 digits (2e-3 relative error,
  measured in numpy); the Cholesky-whitened state keeps rows of N·Z to float32 accuracy."""
  n, h, r, d = 64, 3, 3, 500
  rng = np.random.default_rng(7)
  d_mat, u, v = _random_structured(n=n, h=h, r=r, seed=8)
  t = np.eye(r) + 300 * np.triu(rng.normal(size=(r, r)), 1)
  u_big, v_big = u @ t, v @ np.linalg.inv(t).T
  assert np.max(np.abs(u_big)) > 10 and np.max(np.abs(v_big)) > 10
  specs = [tf.TensorSpec([d], tf.float32)]
  for workload in (workloads.prefix_sum(n),
                   workloads.momentum_matrix(n, 0.9, workloads.learning_rates(n, "decay", 8))):
    stream = noise_lib.StructuredNoise(d_mat, u_big, v_big, h, workload)
    assert stream.noise_bands == h + stream.inverse_bands - 1
    np.testing.assert_allclose(
        stream.noise_matrix(),
        noise_lib.StructuredNoise(d_mat, u, v, h, workload).noise_matrix(), atol=1e-9)
    # The state recursion never amplifies rounding errors: ‖L_i⁻¹·L_{i−1}‖₂ ≤ 1, ‖L_i⁻¹V‖ ≤ 1.
    transition, inject = stream._transition, stream._inject  # pylint: disable=protected-access
    assert max(np.linalg.norm(m, 2) for m in transition) <= 1 + 1e-9
    assert np.max(np.linalg.norm(inject, axis=1)) <= 1 + 1e-9
    q = query_lib.MatrixFactorizationQuery(stream, l2_norm_clip=1.0, noise_multiplier=1.0,
                                           record_specs=specs, noise_seed=2)
    rows, _, _ = _run_rounds(q, n, specs=specs)
    expected = stream.noise_matrix() @ noise_lib.standard_normal_matrix(
        noise_lib.seed_pair(2), n, specs)
    rel = np.linalg.norm(np.array(rows) - expected, axis=1) / np.linalg.norm(expected, axis=1)
    assert rel.max() < 2e-6, rel.max()


def test_structured_stream_runs_in_float64_for_float64_models():
  d_mat, u, v = _random_structured()
  specs = [tf.TensorSpec([4], tf.float64)]
  stream = noise_lib.StructuredNoise(d_mat, u, v, 2, workloads.prefix_sum(N))
  q = query_lib.MatrixFactorizationQuery(stream, l2_norm_clip=1.0, noise_multiplier=1.0,
                                         record_specs=specs, noise_seed=4)
  rows, _, _ = _run_rounds(q, N, specs=specs)
  expected = stream.noise_matrix() @ noise_lib.standard_normal_matrix(
      noise_lib.seed_pair(4), N, specs)
  np.testing.assert_allclose(np.array(rows), expected, rtol=1e-12, atol=1e-12)
  assert stream.state_bytes(specs) == (2 + 1 + 2) * 4 * 8  # h' = h + 1 Z rows and r state rows


def test_structured_pieces_recover_cached_decoder():
  rng = np.random.default_rng(4)
  n, h, r = 40, 3, 2
  d_mat = np.tril(np.triu(rng.normal(size=(n, n)), -(h - 1)))
  d_mat[np.diag_indices(n)] = 2.0
  b_hat = noise_lib.structured_decoder(d_mat, rng.normal(size=(n, r)), rng.normal(size=(n, r)), h)
  d2, u2, v2 = noise_lib.structured_pieces(b_hat, h, r)
  np.testing.assert_allclose(noise_lib.structured_decoder(d2, u2, v2, h), b_hat, atol=1e-10)
  with pytest.raises(noise_lib.NoiseError, match="not 3-banded plus rank 1"):
    noise_lib.structured_pieces(b_hat, h, 1)


def _lr_test_statistic(samples, cov):
  """Likelihood-ratio statistic of H0: samples ~ N(0, cov) (known mean), ~ χ²(n(n+1)/2)."""
  k, n = samples.shape
  chol = np.linalg.cholesky(cov)
  w = scipy.linalg.solve_triangular(chol, samples.T, lower=True)  # whitened, n x k
  s = w @ w.T / k
  _, logdet = np.linalg.slogdet(s)
  return k * (np.trace(s) - logdet - n), n * (n + 1) // 2


@pytest.mark.parametrize("name,stream", _streams()[:4],
                         ids=lambda x: x if isinstance(x, str) else "")
def test_empirical_covariance_matches_sigma2_n_nt(name, stream):
  """Over 4 seeds × 1000 coordinates (4000 i.i.d. draws of the n-vector of noise in one
  coordinate), the likelihood-ratio test of Cov = σ²·N·Nᵀ at false-alarm rate 1e-3
  (χ² with n(n+1)/2 = 36 degrees of freedom) accepts, and rejects a 10% error in N."""
  specs = [tf.TensorSpec([1000], tf.float32)]
  samples = []
  for seed in range(4):
    q = query_lib.MatrixFactorizationQuery(stream, l2_norm_clip=1.5, noise_multiplier=0.7,
                                           record_specs=specs, noise_seed=seed)
    rows, _, _ = _run_rounds(q, N, specs=specs)
    samples.append(np.array(rows).T)  # 1000 x n
  samples = np.concatenate(samples)
  nm = stream.noise_matrix()
  stat, dof = _lr_test_statistic(samples, SIGMA**2 * nm @ nm.T)
  threshold = scipy.stats.chi2.ppf(1 - 1e-3, dof)
  assert stat < threshold, f"{name}: LR statistic {stat:.1f} >= {threshold:.1f}"
  wrong = nm.copy()
  wrong[N // 2] *= 1.1
  stat_wrong, _ = _lr_test_statistic(samples, SIGMA**2 * wrong @ wrong.T)
  assert stat_wrong > threshold, f"{name}: test has no power ({stat_wrong:.1f})"


def test_unpinned_seeds_differ_and_pinned_repeat():
  stream = noise_lib.DenseNoise.from_factorization(_factorization("honaker_online"))
  kw = dict(l2_norm_clip=1.0, noise_multiplier=1.0, record_specs=SPECS)
  tf.random.set_seed(1234)  # a global seed must not make OS-entropy seeds repeat
  free = query_lib.MatrixFactorizationQuery(stream, **kw)
  seeds = {tuple(np.asarray(free.initial_global_state().seed)) for _ in range(3)}
  seeds.add(tuple(np.asarray(tf.function(free.initial_global_state)().seed)))
  seeds.add(tuple(np.asarray(tf.function(query_lib.MatrixFactorizationQuery(
      stream, **kw).initial_global_state)().seed)))
  assert len(seeds) == 5
  a, _, _ = _run_rounds(free, 2)
  b, _, _ = _run_rounds(free, 2)
  assert not np.allclose(a, b)
  pinned = [query_lib.MatrixFactorizationQuery(stream, noise_seed=9, **kw) for _ in range(2)]
  np.testing.assert_array_equal(_run_rounds(pinned[0], 2)[0], _run_rounds(pinned[1], 2)[0])


def test_restored_state_continues_identical_stream():
  d_mat, u, v = _random_structured()
  stream = noise_lib.StructuredNoise(d_mat, u, v, 2, workloads.prefix_sum(N))
  q = query_lib.MatrixFactorizationQuery(stream, l2_norm_clip=1.0, noise_multiplier=1.0,
                                         record_specs=SPECS)  # seed from OS entropy
  start = q.initial_global_state()
  full, _, _ = _run_rounds(q, N, state=start)
  first, state, _ = _run_rounds(q, 3, state=start)
  saved = tf.nest.map_structure(np.array, state)  # a checkpoint: plain arrays
  restored = tf.nest.map_structure(tf.constant, saved)
  rest, _, _ = _run_rounds(q, N - 3, state=restored)
  np.testing.assert_array_equal(np.array(first + rest), np.array(full))


def test_round_past_n_raises():
  q = query_lib.MatrixFactorizationQuery.from_factorization(
      _factorization("honaker_online", n=3), l2_norm_clip=1.0, noise_multiplier=1.0,
      record_specs=SPECS, noise_seed=1)
  _, state, _ = _run_rounds(q, 3)
  with pytest.raises(tf.errors.InvalidArgumentError, match="past the n=3 rounds"):
    _run_rounds(q, 1, state=state)


def test_dp_events_compose_to_one_gaussian():
  z = 0.9
  q = query_lib.MatrixFactorizationQuery.from_factorization(
      _factorization("honaker_online"), l2_norm_clip=1.0, noise_multiplier=z,
      record_specs=SPECS, noise_seed=1)
  _, _, events = _run_rounds(q, N)
  events = [dp_accounting.DpEvent.from_named_tuple(
      tf.nest.map_structure(lambda t: t.numpy() if hasattr(t, "numpy") else t,
                            e.to_named_tuple())) for e in events]
  assert not any(isinstance(e, dp_accounting.UnsupportedDpEvent) for e in events)
  run = dp_accounting.ComposedDpEvent(events)
  reference = query_lib.single_participation_event(z)
  for make in (pld_privacy_accountant.PLDAccountant, rdp_privacy_accountant.RdpAccountant):
    acc_run, acc_ref = make(), make()
    acc_run.compose(run)
    acc_ref.compose(reference)
    assert acc_run.get_epsilon(1e-6) == pytest.approx(acc_ref.get_epsilon(1e-6), rel=1e-9)
  # Only round 0 carries privacy loss; it is the whole Thm 4.1 guarantee at every prefix.
  assert [float(e.sampling_probability) for e in events] == [1.0] + [0.0] * (N - 1)


def test_clipping_to_global_norm():
  q = query_lib.MatrixFactorizationQuery.from_factorization(
      _factorization("honaker_online"), l2_norm_clip=1.5, noise_multiplier=1.0,
      record_specs=SPECS, noise_seed=1)
  record = [tf.fill([3, 2], 3.0), tf.fill([2], 4.0)]
  clipped = q.preprocess_record(q.derive_sample_params(q.initial_global_state()), record)
  norm = np.sqrt(sum(np.sum(np.square(x)) for x in clipped))
  assert norm == pytest.approx(1.5, rel=1e-6)
  small = [tf.fill([3, 2], 0.1), tf.fill([2], 0.1)]
  out = q.preprocess_record(1.5, small)
  np.testing.assert_allclose(out[0], small[0])


# -- errors ----------------------------------------------------------------------------------
def _kw(**overrides):
  kw = dict(l2_norm_clip=1.0, noise_multiplier=1.0, record_specs=SPECS)
  kw.update(overrides)
  return kw


@pytest.mark.parametrize("overrides,match", [
    (dict(noise_multiplier=-0.1), "noise_multiplier must be non-negative"),
    (dict(noise_multiplier=float("nan")), "noise_multiplier must be non-negative"),
    (dict(l2_norm_clip=0.0), "l2_norm_clip must be positive"),
    (dict(l2_norm_clip=-1.0), "l2_norm_clip must be positive"),
    (dict(record_specs=[tf.TensorSpec([None], tf.float32)]), "partially unknown shape"),
    (dict(record_specs=[tf.TensorSpec([2], tf.int32)]), "non-float dtype"),
])
def test_query_rejects_bad_parameters(overrides, match):
  with pytest.raises(ValueError, match=match):
    query_lib.MatrixFactorizationQuery.from_factorization(_factorization("honaker_online"),
                                                          **_kw(**overrides))


def test_query_rejects_bad_matrices():
  c = _random_square_factorization().c
  upper = c.copy()
  upper[0, 2] = 0.5
  with pytest.raises(ValueError, match="must be lower triangular; entry \\[0, 2\\]"):
    query_lib.MatrixFactorizationQuery.from_encoder(upper, **_kw())
  singular = c.copy()
  singular[3, 3] = 0.0
  with pytest.raises(ValueError, match="singular: diagonal entry \\[3, 3\\]"):
    query_lib.MatrixFactorizationQuery.from_encoder(singular, **_kw())
  with pytest.raises(ValueError, match="not normalized"):
    query_lib.MatrixFactorizationQuery.from_encoder(2.0 * c, **_kw())
  with pytest.raises(ValueError, match="square"):
    query_lib.MatrixFactorizationQuery.from_encoder(c[:, :4], **_kw())
  nan = c.copy()
  nan[2, 1] = np.nan
  with pytest.raises(ValueError, match="non-finite"):
    query_lib.MatrixFactorizationQuery.from_encoder(nan, **_kw())
  f = _random_square_factorization()
  upper_a = f.a.copy()
  upper_a[1, 4] = 1.0
  bad_a = fz.Factorization(a=upper_a, b=f.b, c=f.c, strategy="x")
  with pytest.raises(ValueError, match="workload A must be lower triangular"):
    query_lib.MatrixFactorizationQuery.from_factorization(bad_a, **_kw())
  bad_b = fz.Factorization(a=f.a, b=f.b * 1.01, c=f.c, strategy="x")
  with pytest.raises(ValueError, match="B·C differs from A"):
    query_lib.MatrixFactorizationQuery.from_factorization(bad_b, **_kw())
  with pytest.raises(noise_lib.NoiseError, match="all-zero row 2"):
    nm = np.eye(4, 7)
    nm[2, 2] = 0.0
    noise_lib.DenseNoise(nm)
  d_mat, u, v = _random_structured()
  with pytest.raises(noise_lib.NoiseError, match="outside its 1 lower diagonals"):
    noise_lib.StructuredNoise(d_mat, u, v, 1, workloads.prefix_sum(N))
  with pytest.raises(noise_lib.NoiseError, match="bands h must be an integer"):
    noise_lib.StructuredNoise(d_mat, u, v, 0, workloads.prefix_sum(N))
  with pytest.raises(noise_lib.NoiseError, match="banded inverse"):
    noise_lib.StructuredNoise(d_mat, u, v, 2, _random_square_factorization(seed=1).b)


def test_query_rejects_mismatched_model_specs():
  q = query_lib.MatrixFactorizationQuery.from_factorization(_factorization("honaker_online"),
                                                            **_kw(noise_seed=1))
  with pytest.raises(ValueError, match="does not match the record specs"):
    q.initial_sample_state([tf.TensorSpec([3, 2], tf.float32)])
  with pytest.raises(ValueError, match="leaf #1 is float32\\(3,\\)"):
    q.initial_sample_state([tf.TensorSpec([3, 2], tf.float32), tf.TensorSpec([3], tf.float32)])
  with pytest.raises(ValueError, match="does not match the record specs"):
    q.preprocess_record(1.0, [tf.zeros([3, 2])])
  with pytest.raises(ValueError, match="seed the PrecomputedNoise rows were built for"):
    query_lib.MatrixFactorizationQuery(
        noise_lib.PrecomputedNoise.from_factorization(_factorization("honaker_online"), 3, SPECS),
        **_kw(noise_seed=4))
  with pytest.raises(ValueError, match="rows have 8 entries, the record specs 3"):
    query_lib.MatrixFactorizationQuery(
        noise_lib.PrecomputedNoise.from_factorization(_factorization("honaker_online"), 3, SPECS),
        **_kw(noise_seed=3, record_specs=[tf.TensorSpec([3], tf.float32)]))


def test_nan_update_is_an_error():
  q = query_lib.MatrixFactorizationQuery.from_factorization(_factorization("honaker_online"),
                                                            **_kw(noise_seed=1))
  with pytest.raises(tf.errors.InvalidArgumentError, match="leaf #0 contains NaN or Inf"):
    q.preprocess_record(1.0, [tf.fill([3, 2], np.nan), tf.zeros([2])])


# -- build_mechanism without processes ---------------------------------------------------------
def test_default_structure_matches_denisov_table2():
  assert [aggregators.default_structure(2**k) for k in range(8, 13)] == [
      (4, 4), (5, 4), (5, 5), (6, 5), (6, 6)]


@pytest.mark.parametrize("kwargs,match", [
    (dict(mechanism="dpsgd"), "unknown mechanism"),
    (dict(total_rounds=0), "total_rounds must be a positive integer"),
    (dict(noise_multiplier=-1.0), "noise_multiplier must be non-negative"),
    (dict(clients_per_round=0), "clients_per_round must be positive"),
    (dict(clip_norm=0.0), "clip_norm must be positive"),
    (dict(momentum=1.0), "momentum must be in \\[0, 1\\)"),
    (dict(lr_schedule="cosine"), "unknown lr_schedule"),
    (dict(lr_schedule="decay"), "needs schedule_rounds"),
    (dict(schedule_rounds=2), "only used with lr_schedule"),
    (dict(lr_schedule="decay", schedule_rounds=99), "schedule_rounds must be in"),
    (dict(bands=2), "only apply to the structured mechanism"),
    (dict(mechanism="structured", bands=0), "bands must be a positive integer"),
    (dict(noise_seed=-3), "noise_seed must be in"),
    (dict(server_learning_rate=0.0), "server_learning_rate must be positive"),
    (dict(mechanism="gaussian_fixed", noise_seed=3), "cannot pin noise_seed"),
])
def test_build_mechanism_rejects_bad_arguments(kwargs, match):
  args = dict(mechanism="honaker_online", total_rounds=8, noise_multiplier=1.0,
              clients_per_round=4, clip_norm=1.0)
  args.update(kwargs)
  with pytest.raises(ValueError, match=match):
    aggregators.build_mechanism(args.pop("mechanism"), **args)


def test_server_optimizer_applies_momentum_and_schedule():
  """θ_i = θ_0 − η·(M(η)·M(β)·X)[i] (Denisov Prop 4.2) for TFF's optimizer."""
  n, beta, lr = 6, 0.9, 0.5
  etas = workloads.learning_rates(n, "decay", 2)
  opt = aggregators.build_server_optimizer(lr, beta, etas)
  x = np.random.default_rng(0).normal(size=(n, 3)).astype(np.float32)
  weights = [tf.zeros([3])]
  state = opt.initialize([tf.TensorSpec([3], tf.float32)])
  out = []
  for i in range(n):
    state, weights = opt.next(state, weights, [tf.constant(x[i])])
    out.append(np.array(weights[0]))
  expected = -lr * workloads.momentum_matrix(n, beta, etas) @ x
  np.testing.assert_allclose(np.array(out), expected, rtol=1e-5, atol=1e-6)


def test_honaker_setups_have_paper_sqrt_loss():
  """√L of Honaker online for n = 256 is 74.4 (Denisov App H Table 2)."""
  setup = aggregators.build_mechanism("honaker_online", total_rounds=256, noise_multiplier=1.0,
                                      clients_per_round=10, clip_norm=1.0)
  assert setup.sqrt_loss == pytest.approx(74.4, abs=0.05)
  assert setup.info["noise_implementation"].startswith("DenseNoise(n=256, m=511")
  tree_setup = aggregators.build_mechanism("tree_aggregation", total_rounds=256,
                                           noise_multiplier=1.0, clients_per_round=10,
                                           clip_norm=1.0)
  assert tree_setup.factorization is None
  assert tree_setup.info["noise_multiplier_per_node"] == pytest.approx(3.0)  # √9 levels


@pytest.mark.slow
def test_structured_n2048_near_optimal_and_streams_its_noise_matrix():
  """Denisov App H Table 2, n = 2048: √L optimal 143.6, structured (6, 5) 145.8 — within 3%.

  Uses the default factorization cache (computes and stores the n = 2048 entries
  when missing), then streams all 2048 rounds at d = 8 and compares with N·Z.
  """
  n = 2048
  setup = aggregators.build_mechanism("structured", total_rounds=n, noise_multiplier=1.0,
                                      clients_per_round=100, clip_norm=1.0, noise_seed=3)
  optimal = aggregators.build_mechanism("opt_prefix_sum", total_rounds=n, noise_multiplier=1.0,
                                        clients_per_round=100, clip_norm=1.0)
  assert (setup.info["bands"], setup.info["rank"]) == (6, 5)
  assert optimal.sqrt_loss == pytest.approx(143.6, abs=0.1)
  assert setup.sqrt_loss <= 1.03 * optimal.sqrt_loss
  assert setup.sqrt_loss == pytest.approx(145.8, rel=0.01)
  stream, _, _ = aggregators.structured_noise_for(n, 6, 5)
  q = query_lib.MatrixFactorizationQuery(stream, l2_norm_clip=1.0, noise_multiplier=1.0,
                                         record_specs=SPECS, noise_seed=3)
  rows, _, _ = _run_rounds(q, n)
  expected = stream.noise_matrix() @ noise_lib.standard_normal_matrix(
      noise_lib.seed_pair(3), n, SPECS)
  np.testing.assert_allclose(np.array(rows), expected, rtol=1e-5, atol=1e-5)
