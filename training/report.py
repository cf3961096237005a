"""The main job's comparison: mean ± std over noise seeds, paired differences to the tree, plot.

Given one ``summary.json`` per (mechanism, seed) run, :func:`compare` computes, for the
leading metric and the others, the mean and sample standard deviation over seeds and,
for every mechanism against the baseline (TFF's tree), the per-seed paired
differences, their mean ± std and the 95% Student-t interval of the mean difference
(n − 1 degrees of freedom). A mechanism *wins* on a metric only when that interval
lies entirely on its better side: the difference is then larger than the seeds'
spread explains. :func:`write_results` writes ``results.json``, ``results.md`` (each
mechanism's privacy statement, then three sentences) and ``training.png`` (validation curves with shaded ±std bands,
final test metrics with error bars that never go below 0).
"""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import os
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from tff_mf import jsonio
from tff_mf.accounting.statement import Statement
from tff_mf.accounting.statement import epsilon_text
from training.records import RunSummary

# (metric key in summary["test_metrics"], label, lower is better)
METRICS = (("loss", "test loss (nats/token)", True),
           ("accuracy", "test accuracy, all tokens", False),
           ("accuracy_no_oov_no_eos", "test accuracy, no OOV/EOS", False))
CONFIDENCE = 0.95
# The papers' headline metric (Denisov et al. 2022, arXiv:2202.08312, App I): accuracy over
# targets that are neither OOV nor EOS. The conclusion reports it beside the leading metric.
HEADLINE = "accuracy_no_oov_no_eos"


@dataclasses.dataclass(frozen=True, eq=False)
class MechanismEntry(jsonio.Record):
  """A mechanism's entry in results.json (``compare``'s ``mechanisms``): its label, seeds and
  privacy (ε per seed, None where a run reported none); its metrics ({per_seed, mean, std,
  vs_baseline}) are under their keys (``METRICS``)."""
  label: Optional[str] = None
  reference: Optional[bool] = None
  seeds: Optional[List[int]] = None
  privacy_statement: Optional[Dict[str, Any]] = None
  epsilon: Optional[List[Optional[float]]] = None
  analysis: Optional[str] = None
  noise_multiplier: Optional[float] = None
  sensitivity: Optional[float] = None
  single_participation_sqrt_loss: Optional[float] = None
  wall_seconds: Optional[List[float]] = None


def _dataset_note(settings: dict) -> str:
  """What the docstring dataset was built from, when not from everything installed."""
  if settings.get("pydocs_stdlib", True):
    return ""
  return (" of the pinned packages (standard library left out, so the lock file alone fixes "
          "the data)")


def _label(mechanism: str) -> str:
  from tff_mf import registry  # pylint: disable=g-import-not-at-top
  return registry.label(mechanism)


def mean_std(values: Sequence[float]) -> Tuple[float, float]:
  """Mean and sample standard deviation (ddof = 1; 0 for one value)."""
  x = np.asarray(values, dtype=float)
  return float(x.mean()), float(x.std(ddof=1)) if x.size > 1 else 0.0


def t_interval(values: Sequence[float], confidence: float = CONFIDENCE
               ) -> Tuple[Optional[float], Optional[float]]:
  """Student-t interval of the mean (None, None for fewer than two values)."""
  from scipy import stats  # pylint: disable=g-import-not-at-top
  x = np.asarray(values, dtype=float)
  if x.size < 2:
    return None, None
  mean, std = mean_std(x)
  half = float(stats.t.ppf(0.5 + confidence / 2, x.size - 1)) * std / math.sqrt(x.size)
  return mean - half, mean + half


def paired(values: Sequence[float], baseline: Sequence[float], lower_is_better: bool
           ) -> Dict[str, object]:
  """Per-seed differences (mechanism − baseline), their mean ± std, interval and verdict."""
  diffs = [float(a) - float(b) for a, b in zip(values, baseline)]
  mean, std = mean_std(diffs)
  low, high = t_interval(diffs)
  better = (lambda d: d < 0) if lower_is_better else (lambda d: d > 0)
  if low is None:
    verdict = "undecided"
  elif better(low) and better(high):
    verdict = "better"
  elif not better(low) and not better(high) and low != 0 and high != 0:
    verdict = "worse"
  else:
    verdict = "not distinguishable"
  return {"per_seed": diffs, "mean": mean, "std": std, "interval": [low, high],
          "confidence": CONFIDENCE, "excludes_zero": verdict in ("better", "worse"),
          "better_for_seeds": sum(1 for d in diffs if better(d)), "verdict": verdict}


def _entries(result: Mapping[str, Any]) -> Dict[str, MechanismEntry]:
  """{mechanism: its entry} of a ``compare`` result (or of results.json), typed."""
  return {m: MechanismEntry.of_json(e) for m, e in result["mechanisms"].items()}


def compare(runs: Mapping[str, Mapping[int, Any]], baseline: str, leading: str = "loss",
            references: Sequence[str] = (), unigram: Optional[dict] = None
            ) -> Dict[str, object]:
  """{mechanisms: {name: {metric: {per_seed, mean, std, vs_baseline}}}, conclusion}.

  ``runs[mechanism][seed]`` is that run's summary (``RunSummary``, or its JSON form); seeds
  are paired across the DP
  mechanisms. ``references`` (e.g. ``none``, the non-private ceiling) are summarized over
  their own seeds, marked ``reference`` and left out of the pairing and the conclusion.
  ``unigram``: the unigram predictor's test metrics (``training.task.unigram_baseline``),
  the floor every DP run's test loss is checked against.
  """
  runs = {m: {s: RunSummary.of_json(x) for s, x in r.items()} for m, r in runs.items()}
  contenders = {m: r for m, r in runs.items() if m not in references}
  seeds = sorted(set.intersection(*[set(r) for r in contenders.values()]))
  out: Dict[str, dict] = {}
  for mechanism, by_seed in runs.items():
    reference = mechanism in references
    own_seeds = sorted(by_seed) if reference else seeds
    entry: Dict[str, object] = {"label": _label(mechanism), "reference": reference,
                                "seeds": own_seeds}
    for key, label, lower in METRICS:
      values = [by_seed[s].test_metrics[key] for s in own_seeds]
      mean, std = mean_std(values)
      metric = {"label": label, "lower_is_better": lower, "per_seed": values, "mean": mean,
                "std": std}
      if mechanism != baseline and not reference:
        metric["vs_baseline"] = paired(
            values, [runs[baseline][s].test_metrics[key] for s in seeds], lower)
      entry[key] = metric
    first = by_seed[own_seeds[0]]
    entry["privacy_statement"] = _largest_statement([by_seed[s] for s in own_seeds])
    entry.update(epsilon=[by_seed[s].epsilon for s in own_seeds],
                 analysis=first.analysis, noise_multiplier=first.noise_multiplier,
                 sensitivity=(first.privacy or {}).get("sensitivity"),
                 single_participation_sqrt_loss=first.single_participation_sqrt_loss,
                 wall_seconds=[by_seed[s].wall_seconds for s in own_seeds])
    out[mechanism] = entry
  result = {"seeds": seeds, "baseline": baseline, "leading_metric": leading,
            "headline_metric": HEADLINE, "mechanisms": out,
            "conclusion": conclusion(out, baseline, leading)}
  if unigram is not None:
    result["unigram"] = unigram
  result["conclusion"].update(learning(result))
  return result


def learning(result: dict) -> Dict[str, object]:
  """Whether the models learned: the DP runs whose test loss is not below the unigram
  predictor's, and those the non-private ceiling does not beat, as {mechanism: [seeds]}.

  ``every_dp_beats_unigram`` / ``ceiling_beats_every_dp`` are None where the unigram row /
  the ceiling is missing.
  """
  unigram = (result.get("unigram") or {}).get("loss")
  dp = {m: e for m, e in _entries(result).items() if not e.reference}
  ceilings = [e for e in _entries(result).values() if e.reference]
  # The ceiling's worst seed: it beats a DP run only if every one of its seeds does.
  ceiling = max((v for e in ceilings for v in e["loss"]["per_seed"]), default=None)

  def failures(bound, fails):
    if bound is None:
      return None
    seeds = {m: [s for s, v in zip(e.seeds, e["loss"]["per_seed"]) if fails(v, bound)]
             for m, e in dp.items()}
    return {m: s for m, s in seeds.items() if s}

  above_unigram = failures(unigram, lambda v, floor: not v < floor)
  below_ceiling = failures(ceiling, lambda v, top: not v > top)
  return {"unigram_loss": unigram, "ceiling_loss": ceiling,
          "dp_not_beating_unigram": above_unigram,
          "every_dp_beats_unigram": None if above_unigram is None else not above_unigram,
          "dp_not_beaten_by_ceiling": below_ceiling,
          "ceiling_beats_every_dp": None if below_ceiling is None else not below_ceiling}


def _largest_statement(summaries: Sequence[RunSummary]) -> Optional[dict]:
  """The privacy statement (``tff_mf.accounting.statement``) of the run with the largest ε (None: a
  summary written before statements were)."""
  statements = [s.privacy_statement for s in summaries]
  if any(s is None for s in statements):
    return None
  eps = [Statement.of_json(s).epsilon for s in statements]
  return statements[max(range(len(statements)),
                        key=lambda i: -1.0 if eps[i] is None else eps[i])]


def privacy_section(result: dict) -> List[str]:
  """The top of results.md: each mechanism's privacy statement (its largest-ε seed's)."""
  lines = ["## Privacy", ""]
  for entry in _entries(result).values():
    if entry.privacy_statement is None:
      continue
    statement = Statement.of_json(entry.privacy_statement)
    lines += [f"{entry.label}:", "", "```text", statement.text, "```", ""]
  return lines if len(lines) > 2 else []


def conclusion(mechanisms: Dict[str, dict], baseline: str, leading: str) -> Dict[str, object]:
  """The verdicts on the leading metric and on the headline accuracy: which MF mechanisms
  beat the tree beyond the seeds' spread on each, and on both."""
  verdicts, headline = {}, {}
  for name, entry in mechanisms.items():
    if name == baseline or MechanismEntry.of_json(entry).reference:
      continue
    verdicts[name] = entry[leading]["vs_baseline"]["verdict"]
    headline[name] = entry[HEADLINE]["vs_baseline"]["verdict"]
  winners = [m for m, v in verdicts.items() if v == "better"]
  return {"metric": leading, "verdicts": verdicts, "winners": winners,
          "mf_wins": bool(winners), "headline_metric": HEADLINE, "headline_verdicts": headline,
          "wins_both": [m for m in winners if headline[m] == "better"]}


def _fmt(value, spec=".4f") -> str:
  return "—" if value is None else format(value, spec)


def _headline_sentence(result: dict) -> str:
  """The first sentence: the verdict on test loss and on the papers' headline accuracy."""
  mech, c = _entries(result), result["conclusion"]
  unigram = (result.get("unigram") or {}).get(HEADLINE)
  headline_winners = [m for m, v in c["headline_verdicts"].items() if v == "better"]
  parts = [f"{_label(m)} − tree: {mech[m][HEADLINE]['vs_baseline']['mean']:+.4f}, {v}"
           for m, v in c["headline_verdicts"].items()]
  if c["wins_both"]:
    names = ", ".join(_label(m) for m in c["wins_both"])
    text = (f"{names} beat{'s' if len(c['wins_both']) == 1 else ''} TFF's tree on test loss "
            "and on the papers' headline metric, accuracy without OOV/EOS, each beyond the "
            f"seeds' spread ({int(CONFIDENCE * 100)}% paired intervals exclude 0)")
  elif headline_winners:
    names = ", ".join(_label(m) for m in headline_winners)
    text = (f"{names} beat{'s' if len(headline_winners) == 1 else ''} TFF's tree on the "
            "papers' headline metric, accuracy without OOV/EOS, beyond the seeds' spread, but "
            f"not on test loss ({'; '.join(parts)})")
  elif all(v == "undecided" for v in c["headline_verdicts"].values()):
    text = ("On the papers' headline metric, accuracy without OOV/EOS, one seed cannot compare "
            f"MF with TFF's tree beyond the seeds' spread ({'; '.join(parts)})")
  else:
    text = ("On the papers' headline metric, accuracy without OOV/EOS, MF does NOT beat TFF's "
            f"tree beyond the seeds' spread in this budget ({'; '.join(parts)})")
    if c["winners"]:
      text += (f", although {', '.join(_label(m) for m in c['winners'])} "
               f"beat{'s' if len(c['winners']) == 1 else ''} it on test loss")
  if unigram is not None:
    beyond = [e.label for e in mech.values() if e[HEADLINE]["mean"] > unigram]
    text += (f"; a unigram predictor (no training) scores {unigram:.4f} on it, and "
             + (f"{', '.join(beyond)} score{'s' if len(beyond) == 1 else ''} above it"
                if beyond else "no run scores above it"))
  return text + "."


def _learning_sentence(result: dict) -> str:
  """Whether every DP run beat the unigram predictor and the ceiling beat every DP run, on
  test loss ("" where neither reference row is there)."""
  c, mech = result["conclusion"], _entries(result)

  def runs(failed: Dict[str, List[int]]) -> str:
    return "; ".join(f"{_label(m)}, seed{'s' if len(s) > 1 else ''} "
                     f"{', '.join(map(str, s))}" for m, s in failed.items())

  parts = []
  if c.get("every_dp_beats_unigram") is not None:
    floor = f"the unigram predictor's test loss ({c['unigram_loss']:.4f})"
    parts.append(f"every DP run beats {floor}" if c["every_dp_beats_unigram"] else
                 f"NOT every DP run beats {floor} ({runs(c['dp_not_beating_unigram'])} "
                 "do not)")
  if c.get("ceiling_beats_every_dp") is not None:
    names = ", ".join(mech[m].label.lower() for m in mech if mech[m].reference)
    top = f"the {names} ceiling ({c['ceiling_loss']:.4f})"
    parts.append(f"{top} beats every DP run on it" if c["ceiling_beats_every_dp"] else
                 f"{top} does NOT beat every DP run on it "
                 f"({runs(c['dp_not_beaten_by_ceiling'])} score at or below it)")
  if not parts:
    return ""
  text = ", and ".join(parts)
  return f"{text[0].upper()}{text[1:]}."


def _sentences(result: dict, settings: dict) -> str:
  """The sentences results.md opens with: the verdict on both metrics, then three more."""
  mech = _entries(result)
  baseline = result["baseline"]
  others = [m for m in mech if m != baseline and not mech[m].reference]
  references = [m for m in mech if mech[m].reference]
  reported = [e for m in mech.values() if not m.reference for e in m.epsilon]
  privacy = (f"ε ≤ {epsilon_text(max(reported))} at δ = {settings['delta']:g} for every run"
             if reported and all(e is not None for e in reported) else
             f"δ = {settings['delta']:g}; a run without ε broke its schema, see the table")
  schema = settings["schema_text"]
  seeds = len(result["seeds"])
  first = (f"These are {len(others) + 1} mechanisms × {seeds} pinned noise seed"
           f"{'s' if seeds > 1 else ''} ({', '.join(map(str, result['seeds']))}) of DP "
           f"federated training of a small "
           f"next-word LSTM on the docstring dataset{_dataset_note(settings)} "
           f"({settings['total_rounds']} rounds of "
           f"{settings['clients_per_round']} clients, {schema}, {privacy}): TFF's tree "
           "aggregator against "
           f"{', '.join(_label(m) for m in others)}")
  own = settings.get("reference_settings") or {}
  for m in references:
    n = len(mech[m].seeds)
    first += (f", with {_label(m).lower()} training of the same regime as the ceiling "
              f"({n} seed{'s' if n > 1 else ''}")
    if own:
      first += ("; its own learning rates, tuned for it: "
                + ", ".join(f"{k.replace('_', ' ')} {v:g}" for k, v in own.items()))
    first += ")"
  first += "."
  initial = (result.get("initial_test_metrics") or {}).get("loss")
  start = f"; the untrained model scores {initial:.2f}" if initial is not None else ""
  second = (f"The table leads with test loss (lower is better{start}), the metric the "
            "conclusion is drawn on, as mean ± std over the seeds and as the paired per-seed "
            f"difference to the tree with its {int(CONFIDENCE * 100)}% t-interval.")
  parts = []
  for m in others:
    d = mech[m]["loss"]["vs_baseline"]
    low, high = d["interval"]
    if d["verdict"] == "better":
      parts.append(f"{_label(m)} beats the tree on test loss by {-d['mean']:.3f} ± "
                   f"{d['std']:.3f} nats, beyond the seeds' spread (interval "
                   f"[{low:+.3f}, {high:+.3f}] excludes 0)")
    elif d["verdict"] == "worse":
      parts.append(f"{_label(m)} loses to the tree on test loss by {d['mean']:.3f} ± "
                   f"{d['std']:.3f} nats (interval [{low:+.3f}, {high:+.3f}] excludes 0)")
    elif d["verdict"] == "undecided":
      parts.append(f"{_label(m)} cannot be compared with the tree beyond the seeds' spread "
                   f"from {len(d['per_seed'])} seed (difference {d['mean']:+.3f} nats)")
    else:
      parts.append(f"{_label(m)} does NOT beat the tree beyond the seeds' spread on test loss "
                   f"(difference {d['mean']:+.3f} ± {d['std']:.3f} nats, interval "
                   f"[{_fmt(low, '+.3f')}, {_fmt(high, '+.3f')}] includes 0)")
  third = "; ".join(parts) + "."
  headline = _headline_sentence(result)
  learned = _learning_sentence(result)
  return (f"{headline[0].upper()}{headline[1:]} {learned + ' ' if learned else ''}{first} "
          f"{second} {third[0].upper()}{third[1:]}")


def _delta(e: dict, key: str) -> str:
  """A paired-difference cell: mean ± std (interval; verdict, seeds better)."""
  d = e[key]["vs_baseline"]
  low, high = d["interval"]
  return (f"{d['mean']:+.4f} ± {d['std']:.4f} ([{_fmt(low, '+.4f')}, {_fmt(high, '+.4f')}]; "
          f"{d['verdict']}, {d['better_for_seeds']}/{len(d['per_seed'])} seeds)")


def _main_table(result: dict) -> List[str]:
  mech, baseline = _entries(result), result["baseline"]
  interval = f"{int(CONFIDENCE * 100)}% interval"
  lines = [f"| mechanism | **test loss** (mean ± std) | paired Δ loss vs tree (mean ± std; "
           f"{interval}) | test accuracy, all tokens | test accuracy, no OOV/EOS | paired Δ "
           f"accuracy no OOV/EOS vs tree ({interval}) | ε (analysis) | z | sensitivity | "
           "wall s / run |",
           "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
  for name, e in mech.items():
    if e.reference:
      deltas = [f"reference ({len(e.seeds)} seed{'s' if len(e.seeds) > 1 else ''})"] * 2
    elif name == baseline:
      deltas = ["baseline"] * 2
    else:
      deltas = [_delta(e, "loss"), _delta(e, HEADLINE)]
    eps = (max(x for x in e.epsilon) if all(x is not None for x in e.epsilon)
           else None)
    privacy = ("— (no DP) | — | —" if e.reference else
               f"{epsilon_text(eps)} ({e.analysis}) | {_fmt(e.noise_multiplier, '.4g')}"
               f" | {_fmt(e.sensitivity, '.4g')}")
    lines.append(
        f"| {e.label} | **{e['loss']['mean']:.4f} ± {e['loss']['std']:.4f}** | {deltas[0]} | "
        f"{e['accuracy']['mean']:.4f} ± {e['accuracy']['std']:.4f} | "
        f"{e[HEADLINE]['mean']:.4f} ± {e[HEADLINE]['std']:.4f} | {deltas[1]} | {privacy} | "
        f"{np.mean(e.wall_seconds):.0f} |")
  unigram = result.get("unigram")
  if unigram:
    lines.append(
        f"| unigram predictor (always “{unigram['word']}”; no training, no DP) | "
        f"**{unigram['loss']:.4f}** | — | {unigram['accuracy']:.4f} | "
        f"{unigram[HEADLINE]:.4f} | — | — | — | — | — |")
  return lines


def _seed_table(result: dict) -> List[str]:
  seeds = result["seeds"]
  lines = ["| mechanism | " + " | ".join(f"seed {s}: test loss" for s in seeds) + " |",
           "| --- | " + " | ".join("---" for _ in seeds) + " |"]
  for e in _entries(result).values():
    if e.reference:
      continue
    lines.append(f"| {e.label} | " + " | ".join(f"{v:.4f}" for v in e["loss"]["per_seed"])
                 + " |")
  return lines


def markdown(result: dict, settings: dict) -> str:
  """results.md: the privacy statements, three sentences, the leading table, the per-seed
  table, how to read it."""
  c = result["conclusion"]
  verdict = ("MF wins on the leading metric." if c["mf_wins"] else
             "MF does NOT win on the leading metric beyond the seeds' spread.")
  if c["wins_both"]:
    verdict += " It also wins on accuracy without OOV/EOS."
  elif any(v == "better" for v in c["headline_verdicts"].values()):
    verdict += " It wins on accuracy without OOV/EOS beyond the seeds' spread."
  else:
    verdict += " It does NOT win on accuracy without OOV/EOS beyond the seeds' spread."
  seeds = len(result["seeds"])
  lines = [f"# Main job: {settings['title']}", "", *privacy_section(result),
           "## Results", "", _sentences(result, settings), "",
           f"**Conclusion (test loss and accuracy without OOV/EOS, {seeds} seed"
           f"{'s' if seeds > 1 else ''}): {verdict}**", "",
           *_main_table(result), "", *_seed_table(result), "",
           "![validation loss and accuracy (mean ± std over seeds), final test loss]"
           "(training.png)", "", "## How to read this", "", *settings["notes"], ""]
  return "\n".join(lines)


def read_curve(metrics_csv: str, metric: str) -> Dict[int, float]:
  """{round: validation ``metric``} of a run's metrics.csv."""
  points = {}
  with open(metrics_csv, newline="", encoding="utf-8") as f:
    for row in csv.DictReader(f):
      value = row.get(f"validation_{metric}", "")
      if value not in ("", None):
        points[int(row["round"])] = float(value)
  return points


def plot(result: dict, curves: Dict[str, Dict[str, List[Dict[int, float]]]], path: str,
         title: str) -> str:
  """training.png: validation loss and accuracy without OOV/EOS (mean ± std shaded; the
  non-private ceiling dashed, the unigram predictor dotted), final test loss bars.

  ``curves[metric][mechanism]``: one {round: value} per seed, for metric "loss" and
  ``HEADLINE``.
  """
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  fig, axes = plt.subplots(1, 4, figsize=(20, 4.6))
  for ax, (metric, label) in zip(axes[:2], (("loss", "validation loss (nats/token)"),
                                            (HEADLINE, "validation accuracy, no OOV/EOS"))):
    for name, per_seed in curves.get(metric, {}).items():
      rounds = sorted(set.intersection(*[set(c) for c in per_seed]))
      if not rounds:
        continue
      values = np.array([[c[r] for r in rounds] for c in per_seed])
      mean = values.mean(axis=0)
      std = values.std(axis=0, ddof=1) if len(per_seed) > 1 else np.zeros_like(mean)
      reference = name in result["mechanisms"] and _entries(result)[name].reference
      line, = ax.plot(rounds, mean, marker="o", markersize=3,
                      linestyle="--" if reference else "-",
                      label=_label(name) + (" (ceiling)" if reference else ""))
      ax.fill_between(rounds, np.maximum(mean - std, 0.0), mean + std,
                      color=line.get_color(), alpha=0.25)
    initial = (result.get("initial_test_metrics") or {}).get(metric)
    if initial is not None:
      ax.axhline(initial, color="gray", linestyle="--", linewidth=1,
                 label=f"untrained model ({initial:.3g}, test)")
    unigram = (result.get("unigram") or {}).get(metric)
    if unigram is not None:
      ax.axhline(unigram, color="black", linestyle=":", linewidth=1.2,
                 label=f"unigram predictor ({unigram:.3g}, test)")
    ax.set_xlabel("round")
    ax.set_ylabel(label)
    ax.grid(alpha=0.3)
    ax.legend(title=f"mean ± std, {len(result['seeds'])} seeds")
  for ax, (metric, label) in zip(axes[2:], (
      ("loss", "final test loss (nats/token), mean ± std"),
      (HEADLINE, "final test accuracy, no OOV/EOS, mean ± std"))):
    _final_bars(ax, result, metric, label)
  fig.suptitle(title)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)
  return path


def _final_bars(ax, result: dict, metric: str, label: str) -> None:
  """Bars of a final test metric per mechanism: mean, ±std error bars clipped at 0, seeds as
  dots; the untrained model dashed and the unigram predictor dotted."""
  names = list(result["mechanisms"])
  means = np.array([result["mechanisms"][m][metric]["mean"] for m in names])
  stds = np.array([result["mechanisms"][m][metric]["std"] for m in names])
  x = np.arange(len(names))
  ax.bar(x, means, color=[f"C{i}" for i in range(len(names))], alpha=0.7)
  ax.errorbar(x, means, yerr=[np.minimum(stds, means), stds], fmt="none", ecolor="black",
              capsize=6)
  for i, m in enumerate(names):
    seeds = result["mechanisms"][m][metric]["per_seed"]
    ax.plot([i] * len(seeds), seeds, "k.", markersize=6)
  initial = (result.get("initial_test_metrics") or {}).get(metric)
  if initial is not None:
    ax.axhline(initial, color="gray", linestyle="--", linewidth=1, label="untrained model")
  unigram = (result.get("unigram") or {}).get(metric)
  if unigram is not None:
    ax.axhline(unigram, color="black", linestyle=":", linewidth=1.2, label="unigram predictor")
  if initial is not None or unigram is not None:
    ax.legend(loc="lower right")
  ax.set_xticks(x, [_label(m) for m in names], rotation=25, ha="right")
  ax.set_ylabel(label)
  ax.set_ylim(bottom=0.0)
  ax.grid(alpha=0.3, axis="y")


def write_results(output_dir: str, result: dict, settings: dict, curves: dict) -> str:
  """results.json, results.md, training.png; returns the markdown."""
  text = markdown(result, settings)
  plot(result, curves, os.path.join(output_dir, "training.png"), settings["title"])
  with open(os.path.join(output_dir, "results.md"), "w", encoding="utf-8") as f:
    f.write(text)
  with open(os.path.join(output_dir, "results.json"), "w", encoding="utf-8") as f:
    json.dump(dict(result, settings={k: v for k, v in settings.items() if k != "notes"}),
              f, indent=2, sort_keys=True)
  return text
