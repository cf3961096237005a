"""ε of a run under each participation schema (tff_mf.mechanisms.run_privacy for the run's
flags, and training.privacy; no TensorFlow).

Calibration hits ε ≤ target under every schema and analysis; min-sep Poisson sampling
reports the smallest valid bound (amplified banded or MMCC vs unamplified) and names it;
a cap on participations or p = 1 is never amplified; DpEvents compose to the unamplified ε;
the ε spent after each round (the record's epsilon_by_round) is non-decreasing and ends at
the run's ε; dp_events.jsonl starts with a header line its readers skip.
"""

import json

import dp_accounting
import numpy as np
import pytest

from tff_mf import accounting
from tff_mf.accounting import adaptive_clipping
from tff_mf import mechanisms
from tff_mf import spec as spec_lib
from tff_mf.factorization import strategies
from tff_mf.factorization import workloads
from training import config as config_lib
from training import privacy

N = 8


def config(**kw):
  values = dict(mechanism="opt_prefix_sum", dataset="synthetic", total_rounds=N,
                clients_per_round=2, target_epsilon=4.0)
  values.update(kw)
  return config_lib.TrainingConfig(**values)


def privacy_record(cfg, c):
  """The library's ``PrivacyRecord`` for the run's flags and encoder C, the one the harness
  writes (``training.run_setup.resolve_privacy`` reads it from build_mechanism)."""
  spec = cfg.spec
  return mechanisms.privacy_record(c, spec.participation, spec.privacy, adaptive=spec.adaptive)


def guarantee(cfg, c):
  """(z, record): the run's z and the JSON record it writes."""
  record = privacy_record(cfg, c)
  return record.noise_multiplier, record.details


def amplified(cfg):
  return mechanisms.amplification_applies(cfg.schema(), cfg.total_rounds, cfg.sampling_prob)


def encoder(strategy="optimal", schema=None, **params):
  spec = strategies.FactorizationSpec(
      workload=workloads.WorkloadSpec(kind="prefix_sum", n=N), strategy=strategy,
      **({"participation": schema} if schema is not None else {}), **params)
  return strategies.factorize(spec).c


@pytest.mark.parametrize("kw, strategy, analysis", [
    (dict(), "optimal", "none"),
    (dict(participation="fixed_epoch", epochs=2), "optimal", "none"),
    (dict(participation="min_sep", min_sep=4, sampling_prob=0.2), "banded",
     "amplified_banded"),
    (dict(participation="min_sep", min_sep=2, sampling_prob=0.2), "honaker_online", "mmcc"),
    (dict(participation="min_sep", min_sep=2, sampling_prob=0.2, max_participations=2),
     "optimal", "none"),
    (dict(participation="min_sep", min_sep=2, sampling_prob=1.0), "optimal", "none"),
])
def test_calibration_hits_the_target_under_each_schema(kw, strategy, analysis):
  cfg = config(**kw)
  cfg.validate()
  params = {"bands": 4} if strategy == "banded" else {}
  c = encoder(strategy, **params)
  z, record = guarantee(cfg, c)
  assert record["epsilon"] <= cfg.target_epsilon
  assert record["epsilon"] >= 0.95 * cfg.target_epsilon  # calibrated, not just any safe z
  assert record["analysis"] == analysis
  assert record["noise_multiplier"] == z
  assert record["schema"] == cfg.schema().as_dict()
  # The reported bound is the smallest candidate, and each candidate is a valid bound.
  assert record["epsilon"] == min(c["epsilon"] for c in record["candidates"])
  plain = accounting.epsilon_for(c, cfg.schema(), z, cfg.delta)
  assert record["epsilon"] <= plain["epsilon"] * (1 + 1e-12)
  if analysis != "none":
    assert record["amplified_epsilon"] < plain["epsilon"]  # amplification helped here
  # Given z instead of a target: the same record.
  again = guarantee(config(**kw, noise_multiplier=z, target_epsilon=None), c)[1]
  assert again["epsilon"] == pytest.approx(record["epsilon"], rel=1e-9)


def test_fixed_epoch_epsilon_is_the_gaussian_at_z_over_the_schemas_sensitivity():
  cfg = config(participation="fixed_epoch", epochs=2, noise_multiplier=2.0, target_epsilon=None)
  c = encoder()
  _, record = guarantee(cfg, c)
  sens = accounting.sensitivity_report(c, cfg.schema())["value"]
  assert sens > 1.0
  assert record["sensitivity"] == sens
  assert record["epsilon"] == pytest.approx(accounting.epsilon(2.0, 1e-6, sensitivity=sens))
  assert record["epsilon"] > accounting.epsilon(2.0, 1e-6)  # more than single participation


def test_a_participation_cap_below_what_fits_is_not_amplified():
  cfg = config(participation="min_sep", min_sep=2, sampling_prob=0.1, max_participations=3)
  assert not amplified(cfg)
  assert amplified(config(participation="min_sep", min_sep=2, sampling_prob=0.1,
                                  max_participations=4))
  assert not amplified(config(participation="min_sep", min_sep=2, sampling_prob=1.0))


def test_an_inapplicable_amplified_analysis_falls_back_with_a_note(monkeypatch):
  cfg = config(participation="min_sep", min_sep=2, sampling_prob=0.2)

  def refuse(*args, **kwargs):
    raise accounting.AccountingError("MMCC could not analyze this run")

  monkeypatch.setattr(accounting, "calibrate", lambda *a, **k: (
      refuse() if k.get("amplification") == "mmcc" else ORIGINAL_CALIBRATE(*a, **k)))
  z, record = guarantee(cfg, encoder("honaker_online"))
  assert record["analysis"] == "none" and record["epsilon"] <= cfg.target_epsilon
  assert any("mmcc analysis not applicable" in n for n in record["notes"])


ORIGINAL_CALIBRATE = accounting.calibrate


def test_tree_and_gaussian_encoders_are_what_tff_adds_noise_for():
  from tff_mf import participation  # pylint: disable=g-import-not-at-top
  from tff_mf import registry  # pylint: disable=g-import-not-at-top
  from tff_mf.factorization.families import tree as tree_lib  # pylint: disable=g-import-not-at-top

  def resolved(name, n):
    return mechanisms.resolve(registry.mechanism(name), workloads.WorkloadSpec("prefix_sum", n),
                              participation.SINGLE)

  for n in (N, 12):  # 12: not a power of two, no leaf is in all 5 levels' released nodes
    tree = resolved("tree", n).encoder
    assert tree.shape[0] > tree.shape[1] == n  # one row per tree node
    levels = tree_lib.tree_levels(n)
    gamma = np.max(np.linalg.norm(tree, axis=0))
    # TFF adds z·√levels per node: the accountant's C is C_T / √levels.
    np.testing.assert_allclose(tree * np.sqrt(levels), tree_lib.tree_encoder(n))
    assert gamma == pytest.approx(1.0) if n == N else gamma < 1.0
  np.testing.assert_array_equal(resolved("gaussian", N).encoder, np.eye(N))
  assert resolved("none", N).encoder is None


def test_sampling_secret_is_derived_from_a_pinned_noise_seed_only():
  cfg = config(participation="min_sep", min_sep=2, sampling_prob=0.5, noise_seed=17)
  assert privacy.sampling_secret(cfg, 17) == privacy.sampling_secret(cfg, 17) >= 0
  assert privacy.sampling_secret(cfg, 17) != 17
  free = config(participation="min_sep", min_sep=2, sampling_prob=0.5)
  assert privacy.sampling_secret(free, None) != privacy.sampling_secret(free, None)
  assert privacy.sampling_secret(config(), 17) == -1


def test_dp_events_round_trip_and_compose_to_the_unamplified_gaussian():
  z = 1.3
  events = [dp_accounting.PoissonSampledDpEvent(1.0 if i == 0 else 0.0,
                                                dp_accounting.GaussianDpEvent(z))
            for i in range(5)]
  as_json = [privacy.event_to_json(e) for e in events]
  assert [privacy.event_from_json(e) for e in as_json] == events
  check = privacy.dp_event_epsilon(as_json, 1e-6, 5)
  reference = dp_accounting.pld.PLDAccountant()
  reference.compose(dp_accounting.GaussianDpEvent(z))
  assert check["epsilon"] == pytest.approx(reference.get_epsilon(1e-6), rel=1e-9)
  assert check["epsilon"] == pytest.approx(accounting.epsilon(z, 1e-6), rel=1e-3)
  unsupported = privacy.dp_event_epsilon(
      [privacy.event_to_json(dp_accounting.UnsupportedDpEvent())] * 5, 1e-6, 5)
  assert unsupported["epsilon"] is None and "Unsupported" in unsupported["reason"]
  assert privacy.dp_event_epsilon(as_json[:4], 1e-6, 5)["epsilon"] is None


def test_dp_events_use_dp_accounting_named_tuples_and_read_the_older_lines():
  event = dp_accounting.SelfComposedDpEvent(
      dp_accounting.ComposedDpEvent([dp_accounting.GaussianDpEvent(0.7),
                                     dp_accounting.NoOpDpEvent()]), 3)
  as_json = json.loads(json.dumps(privacy.event_to_json(event)))
  assert as_json["class_name"] == "SelfComposedDpEvent"
  assert privacy.event_from_json(as_json) == event
  older = {"type": "PoissonSampledDpEvent", "sampling_probability": 0.5,
           "event": {"type": "GaussianDpEvent", "noise_multiplier": 1.1}}
  assert privacy.event_from_json(older) == dp_accounting.PoissonSampledDpEvent(
      0.5, dp_accounting.GaussianDpEvent(1.1))
  assert isinstance(privacy.event_from_json({"type": "UnsupportedDpEvent", "was": "X"}),
                    dp_accounting.UnsupportedDpEvent)
  elsewhere = dict(privacy.event_to_json(dp_accounting.GaussianDpEvent(1.0)), module_name="os")
  assert isinstance(privacy.event_from_json(elsewhere), dp_accounting.UnsupportedDpEvent)


def run_config(**kw):
  return config(**dict(dict(noise_multiplier=2.0, target_epsilon=None), **kw))


@pytest.mark.parametrize("kw, c", [
    (dict(participation="fixed_epoch", epochs=2), encoder()),
    (dict(), encoder()),
    (dict(mechanism="tree", participation="min_sep", min_sep=3, max_participations=2,
          sampling_prob=0.5),
     mechanisms.tree_encoder(N)),
    (dict(clip_norm="adaptive", participation="fixed_epoch", epochs=4), encoder()),
])
def test_epsilon_by_round_is_non_decreasing_and_ends_at_the_runs_epsilon(kw, c):
  cfg = run_config(**kw)
  cfg.validate()
  record = privacy_record(cfg, c)
  eps = record.epsilon_by_round()
  assert len(eps) == N and eps[-1] == record.epsilon
  assert record.epsilon_by_round(3) == eps[:3]
  assert all(a <= b for a, b in zip(eps, eps[1:]))
  assert 0 < eps[0] < eps[-1]  # round 1 has released less than the whole run


def test_epsilon_after_r_rounds_matches_dp_accounting_directly():
  """C = I (gaussian) in 2 fixed epochs of 4 rounds: after r ≤ 4 rounds a client has joined
  at most once, after r > 4 at most twice; dp_accounting's PLD of the self-composed
  Gaussian is an independent upper bound within its discretization of the exact value."""
  cfg = run_config(mechanism="gaussian", participation="fixed_epoch", epochs=2,
                   noise_multiplier=1.5)
  c = np.eye(N)
  eps = privacy_record(cfg, c).epsilon_by_round()
  for r, joins in ((2, 1), (4, 1), (5, 2), (N, 2)):
    acc = dp_accounting.pld.PLDAccountant(value_discretization_interval=1e-3)
    acc.compose(dp_accounting.GaussianDpEvent(1.5), joins)
    reference = acc.get_epsilon(1e-6)
    assert eps[r - 1] <= reference * (1 + 1e-9)  # exact ≤ PLD's pessimistic bound
    assert eps[r - 1] >= reference * (1 - 1e-4)  # PLD is tight to ~1e-6 here (grid 1e-3)
  assert eps[0] == eps[3] < eps[4] == eps[-1]


def test_released_rows_of_the_tree_encoder_are_those_of_finished_rounds():
  c = mechanisms.tree_encoder(4)
  for r in range(1, 5):
    rows = mechanisms.released_rows(c, r)
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


def test_the_privacy_record_holds_a_sensitivity_once_per_meaning():
  plain_cfg = config(participation="fixed_epoch", epochs=2, noise_multiplier=2.0,
                     target_epsilon=None)
  _, plain = guarantee(plain_cfg, encoder())
  assert "unamplified_sensitivity" not in plain  # `sensitivity` is the one the noise is for
  assert plain["sensitivity"] == accounting.sensitivity_report(encoder(),
                                                               plain_cfg.schema())["value"]
  cfg = config(participation="min_sep", min_sep=4, sampling_prob=0.2, noise_multiplier=2.0,
               target_epsilon=None)
  _, banded = guarantee(cfg, encoder("banded", bands=4))
  assert banded["analysis"] == "amplified_banded"  # `sensitivity`: every eligible round joined
  assert banded["unamplified_sensitivity"] == accounting.sensitivity_report(
      encoder("banded", bands=4), cfg.schema())["value"]


def test_bad_privacy_arguments_are_one_line_errors():
  c = encoder()
  schema = config(participation="fixed_epoch", epochs=2).schema()
  for kwargs, message in [
      (dict(noise_multiplier=1.0, target_epsilon=None, sampling_prob=0.5), "min_sep"),
      (dict(noise_multiplier=1.0, target_epsilon=2.0), "exactly one"),
      (dict(noise_multiplier=None, target_epsilon=2.0, delta=None), "needs delta"),
      (dict(noise_multiplier=1.0, target_epsilon=None, delta=1.5), "delta"),
  ]:
    arguments = {"delta": 1e-6, "accountant": "exact", **kwargs}
    with pytest.raises(ValueError, match=message) as error:
      mechanisms.run_privacy(c, schema, **arguments)
    assert "\n" not in str(error.value)


def test_a_square_encoders_leading_block_has_the_released_rows_sensitivity():
  c = encoder()
  schema = config_lib.TrainingConfig(participation="min_sep", min_sep=3, sampling_prob=0.5,
                                     total_rounds=N).schema()
  for r in (2, 5, 7):
    block, schema_r = mechanisms.prefix_encoder(c, schema, r)
    assert block.shape == (r, r)
    assert accounting.sensitivity_report(block, schema_r)["value"] == pytest.approx(
        accounting.sensitivity_report(mechanisms.released_rows(c, r), schema)["value"],
        rel=1e-12)


def test_the_config_derives_the_library_spec_and_validate_checks_it():
  cfg = config(participation="min_sep", min_sep=4, sampling_prob=0.2, max_participations=2,
               mechanism="band_mf", bands=4, server_momentum=0.9, clip_norm="adaptive")
  cfg.validate()
  spec = cfg.spec
  assert spec == spec_lib.MechanismSpec.from_args(
      "banded", total_rounds=N, clients_per_round=2, clip_norm="adaptive",
      target_epsilon=4.0, delta=cfg.delta, accountant=cfg.accountant, sampling_prob=0.2,
      momentum=0.9, participation=cfg.schema(), bands=4,
      adaptive=adaptive_clipping.AdaptiveClipping())
  assert spec.privacy.sampling_prob == 0.2 and spec.workload.momentum == 0.9
  # A library rule fails validate(), before anything is built or written.
  with pytest.raises(config_lib.TrainingError,
                     match="^--buffers does not apply to --mechanism=gaussian$"):
    config(mechanism="gaussian", buffers=2).validate()
