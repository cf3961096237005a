"""NaN clients, single-pass sampling limits, flag validation and clean errors of the loop."""

import collections
import csv
import os
import subprocess
import sys

import numpy as np
import pytest

import userenv
from training import checkpoints
from training import config as config_lib
from training import run_setup
from training import sampling
from training.config import TrainingError

REPO = userenv.REPO
POISON_TOKEN = 7  # a batch whose targets are all this id trains to NaN (see poisoned_model_fn)
VOCAB = 20
SEQ = 5


def poisoned_model_fn():
  """The project's LSTM whose loss is multiplied by NaN on an all-POISON_TOKEN batch."""
  import tensorflow as tf
  import tensorflow_federated as tff
  from stackoverflow import metrics as so_metrics
  from stackoverflow import model as so_model
  from stackoverflow import preprocessing

  class PoisonedLoss(so_metrics.MaskedSparseCategoricalCrossentropy):

    def __call__(self, y_true, y_pred, sample_weight=None):
      loss = super().__call__(y_true, y_pred, sample_weight)
      poisoned = tf.reduce_all(tf.equal(tf.cast(y_true, tf.int64), POISON_TOKEN))
      return loss * tf.where(poisoned, tf.constant(np.nan, tf.float32), 1.0)

  def model_fn():
    keras_model = so_model.create_keras_model(vocab_size=VOCAB, embedding_size=4, lstm_size=4,
                                              projection_size=4, seed=1)
    return tff.learning.models.from_keras_model(
        keras_model, loss=PoisonedLoss(), input_spec=preprocessing.batch_spec(SEQ),
        metrics=so_metrics.build_metrics(VOCAB, 1))

  return model_fn


def client_dataset(rng, poisoned=False, empty=False):
  import tensorflow as tf
  if poisoned:
    x = np.full((4, SEQ), 3, np.int64)
    y = np.full((4, SEQ), POISON_TOKEN, np.int64)
  else:
    x = rng.integers(1, VOCAB, size=(4, SEQ)).astype(np.int64)
    y = rng.integers(1, VOCAB, size=(4, SEQ)).astype(np.int64)
  ds = tf.data.Dataset.from_tensors((x, y))
  return ds.take(0) if empty else ds


@pytest.mark.parametrize("mechanism", ["opt_prefix_sum"])
def test_nan_client_update_is_zeroed_before_clipping_and_counted(mechanism):
  import tensorflow_federated as tff
  from tff_mf.tf import runtime
  runtime.install_exit_hook()
  config = config_lib.TrainingConfig(mechanism=mechanism, total_rounds=4, clients_per_round=3,
                                     noise_multiplier=0.5, noise_seed=11, client_lr=0.5)
  setup = run_setup.build_run_setup(config, 11)
  process = run_setup.build_process(poisoned_model_fn(), setup, config.client_lr)
  state = process.initialize()
  rng = np.random.default_rng(0)
  c1, c2 = client_dataset(rng), client_dataset(rng)
  poisoned = client_dataset(rng, poisoned=True)
  empty = client_dataset(rng, empty=True)

  out_poisoned = process.next(state, [c1, poisoned, c2])
  out_zero = process.next(state, [c1, empty, c2])  # same state: same noise row, same round
  assert out_poisoned.metrics["aggregator"]["zeroed_client_updates"] == 1
  w_poisoned = process.get_model_weights(out_poisoned.state).trainable
  w_zero = process.get_model_weights(out_zero.state).trainable
  w_start = process.get_model_weights(state).trainable
  for a, b, s in zip(w_poisoned, w_zero, w_start):
    assert np.all(np.isfinite(a))
    # The poisoned client contributes exactly what a zero update contributes.
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
  assert any(not np.allclose(a, s) for a, s in zip(w_poisoned, w_start))
  # The next round goes on from a finite model.
  out_next = process.next(out_poisoned.state, [client_dataset(rng), client_dataset(rng),
                                               client_dataset(rng, poisoned=True)])
  assert out_next.metrics["aggregator"]["zeroed_client_updates"] == 1
  assert all(np.all(np.isfinite(w)) for w in process.get_model_weights(out_next.state).trainable)


def test_zeroing_factory_on_raw_values():
  """NaN/Inf client values are replaced by zeros before the inner aggregator sees them."""
  import tensorflow_federated as tff
  from tff_mf.tf import clipping as tf_clipping
  factory = tf_clipping.NonFiniteZeroingFactory(tff.aggregators.UnweightedMeanFactory())
  value_type = tff.to_type(collections.OrderedDict(a=tff.TensorType(np.float32, [2]),
                                                   b=tff.TensorType(np.float32, [])))
  process = factory.create(value_type)
  values = [collections.OrderedDict(a=np.array([1.0, 2.0], np.float32), b=np.float32(1.0)),
            collections.OrderedDict(a=np.array([np.nan, 2.0], np.float32), b=np.float32(5.0)),
            collections.OrderedDict(a=np.array([3.0, 4.0], np.float32), b=np.float32(np.inf)),
            collections.OrderedDict(a=np.array([2.0, 0.0], np.float32), b=np.float32(2.0))]
  out = process.next(process.initialize(), values)
  assert out.measurements["zeroed_client_updates"] == 2
  np.testing.assert_allclose(out.result["a"], [3.0 / 4, 2.0 / 4])
  np.testing.assert_allclose(out.result["b"], 3.0 / 4)
  with pytest.raises(TypeError, match="UnweightedAggregationFactory"):
    tf_clipping.NonFiniteZeroingFactory(object())


def test_too_few_clients_fails_with_the_numbers():
  with pytest.raises(TrainingError, match=r"48 training clients.*--total_rounds=10 × "
                     r"--clients_per_round=5 = 50"):
    sampling.check_enough_clients(48, 10, 5)
  sampling.check_enough_clients(50, 10, 5)
  sampler = sampling.SinglePassSampler(["a", "b", "c"], seed=0, clients_per_round=2)
  sampler.next_round(1, lambda c: c)
  with pytest.raises(TrainingError, match="ran out of clients"):
    sampler.next_round(2, lambda c: c)


def test_single_pass_sampler_is_a_seeded_permutation_and_resumable():
  ids = [f"c{i:03d}" for i in range(100)]
  a = sampling.SinglePassSampler(ids, seed=3, clients_per_round=10)
  rounds = [a.next_round(t, lambda c: c)[0] for t in range(1, 11)]
  flat = [c for r in rounds for c in r]
  assert sorted(flat) == sorted(ids)  # each client exactly once
  assert flat != sorted(ids)
  b = sampling.SinglePassSampler(list(reversed(ids)), seed=3, clients_per_round=10)
  b.restore({"cursor": [40]})
  assert b.next_round(5, lambda c: c)[0] == rounds[4]  # resumes in the same order
  other = sampling.SinglePassSampler(ids, seed=4, clients_per_round=10)
  assert other.next_round(1, lambda c: c)[0] != rounds[0]


@pytest.mark.parametrize("kwargs, message", [
    (dict(mechanism="none", noise_multiplier=1.0), "without privacy"),
    (dict(mechanism="tree", noise_multiplier=1.0, target_epsilon=4.0), "exactly one"),
    (dict(mechanism="tree"), "exactly one"),
    (dict(mechanism="tree", noise_multiplier=-1.0), "noise_multiplier"),
    (dict(mechanism="tree", noise_multiplier=1.0, lr_schedule="cooldown"), "schedule_rounds"),
    (dict(mechanism="tree", noise_multiplier=1.0, schedule_rounds=5),
     "--schedule_rounds goes with --lr_schedule"),
    (dict(mechanism="tree", noise_multiplier=1.0, server_momentum=1.0), "server_momentum"),
    (dict(mechanism="dp_sgd", noise_multiplier=1.0), "mechanism"),
    (dict(mechanism="tree", noise_multiplier=1.0, clients_per_round=0), "clients_per_round"),
    (dict(mechanism="tree_restart", noise_multiplier=1.0), "not a trainable mechanism"),
    (dict(mechanism="tree", noise_multiplier=1.0, total_rounds=2.0), "total_rounds"),
    (dict(mechanism="tree", noise_multiplier=1.0, experiment_name=".."), "--experiment_name"),
    (dict(mechanism="tree", noise_multiplier=1.0, experiment_name="a/b"), "--experiment_name"),
    (dict(mechanism="tree", noise_multiplier=1.0, experiment_name=""), "--experiment_name"),
    (dict(mechanism="tree", noise_multiplier=1.0, experiment_name="."), "--experiment_name"),
])
def test_conflicting_or_bad_flags_are_errors(kwargs, message):
  with pytest.raises(TrainingError, match=message):
    config_lib.TrainingConfig(**kwargs).validate()


@pytest.mark.parametrize("kwargs, seed, message", [
    (dict(mechanism="opt_prefix_sum", bands=2, rank=1), 0,
     "--bands does not apply to --mechanism=opt_prefix_sum"),
    (dict(mechanism="gaussian", buffers=2), 5, "--buffers does not apply to --mechanism=gaussian"),
])
def test_mechanism_conflicts_from_build_mechanism_become_errors(kwargs, seed, message):
  config = config_lib.TrainingConfig(noise_multiplier=1.0, total_rounds=8, **kwargs)
  with pytest.raises(TrainingError, match=message):
    run_setup.build_run_setup(config, seed)


def test_checkpoint_of_another_state_layout_is_a_clear_error_and_kept(tmp_path):
  """A checkpoint whose arrays differ from this run's state (another tff-mf version, model
  or mechanism: e.g. StructuredNoise's buffers) is refused by name, not loaded with the
  wrong shapes, and its files stay."""
  ckpt = checkpoints.Checkpointer(str(tmp_path / "checkpoints"))
  written = collections.OrderedDict(
      model=np.zeros([3, 2], np.float32),
      buffers=(np.ones([4], np.float32), np.ones([4], np.float32)))
  ckpt.save(written, checkpoints.RunProgress(round=5, cursor=10, noise_seed=1, wall_seconds=1.0))
  files = sorted(os.listdir(tmp_path / "checkpoints"))
  loaded = ckpt.load_state(5, written)
  np.testing.assert_array_equal(loaded["buffers"][1], written["buffers"][1])
  other_shape = collections.OrderedDict(
      model=np.zeros([3, 2], np.float32),
      buffers=(np.ones([4], np.float32), np.ones([6], np.float32)))
  with pytest.raises(TrainingError,
                     match=r"checkpoint_5 .*state entry buffers/1 is float32\[4\] in the "
                     r"checkpoint but float32\[6\] in this run"):
    ckpt.load_state(5, other_shape)
  other_dtype = collections.OrderedDict(
      model=np.zeros([3, 2], np.float64), buffers=written["buffers"])
  with pytest.raises(TrainingError, match=r"state entry model is float32"):
    ckpt.load_state(5, other_dtype)
  other_nesting = collections.OrderedDict(
      model=np.zeros([3, 2], np.float32), buffers=(np.ones([4], np.float32),) * 3)
  with pytest.raises(TrainingError, match="does not have this run's state structure"):
    ckpt.load_state(5, other_nesting)
  assert sorted(os.listdir(tmp_path / "checkpoints")) == files
  assert ckpt.latest().round == 5


def test_binary_exits_nonzero_on_conflicting_flags(tmp_path):
  result = subprocess.run(
      [sys.executable, os.path.join(REPO, "training", "run_stackoverflow.py"),
       "--mechanism=none", "--noise_multiplier=1.0", f"--root_output_dir={tmp_path / 'runs'}"],
      capture_output=True, text=True, timeout=120, cwd=REPO, env=userenv.env())
  assert result.returncode == 2  # a usage error
  assert result.stderr.strip().splitlines() == [
      "error: --mechanism=none adds no noise (it trains without privacy); it takes neither "
      "--noise_multiplier (got 1.0) nor --target_epsilon (got None)"]
  assert not (tmp_path / "runs").exists()


# Slow: the query's error past its n rounds is tested in-process (tests/test_query_noise.py,
# tests/test_query_federated.py); this is the same error through the training loop.
@pytest.mark.slow
def test_running_past_the_matrix_rounds_is_the_querys_one_line_error(tiny_config,
                                                                      tiny_stackoverflow,
                                                                      tmp_path, monkeypatch):
  """A mechanism built for n = 2 rounds in a 3-round run: round 3 fails with the query's own
  message (not a gRPC dump), and rounds 1-2 (metrics.csv rows, checkpoint) stay."""
  import dataclasses
  from training import loop
  data_dir = tiny_stackoverflow(num_train_clients=12)
  build = run_setup.build_run_setup

  def built_for_fewer_rounds(config, noise_seed):
    return build(dataclasses.replace(config, total_rounds=config.total_rounds - 1), noise_seed)

  monkeypatch.setattr(run_setup, "build_run_setup", built_for_fewer_rounds)
  config = tiny_config(
      tmp_path / "runs", mechanism="opt_prefix_sum", dataset="stackoverflow", data_dir=data_dir,
      total_rounds=3, clients_per_round=2, noise_multiplier=1.0, noise_seed=5,
      rounds_per_eval=100, rounds_per_checkpoint=1, experiment_name="past_n",
      cache_dir=str(tmp_path / "cache"))
  with pytest.raises(TrainingError) as error:
    loop.run_training(config)
  message = str(error.value)
  assert message.startswith("round 3: DenseNoise(n=2, m=2, nnz=3): round index")
  assert "past the n=2 rounds" in message and "\n" not in message
  assert "grpc" not in message.lower() and "Traceback" not in message
  run_dir = tmp_path / "runs" / "past_n"
  with open(run_dir / "metrics.csv", newline="") as f:
    assert [r["round"] for r in csv.DictReader(f)] == ["1", "2"]
  assert checkpoints.Checkpointer(str(run_dir / "checkpoints")).latest().round == 2


def test_tff_tree_run_resumes_with_its_grown_level_buffer(tiny_config, tiny_stackoverflow,
                                                          tmp_path, capfd):
  """TFF's tree_aggregation keeps one node per completed level, so its state after round 2
  has another leading dimension than the initial state; rerunning the command resumes from
  that checkpoint (it used to be refused as "a different tff-mf version") and keeps the model."""
  from training import loop
  from training import outputs
  data_dir = tiny_stackoverflow(num_train_clients=12)
  config = tiny_config(
      tmp_path / "runs", mechanism="tree", dataset="stackoverflow", data_dir=data_dir,
      total_rounds=2, clients_per_round=2, noise_multiplier=1.0, rounds_per_eval=100,
      rounds_per_checkpoint=1, experiment_name="tree", cache_dir=str(tmp_path / "cache"))
  assert loop.run_training(config)["finished"]
  run_dir = tmp_path / "runs" / "tree"
  with np.load(run_dir / outputs.FINAL_MODEL_FILE) as f:
    first = {k: f[k] for k in f.files}
  capfd.readouterr()
  assert loop.run_training(config)["finished"]
  assert "from round 2" in capfd.readouterr().err
  with np.load(run_dir / outputs.FINAL_MODEL_FILE) as f:
    for key, value in first.items():
      np.testing.assert_array_equal(f[key], value)
