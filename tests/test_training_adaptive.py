"""The training binary with --clip_norm=adaptive: the clip norm per round, and an ε that covers
the MF noise and the quantile estimator's count queries (tff_mf.accounting.adaptive_clipping)."""

import csv
import json
import math

import dp_accounting
import pytest

from training import loop
from training import outputs
from training.config import TrainingError


@pytest.fixture(name="configs", scope="module")
def _configs(tiny_config):
  return tiny_config.using(mechanism="blt", total_rounds=4, clients_per_round=4,
                           experiment_name="run", rounds_per_eval=4, participation="fixed_epoch",
                           epochs=2, target_epsilon=8.0, clip_norm="adaptive",
                           initial_clip_norm=0.05, clip_learning_rate=0.5,
                           clipped_count_stddev=2.0)


# Slow: adaptive clipping trains inside TFF FedAvg (tests/test_adaptive_clipping.py) and the
# run's composed record is the library's (tests/test_training_privacy.py) in the default suite.
@pytest.mark.slow
def test_adaptive_run_records_the_clip_and_an_epsilon_for_both_parts(configs, tmp_path):
  summary = loop.run_training(configs(tmp_path))
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


def test_quantile_flags_need_adaptive_clipping(configs, tmp_path):
  with pytest.raises(TrainingError,
                     match="--target_quantile, .* go with --clip_norm='adaptive' only"):
    configs(tmp_path, clip_norm=1.0, target_quantile=0.9).validate()
  with pytest.raises(TrainingError, match="--mechanism=none adds no noise and clips nothing"):
    configs(tmp_path, mechanism="none", target_epsilon=None).validate()
