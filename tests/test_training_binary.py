"""The training binary as a user runs it: a clean shell, any working directory, umask 000.

One real run (module fixture) of ``training/run_stackoverflow.py`` on the synthetic
dataset, started from a minimal PATH/HOME/LANG environment (``tests/userenv.py``)
with umask 000 and a working directory outside the repository, then checks of what
it wrote: the summary's provenance, the run directory's permissions, TensorBoard,
the default-off non-private training metrics and a quiet stderr. Plus ``--help``
and one-line configuration errors.
"""

import csv
import datetime
import json
import os
import re
import stat
import subprocess
import sys

import numpy as np
import pytest

import userenv

REPO = userenv.REPO
BINARY = os.path.join(REPO, "training", "run_stackoverflow.py")
TINY = ["--dataset=synthetic", "--mechanism=opt_momentum", "--noise_multiplier=1",
        "--total_rounds=3", "--clients_per_round=2", "--vocab_size=100", "--embedding_size=8",
        "--lstm_size=8", "--projection_size=8", "--rounds_per_eval=1",
        "--max_validation_elements=64", "--max_test_elements=64"]


def run_binary(args, cwd, home, umask=None, timeout=600):
  return subprocess.run(
      [sys.executable, BINARY, *args], cwd=cwd, env=userenv.env(home=home),
      capture_output=True, text=True, timeout=timeout,
      preexec_fn=None if umask is None else (lambda: os.umask(umask)))


@pytest.fixture(scope="module")
def clean_run(tmp_path_factory):
  """The binary from a clean shell, umask 000, cwd outside the repository."""
  base = tmp_path_factory.mktemp("binary")
  home, cwd = base / "home", base / "cwd"
  home.mkdir()
  cwd.mkdir()
  root = base / "runs"
  result = run_binary(TINY + [f"--root_output_dir={root}", "--experiment_name=x"], cwd=cwd,
                      home=home, umask=0)
  return result, root / "x"


def test_binary_finishes_in_a_clean_shell(clean_run):
  result, run_dir = clean_run
  assert result.returncode == 0, result.stderr[-4000:]
  summary = json.loads((run_dir / "summary.json").read_text())
  assert summary["finished"] and summary["rounds_completed"] == 3
  assert summary["mechanism"] == "opt_momentum"
  # The default engine (auto) on one machine is the compiled one, and the run says so.
  assert summary["config"]["engine"] == "compiled"


def test_run_ends_with_its_privacy_statement_and_logs_epsilon_per_round(clean_run):
  result, run_dir = clean_run
  summary = json.loads((run_dir / "summary.json").read_text())
  statement = summary["privacy_statement"]
  assert result.stdout.strip().endswith(statement["text"])
  assert f"epsilon = {statement['epsilon_text']}, delta = 1e-06" in result.stdout
  assert statement["epsilon"] >= summary["epsilon"] and not statement["void"]
  with open(run_dir / "metrics.csv", newline="") as f:
    per_round = [float(row["epsilon"]) for row in csv.DictReader(f)]
  assert len(per_round) == 3 and per_round == sorted(per_round)
  assert per_round[-1] == summary["epsilon"]


def test_default_stderr_is_one_progress_bar_without_absl_info(clean_run):
  result, _ = clean_run
  assert not re.search(r"^I\d{4} ", result.stderr, re.M), result.stderr[-3000:]
  assert not re.search(r"^round \d+/\d+", result.stderr, re.M)  # no line per round
  assert "3/3" in result.stderr  # the tqdm bar reached the last round
  assert len(re.findall(r"\bx: +0%", result.stderr)) <= 1  # one bar for the run


def test_run_directory_is_private_whatever_the_umask(clean_run):
  _, run_dir = clean_run
  assert stat.S_IMODE(os.stat(run_dir).st_mode) == 0o700
  checkpoints = run_dir / "checkpoints"
  files = 0
  for dirpath, dirnames, filenames in os.walk(checkpoints):
    assert stat.S_IMODE(os.stat(dirpath).st_mode) == 0o700, dirpath
    for name in filenames:
      files += 1
      assert stat.S_IMODE(os.stat(os.path.join(dirpath, name)).st_mode) == 0o600, name
  assert files > 0
  for dirpath, dirnames, filenames in os.walk(run_dir):
    for name in filenames + dirnames:
      mode = stat.S_IMODE(os.stat(os.path.join(dirpath, name)).st_mode)
      assert not mode & 0o077, (name, oct(mode))


def test_summary_records_versions_dataset_and_times(clean_run):
  _, run_dir = clean_run
  summary = json.loads((run_dir / "summary.json").read_text())
  versions = summary["versions"]
  for key in ("tff_mf", "tensorflow", "tensorflow_federated", "tensorflow_privacy",
              "dp_accounting", "numpy", "python"):
    assert versions[key], key
  assert summary["dataset"]["name"] == "synthetic"
  assert re.fullmatch(r"[0-9a-f]{64}", summary["dataset"]["fingerprint"])
  start = datetime.datetime.fromisoformat(summary["start_utc"])
  end = datetime.datetime.fromisoformat(summary["end_utc"])
  assert start.utcoffset() == datetime.timedelta(0) and start <= end


def test_final_model_arrays_are_named_by_variable(clean_run):
  _, run_dir = clean_run
  with np.load(run_dir / "final_model.npz") as weights:
    names = list(weights.files)
  assert names and not any(re.fullmatch(r"arr_\d+", n) for n in names)
  assert any("embedding" in n for n in names) and any("lstm" in n for n in names)


def test_nonprivate_train_metrics_are_off_by_default(clean_run):
  _, run_dir = clean_run
  with open(run_dir / "metrics.csv", newline="") as f:
    header = next(csv.reader(f))
  assert not any("train" in h for h in header), header
  summary = json.loads((run_dir / "summary.json").read_text())
  assert summary["nonprivate_train_metrics"] is None
  assert summary["config"]["report_train_metrics"] is False


def _tensorboard_tags(directory):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  tags, plugins = set(), set()
  for dirpath, _, filenames in os.walk(directory):
    for name in filenames:
      if "tfevents" in name:
        for event in tf.compat.v1.train.summary_iterator(os.path.join(dirpath, name)):
          for value in event.summary.value:
            tags.add(value.tag)
            plugins.add(value.metadata.plugin_data.plugin_name)
  return tags, plugins


def test_tensorboard_has_evaluation_epsilon_and_hparams(clean_run):
  _, run_dir = clean_run
  tags, plugins = _tensorboard_tags(run_dir / "tensorboard")
  for tag in ("validation/accuracy_no_oov_no_eos", "validation/loss", "test/loss",
              "test/accuracy_no_oov_no_eos", "privacy/epsilon"):
    assert tag in tags, sorted(tags)
  assert "hparams" in plugins, sorted(plugins)
  assert not [t for t in tags if "train" in t], sorted(tags)


def test_help_describes_every_flag_with_its_default(tmp_path):
  result = run_binary(["--help"], cwd=tmp_path, home=tmp_path, timeout=120)
  assert result.returncode == 0, result.stderr[-2000:]
  text = result.stdout
  blocks = re.split(r"\n  --", text.split("run_stackoverflow.py:", 1)[1])[1:]
  assert len(blocks) >= 30
  for block in blocks:
    name, _, rest = block.partition(":")
    description = rest.split("\n    (", 1)[0]
    assert len(description.strip()) > 10, name
    assert "(default: " in block, f"--{name} does not show its default"
  root_block = next(b for b in blocks if b.startswith("root_output_dir:"))
  assert "'~/tff_mf_runs'" in root_block
  for page in ("README.md", os.path.join("docs", "train_tff.md")):
    with open(os.path.join(REPO, page), encoding="utf-8") as f:
      assert "~/tff_mf_runs" in f.read(), page


@pytest.mark.parametrize("flag, message", [
    ("--experiment_name=..", "--experiment_name"),
    ("--experiment_name=a/b", "--experiment_name"),
    ("--noise_multiplier=-1", "--noise_multiplier"),
    ("--engine=jax", "--engine"),
    ("--engine=compiled --workers=localhost:1", "--workers"),
])
def test_configuration_errors_are_one_line_exit_2(flag, message, tmp_path):
  root = tmp_path / "runs"
  result = run_binary(TINY + [f"--root_output_dir={root}", *flag.split()], cwd=tmp_path,
                      home=tmp_path, timeout=300)
  assert result.returncode == 2, result.stderr[-3000:]  # a usage error
  lines = result.stderr.strip().splitlines()
  # A value outside an enum flag's choices is refused at parse time (tff_mf.clitools).
  assert len(lines) == 1 and lines[0].startswith(("error: ", "run_stackoverflow.py: error: "))
  assert message in lines[0], lines
  assert not root.exists() or not os.listdir(root)


def _two_epoch_run(tmp_path, tiny_stackoverflow, schema: str) -> dict:
  """The clean-shell binary on 6 tiny StackOverflow clients, 4 rounds in 2 epochs under
  ``--participation=schema``, pinned noise seed; returns its summary.json."""
  data_dir = tiny_stackoverflow(num_train_clients=6)
  home = tmp_path / "home"
  home.mkdir()
  args = [a for a in TINY if not a.startswith(("--dataset", "--total_rounds"))] + [
      "--dataset=stackoverflow", f"--data_dir={data_dir}", "--total_rounds=4",
      f"--participation={schema}", "--epochs=2", "--noise_seed=3", "--noprogress",
      f"--cache_dir={tmp_path / 'cache'}", f"--root_output_dir={tmp_path / 'runs'}",
      f"--experiment_name={schema}"]
  result = run_binary(args, cwd=tmp_path, home=home)
  assert result.returncode == 0, result.stderr[-4000:]
  return json.loads((tmp_path / "runs" / schema / "summary.json").read_text())


# Slow: the library record of a random_allocation run is tested in tests/test_training_privacy.py
# and tests/test_random_allocation.py, its sampler in-process; this is the clean-shell binary.
@pytest.mark.slow
def test_binary_trains_under_random_allocation_and_reports_the_smallest_bound(
    tmp_path, tiny_stackoverflow):
  """--participation=random_allocation: every client in exactly one round of each epoch; ε is the
  smaller of the Gaussian at z / sensitivity over the one-round-per-epoch patterns and the
  random-allocation bound (arXiv:2601.21636), both listed."""
  from tff_mf import accounting  # pylint: disable=g-import-not-at-top
  from tff_mf.factorization import cache  # pylint: disable=g-import-not-at-top
  from tff_mf import participation  # pylint: disable=g-import-not-at-top
  summary = _two_epoch_run(tmp_path, tiny_stackoverflow, "random_allocation")
  seen = summary["participation"]
  assert seen["sampler"] == "random allocation (a new round each epoch)" and seen["follows_schema"]
  assert seen["observed"]["client_rounds"] == 6 * 2  # each client once in each of 2 epochs
  assert seen["observed"]["max_participations"] == 2
  assert seen["observed"]["repeats_within_an_epoch"] == 0
  privacy = summary["privacy"]
  by_analysis = {r["analysis"]: r["epsilon"] for r in privacy["candidates"]}
  assert set(by_analysis) == {"none", "amplified_allocation"}
  assert summary["epsilon"] == min(by_analysis.values())
  c = cache.load(summary["mechanism_info"]["cache_npz"]).c
  sens = participation.sensitivity(c, participation.random_allocation(2))
  assert privacy["sensitivity"] == pytest.approx(sens, rel=1e-12)
  assert by_analysis["none"] == pytest.approx(accounting.epsilon(1.0, 1e-6, sensitivity=sens),
                                              rel=1e-9)
  amplified = accounting.epsilon_for(c, participation.random_allocation(2), 1.0, 1e-6,
                                     "amplified_allocation")
  assert by_analysis["amplified_allocation"] == pytest.approx(amplified["epsilon"], rel=1e-9)


# Slow: the fixed-bin sampler and its record are tested in-process in tests/test_fixed_bin.py;
# this is the clean-shell binary.
@pytest.mark.slow
def test_binary_trains_under_fixed_bin_balls_in_bins_and_labels_its_bound(
    tmp_path, tiny_stackoverflow):
  """--participation=balls_in_bins: each client in the rounds of its one bin, b apart; ε is the
  smaller of the Gaussian at z / sensitivity over those patterns and the fixed-bin bound
  (tff_mf.accounting.fixed_bin), both listed."""
  from tff_mf import accounting  # pylint: disable=g-import-not-at-top
  from tff_mf.factorization import cache  # pylint: disable=g-import-not-at-top
  from tff_mf import participation  # pylint: disable=g-import-not-at-top
  summary = _two_epoch_run(tmp_path, tiny_stackoverflow, "balls_in_bins")
  seen = summary["participation"]
  assert seen["sampler"] == "balls in bins (fixed bin)" and seen["follows_schema"]
  assert seen["schema"]["fixed_bin"] is True
  assert seen["observed"]["client_rounds"] == 6 * 2  # each client in both rounds of its bin
  assert seen["observed"]["min_separation"] == 2
  assert seen["observed"]["separations_off_residue_class"] == 0
  c = cache.load(summary["mechanism_info"]["cache_npz"]).c
  sens = participation.sensitivity(c, participation.balls_in_bins(2))
  assert summary["privacy"]["sensitivity"] == pytest.approx(sens, rel=1e-12)
  by_analysis = {r["analysis"]: r["epsilon"] for r in summary["privacy"]["candidates"]}
  assert set(by_analysis) == {"none", "amplified_fixed_bin"}
  assert summary["epsilon"] == min(by_analysis.values())
  assert by_analysis["none"] == pytest.approx(accounting.epsilon(1.0, 1e-6, sensitivity=sens),
                                              rel=1e-9)
  amplified = accounting.epsilon_for(c, participation.balls_in_bins(2), 1.0, 1e-6,
                                     "amplified_fixed_bin")
  assert by_analysis["amplified_fixed_bin"] == pytest.approx(amplified["epsilon"], rel=1e-9)
  assert "fixed bin" in summary["privacy_statement"]["text"]


def test_a_too_coarse_granularity_is_one_line_naming_the_flag(tmp_path):
  """--granularity is checked against the rounding inflation once TFF reveals the model size
  (``tff_mf.noise.discrete_gaussian.plan``): one line naming --granularity, exit 1, no round run."""
  root = tmp_path / "runs"
  args = [a for a in TINY if not a.startswith("--mechanism")] + [
      "--mechanism=gaussian", "--noise_distribution=discrete_gaussian", "--granularity=0.5",
      f"--root_output_dir={root}", "--experiment_name=coarse", "--noprogress"]
  result = run_binary(args, cwd=tmp_path, home=tmp_path, timeout=300)
  assert result.returncode == 1, result.stderr[-3000:]
  lines = result.stderr.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith("error: --granularity 0.5 inflates"), lines
  assert not os.listdir(root / "coarse" / "checkpoints")
