"""CPU per client update: the training binary against the compiled engine alone, and what
each item of the binary's per-round work costs.

Usage: .venv/bin/python benchmarks/bench_binary.py [--rounds 30] [--clients 8]
(``--smoke``: a tiny model, 2 clients, 2 timed rounds; a minute)

The binary's loop (``training.loop.run_training``, the code behind
``training/run_stackoverflow.py``) on ``--engine=compiled`` trains the main job's model
(LSTM 16/32/16, V = 1,000, the fused ``block`` kernel; ``training.main_job``) on pydocs, K
clients a round of at most ``--sentences`` sentences, a single pass, with ``none`` and with
``opt_prefix_sum`` (z = 1, a pinned seed), checkpointing every 10 rounds (the binary's
default) and every round. After each of its rounds, in the same process, the compiled
engine alone (``training.engine.build_process`` with the run's own setup and a state of its
own) runs one round on the same clients' batches, already in memory: what
``benchmarks/bench_engine.py`` measures. Rounds alternate, so load drift hits both alike.
CPU seconds are this process's, all threads (the compiled engine runs in it; the checkpoint
writer's included; ``time.process_time``): a binary
round is the CPU between two of its rounds' callbacks, less the engine-alone round run in
between, once any checkpoint write in flight is finished; no round evaluates
(``--rounds_per_eval`` past the run) and the first ``--warmup`` rounds (tracing) are not
counted. Per item: the process's CPU while the round's thread is inside each function of
its work (TensorFlow's threads included; a checkpoint write running meanwhile too), and the
checkpoint writer thread's own CPU apart; each run trains on a freshly built task (no client
read before).

``--code DIR`` measures another checkout's ``training/`` and ``tff_mf/`` with this script
(the figures before a change). Writes benchmarks/results/binary.md (and binary.json);
``--name`` another stem.
"""

import argparse
import collections
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

from bench_harness import _RecordingClients, common_arguments, write_section  # pylint: disable=g-import-not-at-top,wrong-import-position

COMMAND = ".venv/bin/python benchmarks/bench_binary.py"
TARGET = 1.2  # the binary / the engine alone, CPU per client update, at most
MECHANISMS = ("none", "opt_prefix_sum")
CHECKPOINT_EVERY = (10, 1)
MODEL = dict(vocab_size=1000, embedding_size=16, lstm_size=32, projection_size=16,
             lstm_kernel="block")
SMOKE_MODEL = dict(vocab_size=50, embedding_size=4, lstm_size=4, projection_size=4,
                   lstm_kernel="block")
# (label, module, owner, attribute): the per-round work timed on the calling thread.
ITEMS = (
    ("client data", "training.loop", "_Trainer", "prefetch"),
    ("client data", "training.sampling", "SinglePassSampler", "next_round"),
    ("engine round", "training.engine", "CompiledProcess", "next"),
    ("DpEvent ledger", "training.privacy", "EventLedger", "write"),
    ("DpEvent ledger", "training.privacy", None, "round_event"),
    ("participation record", "training.sampling", "ParticipationLog", "observe"),
    ("participation record", "training.sampling", "ParticipationLog", "violations"),
    ("finite check", "tff_mf.tf.clipping", None, "all_finite"),
    ("model digest", "training.identity", None, "model_digest"),
    ("release log", "training.identity", "ReleaseLog", "record"),
    ("release log", "tff_mf.runstate", "ReleaseLog", "replays"),
    ("metrics.csv + TensorBoard", "training.outputs", "MetricsWriter", "write"),
    ("progress bar", "training.outputs", "Progress", "update"),
    ("checkpoint (round's thread)", "training.checkpoints", "Checkpointer", "save"),
    ("checkpoint (writer thread)", "training.checkpoints", "Checkpointer", "_write"),
)

WRITER_ITEMS = ("checkpoint (writer thread)",)  # timed on its own thread; the others process-wide


class _Items:
  """Wraps ITEMS with timers, per (label, round): the process's CPU (TensorFlow's threads
  included) while the round's thread is inside the item; the writer thread's own CPU."""

  def __init__(self):
    import importlib  # pylint: disable=g-import-not-at-top
    self.round = 0
    self.cpu = collections.defaultdict(float)
    self.checkpointers = []
    for label, module, owner, name in ITEMS:
      target = importlib.import_module(module)
      target = getattr(target, owner) if owner else target
      if hasattr(target, name):  # an item the measured code has
        setattr(target, name, self._timed(label, getattr(target, name)))
    checkpoints = importlib.import_module("training.checkpoints")
    init = checkpoints.Checkpointer.__init__

    def recording_init(checkpointer, *args, **kwargs):
      init(checkpointer, *args, **kwargs)
      self.checkpointers.append(checkpointer)
    checkpoints.Checkpointer.__init__ = recording_init

  def _timed(self, label, function):
    def timed(*args, **kwargs):
      clock = time.thread_time if label in WRITER_ITEMS else time.process_time
      round_num, start = self.round, clock()
      try:
        return function(*args, **kwargs)
      finally:
        if round_num is not None:  # None: the engine alone's round
          self.cpu[label, round_num] += clock() - start
    return timed

  def settle(self):
    """Waits for a checkpoint write in flight (the code before background writes has none)."""
    for checkpointer in self.checkpointers:
      getattr(checkpointer, "wait", lambda: None)()


def _config(args, mechanism, every, root):
  from training import config as config_lib  # pylint: disable=g-import-not-at-top
  total = args.warmup + args.rounds + 1
  values = dict(MODEL if not args.smoke else SMOKE_MODEL, dataset="pydocs",
                mechanism=mechanism, engine="compiled", clients_per_round=args.clients,
                max_elements_per_client=args.sentences, total_rounds=total,
                rounds_per_eval=total + 1, rounds_per_checkpoint=every,
                max_validation_elements=16, max_test_elements=16, root_output_dir=root,
                experiment_name=f"{mechanism}_{every}", progress=False, seed=0)
  if args.smoke:
    values.update(dataset="synthetic")
  if mechanism != "none":
    values.update(noise_multiplier=1.0, noise_seed=1, cache_dir=os.path.join(root, "cache"))
  return config_lib.TrainingConfig(**values)


def measure(args, items, mechanism, every, root):
  """One run of the binary, each round followed by the engine alone on its clients."""
  import dataclasses  # pylint: disable=g-import-not-at-top
  from training import engine  # pylint: disable=g-import-not-at-top
  from training import loop  # pylint: disable=g-import-not-at-top
  from training import run_setup  # pylint: disable=g-import-not-at-top
  from training import task as task_lib  # pylint: disable=g-import-not-at-top
  config = _config(args, mechanism, every, root)
  task = task_lib.build_task(config)  # no client read yet, as in the binary
  recording = _RecordingClients(task.client_datasets)
  task = dataclasses.replace(task, client_datasets=recording)
  setup, _, _ = run_setup.resolve_privacy(config, 1 if mechanism != "none" else None)
  alone = engine.build_process("compiled", task.model_fn, setup, config.client_lr)
  alone_state = [alone.initialize()]
  binary, engine_alone = {}, {}
  start = [time.process_time()]

  def after_round(round_num):
    items.settle()
    binary[round_num] = time.process_time() - start[0]
    batches = [recording._clients.batches(c) for c in recording.take()]  # pylint: disable=protected-access
    items.round = None
    before = time.process_time()
    alone_state[0] = alone.next(alone_state[0], batches).state
    engine_alone[round_num] = time.process_time() - before
    items.round = round_num + 1
    start[0] = time.process_time()

  items.round, items.cpu = 1, collections.defaultdict(float)
  loop.run_training(config, task=task, log=lambda _: None, round_callback=after_round)
  timed = list(range(args.warmup + 1, args.warmup + args.rounds + 1))
  per_item = collections.defaultdict(list)
  for label, *_ in ITEMS:
    for r in timed:
      per_item[label].append(items.cpu.get((label, r), 0.0))
  return {"mechanism": mechanism, "checkpoint_every": every, "clients": args.clients,
          "binary": [binary[r] for r in timed], "engine": [engine_alone[r] for r in timed],
          "items": {k: v for k, v in per_item.items() if any(v)}}


def _mean_ms(values):
  return 1e3 * sum(values) / len(values)


def section(args, results, load_start, load_end, minutes, code) -> str:
  command = COMMAND + ("" if (args.rounds, args.clients, args.sentences) == (30, 8, 5) else
                       f" --rounds {args.rounds} --clients {args.clients} "
                       f"--sentences {args.sentences}") + (
                           f" --code {args.code} --name {args.name}" if args.code else "")
  k = args.clients
  lines = [
      "## The binary against the compiled engine alone" if not args.code else
      f"### The same, before the change ({code})", "",
      f"Command: `{command}` — machine: 2-core x86_64 CPU, no GPU (Python "
      f"{platform.python_version()}); 1-minute load average {load_start:.1f} at the start, "
      f"{load_end:.1f} at the end (shared: CPU seconds are this process's, all threads). "
      f"Total run: {minutes:.1f} min.", "",
      f"CPU per client update, {k} clients a round of at most {args.sentences} sentences "
      f"(pydocs{', tiny model: smoke run' if args.smoke else ''}), median of {args.rounds} "
      f"rounds after {args.warmup} (and the ratio of the means, which spreads the "
      "checkpoint rounds over the others); the engine alone runs each round's clients right "
      f"after the binary. Target: binary / engine alone ≤ {TARGET}.", "",
      "| mechanism | checkpoint every | binary ms | engine alone ms | binary / engine | "
      "binary / engine, means |",
      "|---|---|---|---|---|---|"]
  for r in results:
    b, e = statistics.median(r["binary"]) / k, statistics.median(r["engine"]) / k
    lines.append(f"| {r['mechanism']} | {r['checkpoint_every']} | {b * 1e3:.2f} | "
                 f"{e * 1e3:.2f} | **{b / e:.2f}** | "
                 f"{sum(r['binary']) / sum(r['engine']):.2f} |")
  labels = [label for label in dict.fromkeys(label for label, *_ in ITEMS)
            if any(label in r["items"] for r in results)]
  lines += ["", "The binary's round, item by item: mean CPU ms a round (the process's while "
            "the round's thread is in the item; the checkpoint writer thread's apart; *other* "
            "is the round's CPU less the items):", "",
            "| item | " + " | ".join(f"{r['mechanism']}, every {r['checkpoint_every']}"
                                     for r in results) + " |",
            "|---|" + "---|" * len(results)]
  for label in labels:
    lines.append(f"| {label} | " + " | ".join(
        f"{_mean_ms(r['items'][label]):.3f}" if label in r["items"] else "—"
        for r in results) + " |")
  lines.append("| other | " + " | ".join(
      f"{_mean_ms(r['binary']) - sum(_mean_ms(v) for v in r['items'].values()):.3f}"
      for r in results) + " |")
  lines.append("| **the round (all threads)** | " + " | ".join(
      f"**{_mean_ms(r['binary']):.3f}**" for r in results) + " |")
  return "\n".join(lines) + "\n"


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--rounds", type=int, default=30, help="timed rounds per run")
  parser.add_argument("--warmup", type=int, default=3, help="untimed rounds first")
  parser.add_argument("--clients", type=int, default=8, help="clients per round")
  parser.add_argument("--sentences", type=int, default=5, help="sentences per client, at most")
  parser.add_argument("--code", default=None,
                      help="a checkout whose training/ and tff_mf/ to measure (default: this)")
  parser.add_argument("--name", default="binary", help="results file stem")
  common_arguments(parser, "a tiny model, synthetic data, 2 clients, 2 timed rounds")
  args = parser.parse_args(argv)
  if min(args.rounds, args.warmup, args.clients, args.sentences) < 1:
    parser.error("--rounds, --warmup, --clients and --sentences must be at least 1")
  if args.smoke:
    args.rounds, args.warmup, args.clients = 2, 1, 2
  if args.code:
    sys.path.insert(0, os.path.abspath(args.code))
  import training  # pylint: disable=g-import-not-at-top
  code = f"training/ and tff_mf/ of {os.path.dirname(os.path.dirname(training.__file__))}"
  from tff_mf.tf import runtime  # pylint: disable=g-import-not-at-top
  from training import engine  # pylint: disable=g-import-not-at-top
  runtime.install_exit_hook()
  load_start, start = os.getloadavg()[0], time.perf_counter()
  items = _Items()
  results = []
  with tempfile.TemporaryDirectory() as root:
    engine.configure_threads(_config(args, "none", 1, root))
    for mechanism in MECHANISMS:
      for every in CHECKPOINT_EVERY:
        results.append(measure(args, items, mechanism, every, root))
        r = results[-1]
        print(f"[binary] {mechanism}, checkpoint every {every}: binary "
              f"{statistics.median(r['binary']) / args.clients * 1e3:.2f} ms, engine alone "
              f"{statistics.median(r['engine']) / args.clients * 1e3:.2f} ms a client update",
              file=sys.stderr, flush=True)
  text = section(args, results, load_start, os.getloadavg()[0],
                 (time.perf_counter() - start) / 60, code)
  write_section(args.out_dir, args.name, text, results)
  return 0


if __name__ == "__main__":
  sys.exit(main())
