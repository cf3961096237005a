"""Client samplers under the participation schemas, and the participation record (no TensorFlow).

Fixed epochs: b = n/k cohorts taken in order, each client in one cohort and in the rounds
j, j + b, ... (Choquette-Choo et al. 2023, arXiv:2211.06530). b-min-sep: residue classes
mod b with Poisson coins of probability p (Choquette-Choo et al. 2023, arXiv:2306.08153),
optionally capped at k participations. Resuming restores the same clients.
"""

import collections

import numpy as np
import pytest
from scipy import stats

from tff_mf import participation
from training import config as config_lib
from training import sampling
from training.config import TrainingError

IDS = [f"c{i:04d}" for i in range(120)]


def identity_load(client_id):
  return client_id


def run_rounds(sampler, rounds, load=identity_load, start=1):
  return [sampler.next_round(t, load)[0] for t in range(start, start + rounds)]


def rounds_of_each_client(rounds, start=1):
  out = collections.defaultdict(list)
  for t, ids in enumerate(rounds, start):
    for c in ids:
      out[c].append(t)
  return out


def config(**kw):
  values = dict(mechanism="none", dataset="synthetic", total_rounds=12, clients_per_round=5)
  values.update(kw)
  return config_lib.TrainingConfig(**values)


# ----------------------------------------------------------------------------- fixed epochs


def test_fixed_epoch_cohorts_are_taken_in_order_each_client_every_b_rounds():
  n, k, per_round = 12, 3, 5
  b = n // k
  sampler = sampling.FixedEpochSampler(IDS, seed=1, total_rounds=n, epochs=k,
                                       clients_per_round=per_round)
  rounds = run_rounds(sampler, n)
  assert all(len(r) == per_round for r in rounds)
  for t in range(b + 1, n + 1):
    assert rounds[t - 1] == rounds[t - 1 - b]  # the same cohort every b rounds
  cohorts = [set(rounds[j]) for j in range(b)]
  assert sum(len(c) for c in cohorts) == len(set().union(*cohorts)) == b * per_round
  for client, joined in rounds_of_each_client(rounds).items():
    assert len(joined) == k
    assert np.all(np.diff(joined) == b), (client, joined)
  assert sampler.cursor == b * per_round
  assert set().union(*cohorts) != set(IDS[:b * per_round])  # a seeded permutation


def test_fixed_epoch_skips_empty_clients_when_forming_a_cohort_and_keeps_them_out():
  empty = set(IDS[::3])
  load = lambda c: None if c in empty else c  # pylint: disable=unnecessary-lambda-assignment
  sampler = sampling.FixedEpochSampler(IDS, seed=2, total_rounds=8, epochs=2,
                                       clients_per_round=6)
  skipped = [sampler.next_round(t, load)[2] for t in range(1, 9)]
  assert sum(skipped[:4]) > 0 and skipped[4:] == [0] * 4
  assert not empty & set(sampler.client_ids[i] for i in sampler.cohorts.ravel())


def test_fixed_epoch_needs_b_cohorts_of_clients_and_says_so_with_the_numbers():
  with pytest.raises(TrainingError, match=r"b = 6 cohorts.*--clients_per_round=25.*150 "
                                          r"distinct clients.*120 training clients"):
    sampling.build_sampler(config(participation="fixed_epoch", epochs=2, clients_per_round=25),
                           IDS)
  assert isinstance(sampling.build_sampler(
      config(participation="fixed_epoch", epochs=2, clients_per_round=20), IDS),
                    sampling.FixedEpochSampler)
  with pytest.raises(TrainingError, match="must divide"):
    config(participation="fixed_epoch", epochs=5).validate()


def test_fixed_epoch_loads_each_client_once_per_session():
  calls = collections.Counter()

  def load(c):
    calls[c] += 1
    return c

  sampler = sampling.FixedEpochSampler(IDS, seed=4, total_rounds=12, epochs=3,
                                       clients_per_round=5)
  rounds = [sampler.next_round(t, load)[0] for t in range(1, 13)]
  assert len(calls) == 20 and set(calls.values()) == {1}
  assert rounds[4:8] == rounds[:4] == rounds[8:]


def test_fixed_epoch_sampler_resumes_with_the_same_cohorts():
  a = sampling.FixedEpochSampler(IDS, seed=3, total_rounds=12, epochs=2, clients_per_round=4)
  straight = run_rounds(a, 12)
  b = sampling.FixedEpochSampler(IDS, seed=3, total_rounds=12, epochs=2, clients_per_round=4)
  first = run_rounds(b, 4)
  c = sampling.FixedEpochSampler(IDS, seed=3, total_rounds=12, epochs=2, clients_per_round=4)
  c.restore(b.state())
  assert first + run_rounds(c, 8, start=5) == straight


# ----------------------------------------------------------------------------- min sep


def min_sep_sampler(b=4, p=0.3, secret=99, cap=None, ids=IDS, seed=5):
  return sampling.MinSepSampler(ids, seed=seed, min_sep=b, sampling_prob=p, secret=secret,
                                max_participations=cap)


def test_min_sep_clients_stay_in_their_residue_class():
  b = 4
  sampler = min_sep_sampler(b=b, p=0.5)
  sizes = sampler.class_sizes()
  assert sizes == (len(IDS) // b, len(IDS) // b)  # balanced classes
  rounds = run_rounds(sampler, 40)
  for client, joined in rounds_of_each_client(rounds).items():
    r = sampler.residue[sampler.index[client]]
    assert all((t - 1) % b == r for t in joined), (client, joined)
    assert np.all(np.diff(joined) >= b) and np.all(np.diff(joined) % b == 0)
  assert max(len(j) for j in rounds_of_each_client(rounds).values()) > 1


def test_min_sep_cap_limits_participations():
  sampler = min_sep_sampler(b=2, p=0.9, cap=3)
  joined = rounds_of_each_client(run_rounds(sampler, 30))
  assert max(len(j) for j in joined.values()) == 3
  assert np.all(sampler.counts <= 3)


def test_min_sep_poisson_rate_is_p_in_every_eligible_round():
  """Each (client, eligible round) is joined with probability p, independently."""
  ids = [f"u{i:05d}" for i in range(2000)]
  b, p, rounds = 5, 0.07, 50
  sampler = min_sep_sampler(b=b, p=p, ids=ids)
  counts = [len(sampler.next_round(t, identity_load)[0]) for t in range(1, rounds + 1)]
  trials = rounds * len(ids) // b
  total = sum(counts)
  # Two-sided exact binomial test at level 1e-6 (a fixed seed: this never flakes).
  assert stats.binomtest(total, trials, p).pvalue > 1e-6, (total, trials * p)
  # Per-round counts are Binomial(|class|, p): their dispersion matches too (χ², 50 dof).
  m = len(ids) // b
  dispersion = np.sum((np.array(counts) - m * p) ** 2) / (m * p * (1 - p))
  assert 1e-6 < stats.chi2.cdf(dispersion, rounds) < 1 - 1e-6, dispersion
  joined = rounds_of_each_client([sampler.next_round(t, identity_load)[0]
                                  for t in range(rounds + 1, rounds + 1 + 10 * b)],
                                 start=rounds + 1)
  per_client = np.array([len(joined.get(c, [])) for c in ids])
  assert stats.binomtest(int(per_client.sum()), 10 * len(ids), p).pvalue > 1e-6


def test_min_sep_round_clients_depend_only_on_the_secret_and_the_round():
  a = run_rounds(min_sep_sampler(secret=7), 20)
  b = min_sep_sampler(secret=7)
  assert [b.next_round(t, identity_load)[0] for t in (20, 3, 11)] == [a[19], a[2], a[10]]
  assert run_rounds(min_sep_sampler(secret=8), 20) != a
  capped = min_sep_sampler(secret=7, cap=1)
  first = run_rounds(capped, 6)
  resumed = min_sep_sampler(secret=7, cap=1)
  resumed.restore(capped.state())
  straight = min_sep_sampler(secret=7, cap=1)
  assert first + run_rounds(resumed, 10, start=7) == run_rounds(straight, 16)


def test_min_sep_without_secret_is_refused():
  with pytest.raises(TrainingError, match="secret"):
    min_sep_sampler(secret=-1)


def test_min_sep_flags_go_together():
  with pytest.raises(TrainingError, match="needs --min_sep=b and --sampling_prob"):
    config(participation="min_sep", min_sep=3).validate()
  with pytest.raises(TrainingError, match="does not apply"):
    config(participation="single", min_sep=3).validate()
  with pytest.raises(TrainingError, match="does not apply"):
    config(participation="min_sep", min_sep=3, sampling_prob=0.5, epochs=2).validate()
  with pytest.raises(TrainingError, match="sampling_prob"):
    config(participation="min_sep", min_sep=3, sampling_prob=1.5).validate()
  config(participation="min_sep", min_sep=3, sampling_prob=0.5).validate()


# ----------------------------------------------------------------------------- the record


def test_participation_log_records_and_checks_the_schema():
  n = 12
  log = sampling.ParticipationLog(IDS, period=4)
  for t, ids in ((1, ["c0000", "c0001"]), (5, ["c0000"]), (9, ["c0000", "c0001"])):
    log.observe(t, ids)
  seen = log.observed()
  assert seen["max_participations"] == 3 and seen["min_separation"] == 4
  assert seen["distinct_clients"] == 2 and seen["client_rounds"] == 5 and seen["rounds"] == 3
  assert log.violations(participation.fixed_epoch(3), n) == []
  assert log.violations(participation.Participation("min_sep", min_sep=4), n) == []
  broken = log.violations(participation.fixed_epoch(2), n)  # b = 6, k = 2
  assert any("joined 3 rounds" in v for v in broken)
  assert any("4 apart" in v for v in broken)
  assert log.violations(participation.SINGLE, n)
  log.observe(10, ["c0001"])  # one round after its last: separation 1, off its class
  assert log.observed()["min_separation"] == 1
  assert any("residue class" in v for v in log.violations(participation.from_args(
      "min_sep", n, min_sep=1), n))
  restored = sampling.ParticipationLog(IDS, period=4)
  restored.restore(log.state())
  assert restored.observed() == log.observed()


def test_single_pass_log_has_no_separation():
  log = sampling.ParticipationLog(IDS)
  log.observe(1, IDS[:3])
  log.observe(2, IDS[3:6])
  assert log.observed()["min_separation"] is None
  assert log.violations(participation.SINGLE, 2) == []


# ----------------------------------------------------------------------------- random allocation


def bib_sampler(n=12, k=3, secret=99, ids=IDS, seed=5):
  return sampling.RandomAllocationSampler(ids, seed=seed, total_rounds=n, epochs=k, secret=secret)


def test_random_allocation_each_client_exactly_once_per_epoch():
  n, k = 12, 3
  b = n // k
  sampler = bib_sampler(n, k)
  joined = rounds_of_each_client(run_rounds(sampler, n))
  assert set(joined) == set(IDS)
  for client, rounds in joined.items():
    assert [(t - 1) // b for t in rounds] == list(range(k)), (client, rounds)
  assert np.all(sampler.counts == k)
  log = sampling.ParticipationLog(IDS, epoch_length=b)
  for t, ids in enumerate(run_rounds(bib_sampler(n, k), n), 1):
    log.observe(t, ids)
  assert log.violations(participation.random_allocation(k), n) == []
  assert log.observed()["repeats_within_an_epoch"] == 0


def test_random_allocation_round_is_uniform_and_independent_across_epochs():
  """Per epoch the round of a client is Uniform{0..b−1}; epochs are independent (χ² tests)."""
  ids = [f"u{i:05d}" for i in range(4000)]
  n, k = 20, 4
  b = n // k
  sampler = bib_sampler(n, k, ids=ids, secret=1234)
  slot = np.zeros((k, len(ids)), np.int64)
  for t in range(1, n + 1):
    chosen, _, _ = sampler.next_round(t, identity_load)
    slot[(t - 1) // b, [sampler.index[c] for c in chosen]] = (t - 1) % b
  for e in range(k):  # uniform over the b rounds of the epoch
    observed = np.bincount(slot[e], minlength=b)
    assert stats.chisquare(observed).pvalue > 1e-6, observed
  for e in range(k - 1):  # the pair (round in epoch e, round in epoch e + 1) is independent
    table = np.zeros((b, b))
    np.add.at(table, (slot[e], slot[e + 1]), 1)
    assert stats.chi2_contingency(table)[1] > 1e-6
  # Rounds of one epoch depend only on the secret and the round; another secret, others.
  again = bib_sampler(n, k, ids=ids, secret=1234)
  assert again.next_round(7, identity_load)[0] == sampler.next_round(7, identity_load)[0]
  assert bib_sampler(n, k, ids=ids, secret=1).next_round(7, identity_load)[0] != \
      sampler.next_round(7, identity_load)[0]


def test_random_allocation_resumes_and_refuses_what_breaks_it():
  first = bib_sampler()
  head = run_rounds(first, 5)
  resumed = bib_sampler()
  resumed.restore(first.state())
  assert head + run_rounds(resumed, 7, start=6) == run_rounds(bib_sampler(), 12)
  assert np.array_equal(resumed.counts, np.full(len(IDS), 3))
  with pytest.raises(TrainingError, match="secret"):
    bib_sampler(secret=-1)
  with pytest.raises(TrainingError, match="outside"):
    bib_sampler().next_round(13, identity_load)
  # The record catches a client twice in one epoch (a sampler that broke the schema).
  log = sampling.ParticipationLog(IDS, epoch_length=4)
  log.observe(1, ["c0000"])
  log.observe(3, ["c0000"])
  violations = log.violations(participation.random_allocation(3), 12)
  assert any("within one epoch" in v for v in violations)
  restored = sampling.ParticipationLog(IDS, epoch_length=4)
  restored.restore(log.state())
  assert restored.observed() == log.observed()


def test_random_allocation_and_cyclic_poisson_flags():
  with pytest.raises(TrainingError, match="needs --epochs"):
    config(participation="random_allocation").validate()
  with pytest.raises(TrainingError, match="does not apply"):
    config(participation="random_allocation", epochs=3, sampling_prob=0.5).validate()
  cfg = config(participation="random_allocation", epochs=3)
  cfg.validate()
  assert cfg.schema() == participation.random_allocation(3)
  assert isinstance(sampling.build_sampler(cfg, IDS, 5), sampling.RandomAllocationSampler)
  assert sampling.build_log(cfg, IDS).epoch_length == 4
  cyclic = config(participation="cyclic_poisson", min_sep=3, sampling_prob=0.5)
  cyclic.validate()
  assert cyclic.participation == "min_sep"
  assert cyclic.fingerprint() == config(participation="min_sep", min_sep=3,
                                        sampling_prob=0.5).fingerprint()
  assert isinstance(sampling.build_sampler(cyclic, IDS, 5), sampling.CyclicPoissonSampler)
