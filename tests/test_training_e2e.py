"""End-to-end training runs on the tiny StackOverflow fixture (real on-disk format).

Each buildable trainable mechanism of tff_mf.registry trains two single-pass
rounds through the real loading path (stackoverflow.fixtures →
stackoverflow.data → preprocessing → TFF FedAvg with our aggregator) and must
produce the summary schema, metrics.csv, a finite model and the ε of one
Gaussian mechanism at z (Denisov et al. 2022, arXiv:2202.08312, Thm 4.1), checked
against the analytic formula (tests/statcheck.py). That the noise itself is right
is checked by tests/test_training_noise.py.
"""

import csv
import json
import math
import os

import numpy as np
import pytest

from tff_mf import registry
from training import config as config_lib
from training import loop
from training import outputs
from training import sampling
from training import task as task_lib

import statcheck

PINNED_NOISE_SEED = 987654321012
Z = 0.8


@pytest.fixture(name="configs", scope="module")
def _configs(tiny_config, tiny_stackoverflow):
  tiny_dir = tiny_stackoverflow(num_train_clients=48, num_empty_train_clients=12)
  return tiny_config.using(dataset="stackoverflow", data_dir=tiny_dir, total_rounds=2,
                           clients_per_round=3, noise_multiplier=Z, vocab_size=100,
                           embedding_size=8, lstm_size=8, projection_size=8, rounds_per_eval=1,
                           rounds_per_checkpoint=1, max_validation_elements=64,
                           max_test_elements=64, cache_subdir="cache_dir")


@pytest.fixture(scope="module")
def task(configs, tiny_task, tmp_path_factory):
  return tiny_task(configs(tmp_path_factory.mktemp("task")))


def empty_client_ids(task):
  return {c for c in task.train_client_ids
          if next(iter(task.train.create_tf_dataset_for_client(c)), None) is None}


def expected_skips(task, seed, rounds, clients_per_round):
  empties = empty_client_ids(task)
  sampler = sampling.SinglePassSampler(task.train_client_ids, seed, clients_per_round)
  total = 0
  for t in range(1, rounds + 1):
    _, _, skipped = sampler.next_round(t, lambda c: None if c in empties else c)
    total += skipped
  return total, sampler.cursor


# Every trainable mechanism of the registry (a new one is covered without editing this list).
# The default suite trains one per noise path — TFF's tree, dense regeneration
# (opt_momentum), a linear stream (blt) and no DP — elsewhere; all of them are slow here.
# Every one of them is checked in the default suite in-process against numpy Algorithm 1
# (tests/test_query_federated.py).
MECHANISMS = registry.mechanism_names(trainable=True)
# none: test_nonprivate_train_metrics_...; tree: test_training_noise's run_training[tree]
# trains it and checks its noise, and test_training_robustness resumes it; opt_momentum:
# test_training_noise's clean-shell binary run trains it and checks its noise; blt (a linear
# stream): test_training_participation trains it under fixed epochs and test_adaptive_clipping
# inside TFF's FedAvg with adaptive clipping.
DEFAULT_SUITE = ()


def test_mechanism_flag_takes_the_registrys_trainable_spellings():
  spellings = config_lib.trainable_mechanisms()
  for name in registry.mechanism_names(trainable=True):
    assert name in spellings
    assert set(registry.mechanism(name).aliases) <= set(spellings)
  assert "tree_restart" not in spellings  # accounting only
  assert set(MECHANISMS) <= set(spellings)
  assert config_lib.canonical_mechanism("dp_ftrl") == "honaker_online"
  assert config_lib.canonical_mechanism("tree_aggregation") == "tree"
  assert config_lib.canonical_mechanism("gaussian_fixed") == "gaussian"


@pytest.mark.parametrize("mechanism", [
    m if m in DEFAULT_SUITE else pytest.param(m, marks=pytest.mark.slow) for m in MECHANISMS])
def test_end_to_end(mechanism, configs, task, tmp_path, capfd):
  private = mechanism != "none"
  config = configs(tmp_path, mechanism=mechanism, experiment_name=mechanism,
                   noise_multiplier=Z if private else None,
                   noise_seed=None if config_lib.is_seedless(mechanism)
                   else PINNED_NOISE_SEED)
  summary = loop.run_training(config, task=task)
  run_dir = tmp_path / mechanism
  on_disk = json.loads((run_dir / outputs.SUMMARY_FILE).read_text())
  assert on_disk == json.loads(json.dumps(summary))
  for key in ("config", "mechanism", "noise_multiplier", "epsilon", "delta", "accountant",
              "total_rounds", "rounds_completed", "finished", "diverged", "wall_seconds",
              "validation_metrics", "test_metrics", "single_participation_sqrt_loss"):
    assert key in summary, key
  assert summary["finished"] and not summary["diverged"]
  assert summary["rounds_completed"] == summary["total_rounds"] == 2
  assert summary["config"]["mechanism"] == mechanism
  assert summary["mechanism_label"] == registry.label(mechanism)
  assert summary["config"]["clients_per_round"] == 3
  if private:
    # The run is one Gaussian at z (normalized C; for the TFF tree z·√levels per node over
    # sensitivity √levels): PLD's ε is an upper bound within 1% of the analytic one.
    assert summary["noise_multiplier"] == Z
    exact = statcheck.gaussian_epsilon(Z, 1e-6)
    assert exact <= summary["epsilon"] <= 1.01 * exact
  else:
    assert summary["epsilon"] is None and summary["noise_multiplier"] is None
  if mechanism not in ("tree", "none"):
    assert summary["single_participation_sqrt_loss"] > 0 and math.isfinite(summary["single_participation_sqrt_loss"])
  for split in ("validation_metrics", "test_metrics"):
    metrics = summary[split]
    assert set(metrics) == set(task_lib.METRIC_KEYS)
    assert metrics["loss"] > 0 and math.isfinite(metrics["loss"])
    for key in task_lib.METRIC_KEYS[1:]:
      assert 0.0 <= metrics[key] <= 1.0
  with open(run_dir / outputs.METRICS_FILE, newline="") as f:
    rows = list(csv.DictReader(f))
  assert [int(r["round"]) for r in rows] == [1, 2]
  assert "train_loss" not in rows[0] and "nonprivate_train_loss" not in rows[0]
  assert all(r["validation_accuracy_no_oov_no_eos"] != "" for r in rows)
  assert all(int(r["clients"]) == 3 for r in rows)
  statement = summary["privacy_statement"]
  assert statement["text"] in capfd.readouterr().out  # printed at the end of the run
  if private:  # ε spent after each round: non-decreasing, the run's ε after the last
    per_round = [float(r["epsilon"]) for r in rows]
    assert per_round == sorted(per_round) and per_round[-1] == summary["epsilon"]
    assert statement["epsilon"] >= summary["epsilon"] and "client-level" in statement["unit"]
    assert statement["void"]  # the pinned noise seed
  else:
    assert "epsilon" not in rows[0] and statement["epsilon"] is None
  expected, cursor = expected_skips(task, config.seed, 2, 3)
  assert summary["empty_clients_skipped"] == expected
  assert summary["clients_used"] == cursor
  with np.load(run_dir / outputs.FINAL_MODEL_FILE) as weights:
    assert weights.files == task_lib.trainable_variable_names(task.keras_model_fn)
    assert all(np.all(np.isfinite(weights[k])) for k in weights.files)
  # The noise seed is kept only in the checkpoint, never in the readable outputs.
  for name in (outputs.SUMMARY_FILE, outputs.CONFIG_FILE):
    assert str(PINNED_NOISE_SEED) not in (run_dir / name).read_text()
  assert os.listdir(run_dir / "tensorboard")


# Slow: an empty round still adds its noise (tests/test_training_participation.py) and resumed
# runs count skipped clients alike (tests/test_training_resume.py) in the default suite.
@pytest.mark.slow
def test_empty_clients_are_skipped_and_counted(configs, task, tmp_path):
  empties = empty_client_ids(task)
  assert len(empties) == 12
  seed = next(s for s in range(100) if expected_skips(task, s, 2, 4)[0] >= 2)
  expected, cursor = expected_skips(task, seed, 2, 4)
  config = configs(tmp_path, mechanism="none", noise_multiplier=None, seed=seed,
                   clients_per_round=4, experiment_name="empty")
  summary = loop.run_training(config, task=task)
  assert summary["empty_clients_skipped"] == expected >= 2
  assert summary["clients_used"] == cursor == 8 + expected
  with open(tmp_path / "empty" / outputs.METRICS_FILE, newline="") as f:
    rows = list(csv.DictReader(f))
  assert sum(int(r["empty_clients_skipped"]) for r in rows) == expected
  assert all(int(r["clients"]) == 4 for r in rows)
  assert summary["finished"]


def test_nonprivate_train_metrics_are_labeled_when_reported(configs, task, tmp_path):
  config = configs(tmp_path, mechanism="opt_prefix_sum", experiment_name="train",
                   noise_seed=PINNED_NOISE_SEED, report_train_metrics=True)
  summary = loop.run_training(config, task=task)
  with open(tmp_path / "train" / outputs.METRICS_FILE, newline="") as f:
    rows = list(csv.DictReader(f))
  assert "train_loss" not in rows[0]
  assert all(math.isfinite(float(r["nonprivate_train_loss"])) for r in rows)
  assert set(summary["nonprivate_train_metrics"]) == {"nonprivate_train_loss",
                                                      "nonprivate_train_accuracy"}
  assert summary["nonprivate_train_metrics"]["nonprivate_train_loss"] == pytest.approx(
      float(rows[-1]["nonprivate_train_loss"]))
  assert any("not covered by epsilon" in note for note in summary["notes"])
  assert "train_loss" not in summary and "train_accuracy" not in summary
