"""Streaming noise, MatrixFactorizationQuery and build_mechanism without TFF processes.

Denisov et al. 2022, arXiv:2202.08312: Algorithm 1, App H Algorithm 3, Thm 4.1.
"""

import math

import dp_accounting
from dp_accounting.pld import pld_privacy_accountant
from dp_accounting.rdp import rdp_privacy_accountant
import numpy as np
import pytest
import scipy.linalg
import scipy.stats
import tensorflow as tf

from tff_mf import factorization as fz
from tff_mf import checks
from tff_mf import participation
from tff_mf import registry
from tff_mf import spec as spec_lib
from tff_mf.noise import streams
from tff_mf.factorization import strategies
from tff_mf.factorization import workloads
from tff_mf.factorization.families import structured
from tff_mf.tf import aggregators
from tff_mf.tf import noise as noise_lib
from tff_mf.tf import query as query_lib

import statcheck

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
  """(diagonals, U, V) of a random banded + low-rank B̂."""
  rng = np.random.default_rng(seed)
  diagonals = rng.normal(size=(h, n)) * 0.3
  diagonals[0] = 1.5 + rng.random(n)
  for k in range(h):
    diagonals[k, :k] = 0.0
  return diagonals, rng.normal(size=(n, r)) * 0.3, rng.normal(size=(n, r)) * 0.3


def _structured_noise(workload, pieces=None, **kw):
  """LinearNoise of a structured B̂ with C = B̂⁻¹·A, and that C."""
  diagonals, u, v = pieces or _random_structured(n=workload.shape[0], **kw)
  stream = structured.pieces_stream(diagonals, u, v, workload)
  b_hat = structured.decoder(diagonals, u, v)
  c = np.tril(scipy.linalg.solve_triangular(b_hat, workload, lower=True))
  return noise_lib.LinearNoise(stream, c), c


def _banded_c(n=N, b=3, seed=5):
  rng = np.random.default_rng(seed)
  c = np.zeros((n, n))
  for k in range(b):
    idx = np.arange(k, n)
    c[idx, idx - k] = (1.0 + rng.random(n - k)) if k == 0 else 0.3 * rng.normal(size=n - k)
  return c


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
  mom = workloads.momentum_matrix(N, 0.9, workloads.learning_rates(N, "decay", 3))
  tree_f = _factorization("honaker_online")
  banded = _banded_c()
  cb = np.stack([np.concatenate([np.zeros(k), np.diagonal(banded, -k)]) for k in range(3)], 1)
  toeplitz = np.array([1.0, -0.4, 0.2])
  toeplitz_c = sum(np.diag(np.full(N - k, toeplitz[k]), -k) for k in range(3))
  return [
      ("dense_tree", noise_lib.DenseNoise(tree_f.c, tree_f.noise_matrix())),
      ("dense_square", noise_lib.DenseNoise(_random_square_factorization().c)),
      ("structured_prefix", _structured_noise(workloads.prefix_sum(N))[0]),
      ("structured_momentum", _structured_noise(mom)[0]),
      ("structured_h1_r0", _structured_noise(workloads.prefix_sum(N), h=1, r=0)[0]),
      ("banded", noise_lib.LinearNoise(streams.lower_banded_inverse(cb, N), banded)),
      ("banded_toeplitz", noise_lib.LinearNoise(
          streams.lower_banded_inverse(toeplitz[None], N), toeplitz_c)),
      ("independent", noise_lib.LinearNoise(streams.independent(N), np.eye(N))),
      ("precomputed", noise_lib.PrecomputedNoise(
          _factorization("honaker_full").c, 11, SPECS,
          noise_matrix=_factorization("honaker_full").noise_matrix())),
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


@pytest.mark.parametrize("dtype", [tf.float32, tf.float64])
@pytest.mark.parametrize("name,params", [("banded", {"bands": 16}), ("blt", {}),
                                         ("structured", {})])
def test_fused_kernel_adds_the_graph_kernels_noise_bit_for_bit(name, params, dtype):
  """The XLA kernel (one loop over the state rows) rounds every product and sums in the
  graph's order: its rows and state equal the unfused kernel's, every bit, every round."""
  n = 20
  resolved = aggregators.resolve_mechanism(spec_lib.MechanismSpec.from_args(
      name, total_rounds=n, clients_per_round=2, clip_norm=0.5, noise_multiplier=1.5,
      params=params))
  specs = [tf.TensorSpec([2000], dtype), tf.TensorSpec([4, 5], dtype)]
  fused, graph = (noise_lib.LinearNoise(resolved.stream, resolved.factorization.c,
                                        jit_compile=jit) for jit in (True, False))
  seed = tf.constant(noise_lib.seed_pair(3))
  step = {s: tf.function(lambda i, state, s=s: s.noise_row(seed, i, state, specs, 0.75))
          for s in (fused, graph)}
  state_f, state_g = fused.initial_state(specs), graph.initial_state(specs)
  for i in range(n):
    rows_f, state_f = step[fused](tf.constant(i), state_f)
    rows_g, state_g = step[graph](tf.constant(i), state_g)
    for a, b in zip(tf.nest.flatten((rows_f, state_f)), tf.nest.flatten((rows_g, state_g))):
      assert np.array_equal(a.numpy(), b.numpy()), (name, i)


def test_structured_matches_dense_for_same_decoder():
  """LinearNoise of a structured B̂ and DenseNoise of its C give the same rows (float32)."""
  stream, c = _structured_noise(workloads.prefix_sum(N))
  dense = noise_lib.DenseNoise(c)
  np.testing.assert_allclose(stream.noise_matrix(), dense.noise_matrix(), atol=1e-10)
  assert stream.sensitivity == pytest.approx(dense.sensitivity, rel=1e-12)
  kw = dict(l2_norm_clip=1.0, noise_multiplier=1.0, record_specs=SPECS, noise_seed=5)
  a_rows, _, _ = _run_rounds(query_lib.MatrixFactorizationQuery(stream, **kw), N)
  b_rows, _, _ = _run_rounds(query_lib.MatrixFactorizationQuery(dense, **kw), N)
  np.testing.assert_allclose(a_rows, b_rows, rtol=1e-5, atol=1e-5)


def test_precomputed_rows_are_dense_rows_for_the_same_seed():
  f = _factorization("honaker_online")
  kw = dict(l2_norm_clip=1.0, noise_multiplier=0.8, record_specs=SPECS, noise_seed=21)
  dense, _, _ = _run_rounds(query_lib.MatrixFactorizationQuery(
      noise_lib.DenseNoise(f.c, f.noise_matrix()), **kw), N)
  pre, _, _ = _run_rounds(query_lib.MatrixFactorizationQuery(
      noise_lib.PrecomputedNoise(f.c, 21, SPECS, noise_matrix=f.noise_matrix()), **kw), N)
  np.testing.assert_allclose(np.array(pre), np.array(dense), rtol=1e-6, atol=1e-6)


def test_structured_stream_is_float32_accurate_for_cancelling_factors():
  """The low-rank factors may be huge and cancel (ALS leaves U·Vᵀ free above the band):
  U·T, V·T⁻ᵀ with T a shear of size 300 give the same B̂, with cancellation like that of
  the n = 2048 fit. A float32 β = Σ V[j]ᵀZ[j] then loses ~4 digits (2e-3 relative error,
  measured in numpy); the Cholesky-whitened state keeps rows of N·Z to float32 accuracy."""
  n, h, r, d = 64, 3, 3, 500
  rng = np.random.default_rng(7)
  diagonals, u, v = _random_structured(n=n, h=h, r=r, seed=8)
  t = np.eye(r) + 300 * np.triu(rng.normal(size=(r, r)), 1)
  u_big, v_big = u @ t, v @ np.linalg.inv(t).T
  assert np.max(np.abs(u_big)) > 10 and np.max(np.abs(v_big)) > 10
  specs = [tf.TensorSpec([d], tf.float32)]
  for workload in (workloads.prefix_sum(n),
                   workloads.momentum_matrix(n, 0.9, workloads.learning_rates(n, "decay", 8))):
    stream = structured.pieces_stream(diagonals, u_big, v_big, workload)
    hp = stream.k - r
    np.testing.assert_allclose(
        stream.noise_matrix(),
        structured.pieces_stream(diagonals, u, v, workload).noise_matrix(), atol=1e-9)
    # The state recursion never amplifies rounding errors: ‖L_i⁻¹·L_{i−1}‖₂ ≤ 1, ‖L_i⁻¹V‖ ≤ 1.
    transition, inject = stream.f[:, hp:, hp:], stream.f[:, hp:, 0]
    assert max(np.linalg.norm(m, 2) for m in transition) <= 1 + 1e-9
    assert np.max(np.linalg.norm(inject, axis=1)) <= 1 + 1e-9
    noise, _ = _structured_noise(workload, pieces=(diagonals, u_big, v_big))
    q = query_lib.MatrixFactorizationQuery(noise, l2_norm_clip=1.0, noise_multiplier=1.0,
                                           record_specs=specs, noise_seed=2)
    rows, _, _ = _run_rounds(q, n, specs=specs)
    expected = stream.noise_matrix() @ noise_lib.standard_normal_matrix(
        noise_lib.seed_pair(2), n, specs)
    rel = np.linalg.norm(np.array(rows) - expected, axis=1) / np.linalg.norm(expected, axis=1)
    assert rel.max() < 2e-6, rel.max()


def test_linear_stream_runs_in_float64_for_float64_models():
  specs = [tf.TensorSpec([4], tf.float64)]
  noise, _ = _structured_noise(workloads.prefix_sum(N))
  q = query_lib.MatrixFactorizationQuery(noise, l2_norm_clip=1.0, noise_multiplier=1.0,
                                         record_specs=specs, noise_seed=4)
  rows, _, _ = _run_rounds(q, N, specs=specs)
  expected = noise.noise_matrix() @ noise_lib.standard_normal_matrix(
      noise_lib.seed_pair(4), N, specs)
  np.testing.assert_allclose(np.array(rows), expected, rtol=1e-12, atol=1e-12)
  assert noise.state_bytes(specs) == (2 + 1 + 2) * 4 * 8  # h' = h + 1 Z rows and r state rows


@pytest.mark.parametrize("name,stream", [s for s in _streams() if s[0] != "precomputed"],
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
  wrong = nm.copy()
  wrong[N // 2] *= 1.1
  statcheck.assert_covariance(samples, SIGMA**2 * nm @ nm.T, alpha=1e-3,
                              alternatives={"row n/2 of N 10% larger": SIGMA**2 * wrong @ wrong.T},
                              what=name)


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


@pytest.mark.parametrize("name,stream", [s for s in _streams() if s[0] in (
    "structured_prefix", "banded", "banded_toeplitz", "dense_tree")],
                         ids=lambda x: x if isinstance(x, str) else "")
def test_restored_state_continues_identical_stream(name, stream):
  q = query_lib.MatrixFactorizationQuery(stream, l2_norm_clip=1.0, noise_multiplier=1.0,
                                         record_specs=SPECS)  # seed from OS entropy
  start = q.initial_global_state()
  full, _, _ = _run_rounds(q, N, state=start)
  first, state, _ = _run_rounds(q, 3, state=start)
  saved = tf.nest.map_structure(np.array, state)  # a checkpoint: plain arrays
  restored = tf.nest.map_structure(tf.constant, saved)
  rest, _, _ = _run_rounds(q, N - 3, state=restored)
  np.testing.assert_array_equal(np.array(first + rest), np.array(full))


@pytest.mark.parametrize("name,stream", _streams(), ids=lambda x: x if isinstance(x, str) else "")
def test_round_past_n_raises_for_every_implementation(name, stream):
  q = query_lib.MatrixFactorizationQuery(stream, l2_norm_clip=1.0, noise_multiplier=1.0,
                                         record_specs=SPECS, noise_seed=11)
  _, state, _ = _run_rounds(q, N)
  with pytest.raises(tf.errors.InvalidArgumentError, match=f"past the n={N} rounds"):
    _run_rounds(q, 1, state=state)


@pytest.mark.parametrize("scale", [1.0, 0.01, 3.0])
def test_dp_events_compose_to_one_gaussian_at_z_over_sensitivity(scale):
  """The event is Gaussian(z/sens) with sens computed from the C the stream adds noise for:
  C·0.01 (N·100) adds 100 times the noise and reports sens 0.01, never sens 1."""
  z = 0.9
  f = _factorization("honaker_online")
  noise = noise_lib.DenseNoise(scale * f.c, f.noise_matrix() / scale)
  assert noise.sensitivity == pytest.approx(scale, rel=1e-9)
  q = query_lib.MatrixFactorizationQuery(noise, l2_norm_clip=1.0, noise_multiplier=z,
                                         record_specs=SPECS, noise_seed=1)
  z = z / noise.sensitivity
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
def test_build_mechanism_calibrates_z_to_a_target_epsilon_under_the_schema():
  """ε of one Gaussian at z/sens with sens from the mechanism's own C, checked against the
  analytic Gaussian δ(ε) (Balle & Wang 2018) computed here with scipy."""
  for schema in (participation.SINGLE, participation.fixed_epoch(2)):
    setup = aggregators.build_mechanism(spec_lib.MechanismSpec.from_args(
        "opt_momentum", total_rounds=8, target_epsilon=2.0, delta=1e-5, clients_per_round=2,
        clip_norm=1.0, momentum=0.9, participation=schema))
    info = setup.info
    assert info["calibrated"] and info["epsilon"] <= 2.0
    mu = info["sensitivity"] / info["noise_multiplier"]
    delta = (scipy.stats.norm.cdf(mu / 2 - 2.0 / mu)
             - np.exp(2.0) * scipy.stats.norm.cdf(-mu / 2 - 2.0 / mu))
    assert delta <= 1e-5 * (1 + 1e-6)  # ε(z) ≤ 2 exactly, not only by the code's own function
    smaller = 0.99 * info["noise_multiplier"]
    mu = info["sensitivity"] / smaller
    assert (scipy.stats.norm.cdf(mu / 2 - 2.0 / mu)
            - np.exp(2.0) * scipy.stats.norm.cdf(-mu / 2 - 2.0 / mu)) > 1e-5  # and z is tight
  with pytest.raises(ValueError, match="exactly one of noise_multiplier and target_epsilon"):
    aggregators.build_mechanism(spec_lib.MechanismSpec.from_args(
        "opt_momentum", total_rounds=8, clients_per_round=2, clip_norm=1.0))


def test_zero_noise_needs_an_explicit_opt_in():
  noise = noise_lib.DenseNoise(_random_square_factorization().c)
  with pytest.raises(ValueError, match="allow_no_noise=True"):
    query_lib.MatrixFactorizationQuery(noise, l2_norm_clip=1.0, noise_multiplier=0.0,
                                       record_specs=SPECS)
  q = query_lib.MatrixFactorizationQuery(noise, l2_norm_clip=1.0, noise_multiplier=0.0,
                                         record_specs=SPECS, allow_no_noise=True)
  rows, _, _ = _run_rounds(q, 2)
  assert np.all(np.array(rows) == 0)
  with pytest.raises(ValueError, match="allow_no_noise=True"):
    aggregators.build_mechanism(spec_lib.MechanismSpec.from_args(
        "opt_prefix_sum", total_rounds=4, noise_multiplier=0.0, clients_per_round=2,
        clip_norm=1.0))


def test_streams_refuse_noise_that_does_not_invert_their_encoder():
  c = _random_square_factorization().c
  wrong = np.linalg.inv(c) * 0.5  # half the noise C needs
  with pytest.raises(noise_lib.NoiseError, match="does not add C⁻¹·Z"):
    noise_lib.DenseNoise(c, wrong)
  stream = streams.lower_banded_inverse(np.array([[1.0, -0.4, 0.2]]), N)
  with pytest.raises(noise_lib.NoiseError, match="does not add C⁻¹·Z"):
    noise_lib.LinearNoise(stream, 2.0 * np.eye(N))


def _kw(**overrides):
  kw = dict(l2_norm_clip=1.0, noise_multiplier=1.0, record_specs=SPECS)
  kw.update(overrides)
  return kw


@pytest.mark.parametrize("overrides,match", [
    (dict(noise_multiplier=-0.1), "noise_multiplier must be positive"),
    (dict(noise_multiplier=float("nan")), "noise_multiplier must be a finite"),
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
  with pytest.raises(ValueError, match="lower triangular; entry \\[0, 2\\]"):
    noise_lib.DenseNoise(upper)
  singular = c.copy()
  singular[3, 3] = 0.0
  with pytest.raises(ValueError, match="singular \\(not full rank\\): diagonal entry \\[3, 3\\]"):
    noise_lib.DenseNoise(singular)
  with pytest.raises(ValueError, match="rank below n"):
    noise_lib.DenseNoise(c[:4, :])
  nan = c.copy()
  nan[2, 1] = np.nan
  with pytest.raises(ValueError, match="non-finite"):
    noise_lib.DenseNoise(nan)
  with pytest.raises(ValueError, match="real numbers"):
    noise_lib.DenseNoise(c.astype(complex))
  f = _random_square_factorization()
  upper_a = f.a.copy()
  upper_a[1, 4] = 1.0
  bad_a = fz.Factorization(a=upper_a, b=f.b, c=f.c, strategy="x")
  with pytest.raises(ValueError, match="A is not lower triangular"):
    query_lib.MatrixFactorizationQuery.from_factorization(bad_a, **_kw())
  bad_b = fz.Factorization(a=f.a, b=f.b * 1.01, c=f.c, strategy="x")
  with pytest.raises(ValueError, match="B·C differs from A"):
    query_lib.MatrixFactorizationQuery.from_factorization(bad_b, **_kw())
  scaled = fz.Factorization(a=f.a, b=f.b / 2, c=f.c * 2, strategy="x")
  with pytest.raises(ValueError, match="not normalized"):
    query_lib.MatrixFactorizationQuery.from_factorization(scaled, **_kw())
  with pytest.raises(noise_lib.NoiseError, match="does not add C⁻¹·Z"):  # round 2 adds none
    tree_f = _factorization("honaker_online", n=4)
    nm = tree_f.noise_matrix()
    nm[2] = 0.0
    noise_lib.DenseNoise(tree_f.c, nm)
  with pytest.raises(ValueError, match="banded inverse"):
    structured.pieces_stream(*_random_structured(), _random_square_factorization(seed=1).b)


def test_query_rejects_mismatched_model_specs():
  q = query_lib.MatrixFactorizationQuery.from_factorization(_factorization("honaker_online"),
                                                            **_kw(noise_seed=1))
  with pytest.raises(ValueError, match="does not match the record specs"):
    q.initial_sample_state([tf.TensorSpec([3, 2], tf.float32)])
  with pytest.raises(ValueError, match="leaf #1 is float32\\(3,\\)"):
    q.initial_sample_state([tf.TensorSpec([3, 2], tf.float32), tf.TensorSpec([3], tf.float32)])
  with pytest.raises(ValueError, match="does not match the record specs"):
    q.preprocess_record(1.0, [tf.zeros([3, 2])])
  f = _factorization("honaker_online")
  pre = noise_lib.PrecomputedNoise(f.c, 3, SPECS, noise_matrix=f.noise_matrix())
  with pytest.raises(ValueError, match="seed the PrecomputedNoise rows were built for"):
    query_lib.MatrixFactorizationQuery(pre, **_kw(noise_seed=4))
  with pytest.raises(ValueError, match="rows have 8 entries, the record specs 3"):
    query_lib.MatrixFactorizationQuery(
        pre, **_kw(noise_seed=3, record_specs=[tf.TensorSpec([3], tf.float32)]))


def test_nan_update_is_an_error():
  q = query_lib.MatrixFactorizationQuery.from_factorization(_factorization("honaker_online"),
                                                            **_kw(noise_seed=1))
  with pytest.raises(tf.errors.InvalidArgumentError, match="leaf #0 contains NaN or Inf"):
    q.preprocess_record(1.0, [tf.fill([3, 2], np.nan), tf.zeros([2])])


# -- build_mechanism without processes ---------------------------------------------------------
def test_default_structure_matches_denisov_table2():
  assert [structured.default_structure(2**k) for k in range(8, 13)] == [
      (4, 4), (5, 4), (5, 5), (6, 5), (6, 6)]
  assert structured.default_structure(1) == structured.default_structure(2) == (1, 0)


@pytest.mark.parametrize("kwargs,match", [
    (dict(mechanism="dpsgd"), "unknown mechanism"),
    (dict(mechanism="tree_restart"), "cannot be trained"),
    (dict(total_rounds=0), "total_rounds must be a positive integer"),
    (dict(noise_multiplier=-1.0), "noise_multiplier must be positive"),
    (dict(clients_per_round=0), "clients_per_round must be positive"),
    (dict(clip_norm=0.0), "clip_norm must be positive"),
    (dict(momentum=1.0), "momentum must be in \\[0, 1\\)"),
    (dict(lr_schedule="cosine"), "unknown lr_schedule"),
    (dict(lr_schedule="decay"), "goes with lr_schedule"),
    (dict(schedule_rounds=2), "goes with lr_schedule"),
    (dict(lr_schedule="decay", schedule_rounds=99), "schedule_rounds must be in"),
    (dict(bands=2), "does not apply to mechanism"),
    (dict(mechanism="structured", bands=0), "bands must be a positive integer"),
    (dict(noise_seed=-3), "noise_seed must be in"),
    (dict(server_learning_rate=0.0), "server_learning_rate must be positive"),
])
def test_build_mechanism_rejects_bad_arguments(kwargs, match):
  args = dict(mechanism="honaker_online", total_rounds=8, noise_multiplier=1.0,
              clients_per_round=4, clip_norm=1.0)
  args.update(kwargs)
  wiring = {k: args.pop(k) for k in ("noise_seed", "server_learning_rate") if k in args}
  with pytest.raises(ValueError, match=match):
    aggregators.build_mechanism(spec_lib.MechanismSpec.from_args(
        args.pop("mechanism"), **args), **wiring)


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
  setup = aggregators.build_mechanism(spec_lib.MechanismSpec.from_args(
      "honaker_online", total_rounds=256, noise_multiplier=1.0, clients_per_round=10,
      clip_norm=1.0))
  assert setup.single_participation_sqrt_loss == pytest.approx(74.4, abs=0.05)
  assert setup.info["noise_implementation"].startswith("DenseNoise(n=256, m=511")
  tree_setup = aggregators.build_mechanism(spec_lib.MechanismSpec.from_args(
      "tree_aggregation", total_rounds=256, noise_multiplier=1.0, clients_per_round=10,
      clip_norm=1.0))
  assert tree_setup.factorization is None and tree_setup.info["mechanism"] == "tree"
  assert tree_setup.info["noise_multiplier_per_node"] == pytest.approx(3.0)  # √9 levels


def test_every_spelling_builds_its_registry_mechanism():
  for spelling in ("binary_tree", "dp_ftrl", "gaussian_fixed", "identity", "optimal",
                   "tree_aggregation"):
    setup = aggregators.build_mechanism(spec_lib.MechanismSpec.from_args(
        spelling, total_rounds=4, noise_multiplier=1.0, clients_per_round=2, clip_norm=1.0))
    assert setup.info["mechanism"] == registry.mechanism(spelling).name


def test_build_mechanism_takes_a_spec_only():
  """The spec is the one way in (issue 47 item 1): any spelling of a mechanism builds the same
  spec, a name with keywords is refused in one line naming the constructor, and so is a
  mechanism keyword beside the spec."""
  kwargs = dict(total_rounds=8, target_epsilon=4.0, delta=1e-6, clients_per_round=2,
                clip_norm=0.5, participation=participation.fixed_epoch(2), bands=3)
  spec = spec_lib.MechanismSpec.from_args("banded", **kwargs)
  assert spec_lib.MechanismSpec.from_args("band_mf", **kwargs) == spec
  by_spec = aggregators.build_mechanism(spec)
  assert by_spec.privacy.epsilon <= 4.0 and by_spec.info["bands"] == 3
  for call in (lambda: aggregators.build_mechanism("banded"),
               lambda: aggregators.resolve_mechanism("banded")):
    with pytest.raises(checks.CheckError, match="MechanismSpec.from_args") as e:
      call()
    assert "\n" not in str(e.value)
  with pytest.raises(TypeError, match="total_rounds"):
    aggregators.build_mechanism(spec, total_rounds=8)  # pylint: disable=unexpected-keyword-arg


def test_tree_aggregation_seed_comes_from_os_entropy():
  """Never TFF's clock-based default: two unpinned builds differ, and both words of the key
  TFF's generator takes are secret (issue 46 item 7); a pinned int is TFF's as it was."""
  seeds = [aggregators.tree_aggregation_params(8, 1.0, None).noise_seed for _ in range(4)]
  assert len({tuple(s) for s in seeds}) == 4 and len({s[1] for s in seeds}) == 4
  assert all(len(s) == 2 and all(0 <= w < 2**63 for w in s) for s in seeds)
  assert aggregators.tree_aggregation_params(8, 1.0, 5).noise_seed == 5
  assert aggregators.tree_aggregation_params(8, 1.0, (5, 6)).noise_seed == [5, 6]


def test_a_pinned_key_pair_is_the_state_seed_and_a_malformed_one_is_refused():
  """A harness's recorded key (two secret words) pins the query as it is; an int keeps the
  public tag (the seeds of every pinned run so far); a malformed key: one line."""
  from tff_mf.noise import keys  # pylint: disable=g-import-not-at-top
  stream = noise_lib.DenseNoise.from_factorization(_factorization("honaker_online"))
  kw = dict(l2_norm_clip=1.0, noise_multiplier=1.0, record_specs=SPECS)
  key = keys.noise_key(None)
  q = query_lib.MatrixFactorizationQuery(stream, noise_seed=key, **kw)
  np.testing.assert_array_equal(q.initial_global_state().seed, key)
  q = query_lib.MatrixFactorizationQuery(stream, noise_seed=9, **kw)
  np.testing.assert_array_equal(q.initial_global_state().seed, [9, keys.SEED_TAG])
  gauss = query_lib.SeededGaussianSumQuery(1.0, 1.0, noise_seed=key)
  np.testing.assert_array_equal(gauss.initial_global_state().seed, key)
  for bad in [(1, 2, 3), (1, -2), (1.5, 2)]:
    with pytest.raises(checks.CheckError) as e:
      query_lib.MatrixFactorizationQuery(stream, noise_seed=bad, **kw)
    assert "\n" not in str(e.value)
    with pytest.raises(checks.CheckError):
      aggregators.build_mechanism(spec_lib.MechanismSpec.from_args(
          "band_mf", total_rounds=8, clients_per_round=2, noise_multiplier=1.0, clip_norm=1.0,
          bands=2), noise_seed=bad)


@pytest.mark.slow
def test_structured_n2048_near_optimal_and_streams_its_noise_matrix():
  """Denisov App H Table 2, n = 2048: √L optimal 143.6, structured (6, 5) 145.8 — within 3%.

  Uses the tests' factorization cache (computes and stores the n = 2048 entries when
  missing), then streams all 2048 rounds at d = 8 and compares with N·Z.
  """
  n = 2048
  setup = aggregators.build_mechanism(spec_lib.MechanismSpec.from_args(
      "structured", total_rounds=n, noise_multiplier=1.0, clients_per_round=100,
      clip_norm=1.0), noise_seed=3)
  optimal = aggregators.build_mechanism(spec_lib.MechanismSpec.from_args(
      "opt_prefix_sum", total_rounds=n, noise_multiplier=1.0, clients_per_round=100,
      clip_norm=1.0))
  assert (setup.info["bands"], setup.info["rank"]) == (6, 5)
  assert optimal.single_participation_sqrt_loss == pytest.approx(143.6, abs=0.1)
  assert setup.single_participation_sqrt_loss <= 1.03 * optimal.single_participation_sqrt_loss
  assert setup.single_participation_sqrt_loss == pytest.approx(145.8, rel=0.01)
  q = query_lib.MatrixFactorizationQuery(setup.noise, l2_norm_clip=1.0, noise_multiplier=1.0,
                                         record_specs=SPECS, noise_seed=3)
  rows, _, _ = _run_rounds(q, n)
  expected = setup.noise.noise_matrix() @ noise_lib.standard_normal_matrix(
      noise_lib.seed_pair(3), n, SPECS)
  np.testing.assert_allclose(np.array(rows), expected, rtol=1e-5, atol=1e-5)


def test_seeded_gaussian_query_replays_its_noise_from_the_seed():
  """gaussian's query: same seed, same noise (a rerun replays it); another seed, other noise;
  the state after a round continues the stream; std σ = z·ζ and GaussianDpEvent(z)."""
  def rounds(seed, count=2, state=None):
    q = query_lib.SeededGaussianSumQuery(1.0, 0.7, seed)
    state = q.initial_global_state() if state is None else state
    out = []
    for _ in range(count):
      result, state, event = q.get_noised_result([tf.zeros([4000])], state)
      out.append(result[0].numpy())
    return out, state, event

  (a1, a2), state, event = rounds(11)
  (b1, b2), _, _ = rounds(11)
  (c1, _), _, _ = rounds(12)
  np.testing.assert_array_equal(a1, b1)
  np.testing.assert_array_equal(a2, b2)
  assert not np.allclose(a1, c1) and not np.allclose(a1, a2)
  assert abs(np.std(a1) - 0.7) < 0.05
  assert float(event.noise_multiplier) == pytest.approx(0.7)
  (cont,), _, _ = rounds(11, count=1, state=rounds(11, count=1)[1])
  np.testing.assert_array_equal(cont, a2)
  del state


def test_unpinned_seeded_gaussian_draws_a_new_seed_at_every_initialize():
  """Without a pinned seed two initial states of one query (two runs of one built process)
  never share noise: the seed comes from OS entropy when the state is computed."""
  q = query_lib.SeededGaussianSumQuery(1.0, 0.7)
  first, second = q.initial_global_state(), q.initial_global_state()
  assert not np.array_equal(first.seed.numpy(), second.seed.numpy())
  a, _, _ = q.get_noised_result([tf.zeros([1000])], first)
  b, _, _ = q.get_noised_result([tf.zeros([1000])], second)
  assert not np.allclose(a[0].numpy(), b[0].numpy())


def test_privacy_record_of_a_setup_prints_its_own_statement(tmp_path, capsys):
  """``privacy_statement(setup.privacy)`` and ``print(setup.privacy)`` describe the amplified
  ε of banded under min_sep(4) sampled at 0.25 (it read "no amplification ... single" beside
  the amplified ε, and print gave a 900-character repr), and name the setup."""
  from tff_mf import participation  # pylint: disable=g-import-not-at-top
  from tff_mf.accounting import statement  # pylint: disable=g-import-not-at-top
  setup = aggregators.build_mechanism(spec_lib.MechanismSpec.from_args(
      "banded", total_rounds=16, noise_multiplier=2.0, delta=1e-6, clients_per_round=4,
      clip_norm=1.0, participation=participation.min_sep(4),
      sampling_prob=0.25), cache_dir=str(tmp_path))
  record = setup.privacy
  assert record.bound == "amplified_banded"
  s = statement.privacy_statement(record)
  assert s == statement.privacy_statement(record.details, run=False,
                                          setup=record.setup)
  assert s["analysis"].startswith("amplification by Poisson sampling")
  assert "probability 0.25" in s["participation"] and "min_sep=4" in s["participation"]
  assert s["epsilon"] == statement.round_up(record.epsilon)
  print(record)
  assert capsys.readouterr().out == s["text"] + "\n"
  assert s["setup"].startswith("mechanism banded, n = 16 rounds")
  assert "4 clients per round, fixed clip norm 1" in s["setup"] and not s["void"]


def test_discrete_gaussian_query_round_trip(tmp_path):
  """banded C (b = 3) with the discrete Gaussian: γ·C·s is the integer release Y (s computed
  from Y alone), Y − round(γ·C·x) is N_ℤ(0, σ²) (second moment within 5 SE), a replayed
  round adds the same noise, another seed other noise, and the event is unsupported."""
  from tff_mf.noise import discrete_gaussian as dg  # pylint: disable=g-import-not-at-top
  n, d = 5, 4000
  specs = [tf.TensorSpec([d - 10], tf.float32), tf.TensorSpec([2, 5], tf.float32)]

  def query(seed):
    setup = aggregators.build_mechanism(spec_lib.MechanismSpec.from_args(
        "banded", total_rounds=n, clients_per_round=1, clip_norm=1.0, noise_multiplier=0.5,
        delta=1e-6, noise_distribution="discrete_gaussian",
        bands=3), noise_seed=seed, cache_dir=str(tmp_path))
    return setup, setup.aggregation_factory.dp_query(specs)._numerator

  setup, q = query(5)
  c = setup.noise.encoder()
  rng = np.random.default_rng(0)
  records = [[tf.constant(rng.normal(size=s.shape).astype(np.float32) * 0.01) for s in specs]
             for _ in range(n)]
  state, xs, outs = q.initial_global_state(), [], []
  for t in range(n):
    params = q.derive_sample_params(state)
    sample = q.accumulate_record(params, q.initial_sample_state(specs), records[t])
    values, count = sample  # float64 records and their count (test below)
    assert count.numpy() == 1.0
    xs.append(np.concatenate([np.ravel(v.numpy()) for v in values]))
    before = state
    result, state, event = q.get_noised_result(sample, state)
    outs.append(np.concatenate([np.ravel(v.numpy()) for v in result]).astype(np.float64))
    if t == 1:  # replay: the same round from the same state
      again, _, _ = q.get_noised_result(sample, before)
      np.testing.assert_array_equal(np.concatenate([np.ravel(v.numpy()) for v in again]),
                                    outs[-1])
  assert isinstance(event, dp_accounting.UnsupportedDpEvent)
  plan = q.plan
  assert plan.model_size == d and plan.inflation <= dg.ROUNDING_INFLATION
  # The outputs are float32 (relative error 2⁻²⁴ each, b = 3 terms of C·s): γ·C·s is Y
  # within that error, which stays below 1/2, so rounding recovers Y exactly.
  y = plan.granularity * (c @ np.array(outs))
  error = plan.granularity * np.max(np.abs(c) @ np.abs(np.array(outs))) * 2.0**-22
  assert error < 0.5
  y_int = np.rint(y)
  assert np.max(np.abs(y - y_int)) <= error
  noise = y_int - np.rint(plan.granularity * (c @ np.array(xs)))
  ratio = np.mean(noise**2) / dg.variance(plan.sigma)
  assert abs(ratio - 1) < 5 * math.sqrt(2 / noise.size)
  _, other = query(6)
  params = other.derive_sample_params(other.initial_global_state())
  sample = other.accumulate_record(params, other.initial_sample_state(specs), records[0])
  first, _, _ = other.get_noised_result(sample, other.initial_global_state())
  assert not np.allclose(np.concatenate([np.ravel(v.numpy()) for v in first]), outs[0])


def test_discrete_gaussian_query_clips_and_sums_records_in_float64(tmp_path):
  """The discrete Gaussian's records are clipped to ζ (not its float32 rounding) in float64
  and summed in float64 with their count: each clipped record's exact norm is at most
  ζ·(1 + κ_c) (``clip_allowance`` with K = 1), a record inside the ball is kept up to a few
  float64 roundings, the released s is float32 again, and a round that sums more records
  than the plan's K (``records_covered``: 2 × clients_per_round, at least 2¹⁶) is refused."""
  import fractions  # pylint: disable=g-import-not-at-top
  from tff_mf.noise import discrete_gaussian as dg  # pylint: disable=g-import-not-at-top
  zeta, clients = 0.3, 3  # 0.3 is not a float32: its float32 rounding is above it
  specs = [tf.TensorSpec([300], tf.float32), tf.TensorSpec([4, 5], tf.float32)]
  setup = aggregators.build_mechanism(spec_lib.MechanismSpec.from_args(
      "gaussian", total_rounds=2, clients_per_round=clients, clip_norm=zeta, noise_multiplier=1.0,
      delta=1e-6, noise_distribution="discrete_gaussian"), noise_seed=3, cache_dir=str(tmp_path))
  q = setup.aggregation_factory.dp_query(specs)._numerator
  d = 320
  k = dg.records_covered(clients)
  assert k == dg.RECORDS_FLOOR and dg.records_covered(10**5) == 2 * 10**5
  assert q.plan.records == k and q.plan.clip_allowance == dg.clip_allowance(d, k)
  zeros, count = q.initial_sample_state(specs)
  assert [v.dtype for v in zeros] == [tf.float64] * 2 and count.dtype == tf.float64
  assert count.numpy() == 0.0 and not any(np.any(v.numpy()) for v in zeros)
  state = q.initial_global_state()
  params = q.derive_sample_params(state)
  assert params.dtype == tf.float64 and params.numpy() == zeta
  assert float(np.float32(zeta)) > zeta
  bound = (fractions.Fraction(zeta) * (1 + fractions.Fraction(dg.clip_allowance(d, 1))))**2
  rng = np.random.default_rng(11)
  records = []
  for scale in (1e-3, 0.5, 0.999999, 1.0, 1.000001, 3.0, 1e6):
    for _ in range(3):
      flat = rng.normal(size=d)
      flat = (flat * scale * zeta / np.linalg.norm(flat)).astype(np.float32)
      records.append([tf.constant(flat[:300]), tf.constant(flat[300:].reshape(4, 5))])
      clipped, one = q.preprocess_record(params, records[-1])
      assert [v.dtype for v in clipped] == [tf.float64] * 2 and one.numpy() == 1.0
      out = np.concatenate([np.ravel(v.numpy()) for v in clipped])
      square = sum(fractions.Fraction(float(v))**2 for v in out)
      assert square <= bound
      exact = math.sqrt(float(sum(fractions.Fraction(float(v))**2 for v in flat)))
      if exact < zeta * (1 - 1e-12):  # inside the ball: kept (up to 4 roundings a coordinate)
        assert np.all(np.abs(out - flat) <= 4 * 2.0**-53 * np.abs(flat))
      elif exact > zeta * (1 + 1e-12):  # onto the sphere, up to the same allowance below it
        assert float(square) >= (zeta * (1 - dg.clip_allowance(d, 1)))**2
  sample = q.initial_sample_state(specs)
  for record in records:
    sample = q.accumulate_record(params, sample, record)
  assert sample[1].numpy() == len(records)
  result, _, _ = q.get_noised_result(sample, state)
  assert [v.dtype for v in result] == [tf.float32] * 2
  assert [v.shape for v in result] == [s.shape for s in specs]
  values = sample[0]
  q.get_noised_result((values, tf.constant(float(k), tf.float64)), state)  # K: covered
  with pytest.raises(tf.errors.InvalidArgumentError, match=f"more than the {k} records"):
    q.get_noised_result((values, tf.constant(k + 1.0, tf.float64)), state)


def test_discrete_gaussian_tf_sampler_matches_the_pmf():
  """The TF sampler (stateless, from the seed) against N_ℤ(0, σ²) by χ² (false alarm 1e-4),
  deterministic given (seed, round)."""
  from tff_mf.noise import discrete_gaussian as dg  # pylint: disable=g-import-not-at-top
  sigma, size = 2.5, 200_000
  seed = tf.constant([3, 4], tf.int64)
  draws = noise_lib.discrete_gaussian_row(seed, tf.constant(0), size, sigma).numpy()
  assert draws.dtype == np.int64
  np.testing.assert_array_equal(
      draws, noise_lib.discrete_gaussian_row(seed, tf.constant(0), size, sigma).numpy())
  top = 11
  support = np.arange(-top, top + 1)
  expected = dg.pmf(sigma, support) * size
  observed = np.array([np.sum(draws == x) for x in support], dtype=np.float64)
  tails = np.sum(np.abs(draws) > top)
  assert tails <= 5
  p = scipy.stats.chisquare(observed, expected * observed.sum() / expected.sum()).pvalue
  assert p > 1e-4
  wider = dg.pmf(sigma * 1.05, support) * size
  assert scipy.stats.chisquare(observed, wider * observed.sum() / wider.sum()).pvalue < 1e-4
