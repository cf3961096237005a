"""The training binary with --clip_norm=adaptive: the clip norm per round, and an ε that covers
the MF noise and the quantile estimator's count queries (tff_mf.adaptive_clipping)."""

import csv
import json
import math

import dp_accounting
import pytest

from training import config as config_lib
from training import loop
from training import outputs
from training.config import TrainingError


def tiny_config(root, **kw):
  values = dict(mechanism="blt", dataset="synthetic", total_rounds=4, clients_per_round=4,
                vocab_size=50, embedding_size=4, lstm_size=4, projection_size=4,
                max_validation_elements=16, max_test_elements=16, root_output_dir=str(root),
                experiment_name="run", progress=False, rounds_per_eval=4,
                participation="fixed_epoch", epochs=2, target_epsilon=8.0,
                clip_norm="adaptive", initial_clip_norm=0.05, clip_learning_rate=0.5,
                clipped_count_stddev=2.0)
  values.update(kw)
  return config_lib.TrainingConfig(**values)


# Slow: adaptive clipping trains inside TFF FedAvg (tests/test_adaptive_clipping.py) and the
# run's composed record is the library's (tests/test_training_privacy.py) in the default suite.
@pytest.mark.slow
def test_adaptive_run_records_the_clip_and_an_epsilon_for_both_parts(tmp_path):
  summary = loop.run_training(tiny_config(tmp_path))
  privacy = summary["privacy"]
  assert privacy["analysis"] == "adaptive"
  assert privacy["epsilon"] <= 8.0
  assert privacy["count_participations"] == 2 and privacy["clipped_count_stddev"] == 2.0
  # Independently: the PLD of the two Gaussians (MF at z/sens, count at σ_b/(½·√k)).
  z, sens = summary["noise_multiplier"], privacy["sensitivity"]
  acc = dp_accounting.pld.PLDAccountant(value_discretization_interval=1e-4)
  acc.compose(dp_accounting.GaussianDpEvent(z / sens))
  acc.compose(dp_accounting.GaussianDpEvent(2.0 / (0.5 * math.sqrt(2))))
  assert privacy["epsilon"] <= acc.get_epsilon(1e-6) * (1 + 1e-9)
  assert privacy["epsilon"] >= acc.get_epsilon(1e-6) - 1e-2
  # The run's own DpEvents compose to the same ε.
  assert privacy["dp_event_cross_check"]["epsilon"] == pytest.approx(privacy["epsilon"], rel=1e-3)
  with open(tmp_path / "run" / outputs.METRICS_FILE, newline="") as f:
    rows = list(csv.DictReader(f))
  clips = [float(r["next_clip_norm"]) for r in rows]
  assert len(clips) == 4 and all(c > 0 for c in clips) and len(set(clips)) > 1
  assert json.loads((tmp_path / "run" / outputs.SUMMARY_FILE).read_text())["config"][
      "clip_norm"] == "adaptive"


def test_quantile_flags_need_adaptive_clipping(tmp_path):
  with pytest.raises(TrainingError, match="--target_quantile goes with --clip_norm=adaptive"):
    tiny_config(tmp_path, clip_norm=1.0, target_quantile=0.9).validate()
  with pytest.raises(TrainingError, match="needs a private --mechanism"):
    tiny_config(tmp_path, mechanism="none", target_epsilon=None).validate()
