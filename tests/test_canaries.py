"""Canary clients in a training run and its one-run audit (``training.canaries``, ``--canaries``).

In-process runs of ``training.loop`` on a tiny synthetic task (one task for the module): the
canaries' secret comes from OS entropy unless pinned and is private (0600) and written, with
the plan, before round 1; with no canary included the run is bit-identical to a run without
the flag; an included canary joins exactly its schema pattern's rounds; with little noise
every guess is right; at a moderate claim the bound stays below it; bad flags are one-line
errors (exit status 2 from the binary). The slow tests: coverage over more pinned audits, and
the main job's regime (read from ``training.main_job`` at run time) at a large target ε.
"""

import dataclasses
import json
import os
import stat
import subprocess
import sys

import numpy as np
import pytest

from tff_mf import audit as audit_lib
from training import canaries as canaries_lib
from training import config as config_lib
from training import loop
from training import run_setup
from training import sampling
from training import task as task_lib

import userenv

# About 4000 parameters: canaries' random directions overlap by about 1/√4000.
MODEL = dict(dataset="synthetic", vocab_size=50, embedding_size=16, lstm_size=16,
             projection_size=16, max_validation_elements=16, max_test_elements=16,
             client_batch_size=4, max_elements_per_client=8, seed=1, progress=False)
ROUNDS, EPOCHS, CLIENTS = 4, 2, 16  # 2 cohorts of 16: 32 canary slots


def _config(root, name, **kw):
  values = dict(MODEL, mechanism="opt_prefix_sum", total_rounds=ROUNDS, epochs=EPOCHS,
                participation="fixed_epoch", clients_per_round=CLIENTS, noise_multiplier=1.0,
                noise_seed=20261127, experiment_name=name, root_output_dir=str(root),
                cache_dir=str(root / "cache"), rounds_per_eval=ROUNDS,
                rounds_per_checkpoint=ROUNDS)
  values.update(kw)
  return config_lib.TrainingConfig(**values)


@pytest.fixture(scope="module")
def task(tmp_path_factory):
  return task_lib.build_task(_config(tmp_path_factory.mktemp("task"), "t"))


def _releases(run_dir):
  with open(os.path.join(run_dir, "releases.jsonl"), encoding="utf-8") as f:
    return [json.loads(line)["sha256"] for line in f if line.strip()]


def _final_model(run_dir):
  with np.load(os.path.join(run_dir, "final_model.npz")) as f:
    return {k: f[k] for k in f.files}


# ----------------------------------------------------------------------------- the secret


def test_coins_and_directions_come_from_os_entropy_unless_pinned(tmp_path):
  cfg = _config(tmp_path, "x", canaries=32)
  a, b = canaries_lib.Canaries.draw(cfg), canaries_lib.Canaries.draw(cfg)
  assert a.seed_source == b.seed_source == "os_entropy" and a.seed != b.seed
  assert not np.array_equal(a.direction(0, 100), b.direction(0, 100))
  p, q = canaries_lib.Canaries.draw(cfg, 7), canaries_lib.Canaries.draw(cfg, 7)
  assert p.seed_source == "pinned" and np.array_equal(p.included, q.included)
  u = p.direction(3, 1000)
  assert np.array_equal(u, q.direction(3, 1000)) and abs(np.linalg.norm(u) - 1.0) < 1e-12


def test_secret_is_private_whatever_the_umask(tmp_path):
  cfg = _config(tmp_path, "x", canaries=8)
  old = os.umask(0)
  try:
    canaries_lib.save(str(tmp_path), canaries_lib.Canaries.draw(cfg))
  finally:
    os.umask(old)
  mode = stat.S_IMODE(os.stat(tmp_path / canaries_lib.SECRET_FILE).st_mode)
  assert mode == 0o600, oct(mode)
  loaded = canaries_lib.load(str(tmp_path))
  assert loaded.count == 8 and loaded.seed_source == "os_entropy"


def test_each_canary_takes_one_pattern_of_the_schema(tmp_path):
  for participation, expected in (("fixed_epoch", {(1, 3), (2, 4)}),
                                  ("balls_in_bins", {(1, 3), (2, 4)}),
                                  ("single", {(1,), (2,), (3,), (4,)})):
    epochs = None if participation == "single" else EPOCHS
    cfg = _config(tmp_path, "x", participation=participation, epochs=epochs, canaries=8)
    planted = canaries_lib.Canaries.draw(cfg, 1)
    assert set(planted.rounds) == expected, participation


def test_a_bound_above_the_claim_is_flagged_loudly():
  bounds = {k: {"value": 3.0, "kind": v} for k, v in canaries_lib.BOUND_KINDS.items()}
  report = dict(canaries=100, included=48, bounds=bounds, guesses=60, correct=60, alpha=0.05,
                delta=1e-6, epsilon_lower_bound=3.0, claimed_epsilon=2.0, exceeds_claim=True)
  text = canaries_lib.statement(report)
  assert "EXCEEDS the claimed epsilon 2" in text and "refuted at confidence 0.95" in text
  assert "100 synthetic canary clients" in text and "48 included" in text
  below = canaries_lib.statement(dict(report, claimed_epsilon=8.0, exceeds_claim=False))
  assert "does not exceed the claimed epsilon 8" in below and "EXCEEDS" not in below


# ----------------------------------------------------------------------------- bad flags


@pytest.mark.parametrize("kw, words", [
    (dict(canaries=-1), "--canaries must be a non-negative integer"),
    (dict(canaries=33), "--canaries=33 exceeds the schema's 32 client slots"),
    (dict(canaries=4, mechanism="none", noise_multiplier=None, noise_seed=None),
     "--mechanism=none makes none"),
    (dict(canaries=4, clip_norm="adaptive", noise_multiplier=0.5), "--clip_norm=adaptive"),
    (dict(canaries=4, engine="tff"), "--engine=tff and --workers are not supported"),
    (dict(canaries=4, workers=("localhost:1",)), "--engine=tff and --workers are not supported"),
    (dict(canaries=4, participation="min_sep", epochs=None, min_sep=2, sampling_prob=0.5),
     "not min_sep"),
    (dict(canaries=4, canary_alpha=1.5), "--canary_alpha must be in (0, 1)"),
    (dict(canary_alpha=0.1), "--canary_alpha goes with --canaries=m"),
    (dict(canary_seed=3), "--canary_seed goes with --canaries=m"),
])
def test_bad_canary_flags_are_one_line_errors(tmp_path, kw, words):
  with pytest.raises(config_lib.TrainingError) as e:
    _config(tmp_path, "x", **kw).validate()
  assert words in str(e.value) and "\n" not in str(e.value)


def test_binary_refuses_bad_canary_flags_with_exit_status_2(tmp_path):
  binary = os.path.join(userenv.REPO, "training", "run_stackoverflow.py")
  result = subprocess.run(
      [sys.executable, binary, "--dataset=synthetic", "--noise_multiplier=1",
       "--engine=tff", "--canaries=4", f"--root_output_dir={tmp_path}"],
      env=userenv.env(), capture_output=True, text=True, timeout=300)
  assert result.returncode == 2
  assert result.stderr.strip().splitlines() == [
      "error: --canaries needs the compiled engine (--engine=compiled or auto without "
      "--workers); --engine=tff and --workers are not supported"]
  assert not os.listdir(tmp_path)  # nothing written


def test_released_models_that_would_not_fit_are_refused_in_one_line():
  canaries_lib.check_models_size(48, 40_000)
  with pytest.raises(config_lib.TrainingError) as e:
    canaries_lib.check_models_size(2048, 4_000_000)  # the papers' model and rounds: 30.5 GiB
  assert "--canaries keeps the model after every round" in str(e.value)
  assert "30.5 GiB" in str(e.value) and "\n" not in str(e.value)


def test_a_run_without_canaries_records_no_canary_field(tmp_path):
  public = _config(tmp_path, "x").public_dict()
  assert not [k for k in public if "canar" in k]
  assert _config(tmp_path, "x", canaries=4).public_dict()["canary_seed"] == "os_entropy"


# ----------------------------------------------------------------------------- runs


def _all_out_seed(root, m):
  """A canary seed whose coins leave every one of m canaries out."""
  cfg = _config(root, "x", canaries=m)
  return next(s for s in range(10_000)
              if not canaries_lib.Canaries.draw(cfg, s).included.any())


def test_no_included_canary_leaves_the_run_bit_identical(task, tmp_path):
  plain = loop.run_training(_config(tmp_path, "plain"), task=task)
  seed = _all_out_seed(tmp_path, 4)
  audited = loop.run_training(_config(tmp_path, "canaries", canaries=4, canary_seed=seed),
                              task=task)
  assert audited["canary_audit"]["included"] == 0
  assert _releases(tmp_path / "plain") == _releases(tmp_path / "canaries")
  a, b = _final_model(tmp_path / "plain"), _final_model(tmp_path / "canaries")
  assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
  assert plain["epsilon"] == audited["epsilon"]
  assert audited["canary_audit"]["epsilon_lower_bound"] == 0.0


def test_canaries_join_their_schema_rounds_and_are_found_with_little_noise(
    task, tmp_path, monkeypatch):
  """z = 0.2 (client learning rate 1e-20: the real clients' updates vanish): every guess the
  plan allows is right.
  The canary updates the loop hands the engine each round are
  exactly those of the included canaries whose pattern holds the round, and the harness's own
  participation log finds no break of the schema in them."""
  fed = {}
  real_round = loop.run_round

  def spy(process, state, datasets, round_num, canaries=()):
    fed[round_num] = [np.concatenate([np.ravel(u) for u in c]) for c in canaries]
    return real_round(process, state, datasets, round_num, canaries)

  monkeypatch.setattr(loop, "run_round", spy)
  run_dir = tmp_path / "found"
  seen_before_round_1 = []

  def at_round(round_num):
    if round_num == 1:
      seen_before_round_1.extend(sorted(os.listdir(run_dir)))

  cfg = _config(tmp_path, "found", noise_multiplier=0.2, canaries=32, canary_seed=11,
                client_lr=1e-20)
  summary = loop.run_training(cfg, task=task, round_callback=at_round)
  assert {canaries_lib.SECRET_FILE, canaries_lib.PLAN_FILE} <= set(seen_before_round_1)
  planted = canaries_lib.load(str(run_dir))
  size = fed[1][0].size if fed[1] else None
  log = sampling.ParticipationLog([f"canary{j}" for j in range(planted.count)],
                                  period=ROUNDS // EPOCHS)
  for t in range(1, ROUNDS + 1):
    expected = [j for j in range(planted.count)
                if planted.included[j] and t in planted.rounds[j]]
    assert len(fed[t]) == len(expected)
    for got, j in zip(fed[t], expected):
      want = canaries_lib.SCALE * cfg.clip_norm * planted.direction(j, size)
      np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)  # float32 of the float64
    log.observe(t, [f"canary{j}" for j in expected])
  assert not log.violations(cfg.schema(), ROUNDS)
  report = summary["canary_audit"]
  # Found: every guess the planned counts allow is right (the plan may guess more canaries in
  # than the coins included, never from the scores).
  k_in, k_out = report["plan"]["k_in"], report["plan"]["k_out"]
  inside = int(planted.included.sum())
  best = min(k_in, inside) + min(k_out, planted.count - inside)
  assert report["correct"] == best and report["guesses"] == k_in + k_out
  found = audit_lib.one_run_fdp_epsilon(32, k_in + k_out, best, cfg.canary_alpha, cfg.delta)
  assert report["epsilon_lower_bound"] == pytest.approx(found) and found > 1.0
  assert report["epsilon_lower_bound"] <= summary["epsilon"] and not report["exceeds_claim"]
  for name in (canaries_lib.SECRET_FILE, canaries_lib.PLAN_FILE, canaries_lib.MODELS_FILE):
    assert stat.S_IMODE(os.stat(run_dir / name).st_mode) == 0o600, name
  statement = summary["privacy_statement"]
  assert "32 synthetic canary clients" in statement["text"]
  assert f"{planted.included.sum()} included" in statement["text"]
  with open(run_dir / canaries_lib.REPORT_FILE, encoding="utf-8") as f:
    evidence = json.load(f)
  assert evidence["bounds"] == report["bounds"] and "scores" not in report
  assert evidence["included_canaries"] == [int(x) for x in planted.included]
  recheck = audit_lib.one_run_audit(evidence["scores"], planted.included, cfg.canary_alpha,
                                    cfg.delta, (k_in, k_out))
  assert recheck["correct"] == report["correct"]
  assert stat.S_IMODE(os.stat(run_dir / canaries_lib.REPORT_FILE).st_mode) == 0o600
  # The kept models are checked against the release log: one changed entry is refused.
  kept = np.array(np.load(run_dir / canaries_lib.MODELS_FILE))
  shapes = [np.shape(w) for w in _final_model(run_dir).values()]
  with open(run_dir / "releases.jsonl", encoding="utf-8") as f:
    logged = {r["round"]: r for r in map(json.loads, f)}
  kept[2, 0] += 1.0
  with pytest.raises(config_lib.TrainingError, match="round 2 is not the model the run"):
    canaries_lib.check_released(kept, shapes, logged)


# A claim within reach of 32 canaries (z = 6: ε = 0.91; all of 26 guesses right would give
# about 2.1), audited as the planted fault below is: the honest run must pass.
NEAR_REACH = dict(noise_multiplier=6.0, canaries=32, canary_plan_mu=4.0, client_lr=1e-20)


def test_the_bound_stays_below_a_claim_within_its_reach(task, tmp_path):
  summary = loop.run_training(_config(tmp_path, "claim", canary_seed=5, **NEAR_REACH),
                              task=task)
  report = summary["canary_audit"]
  assert summary["epsilon"] < 2.0
  assert 0.0 <= report["epsilon_lower_bound"] <= summary["epsilon"]
  assert not report["exceeds_claim"]


@pytest.mark.slow  # a run with canaries stopped and resumed (about 13 s)
def test_a_resumed_run_keeps_its_canaries_and_stays_below_the_claim(task, tmp_path):
  """Canaries from OS entropy; stopped after round 3 (round 2 checkpointed), then resumed: the
  secret is the one written before round 1, round 3 replays bit for bit (the loop checks it
  against releases.jsonl, which a redrawn canary would break), and the audit stays below."""
  cfg = _config(tmp_path, "resumed", noise_multiplier=1.0, canaries=32, rounds_per_checkpoint=2)

  def stop(round_num):
    if round_num == 3:
      raise KeyboardInterrupt

  with pytest.raises(KeyboardInterrupt):
    loop.run_training(cfg, task=task, round_callback=stop)
  before = (tmp_path / "resumed" / canaries_lib.SECRET_FILE).read_text()
  summary = loop.run_training(cfg, task=task)
  assert (tmp_path / "resumed" / canaries_lib.SECRET_FILE).read_text() == before
  assert json.loads(before)["seed_source"] == "os_entropy"
  assert summary["finished"] and summary["config"]["canary_seed"] == "os_entropy"
  report = summary["canary_audit"]
  assert 0.0 <= report["epsilon_lower_bound"] <= summary["epsilon"]


def test_a_run_whose_noise_is_short_of_its_claim_is_refuted(task, tmp_path, monkeypatch):
  """A planted fault: the aggregator adds noise at z/30 while the run claims z = 6's ε
  (0.91). The released models then give the canaries away and the audit flags the claim."""
  real = run_setup.build_library_mechanism

  def short_noise(name, config, noise_seed, **kw):
    honest = real(name, config, noise_seed, **kw)
    quiet = real(name, dataclasses.replace(config, noise_multiplier=config.noise_multiplier / 30),
                 noise_seed, **kw)
    return dataclasses.replace(quiet, privacy=honest.privacy, info=honest.info)

  monkeypatch.setattr(run_setup, "build_library_mechanism", short_noise)
  summary = loop.run_training(_config(tmp_path, "fault", canary_seed=5, **NEAR_REACH),
                              task=task)
  report = summary["canary_audit"]
  assert report["epsilon_lower_bound"] > summary["epsilon"] and report["exceeds_claim"]
  assert "EXCEEDS" in summary["privacy_statement"]["text"]
  from training import run_stackoverflow  # pylint: disable=g-import-not-at-top
  status, line = run_stackoverflow.exit_status(summary)
  assert status == run_stackoverflow.REFUTED == 4 and "EXCEEDS the claimed epsilon" in line
  assert run_stackoverflow.exit_status(dict(summary, canary_audit=dict(
      report, exceeds_claim=False))) == (0, None)


@pytest.mark.slow
def test_the_bound_stays_below_the_claim_on_more_audits(task, tmp_path):
  """20 audits at each of two claims within reach (z = 4 and 6), at the real clients' learning
  rate: none exceeds its claim (each would with probability at most 0.05)."""
  exceeded = 0
  for seed in range(10, 30):
    for z in (4.0, 6.0):
      summary = loop.run_training(_config(tmp_path, f"c{seed}_{z}", **dict(
          NEAR_REACH, noise_multiplier=z, client_lr=0.5, canary_seed=seed)), task=task)
      exceeded += summary["canary_audit"]["exceeds_claim"]
  assert exceeded == 0


@pytest.mark.slow
def test_main_job_regime_at_a_large_epsilon_gives_a_nontrivial_bound_below_the_claim(tmp_path):
  from training import main_job  # pylint: disable=g-import-not-at-top
  values = dict(main_job.MAIN_JOB_DEFAULTS, mechanism="opt_momentum", target_epsilon=100.0,
                progress=False, root_output_dir=str(tmp_path), experiment_name="main",
                cache_dir=str(tmp_path / "cache"))
  cfg = config_lib.TrainingConfig(**values)
  cfg = dataclasses.replace(cfg, canaries=cfg.canary_slots())
  summary = loop.run_training(cfg)
  report = summary["canary_audit"]
  print(json.dumps({k: report[k] for k in ("canaries", "included", "guesses", "correct",
                                           "epsilon_lower_bound", "claimed_epsilon")}))
  assert 0.0 < report["epsilon_lower_bound"] <= summary["epsilon"]
  assert not report["exceeds_claim"]
