"""Flower with matrix-factorization noise (BLT) beside Flower's own independent-noise DP.

A linear model y = x·w on synthetic data, trained by 32 Flower clients in Flower's
simulation engine: 16 rounds of 4 clients, every client in 2 rounds (fixed-epoch
participation: 2 epochs over 8 cohorts). Two runs at the same (ε, δ):

- ``MatrixFactorizationFixedClipping`` (tff-mf): BLT noise with momentum 0.9, its noise
  multiplier calibrated to ε for the (k = 2, b = 8) schema, clients drawn by the schema's
  sampler;
- Flower's ``DifferentialPrivacyServerSideFixedClipping`` over FedAvg: independent noise,
  its multiplier calibrated with Flower's ``RdpAccountant`` (no amplification: Flower's
  accountant has no participation schema, so it composes all 16 rounds for every client;
  it samples the 4 clients of a round at random).

It prints each run's ε and held-out loss.

  .venv-flower/bin/python examples/flower_mf.py
"""

import logging

import numpy as np
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import (GaussianPrivacyEvent, Grid, NeighboringRelation, PrivacyConfig,
                            RdpAccountant, SamplingMethod, ServerApp)
from flwr.serverapp.strategy import DifferentialPrivacyServerSideFixedClipping, FedAvg
from flwr.simulation import run_simulation

from tff_mf import participation
from tff_mf.flower import strategy as mf_strategy

CLIENTS, ROUNDS, PER_ROUND, EPOCHS = 32, 16, 4, 2
EPSILON, DELTA, CLIP = 8.0, 1e-5, 1.0
TRUE_W = np.array([1.0, -2.0, 0.5, 3.0], np.float32)
HELD_OUT = np.random.default_rng(1).normal(size=(256, TRUE_W.size)).astype(np.float32)


def client_data(partition: int):
  """Client ``partition``'s 16 examples (a fixed generator per client: the data, not noise)."""
  rng = np.random.default_rng(1000 + partition)
  x = rng.normal(size=(16, TRUE_W.size)).astype(np.float32)
  return x, x @ TRUE_W + 0.1 * rng.normal(size=16).astype(np.float32)


def loss(w: np.ndarray) -> float:
  return float(np.mean((HELD_OUT @ (w - TRUE_W)) ** 2))


client = ClientApp()


@client.train()
def train(msg: Message, context: Context) -> Message:
  """Five steps of gradient descent on the client's squared loss."""
  w = msg.content["arrays"].to_numpy_ndarrays()[0]
  x, y = client_data(int(context.node_config["partition-id"]))
  for _ in range(5):
    w = w - 0.1 * (2.0 / len(y)) * x.T @ (x @ w - y)
  return Message(RecordDict({"arrays": ArrayRecord([w.astype(np.float32)]),
                             "metrics": MetricRecord({"num-examples": len(y)})}), reply_to=msg)


def flower_noise_multiplier() -> float:
  """The smallest z (bisection, relative 1e-3) whose 16 composed Gaussians have ε ≤ EPSILON
  by Flower's RdpAccountant."""
  def epsilon(z):
    accountant = RdpAccountant(privacy_config(None))
    accountant.compose(GaussianPrivacyEvent(noise_multiplier=z, sample_size=PER_ROUND,
                                            population_size=CLIENTS), count=ROUNDS)
    return accountant.get_epsilon(DELTA)
  lo, hi = 0.1, 100.0
  while hi / lo > 1.001:
    mid = (lo * hi) ** 0.5
    lo, hi = (lo, mid) if epsilon(mid) <= EPSILON else (mid, hi)
  return hi


def privacy_config(max_epsilon):
  return PrivacyConfig(target_delta=DELTA, population_size=CLIENTS,
                       neighboring_relation=NeighboringRelation.ADD_OR_REMOVE_ONE,
                       sampling_method=SamplingMethod.NO_AMPLIFICATION,
                       max_epsilon=max_epsilon)


def run(make_strategy) -> dict:
  """Runs the federation with the strategy ``make_strategy()``; its final loss and ε."""
  out = {}
  server = ServerApp()

  @server.main()
  def main(grid: Grid, context: Context) -> None:
    del context
    strategy = make_strategy()
    result = strategy.start(grid=grid, initial_arrays=ArrayRecord([np.zeros(4, np.float32)]),
                            num_rounds=ROUNDS)
    out["loss"] = loss(result.arrays.to_numpy_ndarrays()[0])
    out["epsilon"] = strategy.privacy_spent().epsilon

  run_simulation(server_app=server, client_app=client, num_supernodes=CLIENTS,
                 backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0},
                                 "init_args": {"num_cpus": 1, "include_dashboard": False}})
  return out


def main() -> None:
  logging.getLogger("flwr").setLevel(logging.WARNING)
  mf = run(lambda: mf_strategy.MatrixFactorizationFixedClipping(
      FedAvg(fraction_train=1.0, fraction_evaluate=0.0), "blt", total_rounds=ROUNDS,
      clients_per_round=PER_ROUND, clip_norm=CLIP, target_epsilon=EPSILON, delta=DELTA,
      momentum=0.9, server_learning_rate=0.5, participation=participation.fixed_epoch(EPOCHS),
      privacy_config=privacy_config(None)))
  z = flower_noise_multiplier()
  flower = run(lambda: DifferentialPrivacyServerSideFixedClipping(
      # (waits for every client to connect, so that a round samples PER_ROUND of them)
      FedAvg(fraction_train=PER_ROUND / CLIENTS, fraction_evaluate=0.0,
             min_train_nodes=PER_ROUND, min_available_nodes=CLIENTS), noise_multiplier=z,
      clipping_norm=CLIP, num_sampled_clients=PER_ROUND,
      accountant=RdpAccountant(privacy_config(None))))
  print(f"initial loss {loss(np.zeros(4, np.float32)):.4f}")
  print(f"tff-mf BLT (fixed epochs k={EPOCHS}): epsilon {mf['epsilon']:.3f}, "
        f"loss {mf['loss']:.4f}")
  print(f"Flower independent noise (z={z:.3f}): epsilon {flower['epsilon']:.3f}, "
        f"loss {flower['loss']:.4f}")


if __name__ == "__main__":
  main()
