"""The numpy mechanism layer (tff_mf.mechanisms) on its own, without TensorFlow.

A registry mechanism resolves to the encoder C its noise is calibrated for, with its
family parameters and its sensitivity under the schema; the privacy record's ε is the
accountant's for that C, schema and z (Denisov et al. 2022, arXiv:2202.08312, Thm 4.1);
calibration gives ε ≤ target with z minimal to the search's tolerance; amplification
applies only to cyclic Poisson sampling without a binding cap and to random allocation
(Choquette-Choo et al. 2023, arXiv:2306.08153, Thm 4); bad input is refused in one line.
The layer's one input is a frozen ``MechanismSpec``, checked once where it is built (the
family parameters by the family's declaration); ``build`` gives the resolved mechanism and
its record, whose ε after each round is the accountant's for the rows released so far.
"""

import math
import os
import subprocess
import sys

import numpy as np
import pytest

from tff_mf import accounting
from tff_mf.accounting import adaptive_clipping
from tff_mf import checks
from tff_mf.accounting import gaussian
from tff_mf import mechanisms
from tff_mf import participation
from tff_mf import registry
from tff_mf import spec as spec_lib
from tff_mf.factorization import workloads
from tff_mf.factorization.families import tree

import userenv

N = 8
DELTA = 1e-6
SCHEMAS = [participation.single(), participation.fixed_epoch(2),
           participation.min_sep(2, 3)]


def resolved(name, schema=participation.SINGLE, **params):
  return mechanisms.resolve(registry.mechanism(name),
                            workloads.WorkloadSpec(kind="prefix_sum", n=N), schema, **params)


@pytest.fixture(name="banded", scope="module")
def _banded():
  return resolved("banded", participation.fixed_epoch(2), bands=3)


def test_the_layer_never_imports_tensorflow():
  code = ("import sys\n"
          "from tff_mf import mechanisms, participation, registry\n"
          "from tff_mf.factorization import workloads\n"
          "r = mechanisms.resolve(registry.mechanism('gaussian'), "
          "workloads.WorkloadSpec(kind='prefix_sum', n=4), participation.SINGLE)\n"
          "mechanisms.privacy(r, None, 4.0, 1e-6, 'exact')\n"
          "assert 'tensorflow' not in sys.modules, sorted(sys.modules)\n")
  subprocess.run([sys.executable, "-c", code], check=True, cwd=userenv.REPO,
                 env=userenv.env(pythonpath=True))


def test_a_family_parameter_reaches_the_factorization(banded):
  assert banded.n == N and banded.info["bands"] == 3
  assert accounting.band_count(banded.encoder) <= 3 < N
  assert banded.mechanism is registry.mechanism("band_mf")  # an alias resolves to the entry
  default = resolved("banded")
  assert default.info["bands"] == registry.default_parameters("banded", N)["bands"]


@pytest.mark.parametrize("name", ["banded", "gaussian", "honaker_online"])
@pytest.mark.parametrize("schema", SCHEMAS, ids=lambda s: s.label)
def test_sensitivity_is_the_participation_layers_for_the_encoder(name, schema):
  r = resolved(name, schema)
  assert r.sensitivity == pytest.approx(participation.sensitivity(r.encoder, schema),
                                        rel=participation.EXACT_RTOL)
  assert r.info["sensitivity"] == r.sensitivity


def test_tff_tree_is_calibrated_per_node():
  r = resolved("tree")
  levels = tree.tree_levels(N)
  np.testing.assert_array_equal(r.encoder, mechanisms.tree_encoder(N))
  per_node = participation.sensitivity(tree.tree_encoder(N), participation.SINGLE)
  assert r.sensitivity == pytest.approx(per_node / math.sqrt(levels),
                                        rel=participation.EXACT_RTOL)
  assert mechanisms.tree_node_multiplier(0.5, N) == pytest.approx(0.5 * math.sqrt(levels))


def test_none_is_not_private():
  r = resolved("none")
  assert r.encoder is None and r.sensitivity is None
  record = mechanisms.privacy(r, None, 4.0, DELTA, "exact")
  assert not record.private and record.noise_multiplier == 0.0
  assert record.info(1.0) == {"noise_multiplier": 0.0, "private": False}


@pytest.mark.parametrize("accountant", accounting.ACCOUNTANTS)
@pytest.mark.parametrize("schema", SCHEMAS[:2], ids=lambda s: s.label)
def test_record_epsilon_is_the_accountants(banded, schema, accountant):
  z = 1.3
  record = mechanisms.run_privacy(banded.encoder, schema, z, None, DELTA, accountant)
  expected = accounting.epsilon_for(banded.encoder, schema, z, DELTA, accountant=accountant)
  assert record.epsilon == expected["epsilon"]
  assert record.epsilon == accounting.epsilon(z, DELTA, accountant,
                                              sensitivity=record.sensitivity)
  assert record.bound == "none" and record.noise_multiplier == z
  assert record.effective_noise_multiplier == pytest.approx(z / record.sensitivity)


def test_privacy_reuses_the_resolved_sensitivity(banded):
  record = mechanisms.privacy(banded, 0.9, None, DELTA, "exact")
  assert record.sensitivity == banded.sensitivity
  assert record.epsilon == accounting.epsilon(0.9, DELTA, "exact", sensitivity=banded.sensitivity)
  assert record.details["sensitivity_method"] == banded.sensitivity_report["method"]


@pytest.mark.parametrize("target", [1.0, 8.0])
def test_calibration_meets_the_target_with_a_minimal_z(banded, target):
  record = mechanisms.calibrate(banded, target, DELTA, "exact")
  assert record.epsilon <= target and record.target_epsilon == target
  # The search stops within a relative 1e-3 of z (accounting.calibrate_noise_multiplier).
  below = record.noise_multiplier * (1.0 - 1e-3)
  assert accounting.epsilon(below, DELTA, "exact", sensitivity=record.sensitivity) > target
  assert record.info(2.0)["stddev_per_round_sum"] == 2.0 * record.noise_multiplier


def test_without_delta_the_record_has_no_epsilon(banded):
  record = mechanisms.run_privacy(banded.encoder, banded.participation, 1.0, None, None, "exact")
  assert record.private and record.epsilon is None and record.details == {}
  assert record.sensitivity == pytest.approx(banded.sensitivity, rel=participation.EXACT_RTOL)


def test_amplification_applies_to_poisson_sampling_without_a_binding_cap():
  applies = mechanisms.amplification_applies
  assert applies(participation.min_sep(2), N, 0.5)
  assert applies(participation.min_sep(2, 4), N, 0.5)  # the cap is the ⌈8/2⌉ that fit
  assert not applies(participation.min_sep(2, 3), N, 0.5)  # a binding cap
  assert not applies(participation.min_sep(2), N, 1.0)
  assert not applies(participation.min_sep(2), N, None)
  assert not applies(participation.fixed_epoch(2), N, 0.5)
  assert not applies(participation.SINGLE, N, 0.5)
  assert applies(participation.random_allocation(2), N, None)


def test_amplified_analysis_follows_the_bands(banded):
  assert mechanisms.amplified_analysis(banded.encoder, participation.min_sep(3)) == "amplified_banded"
  assert mechanisms.amplified_analysis(banded.encoder, participation.min_sep(2)) == "mmcc"
  assert mechanisms.amplified_analysis(
      banded.encoder, participation.random_allocation(2)) == "amplified_allocation"


def test_amplified_record_reports_the_smaller_valid_bound(banded):
  schema = participation.min_sep(3)
  record = mechanisms.run_privacy(banded.encoder, schema, 1.0, None, DELTA, "exact",
                                  sampling_prob=0.25)
  epsilons = {c["analysis"]: c["epsilon"] for c in record.details["candidates"]}
  assert set(epsilons) == {"none", "amplified_banded"}
  plain = accounting.epsilon_for(banded.encoder, schema, 1.0, DELTA)["epsilon"]
  assert epsilons["none"] == plain
  assert record.epsilon == min(epsilons.values()) and record.bound == min(epsilons,
                                                                          key=epsilons.get)
  assert record.details["sampling_prob"] == 0.25


@pytest.mark.parametrize("kwargs, message", [
    (dict(noise_multiplier=1.0, target_epsilon=2.0, delta=DELTA),
     "give exactly one of noise_multiplier and target_epsilon"),
    (dict(noise_multiplier=None, target_epsilon=None, delta=DELTA),
     "give exactly one of noise_multiplier and target_epsilon"),
    (dict(noise_multiplier=None, target_epsilon=2.0, delta=None),
     "target_epsilon needs delta"),
    (dict(noise_multiplier=1.0, target_epsilon=None, delta=DELTA, accountant="moments"),
     "accountant must be one of exact, pld, rdp, got 'moments'"),
    (dict(noise_multiplier=1.0, target_epsilon=None, delta=DELTA, sampling_prob=0.5),
     "sampling_prob applies to min_sep .* not fixed_epoch"),
    (dict(noise_multiplier=None, target_epsilon=-1.0, delta=DELTA), "target_epsilon"),
    (dict(noise_multiplier=1.0, target_epsilon=None, delta=1.5), "delta"),
])
def test_bad_input_is_refused_in_one_line(banded, kwargs, message):
  kwargs.setdefault("accountant", "exact")
  with pytest.raises(checks.CheckError, match=message) as e:
    mechanisms.run_privacy(banded.encoder, banded.participation, **kwargs)
  assert "\n" not in str(e.value)


def test_an_unknown_mechanism_is_refused_in_one_line():
  with pytest.raises(registry.RegistryError, match="unknown mechanism 'bandedd'") as e:
    registry.mechanism("bandedd")
  assert "\n" not in str(e.value)


# ----------------------------------------------------------------------------- the spec


def spec(name="banded", **kwargs):
  values = dict(total_rounds=N, clients_per_round=2, clip_norm=1.0, noise_multiplier=1.3,
                delta=DELTA)
  values.update(kwargs)
  return spec_lib.MechanismSpec.from_args(name, **values)


def test_the_spec_is_frozen_and_typed():
  s = spec(participation=participation.fixed_epoch(2), bands=3)
  assert s.mechanism is registry.mechanism("banded") and s.n == N
  assert isinstance(s.privacy, spec_lib.Privacy) and isinstance(s.clipping, spec_lib.Clipping)
  assert dict(s.params) == {"bands": 3} and s.noise_stream == "stateful"  # "auto" resolved
  with pytest.raises(TypeError):
    s.params["bands"] = 4  # pylint: disable=unsupported-assignment-operation
  with pytest.raises(AttributeError):  # dataclasses.FrozenInstanceError
    s.clients_per_round = 4
  assert spec("none", noise_multiplier=None).privacy is None


@pytest.mark.parametrize("kwargs, message", [
    (dict(noise_multiplier=1.0, target_epsilon=2.0), "give exactly one of noise_multiplier and "
                                                     "target_epsilon"),
    (dict(noise_multiplier=None), "give exactly one of noise_multiplier and target_epsilon"),
    (dict(noise_multiplier=None, target_epsilon=2.0, delta=None), "target_epsilon needs delta"),
    (dict(accountant="moments"), "accountant must be one of exact, pld, rdp, got 'moments'"),
    (dict(name="none", noise_multiplier=None, accountant="moments"),
     "accountant must be one of exact, pld, rdp"),
    (dict(name="none", noise_multiplier=1.0), "mechanism 'none' adds no noise"),
    (dict(sampling_prob=0.5), "sampling_prob applies to min_sep .* not single"),
    (dict(bands=0), "bands must be"),
    (dict(name="gaussian", bands=3), "bands does not apply to mechanism 'gaussian'"),
    (dict(name="tree", clip_norm="adaptive"), "with TFF's tree"),
    (dict(clip_norm="fixed"), "clip_norm must be a positive number or 'adaptive'"),
    (dict(target_quantile=0.3), "go with clip_norm='adaptive' only"),
    (dict(noise_stream="stateful", name="opt_prefix_sum"), "does not apply to mechanism"),
    (dict(name="tree_restart"), "cannot be trained"),
    (dict(lr_schedule="decay"), "schedule_rounds goes with lr_schedule"),
    (dict(momentum=1.5), "momentum"),
    (dict(total_rounds=0), "total_rounds"),
])
def test_the_spec_refuses_bad_input_in_one_line(kwargs, message):
  name = kwargs.pop("name", "banded")
  adaptive = {k: kwargs.pop(k) for k in ("target_quantile",) if k in kwargs}
  if adaptive:
    kwargs["adaptive"] = adaptive_clipping.AdaptiveClipping(**adaptive)
  with pytest.raises(checks.CheckError, match=message) as e:
    spec(name, **kwargs)
  assert "\n" not in str(e.value)


def test_an_accounting_spec_resolves_and_accounts_but_builds_no_run():
  """Without clip_norm and clients_per_round a spec is an accounting spec (``tff-mf account``
  builds one): the same mechanism, factorization and sensitivity as the run's spec, but
  ``mechanisms.build`` and ``plan.build`` refuse it in one line naming the two flags."""
  from tff_mf import plan  # pylint: disable=g-import-not-at-top
  run_spec = spec(participation=participation.fixed_epoch(2), bands=3)
  accounting_spec = spec(participation=participation.fixed_epoch(2), bands=3, clip_norm=None,
                         clients_per_round=None)
  assert run_spec.runnable and not accounting_spec.runnable
  assert accounting_spec.clipping is None and accounting_spec.adaptive is None
  assert accounting_spec.privacy == run_spec.privacy
  ours = mechanisms.resolve_spec(accounting_spec)
  theirs = mechanisms.resolve_spec(run_spec)
  np.testing.assert_array_equal(ours.encoder, theirs.encoder)
  assert ours.sensitivity == theirs.sensitivity
  for build in (mechanisms.build, plan.build, lambda s: s.describe(),
                lambda s: s.statement_setup()):
    with pytest.raises(checks.CheckError, match="no clip_norm and no clients_per_round") as e:
      build(accounting_spec)
    assert set(e.value.arguments) == {"clip_norm", "clients_per_round"}


@pytest.mark.parametrize("values, names", [
    ({}, "mechanism"), ({"mechanism": "gaussian"}, "total_rounds"),
    ({"mechanism": "gaussian", "total_rounds": 8}, "noise_multiplier"),
    ({"mechanism": "gaussian", "total_rounds": 8, "noise_multiplier": 1.0,
      "target_quantile": 0.5}, "target_quantile")])
def test_from_flags_refuses_missing_flags_in_one_line(values, names):
  with pytest.raises(checks.CheckError) as e:
    spec_lib.from_flags(values)
  assert names in e.value.arguments and "\n" not in str(e.value)


def test_the_plans_sampler_is_the_schemas_for_private_and_non_private_runs():
  """``Plan.make_sampler`` draws as the schema's own sampler does, also for a mechanism that
  adds no noise (no ``Privacy``, so no sampling probability of its own)."""
  from tff_mf import plan as plan_lib  # pylint: disable=g-import-not-at-top
  ids = [f"c{i}" for i in range(40)]
  for name, z in (("banded", 1.3), ("none", None)):
    built = plan_lib.build(spec(name, noise_multiplier=z,
                                participation=participation.fixed_epoch(2)))
    ours = built.make_sampler(ids, seed=3, secret=5)
    theirs = participation.fixed_epoch(2).make_sampler(ids, seed=3, total_rounds=N,
                                                       clients_per_round=2, secret=5)
    for round_num in range(1, N + 1):
      assert ours.next_round(round_num, lambda c: c)[0] == \
          theirs.next_round(round_num, lambda c: c)[0]


@pytest.mark.parametrize("kwargs", [dict(clip_norm=None), dict(clients_per_round=None),
                                    dict(clip_norm=None, target_quantile=0.3)])
def test_a_spec_has_both_clipping_and_clients_per_round_or_neither(kwargs):
  with pytest.raises(checks.CheckError) as e:
    spec(**kwargs)
  assert "\n" not in str(e.value) and "clip_norm" in str(e.value)


def test_build_returns_the_resolved_mechanism_and_its_record():
  s = spec(participation=participation.fixed_epoch(2), bands=3)
  built, record = mechanisms.build(s)
  assert built.info["bands"] == 3 and built.participation == s.participation
  assert record.epsilon == accounting.epsilon(1.3, DELTA, "exact", sensitivity=built.sensitivity)
  assert record.setup["rounds"] == N and record.setup["participation"] == s.participation.as_dict()
  none_resolved, none_record = mechanisms.build(spec("none", noise_multiplier=None))
  assert none_resolved.encoder is None and not none_record.private
  with pytest.raises(checks.CheckError, match="is not the one asked for"):
    mechanisms.build(spec(bands=2), resolved=built)


def test_epsilon_by_round_is_the_accountants_for_the_rounds_released():
  """C = I in 2 fixed epochs: after r ≤ n/2 rounds a client has joined once (sens 1), after
  more twice (sens √2) (Choquette-Choo et al. 2023, arXiv:2211.06530)."""
  _, record = mechanisms.build(spec("gaussian", participation=participation.fixed_epoch(2)))
  eps = record.epsilon_by_round()
  once = accounting.epsilon(1.3, DELTA, "exact", sensitivity=1.0)
  twice = accounting.epsilon(1.3, DELTA, "exact", sensitivity=math.sqrt(2.0))
  # The sensitivities are computed from C to participation.EXACT_RTOL, which moves ε by its
  # elasticity in sens times that; the exact accountant bisects ε to gaussian.EXACT_TOLERANCE.
  elasticity = (accounting.epsilon(1.3, DELTA, "exact", sensitivity=math.sqrt(2.0) * 1.0001)
                / twice - 1.0) / 1e-4
  rel = 2.0 * (gaussian.EXACT_TOLERANCE + elasticity * participation.EXACT_RTOL)
  assert eps[:N // 2] == pytest.approx([once] * (N // 2), rel=rel)
  assert eps[N // 2:] == [record.epsilon] * (N // 2)
  assert record.epsilon == pytest.approx(twice, rel=rel)
  assert record.epsilon_by_round(2) == eps[:2]
  _, plain = mechanisms.build(spec("gaussian", delta=None))
  with pytest.raises(checks.CheckError, match="needs a private record with delta"):
    plain.epsilon_by_round()


def test_a_family_parameter_of_its_own_flows_from_the_spec_to_its_factorization(tmp_path):
  """tests/toy_family.py declares ``ratio`` for toy_ratio: no other file names it."""
  registry.register(
      registry.Strategy("toy_ratio", "toy_family", "toy ratio", "Toeplitz C with taps r^j",
                        "none (a test family)"),
      registry.Mechanism("toy_ratio", (), "toy ratio", "the toy family with its ratio",
                         "toy_ratio", "training", "dense_rows", registry.PARTICIPATIONS))
  try:
    for ratio in (0.25, None):
      built, _ = mechanisms.build(spec("toy_ratio", ratio=ratio), cache_dir=str(tmp_path))
      expected = 0.5 if ratio is None else ratio  # the family's default
      assert built.info["ratio"] == expected
      assert built.encoder[1, 0] / built.encoder[0, 0] == pytest.approx(expected, rel=1e-12)
    with pytest.raises(checks.CheckError, match="ratio must be in") as e:
      spec("toy_ratio", ratio=2.0)
    assert "\n" not in str(e.value)
    with pytest.raises(checks.CheckError, match="ratio does not apply to mechanism 'banded'"):
      spec("banded", ratio=0.25)
  finally:
    registry.unregister(strategy_name="toy_ratio", mechanism_name="toy_ratio")


def test_the_former_noise_kind_dense_is_refused_naming_dense_rows():
  """"dense" names the optimal family; the noise kind that regenerates N's rows is
  "dense_rows". A Mechanism spelled the old way is refused in one line naming the new
  spelling, and an unknown kind is refused in one line."""
  with pytest.raises(registry.RegistryError, match="noise kind 'dense' was renamed 'dense_rows'"):
    registry.Mechanism("x", (), "x", "x", "optimal", "training", "dense")
  assert "dense" not in registry.NOISE_KINDS
  with pytest.raises(registry.RegistryError, match="noise must be one of .*got 'dens'"):
    registry.Mechanism("x", (), "x", "x", "optimal", "training", "dens")


def _pld_epsilon(event, delta, interval):
  import dp_accounting  # pylint: disable=g-import-not-at-top
  acc = dp_accounting.pld.PLDAccountant(value_discretization_interval=interval)
  return acc.compose(event).get_epsilon(delta)


@pytest.mark.parametrize("case", ["unamplified", "amplified_banded", "adaptive", "mmcc"])
def test_the_record_carries_the_runs_dp_event_where_dp_accounting_expresses_it(case, tmp_path):
  """Issue 47 item 5: the record's DpEvent is the event its ε was computed for; dp_accounting's
  PLD accountant on it gives the record's ε (pessimistic, within its discretization); MMCC's
  dominating pair is no DpEvent, so it says Unsupported, and a run without noise NonPrivate."""
  import dp_accounting  # pylint: disable=g-import-not-at-top
  delta = 1e-6
  kwargs = dict(total_rounds=16, noise_multiplier=2.0, delta=delta)
  if case == "unamplified":
    built = spec("opt_prefix_sum", participation=participation.fixed_epoch(2), **kwargs)
  elif case == "amplified_banded":
    built = spec("banded", participation=participation.min_sep(4), sampling_prob=0.25,
                 bands=4, **kwargs)
  elif case == "adaptive":
    built = spec("opt_prefix_sum", participation=participation.fixed_epoch(2),
                 clip_norm="adaptive", clipped_count_stddev=0.5, **kwargs)
  else:
    built = spec("opt_prefix_sum", participation=participation.min_sep(4), sampling_prob=0.25,
                 **kwargs)
  _, record = mechanisms.build(built, cache_dir=str(tmp_path))
  event = record.dp_event
  if case == "mmcc":
    assert record.details["analysis"] == "mmcc" and record.details["bound"] == "amplified"
    assert isinstance(event, dp_accounting.UnsupportedDpEvent)
    return
  assert record.bound == case if case != "unamplified" else record.bound == "none"
  interval = record.details.get("pld_discretization", 1e-4)
  pld = _pld_epsilon(event, delta, interval)
  # The record's ε is the exact (or the same PLD) bound of this very event: PLD is never
  # below it, and within its discretization error (interval per unit of privacy loss).
  assert record.epsilon <= pld * (1 + 1e-9) + 1e-12
  assert pld <= record.epsilon + 1e-2
  _, none = mechanisms.build(spec_lib.MechanismSpec.from_args(
      "none", total_rounds=16, clients_per_round=2, clip_norm=1.0))
  assert isinstance(none.dp_event, dp_accounting.NonPrivateDpEvent)


@pytest.mark.parametrize("name", ["banded", "bsr"])
def test_a_schema_free_family_shares_one_factorization_across_schemas(name, tmp_path):
  """banded and BSR compute C from A and the bands alone (the schema bounds the bands): one
  cache entry serves every schema, and each schema's sensitivity is computed from that C."""
  workload = workloads.WorkloadSpec(kind="momentum", n=N, momentum=0.9, lr_schedule="cooldown",
                                    schedule_rounds=4)  # not Toeplitz: dense matrices
  out = {}
  for schema in (participation.min_sep(4), participation.fixed_epoch(2),
                 participation.random_allocation(2)):
    out[schema.label] = r = mechanisms.resolve(registry.mechanism(name), workload, schema,
                                               cache_dir=str(tmp_path), bands=3)
    assert r.sensitivity == pytest.approx(participation.sensitivity(r.encoder, schema),
                                          rel=participation.EXACT_RTOL)
  assert len(os.listdir(tmp_path)) == 1
  first, *rest = out.values()
  assert not first.info["cache_hit"] and all(r.info["cache_hit"] for r in rest)
  assert all(np.array_equal(r.encoder, first.encoder) for r in rest)
  # The bands are still checked against the schema that runs them.
  with pytest.raises(checks.CheckError, match="bands"):
    mechanisms.resolve(registry.mechanism("banded"), workload, participation.min_sep(2),
                       cache_dir=str(tmp_path), bands=3)


def test_one_gram_serves_every_schema_of_one_encoder(monkeypatch):
  """A factorization analyzed under several schemas computes CᵀC (and λ_max) once; each
  report is the one computed from scratch."""
  from tff_mf.participation import bounds  # pylint: disable=g-import-not-at-top
  f = resolved("opt_prefix_sum").factorization
  schemas = [participation.fixed_epoch(2), participation.random_allocation(4),
             participation.min_sep(2, 3), participation.balls_in_bins(2)]
  fresh = [participation.sensitivity_report(f.c, s) for s in schemas]
  grams = []
  gram = bounds._gram  # pylint: disable=protected-access
  monkeypatch.setattr(bounds, "_gram", lambda c: grams.append(1) or gram(c))
  assert [f.sensitivity_report(s) for s in schemas] == fresh
  assert len(grams) == 1
