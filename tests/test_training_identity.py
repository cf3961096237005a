"""A resumed or repeated run is one mechanism (training.identity).

* The encoder C and the schema are fixed at the run's start: a cache entry replaced
  by another valid C between a kill and a resume (in the run's cache or another
  --cache_dir) is refused, naming both fingerprints.
* Replays release nothing new: gaussian, TFF's tree and an MF mechanism, killed
  before the first checkpoint and between checkpoints, replay the logged rounds bit
  for bit (seeds from the run directory), and TensorBoard keeps one version of each.
* Provenance: a pinned seed, resumed without the flag, is still labelled pinned.
* A fixed-epoch run with too few non-empty clients is refused before round 1.

A "kill" here is an exception raised by the round callback right after a round is
logged: what is on disk is what a SIGKILL at that point leaves.
"""

import csv
import glob
import json
import os

import numpy as np
import pytest

from stackoverflow import fixtures
from tff_mf import cache
from tff_mf import factorization as fz
from tff_mf import participation
from tff_mf import strategies
from tff_mf import workloads
from training import config as config_lib
from training import identity
from training import loop
from training import outputs
from training.config import TrainingError


class Killed(Exception):
  pass


def tiny(root, **kw):
  values = dict(dataset="synthetic", total_rounds=4, clients_per_round=2, vocab_size=100,
                embedding_size=8, lstm_size=8, projection_size=8, max_validation_elements=8,
                max_test_elements=8, root_output_dir=str(root), experiment_name="run",
                progress=False, noise_multiplier=1.0, rounds_per_checkpoint=2,
                rounds_per_eval=1, cache_dir=str(root / "cache"))
  values.update(kw)
  return config_lib.TrainingConfig(**values)


def run_until(config, kill_after=None):
  def callback(round_num):
    if round_num == kill_after:
      raise Killed()
  if kill_after is None:
    return loop.run_training(config)
  with pytest.raises(Killed):
    loop.run_training(config, round_callback=callback)
  return None


def metric_rows(run_dir):
  """{round: row without its timing} of metrics.csv."""
  with open(os.path.join(run_dir, outputs.METRICS_FILE), newline="") as f:
    return {int(r["round"]): {k: v for k, v in r.items() if k != "round_seconds"}
            for r in csv.DictReader(f)}


def tensorboard_steps(run_dir, tag="validation/loss"):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  steps = []
  for path in glob.glob(os.path.join(run_dir, outputs.TENSORBOARD_DIR, "*tfevents*")):
    for event in tf.compat.v1.train.summary_iterator(path):
      steps += [event.step for v in event.summary.value if v.tag == tag]
  return sorted(steps)


@pytest.mark.parametrize("mechanism,first_seed", [
    pytest.param("gaussian", None, marks=pytest.mark.slow), ("opt_prefix_sum", None),
    pytest.param("tree", 5, marks=pytest.mark.slow)])
def test_killed_runs_replay_their_logged_rounds_bit_for_bit(tmp_path, mechanism, first_seed):
  config = tiny(tmp_path, mechanism=mechanism, noise_seed=first_seed)
  resumed = tiny(tmp_path, mechanism=mechanism)  # a pinned seed is not repeated on resume
  run_dir = config.run_dir
  run_until(config, kill_after=1)  # before the first checkpoint (round 2)
  first = metric_rows(run_dir)
  run_until(resumed, kill_after=3)  # between the checkpoints of rounds 2 and 4
  second = metric_rows(run_dir)
  summary = run_until(resumed)
  final = metric_rows(run_dir)
  assert sorted(first) == [1] and sorted(second) == [1, 2, 3] and sorted(final) == [1, 2, 3, 4]
  assert final[1] == first[1] == second[1]
  for r in (2, 3):
    assert final[r] == second[r], r
  assert tensorboard_steps(run_dir) == [1, 2, 3, 4]  # one version of each round
  with open(os.path.join(run_dir, identity.RELEASES_FILE)) as f:
    assert [json.loads(line)["round"] for line in f] == [1, 2, 3, 4]
  path = os.path.join(run_dir, identity.IDENTITY_FILE)
  assert oct(os.stat(path).st_mode & 0o777) == "0o600"
  with open(path) as f:
    recorded = json.load(f)
  source = "pinned" if first_seed is not None else "os_entropy"
  assert recorded["seed_source"] == source
  assert summary["config"]["noise_seed"] == source
  assert summary["privacy"]["noise_seed_source"] == source
  assert ("warning" in summary["privacy"]) == (first_seed is not None)


def test_a_replaced_encoder_is_refused_on_resume(tmp_path):
  config = tiny(tmp_path, mechanism="opt_prefix_sum", rounds_per_eval=10)
  run_until(config, kill_after=3)
  [entry] = glob.glob(str(tmp_path / "cache" / "optimal-*"))
  with open(os.path.join(entry, cache.METADATA_FILE)) as f:
    params = json.load(f)["params"]
  original = cache.load(glob.glob(os.path.join(entry, "*.npz"))[0])
  # Another valid C for the same A (C = I, B = S) under the same key: passes every load check.
  a = original.a
  other = fz.Factorization(a=a, b=a.copy(), c=np.eye(4), strategy="optimal", info={},
                           extras={})
  other.info.update(strategies.error_figures(other, participation.SINGLE))
  spec = strategies.FactorizationSpec(workload=workloads.WorkloadSpec(
      "prefix_sum", 4))
  elsewhere = tmp_path / "other_cache"
  cache._write_entry(str(elsewhere / os.path.basename(entry)), params, spec, other)  # pylint: disable=protected-access
  saved_dir = str(tmp_path / "saved_entry")
  os.rename(entry, saved_dir)
  cache._write_entry(entry, params, spec, other)  # pylint: disable=protected-access
  assert np.array_equal(cache.load(glob.glob(os.path.join(entry, "*.npz"))[0]).c, np.eye(4))
  before = metric_rows(config.run_dir)
  old = identity.encoder_sha256(original.c)
  new = identity.encoder_sha256(np.eye(4))
  for cache_dir in (str(tmp_path / "cache"), str(elsewhere)):
    with pytest.raises(TrainingError) as e:
      run_until(tiny(tmp_path, mechanism="opt_prefix_sum", rounds_per_eval=10,
                     cache_dir=cache_dir))
    message = str(e.value)
    assert "\n" not in message and old in message and new in message, message
    assert metric_rows(config.run_dir) == before  # nothing lost, nothing added
  # The original entry back: the run resumes and finishes.
  os.rename(entry, str(tmp_path / "bad_entry"))
  os.rename(saved_dir, entry)
  assert run_until(config)["finished"]


def test_fixed_epoch_with_too_few_nonempty_clients_is_refused_before_round_1(tmp_path):
  data_dir = fixtures.write_tiny_stackoverflow(str(tmp_path / "so"), num_train_clients=10,
                                               num_empty_train_clients=10)
  config = tiny(tmp_path, mechanism="opt_prefix_sum", dataset="stackoverflow",
                data_dir=data_dir, total_rounds=4, clients_per_round=6,
                participation="fixed_epoch", epochs=2)
  with pytest.raises(TrainingError, match="before round 1: too few non-empty clients"):
    run_until(config)
  assert not metric_rows(config.run_dir)
  assert not os.path.exists(os.path.join(config.run_dir, identity.RELEASES_FILE))
