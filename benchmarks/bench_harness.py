"""Seconds per round: the training binary's loop vs a bare TFF FedAvg loop on the same data.

Usage: .venv/bin/python benchmarks/bench_harness.py [--rounds 3] [--warmup 1]
(``--smoke``: synthetic data, a tiny model, one timed round; a minute)

The binary's own loop (``training.loop.run_training``, the code behind
``training/run_stackoverflow.py``, on TFF's process: ``--engine=tff``) trains on pydocs
with the model of ``stackoverflow/model.py`` at the main job's size (32 clients x 16
sentences) and at the papers' (32 x 16 and 8 x 256), with ``--mechanism=none`` and with
``opt_momentum``.
After each of its rounds, in the same process and on the same TFF runtime, a bare
``tff.learning.algorithms.build_unweighted_fed_avg`` loop (TFF's default server
optimizer and aggregator) runs one round on in-memory datasets
(``tf.data.Dataset.from_tensor_slices(...).batch(16)``, built before timing) of
exactly the clients, sentences and token ids the binary's round used; for
opt_momentum also bare FedAvg with the run's DP aggregator (the same process
the binary builds), so the harness's own share is visible apart from the
aggregator's. Rounds alternate, so load drift hits both alike. The binary's
round is the wall time between two rounds of its loop (sampling, client data,
``process.next``, metrics, model digest, metrics files); its first rounds
(compilation) and its last (final evaluation) are not counted. Medians over
the timed rounds; CPU seconds are those of this process and its TFF
``worker_binary``.

The bare loop alone at 1 client (the largest of each timed round's clients) gives
what remains TFF's own: seconds per client ((t(K) - t(1)) / (K - 1), with t(K)
the bare rounds above) and per round (t(1) minus one client).
Writes benchmarks/results/harness.md (and the per-round figures to harness.json);
``--only ... --name NAME`` writes a subsection to NAME.md (and NAME.json) instead.
"""

import argparse
import dataclasses
import json
import os
import platform
import statistics
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

COMMAND = ".venv/bin/python benchmarks/bench_harness.py"
TARGET_RATIO = 1.3
NOISE_MULTIPLIER = 1.0  # the private rounds' z; its value does not change their cost
TINY_MODEL = dict(dataset="synthetic", vocab_size=50, embedding_size=4, lstm_size=4,
                  projection_size=4)
MODEL_FIELDS = ("vocab_size", "embedding_size", "lstm_size", "projection_size", "lstm_kernel")
# (model, mechanism, clients, sentences): the paper-size model (the TrainingConfig defaults)
# and the main job's (its MAIN_JOB_DEFAULTS, read when the benchmark runs). The default run
# is the paper-size model's; --only picks any (make bench: the main job's, --name
# harness_main_job).
GRID = tuple((model, m, k, s) for model, shapes in (("paper", ((32, 16), (8, 256))),
                                                    ("main_job", ((32, 16),)))
             for m in ("none", "opt_momentum") for k, s in shapes)
DEFAULT_GRID = tuple(g for g in GRID if g[0] == "paper")


def _model_values(model: str) -> dict:
  """The TrainingConfig model fields of ``model`` ("paper": the defaults)."""
  if model == "paper":
    return {}
  from training import main_job  # pylint: disable=g-import-not-at-top
  return {k: main_job.MAIN_JOB_DEFAULTS[k] for k in MODEL_FIELDS}


def _label(model, mechanism, clients, sentences) -> str:
  return f"{model}/{mechanism}:{clients}x{sentences}"


def _cpu_seconds() -> float:
  """CPU seconds of this process and its children (TFF's worker_binary runs the rounds)."""
  import psutil  # pylint: disable=g-import-not-at-top
  me = psutil.Process()
  total = time.process_time()  # this process, at ns resolution (psutil's: clock ticks)
  for child in me.children(recursive=True):
    try:
      total += sum(child.cpu_times()[:2])
    except psutil.Error:
      pass
  return total


def common_arguments(parser, smoke_help: str) -> None:
  """The flags every training benchmark takes: --cache_dir, --out-dir and --smoke."""
  parser.add_argument("--cache_dir", default=None,
                      help="factorization cache (default: the library's)")
  parser.add_argument("--out-dir", default=os.path.join(REPO, "benchmarks", "results"))
  parser.add_argument("--smoke", action="store_true", help=smoke_help)


def write_section(out_dir: str, stem: str, text: str, data=None) -> str:
  """Writes ``<out_dir>/<stem>.md`` (and ``<stem>.json`` of ``data``), prints the section and
  the path; returns the path. The benchmarks' one way to leave their results."""
  os.makedirs(out_dir, exist_ok=True)
  if data is not None:
    with open(os.path.join(out_dir, f"{stem}.json"), "w", encoding="utf-8") as f:
      json.dump(data, f, indent=1)
  path = os.path.join(out_dir, f"{stem}.md")
  with open(path, "w", encoding="utf-8") as f:
    f.write(text)
  print(text)
  print(f"wrote {path}", file=sys.stderr)
  return path


class _Clock:
  """Wall and CPU seconds since ``start``."""

  def __init__(self):
    self.start()

  def start(self):
    self.wall, self.cpu = time.perf_counter(), _cpu_seconds()

  def read(self):
    return time.perf_counter() - self.wall, _cpu_seconds() - self.cpu


class _RecordingClients:
  """``task.client_datasets`` that also records which clients each round loaded (as a
  dataset, TFF's process, or as arrays, the compiled engine); the rest is the real one's."""

  def __init__(self, clients):
    self._clients = clients
    self.loaded = []

  def load(self, client_id):
    self.loaded.append(client_id)
    return self._clients.load(client_id)

  def batches(self, client_id):
    self.loaded.append(client_id)
    return self._clients.batches(client_id)

  def __getattr__(self, name):  # token_ids, prefetch
    return getattr(self._clients, name)

  def take(self):
    out, self.loaded = self.loaded, []
    return out


def _in_memory(ids, batch_size):
  """The bare loop's client data: the client's token ids as a plain in-memory dataset."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  return tf.data.Dataset.from_tensor_slices((ids[:, :-1], ids[:, 1:])).batch(batch_size)


def _bare_process(task, client_lr, setup=None):
  """Bare unweighted FedAvg: TFF's defaults, or the run's aggregator and server optimizer."""
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
  kwargs = {} if setup is None else dict(server_optimizer_fn=setup.server_optimizer,
                                         model_aggregator=setup.aggregation_factory)
  return tff.learning.algorithms.build_unweighted_fed_avg(
      task.model_fn, client_optimizer_fn=tff.learning.optimizers.build_sgdm(
          learning_rate=client_lr), **kwargs)


class _BareLoop:
  """A bare process and its state, one timed round at a time."""

  def __init__(self, process):
    self.process = process
    self.state = process.initialize()
    self.seconds = {}  # round -> (wall, cpu)

  def round(self, round_num, datasets):
    clock = _Clock()
    self.state = self.process.next(self.state, datasets).state
    self.seconds[round_num] = clock.read()


def _config(args, model, mechanism, clients, sentences, root, name):
  from training import config as config_lib  # pylint: disable=g-import-not-at-top
  total = args.warmup + args.rounds + 1
  values = dict(mechanism=mechanism, dataset="pydocs", clients_per_round=clients,
                max_elements_per_client=sentences, total_rounds=total, rounds_per_eval=total,
                rounds_per_checkpoint=total, max_validation_elements=64, max_test_elements=64,
                root_output_dir=root, experiment_name=name, progress=False, seed=0,
                engine="tff")  # the harness around TFF's process (the compiled: bench_engine)
  if mechanism != "none":
    values.update(noise_multiplier=NOISE_MULTIPLIER, noise_seed=1, cache_dir=args.cache_dir)
  values.update(_model_values(model))
  if args.smoke:
    values.update(TINY_MODEL)
  return config_lib.TrainingConfig(**values)


def _parameters(task) -> int:
  """Trainable parameters of the task's Keras model."""
  return int(sum(int(v.shape.num_elements()) for v in task.keras_model_fn().trainable_variables))


def _median(pairs, index):
  return statistics.median(p[index] for p in pairs)


def measure(args, model, mechanism, clients, sentences, tasks, bare_plain, root):
  """One configuration: the binary's rounds, each followed by the bare rounds on its clients.

  ``tasks`` ({(model, sentences): task}) and ``bare_plain`` ({model: bare process}) are shared
  between configurations, so each model's bare process is built (and traced) once.
  """
  from training import loop  # pylint: disable=g-import-not-at-top
  from training import run_setup  # pylint: disable=g-import-not-at-top
  from training import task as task_lib  # pylint: disable=g-import-not-at-top
  name = f"{model}_{mechanism}_{clients}x{sentences}"
  config = _config(args, model, mechanism, clients, sentences, root, name)
  if (model, sentences) not in tasks:
    tasks[model, sentences] = task_lib.build_task(config)
  recording = _RecordingClients(tasks[model, sentences].client_datasets)
  task = dataclasses.replace(tasks[model, sentences], client_datasets=recording)
  if model not in bare_plain:
    bare_plain[model] = _bare_process(task, config.client_lr)
  bares = {"bare": _BareLoop(bare_plain[model])}
  if mechanism != "none":
    setup, _, _ = run_setup.resolve_privacy(config, 1)
    bares["bare_dp"] = _BareLoop(_bare_process(task, config.client_lr, setup))
  binary, clients_used = {}, {}
  clock = _Clock()

  def after_round(round_num):
    binary[round_num] = clock.read()
    loaded = recording.take()
    clients_used[round_num] = loaded
    if round_num < config.total_rounds:  # the last round is not counted
      data = [_in_memory(recording.token_ids(c), config.client_batch_size) for c in loaded]
      for bare in bares.values():
        bare.round(round_num, data)
    clock.start()

  loop.run_training(config, task=task, log=lambda _: None, round_callback=after_round)
  timed = range(args.warmup + 1, args.warmup + args.rounds + 1)
  out = {"model": model, "mechanism": mechanism, "clients": clients, "sentences": sentences,
         "parameters": _parameters(task),
         "clients_used": [clients_used[r] for r in timed],
         "warmup_clients": clients_used[1],
         "binary": [binary[r] for r in timed]}
  for key, bare in bares.items():
    out[key] = [bare.seconds[r] for r in timed]
  return out


def tff_own(args, tasks, bare_plain, result):
  """TFF's seconds per round and per client: bare rounds of one client (the largest of each
  round of ``result``), against the bare rounds of ``result`` (K clients)."""
  task, batch = tasks[result["model"], result["sentences"]], 16
  sizes = lambda c: len(task.client_datasets.token_ids(c))  # noqa: E731
  rounds = [result["warmup_clients"]] + result["clients_used"]
  bare = _BareLoop(bare_plain[result["model"]])
  for r, loaded in enumerate(rounds):
    largest = max(loaded, key=sizes)
    bare.round(r, [_in_memory(task.client_datasets.token_ids(largest), batch)])
  t1 = _median([bare.seconds[r] for r in range(1, len(rounds))], 0)
  tk, clients = _median(result["bare"], 0), result["clients"]
  per_client = (tk - t1) / (clients - 1)
  return {"model": result["model"], "sentences": result["sentences"], "clients": clients,
          "t1": t1, "tk": tk,
          "per_client": per_client, "per_round": t1 - per_client}


def section(args, results, own, load_start, load_end, minutes) -> str:
  """The markdown section of BENCHMARKS.md."""
  command = COMMAND + ("" if (args.rounds, args.warmup) == (3, 1)
                       else f" --rounds {args.rounds} --warmup {args.warmup}") + (
                           " --only " + " ".join(args.only) if args.only else "") + (
                               f" --name {args.name}" if args.name != "harness" else "")
  title = ("## Harness speed" if args.name == "harness" else
           "### The same for " + ", ".join(args.only or ()) + " (a separate run)")
  lines = [
      title,
      "",
      f"Command: `{command}` — machine: 2-core x86_64 CPU, 24 GB, no GPU "
      f"(Python {platform.python_version()}); 1-minute load average {load_start:.1f} at the "
      f"start, {load_end:.1f} at the end (shared with other jobs: wall times include "
      f"contention; CPU seconds are this process plus TFF's worker_binary). "
      f"Total run: {minutes:.1f} min.",
      "",
      "The binary's loop (`training.loop.run_training`) against a bare "
      "`tff.learning.algorithms.build_unweighted_fed_avg` loop run right after each of its "
      "rounds, in the same process, on in-memory datasets of the same clients' token ids; "
      "pydocs, the LSTM of `stackoverflow/model.py` at the "
      + " and ".join(sorted({"main job's size (`training.main_job.MAIN_JOB_DEFAULTS`)"
                             if r["model"] == "main_job" else "papers' size"
                             for r in results}))
      + f"{' (tiny model: smoke run)' if args.smoke else ''}, client batches "
      f"of 16. Median of {args.rounds} rounds after {args.warmup} warm-up round(s). "
      f"Target: binary / bare ≤ {TARGET_RATIO}. For opt_momentum, *bare + DP* is bare "
      f"FedAvg with the run's own DP aggregator (z = {NOISE_MULTIPLIER}), so the "
      "binary / (bare + DP) ratio is the harness's own overhead and (bare + DP) / bare "
      "the aggregator's.",
      "",
      "| model (parameters) | mechanism | clients × sentences | binary s | bare s | "
      "binary / bare | bare + DP s | binary / (bare + DP) | binary CPU s | bare CPU s | "
      "CPU ratio |",
      "|---|---|---|---|---|---|---|---|---|---|---|"]
  for r in results:
    b, bare = _median(r["binary"], 0), _median(r["bare"], 0)
    dp = _median(r["bare_dp"], 0) if "bare_dp" in r else None
    bc, barec = _median(r["binary"], 1), _median(r["bare"], 1)
    lines.append(
        f"| {r['model']} ({r['parameters']:,}) | {r['mechanism']} | "
        f"{r['clients']} × {r['sentences']} | {b:.2f} | {bare:.2f} | "
        f"**{b / bare:.2f}** | {'—' if dp is None else f'{dp:.2f}'} | "
        f"{'—' if dp is None else f'{b / dp:.2f}'} | {bc:.2f} | {barec:.2f} | "
        f"{bc / barec:.2f} |")
  lines += ["", "Per round (wall s, binary / bare): " + "; ".join(
      f"{r['model']} {r['mechanism']} {r['clients']}×{r['sentences']}: " + ", ".join(
          f"{b[0]:.2f}/{p[0]:.2f}" for b, p in zip(r["binary"], r["bare"]))
      for r in results) + "."]
  lines += ["", "What remains TFF's own (bare loop alone, wall s, median of "
            f"{args.rounds} rounds; t(1): one client, the largest of each timed round's, "
            "t(K): the bare rounds above; per client = (t(K) − t(1)) / (K − 1), per round = "
            "t(1) − per client):", "",
            "| model | sentences per client (at most) | t(1) s | K | t(K) s | per client s | "
            "per round s |",
            "|---|---|---|---|---|---|---|"]
  for o in own:
    lines.append(f"| {o['model']} | {o['sentences']} | {o['t1']:.2f} | {o['clients']} | "
                 f"{o['tk']:.2f} | "
                 f"{o['per_client']:.3f} | {o['per_round']:.2f} |")
  return "\n".join(lines) + "\n"


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--rounds", type=int, default=3, help="timed rounds per configuration")
  parser.add_argument("--warmup", type=int, default=1, help="untimed rounds first")
  parser.add_argument("--only", nargs="*", default=None, metavar="MECHANISM:KxM",
                      help="a subset of the configurations, e.g. main_job/none:32x16 "
                      "paper/opt_momentum:8x256")
  common_arguments(parser, "synthetic data, a tiny model, 2 clients; one timed round")
  parser.add_argument("--name", default="harness",
                      help="results file stem (<out-dir>/<name>.{md,json}); another name needs "
                      "--only and writes a subsection")
  args = parser.parse_args(argv)
  if args.rounds < 1 or args.warmup < 1:
    parser.error("--rounds and --warmup must be at least 1")
  if args.name != "harness" and not args.only:
    parser.error("--name other than harness needs --only (it writes a subsection)")
  from tff_mf.tf import runtime  # pylint: disable=g-import-not-at-top
  runtime.install_exit_hook()
  if args.smoke:
    args.rounds, args.warmup = 1, 1
    grid = [("main_job", "opt_momentum", 2, 4)]
  else:
    grid = list(DEFAULT_GRID)
    if args.only:
      chosen = [g for g in GRID if _label(*g) in args.only]
      if len(chosen) != len(set(args.only)):
        parser.error(f"--only takes some of {' '.join(_label(*g) for g in GRID)}")
      grid = chosen
  load_start, start = os.getloadavg()[0], time.perf_counter()
  tasks, bare_plain, results = {}, {}, []
  with tempfile.TemporaryDirectory() as root:
    os.makedirs(args.out_dir, exist_ok=True)
    for model, mechanism, clients, sentences in grid:
      results.append(measure(args, model, mechanism, clients, sentences, tasks, bare_plain,
                             root))
      r = results[-1]
      print(f"[harness] {_label(model, mechanism, clients, sentences)}: binary "
            f"{_median(r['binary'], 0):.2f} s ({_median(r['binary'], 1):.2f} CPU s), bare "
            f"{_median(r['bare'], 0):.2f} s ({_median(r['bare'], 1):.2f} CPU s), "
            f"load {os.getloadavg()[0]:.1f}", file=sys.stderr, flush=True)
      with open(os.path.join(args.out_dir, f"{args.name}.json"), "w", encoding="utf-8") as f:
        json.dump(results, f, indent=1)  # so far
  own = [tff_own(args, tasks, bare_plain, r) for r in results if r["mechanism"] == grid[0][1]]
  text = section(args, results, own, load_start, os.getloadavg()[0],
                 (time.perf_counter() - start) / 60)
  write_section(args.out_dir, args.name, text)
  return 0


if __name__ == "__main__":
  sys.exit(main())
