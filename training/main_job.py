"""The README's main job: tree vs optimal matrix factorizations at the same ε.

Trains the next-word-prediction LSTM (a small one, via the model-size flags)
on the docstring dataset (``stackoverflow/pydocs.py``, no download) with three
mechanisms at one (ε, δ) — ``tree`` (Honaker online, DP-FTRL),
``opt_prefix_sum`` and ``opt_momentum`` (Denisov et al. Sec 5, Fig 2/3;
``001_…``) — single pass, a few hundred rounds, server momentum β. Prints a
table of ε, √L (Denisov Eq. 2, for the momentum workload A = M(β)) and
accuracies, writes ``results.md``, ``results.json`` and ``accuracy.png``
(validation accuracy against rounds) into ``output_dir``.

Each mechanism is one ``training.train_lib`` run under ``output_dir/runs/``;
rerunning resumes from the checkpoints, so an interrupted job continues.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys
import time
from typing import Dict, List, Optional, Sequence

MAIN_JOB_MECHANISMS = ("tree", "opt_prefix_sum", "opt_momentum")
# Small model and schedule sized for < 15 minutes on 2 CPU cores (all three runs).
MAIN_JOB_DEFAULTS = dict(
    dataset="pydocs",
    total_rounds=200,
    clients_per_round=4,
    target_epsilon=16.0,
    delta=1e-6,
    clip_norm=1.0,
    client_lr=0.5,
    server_lr=0.25,
    server_momentum=0.9,
    vocab_size=1000,
    embedding_size=16,
    lstm_size=32,
    projection_size=16,
    rounds_per_eval=25,
    rounds_per_checkpoint=50,
    max_validation_elements=1000,
    max_test_elements=2000,
)
HEADLINE = "accuracy_no_oov_no_eos"


def _read_curve(metrics_csv: str, metric: str = HEADLINE) -> List[tuple]:
  """(round, validation ``metric``) rows of a run's metrics.csv."""
  points = []
  with open(metrics_csv, newline="") as f:
    for row in csv.DictReader(f):
      value = row.get(f"validation_{metric}", "")
      if value not in ("", None):
        points.append((int(row["round"]), float(value)))
  return points


PLOTTED_METRICS = ((HEADLINE, "validation accuracy (no OOV, no EOS)"),
                   ("accuracy", "validation accuracy (all tokens)"))


def plot_curves(curves: Dict[str, Dict[str, List[tuple]]], path: str, title: str) -> None:
  """PNG: validation accuracy against rounds, one line per mechanism, one panel per metric.

  ``curves[metric][mechanism]`` = [(round, value)].
  """
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  fig, axes = plt.subplots(1, len(PLOTTED_METRICS), figsize=(11, 4.2))
  for ax, (metric, label) in zip(axes, PLOTTED_METRICS):
    for name, points in curves.get(metric, {}).items():
      if points:
        xs, ys = zip(*points)
        ax.plot(xs, ys, marker="o", markersize=3, label=name)
    ax.set_xlabel("round")
    ax.set_ylabel(label)
    ax.grid(alpha=0.3)
    ax.legend()
  fig.suptitle(title)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def format_table(rows: Sequence[dict]) -> str:
  """Markdown table of the per-mechanism results."""
  def fmt(value, spec):
    return "—" if value is None else format(value, spec)
  lines = ["| mechanism | ε | δ | noise multiplier z | √L | validation accuracy | "
           "test accuracy | test accuracy (all tokens) | test loss | rounds | wall s |",
           "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
  for r in rows:
    lines.append(
        f"| {r['mechanism']} | {fmt(r['epsilon'], '.3g')} | {fmt(r['delta'], '.0e')} | "
        f"{fmt(r['noise_multiplier'], '.4g')} | {fmt(r['sqrt_loss'], '.4g')} | "
        f"{fmt(r['validation_accuracy'], '.4f')} | {fmt(r['test_accuracy'], '.4f')} | "
        f"{fmt(r['test_accuracy_all_tokens'], '.4f')} | "
        f"{fmt(r['test_loss'], '.4f')} | {r['rounds_completed']}/{r['total_rounds']} | "
        f"{r['wall_seconds']:.0f} |")
  return "\n".join(lines)


def run_main_job(output_dir: str, cache_dir: Optional[str] = None, *,
                 data_dir: Optional[str] = None,
                 mechanisms: Sequence[str] = MAIN_JOB_MECHANISMS,
                 seed: int = 0, noise_seed: Optional[int] = None,
                 progress: bool = True, **overrides) -> int:
  """Runs the main job into ``output_dir``; returns a process exit code.

  Args:
    output_dir: where runs/, results.md, results.json and accuracy.png go.
    cache_dir: factorization cache (default ``tff_mf.cache.default_cache_dir()``).
    data_dir: docstring-dataset cache (default ``stackoverflow.pydocs.default_cache_dir()``).
    mechanisms: mechanism flag values to compare.
    seed: client sampling / model init seed (the same for every mechanism).
    noise_seed: pin the noise (default: OS entropy per run, kept in checkpoints).
    progress: per-round progress lines on stderr.
    **overrides: any other ``TrainingConfig`` field (e.g. total_rounds).
  """
  from training import train_lib  # pylint: disable=g-import-not-at-top
  settings = dict(MAIN_JOB_DEFAULTS)
  settings.update(overrides)
  os.makedirs(output_dir, exist_ok=True)
  start = time.perf_counter()
  log = lambda msg: print(msg, file=sys.stderr, flush=True)  # pylint: disable=unnecessary-lambda-assignment
  task = None
  rows, curves = [], {}
  for mechanism in mechanisms:
    config = train_lib.TrainingConfig(
        mechanism=mechanism, data_dir=data_dir, matrix_cache=cache_dir,
        root_output_dir=os.path.join(output_dir, "runs"), experiment_name=mechanism,
        seed=seed, noise_seed=noise_seed, progress=progress, **settings)
    try:
      config.validate()
      if task is None:
        task = train_lib.build_task(config)
      log(f"== {mechanism}: {config.total_rounds} rounds x {config.clients_per_round} clients, "
          f"target eps {config.target_epsilon} ==")
      summary = train_lib.run_training(config, task=task, log=log)
    except train_lib.TrainingError as e:
      print(f"error: {e}", file=sys.stderr)
      return 1
    rows.append(dict(
        mechanism=mechanism, epsilon=summary["epsilon"], delta=summary["delta"],
        noise_multiplier=summary["noise_multiplier"], sqrt_loss=summary["sqrt_loss"],
        validation_accuracy=summary["validation_metrics"][HEADLINE],
        test_accuracy=summary["test_metrics"][HEADLINE],
        test_accuracy_all_tokens=summary["test_metrics"]["accuracy"],
        test_loss=summary["test_metrics"]["loss"], rounds_completed=summary["rounds_completed"],
        total_rounds=summary["total_rounds"], wall_seconds=summary["wall_seconds"],
        diverged=summary["diverged"]))
    for metric, _ in PLOTTED_METRICS:
      curves.setdefault(metric, {})[mechanism] = _read_curve(
          os.path.join(config.root_output_dir, mechanism, train_lib.METRICS_FILE), metric)
  table = format_table(rows)
  eps = rows[0]["epsilon"] if rows else None
  title = (f"pydocs, {settings['total_rounds']} rounds x {settings['clients_per_round']} "
           f"clients, eps={eps:.3g}" if eps is not None else "pydocs")
  plot_path = os.path.join(output_dir, "accuracy.png")
  plot_curves(curves, plot_path, title)
  with open(os.path.join(output_dir, "results.json"), "w") as f:
    json.dump({"settings": settings, "seed": seed, "results": rows,
               "wall_seconds": time.perf_counter() - start}, f, indent=2, sort_keys=True)
  with open(os.path.join(output_dir, "results.md"), "w") as f:
    f.write(f"# Main job: {title}\n\nAccuracy is next-word accuracy without OOV and EOS "
            "targets (Denisov et al. App I's headline metric); early in training a model that "
            "predicts the frequent EOS/OOV targets scores near 0 on it, so the all-token "
            "accuracy and the loss are shown too. √L is for the momentum workload.\n\n"
            f"{table}\n\n![validation accuracy](accuracy.png)\n")
  print(table)
  print(f"plot: {plot_path}  ({time.perf_counter() - start:.0f} s)")
  return 2 if any(r["diverged"] for r in rows) else 0


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--output_dir", default="out/main_job")
  parser.add_argument("--cache_dir", default=None, help="factorization cache")
  parser.add_argument("--data_dir", default=None, help="docstring-dataset cache")
  parser.add_argument("--total_rounds", type=int, default=MAIN_JOB_DEFAULTS["total_rounds"])
  parser.add_argument("--clients_per_round", type=int,
                      default=MAIN_JOB_DEFAULTS["clients_per_round"])
  parser.add_argument("--target_epsilon", type=float,
                      default=MAIN_JOB_DEFAULTS["target_epsilon"])
  parser.add_argument("--seed", type=int, default=0)
  args = parser.parse_args(argv)
  return run_main_job(args.output_dir, args.cache_dir, data_dir=args.data_dir, seed=args.seed,
                      total_rounds=args.total_rounds, clients_per_round=args.clients_per_round,
                      target_epsilon=args.target_epsilon)


if __name__ == "__main__":
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  sys.exit(main())
