"""Aggregation wrapper that zeroes non-finite client updates before clipping.

A client whose local training diverged (NaN/Inf anywhere in its model delta)
must not poison the round: its update is replaced by zeros *before* the inner
(clipping + noising) aggregator sees it, so the DP guarantee is untouched — a
zero update has norm 0 ≤ ζ (Denisov et al. Sec 5, per-user clipping to ζ).

Each round reports ``zeroed_client_updates``: clients whose update arrived
non-finite, or arrived as exactly zero. TFF's FedAvg client work
(``model_delta_client_work``) already replaces a non-finite delta by zeros
before aggregation, so at this point a diverged client shows up as an all-zero
update; empty clients are removed earlier by the sampler
(``training.sampling``), so an all-zero update here means a client whose
training was non-finite (with a zero client learning rate every update is
zero, and every client is counted).
"""

from __future__ import annotations

import collections

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

ZEROED_METRIC = "zeroed_client_updates"


def zero_if_non_finite(value):
  """Returns (value or zeros when any entry is NaN/Inf, flag int32: 1 if zeroed or all-zero)."""
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
  return all(np.all(np.isfinite(np.asarray(a))) for a in tf.nest.flatten(arrays))
