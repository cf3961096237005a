"""The privacy statement (tff_mf.statement), ε per round and dp_events.jsonl's header
(training.privacy); numpy and dp_accounting only, no TensorFlow."""

import json

import dp_accounting
import numpy as np
import pytest

from tff_mf import accounting
from tff_mf import mechanisms
from tff_mf import participation
from tff_mf import statement
from tff_mf import strategies
from tff_mf import workloads
from training import config as config_lib
from training import privacy


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
  c = strategies.factorize(strategies.FactorizationSpec(
      workloads.WorkloadSpec("prefix_sum", 8), strategy="banded", bands=2,
      participation=participation.min_sep(2))).c
  record = accounting.epsilon_for(c, participation.min_sep(2), 1.0, 1e-6, "banded", 0.1)
  assert record["bound"] == "amplified"
  s = statement.privacy_statement(record, run=False)
  assert "amplified banded MF" in s["analysis"] and "PLD" in s["analysis"]
  assert "probability 0.1" in s["participation"] and "as configured" in s["participation"]
  loose = statement.privacy_statement(dict(record, bound="unamplified"), run=False)
  assert "no amplification (the banded amplified bound was larger)" in loose["analysis"]


# ----------------------------------------------------------------------------- ε per round

N = 12


def run_config(**kw):
  values = dict(mechanism="opt_prefix_sum", dataset="synthetic", total_rounds=N,
                clients_per_round=2, noise_multiplier=2.0)
  values.update(kw)
  return config_lib.TrainingConfig(**values)


def optimal_c(n=N):
  return strategies.factorize(strategies.FactorizationSpec(
      workloads.WorkloadSpec("prefix_sum", n), strategy="optimal")).c


@pytest.mark.parametrize("kw, c", [
    (dict(participation="fixed_epoch", epochs=2), optimal_c()),
    (dict(), optimal_c()),
    (dict(mechanism="tree", participation="min_sep", min_sep=3, max_participations=2,
          sampling_prob=0.5),
     mechanisms.tree_encoder(N)),
    (dict(clip_norm="adaptive", participation="fixed_epoch", epochs=3), optimal_c()),
])
def test_epsilon_per_round_is_non_decreasing_and_ends_at_the_runs_epsilon(kw, c):
  cfg = run_config(**kw)
  cfg.validate()
  z, record = privacy.guarantee(cfg, c)
  eps = privacy.epsilon_per_round(cfg, c, z, record)
  assert len(eps) == N and eps[-1] == record["epsilon"]
  assert all(a <= b for a, b in zip(eps, eps[1:]))
  assert 0 < eps[0] < eps[-1]  # round 1 has released less than the whole run


def test_epsilon_after_r_rounds_matches_dp_accounting_directly():
  """C = I (gaussian) in 2 fixed epochs of 6 rounds: after r ≤ 6 rounds a client has joined
  at most once, after r > 6 at most twice; dp_accounting's PLD of the self-composed
  Gaussian is an independent upper bound within its discretization of the exact value."""
  cfg = run_config(mechanism="gaussian", participation="fixed_epoch", epochs=2,
                   noise_multiplier=1.5)
  c = np.eye(N)
  z, record = privacy.guarantee(cfg, c)
  eps = privacy.epsilon_per_round(cfg, c, z, record)
  for r, joins in ((3, 1), (6, 1), (7, 2), (N, 2)):
    acc = dp_accounting.pld.PLDAccountant(value_discretization_interval=1e-4)
    acc.compose(dp_accounting.GaussianDpEvent(1.5), joins)
    reference = acc.get_epsilon(1e-6)
    assert eps[r - 1] <= reference * (1 + 1e-9)  # exact ≤ PLD's pessimistic bound
    assert eps[r - 1] >= reference - 5e-3  # PLD's discretization error at this ε
  assert eps[0] == eps[5] < eps[6] == eps[-1]


def test_released_rows_of_the_tree_encoder_are_those_of_finished_rounds():
  c = mechanisms.tree_encoder(4)
  for r in range(1, 5):
    rows = privacy.released_rows(c, r)
    assert not np.any(rows[:, r:])  # nothing of a later round
    assert np.all(np.any(rows[:, :r] != 0, axis=0))  # every round so far


def test_dp_events_file_starts_with_a_header_that_readers_skip(tmp_path):
  ledger = privacy.EventLedger(str(tmp_path), 0)
  event = privacy.event_to_json(dp_accounting.PoissonSampledDpEvent(
      0.0, dp_accounting.GaussianDpEvent(1.0)))
  for r in (1, 2, 3):
    ledger.write(r, event)
  lines = (tmp_path / privacy.EVENTS_FILE).read_text().splitlines()
  header = json.loads(lines[0])
  assert list(header) == ["dp_events"] and "sampling_probability 0.0" in header["dp_events"]
  assert len(lines) == 4 and ledger.events() == [event] * 3
  resumed = privacy.EventLedger(str(tmp_path), 2)  # a resume keeps the header and rounds 1-2
  lines = (tmp_path / privacy.EVENTS_FILE).read_text().splitlines()
  assert json.loads(lines[0]) == header and len(lines) == 3 and resumed.events() == [event] * 2
