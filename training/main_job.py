"""The README's main job (``make demo``): the √L table, then the tree vs optimal factorizations.

  python -m training.main_job --output_dir out/demo [--skip_training] [--total_rounds 50]

1. Factorizes n = 512 rounds for prefix sums and for momentum β = 0.95 with the
   identity, Honaker online / full, optimal and structured (h + r = ⌈log₂ n⌉)
   strategies through the library (``tff_mf.cache``, ``tff_mf.strategies``),
   writes a table of √L (Denisov, McMahan, Rush, Smith, Thakurta 2022,
   arXiv:2202.08312, Eq. 2) with the lower bound ‖A‖_*/√n, and the per-round
   variance and heatmap plots into ``--output_dir``. Everything goes through the
   factorization cache, so a second run only redraws the plots.
2. Trains the next-word-prediction LSTM (a small one) on the docstring dataset
   (``stackoverflow/pydocs.py``, no download) with three mechanisms at one
   (ε, δ): ``honaker_online`` (the DP-FTRL tree as a matrix mechanism),
   ``opt_prefix_sum`` and ``opt_momentum`` (Denisov et al. Sec 5, Fig 2/3),
   single pass, a few hundred rounds, server momentum β. Writes a table of ε,
   √L (for the momentum workload A = M(β)) and accuracies (``results.md``,
   ``results.json``) and ``accuracy.png`` into ``<output_dir>/training``.

Each mechanism is one ``training.loop`` run under ``<output_dir>/training/runs/``;
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

MAIN_JOB_MECHANISMS = ("honaker_online", "opt_prefix_sum", "opt_momentum")
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
DEMO_N = 512
DEMO_MOMENTUM = 0.95
DEMO_STRATEGIES = ("identity", "honaker_online", "honaker_full", "optimal", "structured")
PLOTTED_METRICS = ((HEADLINE, "validation accuracy (no OOV, no EOS)"),
                   ("accuracy", "validation accuracy (all tokens)"))


# ----------------------------------------------------------------------------- √L table


def _strategy_labels(n: int) -> Dict[str, str]:
  from tff_mf import registry  # pylint: disable=g-import-not-at-top
  bands, rank = registry.default_structure(n)
  labels = {s: registry.strategy(s).label for s in DEMO_STRATEGIES}
  labels["structured"] += f" (h={bands}, r={rank})"
  return labels


def _factorize_columns(n: int, cache_dir: Optional[str]):
  """{column: {strategy: √L}}, the cache records, and {column: √(lower bound)}."""
  from tff_mf import cache, registry, strategies, workloads  # pylint: disable=g-import-not-at-top
  from tff_mf import factorization as fz  # pylint: disable=g-import-not-at-top
  from tff_mf.commands import factorize as factorize_cmd  # pylint: disable=g-import-not-at-top
  bands, rank = registry.default_structure(n)
  columns = {
      "prefix sum": workloads.WorkloadSpec(kind="prefix_sum", n=n),
      f"momentum {DEMO_MOMENTUM:g}": workloads.WorkloadSpec(kind="momentum", n=n,
                                                            momentum=DEMO_MOMENTUM),
  }
  values: Dict[str, Dict[str, float]] = {column: {} for column in columns}
  records, lower_bounds = [], {}
  for column, workload in columns.items():
    for strategy in DEMO_STRATEGIES:
      structured = strategy == "structured"
      spec = strategies.FactorizationSpec(workload=workload, strategy=strategy,
                                          bands=bands if structured else 0,
                                          rank=rank if structured else 0)
      f, entry = cache.load_or_factorize(spec, cache_dir=cache_dir, progress=True)
      values[column][strategy] = f.sqrt_loss
      records.append(dict(factorize_cmd.result_record(f, entry), column=column))
    lower_bounds[column] = float(fz.lower_bound_nuclear(workload.build()) ** 0.5)
  return values, records, lower_bounds


def run_factorization_demo(output_dir: str, cache_dir: Optional[str] = None,
                           n: int = DEMO_N) -> str:
  """Writes ``sqrt_loss_table.md``, ``factorizations.json`` and PNGs; returns the table."""
  from tff_mf import plots  # pylint: disable=g-import-not-at-top
  from tff_mf.commands import plot as plot_cmd  # pylint: disable=g-import-not-at-top
  start = time.perf_counter()
  os.makedirs(output_dir, exist_ok=True)
  labels = _strategy_labels(n)
  values, records, lower_bounds = _factorize_columns(n, cache_dir)
  columns = list(values)
  lines = [f"√L = sqrt(γ(C)²·‖B‖²_F) for n = {n} (Denisov et al. Eq. 2; lower is better)", "",
           f"| strategy | √L {' | √L '.join(columns)} |", "|" + "---|" * (len(columns) + 1)]
  for strategy in DEMO_STRATEGIES:
    cells = " | ".join(f"{values[c][strategy]:.2f}" for c in columns)
    lines.append(f"| {labels[strategy]} | {cells} |")
  cells = " | ".join(f"{lower_bounds[c]:.2f}" for c in columns)
  lines.append(f"| lower bound ‖A‖_*/√n | {cells} |")
  table = "\n".join(lines)
  with open(os.path.join(output_dir, "sqrt_loss_table.md"), "w", encoding="utf-8") as f:
    f.write(table + "\n")
  png_paths = plot_cmd.make_plots(output_dir, n, momentum=DEMO_MOMENTUM, cache_dir=cache_dir)
  png_paths.append(plots.plot_sqrt_loss(
      {c: {labels[s]: values[c][s] for s in DEMO_STRATEGIES} for c in columns},
      os.path.join(output_dir, f"sqrt_loss_n{n}.png"), f"√L by strategy, n={n}",
      lower_bounds=lower_bounds))
  with open(os.path.join(output_dir, "factorizations.json"), "w", encoding="utf-8") as f:
    json.dump({"n": n, "factorizations": records, "lower_bound_sqrt": lower_bounds,
               "plots": png_paths, "wall_seconds": time.perf_counter() - start},
              f, indent=2, sort_keys=True)
  return table


# ----------------------------------------------------------------------------- training


def _read_curve(metrics_csv: str, metric: str = HEADLINE) -> List[tuple]:
  """(round, validation ``metric``) rows of a run's metrics.csv."""
  points = []
  with open(metrics_csv, newline="", encoding="utf-8") as f:
    for row in csv.DictReader(f):
      value = row.get(f"validation_{metric}", "")
      if value not in ("", None):
        points.append((int(row["round"]), float(value)))
  return points


def plot_curves(curves: Dict[str, Dict[str, List[tuple]]], path: str, title: str) -> None:
  """PNG: validation accuracy against rounds, one line per mechanism, one panel per metric.

  ``curves[metric][mechanism]`` = [(round, value)].
  """
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  from tff_mf import registry  # pylint: disable=g-import-not-at-top
  fig, axes = plt.subplots(1, len(PLOTTED_METRICS), figsize=(11, 4.2))
  for ax, (metric, label) in zip(axes, PLOTTED_METRICS):
    for name, points in curves.get(metric, {}).items():
      if points:
        xs, ys = zip(*points)
        ax.plot(xs, ys, marker="o", markersize=3, label=registry.label(name))
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
  from tff_mf import registry  # pylint: disable=g-import-not-at-top
  lines = ["| mechanism | label | ε | δ | noise multiplier z | √L | validation accuracy | "
           "test accuracy | test accuracy (all tokens) | test loss | rounds | wall s |",
           "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
  for r in rows:
    lines.append(
        f"| {r['mechanism']} | {registry.label(r['mechanism'])} | {fmt(r['epsilon'], '.3g')} | "
        f"{fmt(r['delta'], '.0e')} | "
        f"{fmt(r['noise_multiplier'], '.4g')} | {fmt(r['sqrt_loss'], '.4g')} | "
        f"{fmt(r['validation_accuracy'], '.4f')} | {fmt(r['test_accuracy'], '.4f')} | "
        f"{fmt(r['test_accuracy_all_tokens'], '.4f')} | "
        f"{fmt(r['test_loss'], '.4f')} | {r['rounds_completed']}/{r['total_rounds']} | "
        f"{r['wall_seconds']:.0f} |")
  return "\n".join(lines)


def _result_row(mechanism: str, summary: dict) -> dict:
  return dict(
      mechanism=mechanism, epsilon=summary["epsilon"], delta=summary["delta"],
      noise_multiplier=summary["noise_multiplier"], sqrt_loss=summary["sqrt_loss"],
      validation_accuracy=summary["validation_metrics"][HEADLINE],
      test_accuracy=summary["test_metrics"][HEADLINE],
      test_accuracy_all_tokens=summary["test_metrics"]["accuracy"],
      test_loss=summary["test_metrics"]["loss"], rounds_completed=summary["rounds_completed"],
      total_rounds=summary["total_rounds"], wall_seconds=summary["wall_seconds"],
      diverged=summary["diverged"])


def _write_results(output_dir: str, settings: dict, seed: int, rows: List[dict],
                   curves: dict, wall_seconds: float) -> str:
  """results.json, results.md and accuracy.png; returns the markdown table."""
  table = format_table(rows)
  eps = rows[0]["epsilon"] if rows else None
  title = (f"pydocs, {settings['total_rounds']} rounds x {settings['clients_per_round']} "
           f"clients, eps={eps:.3g}" if eps is not None else "pydocs")
  plot_curves(curves, os.path.join(output_dir, "accuracy.png"), title)
  with open(os.path.join(output_dir, "results.json"), "w", encoding="utf-8") as f:
    json.dump({"settings": settings, "seed": seed, "results": rows,
               "wall_seconds": wall_seconds}, f, indent=2, sort_keys=True)
  with open(os.path.join(output_dir, "results.md"), "w", encoding="utf-8") as f:
    f.write(f"# Main job: {title}\n\nAccuracy is next-word accuracy without OOV and EOS "
            "targets (Denisov et al. App I's headline metric); early in training a model that "
            "predicts the frequent EOS/OOV targets scores near 0 on it, so the all-token "
            "accuracy and the loss are shown too. √L is for the momentum workload.\n\n"
            f"{table}\n\n![validation accuracy](accuracy.png)\n")
  return table


def run_main_job(output_dir: str, cache_dir: Optional[str] = None, *,
                 data_dir: Optional[str] = None,
                 mechanisms: Sequence[str] = MAIN_JOB_MECHANISMS,
                 seed: int = 0, noise_seed: Optional[int] = None,
                 progress: bool = True, **overrides) -> int:
  """Trains each mechanism into ``output_dir``; returns a process exit code.

  Args:
    output_dir: where runs/, results.md, results.json and accuracy.png go.
    cache_dir: factorization cache (default ``tff_mf.cache.default_cache_dir()``).
    data_dir: docstring-dataset cache (default ``stackoverflow.pydocs.default_cache_dir()``).
    mechanisms: mechanism names (tff_mf.registry) to compare.
    seed: client sampling / model init seed (the same for every mechanism).
    noise_seed: pin the noise (default: OS entropy per run, kept in checkpoints).
    progress: a progress bar per run on stderr.
    **overrides: any other ``TrainingConfig`` field (e.g. total_rounds).
  """
  from training import config as config_lib  # pylint: disable=g-import-not-at-top
  from training import loop  # pylint: disable=g-import-not-at-top
  from training import task as task_lib  # pylint: disable=g-import-not-at-top
  settings = dict(MAIN_JOB_DEFAULTS, **overrides)
  os.makedirs(output_dir, exist_ok=True)
  start = time.perf_counter()
  task, rows, curves = None, [], {}
  for mechanism in mechanisms:
    config = config_lib.TrainingConfig(
        mechanism=mechanism, data_dir=data_dir, matrix_cache=cache_dir,
        root_output_dir=os.path.join(output_dir, "runs"), experiment_name=mechanism,
        seed=seed, noise_seed=noise_seed, progress=progress, **settings)
    try:
      config.validate()
      task = task or task_lib.build_task(config)
      print(f"== {mechanism}: {config.total_rounds} rounds x {config.clients_per_round} "
            f"clients, target eps {config.target_epsilon} ==", file=sys.stderr, flush=True)
      summary = loop.run_training(config, task=task)
    except ValueError as e:  # TrainingError, CheckError: one line
      print(f"error: {' '.join(str(e).split())}", file=sys.stderr)
      return 1
    rows.append(_result_row(mechanism, summary))
    for metric, _ in PLOTTED_METRICS:
      curves.setdefault(metric, {})[mechanism] = _read_curve(
          os.path.join(config.run_dir, "metrics.csv"), metric)
  table = _write_results(output_dir, settings, seed, rows, curves, time.perf_counter() - start)
  print(table)
  print(f"plot: {os.path.join(output_dir, 'accuracy.png')}  "
        f"({time.perf_counter() - start:.0f} s)")
  return 2 if any(r["diverged"] for r in rows) else 0


# ----------------------------------------------------------------------------- entry point


def build_parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(
      prog="python -m training.main_job",
      description="The main job: the √L table and plots of every strategy for n rounds, then "
                  "DP training on the docstring dataset with three mechanisms at equal ε.",
      formatter_class=argparse.ArgumentDefaultsHelpFormatter)
  parser.add_argument("--output_dir", default=os.path.join("out", "demo"),
                      help="table and plots here, training results under <output_dir>/training")
  parser.add_argument("--cache_dir", default=None,
                      help="factorization cache (None: $TFF_MF_CACHE or ~/.cache/tff_mf)")
  parser.add_argument("--data_dir", default=None,
                      help="docstring-dataset cache (None: $TFF_MF_CACHE/datasets/pydocs)")
  parser.add_argument("--n", type=int, default=DEMO_N, help="rounds n of the √L table")
  parser.add_argument("--skip_training", action="store_true",
                      help="only the factorization table and plots (no training run)")
  parser.add_argument("--total_rounds", type=int, default=MAIN_JOB_DEFAULTS["total_rounds"],
                      help="training rounds per mechanism")
  parser.add_argument("--clients_per_round", type=int,
                      default=MAIN_JOB_DEFAULTS["clients_per_round"], help="clients per round")
  parser.add_argument("--target_epsilon", type=float,
                      default=MAIN_JOB_DEFAULTS["target_epsilon"], help="ε of every run")
  parser.add_argument("--seed", type=int, default=0, help="client sampling and model init seed")
  return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
  args = build_parser().parse_args(argv)
  if args.n < 2:
    print(f"error: --n must be at least 2, got {args.n}", file=sys.stderr)
    return 1
  start = time.perf_counter()
  try:
    table = run_factorization_demo(args.output_dir, cache_dir=args.cache_dir, n=args.n)
  except ValueError as e:
    print(f"error: {' '.join(str(e).split())}", file=sys.stderr)
    return 1
  print(table)
  print(f"\nwrote table, JSON and plots to {os.path.abspath(args.output_dir)} "
        f"in {time.perf_counter() - start:.1f} s", flush=True)
  if args.skip_training:
    return 0
  print("\nTraining on the docstring dataset: tree (Honaker online) vs optimal matrix "
        "factorizations at equal ε", flush=True)
  return run_main_job(os.path.join(args.output_dir, "training"), cache_dir=args.cache_dir,
                      data_dir=args.data_dir, seed=args.seed, total_rounds=args.total_rounds,
                      clients_per_round=args.clients_per_round,
                      target_epsilon=args.target_epsilon)


if __name__ == "__main__":
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  sys.exit(main())
