"""CPU per client update: plain TensorFlow, the compiled engine and TFF's process, side by side.

Usage: .venv/bin/python benchmarks/bench_engine.py [--rounds 10] [--clients 8]
[--baseline-engine FILE] [--pfl-python PYTHON]
(``--smoke``: a tiny model, 2 clients, one timed round; seconds)

Three ways to run the same FedAvg round (K clients, each one SGD pass over its batches,
learning rate 0.5), on the LSTM of ``stackoverflow/model.py``:

- plain TF, the limit: one Keras model, one ``tf.function`` train step per batch, clients
  one after another, the weights reset before each client and the deltas summed (no DP,
  no server optimizer);
- the compiled engine (``training.engine.CompiledProcess``, ``--engine=compiled``) with
  ``none`` (its client work and mean) and with the DP mechanisms ``banded`` and ``blt`` (the
  run's query: clipping, noise, DpEvent); goal: each within 1.3x of ``none``;
- TFF's process: ``tff.learning.algorithms.build_unweighted_fed_avg`` with its default
  aggregator, what ``--engine=tff`` runs for ``none``.

Models: the main job's (LSTM 16/32/16, V = 1,000, on the fused ``block`` LSTM kernel it
trains with; ``training.main_job.MAIN_JOB_DEFAULTS``) with 5 sentences per client, and the
papers' (4.05M parameters, V = 10,000, Keras' LSTM cell) with 16. Each model is measured in
a process of its own, whose TensorFlow thread pools are the compiled engine's choice for it
(``training.engine.configure_threads``: one thread for the main job's model, TF's default for
the papers'); plain TF runs in that process too, and TFF in its worker_binary child with TF's
default pools. Each
client's sentences are random token ids of the vocabulary (fixed seed), batches of 16; the
three paths see the same clients in the same order. CPU seconds are those of this process
and its children (TFF's worker_binary), per round divided by K: the median of the timed
rounds after one warm-up round (tracing). Rounds of the three paths alternate, so load drift
hits them alike. The noise: CPU seconds of one call of the query's ``get_noised_result``
(what the engine runs once per round) per mechanism, at n = 48 rounds, median of 5 calls
after one. Writes benchmarks/results/engine.md (and engine.json).

``--baseline-engine FILE``: another version of ``training/engine.py`` (e.g. ``git show
COMMIT:training/engine.py > /tmp/engine_before.py``), loaded beside this one; its
compiled paths run in the same alternation, for before/after ratios of one run.
``--pfl-python PYTHON``: an interpreter with pfl and torch (a benchmark-only venv, by
default .venv-bench-pfl's when it exists: ``make venv-bench-pfl``); runs
``benchmarks/peer_pfl.py`` for the main job's model after this script's rounds (pfl's
FedAvg with no DP and with its banded MF mechanism, same clients and sizes).
"""

import argparse
import json
import os
import platform
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from bench_harness import _cpu_seconds, common_arguments, write_section  # pylint: disable=g-import-not-at-top,wrong-import-position

COMMAND = ".venv/bin/python benchmarks/bench_engine.py"
PFL_PYTHON = os.path.join(REPO, ".venv-bench-pfl", "bin", "python")
TARGET_PLAIN = 1.5  # compiled engine / plain TF, at most
TARGET_TFF = 20.0  # TFF / compiled engine, at least (the main job's model)
TARGET_DP = 1.3  # compiled engine with DP / without, at most (the main job's model)
CLIENT_LR = 0.5
BATCH = 16
NOISE_ROUNDS = 48
NOISE_MECHANISMS = ("gaussian", "tree", "opt_momentum", "banded", "blt", "bisr")
DP_MECHANISMS = ("banded", "blt")
MODELS = {
    "main job": dict(vocab_size=1000, embedding_size=16, lstm_size=32, projection_size=16,
                     lstm_kernel="block", sentences=5),
    "paper": dict(vocab_size=10000, embedding_size=96, lstm_size=670, projection_size=96,
                  lstm_kernel="keras", sentences=16),
}
SMOKE_MODEL = dict(vocab_size=50, embedding_size=4, lstm_size=4, projection_size=4,
                   lstm_kernel="block", sentences=5)


def _sizes(model):
  """The model's size arguments of ``stackoverflow.model.parameter_count``."""
  return {k: v for k, v in model.items() if k not in ("sentences", "lstm_kernel")}


def _config(model, mechanism, cache_dir):
  from training import config as config_lib  # pylint: disable=g-import-not-at-top
  sizes = {k: v for k, v in model.items() if k != "sentences"}  # with its lstm_kernel
  private = mechanism != "none"
  return config_lib.TrainingConfig(
      dataset="synthetic", mechanism=mechanism, total_rounds=NOISE_ROUNDS, clients_per_round=8,
      noise_multiplier=1.0 if private else None, clip_norm=1.0, client_lr=CLIENT_LR,
      client_batch_size=BATCH, cache_dir=cache_dir, progress=False,
      noise_seed=1 if private else None, engine="compiled", **sizes)


def _clients(model, count, seed):
  """``count`` clients' batches of random token ids, ``model['sentences']`` each, in both
  forms: ``ClientBatches`` (arrays, what the harness gives the compiled engine) and
  tf.data datasets (what it gives TFF's process), built before the timing."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  from stackoverflow import preprocessing  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(seed)
  classes = preprocessing.extended_vocab_size(model["vocab_size"], 1)
  batches = [preprocessing.ClientBatches(
      rng.integers(1, classes, size=(model["sentences"], 21)), BATCH) for _ in range(count)]
  return {"arrays": batches, "dataset": [b.dataset() for b in batches]}


def _model_fns(model):
  from stackoverflow import model as so_model  # pylint: disable=g-import-not-at-top
  sizes = {k: v for k, v in model.items() if k not in ("sentences", "vocab_size")}
  tff_model_fn = so_model.create_tff_model_fn(vocab_size=model["vocab_size"], seed=0, **sizes)
  return tff_model_fn, lambda: so_model.create_keras_model(
      vocab_size=model["vocab_size"], seed=0, **sizes)


class PlainTF:
  """The limit: one compiled train step per batch on one model, deltas summed."""

  def __init__(self, keras_model_fn):
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    self.model = model = keras_model_fn()
    variables = model.trainable_variables
    self.initial = [tf.Variable(v) for v in variables]
    self.total = [tf.Variable(tf.zeros_like(v)) for v in variables]
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function(reduce_retracing=True)
    def step(x, y):
      with tf.GradientTape() as tape:
        loss = loss_fn(y, model(x, training=True))
      for v, g in zip(variables, tape.gradient(loss, variables)):
        v.assign_sub(CLIENT_LR * tf.convert_to_tensor(g))

    @tf.function
    def reset():
      for v, w in zip(variables, self.initial):
        v.assign(w)

    @tf.function
    def add_delta():
      for t, w, v in zip(self.total, self.initial, variables):
        t.assign_add(w - v)

    self.step, self.reset, self.add_delta = step, reset, add_delta

  def round(self, clients):
    for batches in clients:
      self.reset()
      ids, size = batches.ids, batches.batch_size
      for start in range(0, len(ids), size):
        self.step(ids[start:start + size, :-1], ids[start:start + size, 1:])
      self.add_delta()


class Timed:
  """A path's rounds: CPU seconds of each."""

  def __init__(self, name, run_round, form="arrays"):
    self.name, self.run_round, self.form, self.cpu = name, run_round, form, []

  def round(self, clients, timed):
    """One round on ``clients[self.form]`` (the clients in the form this path takes)."""
    start = _cpu_seconds()
    self.run_round(clients[self.form])
    if timed:
      self.cpu.append(_cpu_seconds() - start)


def _load_engine(path):
  """``training/engine.py`` of another version, as a module of its own (the baseline)."""
  import importlib.util  # pylint: disable=g-import-not-at-top
  spec = importlib.util.spec_from_file_location("engine_baseline", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def _engine_paths(engines, model, cache_dir, tff_model_fn):
  """The compiled paths: each engine (label -> module) with none and the DP mechanisms."""
  from training import run_setup  # pylint: disable=g-import-not-at-top
  paths = []
  for label, module in engines.items():
    for mechanism in ("none", *DP_MECHANISMS):
      setup, _, _ = run_setup.resolve_privacy(_config(model, mechanism, cache_dir), 1)
      process = module.build_process("compiled", tff_model_fn, setup, CLIENT_LR)
      state = [process.initialize()]

      def run(datasets, process=process, state=state):
        state[0] = process.next(state[0], datasets).state
      paths.append(Timed(f"{label} ({mechanism})", run))
  return paths


def _paths(model, cache_dir, baseline=None):
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
  from training import engine  # pylint: disable=g-import-not-at-top
  tff_model_fn, keras_model_fn = _model_fns(model)
  # TFF's process first: it builds its models in graphs of its own, after which a Keras model
  # built before would no longer trace (Keras 2.14).
  bare = tff.learning.algorithms.build_unweighted_fed_avg(
      tff_model_fn, client_optimizer_fn=tff.learning.optimizers.build_sgdm(
          learning_rate=CLIENT_LR))
  bare_state = [bare.initialize()]

  def run_tff(datasets):
    bare_state[0] = bare.next(bare_state[0], datasets).state
  engines = {"compiled engine": engine}
  if baseline:
    engines["baseline engine"] = _load_engine(baseline)
  paths = _engine_paths(engines, model, cache_dir, tff_model_fn)
  plain = PlainTF(keras_model_fn)
  return [Timed("plain TF", plain.round), *paths,
          Timed("TFF (build_unweighted_fed_avg)", run_tff, form="dataset")]


def noise_cost(model, cache_dir, mechanisms_to_time, repeats):
  """CPU seconds of one ``get_noised_result`` of each mechanism's query (median)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from training import run_setup  # pylint: disable=g-import-not-at-top
  _, keras_model_fn = _model_fns(model)
  specs = [tf.TensorSpec(v.shape, v.dtype) for v in keras_model_fn().trainable_variables]
  out = {}
  for mechanism in mechanisms_to_time:
    setup, _, _ = run_setup.resolve_privacy(_config(model, mechanism, cache_dir), 1)
    query = setup.aggregation_factory.inner.dp_query(specs)
    noised = tf.function(query.get_noised_result, reduce_retracing=True)
    sample = query.initial_sample_state(specs)
    state = query.initial_global_state()
    times = []
    for i in range(repeats + 1):
      start = _cpu_seconds()
      _, state, _ = noised(sample, state)
      tf.nest.map_structure(lambda t: t.numpy() if hasattr(t, "numpy") else t, state)
      if i:
        times.append(_cpu_seconds() - start)
    out[mechanism] = statistics.median(times)
  return out


def _pfl(args):
  """``benchmarks/peer_pfl.py`` under ``args.pfl_python`` (the main job's sizes): its JSON."""
  import subprocess  # pylint: disable=g-import-not-at-top
  import tempfile  # pylint: disable=g-import-not-at-top
  with tempfile.TemporaryDirectory() as tmp:
    out = os.path.join(tmp, "pfl.json")
    subprocess.run([args.pfl_python, os.path.join(REPO, "benchmarks", "peer_pfl.py"),
                    "--rounds", str(args.rounds), "--clients", str(args.clients),
                    "--json", out], check=True)
    with open(out, encoding="utf-8") as f:
      return json.load(f)


def measure(name, model, args):
  """One model's figures, in this process (``_measure_apart`` runs it in a fresh one)."""
  from training import engine  # pylint: disable=g-import-not-at-top
  threads = engine.configure_threads(_config(model, "none", args.cache_dir))
  print(f"[engine] {name}: building (TensorFlow threads: {threads})", file=sys.stderr,
        flush=True)
  paths = _paths(model, args.cache_dir, args.baseline_engine)
  for r in range(args.rounds + 1):  # round 0 traces (not timed)
    clients = _clients(model, args.clients, seed=r)
    for path in paths:
      path.round(clients, timed=r > 0)
  per_client = {p.name: statistics.median(p.cpu) / args.clients for p in paths}
  pfl = _pfl(args) if args.pfl_python and name == "main job" and not args.smoke else None
  noise = noise_cost(model, args.cache_dir, args.noise_mechanisms, args.noise_repeats)
  from stackoverflow import model as so_model  # pylint: disable=g-import-not-at-top
  result = {"model": name, "parameters": so_model.parameter_count(**_sizes(model)),
            "lstm_kernel": model["lstm_kernel"], "threads": threads,
            "sentences": model["sentences"], "clients": args.clients,
            "per_client_cpu_s": per_client,
            "rounds_cpu_s": {p.name: p.cpu for p in paths}, "noise_cpu_s": noise,
            "pfl": pfl}
  print(f"[engine] {name}: " + ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in
                                          per_client.items()), file=sys.stderr, flush=True)
  return result


def _measure_here(name, model, args):
  """``measure`` in this process, which then owns TFF's worker_binary."""
  from tff_mf.tf import runtime  # pylint: disable=g-import-not-at-top
  runtime.install_exit_hook()
  return measure(name, model, args)


def _measure_apart(name, argv, args):
  """``measure`` of one model in a fresh process: TensorFlow's thread pools are fixed once it
  runs, and each model gets the compiled engine's choice."""
  import subprocess  # pylint: disable=g-import-not-at-top
  import tempfile  # pylint: disable=g-import-not-at-top
  argv = list(sys.argv[1:] if argv is None else argv)
  if "--models" in argv:  # the child's --models is this model alone
    i = argv.index("--models")
    while i + 1 < len(argv) and not argv[i + 1].startswith("--"):
      del argv[i + 1]
    del argv[i]
  with tempfile.TemporaryDirectory() as tmp:
    out = os.path.join(tmp, "result.json")
    subprocess.run([sys.executable, os.path.abspath(__file__), *argv, "--models", name,
                    "--one-model-json", out], check=True)
    with open(out, encoding="utf-8") as f:
      return json.load(f)


def _command(args) -> str:
  extra = "" if (args.rounds, args.clients) == (10, 8) else (
      f" --rounds {args.rounds} --clients {args.clients}")
  if args.models != list(MODELS):
    extra += " --models " + " ".join(f'"{m}"' if " " in m else m for m in args.models)
  if args.baseline_engine:
    extra += f" --baseline-engine {args.baseline_engine}"
  if args.pfl_python and args.pfl_python != PFL_PYTHON:
    extra += f" --pfl-python {args.pfl_python}"
  return COMMAND + extra


def _main_table(results):
  dp = " | ".join(f"compiled ({m}) ms" for m in DP_MECHANISMS)
  ratios = " | ".join(f"{m} / none" for m in DP_MECHANISMS)
  lines = [f"| model | parameters | LSTM kernel | engine's TF threads | sentences per client | "
           f"plain TF ms | compiled (none) ms | {dp} | TFF ms | compiled / plain | "
           f"TFF / compiled | {ratios} |",
           "|---|---|---|---|---|---|---|" + "---|" * (2 * len(DP_MECHANISMS) + 3)]
  for r in results:
    t = r["per_client_cpu_s"]
    plain, none = t["plain TF"], t["compiled engine (none)"]
    bare = t["TFF (build_unweighted_fed_avg)"]
    private = [t[f"compiled engine ({m})"] for m in DP_MECHANISMS]
    lines.append(f"| {r['model']} | {r['parameters']:,} | {r['lstm_kernel']} | "
                 f"{r['threads']} | {r['sentences']} | {plain * 1e3:.2f} | {none * 1e3:.2f} | "
                 + " | ".join(f"{x * 1e3:.2f}" for x in private) +
                 f" | {bare * 1e3:.1f} | **{none / plain:.2f}** | **{bare / none:.1f}** | "
                 + " | ".join(f"**{x / none:.2f}**" for x in private) + " |")
  return lines


def _baseline_table(results):
  """The baseline engine's figures of the same rounds, and after / before."""
  mechanisms = ("none", *DP_MECHANISMS)
  lines = ["| model | " + " | ".join(f"before ({m}) ms" for m in mechanisms) + " | " +
           " | ".join(f"before: {m} / none" for m in DP_MECHANISMS) + " | " +
           " | ".join(f"after / before ({m})" for m in mechanisms) + " |",
           "|---|" + "---|" * (2 * len(mechanisms) + len(DP_MECHANISMS))]
  for r in results:
    t = r["per_client_cpu_s"]
    before = [t[f"baseline engine ({m})"] for m in mechanisms]
    after = [t[f"compiled engine ({m})"] for m in mechanisms]
    lines.append(f"| {r['model']} | " + " | ".join(f"{x * 1e3:.2f}" for x in before) + " | "
                 + " | ".join(f"**{x / before[0]:.2f}**" for x in before[1:]) + " | "
                 + " | ".join(f"{y / x:.2f}" for x, y in zip(before, after)) + " |")
  return lines


def _pfl_table(results):
  lines = ["| model | pfl (none) ms | pfl (banded MF) ms | compiled (none) / pfl (none) | "
           "compiled (banded) / pfl (banded MF) | compiled (blt) / pfl (banded MF) |",
           "|---|---|---|---|---|---|"]
  for r in results:
    if not r.get("pfl"):
      continue
    t, p = r["per_client_cpu_s"], r["pfl"]["per_client_cpu_s"]
    lines.append(f"| {r['model']} | {p['none'] * 1e3:.2f} | {p['banded'] * 1e3:.2f} | "
                 f"{t['compiled engine (none)'] / p['none']:.2f} | "
                 f"**{t['compiled engine (banded)'] / p['banded']:.2f}** | "
                 f"**{t['compiled engine (blt)'] / p['banded']:.2f}** |")
  return lines


def section(args, results, load_start, load_end, minutes) -> str:
  dp = " and ".join(DP_MECHANISMS)
  lines = [
      "## Compiled engine speed", "",
      f"Command: `{_command(args)}` — machine: 2-core x86_64 CPU, no GPU (Python "
      f"{platform.python_version()}); 1-minute load average {load_start:.1f} at the start, "
      f"{load_end:.1f} at the end (shared: CPU seconds are this process and its children). "
      f"Total run: {minutes:.1f} min.", "",
      f"CPU per client update, {args.clients} clients per round, median of {args.rounds} "
      "rounds after one warm-up round; the paths alternate rounds on the same clients. "
      "Plain TF is the limit (one compiled step per batch on one model, no DP). The compiled "
      f"engine runs TFF's client update and the run's DP query ({dp}: clipping and "
      "noise included) on one model; TFF is a bare `build_unweighted_fed_avg`. Goals: compiled "
      f"≤ {TARGET_PLAIN}× plain TF, ≥ {TARGET_TFF:g}× faster than TFF, and with DP ≤ "
      f"{TARGET_DP}× without, on the main job's model.", ""] + _main_table(results)
  if args.baseline_engine:
    lines += ["", f"The baseline engine (`{args.baseline_engine}`) in the same rounds:", ""]
    lines += _baseline_table(results)
  if any(r.get("pfl") for r in results):
    version = next(r["pfl"]["versions"] for r in results if r.get("pfl"))
    lines += ["", f"pfl ({version}; `benchmarks/peer_pfl.py`, run by this script right after "
              "the rounds above, same sizes and clients):", ""] + _pfl_table(results)
  lines += ["", f"The mechanisms' noise, once per round (CPU ms of the query's "
            f"`get_noised_result` at n = {NOISE_ROUNDS}, median of {args.noise_repeats}), "
            f"beside the clients' work of a round ({args.clients} clients on the compiled "
            "engine):", "",
            "| model | clients' work ms | " + " | ".join(args.noise_mechanisms) + " |",
            "|---|---|" + "---|" * len(args.noise_mechanisms)]
  for r in results:
    work = r["per_client_cpu_s"]["compiled engine (none)"] * args.clients
    lines.append(f"| {r['model']} | {work * 1e3:.0f} | " + " | ".join(
        f"{r['noise_cpu_s'][m] * 1e3:.1f}" for m in args.noise_mechanisms) + " |")
  return "\n".join(lines) + "\n"


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--rounds", type=int, default=10, help="timed rounds per path")
  parser.add_argument("--clients", type=int, default=8, help="clients per round")
  parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
  parser.add_argument("--baseline-engine", default=None,
                      help="another training/engine.py, measured in the same rounds")
  parser.add_argument("--pfl-python", default=PFL_PYTHON if os.path.exists(PFL_PYTHON) else None,
                      help="an interpreter with pfl and torch: runs benchmarks/peer_pfl.py "
                      "(default: .venv-bench-pfl's, from make venv-bench-pfl, when it exists)")
  parser.add_argument("--one-model-json", default=None, help=argparse.SUPPRESS)
  common_arguments(parser, "a tiny model, 2 clients, one timed round, two mechanisms' noise")
  args = parser.parse_args(argv)
  if args.rounds < 1 or args.clients < 1:
    parser.error("--rounds and --clients must be at least 1")
  models = {name: MODELS[name] for name in args.models}
  args.noise_mechanisms, args.noise_repeats = NOISE_MECHANISMS, 5
  if args.smoke:
    args.rounds, args.clients, models = 1, 2, {"tiny (smoke)": SMOKE_MODEL}
    args.noise_mechanisms, args.noise_repeats = ("gaussian", *DP_MECHANISMS), 1
    if args.cache_dir is None:
      args.cache_dir = os.path.join(args.out_dir, "cache")
  load_start, start = os.getloadavg()[0], time.perf_counter()
  os.makedirs(args.out_dir, exist_ok=True)
  if args.one_model_json:  # the child of _measure_apart: one model, its figures to a file
    (name, model), = models.items()
    with open(args.one_model_json, "w", encoding="utf-8") as f:
      json.dump(_measure_here(name, model, args), f)
    return 0
  results = []
  for name, model in models.items():
    results.append(_measure_here(name, model, args) if args.smoke  # the tiny model
                   else _measure_apart(name, argv, args))
    with open(os.path.join(args.out_dir, "engine.json"), "w", encoding="utf-8") as f:
      json.dump(results, f, indent=1)  # so far
  text = section(args, results, load_start, os.getloadavg()[0],
                 (time.perf_counter() - start) / 60)
  write_section(args.out_dir, "engine", text)
  return 0


if __name__ == "__main__":
  sys.exit(main())
