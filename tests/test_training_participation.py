"""Training under multiple participation: the binary, the summary, resume, broken schemas.

Runs on the synthetic dataset (400 training clients) with a tiny model:

- the binary with ``--participation=fixed_epoch --epochs=2`` and ``--participation=min_sep``
  from a clean shell (``tests/userenv.py``), and what summary.json says about the schema,
  the observed participations, the analysis behind ε and the DpEvent cross-check;
- a sampler that breaks its schema (monkeypatched) leaves ε unreported;
- an interrupted min-sep run resumes with the same clients in every round;
- a Poisson round without clients still adds its noise;
- banded Toeplitz and BLT train end to end under fixed epochs (banded: the binary test);
  all three under min-sep sampling with amplification in the slow suite.
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import userenv
from tff_mf import accounting
from tff_mf import mechanisms
from tff_mf import participation
from tff_mf import registry
from tff_mf.factorization import workloads
from training import loop
from training import outputs
from training import sampling
from training import task as task_lib

REPO = userenv.REPO
BINARY = os.path.join(REPO, "training", "run_stackoverflow.py")


@pytest.fixture(name="configs", scope="module")
def _configs(tiny_config):
  return tiny_config.using(rounds_per_eval=2, total_rounds=4, clients_per_round=2,
                           cache_subdir="cache_dir", noise_seed=12345)


@pytest.fixture(scope="module")
def task(configs, tiny_task, tmp_path_factory):
  return tiny_task(configs(tmp_path_factory.mktemp("task")))


def run_binary(args, tmp_path):
  return subprocess.run([sys.executable, BINARY, *args], cwd=tmp_path,
                        env=userenv.env(home=tmp_path), capture_output=True, text=True,
                        timeout=600)


@pytest.mark.parametrize("schema_flags, analysis", [
    # Fixed epochs in the default suite: in-process (banded Toeplitz/BLT under fixed epochs,
    # a broken fixed-epoch run) and calibration in tests/test_training_privacy.py.
    pytest.param(["--participation=fixed_epoch", "--epochs=2", "--target_epsilon=8"], "none",
                 marks=pytest.mark.slow),
    # A given z here: calibrating the amplified analysis takes several PLD evaluations
    # (tests/test_training_privacy.py calibrates under every schema).
    (["--participation=min_sep", "--min_sep=2", "--sampling_prob=0.01", "--noise_multiplier=0.7"],
     "amplified_banded"),
])
def test_binary_trains_under_the_schema_from_a_clean_shell(schema_flags, analysis, tiny_config,
                                                          tmp_path):
  flags = tiny_config.using(rounds_per_eval=2).flags()
  result = run_binary(flags + schema_flags + [
      "--mechanism=banded", "--total_rounds=4", "--clients_per_round=2",
      f"--root_output_dir={tmp_path / 'runs'}", "--experiment_name=x", "--no_progress"],
                      tmp_path)
  assert result.returncode == 0, result.stderr[-3000:]
  summary = json.loads((tmp_path / "runs" / "x" / "summary.json").read_text())
  assert summary["finished"]
  part = summary["participation"]
  assert part["follows_schema"] and part["violations"] == []
  observed = part["observed"]
  if analysis == "none":  # fixed epochs: 2 cohorts of 2 clients, each in rounds j and j + 2
    assert part["schema"] == {"kind": "fixed_epoch", "label": "fixed_epoch-k2", "epochs": 2}
    assert observed["max_participations"] == 2 and observed["min_separation"] == 2
    assert observed["distinct_clients"] == 4 and observed["client_rounds"] == 8
  else:
    assert part["schema"]["kind"] == "min_sep" and part["schema"]["min_sep"] == 2
    assert part["sampling_prob"] == 0.01
    assert observed["max_participations"] <= 2
    assert observed["min_separation"] in (None, 2)
    assert observed["separations_off_residue_class"] == 0
  eps = summary["epsilon"]
  privacy = summary["privacy"]
  assert summary["analysis"] == analysis and privacy["epsilon"] == eps
  candidates = {c["analysis"]: c["epsilon"] for c in privacy["candidates"]}
  assert eps == min(candidates.values())
  if analysis == "none":
    assert 7.5 <= eps <= 8.0 and privacy["target_epsilon"] == 8.0
  else:
    assert summary["noise_multiplier"] == 0.7 and eps < candidates["none"]
  assert privacy["theorem"] and privacy["analysis_label"]
  assert privacy["sensitivity"] >= 1.0 and "sensitivity_method" in privacy
  # One record: the library's, for the same mechanism, schema and sampling, gives the run's ε.
  library = mechanisms.privacy(
      mechanisms.resolve(registry.mechanism("banded"), workloads.WorkloadSpec("prefix_sum", 4),
                         participation.from_dict(part["schema"]),
                         cache_dir=str(tmp_path / "cache")),
      summary["noise_multiplier"], None, 1e-6, "exact",
      sampling_prob=0.01 if analysis == "amplified_banded" else None)
  assert library.epsilon == eps and library.bound == analysis
  assert "epsilon" not in summary["mechanism_info"]  # the privacy block is the one record
  check = privacy["dp_event_cross_check"]
  # The query's DpEvents carry the unamplified guarantee of the schema: no smaller than ε.
  unamplified = min(c["epsilon"] for c in privacy["candidates"] if c["analysis"] == "none")
  assert check["epsilon"] == pytest.approx(unamplified, rel=1e-3)
  assert check["epsilon"] >= eps * (1 - 1e-3)


def test_a_run_that_breaks_its_schema_reports_no_epsilon(configs, task, tmp_path, monkeypatch):
  original = sampling.FixedEpochSampler.next_round

  def always_cohort_zero(self, round_num, load):
    return original(self, 1, load)  # the same clients every round: separation 1 < b = 2

  monkeypatch.setattr(sampling.FixedEpochSampler, "next_round", always_cohort_zero)
  config = configs(tmp_path, mechanism="opt_momentum", participation="fixed_epoch",
                   epochs=2, noise_multiplier=1.0, experiment_name="broken")
  summary = loop.run_training(config, task=task)
  assert summary["finished"]
  assert summary["epsilon"] is None and summary["privacy"]["epsilon"] is None
  assert "broke the participation schema" in summary["epsilon_reason"]
  part = summary["participation"]
  assert not part["follows_schema"]
  assert part["observed"]["max_participations"] == 4 and part["observed"]["min_separation"] == 1
  assert any("allows 2" in v for v in part["violations"])
  on_disk = json.loads((tmp_path / "broken" / outputs.SUMMARY_FILE).read_text())
  assert on_disk["epsilon"] is None
  # Nothing in the summary reports an ε for this run (the DpEvent cross-check included).
  numbers = []

  def walk(value, key=""):
    if isinstance(value, dict):
      for k, v in value.items():
        walk(v, k)
    elif isinstance(value, list):
      for v in value:
        walk(v, key)
    elif "epsilon" in key and key not in ("target_epsilon", "epsilon_reason"):
      numbers.append((key, value))

  walk(on_disk)
  assert numbers and all(v is None for _, v in numbers), numbers


class Stop(Exception):
  pass


def recording(monkeypatch):
  """Records the client ids of every round the min-sep sampler returns."""
  seen = {}
  original = sampling.MinSepSampler.next_round

  def next_round(self, round_num, load):
    out = original(self, round_num, load)
    seen[round_num] = list(out[0])
    return out

  monkeypatch.setattr(sampling.MinSepSampler, "next_round", next_round)
  return seen


# Slow (40 s): the cyclic Poisson sampler's checkpointed state and its resume are checked in
# tests/test_training_sampling.py, and runs resume bit for bit in tests/test_training_identity.py.
@pytest.mark.slow
def test_resumed_min_sep_run_samples_the_same_clients(configs, task, tmp_path, monkeypatch):
  # A cap of 2 participations: unamplified accounting (fast); the Poisson coins are the same.
  kw = dict(mechanism="opt_prefix_sum", participation="min_sep", min_sep=2, sampling_prob=0.01,
            max_participations=2, noise_multiplier=1.0, total_rounds=6,
            rounds_per_checkpoint=1, noise_seed=None)
  seen = recording(monkeypatch)

  def stop_after_3(round_num):
    if round_num == 3:
      raise Stop()

  with pytest.raises(Stop):
    loop.run_training(configs(tmp_path, experiment_name="run", **kw), task=task,
                      round_callback=stop_after_3)
  interrupted = dict(seen)
  seen.clear()
  resumed = loop.run_training(configs(tmp_path, experiment_name="run", **kw), task=task)
  # Round 3 ran, then the run stopped before checkpointing it: the rerun resumes from round 2
  # and draws round 3 again, the same clients.
  assert sorted(seen) == [3, 4, 5, 6] and seen[3] == interrupted[3]
  run_rounds = {**interrupted, **seen}
  assert sum(len(v) for v in run_rounds.values()) > 0
  # An uninterrupted replay of the sampler with the run's secret draws the same clients.
  meta = loop.checkpoints.Checkpointer(str(tmp_path / "run" / "checkpoints")).latest()
  assert meta.sampling_secret >= 0
  config = configs(tmp_path, **kw)
  replay = sampling.build_sampler(config, task.train_client_ids, meta.sampling_secret)
  load = loop._client_loader(task)  # pylint: disable=protected-access
  assert {t: replay.next_round(t, load)[0] for t in range(1, 7)} == run_rounds
  observed = resumed["participation"]["observed"]
  assert observed["client_rounds"] == sum(len(v) for v in run_rounds.values())
  assert observed["rounds"] == 6 and resumed["participation"]["follows_schema"]


def test_a_round_without_clients_still_adds_its_noise(configs, task, tmp_path):
  kw = dict(mechanism="opt_prefix_sum", participation="min_sep", min_sep=2,
            sampling_prob=1e-9, max_participations=1, noise_multiplier=1.0, total_rounds=2)
  summary = loop.run_training(configs(tmp_path, experiment_name="empty", **kw), task=task)
  assert summary["finished"] and summary["participation"]["observed"]["client_rounds"] == 0
  trainable, _ = task_lib.initial_model_weights(task.keras_model_fn, 0)
  with np.load(tmp_path / "empty" / outputs.FINAL_MODEL_FILE) as final:
    moved = [np.max(np.abs(final[k] - w)) for k, w in zip(final.files, trainable)]
  assert min(moved) > 0.01  # noise only, on every variable
  rows = (tmp_path / "empty" / outputs.METRICS_FILE).read_text().splitlines()
  assert [r.split(",")[2] for r in rows[1:]] == ["0", "0"]  # the "clients" column


@pytest.mark.parametrize("mechanism", [pytest.param("banded_toeplitz", marks=pytest.mark.slow),
                                       "blt"])
def test_banded_toeplitz_and_blt_train_under_fixed_epochs(configs, mechanism, task, tmp_path):
  config = configs(tmp_path, mechanism=mechanism, participation="fixed_epoch", epochs=2,
                   noise_multiplier=1.5, experiment_name=mechanism)
  summary = loop.run_training(config, task=task)
  assert summary["finished"] and not summary["diverged"]
  assert summary["mechanism_info"]["noise_kind"] == "linear"
  assert summary["analysis"] == "none" and summary["participation"]["follows_schema"]
  sens = summary["privacy"]["sensitivity"]
  assert sens == summary["mechanism_info"]["sensitivity"] and sens >= 1.0
  assert summary["epsilon"] == pytest.approx(accounting.epsilon(1.5, 1e-6, sensitivity=sens))
  assert np.isfinite(summary["test_metrics"]["loss"])


@pytest.mark.slow
@pytest.mark.parametrize("mechanism, analysis", [
    ("banded", "amplified_banded"), ("banded_toeplitz", "amplified_banded"), ("blt", "mmcc")])
def test_banded_toeplitz_and_blt_train_under_min_sep_sampling(configs, mechanism, analysis,
                                                              task, tmp_path):
  config = configs(tmp_path, mechanism=mechanism, participation="min_sep", min_sep=2,
                   sampling_prob=0.01, noise_multiplier=1.5, experiment_name=mechanism)
  summary = loop.run_training(config, task=task)
  assert summary["finished"] and not summary["diverged"]
  assert summary["mechanism_info"]["noise_kind"] == "linear"
  assert summary["analysis"] == analysis
  assert summary["participation"]["follows_schema"]
  candidates = {c["analysis"]: c["epsilon"] for c in summary["privacy"]["candidates"]}
  assert 0 < summary["epsilon"] == candidates[analysis] < candidates["none"]
  assert np.isfinite(summary["test_metrics"]["loss"])
