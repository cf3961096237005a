"""The main job (``python -m training.main_job``, what ``make demo`` runs).

Fast: the √L table and plots from a clean shell. Slow: the training part end to end on
the tiny StackOverflow fixture (three TFF processes).
"""

import json
import os
import subprocess
import sys

import pytest

import userenv
from stackoverflow import fixtures
from training import main_job

REPO = userenv.REPO


def test_factorization_table_from_a_clean_shell(tmp_path):
  out = tmp_path / "out"
  result = subprocess.run(
      [sys.executable, "-m", "training.main_job", "--output_dir", str(out), "--cache_dir",
       str(tmp_path / "c"), "--n", "16", "--skip_training"],
      cwd=REPO, env=userenv.env(home=tmp_path), capture_output=True, text=True, timeout=300)
  assert result.returncode == 0, result.stderr[-3000:]
  table = (out / "sqrt_loss_table.md").read_text().strip()
  assert table in result.stdout
  for label in ("identity", "Honaker online", "Honaker full", "optimal", "(h=2, r=2)",
                "lower bound"):
    assert label in table
  rows = {line.split("|")[1].strip(): [float(x) for x in line.split("|")[2:4]]
          for line in table.splitlines() if line.startswith("| ") and "strategy" not in line}
  bound_label = "lower bound ‖A‖_*/√n"
  for column in range(2):
    values = {k: v[column] for k, v in rows.items()}
    # Ordering of Denisov et al. Table 1 / Fig 1: optimal is the smallest; nothing below the
    # lower bound.
    assert values[bound_label] <= values["optimal"] * (1 + 1e-9)
    assert values["optimal"] <= min(v for k, v in values.items() if k != bound_label) * (
        1 + 1e-9)
  summary = json.loads((out / "factorizations.json").read_text())
  assert len(summary["factorizations"]) == 10
  for path in summary["plots"]:
    assert os.path.getsize(path) > 1000
  assert not (out / "training").exists()


def test_tff_mf_cli_has_no_demo_and_the_library_does_not_import_the_harness():
  from tff_mf import cli  # pylint: disable=g-import-not-at-top
  assert "demo" not in dict(cli.COMMANDS)
  makefile = open(os.path.join(REPO, "Makefile"), encoding="utf-8").read()
  assert "-m training.main_job --output_dir out/demo" in makefile
  assert "tff-mf demo" not in makefile


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
  assert rows["honaker_online"]["epsilon"] <= main_job.MAIN_JOB_DEFAULTS["target_epsilon"]
  assert rows["opt_momentum"]["sqrt_loss"] <= rows["honaker_online"]["sqrt_loss"]
  assert os.path.getsize(tmp_path / "out" / "accuracy.png") > 0
  assert "| honaker_online |" in (tmp_path / "out" / "results.md").read_text()
