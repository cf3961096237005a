"""The clipping rule of ``tff_mf.clipping`` in TensorFlow ops (its constants and messages).

``zero_if_non_finite`` zeroes an update with any NaN/Inf entry and flags it, and
``NonFiniteZeroingFactory`` applies it to every client value of a TFF aggregator (TFF's
own client work zeroes a non-finite model delta too; the factory covers any other client
work and counts the zeroed updates under ``ZEROED_METRIC``);
``clip_by_global_norm`` clips to ζ with a norm that cannot overflow: where the plain
float32 global norm is finite it is ``tf.clip_by_global_norm`` itself (the same ops, so
every result is unchanged), and where it overflows (‖u‖ above about 2.6e19 in float32,
for which ``tf.clip_by_global_norm`` returns NaN and rejects the round) it scales by
m = max|u| first: the clipped update is (ζ/‖u/m‖)·(u/m), of norm ζ.
"""

from __future__ import annotations

import collections
from typing import List, Tuple

import tensorflow as tf
import tensorflow_federated as tff

from tff_mf import clipping

ZEROED_METRIC = clipping.ZEROED_METRIC


def zero_if_non_finite(value):
  """(value, or zeros when any entry is NaN/Inf; int32 flag: 1 if zeroed or all zero)."""
  flat = tf.nest.flatten(value)
  finite = tf.reduce_all(tf.stack([tf.reduce_all(tf.math.is_finite(t)) for t in flat]))
  all_zero = tf.reduce_all(tf.stack([tf.reduce_all(tf.equal(t, 0)) for t in flat]))
  zeroed = tf.nest.map_structure(lambda t: tf.where(finite, t, tf.zeros_like(t)), value)
  flag = tf.cast(tf.logical_or(tf.logical_not(finite), all_zero), tf.int32)
  return zeroed, flag


class NonFiniteZeroingFactory(tff.aggregators.UnweightedAggregationFactory):
  """Wraps an unweighted factory: zeroes non-finite client values, counts them.

  Measurements: ``{"inner": <inner measurements>, "zeroed_client_updates": int32}``.
  """

  def __init__(self, inner_factory: tff.aggregators.UnweightedAggregationFactory):
    if not isinstance(inner_factory, tff.aggregators.UnweightedAggregationFactory):
      raise TypeError(
          "NonFiniteZeroingFactory wraps an UnweightedAggregationFactory (for "
          f"build_unweighted_fed_avg), got {type(inner_factory).__name__}")
    self._inner = inner_factory

  @property
  def inner(self) -> tff.aggregators.UnweightedAggregationFactory:
    """The wrapped factory (what aggregates the zeroed values)."""
    return self._inner

  def create(self, value_type) -> tff.templates.AggregationProcess:
    inner_process = self._inner.create(value_type)

    @tff.federated_computation()
    def init_fn():
      return inner_process.initialize()

    @tff.tensorflow.computation(value_type)
    def zero_fn(value):
      return zero_if_non_finite(value)

    @tff.federated_computation(init_fn.type_signature.result,
                               tff.FederatedType(value_type, tff.CLIENTS))
    def next_fn(state, value):
      zeroed_and_flag = tff.federated_map(zero_fn, value)
      output = inner_process.next(state, zeroed_and_flag[0])
      count = tff.federated_sum(zeroed_and_flag[1])
      measurements = tff.federated_zip(collections.OrderedDict(
          inner=output.measurements, **{ZEROED_METRIC: count}))
      return tff.templates.MeasuredProcessOutput(
          state=output.state, result=output.result, measurements=measurements)

    return tff.templates.AggregationProcess(init_fn, next_fn)


def all_finite(arrays) -> bool:
  """True when every array in the (nested) structure is finite."""
  return clipping.all_finite(tf.nest.flatten(arrays))


def assert_finite(flat: List[tf.Tensor], prefix: str) -> List[tf.Operation]:
  """Assertions that every leaf is finite, in the rule's words (``prefix`` names the caller)."""
  return [tf.debugging.assert_all_finite(
      x, message=prefix + clipping.NON_FINITE_MESSAGE.format(leaf=k))
          for k, x in enumerate(flat)]


def clip_by_global_norm(flat: List[tf.Tensor], clip_norm) -> Tuple[List[tf.Tensor], tf.Tensor]:
  """(leaves clipped to global ℓ2 norm ``clip_norm``, the norm before clipping) of finite
  leaves of one float dtype; the norm is inf only where the true norm is past the dtype."""
  flat = list(flat)
  norm = tf.linalg.global_norm(flat)

  def plain():
    clipped, _ = tf.clip_by_global_norm(flat, clip_norm, use_norm=norm)
    return clipped, norm

  def wide():
    m = tf.reduce_max(tf.stack([tf.reduce_max(tf.abs(x)) for x in flat]))
    scaled = [x / m for x in flat]
    inner = tf.linalg.global_norm(scaled)  # in [1, √d]
    return [x * (clip_norm / inner) for x in scaled], m * inner

  return tf.cond(tf.math.is_finite(norm), plain, wide)
