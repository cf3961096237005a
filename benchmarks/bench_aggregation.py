"""Benchmark: per-round DP aggregation cost at StackOverflow-LSTM size (d = 4,050,748).

For an n = 2048 mechanism, times the server-side DP step (``get_noised_result`` of the
normalized query: add this round's noise, divide by the clients) at rounds 1, 256,
1024, 2047 and 2048 for

- dense regeneration (``DenseNoise`` of the optimal prefix-sum factorization, N = C⁻¹:
  round i regenerates i rows of Z; Denisov et al. 2022, arXiv:2202.08312, App I),
- structured B̂ with (h, r) = (6, 5) (``LinearNoise``; Denisov App H, Algorithm 3),
- BLT (``LinearNoise`` of C⁻¹ with the registry's default buffers; Dvijotham et al. 2024,
  arXiv:2404.16706),
- banded C with b = 64 bands (``LinearNoise``, the last 63 noise rows as state;
  Choquette-Choo et al. 2023, arXiv:2306.08153),
- BISR with b = 64 (banded C⁻¹; Kalinin et al. 2025, arXiv:2505.12128) twice: its FIR
  recurrence (``LinearNoise``, 63 state rows) and the stateless stream
  (``noise_stream="stateless"``: ``DenseNoise`` regenerating 64 rows of Z, no state),
- TFF's ``tree_aggregation`` (TreeResidualSumQuery, efficient Honaker tree, with the
  per-node multiplier ``build_mechanism('tree')`` reports),
- TFF's ``gaussian_fixed`` (GaussianSumQuery): the baseline of the ratios,

every matrix mechanism built by ``tff_mf.tf.aggregators.build_mechanism`` (as training
does), plus the bytes of each query's state and √L of the structured factorization
against the optimal one (target ≤ 3%) and Honaker online. Clipping and summing client
updates is identical for all and not timed. The tree's state at round r is built from
the bookkeeping of a run on a 1-float model (its level-buffer layout) with full-size
buffers; timing does not depend on the buffers' values. The matrix mechanisms' states
are set to round r directly (zero buffers of the right size) for the same reason. All
but dense are timed interleaved, repetition by repetition, in one process; then the
amortized cost over the last ``--window`` consecutive rounds.

Usage: ``.venv/bin/python benchmarks/bench_aggregation.py [--n 2048] [--rounds ...]
[--dense-rounds ...] [--reps 7] [--dense-reps 1] [--window 64] [--mechanisms ...]
[--name aggregation]``; ``--smoke`` runs a tiny configuration in seconds. Writes
``benchmarks/results/<name>.{md,json,png}``; ``--mechanisms`` times only those rows (and
gaussian_fixed), under a subsection title.
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

from tff_mf.factorization import strategies  # pylint: disable=wrong-import-position
from tff_mf.factorization import workloads  # pylint: disable=wrong-import-position
from tff_mf.spec import MechanismSpec
from tff_mf.tf import aggregators  # pylint: disable=wrong-import-position
from tff_mf.tf import query as query_lib  # pylint: disable=wrong-import-position

MACHINE = "2-core x86_64 CPU, 24 GB, no GPU"
CLIP, Z, CLIENTS = 1.0, 1.0, 100.0
# name -> (registry mechanism, build_mechanism keyword arguments); None: a TFF query.
MATRIX = {"dense": ("opt_prefix_sum", {}), "structured": ("structured", {}),
          "blt": ("blt", {}), "banded": ("banded", {}),  # banded: b = --bands
          # BISR (banded C⁻¹, b = --bands): the FIR recurrence with b − 1 state rows, and the
          # stateless stream regenerating its b rows of Z from the seed each round.
          "bisr": ("bisr", {"noise_stream": "stateful"}),
          "bisr_stateless": ("bisr", {"noise_stream": "stateless"})}
MECHS = ("dense", "structured", "blt", "banded", "bisr", "bisr_stateless", "tree_aggregation",
         "gaussian_fixed")
BASELINE = "gaussian_fixed"
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
  """[(wall seconds, CPU seconds of this process: all its threads)] of ``reps`` calls.

  On a shared machine the CPU seconds are the contention-free figure: other jobs inflate
  the wall time of whichever call they overlap, not the work the call does.
  """
  out = []
  for _ in range(reps):
    start, cpu = time.perf_counter(), time.process_time()
    result = fn(sample, state)
    _ = [float(tf.reduce_sum(x[:1])) for x in tf.nest.flatten(result[0])]  # force completion
    out.append((time.perf_counter() - start, time.process_time() - cpu))
  return out


def _medians(pairs):
  return (statistics.median(w for w, _ in pairs), statistics.median(c for _, c in pairs))


def build_queries(n, specs, bands, cache_dir, mechs=MECHS):
  """(normalized queries by name, √L by name, mechanism info by name) of ``mechs``."""
  def normalized(q):
    return tfp.NormalizedQuery(q, denominator=CLIENTS)

  common = dict(total_rounds=n, noise_multiplier=Z, clients_per_round=CLIENTS, clip_norm=CLIP)
  wiring = dict(cache_dir=cache_dir, progress=True)
  queries, losses, infos = {}, {}, {}
  for name, (mechanism, kwargs) in MATRIX.items():
    if name not in mechs:
      continue
    if mechanism in ("banded", "bisr"):
      kwargs = dict(kwargs, bands=bands)
    setup = aggregators.build_mechanism(MechanismSpec.from_args(mechanism, **common, **kwargs),
                                        **wiring)
    queries[name] = normalized(query_lib.MatrixFactorizationQuery(
        setup.noise, l2_norm_clip=CLIP, noise_multiplier=Z, record_specs=specs, noise_seed=1))
    losses[name] = setup.single_participation_sqrt_loss
    infos[name] = {k: setup.info.get(k) for k in ("noise_implementation", "state_rows",
                                                   "bands", "rank", "buffers", "cache_npz")}
  if "tree_aggregation" in mechs:
    tree_setup = aggregators.build_mechanism(MechanismSpec.from_args("tree", **common), **wiring)
    z_node = tree_setup.info["noise_multiplier_per_node"]
    queries["tree_aggregation"] = normalized(tfp.TreeResidualSumQuery.build_l2_gaussian_query(
        CLIP, z_node, specs, noise_seed=1, use_efficient=True))
    infos["tree_aggregation"] = {"noise_multiplier_per_node": z_node}
  queries["gaussian_fixed"] = normalized(tfp.GaussianSumQuery(l2_norm_clip=CLIP,
                                                              stddev=CLIP * Z))
  if "dense" in mechs:
    losses["honaker_online"] = strategies.factorize(strategies.FactorizationSpec(
        workloads.WorkloadSpec("prefix_sum", n), "honaker_online")).single_participation_sqrt_loss
  return queries, losses, infos


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--n", type=int, default=2048)
  parser.add_argument("--rounds", type=int, nargs="+", default=[1, 256, 1024, 2047, 2048])
  parser.add_argument("--dim", type=int, default=0, help="flat model size (0: the LSTM)")
  parser.add_argument("--reps", type=int, default=15)
  parser.add_argument("--dense-reps", type=int, default=1)
  parser.add_argument("--dense-rounds", type=int, nargs="+", default=[1, 256, 1024, 2048],
                      help="rounds at which to time dense regeneration (slow: i rows in round i)")
  parser.add_argument("--bands", type=int, default=64, help="bands of the banded mechanism")
  parser.add_argument("--window", type=int, default=64,
                      help="then the mean time per round over the last WINDOW consecutive rounds "
                      "(0: skip)")
  parser.add_argument("--cache-dir", default=None)
  parser.add_argument("--smoke", action="store_true",
                      help="n = 16, d = 1000, 2 repetitions, window 4 (seconds): checks that the "
                      "script runs")
  parser.add_argument("--out", default=os.path.join(REPO, "benchmarks", "results"))
  parser.add_argument("--mechanisms", nargs="+", choices=MECHS, default=list(MECHS),
                      help=f"the rows to time (default: all); {BASELINE}, the ratios' "
                      "baseline, is always timed")
  parser.add_argument("--name", default="aggregation",
                      help="results file stem: <out>/<name>.{md,json,png}")
  args = parser.parse_args(argv)
  args.mechanisms = tuple(m for m in MECHS if m in set(args.mechanisms) | {BASELINE})
  if args.smoke:
    args.n, args.rounds, args.dense_rounds, args.dim = 16, [1, 16], [1, 16], 1000
    args.reps, args.window, args.bands = 2, 4, 4
  n = args.n
  specs = model_specs(args.dim)
  d = sum(int(np.prod(s.shape)) for s in specs)
  sample = [tf.zeros(s.shape, s.dtype) for s in specs]
  queries, losses, infos = build_queries(n, specs, args.bands, args.cache_dir, args.mechanisms)
  small_tree = tfp.NormalizedQuery(tfp.TreeResidualSumQuery.build_l2_gaussian_query(
      CLIP, Z, [tf.TensorSpec([1], tf.float32)], noise_seed=1, use_efficient=True),
                                   denominator=CLIENTS)
  fns = {name: tf.function(q.get_noised_result) for name, q in queries.items()}

  def state_for(name, index):
    """The query state before round index + 1 (0-based index)."""
    q = queries[name]
    base = q.initial_global_state()
    if name in MATRIX:
      return base._replace(numerator_state=base.numerator_state._replace(
          round_index=tf.constant(index, tf.int32)))
    if name == "tree_aggregation":
      return base._replace(numerator_state=tree_state_at(
          q._numerator, small_tree._numerator, index, specs))  # pylint: disable=protected-access
    return base

  results = {}
  # Dense regeneration: one graph for every round (warmed at round 1), few repetitions.
  dense_rounds = args.dense_rounds if "dense" in args.mechanisms else []
  for rnd in tqdm(dense_rounds, desc="dense", file=sys.stderr):
    state = state_for("dense", rnd - 1)
    if rnd == args.dense_rounds[0]:
      time_calls(fns["dense"], sample, state, 1)
    wall, cpu = _medians(time_calls(fns["dense"], sample, state, args.dense_reps))
    results[("dense", rnd)] = {"seconds": wall, "cpu_seconds": cpu, "reps": args.dense_reps,
                               "state_bytes": state_bytes(state)}
    del state
  # The others interleaved, repetition by repetition, so they see the same machine load.
  others = [m for m in args.mechanisms if m != "dense"]
  for rnd in tqdm(args.rounds, desc="interleaved", file=sys.stderr):
    states = {name: state_for(name, rnd - 1) for name in others}
    for name in others:
      time_calls(fns[name], sample, states[name], 1)  # warm (the tree retraces per layout)
    times = {name: [] for name in others}
    for rep in range(args.reps):
      order = others[rep % len(others):] + others[:rep % len(others)]
      for name in order:
        times[name] += time_calls(fns[name], sample, states[name], 1)
    for name in others:
      wall, cpu = _medians(times[name])
      results[(name, rnd)] = {"seconds": wall, "cpu_seconds": cpu, "reps": args.reps,
                              "state_bytes": state_bytes(states[name])}
    del states
  load_after_rounds = os.getloadavg()[0]
  for (name, rnd), v in sorted(results.items()):
    tqdm.write(f"{name} round {rnd}: {v['seconds'] * 1e3:.1f} ms "
               f"(state {v['state_bytes'] / 2**20:.1f} MiB)", file=sys.stderr)
  window = window_times(args, n, queries, fns, small_tree, sample, specs) if args.window else None
  write_results(args, n, d, results, losses, infos, window, load_after_rounds)
  return 0


def window_times(args, n, queries, fns, small_tree, sample, specs):
  """Seconds per round of every streaming mechanism over rounds n−W+1..n, run consecutively
  (a first pass traces every buffer layout of the tree; the second is timed)."""
  first = n - args.window  # 0-based index of the first round in the window
  out = {"load_start": os.getloadavg()[0]}
  for name in [m for m in args.mechanisms if m != "dense"]:
    q = queries[name]
    base = q.initial_global_state()
    if name in MATRIX:
      state = base._replace(numerator_state=base.numerator_state._replace(
          round_index=tf.constant(first, tf.int32)))
    elif name == "tree_aggregation":
      state = base._replace(numerator_state=tree_state_at(
          q._numerator, small_tree._numerator, first, specs))  # pylint: disable=protected-access
    else:
      state = base
    for timed in (False, True):
      run_state, times = state, []
      for _ in tqdm(range(args.window), desc=f"{name} {'timed' if timed else 'warm'}",
                    file=sys.stderr):
        start, cpu = time.perf_counter(), time.process_time()
        result, run_state, _ = fns[name](sample, run_state)
        _ = [float(tf.reduce_sum(x[:1])) for x in tf.nest.flatten(result)]
        times.append((time.perf_counter() - start, time.process_time() - cpu))
    out[name] = times
    del state, run_state
  out["load_end"] = os.getloadavg()[0]
  return out


def _ms(results, name, rnd):
  v = results.get((name, rnd))
  return f"{v['seconds'] * 1e3:.1f}" if v else "not run"


def _bullets(args, n, mechs, results, ratios, cpu_ratios, losses, infos):
  """The summary lines of the mechanisms that ran."""
  def state_mib(name):
    return results[(name, args.rounds[-1])]["state_bytes"] / 2**20

  out = []
  if "blt" in ratios:
    out.append(
        f"- BLT / {BASELINE}: at most {max(ratios['blt']):.2f}x wall, "
        f"{max(cpu_ratios['blt']):.2f}x CPU over these rounds; median over the rounds "
        f"{statistics.median(ratios['blt']):.2f}x wall, "
        f"{statistics.median(cpu_ratios['blt']):.2f}x CPU (target ≤ 1.5x: "
        + ("met" if max(ratios['blt']) <= 1.5 else
           "met on CPU time, not on wall time at this load" if max(cpu_ratios['blt']) <= 1.5
           else "NOT met") + ").")
  if "banded" in ratios:
    others = ", ".join(f"{label}: {infos[m]['state_rows']} rows"
                       for m, label in (("blt", "BLT"), ("structured", "structured"))
                       if m in infos)
    out.append(f"- Banded (b = {args.bands}): at most {max(ratios['banded']):.2f}x wall / "
               f"{max(cpu_ratios['banded']):.2f}x CPU {BASELINE}; state "
               f"{infos['banded']['state_rows']} model-sized rows = {state_mib('banded'):.1f} "
               "MiB" + (f" ({others})" if others else "") + ".")
  if "bisr" in ratios and "bisr_stateless" in ratios:
    out.append(
        f"- BISR (b = {args.bands}, banded C⁻¹), the two streams of the same noise: stateful "
        f"(FIR recurrence) keeps {infos['bisr']['state_rows']} model-sized rows = "
        f"{state_mib('bisr'):.1f} MiB between rounds and costs at most "
        f"{max(ratios['bisr']):.2f}x wall / {max(cpu_ratios['bisr']):.2f}x CPU {BASELINE}; "
        f"stateless keeps no rows ({state_mib('bisr_stateless'):.1f} MiB: seed and round "
        f"index) and regenerates the min(i, {args.bands}) rows of Z that round i needs from the "
        f"seed: at most {max(ratios['bisr_stateless']):.2f}x wall / "
        f"{max(cpu_ratios['bisr_stateless']):.2f}x CPU. The trade: {args.bands - 1} rows of "
        f"memory against {args.bands - 1} more Gaussian rows drawn per round.")
  if "structured" in ratios and "tree_aggregation" in ratios:
    struct_tree = [results[("structured", x)]["seconds"] /
                   results[("tree_aggregation", x)]["seconds"] for x in args.rounds]
    out.append("- Structured / tree: " + ", ".join(f"round {x}: {q:.2f}x"
                                                   for x, q in zip(args.rounds, struct_tree))
               + f" (target ≤ 2x: {'met' if max(struct_tree) <= 2 else 'NOT met'}).")
  if all(m in losses for m in ("dense", "structured", "blt", "banded", "honaker_online")):
    loss_ratio = losses["structured"] / losses["dense"]
    out.append(
        f"- √L (prefix sums, n = {n}): optimal {losses['dense']:.2f}, structured "
        f"{losses['structured']:.2f} ({(loss_ratio - 1) * 100:.2f}% above optimal; target ≤ "
        f"3%: {'met' if loss_ratio <= 1.03 else 'NOT met'}), BLT {losses['blt']:.2f}, banded "
        f"{losses['banded']:.2f}, Honaker online {losses['honaker_online']:.2f}."
        + (" Paper values (Denisov et al. 2022, Table 2, n = 2048): optimal 143.6, structured "
           "(6, 5) 145.8, Honaker online 278.3." if n == 2048 else ""))
  if "dense" in mechs:
    out.append("- Dense regeneration draws i rows of Z in round i; its state is the seed only.")
  if "tree_aggregation" in infos:
    out.append(f"- The TFF tree adds per-node multiplier "
               f"{infos['tree_aggregation']['noise_multiplier_per_node']:.4g} (z·√levels, as "
               "`build_mechanism('tree')` reports).")
  return out


def write_results(args, n, d, results, losses, infos, window, load_after_rounds):
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  import matplotlib.ticker  # pylint: disable=g-import-not-at-top
  os.makedirs(args.out, exist_ok=True)
  mechs = args.mechanisms
  rounds = sorted(set(args.rounds) | set(args.dense_rounds if "dense" in mechs else []))
  command = " ".join(["benchmarks/bench_aggregation.py"] + (
      sys.argv[1:] if __name__ == "__main__" else []))
  setup = []
  if "structured" in infos:
    setup.append(f"structured (h, r) = ({infos['structured']['bands']}, "
                 f"{infos['structured']['rank']})")
  if "blt" in infos:
    setup.append(f"BLT with {infos['blt']['buffers']} buffers")
  banded_like = [m for m in ("banded", "bisr") if m in infos]
  if banded_like:
    setup.append(f"{' and '.join(banded_like)} with b = {args.bands} bands")
  full = set(mechs) == set(MECHS)
  title = ("## Per-round DP aggregation cost (tff_mf.tf.aggregators / query)" if full else
           f"### The same for {', '.join(mechs)} alone (a separate run)")
  lines = [
      title, "",
      f"Command: `.venv/bin/python {command}`  ",
      f"Machine: {MACHINE}, shared with other jobs (ratios within this run are what count). "
      f"Model: d = {d:,} float32 parameters "
      f"({'flat vector' if args.dim else 'StackOverflow LSTM variables'}); n = {n}; "
      + "".join(f"{x}; " for x in setup) + "every matrix mechanism from `build_mechanism`. "
      "Time = median of the server-side `get_noised_result` (noise row + division by "
      f"clients), warm graph; {'all but dense' if 'dense' in mechs else 'all'} interleaved "
      f"over {args.reps} repetitions"
      + (f" (dense: {args.dense_reps})" if "dense" in mechs else "") + ". 1-minute load "
      f"average {LOAD_AT_START:.2f} when the run started, {load_after_rounds:.2f} after these "
      "rounds (2 cores).", "",
      "| mechanism | " + " | ".join(f"round {x} (ms)" for x in rounds) + " | state (MiB) |",
      "| --- | " + " | ".join("---" for _ in rounds) + " | --- |"]
  for name in mechs:
    last = [results[(name, x)] for x in rounds if (name, x) in results]
    state = f"{last[-1]['state_bytes'] / 2**20:.1f}" if last else "not run"
    lines.append(f"| {name} | " + " | ".join(_ms(results, name, x) for x in rounds)
                 + f" | {state} |")
  lines += ["", "The same, CPU ms of this process per round (all its threads):", "",
            "| mechanism | " + " | ".join(f"round {x}" for x in rounds) + " |",
            "| --- | " + " | ".join("---" for _ in rounds) + " |"]
  for name in mechs:
    lines.append(f"| {name} | " + " | ".join(
        f"{results[(name, x)]['cpu_seconds'] * 1e3:.1f}" if (name, x) in results else "not run"
        for x in rounds) + " |")
  lines += ["", f"Ratio to {BASELINE} (same round, same interleaved run), wall time / CPU "
            "time of this process (the CPU figure is what contention from other jobs does not "
            "inflate):", "",
            "| mechanism | " + " | ".join(f"round {x}" for x in args.rounds) + " | max |",
            "| --- | " + " | ".join("---" for _ in args.rounds) + " | --- |"]
  ratios, cpu_ratios = {}, {}
  for name in mechs:
    if name in ("dense", BASELINE):
      continue
    ratios[name] = [results[(name, x)]["seconds"] / results[(BASELINE, x)]["seconds"]
                    for x in args.rounds]
    cpu_ratios[name] = [results[(name, x)]["cpu_seconds"] / results[(BASELINE, x)]["cpu_seconds"]
                        for x in args.rounds]
    lines.append(f"| {name} | " + " | ".join(f"{q:.2f}x / {c:.2f}x" for q, c in
                                             zip(ratios[name], cpu_ratios[name]))
                 + f" | {max(ratios[name]):.2f}x / {max(cpu_ratios[name]):.2f}x |")
  lines += [""] + _bullets(args, n, mechs, results, ratios, cpu_ratios, losses, infos) + [""]
  if window:
    names = [m for m in mechs if m in window]
    base = _medians(window[BASELINE])
    lines += [f"{'###' if full else '####'} Amortized cost over the last {args.window} "
              "consecutive rounds "
              f"({n - args.window + 1}..{n})", "",
              "Same process, after the table above. Mean / median wall ms and median CPU ms per "
              "round of a second pass (the first pass traces the tree's buffer layouts); "
              "1-minute load average "
              f"{window['load_start']:.2f} at the start, {window['load_end']:.2f} at the end:",
              "", f"| mechanism | mean ms/round | median ms/round | median CPU ms/round | "
              f"median / {BASELINE} (wall / CPU) |", "| --- | --- | --- | --- | --- |"]
    for name in names:
      wall, cpu = _medians(window[name])
      mean = float(np.mean([w for w, _ in window[name]]))
      lines.append(f"| {name} | {mean * 1e3:.1f} | {wall * 1e3:.1f} | {cpu * 1e3:.1f} | "
                   f"{wall / base[0]:.2f}x / {cpu / base[1]:.2f}x |")
    lines.append("")
  text = "\n".join(lines)
  with open(os.path.join(args.out, f"{args.name}.md"), "w") as fh:
    fh.write(text)
  with open(os.path.join(args.out, f"{args.name}.json"), "w") as fh:
    json.dump({"results": {f"{k[0]}@{k[1]}": v for k, v in results.items()},
               "single_participation_sqrt_loss": losses, "mechanisms": infos, "d": d, "n": n,
               "load": [LOAD_AT_START, load_after_rounds],
               "window": window}, fh, indent=1, default=float)
  fig, ax = plt.subplots(figsize=(7.5, 4.5))
  # Rounds as categories (1 and 2048 are far apart, 2047 and 2048 adjacent on any scale).
  for k, name in enumerate(mechs):
    pos = [i + (k - (len(mechs) - 1) / 2) * 0.1 for i, x in enumerate(rounds)
           if (name, x) in results]
    ax.plot(pos, [results[(name, x)]["seconds"] * 1e3 for x in rounds if (name, x) in results],
            marker="o", linestyle=":", label=name)
  ax.set_xticks(range(len(rounds)))
  ax.set_xticklabels([str(x) for x in rounds])
  ax.set_yscale("log")
  ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
  ax.set_xlabel("round")
  ax.set_ylabel("ms per round (get_noised_result, wall)")
  ax.grid(True, axis="y", which="both", alpha=0.3)
  ax.set_title(f"DP aggregation cost, d = {d:,}, n = {n}")
  ax.legend(fontsize=8, ncol=2)
  fig.tight_layout()
  fig.savefig(os.path.join(args.out, f"{args.name}.png"), dpi=120)
  plt.close(fig)
  print(text)


if __name__ == "__main__":
  from tff_mf.tf import runtime  # pylint: disable=g-import-not-at-top
  runtime.install_exit_hook()
  sys.exit(main())
