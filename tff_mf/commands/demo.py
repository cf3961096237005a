"""``tff-mf demo``: the README's main job.

1. Factorizes n = 512 rounds for prefix sums and for momentum β = 0.95, prints a
   table of √L for identity, Honaker online / full, optimal and structured
   (h + r = log₂ n, Denisov App H), and writes the plots of ``tff-mf plot``.
   Everything goes through the cache, so a second run only redraws the plots.
2. Trains next-word prediction on the docstring dataset (no download) with the
   tree, optimal prefix-sum and optimal momentum mechanisms at the same ε
   (``training.main_job``), printing ε, √L and accuracy per mechanism and
   writing a plot of accuracy against rounds. ``--skip-training`` stops after 1.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Optional

DEMO_MOMENTUM = 0.95
DEMO_STRATEGIES = ("identity", "honaker_online", "honaker_full", "optimal", "structured")


def run_factorization_demo(output_dir: str, cache_dir: Optional[str] = None, n: int = 512) -> str:
  """Factorizes, writes ``sqrt_loss_table.md``, ``factorizations.json`` and PNGs; returns the table."""
  from tff_mf import cache, plots, strategies, workloads  # pylint: disable=g-import-not-at-top
  from tff_mf import factorization as fz  # pylint: disable=g-import-not-at-top
  from tff_mf.commands import factorize as factorize_cmd  # pylint: disable=g-import-not-at-top
  from tff_mf.commands import plot as plot_cmd  # pylint: disable=g-import-not-at-top
  start = time.perf_counter()
  os.makedirs(output_dir, exist_ok=True)
  bands, rank = factorize_cmd.default_structured_shape(n)
  columns = {
      "prefix sum": workloads.WorkloadSpec(kind="prefix_sum", n=n),
      f"momentum {DEMO_MOMENTUM:g}": workloads.WorkloadSpec(kind="momentum", n=n,
                                                            momentum=DEMO_MOMENTUM),
  }
  labels = {"identity": "identity", "honaker_online": "Honaker online (tree)",
            "honaker_full": "Honaker full", "optimal": "optimal",
            "structured": f"structured (h={bands}, r={rank})"}
  values = {column: {} for column in columns}
  records = []
  lower_bounds = {}
  for column, workload in columns.items():
    for strategy in DEMO_STRATEGIES:
      spec = strategies.FactorizationSpec(
          workload=workload, strategy=strategy,
          bands=bands if strategy == "structured" else 0,
          rank=rank if strategy == "structured" else 0)
      f, entry = cache.load_or_factorize(spec, cache_dir=cache_dir, progress=True)
      values[column][strategy] = f.sqrt_loss
      record = factorize_cmd.result_record(f, entry)
      record["column"] = column
      records.append(record)
    lower_bounds[column] = float(fz.lower_bound_nuclear(workload.build()) ** 0.5)
  header = f"| strategy | √L {' | √L '.join(columns)} |"
  lines = [f"√L = sqrt(γ(C)²·‖B‖²_F) for n = {n} (Denisov Eq. 2; lower is better)", "",
           header, "|" + "---|" * (len(columns) + 1)]
  for strategy in DEMO_STRATEGIES:
    cells = " | ".join(f"{values[c][strategy]:.2f}" for c in columns)
    lines.append(f"| {labels[strategy]} | {cells} |")
  cells = " | ".join(f"{lower_bounds[c]:.2f}" for c in columns)
  lines.append(f"| lower bound ‖A‖_*/√n | {cells} |")
  table = "\n".join(lines)
  with open(os.path.join(output_dir, "sqrt_loss_table.md"), "w", encoding="utf-8") as f:
    f.write(table + "\n")
  png_paths = plot_cmd.make_plots(output_dir, n, momentum=DEMO_MOMENTUM, cache_dir=cache_dir)
  png_paths.append(plots.plot_sqrt_loss_bars(
      {c: {labels[s]: values[c][s] for s in DEMO_STRATEGIES} for c in columns},
      os.path.join(output_dir, f"sqrt_loss_n{n}.png"), f"√L by strategy, n={n}"))
  with open(os.path.join(output_dir, "factorizations.json"), "w", encoding="utf-8") as f:
    json.dump({"n": n, "factorizations": records, "lower_bound_sqrt": lower_bounds,
               "plots": png_paths, "wall_seconds": time.perf_counter() - start},
              f, indent=2, sort_keys=True)
  return table


def register(subparsers) -> None:
  parser = subparsers.add_parser(
      "demo", help="the main job: factorization table and plots, then DP training on the docstring dataset",
      description="Factorizes n rounds for prefix sums and momentum 0.95 with every strategy, "
                  "then trains on the docstring dataset with three mechanisms at equal epsilon; "
                  "prints a table of √L and writes plots into --output-dir.")
  parser.add_argument("--output-dir", default=os.path.join("out", "demo"))
  parser.add_argument("--cache-dir", default=None, help="cache directory (overrides $TFF_MF_CACHE)")
  parser.add_argument("--n", type=int, default=512, help="number of rounds n (default 512)")
  parser.add_argument("--skip-training", action="store_true",
                      help="only the factorization table and plots (no training run)")
  parser.add_argument("--data-dir", default=None, help="docstring-dataset cache directory")
  parser.add_argument("--total-rounds", type=int, default=None,
                      help="training rounds per mechanism (default: training.main_job's)")
  parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
  if args.n < 2:
    raise ValueError(f"--n must be at least 2, got {args.n}")
  start = time.perf_counter()
  table = run_factorization_demo(args.output_dir, cache_dir=args.cache_dir, n=args.n)
  print(table)
  print(f"\nwrote table, JSON and plots to {os.path.abspath(args.output_dir)} "
        f"in {time.perf_counter() - start:.1f} s", flush=True)
  if args.skip_training:
    return 0
  from training import main_job  # pylint: disable=g-import-not-at-top
  overrides = {} if args.total_rounds is None else {"total_rounds": args.total_rounds}
  print("\nTraining on the docstring dataset: tree vs optimal matrix factorizations at equal ε",
        flush=True)
  return main_job.run_main_job(os.path.join(args.output_dir, "training"),
                               cache_dir=args.cache_dir, data_dir=args.data_dir, **overrides)
