"""The privacy statement (tff_mf.statement) of runs and of ``tff-mf account``, and the JSON
fields and zero-noise errors it stands beside (no TensorFlow). ε per round and
dp_events.jsonl's header: tests/test_training_privacy.py."""

import json

import numpy as np
import pytest

from tff_mf import accounting
from tff_mf import mechanisms
from tff_mf import participation
from tff_mf import statement
from training import config as config_lib


@pytest.mark.parametrize("value, text", [
    (7.999999994026439, "8.00"), (1.2341, "1.24"), (1.23, "1.23"), (9.9991, "10.0"),
    (0.012341, "0.0124"), (5.0, "5.00"), (123.01, "124"), (999.5, "1000"),
    (123456.7, "1.24e+05"), (float("inf"), "inf"), (None, "not reported")])
def test_epsilon_is_rounded_up_to_three_significant_digits(value, text):
  assert statement.epsilon_text(value) == text
  if value is not None:
    assert statement.round_up(value) >= value  # still an upper bound
    assert statement.round_up(value) == pytest.approx(float(text), rel=0)


def test_round_up_never_rounds_down_on_random_values():
  rng = np.random.default_rng(0)
  for value in 10.0 ** rng.uniform(-5, 6, 2000):
    up = statement.round_up(float(value))
    assert up >= value and up <= value * (1 + 1e-2)  # 3 digits: within one unit of the 3rd
    assert float(statement.epsilon_text(float(value))) >= value


def observed(rounds=8):
  return {"max_participations": 2, "min_separation": 4, "distinct_clients": 16,
          "rounds": rounds, "client_rounds": 32, "separations_off_residue_class": 0}


def test_statement_fields_of_an_unamplified_run():
  schema = participation.fixed_epoch(2)
  record = accounting.epsilon_for(np.eye(8), schema, 2.0, 1e-6)
  s = statement.privacy_statement(record, observed=observed(), noise_seed_source="os_entropy")
  assert s["epsilon"] == statement.round_up(record["epsilon"]) >= record["epsilon"]
  assert s["epsilon_unrounded"] == record["epsilon"] and s["delta"] == 1e-6
  assert "client-level" in s["unit"] and "add/remove" in s["unit"]
  assert "no amplification" in s["analysis"] and "z/sens = 2/1.414" in s["analysis"]
  assert "Balle & Wang" in s["analysis"]  # the exact accountant, as computed
  assert "fixed_epoch(epochs=2)" in s["participation"]
  assert "16 distinct clients over 8 rounds, at most 2 rounds per client" in s["participation"]
  assert "released after every round" in s["covers"]
  assert any("secret noise seed" in x for x in s["not_covered"]) and not s["void"]
  assert f"epsilon = {s['epsilon_text']}, delta = 1e-06" in s["text"]
  assert json.loads(json.dumps(s)) == s  # JSON-ready


def test_statement_names_what_is_not_private():
  record = accounting.epsilon_for(np.eye(4), participation.SINGLE, 2.0, 1e-6,
                                  accountant="pld")
  s = statement.privacy_statement(record, observed=observed(4), noise_seed_source="pinned",
                                  nonprivate_metrics=("nonprivate_train_loss",))
  assert s["void"] and "pinned" in s["not_covered"][0] and "VOID" in s["text"]
  assert any("nonprivate_train_loss" in x for x in s["not_covered"])
  assert "privacy-loss distributions" in s["analysis"]
  broken = statement.privacy_statement(dict(record, epsilon=None), observed=observed(4),
                                       epsilon_reason="the sampled rounds broke the schema")
  assert broken["epsilon"] is None and "broke the schema" in broken["text"]
  none = statement.no_privacy_statement("--mechanism=none adds no noise")
  assert none["epsilon"] is None and "not differentially private" not in none["text"]
  assert "nothing this run releases is differentially private" in none["text"]


def test_statement_of_amplified_analyses_says_which_bound_was_used():
  record = accounting.epsilon_for(np.eye(8), participation.min_sep(2), 1.0, 1e-6, "banded",
                                  0.1, pld_discretization=1e-3)
  assert record["bound"] == "amplified"
  s = statement.privacy_statement(record, run=False)
  assert "amplified banded MF" in s["analysis"] and "PLD" in s["analysis"]
  assert "probability 0.1" in s["participation"] and "as configured" in s["participation"]
  loose = statement.privacy_statement(dict(record, bound="unamplified"), run=False)
  assert "no amplification (the banded amplified bound was larger)" in loose["analysis"]


# ----------------------------------------------------------------------------- JSON fields


def test_mmcc_record_holds_each_field_once_per_meaning():
  c = mechanisms.tree_encoder(4) * np.sqrt(3)  # γ(C) = 1
  record = accounting.epsilon_for(c, participation.min_sep(2), 3.0, 1e-6, "mmcc", 0.5,
                                  mmcc_options={"workers": 1})
  details = record["mmcc"]
  assert not set(details) & set(record), set(details) & set(record)
  assert details["average_sampling_rate"] == pytest.approx(0.5 / 2)  # MMCC App D's p = p/b
  assert record["sampling_prob"] == 0.5 and "column_norm" in details
  assert "single_participation_reference_epsilon" in details


def test_sensitivity_method_agrees_with_exact():
  report = participation.sensitivity_report(mechanisms.tree_encoder(16),
                                            participation.min_sep(2))
  assert report["exact"] and report["method"] == "alg4_bound_attained"
  rng = np.random.default_rng(5)
  loose = participation.sensitivity_report(np.tril(rng.normal(size=(64, 64))),
                                           participation.min_sep(4, 3))
  assert not loose["exact"] and loose["method"] in ("alg4_bound", "enumerated_patterns")


def test_zero_noise_errors_name_what_exists_on_each_surface(capsys):
  from tff_mf import checks  # pylint: disable=g-import-not-at-top
  from tff_mf import cli  # pylint: disable=g-import-not-at-top
  with pytest.raises(config_lib.TrainingError, match="--mechanism=none trains without noise"):
    config_lib.TrainingConfig(mechanism="opt_prefix_sum", noise_multiplier=0.0).validate()
  assert cli.main(["account", "--noise-multiplier", "0", "--delta", "1e-6"]) != 0
  err = capsys.readouterr().err
  assert "must be positive" in err and "allow_no_noise" not in err
  with pytest.raises(checks.CheckError, match="allow_no_noise=True"):
    checks.noise_multiplier(0.0, no_noise_hint=checks.PYTHON_NO_NOISE_HINT)


def test_account_prints_the_statement_for_its_configuration(capsys):
  from tff_mf import cli  # pylint: disable=g-import-not-at-top
  argv = ["account", "--mechanism", "gaussian", "--n", "8", "--participation", "fixed_epoch",
          "--epochs", "2", "--noise-multiplier", "2", "--delta", "1e-6"]
  assert cli.main(argv) == 0
  text = capsys.readouterr().out
  assert cli.main(argv + ["--json"]) == 0
  record = json.loads(capsys.readouterr().out)
  s = record["privacy_statement"]
  assert s["text"] in text and s["epsilon"] == statement.round_up(record["epsilon"])
  assert "fixed_epoch(epochs=2)" in s["participation"] and "as configured" in s["participation"]
