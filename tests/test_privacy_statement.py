"""The privacy statement (tff_mf.accounting.statement) of runs and of ``tff-mf account``, and the JSON
fields and zero-noise errors it stands beside (no TensorFlow). ε per round and
dp_events.jsonl's header: tests/test_training_privacy.py."""

import dataclasses
import json

import numpy as np
import pytest

from tff_mf import accounting
from tff_mf.accounting import adaptive_clipping
from tff_mf import checks
from tff_mf import mechanisms
from tff_mf import participation
from tff_mf.accounting import statement
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
  record = accounting.epsilon_for(np.eye(8), participation.min_sep(2), 1.0, 1e-6,
                                  "amplified_banded", 0.1, pld_discretization=1e-3)
  assert record["bound"] == "amplified"
  s = statement.privacy_statement(record, run=False)
  assert "amplified banded MF" in s["analysis"] and "PLD" in s["analysis"]
  assert "probability 0.1" in s["participation"] and "as configured" not in s["participation"]
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
  argv = ["account", "--mechanism", "gaussian", "--total_rounds", "8", "--participation",
          "fixed_epoch", "--epochs", "2", "--noise-multiplier", "2", "--delta", "1e-6"]
  assert cli.main(argv) == 0
  text = capsys.readouterr().out
  assert cli.main(argv + ["--json"]) == 0
  record = json.loads(capsys.readouterr().out)
  s = record["privacy_statement"]
  assert s["text"] in text and s["epsilon"] == statement.round_up(record["epsilon"])
  assert s["participation"] == "fixed_epoch(epochs=2)"  # no filler: nothing was sampled
  # It stands on its own: the mechanism and n, and what epsilon does not depend on.
  assert "Setup: mechanism gaussian (gaussian (independent noise)), n = 8 rounds, noise " \
         "multiplier z = 2" in text and "epsilon depends on z alone" in s["setup"]
  assert s["covers"].startswith("the models released after each of the 8 rounds")


# ----------------------------------------------------------------------------- PrivacyRecord


def amplified_record(**setup):
  """A banded C (the identity) under min_sep(4) sampled with p = 0.25: amplified ε is reported."""
  record = mechanisms.run_privacy(np.eye(16), participation.min_sep(4), 2.0, None, 1e-6,
                                  "exact", sampling_prob=0.25)
  return dataclasses.replace(record, setup=setup) if setup else record


def test_statement_of_a_privacy_record_names_the_analysis_its_epsilon_came_from():
  """``privacy_statement(setup.privacy)`` describes the amplified ε it reports (it said "no
  amplification ... under single" beside the amplified ε)."""
  record = amplified_record()
  assert record.bound == "amplified_banded"
  s = statement.privacy_statement(record)
  assert s["epsilon"] == statement.round_up(record.epsilon)
  assert s["analysis"].startswith("amplification by Poisson sampling")
  assert "amplified banded MF" in s["analysis"] and "no amplification" not in s["analysis"]
  assert s["participation"].startswith("min_sep(min_sep=4")
  assert "probability 0.25" in s["participation"]
  assert s == statement.privacy_statement(record.details, run=False)  # the same statement
  # Without delta there is no epsilon, and the statement says why; none adds no noise.
  plain = mechanisms.run_privacy(np.eye(16), participation.min_sep(4), 2.0, None, None, "exact")
  s = statement.privacy_statement(plain)
  assert s["epsilon"] is None and "no delta was given" in s["text"]
  off = statement.privacy_statement(mechanisms.PrivacyRecord(private=False, noise_multiplier=0))
  assert off["epsilon"] is None and "nothing this run releases" in off["text"]


@pytest.mark.parametrize("bad, message", [
    (lambda r: r.info(1.0), "names no analysis"),  # the build record, not a privacy record
    (lambda r: {"epsilon": r.epsilon, "delta": 1e-6}, "names no analysis"),
    (lambda r: dict(r.details, bound=None), "does not say which bound"),
    (lambda r: dict(r.details, epsilon=r.epsilon / 2), "below every bound"),
    (lambda r: participation.SINGLE, "not a Participation"),
])
def test_statement_refuses_what_it_cannot_describe_truthfully(bad, message):
  with pytest.raises(checks.CheckError, match=message):
    statement.privacy_statement(bad(amplified_record()))


def test_str_of_a_privacy_record_is_its_statement():
  record = amplified_record(mechanism="banded", label="banded", rounds=16,
                            clients_per_round=4, clip_norm=1.0)
  text = str(record)
  assert text == statement.privacy_statement(record)["text"]
  assert text.startswith("Privacy statement\n  Setup: mechanism banded, n = 16 rounds")
  assert "epsilon = " + statement.epsilon_text(record.epsilon) in text
  # repr() (what a REPL shows) stays short: the scalar fields, not the JSON record.
  short = repr(record)
  assert short.startswith("PrivacyRecord(") and f"epsilon={record.epsilon!r}" in short
  assert len(short) < 400 and "candidates" not in short, len(short)


def test_statement_stands_on_its_own():
  """Mechanism, n, clients per round and clip norm; ε under each analysis, side by side, the
  reported one the smallest; no filler for what was not sampled."""
  record = amplified_record(mechanism="banded", label="banded", rounds=16,
                            clients_per_round=4, clip_norm=1.5)
  s = statement.privacy_statement(record)
  assert s["setup"] == ("mechanism banded, n = 16 rounds, noise multiplier z = 2 (noise std / "
                        "clip norm), 4 clients per round, fixed clip norm 1.5")
  assert s["covers"].startswith("the models released after each of the 16 rounds")
  assert "as configured" not in s["text"] and " n rounds" not in s["text"]
  table = {row["analysis"]: row for row in s["epsilons"]}
  assert set(table) == {"none", "amplified_banded"}
  candidates = {c["analysis"]: c for c in record.details["candidates"]}
  assert table["none"]["epsilon"] == min(candidates["none"]["epsilon"],
                                         candidates["amplified_banded"]["unamplified_epsilon"])
  assert table["amplified_banded"]["epsilon"] == candidates["amplified_banded"]["amplified_epsilon"] == record.epsilon
  assert table["amplified_banded"]["reported"] and not table["none"]["reported"]
  assert table["amplified_banded"]["epsilon"] < table["none"]["epsilon"]
  assert "smallest is reported" in s["reported_why"]
  for row in s["epsilons"]:
    line = f"    - {row['label']}: {row['epsilon_text']}"
    assert line + (" (reported)" if row["reported"] else "") in s["text"].splitlines()
  # A run without a schema to sample under has one analysis: nothing to put side by side.
  single = accounting.epsilon_for(np.eye(4), participation.SINGLE, 2.0, 1e-6)
  one = statement.privacy_statement(single, run=False)
  assert len(one["epsilons"]) == 1 and "under each analysis" not in one["text"]


def test_adaptive_unit_of_privacy_is_true_for_the_count_query():
  """A zero update counts as unclipped, so replacing a client's updates by zero is not removing
  it: the unit says add/remove of its updates and its count bits together."""
  adaptive = adaptive_clipping.AdaptiveClipping().checked(4)
  record = mechanisms.run_privacy(np.eye(8), participation.SINGLE, 2.0, None, 1e-6, "exact",
                                  adaptive=adaptive)
  record = dataclasses.replace(record, setup={"mechanism": "gaussian", "rounds": 8,
                                              "clients_per_round": 4, "clip_norm": "adaptive",
                                              "adaptive_clipping": adaptive.as_dict()})
  s = statement.privacy_statement(record)
  assert "replacing all of its clipped updates by zero" not in s["unit"]
  assert "add/remove" in s["unit"] and "clipped-count bits" in s["unit"]
  assert "a zero update still counts as unclipped" in s["unit"]
  assert "adaptive clip norm (starting at 0.1, tracking the 0.5 quantile" in s["setup"]
  fixed = statement.privacy_statement(amplified_record())
  assert "replacing all of its clipped updates by zero" in fixed["unit"]
