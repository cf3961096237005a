"""The papers' StackOverflow configuration (grid ``paper_config``): time per round, projected total.

Usage: .venv/bin/python benchmarks/bench_paper_config.py [--rounds 2] [--run 0]
[--noise-rounds 1 64 256] (``--smoke``: a tiny model and 2 clients; a minute)

Runs one entry of ``training.grids.GRIDS["paper_config"]`` (Denisov et al. 2022,
arXiv:2202.08312, Sec 5 and App I: the 4.05M-parameter LSTM, V = 10,000, 100 clients per
round, n = 2048, at most 256 sentences per client, batches of 16) through the binary's own
loop (``training.loop.run_training``) on the compiled engine, for ``--rounds`` rounds after
a warm-up round, and stops it. The mechanism is built for all n = 2048 rounds (its
factorization is cached).

The data: StackOverflow itself is a download this machine cannot make, so the run reads a
stand-in written in TFF's on-disk format (``stackoverflow.fixtures.standin_sentences``:
random words of a 14,000-word Zipf vocabulary, every client exactly 256 sentences, the
papers' cap, so a client costs what a full StackOverflow client costs: 16 steps of 16). A
single pass of 2048 × 100 clients needs 204,800 distinct clients; the stand-in holds
``clients × (rounds + 1)`` of them and the run's client ids map onto them in turn (a client's
cost does not depend on its words).

Per round: the wall and CPU seconds of the binary's round (sampling, client data, the
engine's round: 100 client updates, clipping, the noise row and the server optimizer,
metrics, the model digest). The noise alone is then timed for every mechanism of the grid
entry at ``--noise-rounds`` (the query's ``get_noised_result`` with its state set to that
round, as ``bench_aggregation.py`` does): dense regeneration (``opt_momentum``'s C⁻¹) draws t
rows of Z in round t, so its cost is fit as a + b·t over the timed rounds and summed over
t = 1..n. Projected total = n × (round − its noise) + Σ_t noise(t). Writes
benchmarks/results/paper_config.md (and paper_config.json).
"""

import argparse
import dataclasses
import math
import os
import platform
import statistics
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from bench_harness import _Clock, common_arguments, write_section  # pylint: disable=g-import-not-at-top,wrong-import-position

COMMAND = ".venv/bin/python benchmarks/bench_paper_config.py"
GRID = "paper_config"
STANDIN_VOCAB_WORDS = 14000
SMOKE_MODEL = dict(vocab_size=50, embedding_size=4, lstm_size=4, projection_size=4)
SMOKE = dict(clients_per_round=2, total_rounds=16, max_elements_per_client=8,
             max_validation_elements=16, **SMOKE_MODEL)


class _Stop(Exception):
  """Raised from the round callback once the timed rounds are done."""


class _PooledClients:
  """The run's client ids mapped in turn onto the stand-in's clients (same API)."""

  def __init__(self, clients, pool_ids):
    self._clients, self._pool = clients, list(pool_ids)

  def _source(self, client_id: str) -> str:
    return self._pool[int(client_id.rsplit("_", 1)[1]) % len(self._pool)]

  def load(self, client_id):
    return self._clients.load(self._source(client_id))

  def batches(self, client_id):
    return self._clients.batches(self._source(client_id))

  def token_ids(self, client_id):
    return self._clients.token_ids(self._source(client_id))


def _config(args, run, data_dir, root):
  from training import config as config_lib  # pylint: disable=g-import-not-at-top
  values = dict(run.flag_values())
  values.update(data_dir=data_dir, root_output_dir=root, engine="compiled", progress=False,
                cache_dir=args.cache_dir)
  if args.smoke:
    values.update(SMOKE)
  return config_lib.TrainingConfig(**values)


def _standin(args, config, data_dir):
  from stackoverflow import fixtures  # pylint: disable=g-import-not-at-top
  clients = fixtures.standin_sentences(
      num_train_clients=config.clients_per_round * (args.rounds + 1),
      sentences_per_client=config.max_elements_per_client,
      vocab_words=60 if args.smoke else STANDIN_VOCAB_WORDS)
  fixtures.write_stackoverflow_copy(data_dir, clients)


def train_rounds(args, run, root):
  """[(wall s, CPU s)] of the warm-up and timed rounds, the config, and the task facts."""
  from training import loop  # pylint: disable=g-import-not-at-top
  from training import task as task_lib  # pylint: disable=g-import-not-at-top
  data_dir = os.path.join(root, "standin")
  config = _config(args, run, data_dir, os.path.join(root, "runs"))
  _standin(args, config, data_dir)
  task = task_lib.build_task(config)
  needed = config.total_rounds * config.clients_per_round
  ids = [f"train_{i:06d}" for i in range(needed)]
  task = dataclasses.replace(task, train_client_ids=ids,
                             client_datasets=_PooledClients(task.client_datasets,
                                                            task.train_client_ids))
  parameters = int(sum(int(v.shape.num_elements())
                       for v in task.keras_model_fn().trainable_variables))
  rounds, clock = [], _Clock()

  def after_round(round_num):
    rounds.append(clock.read())
    print(f"[paper_config] round {round_num}: {rounds[-1][0]:.1f} s "
          f"({rounds[-1][1]:.1f} CPU s), load {os.getloadavg()[0]:.1f}", file=sys.stderr,
          flush=True)
    if len(rounds) == args.rounds + 1:
      raise _Stop()
    clock.start()

  def log(line):
    print(f"[paper_config] {line}", file=sys.stderr, flush=True)

  clock.start()
  try:
    loop.run_training(config, task=task, log=log, round_callback=after_round)
  except _Stop:
    pass
  return rounds, config, parameters


def _at_round(state, t: int):
  """``state`` with every matrix-factorization stream set to round t (0-based index t - 1)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from tff_mf.tf import query as query_lib  # pylint: disable=g-import-not-at-top
  if isinstance(state, query_lib.MatrixFactorizationState):
    return state._replace(round_index=tf.constant(t - 1, tf.int32))
  if isinstance(state, tuple) and hasattr(state, "_fields"):
    return type(state)(*(_at_round(v, t) for v in state))
  return state


def noise_seconds(args, runs, data_dir, root):
  """{mechanism: {round t: (wall s, CPU s)}} of one ``get_noised_result`` at round t.

  The query is the run's own: ``training.run_setup.resolve_privacy`` of the run's config,
  as the binary builds it, asked for the model's variables.
  """
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import bench_aggregation as agg  # pylint: disable=g-import-not-at-top
  from stackoverflow import model as so_model  # pylint: disable=g-import-not-at-top
  from training import run_setup as mechanisms_lib  # pylint: disable=g-import-not-at-top
  out = {}
  for run in runs:
    config = _config(args, run, data_dir, root)
    keras_model = so_model.create_keras_model(
        seed=0, vocab_size=config.vocab_size, embedding_size=config.embedding_size,
        lstm_size=config.lstm_size, projection_size=config.projection_size)
    specs = [tf.TensorSpec(v.shape, v.dtype) for v in keras_model.trainable_variables]
    sample = [tf.zeros(s.shape, s.dtype) for s in specs]
    setup, _, _ = mechanisms_lib.resolve_privacy(config, 1)
    query = setup.aggregation_factory.inner.dp_query(specs)
    fn = tf.function(query.get_noised_result)
    base = query.initial_global_state()
    out[run.mechanism] = {"implementation": setup.info.get("noise_implementation"),
                          "rounds": {}}
    for t in args.noise_rounds:
      state = _at_round(base, t)
      agg.time_calls(fn, sample, state, 1)  # warm
      out[run.mechanism]["rounds"][t] = agg._medians(  # pylint: disable=protected-access
          agg.time_calls(fn, sample, state, args.noise_reps))
      print(f"[paper_config] noise of {run.mechanism} at round {t}: "
            f"{out[run.mechanism]['rounds'][t][0]:.2f} s", file=sys.stderr, flush=True)
  return out


def _fit(rounds_seconds):
  """(a, b) of seconds ≈ a + b·t, least squares over the timed rounds (b = 0 for one)."""
  ts = sorted(rounds_seconds)
  ys = [rounds_seconds[t] for t in ts]
  if len(ts) == 1:
    return ys[0], 0.0
  mt, my = statistics.mean(ts), statistics.mean(ys)
  b = sum((t - mt) * (y - my) for t, y in zip(ts, ys)) / sum((t - mt) ** 2 for t in ts)
  return my - b * mt, b


def project(n, round_seconds, noise_now, fit):
  """Seconds of all n rounds: n × (clients' work) + Σ_t noise(t)."""
  a, b = fit
  work = round_seconds - noise_now
  return n * work + n * a + b * n * (n + 1) / 2


def project_all(rounds, noise, trained: str, n: int):
  """{mechanism: its fits and projected totals}, in wall (index 0) and CPU (index 1) seconds.

  The timed rounds added ``trained``'s noise; each mechanism's total swaps it for its own.
  """
  out = {}
  for mechanism in noise:
    r = noise[mechanism]["rounds"]
    for index, key in ((0, ""), (1, "_cpu")):
      fit = _fit({t: r[t][index] for t in r})
      work = statistics.median(x[index] for x in rounds[1:])
      now = noise[trained]["rounds"][len(rounds)][index]
      out.setdefault(mechanism, {})["fit" + key] = fit
      out[mechanism]["total" + key] = project(n, work, now, fit)
  return out


def section(args, run, config, parameters, rounds, noise, projections, load_start, load_end,
            minutes) -> str:
  timed = rounds[1:]
  steps = math.ceil(config.max_elements_per_client / config.client_batch_size)
  wall = statistics.median(w for w, _ in timed)
  cpu = statistics.median(c for _, c in timed)
  command = COMMAND + "".join(
      f" --{k.replace('_', '-')} {v}" for k, v in (("rounds", args.rounds), ("run", args.run))
      if v != {"rounds": 2, "run": 0}[k]) + (
          f" --noise-rounds {' '.join(map(str, args.noise_rounds_given))}"
          if args.noise_rounds_given != [1, 64, 256] else "") + (" --smoke" if args.smoke else "")
  lines = [
      "## The papers' StackOverflow configuration on the compiled engine (grid `paper_config`)",
      "",
      f"Command: `{command}` — machine: 2-core x86_64 CPU, 24 GB, no GPU (Python "
      f"{platform.python_version()}); 1-minute load average {load_start:.1f} at the start, "
      f"{load_end:.1f} at the end (CPU seconds: this process, all its threads). Total run: "
      f"{minutes:.1f} min.",
      "",
      f"Run `{run.name}` of `python -m training.sweep --grid {GRID}`: "
      f"{'(smoke run: a tiny model) ' if args.smoke else ''}the LSTM of "
      f"`stackoverflow/model.py` ({parameters:,} parameters, V = {config.vocab_size:,}), "
      f"{config.clients_per_round} clients per round, n = {config.total_rounds}, at most "
      f"{config.max_elements_per_client} sentences per client in batches of "
      f"{config.client_batch_size}, `--engine=compiled`; the binary's own loop on a stand-in "
      f"in TFF's on-disk format with every client at the cap (StackOverflow is a download). "
      f"Round 1 (tracing) is not counted; median of {len(timed)} timed round(s).",
      "",
      "| | wall s | CPU s |",
      "|---|---|---|",
      f"| start-up (mechanism, task, tracing) and round 1 | {rounds[0][0]:.1f} | "
      f"{rounds[0][1]:.1f} |",
      f"| **one round** (median of rounds 2..{len(rounds)}) | **{wall:.1f}** | **{cpu:.1f}** |",
      f"| per client update ({steps} steps of {config.client_batch_size}) | "
      f"{wall / config.clients_per_round:.2f} | {cpu / config.clients_per_round:.2f} |",
      "",
      "The noise alone (one `get_noised_result` of the run's query at d = "
      f"{parameters:,}, wall / CPU s, median of {args.noise_reps}), its fit a + b·t, and the "
      f"projected total of all {config.total_rounds} rounds (n × (round − noise at round "
      f"{len(rounds)}) + Σ noise(t)), from the wall seconds here and from the CPU seconds "
      "(which contention does not inflate: on 2 idle cores the wall lies between CPU / 2 and "
      "CPU):",
      "",
      "| mechanism | noise | " + " | ".join(f"round {t}" for t in args.noise_rounds) +
      " | a + b·t, wall / CPU s | projected total, days: wall here / CPU |",
      "|---|---|" + "---|" * len(args.noise_rounds) + "---|---|"]
  for mechanism, p in projections.items():
    r = noise[mechanism]["rounds"]
    (a, b), (a_cpu, b_cpu) = p["fit"], p["fit_cpu"]
    lines.append(
        f"| {mechanism} | {noise[mechanism]['implementation']} | " +
        " | ".join(f"{r[t][0]:.2f} / {r[t][1]:.2f}" for t in args.noise_rounds) +
        f" | {a:.3f} + {b:.4f}·t / {a_cpu:.3f} + {b_cpu:.4f}·t | "
        f"**{p['total'] / 86400:.1f}** / **{p['total_cpu'] / 86400:.1f}** |")
  n = config.total_rounds
  a_cpu, b_cpu = projections[run.mechanism]["fit_cpu"]
  last = a_cpu + b_cpu * n
  lines += [
      "",
      f"Reading: one round of the papers' configuration costs {cpu:.0f} CPU s here "
      f"({cpu / config.clients_per_round:.2f} CPU s per client update of {steps} steps) and "
      f"{wall:.0f} s of wall, {wall / cpu:.1f}× its CPU seconds on this shared machine; the "
      f"clients' work is the round at first. The dense `{run.mechanism}` stream regenerates t "
      f"rows of Z in round t, so its noise grows: about {last:.0f} CPU s at round {n}, "
      f"{last / (cpu + last):.0%} of that round; a streaming mechanism (BLT, banded, BISR: "
      "`bench_aggregation.py`) keeps it constant, and TFF's own tree (`tree`) costs O(log n) "
      "a round, where the paper's DP-FTRL tree as a matrix (`honaker_online`) regenerates "
      "about twice the rows of the dense optimum.",
      "",
      "No GPU figure: the GPU machines lent to this project (an H100 and an H200, checked on "
      "2026-11-27 by two sessions) run an image with Python 3.12.3 only, CUDA 13.0 and no "
      "TensorFlow (`import tensorflow` fails), and reach no package index (pip finds no "
      "TensorFlow 2.14); TFF 0.87 pins TensorFlow 2.14, which needs Python 3.11 at most and is "
      "built against CUDA 11.8, so neither engine runs there. What a run would need there "
      "(Python 3.11, TensorFlow's GPU wheel, CUDA 11.8 and cuDNN 8: about 2 GB) cannot "
      "travel: a device call carries at most 64 MiB, and a session has 15 minutes of device "
      "time. Nothing here depends on a GPU."]
  return "\n".join(lines) + "\n"


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--rounds", type=int, default=2, help="timed rounds after the warm-up")
  parser.add_argument("--run", type=int, default=0,
                      help=f"which run of grid {GRID} to time (0: opt_momentum)")
  parser.add_argument("--noise-rounds", type=int, nargs="+", default=[1, 64, 256],
                      help="rounds t at which the noise alone is timed")
  parser.add_argument("--noise-reps", type=int, default=1)
  common_arguments(parser, "a tiny model, 2 clients of 8 sentences, n = 16, one timed round")
  args = parser.parse_args(argv)
  from training import grids  # pylint: disable=g-import-not-at-top
  grid = grids.get_grid(GRID)
  if not 0 <= args.run < len(grid.runs):
    parser.error(f"--run must be in 0..{len(grid.runs) - 1} (grid {GRID} has "
                 f"{len(grid.runs)} runs)")
  if args.rounds < 1 or args.noise_reps < 1:
    parser.error("--rounds and --noise-reps must be at least 1")
  if args.smoke:
    args.rounds, args.noise_rounds = 1, [1, 8]
  args.noise_rounds_given = list(args.noise_rounds)
  from tff_mf.tf import runtime  # pylint: disable=g-import-not-at-top
  runtime.install_exit_hook()
  run = grid.runs[args.run]
  load_start, start = os.getloadavg()[0], time.perf_counter()
  with tempfile.TemporaryDirectory() as root:
    rounds, config, parameters = train_rounds(args, run, root)
    if len(rounds) < args.rounds + 1:
      print(f"error: the run stopped after {len(rounds)} rounds", file=sys.stderr)
      return 1
    n = config.total_rounds
    args.noise_rounds = sorted({t for t in args.noise_rounds if 1 <= t <= n} | {len(rounds)})
    noise = noise_seconds(args, grid.runs, os.path.join(root, "standin"), root)
  projections = project_all(rounds, noise, run.mechanism, n)
  text = section(args, run, config, parameters, rounds, noise, projections, load_start,
                 os.getloadavg()[0], (time.perf_counter() - start) / 60)
  write_section(args.out_dir, "paper_config", text, {
      "run": run.name, "parameters": parameters, "rounds": rounds,
      "noise": {m: {"implementation": v["implementation"],
                    "rounds": {str(t): s for t, s in v["rounds"].items()}}
                for m, v in noise.items()},
      "projections": projections})
  return 0


if __name__ == "__main__":
  sys.exit(main())
