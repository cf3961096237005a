"""End-to-end training runs on the tiny StackOverflow fixture (real on-disk format).

Each mechanism flag of training/run_stackoverflow.py trains two single-pass
rounds through the real loading path (stackoverflow.fixtures →
stackoverflow.data → preprocessing → TFF FedAvg with our aggregator) and must
produce the summary schema, metrics.csv, a finite model and an ε that equals
the accounting module's (Denisov et al. Thm 4.1: one Gaussian mechanism).
"""

import csv
import json
import math
import os

import numpy as np
import pytest

from stackoverflow import fixtures
from training import train_lib

PINNED_NOISE_SEED = 987654321012
Z = 0.8


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
  return fixtures.write_tiny_stackoverflow(str(tmp_path_factory.mktemp("tiny_so")),
                                          num_train_clients=48, num_empty_train_clients=12)


def base_config(tiny_dir, root, **kw):
  values = dict(dataset="stackoverflow", data_dir=tiny_dir, total_rounds=2, clients_per_round=3,
                noise_multiplier=Z, vocab_size=100, embedding_size=8, lstm_size=8,
                projection_size=8, rounds_per_eval=1, rounds_per_checkpoint=1,
                max_validation_elements=64, max_test_elements=64, root_output_dir=str(root),
                matrix_cache=str(root / "matrix_cache"), progress=False)
  values.update(kw)
  return train_lib.TrainingConfig(**values)


@pytest.fixture(scope="module")
def task(tiny_dir, tmp_path_factory):
  return train_lib.build_task(base_config(tiny_dir, tmp_path_factory.mktemp("task")))


def empty_client_ids(task):
  return {c for c in task.train_client_ids
          if next(iter(task.train.create_tf_dataset_for_client(c)), None) is None}


def expected_skips(task, seed, rounds, clients_per_round):
  empties = empty_client_ids(task)
  sampler = train_lib.SinglePassSampler(task.train_client_ids, seed)
  total = 0
  for _ in range(rounds):
    _, _, skipped = sampler.next_round(clients_per_round,
                                       lambda c: None if c in empties else c)
    total += skipped
  return total, sampler.cursor


@pytest.mark.parametrize("mechanism", train_lib.MECHANISM_FLAGS)
def test_end_to_end(mechanism, tiny_dir, task, tmp_path):
  private = mechanism != "none"
  config = base_config(tiny_dir, tmp_path, mechanism=mechanism, experiment_name=mechanism,
                       noise_multiplier=Z if private else None,
                       noise_seed=PINNED_NOISE_SEED if mechanism not in
                       train_lib.SEEDLESS_MECHANISMS else None)
  summary = train_lib.run_training(config, task=task)
  run_dir = tmp_path / mechanism
  on_disk = json.loads((run_dir / train_lib.SUMMARY_FILE).read_text())
  assert on_disk == json.loads(json.dumps(summary))
  for key in ("config", "mechanism", "noise_multiplier", "epsilon", "delta", "accountant",
              "total_rounds", "rounds_completed", "finished", "diverged", "wall_seconds",
              "validation_metrics", "test_metrics", "sqrt_loss"):
    assert key in summary, key
  assert summary["finished"] and not summary["diverged"]
  assert summary["rounds_completed"] == summary["total_rounds"] == 2
  assert summary["config"]["mechanism"] == mechanism
  assert summary["config"]["clients_per_round"] == 3
  if private:
    from tff_mf import accounting
    assert summary["noise_multiplier"] == Z
    assert summary["epsilon"] == pytest.approx(accounting.epsilon(Z, 1e-6))
    assert summary["epsilon"] > 0
  else:
    assert summary["epsilon"] is None and summary["noise_multiplier"] is None
  if mechanism in ("tree", "honaker_full", "opt_prefix_sum", "opt_momentum", "structured",
                   "gaussian"):
    assert summary["sqrt_loss"] > 0 and math.isfinite(summary["sqrt_loss"])
  for split in ("validation_metrics", "test_metrics"):
    metrics = summary[split]
    assert set(metrics) == set(train_lib.METRIC_KEYS)
    assert metrics["loss"] > 0 and math.isfinite(metrics["loss"])
    for key in train_lib.METRIC_KEYS[1:]:
      assert 0.0 <= metrics[key] <= 1.0
  with open(run_dir / train_lib.METRICS_FILE, newline="") as f:
    rows = list(csv.DictReader(f))
  assert [int(r["round"]) for r in rows] == [1, 2]
  assert all(math.isfinite(float(r["train_loss"])) for r in rows)
  assert all(r["validation_accuracy_no_oov_no_eos"] != "" for r in rows)
  assert all(int(r["clients"]) == 3 for r in rows)
  expected, cursor = expected_skips(task, config.seed, 2, 3)
  assert summary["empty_clients_skipped"] == expected
  assert summary["clients_used"] == cursor
  with np.load(run_dir / train_lib.FINAL_MODEL_FILE) as weights:
    assert all(np.all(np.isfinite(weights[k])) for k in weights.files)
  # The noise seed is kept only in the checkpoint, never in the readable outputs.
  for name in (train_lib.SUMMARY_FILE, train_lib.CONFIG_FILE):
    assert str(PINNED_NOISE_SEED) not in (run_dir / name).read_text()
  assert os.listdir(run_dir / "tensorboard")


def test_empty_clients_are_skipped_and_counted(tiny_dir, task, tmp_path):
  empties = empty_client_ids(task)
  assert len(empties) == 12
  seed = next(s for s in range(100) if expected_skips(task, s, 2, 4)[0] >= 2)
  expected, cursor = expected_skips(task, seed, 2, 4)
  config = base_config(tiny_dir, tmp_path, mechanism="none", noise_multiplier=None, seed=seed,
                       clients_per_round=4, experiment_name="empty")
  summary = train_lib.run_training(config, task=task)
  assert summary["empty_clients_skipped"] == expected >= 2
  assert summary["clients_used"] == cursor == 8 + expected
  with open(tmp_path / "empty" / train_lib.METRICS_FILE, newline="") as f:
    rows = list(csv.DictReader(f))
  assert sum(int(r["empty_clients_skipped"]) for r in rows) == expected
  assert all(int(r["clients"]) == 4 for r in rows)
  assert summary["finished"]
