"""Tree vs optimal matrix factorizations at equal ε on the docstring dataset, several seeds.

Runs the main job (``training.main_job.run_main_job``: honaker_online, opt_prefix_sum,
opt_momentum at one (ε, δ), single pass, server momentum) once per seed — the
seed sets client order and model init, noise seeds come from OS entropy — and
writes a markdown section to ``benchmarks/results/training.md`` with the
per-seed and mean ± std test accuracy (no OOV/EOS, Denisov et al. App I), and
``benchmarks/results/training_pydocs.png`` (mean validation accuracy against
rounds). The tree is the baseline measured in the same run (Denisov Sec 5,
Fig 2: optimal MF should beat it at equal ε).

  nice .venv/bin/python benchmarks/training_pydocs.py --seeds 0 1 2 --out out/bench_training
  .venv/bin/python benchmarks/training_pydocs.py --smoke --out /tmp/x \
      --results_md /tmp/x/training.md   # synthetic data, 2 rounds, one seed (a minute)

The section's command states every setting it ran with (rounds, clients, ε), so it
reproduces the section whatever the main job's defaults are.

Seeds whose ``<out>/seed<k>/results.json`` already exists with the same
settings are reused (the runs also resume from checkpoints).
"""

import argparse
import json
import os
import platform
import sys
import time

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

MACHINE = "2-core x86_64 CPU, 24 GB, no GPU"


def run_seed(out_dir, seed, cache_dir, data_dir, settings):
  from training import main_job  # pylint: disable=g-import-not-at-top
  path = os.path.join(out_dir, f"seed{seed}")
  results_path = os.path.join(path, "results.json")
  if os.path.exists(results_path):
    with open(results_path) as f:
      previous = json.load(f)
    merged = dict(main_job.MAIN_JOB_DEFAULTS, **settings)
    if previous.get("settings") == merged and previous.get("seed") == seed:
      return previous
  code = main_job.run_main_job(path, cache_dir, data_dir=data_dir, seed=seed, **settings)
  if code not in (0, 2):
    raise SystemExit(f"main job for seed {seed} failed with exit code {code}")
  with open(results_path) as f:
    return json.load(f)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
  parser.add_argument("--out", default="out/bench_training")
  parser.add_argument("--cache_dir", default=None)
  parser.add_argument("--data_dir", default=None)
  parser.add_argument("--total_rounds", type=int, default=None)
  parser.add_argument("--clients_per_round", type=int, default=None)
  parser.add_argument("--target_epsilon", type=float, default=None)
  parser.add_argument("--results_md", default=os.path.join(REPO, "benchmarks", "results",
                                                           "training.md"))
  parser.add_argument("--smoke", action="store_true",
                      help="synthetic data, 2 rounds x 2 clients, seed 0 only: checks that the "
                      "script runs")
  args = parser.parse_args(argv)
  from training import main_job  # pylint: disable=g-import-not-at-top
  settings = {k: v if v is not None else main_job.MAIN_JOB_DEFAULTS[k]
              for k, v in (("total_rounds", args.total_rounds),
                           ("clients_per_round", args.clients_per_round),
                           ("target_epsilon", args.target_epsilon))}
  if args.smoke:
    args.seeds = [0]
    settings.update(total_rounds=2, clients_per_round=2, dataset="synthetic", vocab_size=100,
                    rounds_per_eval=1, rounds_per_checkpoint=1, max_validation_elements=32,
                    max_test_elements=32)
  start = time.perf_counter()
  per_seed = {s: run_seed(args.out, s, args.cache_dir, args.data_dir, settings)
              for s in args.seeds}
  mechanisms = [r["mechanism"] for r in per_seed[args.seeds[0]]["results"]]
  merged = dict(main_job.MAIN_JOB_DEFAULTS, **settings)

  metric_names = {"accuracy_no_oov_no_eos": "test accuracy, no OOV/EOS (headline)",
                  "accuracy": "test accuracy, all tokens", "loss": "test loss"}
  table = {m: {"eps": None, "z": None, "sqrt_loss": None, "wall": [],
               **{k: [] for k in metric_names}} for m in mechanisms}
  for seed in args.seeds:
    for r in per_seed[seed]["results"]:
      m = r["mechanism"]
      with open(os.path.join(args.out, f"seed{seed}", "runs", m, "summary.json")) as f:
        summary = json.load(f)
      t = table[m]
      for k in metric_names:
        t[k].append(summary["test_metrics"][k])
      t["eps"], t["z"], t["sqrt_loss"] = r["epsilon"], r["noise_multiplier"], r["sqrt_loss"]
      t["wall"].append(r["wall_seconds"])

  def mean_std(values):
    values = np.array([np.nan if v is None else v for v in values], dtype=float)
    return float(np.nanmean(values)), float(np.nanstd(values, ddof=1)) if len(values) > 1 else 0.0

  lines = [
      "## Training: tree vs optimal matrix factorization at equal ε (docstring dataset)",
      "",
      f"Command: `nice .venv/bin/python benchmarks/training_pydocs.py "
      + ("--smoke" if args.smoke else f"--seeds {' '.join(map(str, args.seeds))}"
         + "".join(f" --{k} {v:g}" for k, v in settings.items()))
      + "`  ",
      f"Machine: {MACHINE} (shared with other jobs while it ran; wall times are indicative).  ",
      f"Setup: {merged['dataset']} (pydocs: docstrings of the installed packages), vocabulary "
      f"{merged['vocab_size']}, "
      f"LSTM {merged['embedding_size']}/{merged['lstm_size']}/{merged['projection_size']}, "
      f"{merged['total_rounds']} single-pass rounds × {merged['clients_per_round']} clients, "
      f"clip ζ = {merged['clip_norm']}, client lr {merged['client_lr']}, server lr "
      f"{merged['server_lr']}, server momentum β = {merged['server_momentum']}, "
      f"δ = {merged['delta']:g}. Seed = client order and model init; noise seeds from OS entropy.",
      "",
      "√L is for the momentum workload A = M(β) (Denisov Eq. 2, γ(C) = 1). Metrics on "
      f"{merged['max_test_elements']} test sentences; mean ± std over seeds, then the per-seed "
      "values.",
      "",
      "| mechanism | ε | z | √L | " + " | ".join(metric_names.values()) + " | wall s / run |",
      "| --- | --- | --- | --- | " + " | ".join("---" for _ in metric_names) + " | --- |",
  ]
  for m in mechanisms:
    t = table[m]
    cells = []
    for k in metric_names:
      mean, std = mean_std(t[k])
      per = ", ".join("—" if v is None else f"{v:.4f}" for v in t[k])
      cells.append(f"{mean:.4f} ± {std:.4f} ({per})")
    lines.append(f"| {m} | {t['eps']:.3g} | {t['z']:.4g} | {t['sqrt_loss']:.4g} | "
                 + " | ".join(cells) + f" | {np.mean(t['wall']):.0f} |")
  verdicts = []
  baseline = "honaker_online"  # the main job's tree (DP-FTRL, the Honaker online matrix form)
  if baseline in table:
    for m in mechanisms:
      if m == baseline:
        continue
      for k, label in metric_names.items():
        mean, std = mean_std(table[m][k])
        tree_mean, tree_std = mean_std(table[baseline][k])
        better = (lambda a, b: a < b) if k == "loss" else (lambda a, b: a > b)
        diff = mean - tree_mean
        se = float(np.sqrt((std ** 2 + tree_std ** 2) / len(args.seeds)))
        wins = sum(1 for a, b in zip(table[m][k], table[baseline][k])
                   if a is not None and b is not None and better(a, b))
        if abs(diff) <= 2 * se:
          verdict = "not distinguishable from the tree"
        else:
          verdict = "better than the tree" if better(mean, tree_mean) else "worse than the tree"
        verdicts.append(f"- {m}, {label}: **{verdict}** ({mean:.4f} vs {tree_mean:.4f}, "
                        f"difference {diff:+.4f}, 2·SE = {2 * se:.4f}; better for {wins} of "
                        f"{len(args.seeds)} seeds).")
  lines += ["", *verdicts, "", "![mean validation accuracy (headline and all tokens)](training_pydocs.png)", ""]

  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  fig, axes = plt.subplots(1, len(main_job.PLOTTED_METRICS), figsize=(11, 4.2))
  for ax, (metric, label) in zip(axes, main_job.PLOTTED_METRICS):
    for m in mechanisms:
      curves = [dict(main_job._read_curve(  # pylint: disable=protected-access
          os.path.join(args.out, f"seed{s}", "runs", m, "metrics.csv"), metric))
                for s in args.seeds]
      rounds = sorted(set.intersection(*[set(c) for c in curves]))
      values = np.array([[c[r] for r in rounds] for c in curves])
      ax.plot(rounds, values.mean(axis=0), marker="o", markersize=3, label=m)
      ax.fill_between(rounds, values.min(axis=0), values.max(axis=0), alpha=0.2)
    ax.set_xlabel("round")
    ax.set_ylabel(label)
    ax.grid(alpha=0.3)
    ax.legend()
  fig.suptitle(f"pydocs, ε={table[mechanisms[0]]['eps']:.3g}, {len(args.seeds)} seeds "
               "(mean; band = min..max)")
  fig.tight_layout()
  os.makedirs(os.path.dirname(os.path.abspath(args.results_md)), exist_ok=True)
  png = os.path.join(os.path.dirname(args.results_md), "training_pydocs.png")
  fig.savefig(png, dpi=120)
  plt.close(fig)

  text = "\n".join(lines)
  os.makedirs(os.path.dirname(args.results_md), exist_ok=True)
  with open(args.results_md, "w") as f:
    f.write(text)
  print(text)
  print(f"({time.perf_counter() - start:.0f} s, python {platform.python_version()})")


if __name__ == "__main__":
  main()
