"""Summaries of a sweep: hyperparameter selection, mean ± std over seeds, Fig 2/3 style plots.

Usage::

  python -m training.summarize --root_output_dir D [--output_dir O] [--accountant exact]

Reads every ``D/*/summary.json`` (the training binary's schema) and follows
Denisov et al. 2022 (arXiv:2202.08312), App I "Test accuracy details":

1. Incomplete runs (``finished`` false and not diverged) are left out and counted.
2. **Divergence rule.** A complete run *diverged* when the training binary
   flagged it (``diverged: true``: the model weights became non-finite), or
   when its final validation or test loss/accuracy is not a finite number, or,
   with ``--min_val_accuracy A`` (off by default), when its validation
   accuracy (no OOV/EOS) is below A (a collapsed model). Diverged runs are
   dropped; App I filters them out before computing error bars and requires
   at least 7 of 10 converged seeds per Fig 2 setting (at least 8 for Fig 3);
   cells with fewer than ``--min_converged`` converged seeds are marked.
3. Runs are grouped into *cells*: mechanism, noise multiplier, LR schedule,
   clients per round, and every other flag that changes the experiment
   (dataset, rounds, model size, ...). Within a cell the *setting*
   (server LR, client LR, server momentum) with the highest mean validation
   accuracy without OOV and EOS over its converged seeds is selected (ties:
   more converged seeds, then the smaller setting tuple). With
   ``--selection_min_seeds K`` only settings with at least K converged seeds
   compete (all settings if none has K), so that the 10-seed repeats of
   Table 4 are reported when they share a directory with the 1-seed search.
4. For the selected setting the table reports the mean and the sample
   standard deviation (ddof = 1, App I "empirical standard deviation") over
   seeds of the test accuracy without OOV and EOS.

Outputs in ``--output_dir`` (default ``D/summary``): ``summary.md`` (markdown
table), ``summary.json``, ``fig2_accuracy_vs_epsilon.png`` (constant-LR cells,
accuracy against ε, one line per mechanism) and, when the runs hold LR
schedules or several client counts, ``fig3_schedules.png`` (bars per schedule
and mechanism at one noise multiplier, with the non-private and the DP-FTRL
tree results as horizontal lines when present).
"""

from __future__ import annotations

import dataclasses
import glob
import json
import math
import os
import sys
from typing import Any, Dict, List, Optional, Sequence, Tuple

from tff_mf import jsonio
from tff_mf import participation
from training.records import RunSummary

METRIC = "accuracy_no_oov_no_eos"
SETTING_FIELDS = ("server_lr", "client_lr", "server_momentum")
# Config fields that do not change what is measured (or that are the seed / the setting).
NON_CELL_FIELDS = frozenset(SETTING_FIELDS) | {
    "seed", "noise_seed", "experiment_name", "root_output_dir", "workers", "rounds_per_eval",
    "rounds_per_checkpoint", "progress", "cache_dir", "data_dir", "noise_multiplier",
    "target_epsilon", "accountant", "mechanism", "report_train_metrics", "engine"}
# The "kind" of the summary.json this command writes, so that a later call skips it.
SWEEP_SUMMARY_KIND = "tff_mf_sweep_summary"
MIN_CONVERGED_FIG2 = 7  # App I: at least 7 of 10 seeds converged for each Fig 2 setting


@dataclasses.dataclass(frozen=True, eq=False)
class CellRow(jsonio.Record):
  """One cell of the sweep's table (a row of this command's summary.json, ``summarize``):
  the cell's keys, the selected setting and the test accuracy over its seeds."""
  mechanism: Optional[str] = None
  label: Optional[str] = None
  noise_multiplier: Optional[float] = None
  delta: Optional[float] = None
  accountant: Optional[str] = None
  epsilon: Optional[float] = None
  paper_epsilon: Optional[float] = None
  lr_schedule: Optional[str] = None
  schedule_rounds: Optional[int] = None
  clients_per_round: Optional[int] = None
  total_rounds: Optional[int] = None
  dataset: Optional[str] = None
  runs: Optional[int] = None
  runs_converged: Optional[int] = None
  runs_diverged: Optional[int] = None
  runs_incomplete: Optional[int] = None
  settings_tried: Optional[int] = None
  selected: Optional[Dict[str, float]] = None
  seeds: Optional[int] = None
  validation_mean: Optional[float] = None
  test_mean: Optional[float] = None
  test_std: Optional[float] = None
  test_values: Optional[List[float]] = None
  below_min_converged: Optional[bool] = None
  seed_list: Optional[List[Any]] = None


def _finite(value) -> bool:
  return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def is_sweep_summary(summary) -> bool:
  """True for a summary.json this command wrote (not a training run's)."""
  return isinstance(summary, dict) and (summary.get("kind") == SWEEP_SUMMARY_KIND or (
      "config" not in summary and set(summary) == {"root_output_dir", "rows"}))


def load_summaries(root_output_dir: str) -> List[RunSummary]:
  """Every run's ``<root>/*/summary.json`` (and one level deeper), each with ``_path`` added.

  The summaries this command writes (``<root>/summary/summary.json`` by default) are skipped.
  """
  paths = sorted(set(glob.glob(os.path.join(root_output_dir, "*", "summary.json")) +
                     glob.glob(os.path.join(root_output_dir, "*", "*", "summary.json"))))
  out = []
  for path in paths:
    try:
      with open(path) as f:
        summary = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
      raise ValueError(f"corrupt run summary {path}: {e}") from None
    if is_sweep_summary(summary):
      continue  # this command's own output (the default --output_dir is <root>/summary)
    if not isinstance(summary, dict) or not isinstance(summary.get("config"), dict):
      raise ValueError(f"run summary {path} has no 'config' object; not a training summary")
    out.append(RunSummary.of_json(summary).replace(_path=path))
  return out


def classify(summary: Any, min_val_accuracy: Optional[float] = None) -> str:
  """'incomplete', 'diverged' or 'converged' by the documented rule (module docstring)."""
  summary = RunSummary.of_json(summary)
  if summary.diverged:
    return "diverged"
  if not summary.finished:
    return "incomplete"
  for metrics in (summary.validation_metrics, summary.test_metrics):
    if not isinstance(metrics, dict):
      return "diverged"
    for key in ("loss", METRIC):
      if not _finite(metrics.get(key)):
        return "diverged"
  if min_val_accuracy is not None and summary.validation_metrics[METRIC] < min_val_accuracy:
    return "diverged"
  return "converged"


def _freeze(value):
  if isinstance(value, list):
    return tuple(_freeze(v) for v in value)
  if isinstance(value, dict):
    return tuple(sorted((k, _freeze(v)) for k, v in value.items()))
  return value


def cell_key(summary: Any) -> tuple:
  summary = RunSummary.of_json(summary)
  config = summary.config
  z = summary.noise_multiplier
  rest = tuple(sorted((k, _freeze(v)) for k, v in config.items() if k not in NON_CELL_FIELDS))
  mechanism = summary.mechanism if "mechanism" in summary else config.get("mechanism")
  return (mechanism, z if _finite(z) and z > 0 else None, rest)


def setting_of(summary: Any) -> Tuple[float, float, float]:
  return tuple(float(RunSummary.of_json(summary).config[k]) for k in SETTING_FIELDS)


def _mean(values: Sequence[float]) -> float:
  return sum(values) / len(values)


def _sample_std(values: Sequence[float]) -> Optional[float]:
  if len(values) < 2:
    return None
  m = _mean(values)
  return math.sqrt(sum((v - m) ** 2 for v in values) / (len(values) - 1))


def _recorded_epsilon(summaries: Sequence[RunSummary]) -> Optional[float]:
  values = [s.epsilon for s in summaries]
  return None if not values or any(v is None for v in values) else max(values)


def summarize(summaries: Sequence[dict], accountant: Optional[str] = None,
              min_val_accuracy: Optional[float] = None,
              min_converged: int = MIN_CONVERGED_FIG2,
              selection_min_seeds: int = 1) -> List[CellRow]:
  """One row per cell: selected setting, counts, mean ± std of test accuracy (no OOV/EOS).

  Only settings with at least ``selection_min_seeds`` converged seeds compete
  (all settings when none has that many): with the search and the 10-seed
  repeats in one directory, ``selection_min_seeds=7`` reports the repeated
  settings, as App I does.
  """
  from tff_mf import accounting  # pylint: disable=g-import-not-at-top
  from training import grids  # pylint: disable=g-import-not-at-top
  accountant = accountant or accounting.DEFAULT_ACCOUNTANT
  cells: Dict[tuple, List[Tuple[RunSummary, str]]] = {}
  for s in map(RunSummary.of_json, summaries):
    cells.setdefault(cell_key(s), []).append((s, classify(s, min_val_accuracy)))
  rows = []
  for key, members in cells.items():
    mechanism, z, _ = key
    config = members[0][0].config
    by_setting: Dict[tuple, List[RunSummary]] = {}
    counts = {"converged": 0, "diverged": 0, "incomplete": 0}
    for s, verdict in members:
      counts[verdict] += 1
      if verdict == "converged":
        by_setting.setdefault(setting_of(s), []).append(s)
    delta = float(members[0][0].delta or config.get("delta") or 1e-6)
    single = participation.CLASSES[participation.canonical_kind(
        config.get("participation", "single"))].at_most_once
    row = {
        "mechanism": mechanism,
        "label": grids.label(mechanism),
        "noise_multiplier": z, "delta": delta,
        "accountant": accountant if single else "as recorded by each run",
        # Single participation: one Gaussian at z (Denisov Thm 4.1). Other schemas: the
        # largest ε the runs recorded (their own analysis; None if any run reported none).
        "epsilon": (grids.epsilon_for(z, delta, accountant) if single else
                    _recorded_epsilon(s for s, _ in members)) if z is not None else None,
        "paper_epsilon": grids.PAPER_EPSILON.get(z) if z is not None else None,
        "lr_schedule": config.get("lr_schedule", "constant"),
        "schedule_rounds": config.get("schedule_rounds"),
        "clients_per_round": config.get("clients_per_round"),
        "total_rounds": config.get("total_rounds"), "dataset": config.get("dataset"),
        "runs": len(members), **{f"runs_{k}": v for k, v in counts.items()},
        "settings_tried": len({setting_of(s) for s, _ in members}),
        "selected": None, "seeds": 0, "validation_mean": None, "test_mean": None,
        "test_std": None, "test_values": [], "below_min_converged": True,
    }
    eligible = {k: v for k, v in by_setting.items() if len(v) >= selection_min_seeds}
    by_setting = eligible or by_setting
    if by_setting:
      def rank(item):
        setting, runs = item
        val = _mean([r.validation_metrics[METRIC] for r in runs])
        return (-val, -len(runs), setting)
      setting, runs = sorted(by_setting.items(), key=rank)[0]
      runs = sorted(runs, key=lambda r: r.config.get("seed", 0))
      tests = [float(r.test_metrics[METRIC]) for r in runs]
      row.update(
          selected=dict(zip(SETTING_FIELDS, setting)), seeds=len(runs),
          seed_list=[r.config.get("seed") for r in runs],
          validation_mean=_mean([float(r.validation_metrics[METRIC]) for r in runs]),
          test_mean=_mean(tests), test_std=_sample_std(tests), test_values=tests,
          below_min_converged=len(runs) < min_converged)
    rows.append(CellRow.of_json(row))
  rows.sort(key=lambda r: (r.lr_schedule, r.clients_per_round or 0, r.mechanism,
                           -(r.noise_multiplier or 0.0)))
  return rows


def _pct(value) -> str:
  return "-" if value is None else f"{100 * value:.2f}"


def markdown_table(rows: Sequence[Any], min_converged: int = MIN_CONVERGED_FIG2) -> str:
  rows = [CellRow.of_json(r) for r in rows]
  lines = [
      "| mechanism | z | ε | paper ε | schedule | clients/round | selected (server LR, client LR, "
      "momentum) | seeds of selected / runs in cell | val acc % | test acc % (no OOV/EOS), mean ± std |",
      "|---|---|---|---|---|---|---|---|---|---|"]
  for r in rows:
    sel = r.selected
    selected = "-" if sel is None else (
        f"({sel['server_lr']:g}, {sel['client_lr']:g}, {sel['server_momentum']:g})")
    schedule = r.lr_schedule + (f" (last {r.schedule_rounds})" if r.schedule_rounds else "")
    test = "-" if r.test_mean is None else (
        _pct(r.test_mean) + (f" ± {_pct(r.test_std)}" if r.test_std is not None else " (1 seed)"))
    if r.selected is not None and r.below_min_converged:
      test += " †"
    eps = "∞ (non-private)" if r.noise_multiplier is None else f"{r.epsilon:.2f}"
    lines.append(
        f"| {r.label} | {'-' if r.noise_multiplier is None else format(r.noise_multiplier, 'g')} "
        f"| {eps} | {'-' if r.paper_epsilon is None else format(r.paper_epsilon, 'g')} "
        f"| {schedule} | {r.clients_per_round} | {selected} "
        f"| {r.seeds} of {r.runs} ({r.runs_diverged} diverged, {r.runs_incomplete} "
        f"incomplete) | {_pct(r.validation_mean)} | {test} |")
  lines.append("")
  lines.append(f"ε: {rows[0].accountant if rows else 'the default'} accountant, one Gaussian mechanism "
               "with sensitivity 1 (Denisov Thm 4.1). Std: sample standard deviation over the "
               "converged seeds of the selected setting. † fewer than "
               f"{min_converged} converged seeds (App I asks for at least 7 of 10 in Fig 2).")
  return "\n".join(lines)


def _error_bars(means: Sequence[float], stds: Sequence[float]) -> List[List[float]]:
  """[lower, upper] error-bar lengths: ± std, the lower one clipped so no bar goes below 0
  (an accuracy is never negative)."""
  return [[min(s, max(m, 0.0)) for m, s in zip(means, stds)], list(stds)]


def plot_fig2(rows: Sequence[Any], path: str) -> bool:
  """Accuracy (no OOV/EOS) against ε, one line per mechanism, constant LR cells. False if none."""
  rows = [CellRow.of_json(r) for r in rows]
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  import matplotlib.ticker  # pylint: disable=g-import-not-at-top
  series: Dict[Tuple[str, object], List[CellRow]] = {}
  for r in rows:
    if r.lr_schedule == "constant" and r.noise_multiplier is not None and r.test_mean is not None:
      series.setdefault((r.label, r.clients_per_round), []).append(r)
  if not series:
    return False
  several_counts = len({k[1] for k in series}) > 1
  fig, ax = plt.subplots(figsize=(6.4, 4.2))
  for (label, clients), points in sorted(series.items(), key=lambda kv: str(kv[0])):
    points = sorted(points, key=lambda r: r.epsilon)
    means = [100 * p.test_mean for p in points]
    ax.errorbar([p.epsilon for p in points], means,
                yerr=_error_bars(means, [100 * (p.test_std or 0.0) for p in points]),
                marker="o", capsize=3,
                label=label + (f", {clients} clients/round" if several_counts else ""))
  ax.set_xscale("log")
  ticks = sorted({float(f"{p.epsilon:.3g}") for points in series.values() for p in points})
  ax.set_xticks(ticks)  # one labeled tick per ε of the runs (3 significant digits)
  ax.xaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
  ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
  ax.set_ylim(bottom=0.0)
  ax.set_xlabel(f"ε (δ = {rows[0].delta:g}, {rows[0].accountant})")
  ax.set_ylabel("test accuracy without OOV/EOS (%)")
  ax.set_title("Accuracy vs ε (Denisov et al. Fig 2 style)")
  ax.grid(True, alpha=0.3)
  ax.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)
  return True


def plot_fig3(rows: Sequence[Any], path: str, noise_multiplier: Optional[float] = None) -> bool:
  """Mean ± std per (schedule, clients per round) and mechanism at one noise multiplier, as
  points with error bars (not bars: the accuracy axis does not start at 0, so bar lengths
  would mislead). False if there is nothing to plot."""
  rows = [CellRow.of_json(r) for r in rows]
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  private = [r for r in rows if r.noise_multiplier is not None and r.test_mean is not None]
  if not private:
    return False
  if noise_multiplier is None:
    scheduled = [r for r in private if r.lr_schedule != "constant"] or private
    noise_multiplier = min(r.noise_multiplier for r in scheduled)
  at_z = [r for r in private if math.isclose(r.noise_multiplier, noise_multiplier)]
  groups = sorted({(r.lr_schedule, r.clients_per_round) for r in at_z},
                  key=lambda g: (["constant", "decay", "cooldown"].index(g[0])
                                 if g[0] in ("constant", "decay", "cooldown") else 9, g[1] or 0))
  if len(groups) < 2:
    return False
  mechanisms = sorted({r.label for r in at_z})
  fig, ax = plt.subplots(figsize=(7.0, 4.6))
  width = 0.8 / len(mechanisms)
  low, high = math.inf, -math.inf
  for m_index, label in enumerate(mechanisms):
    xs, ys, es = [], [], []
    for g_index, (schedule, clients) in enumerate(groups):
      match = [r for r in at_z if r.label == label and r.lr_schedule == schedule
               and r.clients_per_round == clients]
      if match:
        xs.append(g_index - 0.4 + width * (m_index + 0.5))
        ys.append(100 * match[0].test_mean)
        es.append(100 * (match[0].test_std or 0.0))
    if xs:
      bars = _error_bars(ys, es)
      ax.errorbar(xs, ys, yerr=bars, fmt="o", markersize=6, capsize=4, label=label)
      low = min(low, min(y - e for y, e in zip(ys, bars[0])))
      high = max(high, max(y + e for y, e in zip(ys, bars[1])))
  nonprivate = [r for r in rows if r.noise_multiplier is None and r.test_mean is not None]
  if nonprivate:
    level = 100 * max(r.test_mean for r in nonprivate)
    ax.axhline(level, color="black", linestyle="--", label="non-private")
    high = max(high, level)
  from training import grids  # pylint: disable=g-import-not-at-top
  tree = [r for r in at_z if r.mechanism == grids.DP_FTRL_TREE and r.lr_schedule == "constant"]
  if tree:
    ax.axhline(100 * tree[0].test_mean, color="red", linewidth=0.8,
               label="DP-FTRL tree (Honaker online), constant LR")
  ax.set_xticks(range(len(groups)))
  ax.set_xticklabels([f"{s}\n{c} clients/round" for s, c in groups], fontsize=8)
  ax.set_xlim(-0.5, len(groups) - 0.5)
  span = max(high - low, 1.0)
  ax.set_ylim(max(0.0, low - 0.15 * span), high + 0.45 * span)  # room for the legend above
  ax.grid(True, axis="y", alpha=0.3)
  eps = at_z[0].epsilon
  ax.set_ylabel("test accuracy without OOV/EOS (%)")
  ax.set_title(f"LR schedules at z = {noise_multiplier:g} (ε = {eps:.2f}; Denisov et al. Fig 3 style)")
  ax.legend(fontsize=8, loc="upper center", ncol=2)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)
  return True


def build_parser():
  """The parser of ``python -m training.summarize``."""
  from tff_mf import clitools  # pylint: disable=g-import-not-at-top
  parser = clitools.ArgumentParser(
      prog="python -m training.summarize",
      description="Select hyperparameters by validation accuracy and report test accuracy "
                  "(mean ± std over seeds) per mechanism and ε, with Fig 2/3 style plots. "
                  "Exit status 0, 2 on a usage error or when no run is found.")
  parser.add_argument("--root_output_dir", required=True,
                      help="the sweep's root: every <root_output_dir>/*/summary.json is read")
  parser.add_argument("--output_dir", default=None,
                      help="where summary.md, summary.json and the plots go (default: "
                           "<root_output_dir>/summary)")
  clitools.add_accountant_flag(parser, "the table's ε for single-participation runs (one "
                                       "Gaussian mechanism, sensitivity 1, Denisov et al. 2022 "
                                       "Thm 4.1; other schemas show the ε each run recorded)")
  parser.add_argument("--min_val_accuracy", type=float, default=None,
                      help="treat runs with validation accuracy (no OOV/EOS) below this as "
                           "diverged (default: none, off)")
  parser.add_argument("--min_converged", type=int, default=MIN_CONVERGED_FIG2,
                      help="mark cells whose selected setting has fewer converged seeds")
  parser.add_argument("--selection_min_seeds", type=int, default=1,
                      help="only settings with this many converged seeds compete in the "
                           "selection (all if none has); 7 reports the 10-seed repeats")
  parser.add_argument("--fig3_noise_multiplier", type=float, default=None,
                      help="the noise multiplier of the Fig 3 style plot (default: none, the "
                           "largest one with schedules)")
  return parser


def main(argv: Optional[List[str]] = None) -> int:
  parser = build_parser()
  args = parser.parse_args(argv)
  try:
    summaries = load_summaries(args.root_output_dir)
    if not summaries:
      raise ValueError(f"no */summary.json under {args.root_output_dir}")
    rows = summarize(summaries, args.accountant, args.min_val_accuracy, args.min_converged,
                     args.selection_min_seeds)
  except ValueError as e:
    print(f"{parser.prog}: error: {' '.join(str(e).split())}", file=sys.stderr)
    return 2
  output_dir = args.output_dir or os.path.join(args.root_output_dir, "summary")
  os.makedirs(output_dir, exist_ok=True)
  table = markdown_table(rows, args.min_converged)
  with open(os.path.join(output_dir, "summary.md"), "w") as f:
    f.write(f"# Sweep summary: {args.root_output_dir}\n\n{table}\n")
  with open(os.path.join(output_dir, "summary.json"), "w") as f:
    json.dump({"kind": SWEEP_SUMMARY_KIND, "root_output_dir": args.root_output_dir,
               "rows": [r.json() for r in rows]}, f, indent=1)
  written = ["summary.md", "summary.json"]
  if plot_fig2(rows, os.path.join(output_dir, "fig2_accuracy_vs_epsilon.png")):
    written.append("fig2_accuracy_vs_epsilon.png")
  if plot_fig3(rows, os.path.join(output_dir, "fig3_schedules.png"), args.fig3_noise_multiplier):
    written.append("fig3_schedules.png")
  print(table)
  print(f"\nwrote {', '.join(written)} to {output_dir}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
