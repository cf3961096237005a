"""Client selection by the library's sampler for the spec's schema, in Flower's simulation
engine: the wrapped FedAvg sends to exactly the clients the schema's sampler draws for the
round (min-sep cyclic Poisson, balls-in-bins), however few; a round with no client still
adds its noise row; and the clients get the clip norm, which Flower's client-side
``fixedclipping_mod`` applies."""

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


class ReplyNorms(strategy_lib.MatrixFactorizationFixedClipping):
  """The wrapper, recording the norm of each update as it arrives (before the server clips)."""

  def aggregate_train(self, server_round, replies):
    replies = list(replies)
    current = self.current_arrays.to_numpy_ndarrays()
    for reply in replies:
      sent = next(iter(reply.content.array_records.values())).to_numpy_ndarrays()
      norm = np.sqrt(sum(np.sum((a.astype(np.float64) - c) ** 2) for a, c in zip(sent, current)))
      self.norms = getattr(self, "norms", []) + [float(norm)]
    return super().aggregate_train(server_round, replies)


def test_clients_with_flowers_fixedclipping_mod_clip_to_the_wrappers_norm():
  """The train config carries ζ, so Flower's client-side mod clips updates of norm 6 to ζ."""
  from flwr.clientapp.mod import fixedclipping_mod  # pylint: disable=g-import-not-at-top

  def make():
    return ReplyNorms(FedAvg(fraction_train=1.0, fraction_evaluate=0.0), "blt", total_rounds=4,
                      clients_per_round=2, clip_norm=0.25, noise_multiplier=1.0,
                      participation=participation.fixed_epoch(2), population=4)

  out = simulation.run(make, [(4,)], 4, 4, update=lambda node, a: np.full(a.size, 3.0),
                       mods=[fixedclipping_mod])
  norms = out["strategy"].norms
  # float32 models of size ≤ 4: the difference is rounded at 2⁻²⁴ of ~4, well below 1e-5
  assert len(norms) == 8 and all(abs(n - 0.25) <= 1e-5 for n in norms)
