"""MMCC for Toeplitz encoders at production size, and ε-vs-z curves (arXiv:2310.15526).

Choquette-Choo, Ganesh, Steinke, Thakurta 2024 (MMCC, arXiv:2310.15526, App D) under
b-min-sep Poisson sampling (k = n/b participations, each eligible round joined with
probability q). Every ε here is an upper bound (``tff_mf.accounting.mmcc``).

Parts (each writes ``benchmarks/results/mmcc_toeplitz_<part>.json``; ``report`` writes
``benchmarks/results/mmcc_toeplitz.md`` and ``mmcc_toeplitz_curves.png``):

- ``profile``: BLT and banded Toeplitz from the registry at n = 256, 512, 1024 (k = 8):
  ``tff_mf.accounting.mmcc.mmcc`` composing only the undominated residue classes against composing
  every class (``prune_offsets=False``, the previous behaviour; only up to --max-slow-n).
- ``production``: ``tff-mf account --mechanism blt|banded_toeplitz --total_rounds 2048 --min_sep 256
  --amplification mmcc`` (k = 8) at several q, wall time of the whole command.
- ``slack``: for the production cases, a proven lower bound on ε
  (``tff_mf.accounting.mixture_pair.lower_bound``) and the Monte-Carlo ESTIMATE of the non-adaptive
  pair's ε (arXiv:2410.06266; an estimate, not a bound).
- ``curves``: ε against z for tree, banded, BLT and the multi-epoch optimum at equal n,
  with (MMCC) and without amplification, each point one ``tff-mf account`` call.

  nice -n 10 .venv/bin/python benchmarks/bench_mmcc_toeplitz.py profile
  nice -n 10 .venv/bin/python benchmarks/bench_mmcc_toeplitz.py production
  nice -n 10 .venv/bin/python benchmarks/bench_mmcc_toeplitz.py slack
  nice -n 10 .venv/bin/python benchmarks/bench_mmcc_toeplitz.py curves --n 64
  .venv/bin/python benchmarks/bench_mmcc_toeplitz.py report
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from tff_mf.factorization import cache  # pylint: disable=g-import-not-at-top
from tff_mf.accounting import mixture_pair  # pylint: disable=g-import-not-at-top
from tff_mf.accounting import mmcc  # pylint: disable=g-import-not-at-top

RESULTS = os.path.join(ROOT, "benchmarks", "results")
DELTA = 1e-6
K = 8  # participations: min_sep b = n / K
CLI = [os.path.join(ROOT, ".venv", "bin", "tff-mf")]
# The multi-epoch optimum: opt_prefix_sum factorized for k fixed epochs (dense_fixed_epoch),
# then accounted from its cache file under the same min-sep schema as the others.
MULTI_EPOCH = "multi_epoch_optimum"
CURVE_MECHANISMS = ("tree", "banded", "blt", MULTI_EPOCH)


def _machine() -> dict:
  return {"cpus": os.cpu_count(), "machine": platform.machine(),
          "python": platform.python_version(), "load_1min": os.getloadavg()[0]}


def _save(part: str, data: dict) -> None:
  os.makedirs(RESULTS, exist_ok=True)
  data["machine"] = _machine()
  with open(os.path.join(RESULTS, f"mmcc_toeplitz_{part}.json"), "w") as f:
    json.dump(data, f, indent=1)


def _load(part: str):
  path = os.path.join(RESULTS, f"mmcc_toeplitz_{part}.json")
  if not os.path.exists(path):
    return None
  with open(path) as f:
    return json.load(f)


def _account(mechanism: str, n: int, q: float, z: float, cache_dir: str, amplified: bool,
             workers: int = 2) -> dict:
  """One ``tff-mf account`` call (b = n/K min-sep): its JSON record plus wall seconds."""
  if mechanism == MULTI_EPOCH:
    fixed = CLI + ["account", "--mechanism", "opt_prefix_sum", "--total_rounds", str(n),
                   "--participation", "fixed_epoch", "--epochs", str(K), "--noise_multiplier", "1",
                   "--delta", repr(DELTA), "--cache_dir", cache_dir, "--json", "--no_progress"]
    npz = json.loads(subprocess.run(fixed, capture_output=True, text=True, check=True,
                                    env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")).stdout)
    source = ["--matrix", npz["cache_npz"]]
  else:
    source = ["--mechanism", mechanism, "--total_rounds", str(n), "--cache_dir", cache_dir]
  cmd = CLI + ["account", *source, "--min_sep", str(n // K),
               "--noise_multiplier", repr(z), "--delta", repr(DELTA), "--json", "--no_progress"]
  if amplified:
    cmd += ["--amplification", "mmcc", "--sampling_prob", repr(q), "--processes", str(workers)]
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
  start = time.time()
  out = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
  seconds = time.time() - start
  if out.returncode != 0:
    return {"error": (out.stderr.strip().splitlines() or ["?"])[-1], "seconds": seconds,
            "command": "tff-mf " + " ".join(cmd[1:]), "epsilon": None}
  record = json.loads(out.stdout)
  record["seconds"] = seconds
  record["command"] = "tff-mf " + " ".join(cmd[1:])
  return record


def run_profile(args):
  rows = []
  for mechanism in ("blt", "banded_toeplitz"):
    for n in args.ns:
      b = n // K
      rec = _account(mechanism, n, args.q, args.z, args.cache_dir, amplified=False)
      c = cache.load(rec["cache_npz"]).c
      for prune in ((True, False) if n <= args.max_slow_n else (True,)):
        start = time.time()
        r = mmcc.mmcc(c, args.q / b, args.z, DELTA, min_sep=b, workers=args.workers,
                      prune_offsets=prune)
        rows.append({"mechanism": mechanism, "n": n, "b": b, "prune_offsets": prune,
                     "epsilon": r.epsilon, "seconds": time.time() - start,
                     "composed_offsets": r.composed_offsets, "distinct_rows": r.distinct_rows,
                     "max_prob_ratio": r.max_prob_ratio})
        print(rows[-1], flush=True)
        _save("profile", {"q": args.q, "z": args.z, "rows": rows})  # after each point


def run_production(args):
  rows = []
  for mechanism in ("blt", "banded_toeplitz"):
    _account(mechanism, args.n, 1.0, args.z, args.cache_dir, amplified=False)  # factorize
    for q in args.qs:
      rec = _account(mechanism, args.n, q, args.z, args.cache_dir, amplified=True)
      rows.append({k: rec.get(k) for k in ("command", "seconds", "epsilon",
                                           "unamplified_epsilon", "error", "sensitivity")}
                  | {"mechanism": mechanism, "q": q,
                     "mmcc_seconds": (rec.get("mmcc") or {}).get("seconds"),
                     "distinct_rows": (rec.get("mmcc") or {}).get("distinct_rows")})
      print(rows[-1], flush=True)
  _save("production", {"n": args.n, "z": args.z, "rows": rows})


def run_slack(args):
  rows = []
  for mechanism in ("blt", "banded_toeplitz"):
    rec = _account(mechanism, args.n, 1.0, args.z, args.cache_dir, amplified=False)
    c = cache.load(rec["cache_npz"]).c
    for q in args.qs:
      start = time.time()
      lb = mixture_pair.lower_bound(c, q, args.z, DELTA, min_sep=args.n // K)
      lb_seconds = time.time() - start
      start = time.time()
      mc = mixture_pair.monte_carlo_epsilon(c, q, args.z, DELTA, min_sep=args.n // K,
                                            samples=args.samples)
      rows.append({"mechanism": mechanism, "q": q, "lower_bound": lb["epsilon"],
                   "lower_bound_seconds": lb_seconds, "mc_estimate": mc["epsilon"],
                   "mc_tail_hits": mc["tail_hits"], "mc_samples": mc["samples"],
                   "mc_seconds": time.time() - start})
      print(rows[-1], flush=True)
  _save("slack", {"n": args.n, "z": args.z, "rows": rows})


def run_curves(args):
  rows = []
  for mechanism in CURVE_MECHANISMS:
    for z in args.zs:
      for amplified in (False, True):
        rec = _account(mechanism, args.n, args.q, z, args.cache_dir, amplified)
        rows.append({"mechanism": mechanism, "z": z, "amplified": amplified,
                     "epsilon": rec.get("epsilon"), "error": rec.get("error"),
                     "seconds": rec["seconds"], "command": rec["command"]})
        print(rows[-1], flush=True)
        _save("curves", {"n": args.n, "q": args.q, "rows": rows})  # after each point


def _fmt(x, digits=4):
  if x is None:
    return ""
  if isinstance(x, str):
    return x
  return f"{x:.{digits}f}"


def run_report(args):
  del args
  lines = []
  prof = _load("profile")
  if prof:
    lines += [f"Profile (q = {prof['q']}, z = {prof['z']}, k = {K}; load {prof['machine']['load_1min']:.1f}):", "",
              "| mechanism | n | b | classes composed | distinct row PLDs | ε | seconds |",
              "|---|---|---|---|---|---|---|"]
    for r in prof["rows"]:
      lines.append(f"| {r['mechanism']} | {r['n']} | {r['b']} | {r['composed_offsets']} | "
                   f"{r['distinct_rows']} | {_fmt(r['epsilon'])} | {r['seconds']:.1f} |")
    lines.append("")
  prod = _load("production")
  slack = {(r["mechanism"], r["q"]): r for r in (_load("slack") or {"rows": []})["rows"]}
  if prod:
    lines += [f"Production size n = {prod['n']}, k = {K}, z = {prod['z']} "
              f"(load {prod['machine']['load_1min']:.1f}):", "",
              "| mechanism | q | unamplified ε | MMCC ε (bound) | lower bound | MMCC / lower "
              "| MC estimate (not a bound) | MC tail draws | distinct row PLDs | MMCC s | command s |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in prod["rows"]:
      sl = slack.get((r["mechanism"], r["q"]), {})
      ratio = (r["epsilon"] / sl["lower_bound"]) if sl.get("lower_bound") and r["epsilon"] else None
      lines.append(f"| {r['mechanism']} | {r['q']} | {_fmt(r['unamplified_epsilon'])} | "
                   f"{_fmt(r['epsilon']) if not r.get('error') else r['error']} | "
                   f"{_fmt(sl.get('lower_bound'))} | {_fmt(ratio, 2)} | "
                   f"{_fmt(sl.get('mc_estimate'))} | {sl.get('mc_tail_hits', '')} | "
                   f"{r['distinct_rows']} | {_fmt(r['mmcc_seconds'], 1)} | {r['seconds']:.1f} |")
    lines.append("")
  curves = _load("curves")
  if curves:
    zs = sorted({r["z"] for r in curves["rows"]})
    lines += [f"ε vs z, n = {curves['n']}, k = {K} (min_sep b = {curves['n'] // K}), "
              f"q = {curves['q']} (load {curves['machine']['load_1min']:.1f}):", "",
              "| mechanism | amplification | " + " | ".join(f"z = {z:g}" for z in zs) + " |",
              "|---|---|" + "---|" * len(zs)]
    for mech in CURVE_MECHANISMS:
      for amplified in (False, True):
        vals = {r["z"]: r for r in curves["rows"]
                if r["mechanism"] == mech and r["amplified"] == amplified}
        cells = [_curve_cell(vals.get(z)) for z in zs]
        lines.append(f"| {mech} | {'MMCC' if amplified else 'none'} | " + " | ".join(cells) + " |")
    lines.append("")
    _plot(curves)
    lines.append("![ε vs z](benchmarks/results/mmcc_toeplitz_curves.png)")
  with open(os.path.join(RESULTS, "mmcc_toeplitz.md"), "w") as f:
    f.write("\n".join(lines) + "\n")
  print("\n".join(lines))


def _curve_cell(rec) -> str:
  if rec is None:
    return "not run"
  if rec["epsilon"] is not None:
    return _fmt(rec["epsilon"])
  if "interrupted" in (rec.get("error") or ""):
    return f"stopped at {rec['seconds']:.0f} s (over the 10-minute limit)"
  if "negative entries" in (rec.get("error") or ""):
    return "no bound: C has negative entries (MMCC needs C ≥ 0)"
  return (rec.get("error") or "?")[:80]


def _plot(curves):
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  fig, ax = plt.subplots(figsize=(7, 4.5))
  for i, mech in enumerate(CURVE_MECHANISMS):
    for amplified in (False, True):
      pts = sorted((r["z"], r["epsilon"]) for r in curves["rows"]
                   if r["mechanism"] == mech and r["amplified"] == amplified
                   and r["epsilon"] is not None)
      if pts:
        ax.plot(*zip(*pts), color=f"C{i}", linestyle="-" if amplified else "--", marker="o",
                label=f"{mech}, {'MMCC (q = %g)' % curves['q'] if amplified else 'unamplified'}")
  ax.set_xlabel("noise multiplier z")
  ax.set_ylabel(f"ε at δ = {DELTA:g} (upper bound)")
  ax.set_yscale("log")
  ax.set_title(f"n = {curves['n']}, k = {K} participations, min_sep b = {curves['n'] // K}")
  ax.grid(True, which="both", alpha=0.3)
  ax.legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(os.path.join(RESULTS, "mmcc_toeplitz_curves.png"), dpi=110)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  sub = parser.add_subparsers(dest="part", required=True)
  pp = sub.add_parser("profile")
  pp.add_argument("--ns", type=int, nargs="+", default=[256, 512, 1024])
  pp.add_argument("--max-slow-n", type=int, default=512)
  pp.add_argument("--q", type=float, default=0.25)
  pp.add_argument("--z", type=float, default=2.0)
  pr = sub.add_parser("production")
  pr.add_argument("--n", type=int, default=2048)
  pr.add_argument("--qs", type=float, nargs="+", default=[0.05, 0.1, 0.25, 0.5])
  pr.add_argument("--z", type=float, default=2.0)
  ps = sub.add_parser("slack")
  ps.add_argument("--n", type=int, default=2048)
  ps.add_argument("--qs", type=float, nargs="+", default=[0.05, 0.1, 0.25, 0.5])
  ps.add_argument("--z", type=float, default=2.0)
  ps.add_argument("--samples", type=int, default=400_000)
  pc = sub.add_parser("curves")
  pc.add_argument("--n", type=int, default=128)
  pc.add_argument("--q", type=float, default=0.25)
  pc.add_argument("--zs", type=float, nargs="+", default=[1.0, 2.0, 4.0, 8.0])
  sub.add_parser("report")
  for p in (pp, pr, ps, pc):
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--cache-dir", default=os.path.expanduser("~/.cache/tff_mf"))
  args = parser.parse_args(argv)
  {"profile": run_profile, "production": run_production, "slack": run_slack,
   "curves": run_curves,
   "report": run_report}[args.part](args)
  return 0


if __name__ == "__main__":
  sys.exit(main())
