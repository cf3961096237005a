"""The main job end to end on the tiny StackOverflow fixture (slow: three TFF processes)."""

import json
import os

import pytest

from stackoverflow import fixtures
from training import main_job


@pytest.mark.slow
def test_main_job_writes_table_plot_and_results(tmp_path, capfd):
  data_dir = fixtures.write_tiny_stackoverflow(str(tmp_path / "so"), num_train_clients=30)
  code = main_job.run_main_job(
      str(tmp_path / "out"), str(tmp_path / "cache"), data_dir=data_dir, dataset="stackoverflow",
      total_rounds=3, clients_per_round=2, vocab_size=100, embedding_size=8, lstm_size=8,
      projection_size=8, rounds_per_eval=1, max_validation_elements=32, max_test_elements=32,
      progress=False)
  assert code == 0
  out = capfd.readouterr().out
  for mechanism in main_job.MAIN_JOB_MECHANISMS:
    assert f"| {mechanism} |" in out
  results = json.loads((tmp_path / "out" / "results.json").read_text())
  rows = {r["mechanism"]: r for r in results["results"]}
  assert set(rows) == set(main_job.MAIN_JOB_MECHANISMS)
  # Same ε for every mechanism (one calibrated noise multiplier), √L from each factorization.
  assert len({r["epsilon"] for r in rows.values()}) == 1
  assert rows["tree"]["epsilon"] <= main_job.MAIN_JOB_DEFAULTS["target_epsilon"]
  assert rows["opt_momentum"]["sqrt_loss"] <= rows["tree"]["sqrt_loss"]
  assert os.path.getsize(tmp_path / "out" / "accuracy.png") > 0
  assert "| tree |" in (tmp_path / "out" / "results.md").read_text()
