"""The Flower layer's numpy noise against the TF aggregator's, for the same seed and mechanism.

Z: the integer stream (Philox key, counter, fold-ins) is reproduced exactly; the normals go
through float32 log, sin and cos, which TensorFlow takes from the C library (within one
float32 ulp of the true value) and the numpy layer rounds from float64 (within half an ulp).
So each of log and sin/cos may differ by one ulp; the radius √(−2·log u) then by at most one
ulp and the product r·sin v by at most three. Measured here: at most 3 ulps, about 1.4% of
the values not bit-identical. The noise rows: both layers run the same N on their own Z,
TensorFlow in float32; they agree within that float32 arithmetic's error.
"""

import numpy as np
import pytest
import tensorflow as tf

from tff_mf import mechanisms
from tff_mf import participation
from tff_mf import spec as spec_lib
from tff_mf.noise import rows as flower_noise
from tff_mf.noise import philox
from tff_mf.noise import keys
from tff_mf.tf import noise as tf_noise

SHAPES = [(20000,), (10, 48), (5,)]
MAX_ULPS = 3


def _ulps(a, b):
  a = np.asarray(a, np.float32).view(np.int32).astype(np.int64)
  b = np.asarray(b, np.float32).view(np.int32).astype(np.int64)
  return np.abs(a - b)


def test_seed_pairs_agree():
  assert np.array_equal(flower_noise.seed_pair(1234), tf_noise.seed_pair(1234))
  assert list(flower_noise.seed_pair(1234)) == [1234, keys.SEED_TAG]
  key = keys.noise_key(None)
  assert np.array_equal(flower_noise.seed_pair(key), tf_noise.seed_pair(key))


def test_an_unpinned_flower_key_has_two_secret_words():
  """Issue 46 item 7: no public tag in an unpinned Flower run's key; fresh at every draw."""
  a, b = flower_noise.seed_pair(None), flower_noise.seed_pair(None)
  assert a.dtype == np.int64 and a.shape == (2,)
  assert a[1] != keys.SEED_TAG and b[1] != keys.SEED_TAG and a[0] != b[0] and a[1] != b[1]


@pytest.mark.parametrize("seed", [0, 2**62 + 12345])
def test_z_rows_equal_tf_within_three_ulps(seed):
  pair = tf_noise.seed_pair(seed)
  specs = [tf.TensorSpec(s, tf.float32) for s in SHAPES]
  worst = 0
  for row in (0, 1, 37):
    want = tf_noise.standard_normal_row(tf.constant(pair), row, specs)
    got = philox.standard_normal_row(pair, row, SHAPES)
    for w, g in zip(want, got):
      assert g.shape == tuple(w.shape) and g.dtype == np.float32
      worst = max(worst, int(np.max(_ulps(w.numpy(), g))))
  assert worst <= MAX_ULPS


@pytest.mark.parametrize("name", ["blt", "opt_prefix_sum"])
def test_noise_rows_equal_the_tf_aggregators(name):
  n, z, clip = 8, 1.5, 0.5
  spec = spec_lib.MechanismSpec.from_args(
      name, total_rounds=n, clients_per_round=2, clip_norm=clip, noise_multiplier=z,
      participation=participation.fixed_epoch(2))
  resolved, _ = mechanisms.build(spec)
  f = resolved.factorization
  pair = tf_noise.seed_pair(99)
  shapes = [(3000,), (4, 5)]
  specs = [tf.TensorSpec(s, tf.float32) for s in shapes]
  if resolved.stream is not None:
    tf_stream = tf_noise.LinearNoise(resolved.stream, f.c, spec.participation)
  else:
    tf_stream = tf_noise.DenseNoise(f.c, None, spec.participation)
  flower = flower_noise.NoiseRows(resolved, shapes, pair)
  state = tf_stream.initial_state(specs)
  n_abs = np.abs(f.noise_matrix())
  z_abs = np.abs(np.stack([np.concatenate([p.ravel() for p in philox.standard_normal_row(
      pair, j, shapes)]) for j in range(n)]))
  for i in range(n):
    rows, state = tf_stream.noise_row(tf.constant(pair), tf.constant(i), state, specs, z * clip)
    want = np.concatenate([r.numpy().ravel() for r in rows]).astype(np.float64)
    got = np.concatenate([r.ravel() for r in flower.next(z * clip)])
    # Z within 3 ulps each (relative 3·2⁻²³), and float32 sums and products in TF's
    # recurrence (at most 2n roundings of 2⁻²⁴ on terms no larger than the row's |N|·|Z|,
    # which holds for these mechanisms' streams).
    scale = z * clip * n_abs[i] @ z_abs
    assert np.all(np.abs(got - want) <= (3 * 2.0**-23 + 2 * n * 2.0**-24) * scale)


def test_count_noise_is_the_tf_querys_draw():
  """Adaptive clipping's count noise: TF's float64 stateless normal, bit for bit (float64
  Box–Muller through the C library's log and sin, which Python's math calls too)."""
  from tff_mf.tf import query  # pylint: disable=g-import-not-at-top
  pair = tf_noise.seed_pair(77)
  assert flower_noise.COUNT_NOISE_TAG == query._COUNT_NOISE_TAG  # pylint: disable=protected-access
  for i in range(6):
    seed = tf.random.experimental.stateless_fold_in(
        tf.random.experimental.stateless_fold_in(
            tf.constant(pair), tf.constant(flower_noise.COUNT_NOISE_TAG, tf.int64),
            alg=tf_noise.PHILOX), tf.constant(i, tf.int64), alg=tf_noise.PHILOX)
    want = tf.random.stateless_normal([], seed=seed, dtype=tf.float64, alg=tf_noise.PHILOX)
    assert flower_noise.count_noise(pair, i) == float(want.numpy())


def _tf_noise_for(resolved, participation_schema):
  f = resolved.factorization
  if resolved.stream is not None:
    return tf_noise.LinearNoise(resolved.stream, f.c, participation_schema)
  return tf_noise.DenseNoise(f.c, f.noise_matrix() if f.m != f.n else None, participation_schema)


def test_exact_z_rows_are_tfs_bit_for_bit():
  """``exact=True``: the C library's logf and sincosf, as TensorFlow's Box–Muller calls them."""
  pair = tf_noise.seed_pair(2**62 + 12345)
  specs = [tf.TensorSpec(s, tf.float32) for s in SHAPES]
  for row in (0, 1, 37):
    want = tf_noise.standard_normal_row(tf.constant(pair), row, specs)
    got = philox.standard_normal_row(pair, row, SHAPES, exact=True)
    for w, g in zip(want, got):
      assert g.dtype == np.float32 and np.array_equal(w.numpy(), g)


@pytest.mark.parametrize("name,schema", [
    ("blt", participation.fixed_epoch(2)), ("opt_prefix_sum", participation.fixed_epoch(2)),
    ("banded", participation.min_sep(2)), ("bisr", participation.SINGLE),
    ("honaker_online", participation.SINGLE), ("gaussian", participation.SINGLE)])
def test_exact_noise_rows_are_the_tf_aggregators_bit_for_bit(name, schema):
  """With ``exact=True`` the Flower layer's rows are the TF query's, every bit, for the same
  seed and factorization: 20,020 coordinates a round, every round of the run."""
  n, z, clip = 8, 1.5, 0.5
  spec = spec_lib.MechanismSpec.from_args(
      name, total_rounds=n, clients_per_round=2, clip_norm=clip, noise_multiplier=z,
      participation=schema)
  _assert_exact_rows_are_the_tf_kernels(spec, [(20000,), (4, 5)], 99, z * clip)


def _assert_exact_rows_are_the_tf_kernels(spec, shapes, seed, stddev):
  """Every round of ``spec``'s run: the exact numpy rows equal the TF kernel's, every bit."""
  resolved, _ = mechanisms.build(spec)
  pair = tf_noise.seed_pair(seed)
  specs = [tf.TensorSpec(s, tf.float32) for s in shapes]
  tf_stream = _tf_noise_for(resolved, spec.participation)
  flower = flower_noise.NoiseRows(resolved, shapes, pair, exact=True)
  state = tf_stream.initial_state(specs)
  for i in range(spec.n):
    rows, state = tf_stream.noise_row(tf.constant(pair), tf.constant(i), state, specs, stddev)
    for w, g in zip(rows, flower.next(stddev)):
      assert g.dtype == np.float32 and g.shape == tuple(w.shape)
      assert np.array_equal(w.numpy(), g), (spec.mechanism.name, i,
                                            int(np.sum(w.numpy() != g)))


@pytest.mark.parametrize("bands", [10, 16])
def test_exact_rows_are_the_tf_aggregators_past_eight_terms(bands):
  """A banded row of more than 8 terms: TensorFlow's AddN sums them in blocks of 8, and the
  exact numpy rows do the same, every bit, every round."""
  n = 20
  spec = spec_lib.MechanismSpec.from_args(
      "banded", total_rounds=n, clients_per_round=2, clip_norm=0.5, noise_multiplier=1.5,
      params={"bands": bands})
  _assert_exact_rows_are_the_tf_kernels(spec, [(3000,), (4, 5)], 7, 0.75)


def test_exact_mode_survives_a_restart_and_refuses_a_mixed_one():
  spec = spec_lib.MechanismSpec.from_args("blt", total_rounds=4, clients_per_round=2,
                                          clip_norm=1.0, noise_multiplier=1.0)
  resolved, _ = mechanisms.build(spec)
  pair = tf_noise.seed_pair(5)
  a = flower_noise.NoiseRows(resolved, [(300,)], pair, exact=True)
  a.next(1.0)
  b = flower_noise.NoiseRows(resolved, [(300,)], pair, exact=True)
  b.restore(a.state())
  assert np.array_equal(a.next(1.0)[0], b.next(1.0)[0])
  c = flower_noise.NoiseRows(resolved, [(300,)], pair)
  with pytest.raises(Exception, match="exact=True"):
    c.restore(a.state())
