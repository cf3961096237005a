"""The planner's speed (issue 50): ``tff_mf.planner.plan`` from an empty cache, then warm.

The issue's size is n = 2048 rounds, a population of 10^5, 500 clients per round, ε = 8
(δ = 1e-6), every trainable private mechanism and every schema: targets 10 minutes from an
empty factorization cache and 1 minute from a warm one on a 2-core machine.

  python benchmarks/bench_planner.py                       # the issue's size
  python benchmarks/bench_planner.py --total-rounds 256 --population 12500 --skip-mmcc
  python benchmarks/bench_planner.py --smoke --out-dir /tmp/x

Each run plans twice into one fresh cache directory (the cold run fills it, the warm run reads
it) and reports wall and CPU seconds, the candidates built, the recommendation and the best
few. ``--budget`` stops the cold run after that many seconds (reported as not finished).
Writes ``benchmarks/results/<name>.md`` (or ``--out-dir``) and its JSON.
"""

from __future__ import annotations

import argparse
import os
import platform
import signal
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import bench_harness  # pylint: disable=g-import-not-at-top,wrong-import-position
from tff_mf import planner  # pylint: disable=g-import-not-at-top,wrong-import-position

RESULTS = os.path.join(REPO, "benchmarks", "results")
ISSUE_SIZE = (2048, 100_000, 500, 8.0)  # n, P, K, ε
TARGETS = (600, 60)  # seconds: from an empty cache, from a warm one


def _at_issue_size(dep) -> bool:
  return (dep.total_rounds, dep.population, dep.clients_per_round,
          dep.target_epsilon) == ISSUE_SIZE


class _OverBudget(Exception):
  pass


def timed_plan(dep, cache_dir, budget, progress):
  """(result or None when over ``budget`` seconds, wall s, CPU s, {phase: count}): the
  candidates resolved (factorizations), calibrated and tested for pruning."""
  counts = {"resolved": 0, "calibrated": 0, "prune evaluations": 0}
  seconds = {key: 0.0 for key in counts}
  originals = {name: getattr(planner, name) for name in ("prepare", "calibrate",
                                                         "epsilon_at")}

  def counted(name, key):
    def call(*args, **kwargs):
      counts[key] += 1
      start = time.time()
      try:
        return originals[name](*args, **kwargs)
      finally:
        seconds[key] += time.time() - start
    return call

  def stop(signum, frame):
    raise _OverBudget()
  planner.prepare = counted("prepare", "resolved")
  planner.calibrate = counted("calibrate", "calibrated")
  planner.epsilon_at = counted("epsilon_at", "prune evaluations")
  previous = signal.signal(signal.SIGALRM, stop)
  signal.alarm(int(budget) if budget else 0)
  wall, cpu = time.time(), _cpu()
  try:
    result = planner.plan(dep, cache_dir=cache_dir, progress=progress)
  except _OverBudget:
    result = None
  finally:
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)
    for name, f in originals.items():
      setattr(planner, name, f)
  counts.update({f"{key} s": s for key, s in seconds.items()})
  return result, time.time() - wall, _cpu() - cpu, counts


def _cpu() -> float:
  """CPU seconds of this process and of its children that ended (the planner's prefetch
  child, ``tff_mf.planner_prefetch``, is waited for before ``plan`` returns)."""
  t = os.times()
  return t.user + t.system + t.children_user + t.children_system


def report(args, dep, runs):
  lines = [f"## {args.name}: the planner at n = {dep.total_rounds}, P = {dep.population}, "
           f"K = {dep.clients_per_round}, ε = {dep.target_epsilon:g}", "",
           f"Command: `python benchmarks/bench_planner.py {' '.join(sys.argv[1:])}`. Machine: "
           f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, shared (load "
           f"average {os.getloadavg()[0]:.1f} at the end), Python {platform.python_version()}. "
           f"Schemas: {', '.join(dep.schemas)}; mechanisms: "
           f"{'all trainable private' if args.mechanisms is None else ', '.join(dep.mechanisms)}"
           f"; MMCC {'skipped (--skip-mmcc)' if dep.skip_mmcc else 'run'}.", "",
           f"Issue 50's target: n = {ISSUE_SIZE[0]}, P = {ISSUE_SIZE[1]}, K = {ISSUE_SIZE[2]}, "
           f"ε = {ISSUE_SIZE[3]:g} within {TARGETS[0]} s from an empty cache and {TARGETS[1]} s "
           "from a warm one. " + ("This run is at that size." if _at_issue_size(dep) else
                                  "This run is smaller: the issue's size was not measured here."),
           "",
           "| run | finished | wall s | CPU s | within the target's time | candidates: "
           "resolved / calibrated / pruned (ε evaluations of the prune tests) | wall s in: "
           "resolving / calibrating / prune evaluations | recommended |",
           "|---|---|---|---|---|---|---|---|"]
  total = len(planner.enumerate_candidates(dep)[0])
  for (label, (result, wall, cpu, counts)), target in zip(runs, TARGETS):
    within = "yes" if result is not None and wall <= target else "no"
    if label not in ("empty cache", "warm cache"):  # a stopped cold run, continued
      within = "– (neither empty nor warm)"
    done = (f"{counts['resolved']} of {total} / {counts['calibrated']} / "
            f"{'–' if result is None else _pruned_text(result)} ({counts['prune evaluations']})"
            f" | {counts['resolved s']:.1f} / {counts['calibrated s']:.1f} / "
            f"{counts['prune evaluations s']:.1f}")
    if result is None:
      lines.append(f"| {label} | no (over the {args.budget:g} s budget) | {wall:.1f} | "
                   f"{cpu:.1f} | {within} | {done} | – |")
      continue
    best = result["recommended"]
    lines.append(f"| {label} | yes | {wall:.1f} | {cpu:.1f} | {within} | {done} | "
                 f"{planner.describe(best['mechanism'], _option(best), best['params'])}: "
                 f"z = {best['noise_multiplier']:.4g}, rmse = {best['rmse']:.4g} |")
  lines += ["", "A warm run reads the factorizations and the calibrated records (and the "
            "pruning tests' evaluations) back from the cache; it checks the winner "
            "(its figures, and its ε evaluated again at its z and just below)."]
  done = [r for _, (r, *_) in runs if r is not None]
  if done:
    lines += ["", "Best five (of the last finished run):", "",
              "| mechanism | schema, params | ε (bound) | z | rmse | state rows |",
              "|---|---|---|---|---|---|"]
    for c in done[-1]["candidates"][:5]:
      where = planner.describe("", _option(c), c["params"]).strip()
      lines.append(f"| {c['mechanism']} | {where} | "
                   f"{c['epsilon']:.4g} ({c['bound']}) | {c['noise_multiplier']:.4g} | "
                   f"{c['rmse']:.4g} | {c['state_rows']} |")
  return "\n".join(lines) + "\n"


def _pruned_text(result):
  before = sum(1 for x in result["pruned"] if x.get("before_factorizing"))
  return f"{len(result['pruned'])}, {before} of them before factorizing"


def _option(c):
  from tff_mf import participation  # pylint: disable=g-import-not-at-top
  return planner.SchemaOption(participation.from_dict(c["schema"]), c["sampling_prob"],
                              c["clients_used"], c["participations"])


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--total-rounds", type=int, default=2048)
  parser.add_argument("--population", type=int, default=100_000)
  parser.add_argument("--clients-per-round", type=int, default=500)
  parser.add_argument("--epsilon", type=float, default=8.0)
  parser.add_argument("--delta", type=float, default=1e-6)
  parser.add_argument("--mechanisms", nargs="+", default=None)
  parser.add_argument("--schemas", nargs="+", default=None)
  parser.add_argument("--skip-mmcc", action="store_true")
  parser.add_argument("--budget", type=float, default=None,
                      help="seconds the cold run may take before it is stopped")
  parser.add_argument("--progress", action="store_true", help="the planner's bar on stderr")
  parser.add_argument("--name", default="planner")
  parser.add_argument("--out-dir", default=RESULTS)
  parser.add_argument("--smoke", action="store_true", help="a tiny deployment, seconds")
  parser.add_argument("--cache-dir", default=None,
                      help="the factorization cache to plan into, kept afterwards (default: a "
                           "fresh temporary one); a cold run stopped by --budget goes on from "
                           "what it stored when run again on it")
  args = parser.parse_args(argv)
  if args.smoke:
    args.total_rounds, args.population, args.clients_per_round = 8, 32, 4
    args.mechanisms, args.schemas = ["gaussian", "opt_prefix_sum"], ["fixed_epoch"]
  dep = planner.Deployment(
      population=args.population, total_rounds=args.total_rounds,
      clients_per_round=args.clients_per_round, target_epsilon=args.epsilon, delta=args.delta,
      mechanisms=tuple(args.mechanisms) if args.mechanisms else None,
      skip_mmcc=args.skip_mmcc, **({"schemas": tuple(args.schemas)} if args.schemas else {}))
  with tempfile.TemporaryDirectory() as fresh:
    cache_dir = args.cache_dir or fresh
    os.makedirs(cache_dir, exist_ok=True)
    first = "empty cache" if not os.listdir(cache_dir) else f"cache {cache_dir} as found"
    cold = timed_plan(dep, cache_dir, args.budget, args.progress)
    runs = [(first, cold)]
    if cold[0] is not None:
      runs.append(("warm cache", timed_plan(dep, cache_dir, None, args.progress)))
  data = [{"run": label, "wall_s": wall, "cpu_s": cpu, "counts": counts, "result": result}
          for label, (result, wall, cpu, counts) in runs]
  bench_harness.write_section(args.out_dir, args.name, report(args, dep, runs),
                              data=_jsonable(data))
  return 0


def _jsonable(x):
  from tff_mf import jsonio  # pylint: disable=g-import-not-at-top
  return jsonio.jsonable(x)


if __name__ == "__main__":
  sys.exit(main())
