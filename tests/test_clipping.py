"""The core's clipping rule (``tff_mf.clipping``), and its TF twin on the same inputs."""

import numpy as np
import pytest

from tff_mf import checks
from tff_mf import clipping


def test_a_non_finite_update_is_zeroed_and_counted():
  for bad in (np.nan, np.inf, -np.inf):
    out = clipping.clip_update([np.array([bad, 1000.0, 0.0]), np.ones(2)], 1.0)
    assert out.zeroed and out.unclipped and out.norm == 0.0
    assert all(np.array_equal(v, np.zeros_like(v)) for v in out.values)


def test_a_finite_update_whose_squares_overflow_is_clipped_to_the_norm():
  big = np.full(5, 1e200)  # float64 squares overflow
  out = clipping.clip_update([big, np.array([-1e200])], 2.0)
  assert not out.zeroed and not out.unclipped
  norm = np.sqrt(sum(float(np.sum(v * v)) for v in out.values))
  assert norm == pytest.approx(2.0, rel=1e-12)
  assert out.norm == pytest.approx(1e200 * np.sqrt(6), rel=1e-12)
  assert np.isfinite(clipping.global_norm([big]))


def test_the_plain_path_is_unchanged_below_the_overflow():
  rng = np.random.default_rng(0)
  u = [rng.normal(size=7) * 10, rng.normal(size=(2, 3))]
  out = clipping.clip_update(u, 1.5)
  norm = float(np.sqrt(sum(float(np.sum(a * a)) for a in u)))
  assert out.norm == norm
  for v, a in zip(out.values, u):
    assert np.array_equal(v, min(1.0, 1.5 / norm) * a)
  small = [np.array([0.1, 0.2])]
  out = clipping.clip_update(small, 1.0)
  assert out.unclipped and np.array_equal(out.values[0], small[0])


def test_a_bad_clip_norm_is_refused():
  with pytest.raises(checks.CheckError, match="clip_norm"):
    clipping.clip_update([np.ones(2)], 0.0)


@pytest.mark.parametrize("scale", [1.0, 1e10, 1e19, 1e30, 3e38])
def test_the_tf_twin_clips_every_finite_float32_update_to_the_norm(scale):
  import tensorflow as tf
  from tff_mf.tf import clipping as tf_clipping
  flat = [tf.constant(np.full(4, scale, np.float32)), tf.constant(np.full((2, 2), -scale,
                                                                          np.float32))]
  clipped, norm = tf_clipping.clip_by_global_norm(flat, tf.constant(1.0))
  values = np.concatenate([np.asarray(c, np.float64).ravel() for c in clipped])
  assert np.all(np.isfinite(values))
  assert np.linalg.norm(values) == pytest.approx(1.0, rel=1e-6)
  assert bool(norm > 1.0)
  if scale <= 1e10:  # where the float32 norm is finite: TensorFlow's own clipping, bit for bit
    plain, _ = tf.clip_by_global_norm(flat, 1.0)
    for a, b in zip(clipped, plain):
      assert np.array_equal(np.asarray(a), np.asarray(b))


def test_the_tf_twin_in_a_graph_is_tensorflows_clipping_bit_for_bit():
  import tensorflow as tf
  from tff_mf.tf import clipping as tf_clipping
  rng = np.random.default_rng(1)
  flat = [tf.constant(rng.normal(size=s).astype(np.float32) * 3) for s in [(40, 7), (7,), (3,)]]
  ours = tf.function(lambda xs, c: tf_clipping.clip_by_global_norm(xs, c))
  theirs = tf.function(lambda xs, c: tf.clip_by_global_norm(xs, c))
  for clip in (0.5, 1.0, 1e3):
    (a, na), (b, nb) = ours(flat, tf.constant(clip)), theirs(flat, tf.constant(clip))
    assert np.array_equal(np.asarray(na), np.asarray(nb))
    for x, y in zip(a, b):
      assert np.array_equal(np.asarray(x), np.asarray(y))
