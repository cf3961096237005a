"""Client selection by the library's sampler for the spec's schema, in Flower's simulation
engine: the wrapped FedAvg sends to exactly the clients the schema's sampler draws for the
round (min-sep cyclic Poisson, balls-in-bins), however few; a round with no client still
adds its noise row."""

import numpy as np
from flwr.serverapp.strategy import FedAvg

import simulation
from tff_mf import participation
from tff_mf.flower import strategy as strategy_lib

NODES = 16


class Recording(strategy_lib.MatrixFactorizationFixedClipping):
  """The wrapper, recording the nodes each round's messages go to."""

  def configure_train(self, server_round, arrays, config, grid):
    messages = list(super().configure_train(server_round, arrays, config, grid))
    self.sent = getattr(self, "sent", []) + [sorted(m.metadata.dst_node_id for m in messages)]
    return messages


def _run(schema, rounds, **kwargs):
  def make():
    return Recording(FedAvg(fraction_train=1.0, fraction_evaluate=0.0), "blt",
                     total_rounds=rounds, clients_per_round=2, clip_norm=1.0,
                     noise_multiplier=1.0, participation=schema, noise_seed=5, population=NODES,
                     **kwargs)
  out = simulation.run(make, [(3,)], rounds, NODES)
  return out["strategy"], out["strategy"].sent, out["models"]


def test_min_sep_sends_to_the_cyclic_poisson_draw():
  w, sent, models = _run(participation.min_sep(4), 8, sampling_prob=0.4)
  for r, nodes in enumerate(sent, start=1):
    assert nodes == sorted(int(w.sampler.client_ids[i]) for i in w.sampler.coins(r))
    # every client of round r is in class (r − 1) mod 4: a client's rounds are 4 apart
    assert all(w.sampler.residue[w.sampler.index[str(n)]] == (r - 1) % 4 for n in nodes)
  assert sum(map(len, sent)) > 0
  # clients send their model back unchanged: every round moved the model by its noise
  assert all(np.any(a != b) for a, b in zip(models[1:], models[:-1]))


def test_balls_in_bins_sends_to_each_clients_secret_bin():
  w, sent, _ = _run(participation.balls_in_bins(2), 8)
  for r, nodes in enumerate(sent, start=1):
    assert nodes == sorted(int(w.sampler.client_ids[i]) for i in w.sampler.members(r))
  for node in w.sampler.client_ids:
    rounds = [r for r, nodes in enumerate(sent, start=1) if int(node) in nodes]
    assert len(rounds) == 2 and rounds[1] - rounds[0] == 4
