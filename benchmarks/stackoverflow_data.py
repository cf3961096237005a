"""Benchmark of the stackoverflow/ package: pydocs build, preprocessing, model.

Measures, in one run on this machine:
  1. the pydocs dataset build (cold cache) against reopening it (cache hit);
  2. preprocessing throughput of `stackoverflow.preprocessing` against TFF's
     StackOverflow baseline preprocessing (same batches; its shuffle off);
  3. one client training step (batch 16 x 20 tokens) of the papers' 4.05M
     model (Denisov et al. 2022, App I) against the small default model;
  4. building the main job's model with Keras' LSTM against the CPU path of
     `stackoverflow.model` (the same cell in Keras' RNN wrapper).
Writes benchmarks/results/stackoverflow_data.md and .png.

  .venv/bin/python benchmarks/stackoverflow_data.py
  .venv/bin/python benchmarks/stackoverflow_data.py --smoke --out-dir /tmp/x  # seconds
"""

import argparse
import os
import platform
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import matplotlib  # pylint: disable=g-import-not-at-top
matplotlib.use("Agg")
import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
import numpy as np  # pylint: disable=g-import-not-at-top

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def _median_seconds(fn, repeats):
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    fn()
    times.append(time.perf_counter() - start)
  return float(np.median(times))


def bench_pydocs(cache_dir, options):
  from stackoverflow import pydocs  # pylint: disable=g-import-not-at-top
  start = time.perf_counter()
  built = pydocs.build(cache_dir, progress=True, **options)
  cold = time.perf_counter() - start
  hit = _median_seconds(lambda: pydocs.build(cache_dir, progress=False, **options), 3)
  return built, cold, hit


def bench_preprocessing(cache_dir, options, num_clients=300):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from tensorflow_federated.python.simulation.baselines import client_spec  # pylint: disable=g-import-not-at-top
  from tensorflow_federated.python.simulation.baselines.stackoverflow import word_prediction_preprocessing as tff_pre  # pylint: disable=g-import-not-at-top
  from stackoverflow import pydocs  # pylint: disable=g-import-not-at-top
  from stackoverflow import preprocessing  # pylint: disable=g-import-not-at-top
  loaded = pydocs.load(cache_dir, progress=False, **options)
  vocab = loaded.vocab[:10000]
  sentences = []
  for client in loaded.train.client_ids[:num_clients]:
    sentences.extend(e["tokens"].numpy()
                     for e in loaded.train.create_tf_dataset_for_client(client))
  dataset = tf.data.Dataset.from_tensor_slices({"tokens": sentences}).cache()
  list(dataset)
  ours = preprocessing.build_preprocess_fn(vocab, max_elements_per_client=None)
  spec = client_spec.ClientSpec(num_epochs=1, batch_size=16,
                                shuffle_buffer_size=1)
  theirs = tff_pre.create_preprocess_fn(spec, vocab, sequence_length=20)
  for (x, y), (tx, ty) in zip(ours(dataset), theirs(dataset)):
    assert np.array_equal(x.numpy(), tx.numpy())
    assert np.array_equal(y.numpy(), ty.numpy())

  def consume(fn):
    for _ in fn(dataset):
      pass

  t_ours = _median_seconds(lambda: consume(ours), 3)
  t_theirs = _median_seconds(lambda: consume(theirs), 3)
  return len(sentences), t_ours, t_theirs


def bench_model_step(models, repeats):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from stackoverflow import metrics  # pylint: disable=g-import-not-at-top
  from stackoverflow import model  # pylint: disable=g-import-not-at-top
  results = {}
  for name, kwargs in models:
    keras_model = model.create_keras_model(seed=1, **kwargs)
    loss_fn = metrics.MaskedSparseCategoricalCrossentropy()
    optimizer = tf.keras.optimizers.SGD(0.1)
    x = tf.random.stateless_uniform([16, 20], [1, 2], minval=1, maxval=10004,
                                    dtype=tf.int64)

    @tf.function
    def step(x=x, keras_model=keras_model, loss_fn=loss_fn,
             optimizer=optimizer):
      with tf.GradientTape() as tape:
        loss = loss_fn(x, keras_model(x, training=True))
      grads = tape.gradient(loss, keras_model.trainable_variables)
      optimizer.apply_gradients(zip(grads, keras_model.trainable_variables))
      return loss

    step()
    seconds = _median_seconds(step, repeats)
    results[name] = (keras_model.count_params(), seconds)
  return results


def bench_model_build(kwargs, repeats):
  """Keras' LSTM (with its cuDNN variant for backend selection) against the same cell in
  the RNN wrapper (what `create_keras_model` builds without a GPU): the median seconds to
  build the model and to trace and run one SGD step, and whether outputs and gradients are
  identical (same seed)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from stackoverflow import model  # pylint: disable=g-import-not-at-top
  x = tf.random.stateless_uniform([16, 20], [1, 2], minval=1, maxval=1000, dtype=tf.int64)
  out, values = {}, {}
  for name, keras_lstm in (("Keras LSTM (cuDNN variant traced)", True),
                           ("RNN(LSTMCell), the CPU path", False)):
    build = _median_seconds(lambda k=keras_lstm: model.create_keras_model(
        seed=1, keras_lstm=k, **kwargs), repeats)
    traces = []
    for _ in range(repeats):
      keras_model = model.create_keras_model(seed=1, keras_lstm=keras_lstm, **kwargs)

      @tf.function
      def step(keras_model=keras_model):
        with tf.GradientTape() as tape:
          logits = keras_model(x, training=True)
          loss = tf.reduce_sum(tf.square(logits))
        grads = tape.gradient(loss, keras_model.trainable_variables)
        return logits, [tf.convert_to_tensor(g) for g in grads]

      start = time.perf_counter()
      values[name] = step()
      traces.append(time.perf_counter() - start)
    out[name] = (build, float(np.median(traces)))
  first, second = values.values()
  identical = bool(np.array_equal(first[0].numpy(), second[0].numpy()) and all(
      np.array_equal(a.numpy(), b.numpy()) for a, b in zip(first[1], second[1])))
  return out, identical


MODELS = (("papers (96/670/96, V=10,000)", {}),
          ("small (32/128/32, V=10,000)",
           dict(embedding_size=32, lstm_size=128, projection_size=32)))


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--smoke", action="store_true",
                      help="one small package, 20 clients, two tiny models (seconds)")
  parser.add_argument("--out-dir", default=RESULTS)
  args = parser.parse_args(argv)
  if args.smoke:
    options, num_clients, repeats = dict(distributions=["absl-py"], include_stdlib=False), 20, 2
    models = (("tiny (8/16/8, V=10,000)", dict(embedding_size=8, lstm_size=16,
                                               projection_size=8)),
              ("tiny (4/8/4, V=10,000)", dict(embedding_size=4, lstm_size=8,
                                              projection_size=4)))
  else:
    options, num_clients, repeats, models = {}, 300, 20, MODELS
  load_before = os.getloadavg()[0]
  with tempfile.TemporaryDirectory() as cache_dir:
    built, cold, hit = bench_pydocs(cache_dir, options)
    num_sentences, t_ours, t_theirs = bench_preprocessing(cache_dir, options, num_clients)
    with open(built.word_count_path, encoding="utf-8") as f:
      vocab_words = sum(1 for _ in f)
  steps = bench_model_step(models, repeats)
  from training import main_job  # pylint: disable=g-import-not-at-top
  build_kwargs = {k: main_job.MAIN_JOB_DEFAULTS[k]
                  for k in ("vocab_size", "embedding_size", "lstm_size", "projection_size")}
  build_repeats = 3 if args.smoke else 5
  builds, identical = bench_model_build(build_kwargs, build_repeats)
  load_after = os.getloadavg()[0]
  meta = built.metadata
  lines = [
      "## stackoverflow/: pydocs dataset, preprocessing, model",
      "",
      "Command: `.venv/bin/python benchmarks/stackoverflow_data.py"
      + "".join(f" {a}" for a in (argv if argv is not None else sys.argv[1:]))
      + "` — machine: "
      "2-core x86_64 CPU, 24 GB, no GPU "
      f"({platform.machine()}, Python {platform.python_version()}); 1-minute "
      f"load average {load_before:.1f} before and {load_after:.1f} after"
      + (" (other jobs shared the 2 cores, so wall times are inflated)."
         if max(load_before, load_after) > 2.5 else "."),
      "",
      "### Docstring dataset (`stackoverflow.pydocs`, "
      + (f"options {options}" if options else "default options") + ")",
      "",
      "| source files parsed | clients (train / heldout / test) | sentences "
      "(train / heldout / test) | train vocabulary | cold build s | cache hit s"
      " | cold / hit |",
      "|---|---|---|---|---|---|---|",
      "| {} | {} / {} / {} | {} / {} / {} | {} words | {:.1f} | {:.2f} | "
      "{:.0f}x |".format(
          meta["stats"].get("files_parsed", 0),
          meta["splits"]["train"]["clients"],
          meta["splits"]["heldout"]["clients"],
          meta["splits"]["test"]["clients"],
          meta["splits"]["train"]["sentences"],
          meta["splits"]["heldout"]["sentences"],
          meta["splits"]["test"]["sentences"],
          vocab_words,
          cold, hit, cold / hit),
      "",
      f"Fingerprint `{meta['fingerprint'][:20]}` "
      f"({len(meta['source']['distributions'])} distributions"
      f"{' + stdlib' if meta['source'].get('stdlib', True) else ''}, "
      f"content sha256 `{meta['content_sha256'][:16]}`).",
      "",
      "### Preprocessing throughput (V = 10,000, L = 20, batch 16)",
      "",
      "| sentences | ours s | TFF baseline s | TFF / ours | batches identical |",
      "|---|---|---|---|---|",
      f"| {num_sentences} | {t_ours:.2f} | {t_theirs:.2f} | "
      f"{t_theirs / t_ours:.2f}x | yes |",
      "",
      f"### One client SGD step, batch 16 x 20 tokens (median of {repeats})",
      "",
      "| model | parameters | step ms | relative to the first row |",
      "|---|---|---|---|",
  ]
  paper_seconds = next(iter(steps.values()))[1]
  for name, (params, seconds) in steps.items():
    lines.append(f"| {name} | {params:,} | {1000 * seconds:.1f} | "
                 f"{seconds / paper_seconds:.2f} |")
  lines += ["", "### Model build: Keras' LSTM against the CPU path (the main job's model, "
            f"{build_kwargs['embedding_size']}/{build_kwargs['lstm_size']}/"
            f"{build_kwargs['projection_size']}, V = {build_kwargs['vocab_size']:,}; "
            f"median of {build_repeats})", "",
            "| LSTM layer | build s | trace + first SGD step s | build relative to Keras' |",
            "|---|---|---|---|"]
  keras_build = next(iter(builds.values()))[0]
  for name, (build, trace) in builds.items():
    lines.append(f"| {name} | {build:.2f} | {trace:.2f} | {build / keras_build:.2f} |")
  lines += ["", "Outputs and gradients of the two (same seed) "
            + ("are bit-identical." if identical else "DIFFER."), ""]
  os.makedirs(args.out_dir, exist_ok=True)
  with open(os.path.join(args.out_dir, "stackoverflow_data.md"), "w",
            encoding="utf-8") as f:
    f.write("\n".join(lines))
  fig, axes = plt.subplots(1, 4, figsize=(16, 3.5))
  axes[0].bar(["cold build", "cache hit"], [cold, hit], color=["C1", "C0"])
  axes[0].set_ylabel("seconds")
  axes[0].set_title("pydocs dataset")
  axes[1].bar(["ours", "TFF baseline"], [num_sentences / t_ours,
                                         num_sentences / t_theirs],
              color=["C0", "C2"])
  axes[1].set_ylabel("sentences / s")
  axes[1].set_title("preprocessing throughput")
  names = list(steps)
  axes[2].bar([n.split(" (")[0] for n in names],
              [1000 * steps[n][1] for n in names], color=["C3", "C0"])
  axes[2].set_ylabel("ms per step")
  axes[2].set_title("client step, batch 16x20")
  positions = np.arange(len(builds))
  for offset, (label, index, color) in enumerate((("build", 0, "C1"),
                                                   ("trace + first step", 1, "C0"))):
    axes[3].bar(positions + (offset - 0.5) * 0.4, [v[index] for v in builds.values()], 0.4,
                label=label, color=color)
  axes[3].set_xticks(positions, ["Keras LSTM", "RNN(LSTMCell)"])
  axes[3].set_ylabel("seconds")
  axes[3].set_title("model build (main job's model)")
  axes[3].legend()
  fig.tight_layout()
  fig.savefig(os.path.join(args.out_dir, "stackoverflow_data.png"), dpi=110)
  print("\n".join(lines))
  return 0


if __name__ == "__main__":
  sys.exit(main())
