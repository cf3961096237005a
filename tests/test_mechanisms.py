"""The numpy mechanism layer (tff_mf.mechanisms) on its own, without TensorFlow.

A registry mechanism resolves to the encoder C its noise is calibrated for, with its
family parameters and its sensitivity under the schema; the privacy record's ε is the
accountant's for that C, schema and z (Denisov et al. 2022, arXiv:2202.08312, Thm 4.1);
calibration gives ε ≤ target with z minimal to the search's tolerance; amplification
applies only to cyclic Poisson sampling without a binding cap and to random allocation
(Choquette-Choo et al. 2023, arXiv:2306.08153, Thm 4); bad input is refused in one line.
"""

import math
import subprocess
import sys

import numpy as np
import pytest

from tff_mf import accounting
from tff_mf import checks
from tff_mf import mechanisms
from tff_mf import participation
from tff_mf import registry
from tff_mf import workloads
from tff_mf.families import tree

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
          "from tff_mf import mechanisms, participation, registry, workloads\n"
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
  assert mechanisms.amplified_analysis(banded.encoder, participation.min_sep(3)) == "banded"
  assert mechanisms.amplified_analysis(banded.encoder, participation.min_sep(2)) == "mmcc"
  assert mechanisms.amplified_analysis(
      banded.encoder, participation.random_allocation(2)) == "random_allocation"


def test_amplified_record_reports_the_smaller_valid_bound(banded):
  schema = participation.min_sep(3)
  record = mechanisms.run_privacy(banded.encoder, schema, 1.0, None, DELTA, "exact",
                                  sampling_prob=0.25)
  epsilons = {c["analysis"]: c["epsilon"] for c in record.details["candidates"]}
  assert set(epsilons) == {"none", "banded"}
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
