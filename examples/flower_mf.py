"""Which helps a Flower run more: correlated noise, or a participation schema? Paired over seeds.

A linear model y = x·w (8 weights) on synthetic data, trained in Flower's simulation engine
by a population of N = K·n/k clients: n rounds of K = 4 clients, each client in exactly k = 2
rounds (fixed-epoch participation, Choquette-Choo et al. 2023, arXiv:2211.06530), one small
local gradient step each. Three runs per seed, each at the same (ε, δ) = (8, 1e-5), with the
same server optimizer (the noisy mean of the clipped updates added to the model: FedAvg,
server learning rate 1, no momentum), the same clip norm and the same clients per round:

- BLT: ``MatrixFactorizationFixedClipping`` with correlated noise (BLT, Dvijotham et al.
  2024, arXiv:2404.16706), its noise multiplier calibrated to ε for the (k, b = n/k) schema,
  clients drawn by the schema's sampler;
- tff-mf independent: the same wrapper with the ``gaussian`` mechanism (independent noise)
  under the same schema, calibrated the same way;
- Flower: Flower's own ``DifferentialPrivacyServerSideFixedClipping`` over FedAvg, its noise
  multiplier calibrated with Flower's ``RdpAccountant``, which has no participation schema
  (``NO_AMPLIFICATION``): it composes all n rounds for every client, and FedAvg samples the
  K clients of a round at random.

BLT against tff-mf independent isolates the correlated noise; tff-mf independent against
Flower isolates the participation schema (with its accounting: tff-mf's accountant for the
schema against Flower's RDP composition). Each seed pins the noise, tff-mf's sampler and
Flower's random draws; the difference of held-out losses between two runs of the same seed
is one paired sample, and the 95% interval is Student's t on those differences. The
conclusion printed at the end is computed from them.

  .venv-flower/bin/python examples/flower_mf.py            # n = 64 rounds, 5 seeds
  .venv-flower/bin/python examples/flower_mf.py --quick    # n = 16 rounds, 5 seeds (tests)

All runs share one simulated federation: the ServerApp runs them one after another. It uses
``flwr.simulation.run_simulation``, which Flower 1.42 marks deprecated in favour of ``flwr
run``: ``flwr run`` builds and installs an App and a fresh dependency environment and starts
the simulation engine for each run (about 40 s each here), which for 3 × 5 runs would cost
ten minutes of start-up alone. examples/flower_app shows tff-mf under ``flwr run``.
"""

import argparse
import logging
import random
import sys
import time
import warnings

import numpy as np
import tqdm
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import (GaussianPrivacyEvent, Grid, NeighboringRelation, PrivacyConfig,
                            RdpAccountant, SamplingMethod, ServerApp)
from flwr.serverapp.strategy import DifferentialPrivacyServerSideFixedClipping, FedAvg
from flwr.simulation import run_simulation
from scipy import stats

from tff_mf import participation
from tff_mf.flower import strategy as mf_strategy

SEEDS = (1, 2, 3, 4, 5)
PER_ROUND, EPOCHS = 4, 2
EPSILON, DELTA, CLIP = 8.0, 1e-5, 0.2
# One small local step a round: each round moves the model a little, so that the model
# carries the noise of many past rounds (as in deep-learning training), where correlated
# noise can matter; five large steps would make it forget all but the last round's noise.
LOCAL_STEPS, LOCAL_LR = 1, 0.02
TRUE_W = np.linspace(-2.0, 2.0, 8).astype(np.float32)
HELD_OUT = np.random.default_rng(1).normal(size=(256, TRUE_W.size)).astype(np.float32)
PARTITION = "partition"  # the train config's key: which data a node holds


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
  """LOCAL_STEPS steps of gradient descent on the squared loss of the partition the server
  names."""
  del context
  w = msg.content["arrays"].to_numpy_ndarrays()[0]
  x, y = client_data(int(msg.content["config"][PARTITION]))
  for _ in range(LOCAL_STEPS):
    w = w - LOCAL_LR * (2.0 / len(y)) * x.T @ (x @ w - y)
  return Message(RecordDict({"arrays": ArrayRecord([w.astype(np.float32)]),
                             "metrics": MetricRecord({"num-examples": len(y)})}), reply_to=msg)


def in_order(node_ids):
  """Node ids in the order of their decimal strings, the order tff-mf's samplers keep client
  ids in. Flower's simulation draws node ids at random: ranked so, a seed pins which data
  partitions each strategy samples."""
  return sorted(node_ids, key=str)


class SortedGrid:
  """The grid with its node ids ``in_order``."""

  def __init__(self, grid):
    self._grid = grid

  def get_node_ids(self):
    return in_order(self._grid.get_node_ids())

  def __getattr__(self, name):
    return getattr(self._grid, name)


class PartitionedFedAvg(FedAvg):
  """FedAvg that tells each sampled node its data partition: the rank of its id."""

  def __init__(self, node_ids, **kwargs):
    super().__init__(**kwargs)
    self.rank = {node: i for i, node in enumerate(in_order(node_ids))}

  def configure_train(self, server_round, arrays, config, grid):
    messages = list(super().configure_train(server_round, arrays, config, grid))
    for m in messages:
      m.content["config"] = ConfigRecord(dict(m.content["config"],
                                              **{PARTITION: self.rank[m.metadata.dst_node_id]}))
    return messages


def privacy_config(population: int) -> PrivacyConfig:
  return PrivacyConfig(target_delta=DELTA, population_size=population,
                       neighboring_relation=NeighboringRelation.ADD_OR_REMOVE_ONE,
                       sampling_method=SamplingMethod.NO_AMPLIFICATION)


def flower_noise_multiplier(rounds: int, population: int) -> float:
  """The smallest z (bisection, relative 1e-3) whose ``rounds`` composed Gaussians have
  ε ≤ EPSILON by Flower's RdpAccountant."""
  def epsilon(z):
    accountant = RdpAccountant(privacy_config(population))
    accountant.compose(GaussianPrivacyEvent(noise_multiplier=z, sample_size=PER_ROUND,
                                            population_size=population), count=rounds)
    return accountant.get_epsilon(DELTA)
  lo, hi = 0.1, 100.0
  while hi / lo > 1.001:
    mid = (lo * hi) ** 0.5
    lo, hi = (lo, mid) if epsilon(mid) <= EPSILON else (mid, hi)
  return hi


def strategies(rounds: int, population: int, node_ids, seed: int, z_flower: float):
  """The three strategies of one seed, by name."""
  def tff_mf(mechanism):
    return mf_strategy.MatrixFactorizationFixedClipping(
        PartitionedFedAvg(node_ids, fraction_train=1.0, fraction_evaluate=0.0), mechanism,
        total_rounds=rounds, clipping_norm=CLIP, num_sampled_clients=PER_ROUND,
        target_epsilon=EPSILON, delta=DELTA, participation=participation.fixed_epoch(EPOCHS),
        privacy_config=privacy_config(population), noise_seed=seed, sampling_seed=seed,
        sampling_secret=seed)
  flower = DifferentialPrivacyServerSideFixedClipping(
      PartitionedFedAvg(node_ids, fraction_train=PER_ROUND / population, fraction_evaluate=0.0,
                        min_train_nodes=PER_ROUND, min_available_nodes=population),
      z_flower, CLIP, PER_ROUND, accountant=RdpAccountant(privacy_config(population)))
  return {"BLT": tff_mf("blt"), "tff-mf independent": tff_mf("gaussian"), "Flower": flower}


def run_all(rounds: int):
  """({method: [final held-out loss per seed]}, {method: (z, ε)}): every run in one
  simulation, with one progress bar over the runs on stderr."""
  population = PER_ROUND * rounds // EPOCHS
  z_flower = flower_noise_multiplier(rounds, population)
  losses, privacy = {}, {}
  server = ServerApp()
  bar = tqdm.tqdm(total=3 * len(SEEDS), desc=f"runs of {rounds} rounds", unit="run")

  @server.main()
  def main(grid: Grid, context: Context) -> None:
    del context
    grid = SortedGrid(grid)
    while len(node_ids := grid.get_node_ids()) < population:  # all nodes registered
      time.sleep(0.2)
    for seed in SEEDS:
      for name, strategy in strategies(rounds, population, node_ids, seed, z_flower).items():
        random.seed(seed)  # Flower's sampling (random) and noise (numpy's global generator)
        np.random.seed(seed)
        result = strategy.start(grid=grid, num_rounds=rounds,
                                initial_arrays=ArrayRecord([np.zeros_like(TRUE_W)]))
        losses.setdefault(name, []).append(loss(result.arrays.to_numpy_ndarrays()[0]))
        z = (strategy.record.noise_multiplier if name != "Flower"
             else strategy.noise_multiplier)
        privacy[name] = (z, strategy.privacy_spent().epsilon)
        bar.update()

  run_simulation(server_app=server, client_app=client, num_supernodes=population,
                 backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0},
                                 "init_args": {"num_cpus": 1, "include_dashboard": False}})
  bar.close()
  if bar.n != bar.total:  # the engine logs a ServerApp's error and carries on
    sys.exit(f"the simulation stopped after {bar.n} of {bar.total} runs (its log above says "
             "why)")
  return losses, privacy


def paired_interval(a, b):
  """Mean of the per-seed differences a − b and its 95% Student-t half-width."""
  d = np.asarray(a, np.float64) - np.asarray(b, np.float64)
  half = stats.t.ppf(0.975, len(d) - 1) * d.std(ddof=1) / np.sqrt(len(d))
  return float(d.mean()), float(half)


def conclusion(losses) -> list:
  """The report's lines: each effect's paired gain (positive: lower loss) and which is larger."""
  blt, ind, flw = (losses[k] for k in ("BLT", "tff-mf independent", "Flower"))
  noise = paired_interval(ind, blt)  # correlated noise: independent − BLT, same schema
  schema = paired_interval(flw, ind)  # the schema: Flower − independent, same noise kind
  # Per seed: schema gain − correlated-noise gain.
  which = paired_interval(np.asarray(flw) - np.asarray(ind), np.asarray(ind) - np.asarray(blt))

  def said(name, m, h):
    sign = "lowers" if m > 0 else "raises"
    sure = ("the interval excludes 0" if abs(m) > h else "the interval includes 0: not resolved"
            " at 95%")
    return f"{name} {sign} the loss by {abs(m):.4f} ± {h:.4f} (95%, paired t; {sure})"

  lines = [said("correlated noise (BLT vs independent, same schema)", *noise),
           said("the participation schema (tff-mf independent vs Flower)", *schema)]
  m, h = which
  if abs(m) <= h:
    lines.append(f"neither effect won at 95%: their difference is {m:.4f} ± {h:.4f}")
  else:
    winner = ("the participation schema" if m > 0 else "correlated noise")
    lines.append(f"{winner} won, by {abs(m):.4f} ± {h:.4f} in loss (95%, paired t)")
  return lines


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--quick", action="store_true", help="n = 16 rounds (tests), not 64")
  rounds = 16 if parser.parse_args().quick else 64
  logging.getLogger("flwr").setLevel(logging.WARNING)
  warnings.filterwarnings("ignore", category=FutureWarning)
  losses, privacy = run_all(rounds)
  print(f"n = {rounds} rounds, K = {PER_ROUND} clients a round, each client in {EPOCHS} rounds "
        f"(population {PER_ROUND * rounds // EPOCHS}), seeds {list(SEEDS)}; initial loss "
        f"{loss(np.zeros_like(TRUE_W)):.4f}")
  for name, values in losses.items():
    z, eps = privacy[name]
    print(f"{name:<18} z {z:.3f}, epsilon {eps:.3f}, loss {np.mean(values):.4f} "
          f"(per seed {', '.join(f'{v:.4f}' for v in values)})")
  for line in conclusion(losses):
    print(line)


if __name__ == "__main__":
  main()
