"""One-run auditing: tff-mf's bounds against jax_privacy's ``CanaryScoreAuditor`` on the same scores.

Writes ``benchmarks/results/one_run_audit.md``. m canaries, each included with probability
1/2, score N(μ, 1) when included and N(0, 1) otherwise (each inclusion is μ-GDP: the
scores of a Gaussian mechanism's canaries, the one-run audit's model). On every draw both
sides get the same scores, confidence 1 − α, δ:

- ours: Steinke, Nasr, Jagielski 2023 (arXiv:2305.08846, Thm 3.1) with guess counts
  planned on the model (``plan_one_run``, both directions), and its f-DP refinement
  (Mahloujifar, Melis, Chaudhuri 2024, arXiv:2410.22235): the GDP μ lower bound, reported
  as its ε(δ), with counts planned for μ, and the (ε, δ)-curve bound (no Gaussian shape);
- peer: ``epsilon_one_run`` and ``epsilon_one_run_fdp`` (one-sided, the best threshold on the
  observed scores' ROC frontier, with a Bonferroni correction over the frontier), run by
  ``benchmarks/peer_jax_privacy_audit.py`` in the benchmark-only interpreter.

Second section (issue 40, item 5): the multi-run audit's ε and μ bounds share one α
(``planned_thresholds``' ``epsilon_share`` and ``mu_share``); the peer's
``epsilon_clopper_pearson`` and ``epsilon_from_gdp`` each spend the whole α. On exact
Gaussian scores (T + T trials, μ of the sweep's rows) both sides' ε at δ and ε of the μ bound,
for our default shares and for shares that move α to μ.

  python benchmarks/bench_one_run_audit.py --peer-python /tmp/peer-audit/bin/python
  python benchmarks/bench_one_run_audit.py --smoke --out-dir OUT   # seconds, no peer
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

# pylint: disable=g-import-not-at-top,wrong-import-position
import numpy as np

from tff_mf import audit as audit_lib
# pylint: enable=g-import-not-at-top,wrong-import-position

ALPHA, DELTA = 0.05, 1e-5
# (μ, canaries) and draws per configuration.
CONFIGS = ((1.0, 1000), (2.0, 1000), (4.0, 1000), (2.0, 5000), (4.0, 5000))
DRAWS = 10
SEED = 20261127
PEER_SOURCE = "newest source, commit 8967688c26d4 of 2026-08-20"


def our_side(mu, m, draws, seed):
  """Scores, inclusions and our bounds for ``draws`` one-run audits."""
  model = np.random.default_rng(audit_lib.PLAN_SEED).standard_normal((2, 20_000))
  start = time.perf_counter()
  plan_eps = audit_lib.plan_one_run(model[0] + mu, model[1], m, ALPHA, DELTA)
  plan_mu = audit_lib.plan_one_run(model[0] + mu, model[1], m, ALPHA, DELTA, target="mu")
  plan_seconds = time.perf_counter() - start
  rng = np.random.default_rng([seed, m, int(mu * 100)])
  runs = []
  for _ in range(draws):
    inc = rng.random(m) < 0.5
    scores = rng.standard_normal(m) + mu * inc
    start = time.perf_counter()
    g, c = audit_lib.one_run_guesses(scores, inc, *plan_eps)
    gm, cm = audit_lib.one_run_guesses(scores, inc, *plan_mu)
    mu_lb = audit_lib.one_run_mu(m, gm, cm, ALPHA)
    runs.append({"scores": scores, "included": inc, "counts": (m, g, c),
                 "snj": audit_lib.one_run_epsilon(m, g, c, ALPHA, DELTA),
                 "fdp_eps_delta": audit_lib.one_run_fdp_epsilon(m, g, c, ALPHA, DELTA),
                 "mu_lb": mu_lb, "fdp_gdp": audit_lib.gdp_epsilon(mu_lb, DELTA),
                 "seconds": time.perf_counter() - start})
  return {"plan_eps": plan_eps, "plan_mu": plan_mu, "plan_seconds": plan_seconds,
          "runs": runs}


# Multi-run section: trials per world, confidence, μ values, audits per μ, and the
# (epsilon_share, mu_share) plans compared (the first is the audit's default).
SHARE_TRIALS, SHARE_ALPHA, SHARE_MUS, SHARE_DRAWS = 2048, 0.01, (2.0, 3.2, 5.5), 15
SHARES = ((audit_lib.EPSILON_SHARE, audit_lib.MU_SHARE), (0.35, 0.45), (0.001, 0.8))


def share_side(mus, draws, trials, tmp):
  """Our multi-run bounds on exact Gaussian scores under each plan of SHARES; score files
  for the peer."""
  rows = []
  for mu in mus:
    m0, m1 = audit_lib.gaussian_model(mu)
    plans = [audit_lib.planned_thresholds(m0, m1, trials, trials, SHARE_ALPHA, DELTA,
                                          epsilon_share=e, mu_share=u) for e, u in SHARES]
    rng = np.random.default_rng([SEED, int(mu * 100)])
    for i in range(draws):
      s0, s1 = rng.standard_normal(trials), rng.standard_normal(trials) + mu
      row = {"mu": mu, "file": os.path.join(tmp, f"multi_mu{mu:g}_{i}.npz"), "ours": []}
      np.savez(row["file"], held_in=s1, out=s0)
      for plan in plans:
        pts = audit_lib.tradeoff_points(s0, s1, plan, SHARE_ALPHA)
        row["ours"].append((audit_lib.epsilon_lower_bound(pts["fpr_hi"], pts["fnr_hi"], DELTA),
                            audit_lib.gdp_epsilon(audit_lib.gdp_mu_lower_bound(
                                pts["fpr_hi"], pts["fnr_hi"]), DELTA)))
      rows.append(row)
  return rows


def share_table(rows, peer):
  lines = ["", "### The multi-run statistic: ε and μ share one α", "",
           f"Exact Gaussian scores, {SHARE_TRIALS} + {SHARE_TRIALS} trials, confidence "
           f"{1 - SHARE_ALPHA:g}, δ = {DELTA:g}, {SHARE_DRAWS} audits per μ (ours planned on "
           "the true μ). Ratios ours / peer per audit (mean, min, audits with ours ≥ peer): "
           "ε at δ against `epsilon_clopper_pearson` (two-sided, Bonferroni), ε of the μ "
           "bound against `epsilon_from_gdp`. Each peer method spends the whole α; ours "
           "gives both bounds at once, simultaneously valid at 1 − α, with the shares shown.",
           "", "| μ | ours: ε share, μ share | ε at δ: ours / peer | ε of μ: ours / peer |",
           "| --- | --- | --- | --- |"]
  if not peer:
    return "\n".join(lines[:5] + ["(no peer interpreter: not run)"]) + "\n"
  summary = {k: [] for k in range(len(SHARES))}
  for mu in sorted({r["mu"] for r in rows}):
    sub = [r for r in rows if r["mu"] == mu]
    pe = np.array([peer[r["file"]]["clopper_pearson_bonferroni"] for r in sub])
    pg = np.array([peer[r["file"]]["gdp"] for r in sub])
    for k, (e, u) in enumerate(SHARES):
      oe = np.array([r["ours"][k][0] for r in sub]) / pe
      og = np.array([r["ours"][k][1] for r in sub]) / pg
      summary[k] += [(a, b) for a, b in zip(oe, og)]
      lines.append(f"| {mu:g} | {e:g}, {u:g}{' (default)' if k == 0 else ''} | "
                   f"{oe.mean():.3f}, {oe.min():.3f}, {int(np.sum(oe >= 1))} of {len(sub)} | "
                   f"{og.mean():.3f}, {og.min():.3f}, {int(np.sum(og >= 1))} of {len(sub)} |")
  (e0, g0), (e2, g2) = (np.array(summary[k]).T for k in (0, len(SHARES) - 1))
  lines += ["", f"Why the μ column stays below the peer's at the default shares (mean "
            f"{g0.mean():.3f} over all audits here, while the ε column is {e0.mean():.3f}): "
            "the two bounds share one α and the default plan gives μ "
            f"{SHARES[0][1]:g} of it, the peer's `epsilon_from_gdp` all of it. Moved to μ "
            f"({SHARES[-1][1]:g}), the μ column is {g2.mean():.3f} on average and the ε column "
            f"falls to {e2.mean():.3f}: α moves the gap between the two bounds, it does not "
            "close both. Per audit the μ column still loses some draws (min "
            f"{g2.min():.3f}): the peer takes the largest μ over the thresholds on the "
            "observed ROC frontier at α/(2·their number), a number it counts after seeing "
            "the scores (a few dozen here); a bound proven for every threshold the data could "
            "pick pays for all T + 1 counts of each side (ours: the union share, or a band "
            "planned where the bound is expected). Matching the peer on every draw would take "
            "its data-chosen correction, which has no proof of validity: our audit keeps "
            "simultaneous, proven coverage and its default shares, whose ε bound decides "
            f"(ε, δ) claims and whose μ bound decides GDP claims (at least {e0.min():.3f} and "
            f"{g0.min():.3f} of the peer's full-α figures here)."]
  return "\n".join(lines) + "\n"


def peer_side(peer_python, files, one_run=True, counts=()):
  """The peer's one-run bounds per score file (None without the peer interpreter)."""
  if not peer_python or not os.path.exists(peer_python):
    return None, None
  with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
    json.dump({"significance": ALPHA if one_run else SHARE_ALPHA, "delta": DELTA,
               "files": files, "one_run": one_run, "counts": list(counts)}, f)
  out = subprocess.run([peer_python, os.path.join(REPO, "benchmarks",
                                                  "peer_jax_privacy_audit.py"), f.name],
                       capture_output=True, text=True, timeout=3600, check=True)
  os.unlink(f.name)
  lines = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
  by_file = {e["file"]: e for e in lines[1:] if "file" in e}
  by_file.update({tuple(e["counts"]): e for e in lines[1:] if "counts" in e})
  return by_file, lines[0]


def table(results, peer, info, command, elapsed):
  load = os.getloadavg()[0]
  lines = ["## One-run auditing: tff-mf against jax_privacy's `CanaryScoreAuditor`", "",
           f"Command: `{command}` ({elapsed / 60:.1f} min, load average {load:.1f}). "
           f"Machine: {platform.machine()}, Python {platform.python_version()}, "
           f"numpy {np.__version__}.", ""]
  if info:
    lines += [f"Peer: jax_privacy {info.get('version', '?')} ({PEER_SOURCE}), "
              "`jax_privacy/auditing.py`, run by `benchmarks/peer_jax_privacy_audit.py` in a "
              "benchmark-only interpreter.", ""]
  lines += [f"m canaries, each included with probability 1/2, scores N(μ, 1) if included, "
            f"N(0, 1) if not; {len(next(iter(results.values()))['runs'])} draws per row, the same scores on both sides; "
            f"confidence {1 - ALPHA:g}, δ = {DELTA:g}. Means over the draws; "
            "'ours ≥ peer' counts draws.", "",
            "| μ | m | true ε | ours: Thm 3.1 (k_in, k_out) | peer: `epsilon_one_run` | "
            "ours: f-DP (ε, δ) curve | ours: f-DP GDP, ε of μ (k_in, k_out) | "
            "peer: `epsilon_one_run_fdp` | ours ≥ peer (Thm 3.1; f-DP) | "
            "seconds ours / peer per draw |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
  for (mu, m), r in results.items():
    runs = r["runs"]
    mean = lambda k: float(np.mean([x[k] for x in runs]))  # pylint: disable=cell-var-from-loop
    p = [peer[x["file"]] for x in runs] if peer else None
    if p and all("error" not in e for e in p):
      p1, p2 = np.mean([e["one_run"] for e in p]), np.mean([e["one_run_fdp"] for e in p])
      w1 = sum(x["snj"] >= e["one_run"] - 1e-6 for x, e in zip(runs, p))
      w2 = sum(x["fdp_gdp"] >= e["one_run_fdp"] - 1e-6 for x, e in zip(runs, p))
      peer_cols = (f"{p1:.3f}", f"{p2:.3f}", f"{w1} / {w2} of {len(runs)}",
                   f"{mean('seconds'):.2f} / {np.mean([e['seconds'] for e in p]):.2f}")
    else:
      peer_cols = ("—", "—", "—", f"{mean('seconds'):.2f} / —")
    lines.append(f"| {mu:g} | {m} | {audit_lib.gdp_epsilon(mu, DELTA):.3f} | "
                 f"{mean('snj'):.3f} {tuple(r['plan_eps'])} | {peer_cols[0]} | "
                 f"{mean('fdp_eps_delta'):.3f} | {mean('fdp_gdp'):.3f} {tuple(r['plan_mu'])} | "
                 f"{peer_cols[1]} | {peer_cols[2]} | {peer_cols[3]} |")
  if peer:
    diffs = [(abs(audit_lib.one_run_epsilon(m, g, c, ALPHA, DELTA) - e["one_run"]),
              abs(audit_lib.gdp_epsilon(audit_lib.one_run_mu(m, g, c, ALPHA), DELTA)
                  - e["one_run_fdp"]))
             for (m, g, c), e in ((k, v) for k, v in peer.items() if isinstance(k, tuple))]
    frontier = [peer[x["file"]]["frontier_thresholds"] for r in results.values()
                for x in r["runs"]]
    lines += ["", f"The formulas alone, on the same counts (m, guesses, right) of all "
              f"{len(diffs)} distinct draws above: ours and the peer's Thm 3.1 bound differ by "
              f"at most {max(d[0] for d in diffs):.1e} in ε, the f-DP GDP bound (our "
              f"`one_run_mu`, as ε(δ)) and `_epsilon_one_run_fdp` by at most "
              f"{max(d[1] for d in diffs):.1e} (both sides' root-finding tolerances). "
              "The gap in the table is in how the guesses are made and paid for: ours guesses "
              "in both directions with counts planned on a model before the scores exist, "
              "and spends all of α on that one test; the peer guesses one direction, tries "
              "every threshold on the observed scores' ROC frontier and divides α by their "
              f"number ({min(frontier)}-{max(frontier)} here, counted after seeing the "
              "scores)."]
    losses = [(mu, m) for (mu, m), r in results.items() for x in r["runs"]
              if x["snj"] < peer[x["file"]]["one_run"] - 1e-6
              or x["fdp_gdp"] < peer[x["file"]]["one_run_fdp"] - 1e-6]
    if losses:
      lines[-1] += (f" The peer's is larger in {len(losses)} of "
                    f"{sum(len(r['runs']) for r in results.values())} draws (at (μ, m) = "
                    f"{', '.join(f'({a:g}, {b})' for a, b in sorted(set(losses)))}): there the "
                    "planned counts are few and the best threshold of those scores, which the "
                    "peer finds after seeing them, beats the plan.")
  return "\n".join(lines) + "\n"


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--peer-python", default="/tmp/peer-audit/bin/python",
                      help="interpreter with jax_privacy's newest source (skipped if absent)")
  parser.add_argument("--out-dir", default=os.path.join(REPO, "benchmarks", "results"))
  parser.add_argument("--smoke", action="store_true", help="one small configuration, no peer")
  args = parser.parse_args(argv)
  configs, draws = (((2.0, 200),), 2) if args.smoke else (CONFIGS, DRAWS)
  start = time.perf_counter()
  results, files = {}, []
  with tempfile.TemporaryDirectory() as tmp:
    for mu, m in configs:
      r = our_side(mu, m, draws, SEED)
      for i, x in enumerate(r["runs"]):
        x["file"] = os.path.join(tmp, f"one_run_mu{mu:g}_m{m}_{i}.npz")
        np.savez(x["file"], held_in=x["scores"][x["included"]],
                 out=x["scores"][~x["included"]])
        files.append(x["file"])
      results[(mu, m)] = r
      print(f"[one-run] mu {mu:g} m {m}: ours done", file=sys.stderr, flush=True)
    counts = sorted({x["counts"] for r in results.values() for x in r["runs"]})
    peer, info = (None, None) if args.smoke else peer_side(args.peer_python, files,
                                                           counts=counts)
    shares = share_side(*(((2.0,), 1, 256) if args.smoke else (SHARE_MUS, SHARE_DRAWS,
                                                               SHARE_TRIALS)), tmp)
    print("[one-run] multi-run shares: ours done", file=sys.stderr, flush=True)
    share_peer = None if args.smoke else peer_side(args.peer_python, [r["file"] for r in shares],
                                                   one_run=False)[0]
  command = "python benchmarks/bench_one_run_audit.py" + (
      " --smoke" if args.smoke else f" --peer-python {args.peer_python}")
  text = table(results, peer, info, command, time.perf_counter() - start) + share_table(
      shares, share_peer)
  os.makedirs(args.out_dir, exist_ok=True)
  with open(os.path.join(args.out_dir, "one_run_audit.md"), "w", encoding="utf-8") as f:
    f.write(text)
  print(text)


if __name__ == "__main__":
  main()
