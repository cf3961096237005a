"""The learning task of a run: federated data, preprocessing, model, and central evaluation.

Next-word prediction on StackOverflow-style text with the LSTM of Denisov et al.
2022 (arXiv:2202.08312, App I), built from ``stackoverflow/``.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Callable, Dict, List, Optional

from training.config import TrainingConfig

METRIC_KEYS = ("loss", "accuracy", "accuracy_no_oov", "accuracy_no_oov_no_eos")
# Bytes of clients' token ids kept between rounds (a client of 256 sentences of
# L = 20 holds 43 kB): repeated participations reuse them.
CLIENT_CACHE_BYTES = 256 << 20


class ClientDatasets:
  """A train client's preprocessed batches, materialized once per client.

  ``load(client_id)`` is the dataset ``preprocess_fn`` makes of the client's raw
  examples (same sentences, order, ids and batches), or None for a client
  without examples; it is built in memory from the client's token ids: its
  sentences (``read_sentences(client_id)``, already cut to the
  ``max_elements_per_client`` first) through
  ``stackoverflow.preprocessing.build_client_ids_fn``, read and preprocessed once
  and kept (least recently used first out, at most ``cache_bytes``).
  """

  def __init__(self, read_sentences: Callable, client_ids_fn: Callable, batch_size: int,
               cache_bytes: int = CLIENT_CACHE_BYTES, read_many: Optional[Callable] = None):
    self._read_sentences = read_sentences
    self._read_many = read_many
    self._client_ids_fn = client_ids_fn
    self._batch_size = batch_size
    self._cache_bytes = cache_bytes
    self._cached_bytes = 0
    self._cache: "collections.OrderedDict[str, object]" = collections.OrderedDict()

  def token_ids(self, client_id: str):
    """The client's ids [n, L+1] (numpy int64; n = 0 for a client without examples)."""
    ids = self._cache.get(client_id)
    if ids is not None:
      self._cache.move_to_end(client_id)
      return ids
    return self._keep(client_id, self._client_ids_fn(self._read_sentences(client_id)))

  def _keep(self, client_id: str, ids):
    ids.setflags(write=False)
    self._cache[client_id] = ids
    self._cached_bytes += ids.nbytes
    while self._cached_bytes > self._cache_bytes and len(self._cache) > 1:
      _, dropped = self._cache.popitem(last=False)
      self._cached_bytes -= dropped.nbytes
    return ids

  def prefetch(self, client_ids) -> None:
    """Reads and preprocesses the clients not kept yet in one batch (``read_many``, one
    ``client_ids_fn`` call): the ids of each are those ``token_ids`` makes (sentence by
    sentence), at a fraction of the per-client calls' cost (about 1.4 ms a client on
    the main job's model, beside a client update of 2.5-3.5 ms)."""
    import numpy as np  # pylint: disable=g-import-not-at-top
    todo = list(dict.fromkeys(c for c in client_ids if c not in self._cache))
    if not todo:
      return
    sentences = (self._read_many(todo) if self._read_many is not None
                 else [self._read_sentences(c) for c in todo])
    counts = [len(s) for s in sentences]
    if sum(counts):
      ids = self._client_ids_fn(np.concatenate([np.asarray(s, object) for s in sentences]))
    else:
      ids = self._client_ids_fn([])
    for client_id, part in zip(todo, np.split(ids, np.cumsum(counts)[:-1])):
      self._keep(client_id, np.array(part))

  def load(self, client_id: str) -> Optional[object]:
    """The client's (x, y) batches as a tf.data.Dataset, None when it has no examples."""
    batches = self.batches(client_id)
    return None if batches is None else batches.dataset()

  def batches(self, client_id: str) -> Optional[object]:
    """The client's batches as arrays (``preprocessing.ClientBatches``, what the compiled
    engine takes), None when it has no examples."""
    from stackoverflow import preprocessing  # pylint: disable=g-import-not-at-top
    ids = self.token_ids(client_id)
    if not len(ids):
      return None
    return preprocessing.ClientBatches(ids, self._batch_size)


@dataclasses.dataclass
class Task:
  """Data and model of one run."""
  train: object  # tff.simulation.datasets.ClientData of raw examples
  train_client_ids: List[str]
  validation: object  # tf.data.Dataset of (x, y) batches
  test: object
  preprocess_fn: Callable  # raw client dataset -> (x, y) batches (lazy tf.data pipeline)
  client_datasets: ClientDatasets  # the same batches, materialized per client
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


def _dataset_options(config: TrainingConfig) -> dict:
  """``load_federated_data``'s dataset options of ``config``: for a docstring dataset without
  the standard library (--nopydocs_stdlib), ``include_stdlib=False``."""
  return {} if config.pydocs_stdlib else {"include_stdlib": False}


def build_task(config: TrainingConfig) -> Task:
  """Loads the federated data and builds the preprocessing and model (stackoverflow/)."""
  from stackoverflow import data as so_data  # pylint: disable=g-import-not-at-top
  from stackoverflow import model as so_model  # pylint: disable=g-import-not-at-top
  from stackoverflow import preprocessing  # pylint: disable=g-import-not-at-top
  federated = so_data.load_federated_data(
      config.dataset, data_dir=config.data_dir, vocab_size=config.vocab_size,
      num_validation_examples=config.max_validation_elements,
      max_test_examples=config.max_test_elements, progress=config.progress,
      **_dataset_options(config))
  vocab = list(federated.vocab)
  preprocess_fn = preprocessing.build_preprocess_fn(
      vocab, sequence_length=config.sequence_length,
      max_elements_per_client=config.max_elements_per_client,
      batch_size=config.client_batch_size, num_oov_buckets=config.num_oov_buckets)
  client_ids_fn = preprocessing.build_client_ids_fn(
      vocab, sequence_length=config.sequence_length, num_oov_buckets=config.num_oov_buckets)

  def read_sentences(client_id):
    return federated.train_tokens(client_id, config.max_elements_per_client)

  read_many = getattr(federated.train_tokens, "many", None)
  central = preprocessing.build_preprocess_fn(
      vocab, sequence_length=config.sequence_length, max_elements_per_client=None,
      batch_size=256, num_oov_buckets=config.num_oov_buckets)
  model_kwargs = dict(vocab_size=len(vocab), num_oov_buckets=config.num_oov_buckets,
                      embedding_size=config.embedding_size, lstm_size=config.lstm_size,
                      projection_size=config.projection_size, lstm_kernel=config.lstm_kernel)
  model_fn = so_model.create_tff_model_fn(sequence_length=config.sequence_length, **model_kwargs)

  def keras_model_fn(seed=None):
    return so_model.create_keras_model(seed=seed, **model_kwargs)

  return Task(train=federated.train, train_client_ids=list(federated.train_client_ids),
              validation=central(federated.validation), test=central(federated.test),
              preprocess_fn=preprocess_fn,
              client_datasets=ClientDatasets(
                  read_sentences, client_ids_fn, config.client_batch_size,
                  read_many=read_many and (lambda ids: read_many(
                      ids, config.max_elements_per_client))),
              vocab=vocab, model_fn=model_fn,
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


# Train clients the unigram baseline is fit on (a fixed random sample: about 10^5 targets).
UNIGRAM_CLIENTS = 2000


def unigram_baseline(task: Task, num_oov_buckets: int,
                     max_clients: int = UNIGRAM_CLIENTS) -> Dict[str, object]:
  """Test metrics of the context-free predictors fit on the train clients' targets.

  The fit uses ``max_clients`` train clients drawn without replacement with seed 0 (all of
  them when there are fewer): reading every client of a large dataset costs more than the
  estimate gains.

  ``loss``: cross-entropy on the test targets of the train targets' frequencies (add-one
  smoothed over the model's classes): an estimate of what a model that ignores the words
  before can reach (not a bound). The accuracies are those of always predicting ``word``, the most frequent train
  target that is a word (neither pad, OOV, BOS nor EOS), over the targets each accuracy
  counts (``stackoverflow.metrics``): what a model gets for learning only the unigram.
  Non-private: a reference line for the tables, not a run.
  """
  import numpy as np  # pylint: disable=g-import-not-at-top
  from stackoverflow import preprocessing  # pylint: disable=g-import-not-at-top
  vocab_size = len(task.vocab)
  special = preprocessing.special_token_ids(vocab_size, num_oov_buckets)
  classes = vocab_size + num_oov_buckets + 3  # pad, words, OOV buckets, BOS, EOS
  counts = np.zeros(classes, dtype=np.float64)
  ids = list(task.train_client_ids)
  if len(ids) > max_clients:
    ids = [ids[i] for i in np.sort(np.random.default_rng(0).choice(len(ids), max_clients,
                                                                    replace=False))]
  for client_id in ids:
    targets = np.asarray(task.client_datasets.token_ids(client_id))[:, 1:].ravel()
    counts += np.bincount(targets, minlength=classes)
  counts[special.pad] = 0.0
  frequencies = (counts + 1.0) / (counts.sum() + classes - 1)
  frequencies[special.pad] = 0.0
  words = counts.copy()
  words[[special.pad, *special.oov, special.bos, special.eos]] = -1.0
  word = int(np.argmax(words))
  test = np.concatenate([np.asarray(y).ravel() for _, y in task.test])
  test = test[test != special.pad]
  no_oov = test[~np.isin(test, special.oov)]
  no_oov_no_eos = no_oov[no_oov != special.eos]
  return {"loss": float(-np.mean(np.log(frequencies[test]))),
          "accuracy": float(np.mean(test == word)),
          "accuracy_no_oov": float(np.mean(no_oov == word)),
          "accuracy_no_oov_no_eos": float(np.mean(no_oov_no_eos == word)),
          "word": task.vocab[word - 1], "test_targets": int(test.size),
          "fit_clients": len(ids), "fit_targets": int(counts.sum())}


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
