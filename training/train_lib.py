"""DP federated training on StackOverflow-style next-word prediction.

The loop of Denisov et al. Sec 5 / App I (`001_…`, `000_…`): FedAvg where each
round's clipped client updates go through a matrix-factorization mechanism
(``tff_mf.tf.aggregators.build_mechanism``), single pass over the clients
(each client at most once), ε of the one Gaussian mechanism (Denisov Thm 4.1,
``tff_mf.accounting``), checkpoint/resume through
``tff.program.FileProgramStateManager``.

``run_training(TrainingConfig(...))`` is what ``training/run_stackoverflow.py``
calls; it returns the summary dict it also writes to
``<root_output_dir>/<experiment_name>/summary.json``.
"""

from __future__ import annotations

import asyncio
import collections
import csv
import dataclasses
import hashlib
import json
import math
import os
import sys
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

MECHANISM_FLAGS = ("tree", "honaker_full", "opt_prefix_sum", "opt_momentum", "structured",
                   "gaussian", "none")
# Flag value -> tff_mf.tf.aggregators.MECHANISMS name.
MECHANISM_NAMES = {
    "tree": "honaker_online",
    "honaker_full": "honaker_full",
    "opt_prefix_sum": "opt_prefix_sum",
    "opt_momentum": "opt_momentum",
    "structured": "structured",
    "gaussian": "gaussian_fixed",
}
DATASETS = ("stackoverflow", "pydocs", "synthetic")
LR_SCHEDULES = ("constant", "decay", "cooldown")
METRIC_KEYS = ("loss", "accuracy", "accuracy_no_oov", "accuracy_no_oov_no_eos")
SUMMARY_FILE = "summary.json"
METRICS_FILE = "metrics.csv"
CONFIG_FILE = "config.json"
FINAL_MODEL_FILE = "final_model.npz"
# Flags that may differ between the run that wrote a checkpoint and the one resuming it.
RESUME_FREE_FIELDS = ("noise_seed", "workers", "rounds_per_checkpoint", "rounds_per_eval",
                      "progress", "root_output_dir", "matrix_cache")
# Mechanisms without a seedable noise stream: with no --noise_seed they get none
# (gaussian = TFF's gaussian_fixed uses TensorFlow's stateful RNG, so it is not
# reproducible across a resume; none adds no noise).
SEEDLESS_MECHANISMS = ("gaussian", "none")


class TrainingError(ValueError):
  """A configuration or data problem that stops training (message says what)."""


@dataclasses.dataclass
class TrainingConfig:
  """Every flag of run_stackoverflow.py (defaults: a small model, see the flags)."""
  mechanism: str = "opt_prefix_sum"
  dataset: str = "pydocs"
  data_dir: Optional[str] = None
  total_rounds: int = 100
  clients_per_round: int = 10
  client_lr: float = 0.5
  server_lr: float = 1.0
  server_momentum: float = 0.0
  lr_schedule: str = "constant"
  schedule_rounds: Optional[int] = None
  noise_multiplier: Optional[float] = None
  target_epsilon: Optional[float] = None
  delta: float = 1e-6
  accountant: str = "pld"
  clip_norm: float = 1.0
  noise_seed: Optional[int] = None
  matrix_cache: Optional[str] = None
  bands: Optional[int] = None
  rank: Optional[int] = None
  root_output_dir: str = "/tmp/tff_mf_training"
  experiment_name: str = "run"
  rounds_per_eval: int = 10
  rounds_per_checkpoint: int = 10
  vocab_size: int = 10000
  num_oov_buckets: int = 1
  embedding_size: int = 96
  lstm_size: int = 670
  projection_size: int = 96
  sequence_length: int = 20
  max_elements_per_client: int = 256
  client_batch_size: int = 16
  max_validation_elements: int = 10000
  max_test_elements: Optional[int] = None
  workers: Tuple[str, ...] = ()
  seed: int = 0
  progress: bool = True

  def validate(self) -> None:
    """Raises TrainingError naming the first bad or conflicting value."""
    if self.mechanism not in MECHANISM_FLAGS:
      raise TrainingError(f"--mechanism={self.mechanism!r}; expected one of {MECHANISM_FLAGS}")
    if self.dataset not in DATASETS:
      raise TrainingError(f"--dataset={self.dataset!r}; expected one of {DATASETS}")
    if self.lr_schedule not in LR_SCHEDULES:
      raise TrainingError(f"--lr_schedule={self.lr_schedule!r}; expected one of {LR_SCHEDULES}")
    for name in ("total_rounds", "clients_per_round", "rounds_per_eval", "rounds_per_checkpoint",
                 "max_validation_elements",
                 "vocab_size", "num_oov_buckets", "embedding_size", "lstm_size",
                 "projection_size", "sequence_length", "max_elements_per_client",
                 "client_batch_size"):
      value = getattr(self, name)
      if not isinstance(value, (int, np.integer)) or value < 1:
        raise TrainingError(f"--{name} must be a positive integer, got {value!r}")
    for name in ("client_lr", "server_lr", "clip_norm"):
      value = getattr(self, name)
      if not math.isfinite(value) or value <= 0:
        raise TrainingError(f"--{name} must be a finite positive number, got {value!r}")
    if not 0.0 <= self.server_momentum < 1.0:
      raise TrainingError(f"--server_momentum must be in [0, 1), got {self.server_momentum}")
    if self.lr_schedule != "constant":
      if self.schedule_rounds is None or not 1 <= self.schedule_rounds <= self.total_rounds:
        raise TrainingError(
            f"--lr_schedule={self.lr_schedule} needs --schedule_rounds in [1, total_rounds="
            f"{self.total_rounds}], got {self.schedule_rounds}")
    elif self.schedule_rounds is not None:
      raise TrainingError("--schedule_rounds is only meaningful with --lr_schedule=decay or "
                          f"cooldown (got --lr_schedule=constant, --schedule_rounds="
                          f"{self.schedule_rounds})")
    if not 0.0 < self.delta < 1.0:
      raise TrainingError(f"--delta must be in (0, 1), got {self.delta}")
    if self.mechanism == "none":
      if self.noise_multiplier not in (None, 0.0) or self.target_epsilon is not None:
        raise TrainingError(
            "--mechanism=none trains without privacy; it takes neither --noise_multiplier "
            f"(got {self.noise_multiplier}) nor --target_epsilon (got {self.target_epsilon})")
    else:
      if (self.noise_multiplier is None) == (self.target_epsilon is None):
        raise TrainingError(
            f"--mechanism={self.mechanism} needs exactly one of --noise_multiplier and "
            f"--target_epsilon (got {self.noise_multiplier} and {self.target_epsilon})")
      if self.noise_multiplier is not None and not (
          math.isfinite(self.noise_multiplier) and self.noise_multiplier > 0):
        raise TrainingError(
            f"--noise_multiplier must be a finite positive number, got {self.noise_multiplier}")
      if self.target_epsilon is not None and not (
          math.isfinite(self.target_epsilon) and self.target_epsilon > 0):
        raise TrainingError(
            f"--target_epsilon must be a finite positive number, got {self.target_epsilon}")
    if self.noise_seed is not None and not 0 <= int(self.noise_seed) < 2**63:
      raise TrainingError(f"--noise_seed must be in [0, 2^63), got {self.noise_seed}")
    if not self.experiment_name or os.sep in self.experiment_name:
      raise TrainingError(f"--experiment_name must be a plain name, got {self.experiment_name!r}")

  def public_dict(self) -> Dict[str, object]:
    """Every flag value, except the noise seed (kept only in the checkpoint)."""
    out = dataclasses.asdict(self)
    out["workers"] = list(self.workers)
    if self.noise_seed is not None:
      out["noise_seed"] = "pinned"
    elif self.mechanism == "none":
      out["noise_seed"] = "no_noise"
    elif self.mechanism == "gaussian":
      out["noise_seed"] = "tf_stateful_rng"
    else:
      out["noise_seed"] = "os_entropy"
    return out

  def fingerprint(self) -> str:
    """Hash of the fields a resumed run must share with the run that checkpointed."""
    values = {k: v for k, v in self.public_dict().items() if k not in RESUME_FREE_FIELDS}
    return hashlib.sha256(json.dumps(values, sort_keys=True).encode()).hexdigest()


# ----------------------------------------------------------------------------- sampling


class SinglePassSampler:
  """Each client at most once, in a permutation fixed by ``seed`` (Denisov Sec 5).

  The permutation is recomputed from the seed; only ``cursor`` (the number of
  clients consumed, used or skipped) is state, so resuming restores the order.
  """

  def __init__(self, client_ids: Sequence[str], seed: int, cursor: int = 0):
    self.client_ids = sorted(client_ids)
    self.order = np.random.default_rng(seed).permutation(len(self.client_ids))
    self.cursor = int(cursor)

  def __len__(self) -> int:
    return len(self.client_ids)

  def next_round(self, count: int, load: Callable[[str], Optional[object]]
                 ) -> Tuple[List[str], List[object], int]:
    """The next ``count`` clients whose ``load(id)`` is not None (non-empty).

    Returns (client ids, their loaded datasets, number skipped as empty).
    """
    chosen, loaded, skipped = [], [], 0
    while len(chosen) < count:
      if self.cursor >= len(self.order):
        raise TrainingError(
            f"ran out of clients for a single pass: all {len(self.order)} training clients "
            f"are used ({skipped} skipped as empty this round) with {len(chosen)} of "
            f"{count} clients found for this round")
      client_id = self.client_ids[self.order[self.cursor]]
      self.cursor += 1
      value = load(client_id)
      if value is None:
        skipped += 1
      else:
        chosen.append(client_id)
        loaded.append(value)
    return chosen, loaded, skipped


def check_enough_clients(num_clients: int, total_rounds: int, clients_per_round: int) -> None:
  """Single pass needs total_rounds × clients_per_round distinct clients."""
  needed = total_rounds * clients_per_round
  if num_clients < needed:
    raise TrainingError(
        f"too few clients for a single pass: the dataset has {num_clients} training clients, "
        f"but --total_rounds={total_rounds} × --clients_per_round={clients_per_round} = "
        f"{needed} are needed (each client is used at most once)")


# ----------------------------------------------------------------------------- privacy


def resolve_noise_multiplier(config: TrainingConfig) -> Tuple[Optional[float], Optional[float]]:
  """(noise multiplier z, ε) — ε is an upper bound from tff_mf.accounting (Denisov Thm 4.1).

  Every mechanism here is normalized to sensitivity γ(C) = 1 in the single-pass
  setting, so the release is one Gaussian mechanism with multiplier z.
  """
  if config.mechanism == "none":
    return None, None
  from tff_mf import accounting  # pylint: disable=g-import-not-at-top
  if config.target_epsilon is not None:
    z = float(accounting.calibrate_noise_multiplier(config.target_epsilon, config.delta,
                                                    accountant=config.accountant))
  else:
    z = float(config.noise_multiplier)
  eps = float(accounting.epsilon(z, config.delta, accountant=config.accountant))
  return z, eps


def new_noise_seed() -> int:
  """A fresh noise seed from OS entropy (non-negative int64)."""
  return int.from_bytes(os.urandom(8), "little") >> 1


# ----------------------------------------------------------------------------- model/process


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
              keras_model_fn=keras_model_fn)


def server_lr_schedule(config: TrainingConfig) -> np.ndarray:
  """Per-round server learning rates η_i · server_lr (tff_mf.workloads.learning_rates)."""
  from tff_mf import workloads  # pylint: disable=g-import-not-at-top
  return config.server_lr * workloads.learning_rates(
      config.total_rounds, config.lr_schedule, config.schedule_rounds)


def build_mechanism_setup(config: TrainingConfig, noise_multiplier: Optional[float],
                          noise_seed: Optional[int]):
  """(aggregation factory, server optimizer, sqrt_loss, info) for the mechanism flag.

  For the DP mechanisms both come from ``tff_mf.tf.aggregators.build_mechanism``
  (momentum β and the learning-rate schedule are part of the mechanism's
  workload for opt_momentum, and the server optimizer realizes the rest;
  conflicting flags raise there). ``none`` is plain FedAvg with server SGD
  momentum and the same schedule.
  """
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
  from training import robustness  # pylint: disable=g-import-not-at-top
  if config.mechanism == "none":
    rates = server_lr_schedule(config)
    optimizer = tff.learning.optimizers.build_sgdm(
        learning_rate=float(rates[0]),
        momentum=config.server_momentum if config.server_momentum > 0 else None)
    if config.lr_schedule != "constant":
      table = tf.constant(rates.astype(np.float32))

      def schedule(round_index):
        index = tf.minimum(tf.cast(round_index, tf.int32), config.total_rounds - 1)
        return tf.gather(table, index)

      optimizer = tff.learning.optimizers.schedule_learning_rate(optimizer, schedule)
    factory = tff.aggregators.UnweightedMeanFactory()
    return robustness.NonFiniteZeroingFactory(factory), optimizer, None, {"private": False}
  from tff_mf.tf import aggregators  # pylint: disable=g-import-not-at-top
  kwargs = dict(total_rounds=config.total_rounds, noise_multiplier=noise_multiplier,
                clients_per_round=config.clients_per_round, clip_norm=config.clip_norm,
                server_learning_rate=config.server_lr, momentum=config.server_momentum,
                lr_schedule=config.lr_schedule, schedule_rounds=config.schedule_rounds,
                noise_seed=noise_seed, cache_dir=config.matrix_cache, progress=config.progress)
  if config.bands is not None:
    kwargs["bands"] = config.bands
  if config.rank is not None:
    kwargs["rank"] = config.rank
  try:
    setup = aggregators.build_mechanism(MECHANISM_NAMES[config.mechanism], **kwargs)
  except ValueError as e:
    raise TrainingError(f"--mechanism={config.mechanism}: {e}") from e
  info = dict(setup.info or {})
  info["private"] = True
  return (robustness.NonFiniteZeroingFactory(setup.aggregation_factory), setup.server_optimizer,
          setup.sqrt_loss, info)


def build_process(model_fn, aggregation_factory, server_optimizer, client_lr: float):
  """Unweighted FedAvg (each client one clipped update, Denisov Sec 5)."""
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
  return tff.learning.algorithms.build_unweighted_fed_avg(
      model_fn,
      client_optimizer_fn=tff.learning.optimizers.build_sgdm(learning_rate=client_lr),
      server_optimizer_fn=server_optimizer,
      model_aggregator=aggregation_factory)


def initial_model_weights(keras_model_fn, seed: int):
  """Model weights initialized deterministically from ``seed`` (trainable, non_trainable)."""
  model = keras_model_fn(seed=int(seed))
  return ([v.numpy() for v in model.trainable_variables],
          [v.numpy() for v in model.non_trainable_variables])


# ----------------------------------------------------------------------------- evaluation


class Evaluator:
  """Loss and the three accuracies of Denisov App I on batched (x, y) datasets.

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


# ----------------------------------------------------------------------------- checkpoints


def _run(coro):
  return asyncio.run(coro)


def _leaf_dtype(x) -> str:
  """numpy dtype name of a state leaf (array, tensor or Python scalar)."""
  dtype = getattr(x, "dtype", None)
  if dtype is None:
    return np.asarray(x).dtype.name
  return getattr(dtype, "name", str(dtype))


class Checkpointer:
  """Program state through tff.program.FileProgramStateManager.

  Two managers in ``<experiment>/checkpoints``: ``meta_<round>`` (round, sampler
  cursor, counters and the private noise seed; fixed structure, so it can be read
  before the process is built with that seed) and ``program_state_<round>``
  (the LearningAlgorithmState). Meta is written second, so its latest version
  always has a complete process state beside it.
  """

  META_KEYS = ("round", "cursor", "noise_seed", "empty_clients_skipped",
               "zeroed_client_updates", "wall_seconds")

  def __init__(self, directory: str, keep: int = 3):
    import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
    self.directory = directory
    self.meta = tff.program.FileProgramStateManager(directory, prefix="meta_", keep_total=keep,
                                                    keep_first=False)
    self.state = tff.program.FileProgramStateManager(directory, prefix="program_state_",
                                                     keep_total=keep, keep_first=False)

  @classmethod
  def _meta_structure(cls):
    return collections.OrderedDict(
        round=np.int64(0), cursor=np.int64(0), noise_seed=np.int64(0),
        empty_clients_skipped=np.int64(0), zeroed_client_updates=np.int64(0),
        wall_seconds=np.float64(0.0))

  def latest_meta(self) -> Optional[Dict[str, object]]:
    versions = _run(self.meta.get_versions())
    if not versions:
      return None
    meta = _run(self.meta.load(versions[-1], self._meta_structure()))
    out = {k: (float(meta[k]) if k == "wall_seconds" else int(meta[k])) for k in self.META_KEYS}
    if out["round"] != versions[-1]:
      raise TrainingError(f"checkpoint meta_{versions[-1]} in {self.directory} records round "
                          f"{out['round']}; the checkpoint directory is corrupt")
    return out

  def load_state(self, round_num: int, structure):
    """``program_state_<round_num>``, checked leaf by leaf against ``structure``.

    FileProgramStateManager would return arrays of the checkpoint's shapes for a
    template of other shapes, and fails with a bare nest error when the nesting
    differs. Both happen when the checkpoint was written by another tff-mf
    version or model; either way this raises a TrainingError naming the first
    difference, and leaves the checkpoint files untouched.
    """
    from tensorflow.python.util import nest  # pylint: disable=g-import-not-at-top
    name = f"checkpoint program_state_{round_num} in {self.directory}"
    hint = ("it was written by a different tff-mf version, model or mechanism; resume with "
            "the code and flags that wrote it, or start a new experiment directory")
    try:
      state = _run(self.state.load(round_num, structure))
    except (ValueError, TypeError) as e:
      raise TrainingError(f"{name} does not have this run's state structure ({hint}): "
                          f"{str(e).splitlines()[0]}") from e
    expected = nest.flatten_with_joined_string_paths(structure)
    loaded = nest.flatten(state)
    if len(expected) != len(loaded):
      raise TrainingError(f"{name} holds {len(loaded)} arrays, this run's state "
                          f"{len(expected)} ({hint})")
    for (path, want), got in zip(expected, loaded):
      want_shape, got_shape = tuple(np.shape(want)), tuple(np.shape(got))
      want_dtype, got_dtype = _leaf_dtype(want), _leaf_dtype(got)
      if want_shape != got_shape or want_dtype != got_dtype:
        raise TrainingError(f"{name}: state entry {path or '<root>'} is "
                            f"{got_dtype}{list(got_shape)} in the checkpoint but "
                            f"{want_dtype}{list(want_shape)} in this run ({hint})")
    return state

  def save(self, state, meta: Dict[str, object]) -> None:
    version = int(meta["round"])
    for manager in (self.state, self.meta):
      versions = _run(manager.get_versions()) or []
      if version in versions:  # left by a run killed between the two writes
        _run(manager._remove(version))  # pylint: disable=protected-access
    _run(self.state.save(state, version))
    values = self._meta_structure()
    for k in self.META_KEYS:
      values[k] = np.float64(meta[k]) if k == "wall_seconds" else np.int64(meta[k])
    _run(self.meta.save(values, version))


# ----------------------------------------------------------------------------- outputs


class MetricsWriter:
  """metrics.csv (one row per round, rewritten on resume up to the checkpoint) + TensorBoard."""

  FIELDS = ("round", "train_loss", "train_accuracy", "round_seconds", "clients",
            "empty_clients_skipped", "zeroed_client_updates",
            *(f"validation_{k}" for k in METRIC_KEYS))

  def __init__(self, experiment_dir: str, resume_round: int):
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    self.path = os.path.join(experiment_dir, METRICS_FILE)
    kept = []
    if resume_round > 0 and os.path.exists(self.path):
      with open(self.path, newline="") as f:
        kept = [row for row in csv.DictReader(f) if int(row["round"]) <= resume_round]
    self._file = open(self.path, "w", newline="")
    self._writer = csv.DictWriter(self._file, fieldnames=self.FIELDS)
    self._writer.writeheader()
    for row in kept:
      self._writer.writerow({k: row.get(k, "") for k in self.FIELDS})
    self._file.flush()
    self.rows = kept
    self._tb = tf.summary.create_file_writer(os.path.join(experiment_dir, "tensorboard"))

  def write(self, row: Dict[str, object]) -> None:
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    self._writer.writerow({k: row.get(k, "") for k in self.FIELDS})
    self._file.flush()
    self.rows.append({k: row.get(k, "") for k in self.FIELDS})
    with self._tb.as_default():
      for key, value in row.items():
        if key != "round" and isinstance(value, (int, float)) and math.isfinite(value):
          tf.summary.scalar(key, value, step=int(row["round"]))
    self._tb.flush()

  def close(self) -> None:
    self._file.close()
    self._tb.close()


def _format_seconds(seconds: float) -> str:
  seconds = int(round(seconds))
  return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def _write_json(path: str, value) -> None:
  tmp = path + ".tmp"
  with open(tmp, "w") as f:
    json.dump(value, f, indent=2, sort_keys=True, allow_nan=False)
  os.replace(tmp, path)


def _finite_or_none(value):
  return value if isinstance(value, float) and math.isfinite(value) else None


# ----------------------------------------------------------------------------- main loop


def run_training(config: TrainingConfig, task: Optional[Task] = None,
                 log=None) -> Dict[str, object]:
  """Trains (resuming from the latest checkpoint if any); returns the summary dict."""
  config.validate()
  log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
  from tff_mf.tf import runtime  # pylint: disable=g-import-not-at-top
  from training import robustness  # pylint: disable=g-import-not-at-top
  runtime.install_exit_hook()
  if config.workers:
    from training import distributed  # pylint: disable=g-import-not-at-top
    distributed.configure_execution_context(list(config.workers))

  experiment_dir = os.path.join(config.root_output_dir, config.experiment_name)
  os.makedirs(experiment_dir, exist_ok=True)
  checkpointer = Checkpointer(os.path.join(experiment_dir, "checkpoints"))
  meta = checkpointer.latest_meta()
  config_path = os.path.join(experiment_dir, CONFIG_FILE)
  if meta is not None:
    if not os.path.exists(config_path):
      raise TrainingError(f"{experiment_dir} has checkpoints but no {CONFIG_FILE}; "
                          "use a new --experiment_name")
    with open(config_path) as f:
      saved = json.load(f)
    if saved.get("fingerprint") != config.fingerprint():
      changed = sorted(k for k, v in config.public_dict().items()
                       if k not in RESUME_FREE_FIELDS and saved.get("config", {}).get(k) != v)
      raise TrainingError(
          f"{experiment_dir} holds a checkpoint (round {meta['round']}) of a run with other "
          f"flags ({', '.join(changed) or 'fingerprint'} differ); rerun the same command to "
          "resume, or use a new --experiment_name")
    if config.noise_seed is not None and int(config.noise_seed) != meta["noise_seed"]:
      raise TrainingError("--noise_seed differs from the seed recorded in the checkpoint of "
                          f"{experiment_dir}; a resumed run must reuse its noise seed")
    noise_seed = meta["noise_seed"] if meta["noise_seed"] >= 0 else None
    log(f"resuming {experiment_dir} from round {meta['round']}")
  else:
    if config.noise_seed is not None:
      noise_seed = int(config.noise_seed)
    elif config.mechanism in SEEDLESS_MECHANISMS:
      noise_seed = None  # TFF's gaussian_fixed draws from TF's stateful RNG; none has no noise
    else:
      noise_seed = new_noise_seed()
    meta = {"round": 0, "cursor": 0, "noise_seed": -1 if noise_seed is None else noise_seed,
            "empty_clients_skipped": 0,
            "zeroed_client_updates": 0, "wall_seconds": 0.0}
    _write_json(config_path, {"config": config.public_dict(),
                              "fingerprint": config.fingerprint()})

  noise_multiplier, eps = resolve_noise_multiplier(config)
  if task is None:
    task = build_task(config)
  check_enough_clients(len(task.train_client_ids), config.total_rounds, config.clients_per_round)
  sampler = SinglePassSampler(task.train_client_ids, config.seed, cursor=meta["cursor"])

  factory, server_optimizer, sqrt_loss, mechanism_info = build_mechanism_setup(
      config, noise_multiplier, noise_seed)
  process = build_process(task.model_fn, factory, server_optimizer, config.client_lr)
  state = process.initialize()
  trainable, non_trainable = initial_model_weights(task.keras_model_fn, config.seed)
  state = process.set_model_weights(
      state, tff.learning.models.ModelWeights(trainable=trainable, non_trainable=non_trainable))
  if meta["round"] > 0:
    state = checkpointer.load_state(meta["round"], state)

  writer = MetricsWriter(experiment_dir, meta["round"])
  diverged = False
  start_round = meta["round"]
  session_start = time.perf_counter()
  wall_before = meta["wall_seconds"]
  last_validation = None
  evaluate = Evaluator(task.keras_model_fn, len(task.vocab), config.num_oov_buckets)

  def load_client(client_id):
    """The client's preprocessed dataset, or None when it has no examples (skipped).

    Checked on the raw examples (cheaper): preprocessing turns any non-empty
    client into at least one batch (every sentence yields at least [BOS]).
    """
    raw = task.train.create_tf_dataset_for_client(client_id)
    if next(iter(raw.take(1)), None) is None:
      return None
    return task.preprocess_fn(raw)

  def model_weights_of(s):
    return process.get_model_weights(s)

  try:
    for round_num in range(start_round + 1, config.total_rounds + 1):
      round_start = time.perf_counter()
      client_ids, datasets, skipped = sampler.next_round(config.clients_per_round, load_client)
      output = process.next(state, datasets)
      state = output.state
      metrics = output.metrics
      train = metrics["client_work"]["train"]
      zeroed = int(metrics["aggregator"][robustness.ZEROED_METRIC])
      meta["empty_clients_skipped"] += skipped
      meta["zeroed_client_updates"] += zeroed
      meta["cursor"] = sampler.cursor
      meta["round"] = round_num
      round_seconds = time.perf_counter() - round_start
      row = {"round": round_num, "train_loss": float(train["loss"]),
             "train_accuracy": float(train.get("accuracy", float("nan"))),
             "round_seconds": round_seconds, "clients": len(client_ids),
             "empty_clients_skipped": skipped, "zeroed_client_updates": zeroed}
      weights = model_weights_of(state)
      if not robustness.all_finite(weights.trainable):
        diverged = True
      if not diverged and (round_num % config.rounds_per_eval == 0
                           or round_num == config.total_rounds):
        last_validation = evaluate(weights, task.validation)
        row.update({f"validation_{k}": v for k, v in last_validation.items()})
      writer.write(row)
      elapsed = time.perf_counter() - session_start
      done = round_num - start_round
      eta = elapsed / done * (config.total_rounds - round_num)
      message = (f"round {round_num}/{config.total_rounds} loss {row['train_loss']:.4f} "
                 f"{round_seconds:.2f}s ETA {_format_seconds(eta)}")
      if skipped or zeroed:
        message += f" (empty skipped {skipped}, zeroed updates {zeroed})"
      if "validation_accuracy_no_oov_no_eos" in row:
        message += f" val_acc {row['validation_accuracy_no_oov_no_eos']:.4f}"
      if config.progress:
        log(message)
      if diverged:
        log(f"round {round_num}: model weights are no longer finite; stopping (diverged)")
        break
      if round_num % config.rounds_per_checkpoint == 0 or round_num == config.total_rounds:
        meta["wall_seconds"] = wall_before + time.perf_counter() - session_start
        checkpointer.save(state, meta)
  finally:
    writer.close()

  weights = model_weights_of(state)
  finished = meta["round"] == config.total_rounds and not diverged
  if diverged:
    validation = test = {k: None for k in METRIC_KEYS}
  else:
    validation = evaluate(weights, task.validation)
    test = evaluate(weights, task.test)
    np.savez(os.path.join(experiment_dir, FINAL_MODEL_FILE),
             *[np.asarray(w) for w in weights.trainable])
  wall_seconds = wall_before + time.perf_counter() - session_start
  public_info = {k: v for k, v in mechanism_info.items()
                 if isinstance(v, (str, int, float, bool)) and "seed" not in k}
  summary = {
      "config": config.public_dict(),
      "mechanism": config.mechanism,
      "noise_multiplier": noise_multiplier,
      "epsilon": eps,
      "delta": config.delta if config.mechanism != "none" else None,
      "accountant": config.accountant if config.mechanism != "none" else None,
      "private": config.mechanism != "none",
      "total_rounds": config.total_rounds,
      "rounds_completed": meta["round"],
      "finished": finished,
      "diverged": diverged,
      "wall_seconds": wall_seconds,
      "validation_metrics": {k: _finite_or_none(v) for k, v in validation.items()},
      "test_metrics": {k: _finite_or_none(v) for k, v in test.items()},
      "sqrt_loss": sqrt_loss,
      "empty_clients_skipped": meta["empty_clients_skipped"],
      "zeroed_client_updates": meta["zeroed_client_updates"],
      "num_train_clients": len(task.train_client_ids),
      "clients_used": sampler.cursor,
      "mechanism_info": public_info,
  }
  _write_json(os.path.join(experiment_dir, SUMMARY_FILE), summary)
  log(f"{config.mechanism}: {meta['round']}/{config.total_rounds} rounds, "
      f"eps={'inf' if eps is None else f'{eps:.3g}'}, test accuracy (no OOV/EOS) "
      f"{test['accuracy_no_oov_no_eos']}, {wall_seconds:.1f}s -> "
      f"{os.path.join(experiment_dir, SUMMARY_FILE)}")
  return summary
