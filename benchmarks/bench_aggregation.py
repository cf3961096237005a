"""Benchmark: per-round DP aggregation cost at StackOverflow-LSTM size (d = 4,050,748).

For an n = 2048 mechanism, times the server-side DP step (``get_noised_result``
of the normalized query: add this round's noise, divide by clients) at rounds
1, 256, 1024 and 2048 for

- dense regeneration (``DenseNoise`` of the optimal prefix-sum factorization,
  N = C*⁻¹: round i regenerates i rows of Z; Denisov et al. App I),
- structured B̂ with h + r = 11 (``StructuredNoise``, Denisov App H Algorithm 3),
- TFF's ``tree_aggregation`` (TreeResidualSumQuery, efficient Honaker tree),
- TFF's ``gaussian_fixed`` (GaussianSumQuery),

plus the bytes of each query's state at that round, and √L of the structured
factorization against the optimal one (target: within 3%) and Honaker online.
Clipping and summing client updates is identical for all of them and is not
timed. The tree's state at round r is built from the bookkeeping of a run on
a 1-float model (its level-buffer layout) with full-size buffers; timing does
not depend on the buffers' values. Dense and structured states are set to
round r directly for the same reason.

Usage: ``.venv/bin/python benchmarks/bench_aggregation.py [--n 2048] [--rounds 1 256 1024 2048]
[--dim D (flat model instead of the LSTM's variables)] [--reps 5] [--dense-reps 1]``.
Writes ``benchmarks/results/aggregation.md`` and ``aggregation.png``.
"""

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import tensorflow as tf  # pylint: disable=wrong-import-position
import tensorflow_privacy as tfp  # pylint: disable=wrong-import-position
from tensorflow_privacy.privacy.dp_query import tree_aggregation  # pylint: disable=wrong-import-position
from tqdm import tqdm  # pylint: disable=wrong-import-position

from tff_mf import cache  # pylint: disable=wrong-import-position
from tff_mf import strategies  # pylint: disable=wrong-import-position
from tff_mf import tree  # pylint: disable=wrong-import-position
from tff_mf import workloads  # pylint: disable=wrong-import-position
from tff_mf.tf import aggregators  # pylint: disable=wrong-import-position
from tff_mf.tf import noise as noise_lib  # pylint: disable=wrong-import-position
from tff_mf.tf import query as query_lib  # pylint: disable=wrong-import-position

MACHINE = "2-core x86_64 CPU, 24 GB, no GPU"
CLIP, Z, CLIENTS = 1.0, 1.0, 100.0
MECHS = ("dense", "structured", "tree_aggregation", "gaussian_fixed")
LOAD_AT_START = os.getloadavg()[0]


def model_specs(dim):
  if dim:
    return [tf.TensorSpec([dim], tf.float32)]
  from stackoverflow import model as so_model  # pylint: disable=g-import-not-at-top
  keras_model = so_model.create_keras_model(seed=0)
  return [tf.TensorSpec(v.shape, v.dtype) for v in keras_model.trainable_variables]


def state_bytes(state):
  return int(sum(np.asarray(t).nbytes for t in tf.nest.flatten(state)
                 if hasattr(t, "shape")))


def tree_state_at(full_query, small_query, round_index, specs):
  """TreeResidualSumQuery state before round ``round_index`` (0-based), full-size buffers."""
  small_state = small_query.initial_global_state()
  step = tf.function(small_query.get_noised_result)
  zero = [tf.zeros([1])]
  for _ in range(round_index):
    _, small_state, _ = step(zero, small_state)
  tree_state = small_state.tree_state
  k = int(tree_state.level_buffer_idx.shape[0])
  full = full_query.initial_global_state()
  level_buffer = [tf.zeros([k] + s.shape.as_list(), s.dtype) for s in specs]
  return full._replace(
      tree_state=tree_aggregation.TreeState(
          level_buffer=level_buffer, level_buffer_idx=tree_state.level_buffer_idx,
          value_generator_state=tree_state.value_generator_state),
      previous_tree_noise=[tf.zeros(s.shape, s.dtype) for s in specs])


def time_calls(fn, sample, state, reps):
  out = []
  for _ in range(reps):
    start = time.perf_counter()
    result = fn(sample, state)
    _ = [float(tf.reduce_sum(x[:1])) for x in tf.nest.flatten(result[0])]  # force completion
    out.append(time.perf_counter() - start)
  return out


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--n", type=int, default=2048)
  parser.add_argument("--rounds", type=int, nargs="+", default=[1, 256, 1024, 2048])
  parser.add_argument("--dim", type=int, default=0, help="flat model size (0: the LSTM)")
  parser.add_argument("--reps", type=int, default=5)
  parser.add_argument("--dense-reps", type=int, default=1)
  parser.add_argument("--dense-rounds", type=int, nargs="+", default=None,
                      help="rounds at which to time dense regeneration (default: --rounds)")
  parser.add_argument("--cache-dir", default=None)
  parser.add_argument("--window", type=int, default=0,
                      help="only measure the mean time per round of structured and tree over the "
                      "last WINDOW consecutive rounds (amortized cost), appended to the results")
  parser.add_argument("--out", default=os.path.join(REPO, "benchmarks", "results"))
  args = parser.parse_args(argv)
  n = args.n
  specs = model_specs(args.dim)
  d = sum(int(np.prod(s.shape)) for s in specs)
  sample = [tf.zeros(s.shape, s.dtype) for s in specs]
  h, r = aggregators.default_structure(n)

  # Factorizations (through the cache: the optimal one comes from tff_mf.optimal).
  s_spec = workloads.WorkloadSpec("prefix_sum", n)
  f_opt, e_opt = cache.load_or_factorize(strategies.FactorizationSpec(s_spec, "optimal"),
                                         cache_dir=args.cache_dir, progress=True)
  stream_struct, f_struct, _ = aggregators.structured_noise_for(n, h, r, cache_dir=args.cache_dir,
                                                                progress=True)
  f_hon = strategies.factorize(strategies.FactorizationSpec(s_spec, "honaker_online"))
  losses = {"optimal": f_opt.sqrt_loss, "structured": f_struct.sqrt_loss,
            "honaker_online": f_hon.sqrt_loss}

  def normalized(q):
    return tfp.NormalizedQuery(q, denominator=CLIENTS)

  queries = {
      "dense": normalized(query_lib.MatrixFactorizationQuery(
          noise_lib.DenseNoise.from_factorization(f_opt), l2_norm_clip=CLIP,
          noise_multiplier=Z, record_specs=specs, noise_seed=1)),
      "structured": normalized(query_lib.MatrixFactorizationQuery(
          stream_struct, l2_norm_clip=CLIP, noise_multiplier=Z, record_specs=specs,
          noise_seed=1)),
      "tree_aggregation": normalized(tfp.TreeResidualSumQuery.build_l2_gaussian_query(
          CLIP, Z * np.sqrt(tree.tree_levels(n)), specs, noise_seed=1,
          use_efficient=True)),
      "gaussian_fixed": normalized(tfp.GaussianSumQuery(l2_norm_clip=CLIP, stddev=CLIP * Z)),
  }
  small_tree = normalized(tfp.TreeResidualSumQuery.build_l2_gaussian_query(
      CLIP, Z, [tf.TensorSpec([1], tf.float32)], noise_seed=1, use_efficient=True))
  fns = {name: tf.function(q.get_noised_result) for name, q in queries.items()}

  def state_for(name, rnd):
    q, i = queries[name], rnd - 1
    base = q.initial_global_state()
    if name in ("dense", "structured"):
      return base._replace(numerator_state=base.numerator_state._replace(
          round_index=tf.constant(i, tf.int32)))
    if name == "tree_aggregation":
      return base._replace(numerator_state=tree_state_at(
          q._numerator, small_tree._numerator, i, specs))  # pylint: disable=protected-access
    return base

  if args.window:
    return window_mean(args, n, d, h, r, queries, fns, small_tree, sample, specs)
  results = {}
  # Dense regeneration: one graph for every round (warmed at round 1), few repetitions.
  for rnd in tqdm(args.dense_rounds or args.rounds, desc="dense", file=sys.stderr):
    state = state_for("dense", rnd)
    if rnd == 1:
      time_calls(fns["dense"], sample, state, 1)
    times = time_calls(fns["dense"], sample, state, args.dense_reps)
    results[("dense", rnd)] = {"seconds": statistics.median(times), "reps": args.dense_reps,
                               "state_bytes": state_bytes(state)}
  # The others interleaved, repetition by repetition, so they see the same machine load.
  others = [m for m in MECHS if m != "dense"]
  for rnd in tqdm(args.rounds, desc="structured/tree/gaussian", file=sys.stderr):
    states = {name: state_for(name, rnd) for name in others}
    for name in others:
      time_calls(fns[name], sample, states[name], 1)  # warm (the tree retraces per layout)
    times = {name: [] for name in others}
    for rep in range(args.reps):
      order = others[rep % len(others):] + others[:rep % len(others)]
      for name in order:
        times[name] += time_calls(fns[name], sample, states[name], 1)
    for name in others:
      results[(name, rnd)] = {"seconds": statistics.median(times[name]), "reps": args.reps,
                              "state_bytes": state_bytes(states[name])}
  for (name, rnd), v in sorted(results.items()):
    tqdm.write(f"{name} round {rnd}: {v['seconds'] * 1e3:.1f} ms "
               f"(state {v['state_bytes'] / 2**20:.1f} MiB)", file=sys.stderr)
  write_results(args, n, d, h, r, results, losses, e_opt)
  return 0


def window_mean(args, n, d, h, r, queries, fns, small_tree, sample, specs):
  """Mean ms per round of structured and the TFF tree over rounds n−W+1..n, run consecutively."""
  first = n - args.window  # 0-based index of the first round in the window
  means = {}
  for name in ("structured", "tree_aggregation", "gaussian_fixed"):
    q = queries[name]
    base = q.initial_global_state()
    if name == "structured":
      state = base._replace(numerator_state=base.numerator_state._replace(
          round_index=tf.constant(first, tf.int32)))
    elif name == "tree_aggregation":
      state = base._replace(numerator_state=tree_state_at(
          q._numerator, small_tree._numerator, first, specs))  # pylint: disable=protected-access
    else:
      state = base
    for timed in (False, True):  # pass 1 traces every buffer layout, pass 2 is timed
      run_state, times = state, []
      for _ in tqdm(range(args.window), desc=f"{name} {'timed' if timed else 'warm'}",
                    file=sys.stderr):
        start = time.perf_counter()
        result, run_state, _ = fns[name](sample, run_state)
        _ = [float(tf.reduce_sum(x[:1])) for x in tf.nest.flatten(result)]
        times.append(time.perf_counter() - start)
    means[name] = times
  lines = ["", f"### Amortized cost over the last {args.window} consecutive rounds "
           f"({n - args.window + 1}..{n})", "",
           f"Command: `.venv/bin/python benchmarks/bench_aggregation.py --window {args.window}`. "
           "Mean / median ms per round of a second pass (the first pass traces the tree's "
           f"buffer layouts); 1-minute load average {LOAD_AT_START:.2f} at the start, "
           f"{os.getloadavg()[0]:.2f} at the end:", "",
           "| mechanism | mean ms/round | median ms/round |", "| --- | --- | --- |"]
  for name, times in means.items():
    lines.append(f"| {name} | {np.mean(times) * 1e3:.1f} | {np.median(times) * 1e3:.1f} |")
  ratio = np.median(means["structured"]) / np.median(means["tree_aggregation"])
  lines += ["", f"Structured / tree, median over the window: {ratio:.2f}x.", ""]
  text = "\n".join(lines)
  with open(os.path.join(args.out, "aggregation.md"), "a") as fh:
    fh.write(text)
  print(text)
  return 0


def write_results(args, n, d, h, r, results, losses, e_opt):
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  os.makedirs(args.out, exist_ok=True)
  rounds = args.rounds
  lines = [
      "## Per-round DP aggregation cost (tff_mf.tf.aggregators / query)", "",
      f"Command: `.venv/bin/python benchmarks/bench_aggregation.py "
      f"{' '.join(sys.argv[1:])}`".rstrip() + "  ",
      f"Machine: {MACHINE}. Model: d = {d:,} float32 parameters "
      f"({'flat vector' if args.dim else 'StackOverflow LSTM variables'}); n = {n}; "
      f"structured (h, r) = ({h}, {r}). Time = median of the server-side "
      "`get_noised_result` (noise row + division by clients), warm graph; structured, tree "
      f"and gaussian interleaved over {args.reps} repetitions; 1-minute load average "
      f"{LOAD_AT_START:.2f} when the run started, {os.getloadavg()[0]:.2f} at the end "
      "(2 cores).", "",
      "| mechanism | " + " | ".join(f"round {x} (ms)" for x in rounds) + " | state at round "
      f"{rounds[-1]} (MiB) |",
      "| --- | " + " | ".join("---" for _ in rounds) + " | --- |"]
  for name in MECHS:
    cells = [f"{results[(name, x)]['seconds'] * 1e3:.1f}" if (name, x) in results else "not run"
             for x in rounds]
    last = results.get((name, rounds[-1]))
    last_cell = f"{last['state_bytes'] / 2**20:.1f}" if last else "not run"
    lines.append(f"| {name} | " + " | ".join(cells) + f" | {last_cell} |")
  lines += ["", "State carried between rounds (MiB; round index and seed included):", "",
            "| mechanism | " + " | ".join(f"round {x}" for x in rounds) + " |",
            "| --- | " + " | ".join("---" for _ in rounds) + " |"]
  for name in MECHS:
    lines.append(f"| {name} | " + " | ".join(
        f"{results[(name, x)]['state_bytes'] / 2**20:.1f}" if (name, x) in results else "not run"
        for x in rounds) + " |")
  ratios = [results[("structured", x)]["seconds"] / results[("tree_aggregation", x)]["seconds"]
            for x in rounds]
  loss_ratio = losses["structured"] / losses["optimal"]
  lines += [
      "", f"Structured / tree time per round: " +
      ", ".join(f"round {x}: {q:.2f}x" for x, q in zip(rounds, ratios)) +
      f" (target ≤ 2x: {'met' if max(ratios) <= 2 else 'NOT met'}).",
      f"√L: optimal {losses['optimal']:.2f}, structured {losses['structured']:.2f} "
      f"({(loss_ratio - 1) * 100:.2f}% above optimal; target ≤ 3%: "
      f"{'met' if loss_ratio <= 1.03 else 'NOT met'}), Honaker online "
      f"{losses['honaker_online']:.2f}. Denisov et al. Table 2 (n = 2048): 143.6 / 145.8 "
      "(6, 5) / 278.3.",
      f"Dense regeneration draws i rows of Z in round i (reps: {args.dense_reps}); its state "
      "is the seed only. Optimal factorization from the cache: "
      f"`{os.path.basename(os.path.dirname(e_opt.npz_path))}`.", ""]
  text = "\n".join(lines)
  md_path = os.path.join(args.out, "aggregation.md")
  with open(md_path, "w") as fh:
    fh.write(text)
  with open(os.path.join(args.out, "aggregation.json"), "w") as fh:
    json.dump({f"{k[0]}@{k[1]}": v for k, v in results.items()} | {"sqrt_loss": losses}, fh,
              indent=1)
  fig, ax = plt.subplots(figsize=(6, 4))
  for name in MECHS:
    xs = [x for x in rounds if (name, x) in results]
    ax.plot(xs, [results[(name, x)]["seconds"] * 1e3 for x in xs], marker="o", label=name)
  ax.set_xscale("log", base=2)
  ax.set_yscale("log")
  ax.set_xlabel("round")
  ax.set_ylabel("ms per round (get_noised_result)")
  ax.set_title(f"DP aggregation cost, d = {d:,}, n = {n}")
  ax.legend()
  fig.tight_layout()
  fig.savefig(os.path.join(args.out, "aggregation.png"), dpi=120)
  print(text)


if __name__ == "__main__":
  from tff_mf.tf import runtime  # pylint: disable=g-import-not-at-top
  runtime.install_exit_hook()
  sys.exit(main())
