"""Client-side clipping (issue 48, item 5): ``MatrixFactorizationClientSideFixedClipping`` with
Flower's ``fixedclipping_mod`` and ``MatrixFactorizationClientSideAdaptiveClipping`` with its
``adaptiveclipping_mod``, in Flower's simulation engine: the clients clip, the server checks
each norm and rejects (zeroes and counts) an update above ζ, reads the adaptive mod's norm bits
into the noisy count and keeps them out of the released metrics."""

import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.clientapp.mod import adaptiveclipping_mod, fixedclipping_mod
from flwr.serverapp.strategy import FedAvg
from flwr.supercore.differential_privacy import KEY_NORM_BIT

import simulation
from tff_mf import clipping
from tff_mf.flower import strategy as strategy_lib

N, K, NODES = 4, 2, 8
COMMON = dict(total_rounds=N, clients_per_round=K, noise_multiplier=1.0, delta=1e-5,
              noise_seed=3, sampling_seed=1, sampling_secret=2, population=NODES)


def fedavg():
  return FedAvg(fraction_train=1.0, fraction_evaluate=0.0)


def big_update(node, model):
  del node
  return np.full(model.shape, 5.0)  # norm 5·√d, far above every clip norm below


def test_fixed_clients_clip_and_the_server_does_not_clip_again():
  """The same released models as the server-side wrapper (the clipped sums are equal up to
  float32 rounding, and no update is rejected)."""
  def make(cls):
    return lambda: cls(fedavg(), "blt", clip_norm=1.0, **COMMON)
  client = simulation.run(make(strategy_lib.MatrixFactorizationClientSideFixedClipping),
                          [(3,)], N, NODES, update=big_update, mods=[fixedclipping_mod])
  server = simulation.run(make(strategy_lib.MatrixFactorizationFixedClipping), [(3,)], N,
                          NODES, update=big_update)
  np.testing.assert_allclose(client["models"][-1], server["models"][-1], rtol=0, atol=1e-5)


def test_a_client_that_did_not_clip_is_rejected_and_counted():
  """Without the mod the updates arrive unclipped: each is rejected (zeroed, counted), so the
  model moves by the noise alone."""
  w = simulation.run(lambda: strategy_lib.MatrixFactorizationClientSideFixedClipping(
      fedavg(), "blt", clip_norm=1.0, **COMMON), [(3,)], 1, NODES, update=big_update)
  quiet = simulation.run(lambda: strategy_lib.MatrixFactorizationClientSideFixedClipping(
      fedavg(), "blt", clip_norm=1.0, **COMMON), [(3,)], 1, NODES)
  np.testing.assert_array_equal(w["models"][-1], quiet["models"][-1])


def test_adaptive_clients_send_their_norm_bits_to_the_noisy_count_only():
  """With every true norm (8.7) far above ζ the bits say "clipped": the unclipped fraction is
  0 against the target 0.5, so ζ grows by exp(0.5·0.5) each round (Andrew et al. 2021,
  arXiv:1905.03871), where the server-side wrapper behind client-side mods saw only clipped
  norms and kept ζ near its start."""
  out = simulation.run(lambda: strategy_lib.MatrixFactorizationClientSideAdaptiveClipping(
      fedavg(), "blt", initial_clip_norm=1.0, clip_learning_rate=0.5, clipped_count_stddev=0.01,
      **COMMON), [(3,)], N, NODES, update=big_update, mods=[adaptiveclipping_mod])
  w = out["strategy"]
  assert w.clip_norm == pytest.approx(np.exp(0.25 * N), rel=0.05)


class Grid:
  def get_node_ids(self):
    return list(range(401, 401 + NODES))


@pytest.mark.usefixtures("flower_task")
def test_norm_bits_leave_the_metrics_and_a_missing_bit_is_rejected():
  w = strategy_lib.MatrixFactorizationClientSideAdaptiveClipping(fedavg(), "blt", **COMMON)
  messages = list(w.configure_train(1, ArrayRecord([np.zeros(3, np.float32)]), ConfigRecord(),
                                    Grid()))
  assert all("clipping_norm" in m.content["config"] for m in messages)

  def reply(m, metrics):
    model = m.content["arrays"].to_numpy_ndarrays()[0] + np.float32(0.01)
    return Message(RecordDict({"arrays": ArrayRecord([model]), "metrics": MetricRecord(metrics)}),
                   reply_to=m)
  replies = [reply(messages[0], {"num-examples": 1, KEY_NORM_BIT: 0}),
             reply(messages[1], {"num-examples": 1})]
  _, metrics = w.aggregate_train(1, replies)
  assert KEY_NORM_BIT not in metrics
  assert metrics[clipping.REJECTED_METRIC] == 1 and metrics[clipping.ZEROED_METRIC] == 0


def test_within_clip_allows_the_rounding_of_the_returned_model_only():
  model = np.full(1000, 100.0, np.float32)
  update = np.full(1000, 1.0 / np.sqrt(1000))
  returned = (model + update.astype(np.float32)).astype(np.float32)
  delta = returned.astype(np.float64) - model
  assert clipping.within_clip([delta], 1.0, [returned])
  assert not clipping.within_clip([delta * 1.01], 1.0, [returned])
