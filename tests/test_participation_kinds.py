"""Participation kinds as classes: each owns its parameters, stored form, rules, sampler and
cache key (no TensorFlow).

Properties: the old single-class spelling builds the kind's class; every stored form,
including those earlier versions wrote, reads back as the scheme it was; one schema has
one cache key at n; a kind's sampler refuses with the library's error, the harness's
with its own; the kind's joinable sets equal the audit's independent enumeration.
"""

import dataclasses
import pickle

import numpy as np
import pytest

from tff_mf import audit as audit_lib
from tff_mf import checks
from tff_mf import participation as pa
from tff_mf.participation import samplers
from training import config as config_lib
from training import sampling

SCHEMAS = [pa.single(), pa.fixed_epoch(3), pa.min_sep(4), pa.min_sep(4, 2),
           pa.balls_in_bins(3), pa.random_allocation(3)]
N = 12


def test_every_kind_is_one_registered_frozen_class():
  assert set(pa.CLASSES) == set(pa.KINDS)
  for kind, cls in pa.CLASSES.items():
    assert cls.kind == kind and issubclass(cls, pa.Participation)
  for schema in SCHEMAS:
    with pytest.raises(AttributeError):
      schema.epochs = 5  # frozen
    assert pickle.loads(pickle.dumps(schema)) == schema
    assert hash(type(schema)(**{n: getattr(schema, n) for n in schema.takes})) == hash(schema)


def test_the_single_class_spelling_builds_the_kinds_class():
  assert pa.Participation() is not None and pa.Participation() == pa.SINGLE
  assert isinstance(pa.Participation("fixed_epoch", epochs=2), pa.FixedEpoch)
  assert pa.Participation("cyclic_poisson", min_sep=3) == pa.MinSep(3)
  assert pa.Participation("balls_in_bins", epochs=2) != pa.Participation("random_allocation",
                                                                         epochs=2)
  with pytest.raises(checks.CheckError, match="takes only epochs; got min_sep"):
    pa.Participation("fixed_epoch", epochs=2, min_sep=3)
  with pytest.raises(checks.CheckError, match="needs epochs"):
    pa.FixedEpoch()
  with pytest.raises(checks.CheckError, match="unknown participation"):
    pa.Participation("poisson")


@pytest.mark.parametrize("schema", SCHEMAS, ids=lambda s: s.label)
def test_each_stored_form_reads_back_as_the_scheme_it_was(schema):
  assert pa.from_dict(schema.as_dict()) == schema
  assert type(pa.from_dict(schema.as_dict())) is type(schema)
  for old in schema.legacy_dicts() + schema.cache_key_aliases(N):
    assert type(pa.from_dict(old)) is type(schema)  # never reinterpreted as another kind


def test_old_balls_in_bins_records_are_random_allocation_and_the_marker_is_fixed_bin():
  old = {"kind": "balls_in_bins", "label": "balls_in_bins-k3", "epochs": 3}
  assert pa.from_dict(old) == pa.random_allocation(3)
  assert pa.from_dict(pa.balls_in_bins(3).as_dict()) == pa.balls_in_bins(3)
  with pytest.raises(checks.CheckError, match="belongs to balls_in_bins only"):
    pa.from_dict(dict(pa.random_allocation(3).as_dict(), fixed_bin=True))


def test_one_schema_has_one_cache_key_at_n():
  """min_sep(4) from Python and from_args (the CLI) at n = 12: the same key, ⌈12/4⌉ = 3."""
  python, cli = pa.min_sep(4), pa.from_args("min_sep", N, min_sep=4)
  assert python.label.endswith("kall") and cli.label.endswith("k3")
  assert python.cache_key(N) == cli.cache_key(N) == pa.min_sep(4, 3).as_dict()
  assert python.cache_key_aliases(N) == cli.cache_key_aliases(N) == [python.as_dict()]
  assert pa.min_sep(4, 2).cache_key_aliases(N) == []  # a binding cap is another schema
  for schema in SCHEMAS:
    assert pa.from_dict(schema.cache_key(N)).for_rounds(N) == schema.for_rounds(N)
    assert schema.for_rounds(N).max_participations_in(N) == schema.max_participations_in(N)


@pytest.mark.parametrize("schema", SCHEMAS, ids=lambda s: s.label)
def test_joinable_sets_match_the_audits_independent_enumeration(schema):
  ours = sorted(schema.joinable_sets(N))
  theirs = sorted(audit_lib.canary_patterns(schema.kind, N, schema.epochs, schema.min_sep,
                                            schema.max_participations))
  assert ours == theirs
  for pattern in ours:  # within the schema's separation and participation count
    assert len(pattern) <= schema.max_participations_in(N)
    assert all(b - a >= schema.separation(N) for a, b in zip(pattern, pattern[1:]))


def test_kind_rules_used_outside_the_package():
  assert [s.at_most_once for s in SCHEMAS] == [True] + [False] * 5
  assert [s.poisson for s in SCHEMAS] == [False, False, True, True, False, False]
  assert [s.secret_sampling for s in SCHEMAS] == [False, False, True, True, True, True]
  assert [s.cyclic_cover(N) for s in SCHEMAS] == [None, (4, 3), (4, None), (4, 2), (4, 3),
                                                  None]
  assert [s.residue_period(N) for s in SCHEMAS] == [None, 4, 4, 4, 4, None]
  assert [s.epoch_length(N) for s in SCHEMAS] == [None] * 5 + [4]
  assert pa.fixed_epoch(3).poisson_period(N) == 4 and pa.min_sep(4).poisson_period(N) == 4
  for schema in (pa.single(), pa.balls_in_bins(3), pa.random_allocation(3), pa.min_sep(4, 2)):
    with pytest.raises(checks.CheckError, match="Poisson"):
      schema.poisson_period(N)
  assert pa.min_sep(4).prefix(3) == pa.SINGLE and pa.min_sep(4).prefix(8) == pa.min_sep(4)
  assert pa.fixed_epoch(3).prefix(8) is None


def test_kind_samplers_refuse_with_the_library_error_and_the_harness_with_its_own():
  ids = [f"c{i}" for i in range(3)]
  with pytest.raises(samplers.SamplingError, match="too few clients"):
    pa.single().make_sampler(ids, seed=0, total_rounds=4, clients_per_round=1)
  with pytest.raises(samplers.SamplingError, match="secret"):
    pa.random_allocation(2).make_sampler(ids, seed=0, total_rounds=4)
  assert not issubclass(samplers.SamplingError, config_lib.TrainingError)
  with pytest.raises(config_lib.TrainingError, match="secret"):
    pa.random_allocation(2).make_sampler(ids, seed=0, total_rounds=4, classes=sampling)
  sampler = pa.min_sep(2).make_sampler(ids, seed=0, total_rounds=4, sampling_prob=1.0, secret=1,
                                       classes=sampling)
  assert isinstance(sampler, sampling.CyclicPoissonSampler)
  assert isinstance(sampler, samplers.CyclicPoissonSampler)
  assert sampler.next_round(1, lambda c: c)[0] == [ids[i] for i in np.sort(sampler.members[0])]


def test_a_new_kind_is_one_class():
  """A subclass registers itself by its kind; everything else it inherits."""
  try:
    @dataclasses.dataclass(frozen=True)
    class Toy(pa.Participation):  # pylint: disable=unused-variable
      kind = "toy_kind"
    toy = pa.CLASSES["toy_kind"]()
    assert toy.label == "toy_kind" and toy.max_participations_in(5) == 1
    assert pa.sensitivity(np.eye(3), toy) == pytest.approx(1.0)
  finally:
    pa.CLASSES.pop("toy_kind", None)


def test_min_sep_patterns_refuse_a_listing_whose_partial_patterns_explode():
  """min_sep b = 1 has one maximal pattern, but listing it visited every subset of the rounds
  (2^n): ``tff-mf plan`` and ``account`` hung on a tree C at n = 128. The listing is now
  refused past limit·(n + 1) visits, and the sensitivity falls back to its valid bound."""
  schema = pa.min_sep(1)
  with pytest.raises(checks.CheckError, match="partial patterns"):
    schema.patterns(128, limit=50)
  assert schema.patterns(6, limit=50) == [tuple(range(6))]
  from tff_mf.factorization.families import tree  # pylint: disable=g-import-not-at-top
  c = np.asarray(tree.tree_encoder(128), np.float64)
  report = pa.sensitivity_report(c, schema.for_rounds(128))
  assert report["value"] >= report["lower"] > 0


def test_min_sep_patterns_too_deep_to_list_are_refused_not_a_recursion_error():
  """At n = 2048 and b = 1 a pattern has 2048 rounds, deeper than Python's recursion: the
  listing is refused with a CheckError, which ``bounds.min_sep_bounds`` catches (the
  sensitivity then keeps its Alg. 4 bound), never a RecursionError."""
  import sys  # pylint: disable=g-import-not-at-top
  n = 2 * sys.getrecursionlimit() + 2
  schema = pa.min_sep(1).for_rounds(n)
  with pytest.raises(checks.CheckError, match="deep"):
    schema.patterns(n, limit=2000)
