"""The accountant interface (tff_mf.accounting.analyses): one object per analysis, its own words, one
registry that the functional API, the calibration and the statement dispatch through."""

import dataclasses
import re
from typing import ClassVar

import numpy as np
import pytest

from tff_mf import accounting
from tff_mf.accounting import analyses
from tff_mf.accounting import encoder_facts
from tff_mf import checks
from tff_mf import participation
from tff_mf.accounting import statement

DELTA = 1e-6


def _prefix_sqrt(n):
  """The lower-triangular non-negative square root of the prefix-sum matrix, γ(C) = 1."""
  coef = np.ones(n)
  for k in range(1, n):
    coef[k] = coef[k - 1] * (2 * k - 1) / (2 * k)
  c = np.zeros((n, n))
  for k in range(n):
    c += np.diag(np.full(n - k, coef[k]), -k)
  return c / np.max(np.linalg.norm(c, axis=0))


def test_every_analysis_is_a_frozen_dataclass_with_its_own_words():
  for registry in (analyses.REGISTRY, analyses.ACCOUNTANTS):
    for name, cls in registry.items():
      assert cls.name == name
      assert dataclasses.is_dataclass(cls) and cls.__dataclass_params__.frozen, name
  for name, cls in analyses.REGISTRY.items():
    assert cls.label, name
    if cls.selectable:  # what a record carries as its citation names a paper
      assert re.search(r"arXiv:\d{4}\.\d{4,5}", cls.theorem), name
  for name, cls in analyses.ACCOUNTANTS.items():
    assert cls.words and cls.bound, name


def test_the_functional_api_lists_the_registry():
  assert accounting.ANALYSES == analyses.SELECTABLE
  assert set(accounting.ACCOUNTANTS) == set(analyses.ACCOUNTANTS)
  assert "monte_carlo" not in accounting.ANALYSES  # an estimate is never a run's ε
  assert not analyses.REGISTRY["monte_carlo"].bound


def test_an_estimate_cannot_be_asked_for_as_epsilon():
  with pytest.raises(checks.CheckError, match="amplification must be one of .* got 'monte_carlo'"):
    accounting.epsilon_for(_prefix_sqrt(8), participation.SINGLE, 2.0, DELTA, "monte_carlo")
  with pytest.raises(checks.CheckError, match="ESTIMATE, not an upper bound"):
    analyses.MonteCarlo().epsilon(_prefix_sqrt(8), participation.SINGLE, 2.0, DELTA)


def test_an_analysis_object_checks_its_inputs():
  c = _prefix_sqrt(8)
  for bad, match in ((dict(noise_multiplier=-1.0), "noise_multiplier"),
                     (dict(delta=1.5), "delta"), (dict(accountant_name="rdpx"), "accountant")):
    kwargs = {"noise_multiplier": 2.0, "delta": DELTA, "accountant_name": "exact", **bad}
    with pytest.raises(checks.CheckError, match=match):
      analyses.Unamplified().epsilon(c, participation.SINGLE, **kwargs)
  with pytest.raises(checks.CheckError, match="all zeros"):
    analyses.Unamplified().epsilon(np.zeros((8, 8)), participation.SINGLE, 2.0, DELTA)


@pytest.mark.parametrize("z", [2.0, 8.0])
def test_every_gaussian_accountant_bounds_the_exact_epsilon(z):
  exact = analyses.ExactGaussian().epsilon(z, DELTA)
  for name in analyses.ACCOUNTANTS:
    eps = accounting.epsilon(z, DELTA, name)
    assert eps == analyses.ACCOUNTANTS[name]().epsilon(z, DELTA)
    assert eps >= exact * (1 - 1e-12), name  # each is an upper bound on the exact ε


def test_an_analysis_object_gives_epsilon_for_its_epsilon():
  n, b, grid = 6, 2, 1e-2  # small and coarse: the same computation either way
  schema = participation.from_args("min_sep", n, min_sep=b)
  banded = np.tril(np.triu(_prefix_sqrt(n), -(b - 1)))  # b bands: the banded analysis applies
  banded /= np.max(np.linalg.norm(banded, axis=0))
  for name, c, p in (("none", _prefix_sqrt(n), None), ("amplified_banded", banded, 0.5),
                     ("mmcc", _prefix_sqrt(n), 0.5)):
    record = accounting.epsilon_for(c, schema, 2.0, DELTA, name, p, pld_discretization=grid)
    analysis = analyses.make(name, pld_discretization=grid)
    assert analysis.epsilon(c, schema, 2.0, DELTA, "exact", p) == record["epsilon"]
    assert record["analysis"] == name


def test_applies_gives_a_one_line_reason():
  c = _prefix_sqrt(16)
  min_sep = participation.from_args("min_sep", 16, min_sep=4)
  assert analyses.MMCC().applies(c, min_sep) is None
  reason = analyses.AmplifiedBanded().applies(c, min_sep)  # 16 bands > b = 4
  assert reason == analyses.MMCC.chosen_because and "\n" not in reason
  reason = analyses.RandomAllocation().applies(c, min_sep)
  assert "random_allocation" in reason and "\n" not in reason
  assert analyses.automatic(c, min_sep) == "mmcc"
  assert analyses.automatic(np.tril(np.triu(c, -3)), min_sep) == "amplified_banded"


def test_options_belong_to_their_analysis():
  assert analyses.takes(analyses.MMCC, "non_adaptive")
  assert not analyses.takes(analyses.AmplifiedBanded, "non_adaptive")
  assert analyses.make("mmcc", non_adaptive=True, pld_discretization=1e-3) == \
      analyses.MMCC(non_adaptive=True, pld_discretization=1e-3)
  assert analyses.make("none", non_adaptive=True) == analyses.Unamplified()


def test_a_new_analysis_is_one_class_and_the_statement_reads_its_words(monkeypatch):
  """Registering a class is all a new analysis needs: epsilon_for, calibrate and the
  statement reach it through the registry (here a deliberately loose bound: twice the
  unamplified ε, still an upper bound)."""

  @dataclasses.dataclass(frozen=True)
  class Doubled(analyses.Unamplified):
    name: ClassVar[str] = "doubled_for_test"
    label: ClassVar[str] = "twice the unamplified bound"
    theorem: ClassVar[str] = "a test analysis (arXiv:2202.08312 doubled)"

    def record(self, record, c, schema, z, delta, accountant_name, sampling_prob, known):
      record = super().record(record, c, schema, z, delta, accountant_name, sampling_prob,
                              known)
      record["epsilon"] *= 2.0
      return record

    def words(self, record, ratio, accountant_words, sensitivity_words):
      return f"DOUBLED-WORDS at {ratio}"

  monkeypatch.setitem(analyses.REGISTRY, Doubled.name, Doubled)
  monkeypatch.setattr(analyses, "SELECTABLE", analyses.SELECTABLE + (Doubled.name,))
  monkeypatch.setattr(statement, "ANALYSES", statement.ANALYSES + (Doubled.name,))
  c = _prefix_sqrt(8)
  plain = accounting.epsilon_for(c, participation.SINGLE, 2.0, DELTA)
  record = accounting.epsilon_for(c, participation.SINGLE, 2.0, DELTA, Doubled.name)
  assert record["epsilon"] == 2.0 * plain["epsilon"]
  text = statement.privacy_statement(record, run=False)["text"]
  assert "DOUBLED-WORDS at z/sens" in text
  calibrated = accounting.calibrate(c, participation.SINGLE, 1.0, DELTA, Doubled.name)
  assert calibrated["epsilon"] <= 1.0  # the one search, for the new analysis too


def test_calibration_takes_the_analysis_object():
  """The one search, given the object or its name with the same options, finds the same z."""
  n, b, grid = 6, 2, 1e-2
  schema = participation.from_args("min_sep", n, min_sep=b)
  c = _prefix_sqrt(n)
  by_name = accounting.calibrate(c, schema, 2.0, DELTA, "mmcc", 0.5, tolerance=1e-2,
                                 pld_discretization=grid)
  by_object = accounting.calibrate(c, schema, 2.0, DELTA, analyses.MMCC(pld_discretization=grid),
                                   0.5, tolerance=1e-2)
  assert by_object["noise_multiplier"] == by_name["noise_multiplier"]
  assert by_object["epsilon"] <= 2.0 and by_object["analysis"] == "mmcc"


def test_the_former_name_banded_is_refused_and_a_stored_record_still_reads():
  """"banded" is a strategy; the analysis is "amplified_banded". A caller who types the
  former name is refused in one line naming the new one (no alias); a stored record naming it
  reads as the analysis it named."""
  n, b, grid = 6, 2, 1e-2
  schema = participation.from_args("min_sep", n, min_sep=b)
  c = np.tril(np.triu(_prefix_sqrt(n), -(b - 1)))
  c /= np.max(np.linalg.norm(c, axis=0))
  new = accounting.epsilon_for(c, schema, 2.0, DELTA, "amplified_banded", 0.5,
                               pld_discretization=grid)
  with pytest.raises(checks.CheckError, match="'banded' was renamed 'amplified_banded'"):
    accounting.epsilon_for(c, schema, 2.0, DELTA, "banded", 0.5, pld_discretization=grid)
  assert new["analysis"] == "amplified_banded"
  stored = dict(new, analysis="banded")  # a record written before the rename
  assert analyses.of_record("banded") is analyses.AmplifiedBanded
  then, now = (statement.privacy_statement(r, run=False) for r in (stored, new))
  assert then["analysis"] == now["analysis"] and "amplified banded MF" in then["analysis"]
  assert [e["epsilon_text"] for e in then["epsilons"]] == \
      [e["epsilon_text"] for e in now["epsilons"]]
  assert "banded" not in analyses.SELECTABLE and "banded" not in analyses.REGISTRY


def test_no_analysis_shares_a_name_with_a_participation_kind_or_a_strategy():
  """One name, one meaning (dp_accounting's rule): "random_allocation" and "balls_in_bins"
  named both a participation kind and its amplified analysis; the analyses are now
  "amplified_allocation" and "amplified_fixed_bin". The former names are refused in one line
  naming the new one, and a stored record naming one still reads as the analysis it named.
  ("none", no amplification, is also the mechanism without noise: both name an absence.)"""
  from tff_mf import registry  # pylint: disable=g-import-not-at-top
  names = set(analyses.REGISTRY)
  assert not names & set(participation.CLASSES), names & set(participation.CLASSES)
  assert names & set(registry.STRATEGIES) <= {"none"}
  c, k = np.eye(16), 4
  for former, schema in (("random_allocation", participation.random_allocation(k)),
                         ("balls_in_bins", participation.balls_in_bins(k))):
    new = analyses.RENAMED[former][0]
    with pytest.raises(checks.CheckError) as e:
      accounting.epsilon_for(c, schema, 2.0, DELTA, former)
    assert f"'{former}' was renamed '{new}'" in str(e.value) and "\n" not in str(e.value)
    assert "participation kind" in str(e.value)
    record = accounting.epsilon_for(c, schema, 2.0, DELTA, new)
    assert record["analysis"] == new and record["epsilon"] < record["unamplified_epsilon"]
    assert analyses.of_record(former) is analyses.REGISTRY[new]
    then, now = (statement.privacy_statement(r, run=False)
                 for r in (dict(record, analysis=former), record))
    assert then["analysis"] == now["analysis"]
    assert [e["epsilon_text"] for e in then["epsilons"]] == \
        [e["epsilon_text"] for e in now["epsilons"]]


def test_a_calibration_derives_what_it_needs_of_c_once(monkeypatch):
  """The search evaluates one C at many z: its band count, γ and class sensitivity are
  computed once, and the calibration is the one computed without the memo. Inside the
  block another array (even an equal one) is computed afresh, and nothing outlives it."""
  c = np.tril(np.ones((16, 16))) - np.tril(np.ones((16, 16)), -4)  # 4 bands
  c = c / np.sqrt(4.0)
  schema = participation.min_sep(4)
  calls = []
  for name in ("_band_count", "_poisson_sensitivity"):
    real = getattr(analyses, name)
    monkeypatch.setattr(analyses, name,
                        lambda *a, _real=real, _name=name: calls.append(_name) or _real(*a))
  bound = accounting.calibrate(c, schema, 2.0, DELTA, "amplified_banded", sampling_prob=0.3)
  assert bound.evaluations > 3
  assert calls.count("_band_count") == 1 and calls.count("_poisson_sensitivity") == 1
  with monkeypatch.context() as m:
    m.setattr(analyses, "derived", lambda c, key, compute: compute())
    fresh = accounting.calibrate(c, schema, 2.0, DELTA, "amplified_banded", sampling_prob=0.3)
  assert bound == fresh
  wider = c.copy()
  wider[8, 0] = 0.1  # 9 bands
  with encoder_facts.same_encoder(c):
    assert analyses.band_count(c) == 4 and analyses.band_count(wider) == 9
    assert analyses.band_count(c.copy()) == 4
  assert encoder_facts._ENCODER.c is None  # pylint: disable=protected-access
