"""The learning task of a run: federated data, preprocessing, model, and central evaluation.

Next-word prediction on StackOverflow-style text with the LSTM of Denisov et al.
2022 (arXiv:2202.08312, App I), built from ``stackoverflow/``.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Dict, List

from training.config import TrainingConfig

METRIC_KEYS = ("loss", "accuracy", "accuracy_no_oov", "accuracy_no_oov_no_eos")


@dataclasses.dataclass
class Task:
  """Data and model of one run."""
  train: object  # tff.simulation.datasets.ClientData of raw examples
  train_client_ids: List[str]
  validation: object  # tf.data.Dataset of (x, y) batches
  test: object
  preprocess_fn: Callable
  vocab: List[str]
  model_fn: Callable
  keras_model_fn: Callable
  dataset: Dict[str, object]  # name, fingerprint and facts, for the summary


def _dataset_record(federated) -> Dict[str, object]:
  info = federated.info
  record = {"name": federated.name, "fingerprint": federated.fingerprint,
            "num_train_clients": info.get("num_train_clients"),
            "vocab_size": info.get("vocab_size")}
  for key in ("content_sha256", "word_count_sha256", "sqlite_bytes"):
    if key in info:
      record[key] = info[key]
  if "fingerprint" in info:  # pydocs: the build fingerprint and what it hashes
    record["build_fingerprint"] = info["fingerprint"]
    record["source"] = info.get("source")
  return record


def build_task(config: TrainingConfig) -> Task:
  """Loads the federated data and builds the preprocessing and model (stackoverflow/)."""
  from stackoverflow import data as so_data  # pylint: disable=g-import-not-at-top
  from stackoverflow import model as so_model  # pylint: disable=g-import-not-at-top
  from stackoverflow import preprocessing  # pylint: disable=g-import-not-at-top
  federated = so_data.load_federated_data(
      config.dataset, data_dir=config.data_dir, vocab_size=config.vocab_size,
      num_validation_examples=config.max_validation_elements,
      max_test_examples=config.max_test_elements, progress=config.progress)
  vocab = list(federated.vocab)
  preprocess_fn = preprocessing.build_preprocess_fn(
      vocab, sequence_length=config.sequence_length,
      max_elements_per_client=config.max_elements_per_client,
      batch_size=config.client_batch_size, num_oov_buckets=config.num_oov_buckets)
  central = preprocessing.build_preprocess_fn(
      vocab, sequence_length=config.sequence_length, max_elements_per_client=None,
      batch_size=256, num_oov_buckets=config.num_oov_buckets)
  model_kwargs = dict(vocab_size=len(vocab), num_oov_buckets=config.num_oov_buckets,
                      embedding_size=config.embedding_size, lstm_size=config.lstm_size,
                      projection_size=config.projection_size)
  model_fn = so_model.create_tff_model_fn(sequence_length=config.sequence_length, **model_kwargs)

  def keras_model_fn(seed=None):
    return so_model.create_keras_model(seed=seed, **model_kwargs)

  return Task(train=federated.train, train_client_ids=list(federated.train_client_ids),
              validation=central(federated.validation), test=central(federated.test),
              preprocess_fn=preprocess_fn, vocab=vocab, model_fn=model_fn,
              keras_model_fn=keras_model_fn, dataset=_dataset_record(federated))


def initial_model_weights(keras_model_fn, seed: int):
  """Model weights initialized deterministically from ``seed`` (trainable, non_trainable)."""
  model = keras_model_fn(seed=int(seed))
  return ([v.numpy() for v in model.trainable_variables],
          [v.numpy() for v in model.non_trainable_variables])


def trainable_variable_names(keras_model_fn) -> List[str]:
  """Names of the model's trainable variables, in the order of its weights (``:0`` dropped)."""
  model = keras_model_fn()
  names = [v.name[:-2] if v.name.endswith(":0") else v.name for v in model.trainable_variables]
  if len(set(names)) != len(names):  # never expected; keep the arrays apart anyway
    names = [f"{i:02d}_{name}" for i, name in enumerate(names)]
  return names


class Evaluator:
  """Loss and the three accuracies of Denisov et al. App I on batched (x, y) datasets.

  Loss is the mean cross-entropy over all non-pad targets of the dataset
  (token-weighted; ``stackoverflow.metrics.MaskedSparseCategoricalCrossentropy``
  is the per-batch version). One Keras model and one traced step are reused.
  """

  def __init__(self, keras_model_fn, vocab_size: int, num_oov_buckets: int):
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    from stackoverflow import metrics as so_metrics  # pylint: disable=g-import-not-at-top
    from stackoverflow import preprocessing  # pylint: disable=g-import-not-at-top
    pad = preprocessing.special_token_ids(vocab_size, num_oov_buckets).pad
    self.model = keras_model_fn()
    self.metrics = [m for m in so_metrics.build_metrics(vocab_size, num_oov_buckets)
                    if m.name in METRIC_KEYS]
    model, metrics = self.model, self.metrics

    @tf.function
    def step(x, y):
      logits = model(x, training=False)
      per_token = tf.keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True)
      weight = tf.cast(tf.not_equal(y, pad), tf.float32)
      for metric in metrics:
        metric.update_state(y, logits)
      return tf.reduce_sum(per_token * weight), tf.reduce_sum(weight)

    self._step = step

  def __call__(self, model_weights, dataset) -> Dict[str, float]:
    model_weights.assign_weights_to(self.model)
    for metric in self.metrics:
      metric.reset_state()
    loss_sum, tokens = 0.0, 0.0
    for x, y in dataset:
      batch_loss, batch_tokens = self._step(x, y)
      loss_sum += float(batch_loss)
      tokens += float(batch_tokens)
    out = {"loss": loss_sum / tokens if tokens else float("nan")}
    out.update({m.name: float(m.result()) for m in self.metrics})
    return out
