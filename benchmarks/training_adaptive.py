"""Adaptive clipping with MF noise against TFF's tree_adaptive and a fixed-clip grid.

Trains the main job's model and regime (``training.main_job.MAIN_JOB_DEFAULTS``: the
docstring dataset, 2 fixed epochs, one target ε) through the training binary's loop
(``training.loop.run_training``), one run per (arm, seed), and compares the arms on
test loss and test accuracy without OOV/EOS targets (mean ± std over seeds, paired
per-seed differences with a 95% t-interval, ``training.report``):

- ``tree_adaptive``: TFF's ``DifferentiallyPrivateFactory.tree_adaptive`` with its
  defaults. Its ``QAdaClipTreeResSumQuery`` adopts the clip-norm estimate only when the
  tree restarts, after ``restart_warmup`` = 128 rounds; in a run of at most 128 rounds it
  releases exactly TFF's ``tree_aggregation`` at ``l2_norm_clip`` = the initial clip
  norm (0.1), with the value noise multiplier of ``adaptive_clip_noise_params``. That is
  how it is run here (``--mechanism=tree --clip_norm=0.1 --noise_multiplier=z``), with z
  from the same budget split as the binary's adaptive MF runs
  (``tff_mf.accounting.adaptive_clipping.value_noise_multiplier``): the table's ε composes the tree
  at z with the count queries (Andrew, Thakkar, McMahan, Ramaswamy 2021,
  arXiv:1905.03871; Dong, Roth, Su 2019, arXiv:1905.02383).
- adaptive MF: ``--clip_norm=adaptive`` with TFF's ``gaussian_adaptive`` defaults
  (target quantile 0.5, initial clip 0.1, learning rate 0.2, count noise 0.05 × clients
  per round), at the same target ε.
- fixed MF: the same mechanisms at each clip norm of a grid, at the same target ε.

  nice -n 10 .venv/bin/python benchmarks/training_adaptive.py --total_rounds 24 \
      --clips 1 0.3 3 --seeds 0 1 2 --grid_seeds 0
  .venv/bin/python benchmarks/training_adaptive.py --smoke --out /tmp/x \
      --results_md /tmp/x/training_adaptive.md   # synthetic data, 2 rounds, one seed

A finished run (same flags) is read from its summary.json, not trained again; an
interrupted one resumes from its checkpoint. ``--report_only`` redraws the table and plot
from ``<out>/raw.json``.
"""

import argparse
import csv
import json
import os
import platform
import sys
import time

from training_pydocs import MACHINE, REPO  # sets sys.path and TF's log level

DEFAULT_OUT = os.path.join("out", "bench_adaptive")
DEFAULT_RESULTS_MD = os.path.join(REPO, "benchmarks", "results", "training_adaptive.md")
DEFAULT_MECHANISMS = ("blt", "opt_momentum")
DEFAULT_CLIPS = (1.0, 0.3, 3.0)
TREE_ADAPTIVE = "tree_adaptive"
# TFF's tree_adaptive default: the clip-norm estimate is adopted at the first restart.
TFF_RESTART_WARMUP = 128
# (summary key, label, lower is better): the leading metric first.
METRICS = (("loss", "test loss", True),
           ("accuracy_no_oov_no_eos", "test accuracy, no OOV/EOS", False),
           ("accuracy", "test accuracy, all tokens", False))


def arms(mechanisms, clips):
  """[(arm key, mechanism, clip_norm)]: the adaptive arms first, then the grid."""
  out = [(f"{m}-adaptive", m, "adaptive") for m in mechanisms]
  out.append((TREE_ADAPTIVE, "tree", None))
  out += [(f"{m}-clip{c:g}", m, float(c)) for c in clips for m in mechanisms]
  return out


def tree_adaptive_budget(settings):
  """(z of TFF's tree, sensitivity, σ_b, participations, composed ε) for tree_adaptive.

  The budget is split as for the binary's adaptive MF runs: 1/μ from the target ε, σ_b
  fixed, the tree's value noise takes the rest; ε is the composition's, an upper bound.
  """
  from tff_mf import accounting, mechanisms  # pylint: disable=g-import-not-at-top
  from tff_mf.accounting import adaptive_clipping  # pylint: disable=g-import-not-at-top
  from training import config as config_lib  # pylint: disable=g-import-not-at-top
  n = settings["total_rounds"]
  if n > TFF_RESTART_WARMUP:
    raise SystemExit(f"error: tree_adaptive is run as TFF's tree at its initial clip, which "
                     f"holds for at most {TFF_RESTART_WARMUP} rounds (restart_warmup), got {n}")
  config = config_lib.TrainingConfig(mechanism="tree", **settings)
  schema = config.schema()
  k = schema.max_participations_in(n)
  sens = accounting.sensitivity_report(mechanisms.tree_encoder(n), schema)["value"]
  sigma_b = adaptive_clipping.AdaptiveClipping().checked(
      settings["clients_per_round"]).clipped_count_stddev
  total = accounting.calibrate_noise_multiplier(settings["target_epsilon"], settings["delta"])
  z = adaptive_clipping.value_noise_multiplier(total, sens, sigma_b, k)
  eps = accounting.epsilon(adaptive_clipping.combined_noise_multiplier(z, sens, sigma_b, k),
                           settings["delta"])
  if not eps <= settings["target_epsilon"]:
    raise SystemExit(f"error: tree_adaptive's composed epsilon {eps} exceeds the target")
  return z, sens, sigma_b, k, eps


def _config(arm, mechanism, clip, seed, out, settings, tree_z, smoke):
  from training import config as config_lib  # pylint: disable=g-import-not-at-top
  run = dict(settings)
  if arm == TREE_ADAPTIVE:
    from tff_mf.accounting import adaptive_clipping  # pylint: disable=g-import-not-at-top
    run.update(clip_norm=adaptive_clipping.DEFAULT_INITIAL_CLIP_NORM, target_epsilon=None,
               noise_multiplier=tree_z)
  else:
    run["clip_norm"] = clip
  return config_lib.TrainingConfig(mechanism=mechanism, root_output_dir=os.path.join(out, "runs"),
                                   experiment_name=f"{arm}-seed{seed}", seed=seed,
                                   noise_seed=seed, progress=not smoke, **run)


def _clip_curve(run_dir):
  """{round: ζ of the next round} of an adaptive run (empty for a fixed clip)."""
  curve = {}
  with open(os.path.join(run_dir, "metrics.csv"), newline="", encoding="utf-8") as f:
    for row in csv.DictReader(f):
      if row.get("next_clip_norm") not in ("", None):
        curve[int(row["round"])] = float(row["next_clip_norm"])
  return curve


def best_fixed(results, mechanism, seeds):
  """The grid arm of ``mechanism`` with the least mean test loss over ``seeds``."""
  grid = [a for a, e in results.items() if e["mechanism"] == mechanism
          and e["clip"] not in ("adaptive", None) and all(s in e["runs"] for s in seeds)]
  return min(grid, key=lambda a: sum(results[a]["runs"][s]["test"]["loss"] for s in seeds))


def train(args, settings):
  """{arm: {"mechanism", "clip", "runs": {seed: record}}} (runs reused when finished).

  The adaptive arms and tree_adaptive run every seed; the grid runs ``--grid_seeds``, then
  each mechanism's best clip runs the other seeds.
  """
  from training import loop  # pylint: disable=g-import-not-at-top
  from training import task as task_lib  # pylint: disable=g-import-not-at-top
  tree = tree_adaptive_budget(settings)
  results, task = {}, None

  def run(arm, mechanism, clip, seed):
    nonlocal task
    entry = results.setdefault(arm, {"mechanism": mechanism, "clip": clip, "runs": {}})
    config = _config(arm, mechanism, clip, seed, args.out, settings, tree[0], args.smoke)
    config.validate()
    print(f"== {arm}, seed {seed} ==", file=sys.stderr, flush=True)
    s = _finished_summary(config)
    if s is None:
      task = task or task_lib.build_task(config)
      s = loop.run_training(config, task=task)
    if s["diverged"]:
      print(f"warning: {arm} seed {seed} diverged", file=sys.stderr)
    eps, analysis = s["epsilon"], s["analysis"]
    if arm == TREE_ADAPTIVE:
      z, sens, sigma_b, k, eps = tree
      if abs(s["privacy"]["sensitivity"] - sens) > 1e-9 * sens:
        raise SystemExit(f"error: the run's tree sensitivity {s['privacy']['sensitivity']} "
                         f"is not the one the budget was split with ({sens})")
      analysis = (f"tree at z = {z:.4g} (sens {sens:.4g}) composed with {k} count "
                  f"queries at sigma_b = {sigma_b:g}")
    entry["runs"][seed] = {
        "test": {key: s["test_metrics"][key] for key, _, _ in METRICS},
        "epsilon": eps, "analysis": analysis, "noise_multiplier": s["noise_multiplier"],
        "sensitivity": (s.get("privacy") or {}).get("sensitivity"),
        "wall_seconds": s["wall_seconds"], "diverged": s["diverged"],
        "clips": _clip_curve(config.run_dir)}
    _save_raw(args.out, results, tree, settings)

  plan = arms(args.mechanisms, args.clips)
  for arm, mechanism, clip in plan:
    for seed in (args.seeds if clip in ("adaptive", None) else args.grid_seeds):
      run(arm, mechanism, clip, seed)
  for m in args.mechanisms:
    best = best_fixed(results, m, args.grid_seeds)
    for seed in args.seeds:
      if seed not in results[best]["runs"]:
        run(best, m, results[best]["clip"], seed)
  return results, tree


def _save_raw(out, results, tree, settings):
  """<out>/raw.json: every finished run's record and the settings they ran with."""
  path = os.path.join(out, "raw.json")
  with open(path + ".tmp", "w", encoding="utf-8") as f:
    json.dump({"results": results, "tree": tree, "settings": settings}, f)
  os.replace(path + ".tmp", path)


def _read_raw(out):
  """(results with int seeds and rounds, tree, settings) of <out>/raw.json."""
  with open(os.path.join(out, "raw.json"), encoding="utf-8") as f:
    raw = json.load(f)
  results = {}
  for arm, entry in raw["results"].items():
    runs = {int(s): dict(r, clips={int(k): v for k, v in r["clips"].items()})
            for s, r in entry["runs"].items()}
    results[arm] = dict(entry, runs=runs)
  return results, tuple(raw["tree"]), raw.get("settings")


def _finished_summary(config):
  """The summary.json of a finished run with the same flags (None: train or resume it)."""
  path = os.path.join(config.run_dir, "summary.json")
  if not os.path.exists(path):
    return None
  with open(path, encoding="utf-8") as f:
    summary = json.load(f)
  flags = json.loads(json.dumps(config.public_dict()))
  recorded = dict(summary["config"])
  for key in ("noise_seed", "progress"):  # the seed's source, the progress bars
    recorded.pop(key, None)
    flags.pop(key, None)
  return summary if summary.get("finished") and recorded == flags else None


def _load_raw(out, args):
  """The records of <out>/raw.json for the seeds asked for, and its tree_adaptive budget."""
  results, tree, _ = _read_raw(out)
  for entry in results.values():
    entry["runs"] = {s: r for s, r in entry["runs"].items() if s in args.seeds}
  return results, tree


def summarize(results, mechanisms, grid_seeds):
  """Adds mean ± std per metric to each arm; returns the comparisons per MF mechanism (the
  best fixed clip chosen on ``grid_seeds``)."""
  from training import report  # pylint: disable=g-import-not-at-top
  for entry in results.values():
    seeds = sorted(entry["runs"])
    entry["seeds"] = seeds
    for key, _, _ in METRICS:
      values = [entry["runs"][s]["test"][key] for s in seeds]
      mean, std = report.mean_std(values)
      entry[key] = {"per_seed": values, "mean": mean, "std": std}
  comparisons = {}
  for m in mechanisms:
    best = best_fixed(results, m, grid_seeds)
    adaptive = f"{m}-adaptive"
    comparisons[m] = {"best_fixed": best, "adaptive": adaptive}
    for key, _, lower in METRICS:
      values = results[adaptive][key]["per_seed"]
      comparisons[m][key] = {
          "vs_best_fixed": report.paired(values, results[best][key]["per_seed"], lower),
          "vs_tree_adaptive": report.paired(values, results[TREE_ADAPTIVE][key]["per_seed"],
                                            lower)}
  return comparisons


def _label(arm, entry):
  from tff_mf import registry  # pylint: disable=g-import-not-at-top
  if arm == TREE_ADAPTIVE:
    return "TFF tree_adaptive (clip 0.1 until round 128)"
  name = registry.label(entry["mechanism"])
  return f"{name}, adaptive" if entry["clip"] == "adaptive" else f"{name}, clip {entry['clip']:g}"


def _pm(entry, key, spec=".4f"):
  """mean ± std over the arm's seeds, or the one value and its seed."""
  metric = entry[key]
  if len(entry["seeds"]) == 1:
    return f"{metric['mean']:{spec}} (seed {entry['seeds'][0]} only)"
  return f"{metric['mean']:{spec}} ± {metric['std']:{spec}}"


def _delta(d):
  low, high = d["interval"]
  interval = "—" if low is None else f"[{low:+.4f}, {high:+.4f}]"
  return (f"{d['mean']:+.4f} ± {d['std']:.4f} ({interval}; {d['verdict']}, "
          f"{d['better_for_seeds']}/{len(d['per_seed'])} seeds)")


def markdown(results, comparisons, settings, tree, command, trained, smoke, png, grid):
  """The section: settings, the table, the paired differences, the plot, the conclusion.

  ``grid``: (clip norms, seeds the grid ran).
  """
  from tff_mf.accounting import adaptive_clipping as ac  # pylint: disable=g-import-not-at-top
  from training import main_job  # pylint: disable=g-import-not-at-top
  z, sens, sigma_b, k, eps = tree
  seeds = next(iter(results.values()))["seeds"]
  schema = main_job.schema_text(settings)
  lines = [
      f"### Adaptive clipping with MF noise vs TFF's tree_adaptive and a fixed-clip grid: "
      f"{settings['dataset']}, {settings['total_rounds']} rounds x {settings['clients_per_round']} clients, "
      f"{schema}, target eps {settings['target_epsilon']:g}", "",
      f"Command: `{command}`  ",
      f"Machine: {MACHINE}, shared (load average {os.getloadavg()[0]:.1f} at the end; "
      f"{trained:.0f} s of training in all, the sum of the runs' wall times; Python "
      f"{platform.python_version()}).", "",
      f"Every run: ε ≤ {settings['target_epsilon']:g} at δ = {settings['delta']:g}, "
      f"{schema}, the main job's model and learning rates (client {settings['client_lr']:g}, "
      f"server {settings['server_lr']:g}, momentum {settings['server_momentum']:g}); seeds "
      f"{', '.join(map(str, seeds))} pin the noise, the client order and the init. Adaptive "
      f"runs use TFF's gaussian_adaptive defaults: target quantile {ac.DEFAULT_TARGET_QUANTILE:g}, "
      f"initial clip {ac.DEFAULT_INITIAL_CLIP_NORM:g}, learning rate {ac.DEFAULT_LEARNING_RATE:g} "
      f"(geometric), count noise σ_b = {ac.DEFAULT_COUNT_STDDEV_PER_CLIENT:g} × clients = "
      f"{sigma_b:g}; the count queries (sensitivity ½ per participation, {k} participations) "
      "and the MF noise compose to the target ε, and the MF noise takes what the count "
      "queries leave (summary.json, analysis `adaptive`). TFF's tree_adaptive adopts its "
      f"clip estimate only at the tree's first restart (restart_warmup = {TFF_RESTART_WARMUP} "
      f"rounds), so for these {settings['total_rounds']} rounds it is TFF's tree at clip "
      f"{ac.DEFAULT_INITIAL_CLIP_NORM:g} with value noise z = {z:.4g} (sensitivity "
      f"{sens:.4g}), the same budget split: composed ε = {eps:.4g}. The fixed-clip grid "
      f"({', '.join(f'{c:g}' for c in grid[0])}) ran seed{'s' if len(grid[1]) > 1 else ''} "
      f"{', '.join(map(str, grid[1]))}; each mechanism's best clip there (least test loss) "
      "then ran every seed. Choosing the clip on test loss favors the fixed clip (the search "
      "sees the test set and costs privacy a real search would pay for).", ""]
  head = " | ".join(f"{label} (mean ± std)" for _, label, _ in METRICS)
  lines += [f"| arm | {head} | ε | z | sensitivity | final ζ (mean) | wall s / run |",
            "| --- |" + " --- |" * (len(METRICS) + 5)]
  for arm, e in results.items():
    runs = list(e["runs"].values())
    finals = [r["clips"][max(r["clips"])] for r in runs if r["clips"]]
    final = f"{sum(finals) / len(finals):.4g}" if finals else "—"
    best = any(c["best_fixed"] == arm for c in comparisons.values())
    cells = " | ".join(("**" + _pm(e, key) + "**") if key == "loss" else _pm(e, key)
                       for key, _, _ in METRICS)
    lines.append(f"| {_label(arm, e)}{' (best fixed)' if best else ''} | {cells} | "
                 f"{max(r['epsilon'] for r in runs):.4g} | {runs[0]['noise_multiplier']:.4g} | "
                 f"{runs[0]['sensitivity']:.4g} | {final} | "
                 f"{sum(r['wall_seconds'] for r in runs) / len(runs):.0f} |")
  lines += ["", "Paired per-seed differences of each adaptive MF arm (adaptive − other; "
            "test loss: negative is better; accuracy: positive is better; 95% t-interval):", "",
            "| adaptive arm | against | Δ test loss | Δ accuracy, no OOV/EOS |",
            "| --- | --- | --- | --- |"]
  for m, c in comparisons.items():
    a = results[c["adaptive"]]
    for other, key in ((c["best_fixed"], "vs_best_fixed"), (TREE_ADAPTIVE, "vs_tree_adaptive")):
      lines.append(f"| {_label(c['adaptive'], a)} | {_label(other, results[other])} | "
                   f"{_delta(c['loss'][key])} | {_delta(c['accuracy_no_oov_no_eos'][key])} |")
  lines += ["", "![test loss and accuracy against the clip norm; ζ per round of the adaptive "
            f"runs]({png})", ""]
  if not smoke:
    lines += ["#### Conclusion", "", *conclusion_lines(results, comparisons), ""]
  return "\n".join(lines)


def conclusion_lines(results, comparisons):
  """One line per MF mechanism: the paired test-loss differences, read without rounding up."""
  def said(d):
    low, high = d["interval"]
    n = len(d["per_seed"])
    interval = "—" if low is None else f"[{low:+.3f}, {high:+.3f}]"
    return (f"{d['mean']:+.3f} ± {d['std']:.3f} nats, adaptive better for "
            f"{d['better_for_seeds']}/{n} seeds, 95% interval {interval} ({d['verdict']})")
  out = []
  for c in comparisons.values():
    best = c["best_fixed"]
    out.append(f"- {_label(c['adaptive'], results[c['adaptive']])} − "
               f"{_label(best, results[best])} (the grid's best): {said(c['loss']['vs_best_fixed'])}; "
               f"− TFF tree_adaptive: {said(c['loss']['vs_tree_adaptive'])}.")
  return out


def plot(results, comparisons, grid_seeds, path, title):
  """Test loss and accuracy against the clip norm (adaptive arms as bands), and ζ per round."""
  mechanisms = list(comparisons)
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from tff_mf import registry  # pylint: disable=g-import-not-at-top
  fig, axes = plt.subplots(1, 3, figsize=(16, 4.6))
  for ax, (key, label, _) in zip(axes[:2], METRICS[:2]):
    for i, m in enumerate(mechanisms):
      color = f"C{i}"
      grid = sorted((e["clip"], arm) for arm, e in results.items()
                    if e["mechanism"] == m and e["clip"] != "adaptive")
      seeds_label = ", ".join(map(str, grid_seeds))
      ax.plot([c for c, _ in grid],
              [np.mean([results[a]["runs"][s]["test"][key] for s in grid_seeds])
               for _, a in grid], marker="o", color=color,
              label=f"{registry.label(m)}, fixed clip (seed {seeds_label})")
      best = results[comparisons[m]["best_fixed"]]
      ax.errorbar([best["clip"]], [best[key]["mean"]], yerr=[best[key]["std"]], marker="*",
                  markersize=12, capsize=5, color=color, linestyle="none",
                  label=f"{registry.label(m)}, best fixed clip, mean ± std of all seeds")
      a = results[f"{m}-adaptive"][key]
      ax.axhline(a["mean"], color=color, linestyle="--", label=f"{registry.label(m)}, adaptive (± std)")
      ax.axhspan(a["mean"] - a["std"], a["mean"] + a["std"], color=color, alpha=0.15)
    t = results[TREE_ADAPTIVE][key]
    ax.axhline(t["mean"], color="k", linestyle=":", label="TFF tree_adaptive (± std)")
    ax.axhspan(t["mean"] - t["std"], t["mean"] + t["std"], color="k", alpha=0.08)
    ax.set_xscale("log")
    clips = sorted({e["clip"] for e in results.values() if e["clip"] not in ("adaptive", None)})
    ax.set_xticks(clips, [f"{c:g}" for c in clips])
    ax.minorticks_off()
    ax.set_xlabel("fixed clip norm ζ (log scale)")
    ax.set_ylabel(f"final {label}, mean ± std over seeds")
    ax.grid(alpha=0.3)
  axes[0].legend(fontsize=7)
  ax = axes[2]
  for c in sorted({e["clip"] for e in results.values() if e["clip"] not in ("adaptive", None)}):
    ax.axhline(c, color="gray", linewidth=0.8, linestyle=":")
  for i, m in enumerate(mechanisms):
    curves = [r["clips"] for r in results[f"{m}-adaptive"]["runs"].values()]
    rounds = sorted(set.intersection(*[set(c) for c in curves]))
    values = np.array([[c[r] for r in rounds] for c in curves])
    std = values.std(axis=0, ddof=1) if len(curves) > 1 else np.zeros(len(rounds))
    line, = ax.plot(rounds, values.mean(axis=0), color=f"C{i}",
                    label=_label(f"{m}-adaptive", results[f"{m}-adaptive"]))
    ax.fill_between(rounds, values.mean(axis=0) - std, values.mean(axis=0) + std,
                    color=line.get_color(), alpha=0.2)
  ax.set_xlabel("round")
  ax.set_ylabel("clip norm ζ of the next round (mean ± std)")
  ax.set_yscale("log")
  ax.grid(alpha=0.3)
  ax.legend(fontsize=8)
  fig.suptitle(title)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)
  return path


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
  parser.add_argument("--grid_seeds", type=int, nargs="+", default=None,
                      help="seeds the clip grid runs (default: --seeds); each mechanism's "
                      "best clip on them then runs every seed")
  parser.add_argument("--out", default=DEFAULT_OUT)
  parser.add_argument("--total_rounds", type=int, default=None)
  parser.add_argument("--target_epsilon", type=float, default=None)
  parser.add_argument("--mechanisms", nargs="+", default=list(DEFAULT_MECHANISMS))
  parser.add_argument("--clips", type=float, nargs="+", default=list(DEFAULT_CLIPS),
                      help="the fixed clip norms of the grid")
  parser.add_argument("--results_md", default=DEFAULT_RESULTS_MD)
  parser.add_argument("--smoke", action="store_true",
                      help="synthetic data, 2 rounds x 8 clients, seed 0, one clip: checks that "
                      "the script runs")
  parser.add_argument("--report_only", action="store_true",
                      help="no training: the table and plot from <out>/raw.json")
  args = parser.parse_args(argv)
  from training import main_job  # pylint: disable=g-import-not-at-top
  overrides = {key: getattr(args, key) for key in ("total_rounds", "target_epsilon")
               if getattr(args, key) is not None}
  if args.grid_seeds is None:
    args.grid_seeds = list(args.seeds)
  if args.smoke:
    args.seeds, args.grid_seeds, args.clips = [0], [0], args.clips[:1]
    overrides.update(total_rounds=2, dataset="synthetic", vocab_size=100, rounds_per_eval=1,
                     rounds_per_checkpoint=1, max_validation_elements=32, max_test_elements=32)
  settings = main_job.main_job_settings(**overrides)
  settings.pop("clip_norm")
  start = time.perf_counter()
  results, tree = _load_raw(args.out, args) if args.report_only else train(args, settings)
  comparisons = summarize(results, args.mechanisms, args.grid_seeds)
  trained = sum(r["wall_seconds"] for e in results.values() for r in e["runs"].values())
  flags = " --smoke" if args.smoke else (
      f" --total_rounds {settings['total_rounds']} --target_epsilon "
      f"{settings['target_epsilon']:g} --mechanisms {' '.join(args.mechanisms)} --clips "
      f"{' '.join(f'{c:g}' for c in args.clips)} --seeds {' '.join(map(str, args.seeds))}"
      + ("" if args.grid_seeds == args.seeds else
         f" --grid_seeds {' '.join(map(str, args.grid_seeds))}"))
  for flag, value, default in (("out", args.out, DEFAULT_OUT),
                                ("results_md", args.results_md, DEFAULT_RESULTS_MD)):
    if os.path.abspath(value) != os.path.abspath(default):
      inside = os.path.abspath(value).startswith(REPO + os.sep)
      flags += f" --{flag} {os.path.relpath(value, REPO) if inside else value}"
  command = f"nice -n 10 .venv/bin/python benchmarks/training_adaptive.py{flags}"
  stem = os.path.splitext(os.path.abspath(args.results_md))[0]
  text = markdown(results, comparisons, settings, tree, command, trained, args.smoke,
                  os.path.basename(stem) + ".png", (args.clips, args.grid_seeds))
  results_dir = os.path.dirname(os.path.abspath(args.results_md))
  os.makedirs(results_dir, exist_ok=True)
  with open(args.results_md, "w", encoding="utf-8") as f:
    f.write(text)
  with open(stem + ".json", "w", encoding="utf-8") as f:
    json.dump({"settings": settings, "results": results, "comparisons": comparisons,
               "tree_adaptive": dict(zip(("z", "sensitivity", "clipped_count_stddev",
                                          "participations", "epsilon"), tree)),
               "wall_seconds": time.perf_counter() - start}, f, indent=2, sort_keys=True)
  plot(results, comparisons, args.grid_seeds, stem + ".png",
       f"{settings['dataset']}, {settings['total_rounds']} rounds x "
       f"{settings['clients_per_round']} clients, {settings['epochs']} fixed epochs, "
       f"ε = {settings['target_epsilon']:g}")
  print(text)


if __name__ == "__main__":
  main()
