"""Issue 46's attacks on the Flower wrappers (``make test-flower``): the same attacks and the
same assertion as on TFF's process and the compiled engine (``tests/test_edge_attacks.py``,
``edge_attacks``), on the wrapper's own round (``configure_train`` then ``aggregate_train``
on the clients' replies), with the attacker replying or absent."""

import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp.strategy import FedAvg

import edge_attacks
from tff_mf import clipping
from tff_mf.flower import strategy as strategy_lib

K, CLIP, SERVER_LR, Z, SEED = 3, 1.0, 1.0, 0.5, 11
NODES = list(range(101, 113))  # 4 rounds × K clients, each once


class Grid:
  """The part of Flower's Grid the wrapper and FedAvg use to address a round."""

  def get_node_ids(self):
    return list(NODES)


pytestmark = pytest.mark.usefixtures("flower_task")


def wrapper(mechanism):
  return strategy_lib.MatrixFactorizationFixedClipping(
      FedAvg(fraction_train=1.0, fraction_evaluate=0.0), mechanism, total_rounds=4,
      clients_per_round=K, clip_norm=CLIP, noise_multiplier=Z, server_learning_rate=SERVER_LR,
      noise_seed=SEED, sampling_seed=1, sampling_secret=2, population=len(NODES))


def reply(message, data):
  """The client's reply: its model after one local SGD step on its example."""
  (x, y), current = data, message.content["arrays"].to_numpy_ndarrays()[0].astype(np.float64)
  delta = edge_attacks.local_update(x, y, current[:-1], current[-1])
  model = (current - delta).astype(np.float32)
  content = RecordDict({"arrays": ArrayRecord([model]),
                        "metrics": MetricRecord({"num-examples": 1})})
  return Message(content=content, reply_to=message)


def released(mechanism, clients):
  w = wrapper(mechanism)
  before = ArrayRecord([np.zeros(edge_attacks.D_IN + 1, np.float32)])
  messages = list(w.configure_train(1, before, ConfigRecord(), Grid()))
  assert len(messages) == K
  replies = [reply(m, data) for m, data in zip(messages, clients)]  # missing: absent
  out, metrics = w.aggregate_train(1, replies)
  return np.zeros(edge_attacks.D_IN + 1), out.to_numpy_ndarrays()[0], metrics


@pytest.mark.parametrize("attack", sorted(edge_attacks.ATTACKS))
@pytest.mark.parametrize("mechanism", ["gaussian", "opt_prefix_sum", "banded"])
def test_an_attacker_moves_the_release_by_at_most_its_clipped_share(mechanism, attack):
  honest = edge_attacks.HONEST
  before, with_attacker, metrics = released(mechanism, honest + [edge_attacks.ATTACKS[attack]])
  _, without, clean = released(mechanism, honest)
  edge_attacks.check_round(before, with_attacker, without, CLIP, SERVER_LR, K)
  x, y = edge_attacks.ATTACKS[attack]
  expected = int(not np.all(np.isfinite(edge_attacks.local_update(x, y, np.zeros(3), 0.0))))
  assert metrics[clipping.ZEROED_METRIC] == expected and clean[clipping.ZEROED_METRIC] == 0
