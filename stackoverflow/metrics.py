"""Next-word-prediction metrics and loss (Denisov et al. 2022, arXiv:2202.08312, Sec 5, App I).

The papers' headline number is accuracy without OOV and EOS targets
(Denisov et al. App I, "Test accuracy details"). Pad targets are
always excluded: they are not words. BOS never occurs as a target.

  accuracy                 -- over all non-pad targets,
  accuracy_no_oov          -- over targets that are neither pad nor OOV,
  accuracy_no_oov_no_eos   -- over targets that are neither pad, OOV nor EOS,
  num_tokens               -- count of non-pad targets,
  loss                     -- mean cross-entropy over non-pad targets.
"""

from typing import Sequence

import tensorflow as tf

from stackoverflow import preprocessing

ACCURACY_METRIC_NAMES = ("accuracy", "accuracy_no_oov",
                         "accuracy_no_oov_no_eos")


def _token_runs(tokens: Sequence[int]):
  """The sorted distinct ``tokens`` as runs of consecutive ids [(first, last), ...]."""
  runs = []
  for token in sorted(set(int(t) for t in tokens)):
    if runs and token == runs[-1][1] + 1:
      runs[-1] = (runs[-1][0], token)
    else:
      runs.append((token, token))
  return runs


def kept_targets(y_true, masked_tokens: Sequence[int]):
  """Boolean mask of the targets not in ``masked_tokens`` (int64 ``y_true``).

  One comparison per run of consecutive ids (the OOV buckets are one run), not one per
  token: the same mask in a few ops per batch instead of two per masked token.
  """
  kept = tf.ones_like(y_true, dtype=tf.bool)
  for first, last in _token_runs(masked_tokens):
    if first == last:
      kept = tf.logical_and(kept, tf.not_equal(y_true, first))
    else:
      inside = tf.logical_and(tf.greater_equal(y_true, first), tf.less_equal(y_true, last))
      kept = tf.logical_and(kept, tf.logical_not(inside))
  return kept


class MaskedCategoricalAccuracy(tf.keras.metrics.Metric):
  """Accuracy of argmax predictions over targets not in `masked_tokens`.

  Inputs: y_true int [batch, time], y_pred logits or probabilities
  [batch, time, classes]. State: (correct, total) counts, so TFF sums it
  correctly across clients.
  """

  def __init__(self, name: str, masked_tokens: Sequence[int], dtype=tf.float32):
    super().__init__(name=name, dtype=dtype)
    self.masked_tokens = tuple(int(t) for t in masked_tokens)
    self.correct = self.add_weight("correct", initializer="zeros",
                                   dtype=tf.float32)
    self.total = self.add_weight("total", initializer="zeros",
                                 dtype=tf.float32)

  def update_state(self, y_true, y_pred, sample_weight=None):
    y_true = tf.cast(y_true, tf.int64)
    predicted = tf.argmax(y_pred, axis=-1, output_type=tf.int64)
    weight = tf.cast(kept_targets(y_true, self.masked_tokens), tf.float32)
    if sample_weight is not None:
      weight *= tf.cast(sample_weight, tf.float32)
    matches = tf.cast(tf.equal(y_true, predicted), tf.float32)
    self.correct.assign_add(tf.reduce_sum(matches * weight))
    self.total.assign_add(tf.reduce_sum(weight))

  def result(self):
    return tf.math.divide_no_nan(self.correct, self.total)

  def reset_state(self):
    self.correct.assign(0.0)
    self.total.assign(0.0)

  def get_config(self):
    config = super().get_config()
    config["masked_tokens"] = list(self.masked_tokens)
    return config


class NumTokens(tf.keras.metrics.Sum):
  """Number of targets not in `masked_tokens` (pad by default)."""

  def __init__(self, name: str = "num_tokens", masked_tokens=(0,),
               dtype=tf.float32):
    super().__init__(name=name, dtype=dtype)
    self.masked_tokens = tuple(int(t) for t in masked_tokens)

  def update_state(self, y_true, y_pred, sample_weight=None):
    del y_pred, sample_weight
    y_true = tf.cast(y_true, tf.int64)
    return super().update_state(tf.cast(kept_targets(y_true, self.masked_tokens), tf.float32))

  def get_config(self):
    config = super().get_config()
    config["masked_tokens"] = list(self.masked_tokens)
    return config


def build_metrics(vocab_size: int,
                  num_oov_buckets: int = preprocessing.DEFAULT_NUM_OOV_BUCKETS
                 ) -> list:
  """Fresh metric objects: num_tokens and the three accuracies."""
  special = preprocessing.special_token_ids(vocab_size, num_oov_buckets)
  pad, oov, eos = special.pad, list(special.oov), special.eos
  return [
      NumTokens("num_tokens", masked_tokens=[pad]),
      MaskedCategoricalAccuracy("accuracy", masked_tokens=[pad]),
      MaskedCategoricalAccuracy("accuracy_no_oov", masked_tokens=[pad] + oov),
      MaskedCategoricalAccuracy("accuracy_no_oov_no_eos",
                                masked_tokens=[pad, eos] + oov),
  ]


class MaskedSparseCategoricalCrossentropy(tf.keras.losses.Loss):
  """Mean cross-entropy from logits over targets that are not pad.

  The mean is over the non-pad targets of the batch (0 for an all-pad batch),
  so padding never dilutes or biases the loss.
  """

  def __init__(self, pad_token: int = 0,
               name: str = "masked_sparse_categorical_crossentropy"):
    super().__init__(name=name, reduction=tf.keras.losses.Reduction.NONE)
    self.pad_token = int(pad_token)
    self._last_call = None  # (y_true, y_pred, sample_weight, graph, loss) of the last call

  def call(self, y_true, y_pred):
    return tf.keras.losses.sparse_categorical_crossentropy(
        y_true, y_pred, from_logits=True)

  def __call__(self, y_true, y_pred, sample_weight=None):
    # TFF's Keras model calls its loss twice on the same tensors (the batch loss, then its
    # "loss" metric, tff.learning.models.from_keras_model): the second call, in the same
    # graph, returns the first's result, the same value, and the softmax over the
    # vocabulary runs once.
    graph = tf.compat.v1.get_default_graph()
    last = self._last_call
    if (last is not None and last[0] is y_true and last[1] is y_pred
        and last[2] is sample_weight and last[3] is graph):
      return last[4]
    loss = self._loss(y_true, y_pred, sample_weight)
    self._last_call = (y_true, y_pred, sample_weight, graph, loss)
    return loss

  def _loss(self, y_true, y_pred, sample_weight):
    y_true = tf.cast(y_true, tf.int64)
    per_token = tf.keras.losses.sparse_categorical_crossentropy(
        y_true, tf.cast(y_pred, tf.float32), from_logits=True)
    weight = tf.cast(tf.not_equal(y_true, self.pad_token), tf.float32)
    if sample_weight is not None:
      weight *= tf.cast(sample_weight, tf.float32)
    return tf.math.divide_no_nan(tf.reduce_sum(per_token * weight),
                                 tf.reduce_sum(weight))

  def get_config(self):
    config = super().get_config()
    config["pad_token"] = self.pad_token
    return config
