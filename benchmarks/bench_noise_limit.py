"""Benchmark: each streaming mechanism's noise per round against its own limit (d = 4,050,748).

A streaming mechanism's own limit is the floor of seeded noise (Philox: round i's Z row of
every variable, ``tff_mf.tf.noise.standard_normal_row``) plus one pass over each state row it
combines, a pass being one in-place axpy of a d-vector (BLAS ``saxpy``: reads the row and the
accumulator, writes the accumulator, allocates nothing). TensorFlow's ``acc + row`` over the
model's variables (a fresh output each call) is reported beside it. Measured in one process:

- the floor and the pass, interleaved with the mechanisms, repetition by repetition;
- each mechanism's round: the DPQuery's ``get_noised_result`` (noise row, added to a zero
  sum) of the query ``build_mechanism`` wires, with its streams' kernel (``LinearNoise``'s
  fused XLA loop, training's; ``--graph-kernel``: the graph kernel), state set to round
  ``--round``: gaussian
  (independent noise), BLT (Dvijotham et al. 2024, arXiv:2404.16706), banded C with
  ``--bands`` bands (Choquette-Choo et al. 2023, arXiv:2306.08153), structured B̂ (Denisov et
  al. 2022, arXiv:2202.08312, App H), BISR's FIR stream (Kalinin et al. 2025,
  arXiv:2505.12128) and TFF's tree (TreeResidualSumQuery, tensorflow_privacy's code);
- its limit = floor + rows × pass (rows: the distinct state rows a round reads; the tree's:
  the level buffers it holds at that round) and the ratio CPU / limit;
- the query state's save and restore through the training binary's checkpoints
  (``training.checkpoints.Checkpointer``: ``save`` as the round loop calls it, on the caller's
  thread, then the background write; ``load_state``), against one round's noise.

CPU seconds are this process's (all threads): on a shared machine they are what other jobs
do not inflate. Usage: ``.venv/bin/python benchmarks/bench_noise_limit.py [--n 2048]
[--round 1000] [--bands 16] [--reps 9] [--mechanisms ...] [--dim 0] [--smoke]``; writes
``benchmarks/results/<name>.{md,json}``.
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import numpy as np
import scipy.linalg.blas

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.join(REPO, "benchmarks"))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import tensorflow as tf  # pylint: disable=wrong-import-position
from tqdm import tqdm  # pylint: disable=wrong-import-position

from bench_aggregation import model_specs, tree_state_at  # pylint: disable=wrong-import-position

from tff_mf.spec import MechanismSpec  # pylint: disable=wrong-import-position
from tff_mf.tf import aggregators  # pylint: disable=wrong-import-position
from tff_mf.tf import noise as noise_lib  # pylint: disable=wrong-import-position
from training import checkpoints  # pylint: disable=wrong-import-position

MACHINE = "2-core x86_64 CPU (Intel Xeon, AVX-512), 24 GB, no GPU"
CLIP, Z, CLIENTS = 1.0, 1.0, 100.0
# name -> (registry mechanism, keyword arguments of MechanismSpec.from_args).
MECHANISMS = {"gaussian": ("gaussian", {}), "blt": ("blt", {}), "banded": ("banded", {}),
              "structured": ("structured", {}),
              "bisr": ("bisr", {"noise_stream": "stateful"}), "tree": ("tree", {})}
LOAD_AT_START = os.getloadavg()[0]


def build(names, n, bands, specs, cache_dir):
  """{name: (unnormalized DPQuery, StreamingNoise or None)} as ``build_mechanism`` wires them."""
  out = {}
  for name in tqdm(names, desc="build", file=sys.stderr):
    mechanism, kwargs = MECHANISMS[name]
    if mechanism in ("banded", "bisr"):
      kwargs = dict(kwargs, bands=bands)
    setup = aggregators.build_mechanism(
        MechanismSpec.from_args(mechanism, total_rounds=n, noise_multiplier=Z,
                                clients_per_round=CLIENTS, clip_norm=CLIP, **kwargs),
        noise_seed=1, cache_dir=cache_dir)
    query = setup.aggregation_factory.dp_query(specs)
    out[name] = (getattr(query, "_numerator", query), setup.noise)  # pylint: disable=protected-access
  return out


def state_at(name, query, round_index, specs):
  """The query state before round ``round_index`` (0-based): the tree's buffer layout from
  its bookkeeping on a 1-float model, with full-size buffers (``bench_aggregation``)."""
  state = query.initial_global_state()
  if hasattr(state, "round_index"):
    return state._replace(round_index=tf.constant(round_index, tf.int32))
  if name == "tree":
    import tensorflow_privacy as tfp  # pylint: disable=g-import-not-at-top
    small = tfp.TreeResidualSumQuery.build_l2_gaussian_query(
        CLIP, Z, [tf.TensorSpec([1], tf.float32)], noise_seed=1, use_efficient=True)
    return tree_state_at(query, small, round_index, specs)
  return state


def rows_combined(name, noise, state):
  """Distinct model-sized state rows one round reads."""
  if noise is not None:
    return noise.state_rows()
  if name == "tree":
    return int(state.tree_state.level_buffer_idx.shape[0])
  return 0


def timed(fn, *args):
  """(wall s, CPU s of this process) of one call, its outputs forced: each read through
  ``np.asarray`` (the tensor's buffer; ``numpy()`` would add a copy of every output, 0.8 ms
  a model-sized one here)."""
  start, cpu = time.perf_counter(), time.process_time()
  out = fn(*args)
  for x in tf.nest.flatten(out):
    if isinstance(x, tf.Tensor) and x.shape.rank and x.dtype != tf.string:
      _ = np.asarray(x).flat[0]
  return time.perf_counter() - start, time.process_time() - cpu


def checkpoint_times(step, state, reps, every):
  """(first save with its write; then medians of: save on the caller's thread, whole save
  with its write, load_state), CPU s. Before each save the state advances ``every`` rounds
  (the query's step), as the round loop checkpoints it, so an incremental save writes what
  those rounds changed; the leaves are the tensors' buffers, as the compiled engine gives
  them (``np.asarray``: no copy)."""
  save_call, save_all, load, first = [], [], [], None
  with tempfile.TemporaryDirectory() as tmp:
    ckpt = checkpoints.Checkpointer(os.path.join(tmp, "ckpt"), keep=1)
    for r in range(reps + 1):
      for _ in range(every):
        state = step(state)
      leaves = tf.nest.map_structure(np.asarray, state)
      progress = checkpoints.RunProgress(round=(r + 1) * every)
      cpu = time.process_time()
      ckpt.save(leaves, progress, background=True)
      call = time.process_time() - cpu
      ckpt.wait()
      whole = time.process_time() - cpu
      cpu = time.process_time()
      ckpt.load_state(progress.round, leaves)
      if r == 0:  # the run's first checkpoint: every leaf written
        first = whole
        continue
      save_call.append(call)
      save_all.append(whole)
      load.append(time.process_time() - cpu)
    ckpt.close()
  return (first, statistics.median(save_call), statistics.median(save_all),
          statistics.median(load))


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--n", type=int, default=2048)
  parser.add_argument("--round", type=int, default=1000, help="0-based round index timed")
  parser.add_argument("--bands", type=int, default=16)
  parser.add_argument("--reps", type=int, default=9)
  parser.add_argument("--checkpoint-reps", type=int, default=3)
  parser.add_argument("--checkpoint-every", type=int, default=1,
                      help="rounds between the checkpoints timed (the binary's "
                           "--rounds_per_checkpoint)")
  parser.add_argument("--dim", type=int, default=0, help="flat model size (0: the LSTM)")
  parser.add_argument("--mechanisms", nargs="+", choices=list(MECHANISMS),
                      default=list(MECHANISMS))
  parser.add_argument("--graph-kernel", action="store_true",
                      help="the streams' graph kernel, not the fused one (training's)")
  parser.add_argument("--cache-dir", default=None)
  parser.add_argument("--smoke", action="store_true", help="n = 16, d = 1000: seconds")
  parser.add_argument("--out", default=os.path.join(REPO, "benchmarks", "results"))
  parser.add_argument("--name", default="noise_limit")
  args = parser.parse_args(argv)
  if args.smoke:
    args.n, args.round, args.bands, args.dim, args.reps, args.checkpoint_reps = 16, 9, 4, 1000, 2, 1
  specs = model_specs(args.dim)
  d = sum(int(np.prod(s.shape)) for s in specs)
  built = build(args.mechanisms, args.n, args.bands, specs, args.cache_dir)
  seed = tf.constant(noise_lib.seed_pair(1))
  zero = [tf.zeros(s.shape, s.dtype) for s in specs]
  rows = [tf.random.normal(s.shape, dtype=s.dtype) for s in specs]
  floor = tf.function(lambda i: noise_lib.standard_normal_row(seed, i, specs))
  tf_pass = tf.function(lambda acc, row: [a + r for a, r in zip(acc, row)])
  flat_acc = np.zeros(d, np.float32)
  flat_row = np.random.default_rng(0).standard_normal(d).astype(np.float32)
  fns = {"floor": (floor, (tf.constant(args.round, tf.int64),)),
         "pass": (lambda row, acc: scipy.linalg.blas.saxpy(row, acc, a=0.5), (flat_row, flat_acc)),
         "tf_pass": (tf_pass, (zero, rows))}
  states = {}
  for name, (query, noise) in built.items():
    states[name] = state_at(name, query, args.round, specs)
    if args.graph_kernel and isinstance(noise, noise_lib.LinearNoise):
      noise.jit_compile = False
    fns[name] = (tf.function(query.get_noised_result), (zero, states[name]))
  for fn, fargs in fns.values():
    timed(fn, *fargs)  # trace and warm
  times = {name: [] for name in fns}
  names = list(fns)
  for rep in tqdm(range(args.reps), desc="interleaved", file=sys.stderr):
    for name in names[rep % len(names):] + names[:rep % len(names)]:
      times[name].append(timed(fns[name][0], *fns[name][1]))
  cpu = {name: statistics.median(c for _, c in v) for name, v in times.items()}
  wall = {name: statistics.median(w for w, _ in v) for name, v in times.items()}
  load_after = os.getloadavg()[0]
  results = {}
  for name in built:
    k = rows_combined(name, built[name][1], states[name])
    limit = cpu["floor"] + k * cpu["pass"]
    results[name] = {"cpu_s": cpu[name], "wall_s": wall[name], "rows": k, "limit_s": limit,
                     "ratio": cpu[name] / limit,
                     "state_bytes": int(sum(np.asarray(t).nbytes
                                            for t in tf.nest.flatten(states[name])))}
    if results[name]["state_bytes"] > (0 if args.smoke else 1 << 20):
      query = built[name][0]
      step = tf.function(lambda s, q=query: q.get_noised_result(zero, s)[1])
      first, save_call, save_all, load = checkpoint_times(
          step, states[name], args.checkpoint_reps, args.checkpoint_every)
      results[name].update(first_save_s=first, save_call_s=save_call, save_s=save_all,
                           restore_s=load)
  write(args, d, cpu, wall, results, load_after)
  return 0


def write(args, d, cpu, wall, results, load_after):
  command = " ".join(["benchmarks/bench_noise_limit.py"] + (
      sys.argv[1:] if __name__ == "__main__" else []))
  lines = [
      "## Noise at its limit (tff_mf.tf.noise, training.checkpoints)", "",
      f"Command: `.venv/bin/python {command}`  ",
      f"Machine: {MACHINE}, shared (2 cores); 1-minute load average {LOAD_AT_START:.2f} at the "
      f"start, {load_after:.2f} after the timings. d = {d:,} float32 parameters, n = {args.n}, "
      f"round {args.round}, banded and BISR with b = {args.bands}; the streams' "
      f"{'graph' if args.graph_kernel else 'fused (XLA)'} kernel; medians of {args.reps} "
      "interleaved repetitions, CPU ms of this process (wall ms in brackets). Checkpoints "
      f"(`training.checkpoints`, incremental): a save every {args.checkpoint_every} "
      f"round(s) of the query's own steps, medians of {args.checkpoint_reps} after the "
      "run's first (whole) one.", "",
      f"Floor (Philox Z row): {cpu['floor'] * 1e3:.1f} ({wall['floor'] * 1e3:.1f}); one pass "
      f"(in-place saxpy over d): {cpu['pass'] * 1e3:.2f} ({wall['pass'] * 1e3:.2f}); "
      f"TensorFlow's acc + row over the variables: {cpu['tf_pass'] * 1e3:.2f} "
      f"({wall['tf_pass'] * 1e3:.2f}).", "",
      "| mechanism | CPU ms / round | rows combined | limit ms | CPU / limit | state MiB | "
      "first save ms | save (caller) ms | save (with write) ms | restore ms | "
      "(save + restore) / round |",
      "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
  keys = ("first_save_s", "save_call_s", "save_s", "restore_s")
  for name, r in results.items():
    ck = ("| " + " | ".join(f"{r[k] * 1e3:.0f}" for k in keys)
          + f" | {(r['save_s'] + r['restore_s']) / r['cpu_s']:.2f}x |"
          if "save_s" in r else "| - | - | - | - | - |")
    lines.append(f"| {name} | {r['cpu_s'] * 1e3:.1f} ({r['wall_s'] * 1e3:.1f}) | {r['rows']} | "
                 f"{r['limit_s'] * 1e3:.1f} | **{r['ratio']:.2f}x** | "
                 f"{r['state_bytes'] / 2**20:.1f} " + ck)
  text = "\n".join(lines) + "\n"
  os.makedirs(args.out, exist_ok=True)
  with open(os.path.join(args.out, f"{args.name}.md"), "w") as fh:
    fh.write(text)
  with open(os.path.join(args.out, f"{args.name}.json"), "w") as fh:
    json.dump({"d": d, "n": args.n, "round": args.round, "bands": args.bands,
               "floor_cpu_s": cpu["floor"], "pass_cpu_s": cpu["pass"],
               "tf_pass_cpu_s": cpu["tf_pass"], "results": results,
               "load": [LOAD_AT_START, load_after]}, fh, indent=1)
  print(text)


if __name__ == "__main__":
  from tff_mf.tf import runtime  # pylint: disable=g-import-not-at-top
  runtime.install_exit_hook()
  sys.exit(main())
