"""Seconds per DP-FedAvg round: single process vs. CoordinatorContext over local worker_binary services.

Usage: .venv/bin/python benchmarks/bench_distributed.py [--rounds 4] [--clients 4] [--examples 400]
(``--smoke``: 1 timed round, 2 clients, a tiny model; seconds)

FedAvg (unweighted) with the opt_prefix_sum matrix-factorization aggregator
(Denisov Table 1) on a dense model; the baseline is TFF's default local C++
context in the same process and run. Reports the median seconds per round
after one warm-up round and the ratio to the baseline, for 1 and 2 local
workers, and how far each round's model is from the single-process one. Writes
benchmarks/results/distributed.md and distributed.png.
"""

import argparse
import os
import platform
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # pylint: disable=g-import-not-at-top


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--rounds", type=int, default=4)
  parser.add_argument("--clients", type=int, default=4)
  parser.add_argument("--examples", type=int, default=400)
  parser.add_argument("--hidden", type=int, default=256)
  parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results"))
  parser.add_argument("--smoke", action="store_true", help="a tiny configuration (seconds)")
  args = parser.parse_args(argv)
  if args.smoke:
    args.rounds, args.clients, args.examples, args.hidden = 1, 2, 16, 8
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
  from tff_mf.spec import MechanismSpec  # pylint: disable=g-import-not-at-top
  from tff_mf.tf import aggregators  # pylint: disable=g-import-not-at-top
  from tff_mf.tf import runtime  # pylint: disable=g-import-not-at-top
  from training import distributed  # pylint: disable=g-import-not-at-top
  runtime.install_exit_hook()
  total_rounds = args.rounds + 1
  setup = aggregators.build_mechanism(MechanismSpec.from_args(
      "opt_prefix_sum", total_rounds=total_rounds, noise_multiplier=1.0,
      clients_per_round=args.clients, clip_norm=1.0), noise_seed=11)

  def model_fn():
    model = tf.keras.Sequential([
        tf.keras.layers.Dense(args.hidden, input_shape=(64,), activation="relu",
                              kernel_initializer=tf.keras.initializers.GlorotUniform(seed=1)),
        tf.keras.layers.Dense(args.hidden, activation="relu",
                              kernel_initializer=tf.keras.initializers.GlorotUniform(seed=2)),
        tf.keras.layers.Dense(10, kernel_initializer=tf.keras.initializers.GlorotUniform(seed=3))])
    return tff.learning.models.from_keras_model(
        model, loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        input_spec=(tf.TensorSpec([None, 64], tf.float32), tf.TensorSpec([None], tf.int32)))

  process = tff.learning.algorithms.build_unweighted_fed_avg(
      model_fn, client_optimizer_fn=tff.learning.optimizers.build_sgdm(learning_rate=0.05),
      server_optimizer_fn=setup.server_optimizer, model_aggregator=setup.aggregation_factory)
  rng = np.random.default_rng(0)
  data = [[tf.data.Dataset.from_tensor_slices(
      (rng.normal(size=(args.examples, 64)).astype(np.float32),
       rng.integers(0, 10, args.examples).astype(np.int32))).batch(16)
           for _ in range(args.clients)] for _ in range(total_rounds)]

  def timed_run():
    """(median seconds per round after the first, the model after every round)."""
    state = process.initialize()
    seconds, models = [], []
    for r in range(total_rounds):
      start = time.perf_counter()
      state = process.next(state, data[r]).state
      if r > 0:  # round 0 includes compilation
        seconds.append(time.perf_counter() - start)
      models.append([np.asarray(w) for w in process.get_model_weights(state).trainable])
    return statistics.median(seconds), models

  def max_diff(a, b):
    return max(float(np.max(np.abs(x - y))) for x, y in zip(a, b))

  results, per_round = [], {}
  base_seconds, base_models = timed_run()
  results.append(("single process (TFF local C++ context)", base_seconds, 0.0))
  for count in (1, 2):
    with distributed.local_workers(count) as workers:
      distributed.configure_execution_context([a for a, _ in workers])
      seconds, models = timed_run()
    per_round[count] = [max_diff(a, b) for a, b in zip(base_models, models)]
    results.append((f"{count} local worker(s), CoordinatorContext", seconds,
                    per_round[count][-1]))
  base_weights = base_models[-1]
  load = os.getloadavg()
  params = sum(int(np.prod(w.shape)) for w in base_weights)
  command = "  .venv/bin/python benchmarks/bench_distributed.py " + (
      "--smoke" if args.smoke else " ".join(f"--{k}={v}" for k, v in vars(args).items()
                                            if k not in ("out", "smoke")))
  lines = [
      "## Distributed runtime (training/distributed.py)", "",
      "Command:", "", "```", command.strip(), "```", "",
      f"Machine: 2-core x86_64 CPU, 24 GB, no GPU ({platform.machine()}); load average at the "
      f"end {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f} (the machine was shared, so absolute "
      "times are noisy).", "",
      f"DP-FedAvg with the opt_prefix_sum MF aggregator, {params:,} parameters, "
      f"{args.clients} clients per round with {args.examples} examples each; median seconds per "
      f"round over rounds 2..{total_rounds} (round 1 compiles).", "",
      "| execution | s / round | ratio to single process | max abs weight difference |",
      "|---|---|---|---|"]
  for name, seconds, diff in results:
    lines.append(f"| {name} | {seconds:.3f} | {seconds / base_seconds:.2f} | {diff:.2e} |")
  lines += ["", "All worker processes ran on this same 2-core machine. The ratio therefore shows "
            "the coordinator's overhead (mergeable-form split, gRPC transfer of model, data "
            "and partial sums, merge and DP noise on the coordinator), not the speed-up of "
            "separate machines. Weight differences come from float32 summation order with more "
            "than one client per worker (docs/distributed.md, Exactness).", "",
            "Max |Δ| of the weights after each round against the single-process run: "
            + "; ".join(f"{count} worker(s): " + ", ".join(f"{d:.1e}" for d in diffs)
                        for count, diffs in per_round.items())
            + ". With several clients per worker the first round differs by float32 summation "
            "order; later rounds carry that difference through local training. With one "
            "client per worker the distributed run is bit-identical to the single process "
            "(tests/test_distributed_runtime.py).", ""]
  os.makedirs(args.out, exist_ok=True)
  with open(os.path.join(args.out, "distributed.md"), "w") as f:
    f.write("\n".join(lines))
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  fig, ax = plt.subplots(figsize=(6, 3))
  ax.barh([r[0] for r in results][::-1], [r[1] for r in results][::-1])
  ax.set_xlabel("seconds per round (median)")
  ax.set_title("DP-FedAvg round time: single process vs local workers")
  fig.tight_layout()
  fig.savefig(os.path.join(args.out, "distributed.png"), dpi=110)
  print("\n".join(lines))


if __name__ == "__main__":
  sys.exit(main())
