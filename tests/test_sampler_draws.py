"""The samplers draw exactly the clients they drew before they moved into the library.

Pinned seeds and secrets, every participation kind, a few hundred client draws each
(with empty clients skipped), compared by the sha256 of their canonical JSON against the
digests recorded on main at 1736da4 (before the samplers left ``training/sampling.py``).
A resumed run, another framework or a new release must put the same clients in the same
rounds: a change here changes who is sampled, which these digests make visible.
"""

import hashlib
import json

import numpy as np
import pytest

from tff_mf import participation
from tff_mf.participation import samplers
from training import sampling

IDS = [f"client{i:03d}" for i in range(150)]
SEED, SECRET = 7, 123456789


def _load(client_id):
  """Every seventh client (ids ending in 3 mod 7) has no data: the samplers skip it."""
  return None if int(client_id[-3:]) % 7 == 3 else client_id


def _run(sampler, rounds):
  out = []
  for t in range(1, rounds + 1):
    ids, loaded, skipped = sampler.next_round(t, _load)
    assert list(loaded) == list(ids)
    out.append([t, list(ids), int(skipped)])
  state = {name: np.asarray(value).tolist() for name, value in sampler.state().items()}
  return {"rounds": out, "state": state}


# kind -> (constructor from training.sampling, keywords, rounds run)
CASES = {
    "single": ("SinglePassSampler", dict(clients_per_round=6), 18),
    "fixed_epoch": ("FixedEpochSampler",
                    dict(total_rounds=24, epochs=4, clients_per_round=7), 24),
    "min_sep": ("CyclicPoissonSampler",
                dict(min_sep=5, sampling_prob=0.35, secret=SECRET, max_participations=4), 40),
    "min_sep_uncapped": ("CyclicPoissonSampler",
                         dict(min_sep=3, sampling_prob=0.2, secret=SECRET), 30),
    "balls_in_bins": ("BallsInBinsSampler",
                      dict(total_rounds=24, epochs=3, secret=SECRET), 24),
    "random_allocation": ("RandomAllocationSampler",
                          dict(total_rounds=24, epochs=3, secret=SECRET), 24),
}

# sha256 of json.dumps(_run(...), sort_keys=True) on main at 1736da4.
PINNED = {
    "balls_in_bins": "931b6a73d19aabf9299a0a9ecf1a52415aa3fd1b9f2a8250de06eb457d93a68d",
    "fixed_epoch": "2fcc394f40f8e0db5fd04ce5ed5a71c110fe4d0c5c9d3147cd7c8f8c6ef872d9",
    "min_sep": "f01cf9f86f90c17769c6aa3611a0ed037c1eb6ccc17df5f169307ef3427f2d64",
    "min_sep_uncapped": "f7ea36cf88d396c6cf4791a0a7ed3d8d47c0cb86df90cbb4e8a53deaab828e24",
    "random_allocation": "cec15ae0cd4e86c0aebedac608a0fd8f6249ea3ef847837da665c186974d524b",
    "single": "07175519767b1545384f797260673d8d84c35833990f0cf87f0fddd3423edc2c",
}


def _digest(draws):
  return hashlib.sha256(json.dumps(draws, sort_keys=True).encode()).hexdigest()


def draws_of(kind):
  name, kwargs, rounds = CASES[kind]
  return _run(getattr(sampling, name)(IDS, SEED, **kwargs), rounds)


@pytest.mark.parametrize("kind", sorted(CASES))
def test_samplers_draw_the_pinned_clients(kind):
  draws = draws_of(kind)
  assert sum(len(ids) for _, ids, _ in draws["rounds"]) >= 100  # a few hundred draws in all
  assert _digest(draws) == PINNED[kind]


# kind -> (schema, make_sampler keywords): the same samplers as CASES, built by each kind.
SCHEMAS = {
    "single": (participation.single(), dict(total_rounds=18, clients_per_round=6)),
    "fixed_epoch": (participation.fixed_epoch(4), dict(total_rounds=24, clients_per_round=7)),
    "min_sep": (participation.min_sep(5, 4),
                dict(total_rounds=40, sampling_prob=0.35, secret=SECRET)),
    "min_sep_uncapped": (participation.min_sep(3),
                         dict(total_rounds=30, sampling_prob=0.2, secret=SECRET)),
    "balls_in_bins": (participation.balls_in_bins(3), dict(total_rounds=24, secret=SECRET)),
    "random_allocation": (participation.random_allocation(3),
                          dict(total_rounds=24, secret=SECRET)),
}


@pytest.mark.parametrize("kind", sorted(CASES))
def test_each_kind_builds_the_sampler_that_draws_the_pinned_clients(kind):
  """The library's samplers (no harness): another framework samples the same clients."""
  schema, kwargs = SCHEMAS[kind]
  sampler = schema.make_sampler(IDS, seed=SEED, **kwargs)
  assert type(sampler).__module__ == samplers.__name__ and sampler.error is samplers.SamplingError
  assert _digest(_run(sampler, CASES[kind][2])) == PINNED[kind]


if __name__ == "__main__":
  for kind in sorted(CASES):
    print(f'    "{kind}": "{_digest(draws_of(kind))}",')
