"""Square-root and banded-inverse families: tff-mf against jax_privacy's newest source.

Prefix sums S, n ∈ {512, 1024, 2048}; k ∈ {4, 8} participations at least n/k rounds
apart (b-min-sep, Choquette-Choo et al. 2023, arXiv:2306.08153); b ∈ {1, 2, 16, 64, 256}
bands of C or taps of C⁻¹ with b ≤ n/k. Pairs, each side scored by tff-mf's evaluation (``toeplitz_ops``: rmse =
sens·‖S·C⁻¹‖_F/√n, max error = sens·max_i ‖(S·C⁻¹)[i, :]‖, the sensitivity recomputed
from each side's C under the same schema):

- BISR (Kalinin, Lampert et al. 2025, arXiv:2505.12128), C⁻¹ = the first b taps of
  S^{−1/2}: ``square_root.bisr_taps`` vs ``toeplitz.banded_inverse_square_root_noising_coefs``;
- BandInvMF (same paper), the b taps of C⁻¹ optimized for the schema:
  ``square_root.optimize_banded_inverse_taps`` vs ``toeplitz.optimize_banded_inverse_toeplitz``;
- DP-λCGD (Kalinin, McKenna, Pagh, Lampert 2026, arXiv:2601.22334), C⁻¹ = I − λ·shift:
  ``square_root.optimal_lambda`` vs jax_privacy's BandInvMF with 2 taps (it has no λCGD);
- BSR (Kalinin & Lampert 2024, arXiv:2405.13763), C = the first b taps of S^{1/2}:
  ``square_root.series_sqrt`` vs ``toeplitz.optimal_max_error_strategy_coefs(b)``;
- banded Toeplitz and BLT on the configurations ``bench_multi_participation.py`` lacks
  (as there: ``toeplitz.optimize`` vs ``optimize_banded_toeplitz``, ``blt.optimize`` with
  jax_privacy's number of buffers vs ``buffered_toeplitz.optimize``).

jax_privacy runs in a separate benchmark-only interpreter through
``benchmarks/peer_jax_privacy.py``, one process per call of this script, each stopped at
``--peer-budget`` seconds (< 10 min): ``--peer-only`` runs the pending peer tasks of a shard
and appends their outputs (small arrays) to ``<out-dir>/square_root_peer.jsonl``; call it
until nothing is pending. A task still running when its process is stopped at the budget
is retried by the next call unless it ran for the whole budget (then it is recorded as
not finished). The assembly run computes tff-mf's side and writes
``<out-dir>/square_root.{md,json}``:

  nice -n 10 .venv/bin/python benchmarks/bench_square_root.py --peer-only --until-done
  nice -n 10 .venv/bin/python benchmarks/bench_square_root.py --peer-only --shard 0/2  # one process
  nice -n 10 .venv/bin/python benchmarks/bench_square_root.py       # ours + the table
  .venv/bin/python benchmarks/bench_square_root.py --smoke --out-dir /tmp/x  # seconds
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir))

from tff_mf import participation  # pylint: disable=g-import-not-at-top,wrong-import-position
from tff_mf.factorization import toeplitz_ops  # pylint: disable=g-import-not-at-top,wrong-import-position
from tff_mf.participation import toeplitz_bounds  # pylint: disable=g-import-not-at-top,wrong-import-position
from tff_mf.factorization.families import blt  # pylint: disable=g-import-not-at-top,wrong-import-position
from tff_mf.factorization.families import square_root  # pylint: disable=g-import-not-at-top,wrong-import-position
from tff_mf.factorization.families import toeplitz  # pylint: disable=g-import-not-at-top,wrong-import-position

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results")
DEFAULT_PEER_PYTHON = "/tmp/peer24/bin/python"
PEER_VERSION = "jax_privacy 2.3.0.dev0 (newest source, commit 8967688c26d4 of 2026-08-20)"


def _multi_participation():
  """bench_multi_participation.py (its machine line and table formatting)."""
  spec = importlib.util.spec_from_file_location(
      "bench_multi_participation", os.path.join(HERE, "bench_multi_participation.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


MP = _multi_participation()
score_inverse_taps = MP.score_inverse_taps


def _log(msg: str) -> None:
  print(f"[square_root] {msg}", file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------- grid


def grid(smoke: bool):
  """(n, k, min_sep, bands) configurations; min_sep = n/k, bands ≤ min_sep."""
  if smoke:
    return [(32, 4, 8, b) for b in (1, 2, 8)]
  out = []
  for n, bands in ((512, (1, 2, 16, 64)), (1024, (1, 2, 16, 64, 256)),
                   (2048, (1, 2, 16, 64, 256))):
    for k in (4, 8):
      out += [(n, k, n // k, b) for b in bands if b <= n // k]
  return out


# Configurations bench_multi_participation.py's table already holds for banded Toeplitz
# (n, bands = min_sep) and BLT (n, min_sep, k).
IN_MULTI_PARTICIPATION_TOEPLITZ = {(n, b) for n in (512, 1024) for b in (32, 64, 128)}
IN_MULTI_PARTICIPATION_BLT = {(n, b, k) for n in (512, 1024) for b in (32, 64, 128)
                              for k in (4, 8)}


def peer_tasks(configs) -> List[Dict[str, Any]]:
  """Peer tasks in priority order (cheap closed forms first, then the optimizers)."""
  tasks, seen = [], set()

  def add(task):
    if task["id"] not in seen:
      seen.add(task["id"])
      tasks.append(task)

  for _, _, _, b in configs:
    add({"id": f"bisr_b{b}", "kind": "bisr", "n": b, "bands": b})
    add({"id": f"bsr_b{b}", "kind": "bsr", "n": b, "bands": b})
  # n = 2048 last: under load one such jax_privacy call can outlast a process's budget.
  for n, k, sep, b in sorted(configs, key=lambda c: (c[0] > 1024, c[0], -c[1], c[3])):
    if b > 1:  # one tap is C = I on both sides
      add({"id": f"binv_n{n}_k{k}_b{b}", "kind": "banded_inverse", "n": n, "min_sep": sep,
           "bands": b, "max_participations": k})
  for n, k, sep, b in configs:
    if b > 1 and (n, b) not in IN_MULTI_PARTICIPATION_TOEPLITZ:
      add({"id": f"toep_n{n}_b{b}", "kind": "banded_toeplitz", "n": n, "bands": b})
  for n, k, sep, _ in configs:
    if (n, sep, k) not in IN_MULTI_PARTICIPATION_BLT:
      add({"id": f"blt_n{n}_k{k}", "kind": "blt", "n": n, "min_sep": sep,
           "max_participations": k, "error": "mean"})
  return tasks


# ----------------------------------------------------------------------------- peer runs


def load_peer(path: str) -> Dict[str, Dict[str, Any]]:
  out = {}
  if os.path.exists(path):
    with open(path, encoding="utf-8") as f:
      for line in f:
        if line.startswith("{"):
          entry = json.loads(line)
          out[entry["id"]] = entry
  return out


def run_peer_chunk(peer_python: str, tasks, budget_s: float, path: str) -> int:
  """Runs the tasks in one peer process stopped at ``budget_s``; appends finished ones
  (and a first task that ran for the whole budget, as not finished) to ``path``.
  Returns the number of entries written."""
  with tempfile.TemporaryDirectory() as tmp:
    lines, stopped = MP.peer_process(peer_python, tasks, budget_s, tmp)
    jax_version = lines[0].get("jax", "?") if lines else "?"
    entries = []
    for entry in lines[1:]:
      if "error" not in entry:
        with np.load(os.path.join(tmp, f"{entry['id']}.npz")) as data:
          entry["arrays"] = {key: data[key].tolist() for key in data.files}
      entries.append(dict(entry, jax=jax_version))
    if stopped and not entries:
      entries.append({"id": tasks[0]["id"], "jax": jax_version,
                      "error": f"not finished within one process's {budget_s:.0f} s budget"})
  with open(path, "a", encoding="utf-8") as f:
    for entry in entries:
      f.write(json.dumps(entry) + "\n")
  return len(entries)


# ----------------------------------------------------------------------------- scoring


def _timed(fn, *args, **kwargs):
  start, cpu = time.perf_counter(), time.process_time()
  value = fn(*args, **kwargs)
  return value, time.perf_counter() - start, time.process_time() - cpu


def run(args) -> Dict[str, Any]:
  configs = grid(args.smoke)
  peer = load_peer(os.path.join(args.out_dir, "square_root_peer.jsonl"))
  rows = []

  def theirs(task_id, score):
    entry = peer.get(task_id)
    if entry is None:
      return None, "not run (the jax_privacy side was stopped before this task)"
    if "error" in entry:
      return None, entry["error"]
    out = dict(score({key: np.asarray(v) for key, v in entry["arrays"].items()}),
               seconds=entry["seconds"], cpu_seconds=entry["cpu_seconds"])
    return out, ""

  def add(pair, config, ours, other, note, detail_ours, detail_theirs):
    ours = dict(ours, detail=detail_ours)
    if other is not None:
      other = dict(other, detail=detail_theirs)
    rows.append(MP._row(pair, config, ours, other, note))  # pylint: disable=protected-access

  blt_cache: Dict[Any, Any] = {}
  toep_cache: Dict[Any, Any] = {}
  for n, k, sep, b in configs:
    column = np.ones(n)
    schema = participation.min_sep(sep, k)
    config = {"n": n, "k": k, "min_sep": sep, "bands": b,
              "k_effective": toeplitz_bounds.participations(n, sep, k)[1]}
    taps, wall, cpu = _timed(square_root.bisr_taps, column, b)
    ours = dict(score_inverse_taps(taps, n, sep, k), seconds=wall, cpu_seconds=cpu)
    other, note = theirs(f"bisr_b{b}", lambda a: score_inverse_taps(a["taps"], n, sep, k))
    taps_text, bands_text = (f"{b} tap{'s' * (b > 1)} of C⁻¹", f"{b} band{'s' * (b > 1)} of C")
    add("BISR", config, ours, other, note, taps_text, taps_text)

    (taps, info), wall, cpu = _timed(square_root.optimize_banded_inverse_taps, column, b, schema)
    ours = dict(score_inverse_taps(taps, n, sep, k), seconds=wall, cpu_seconds=cpu)
    if b == 1:
      add("BandInvMF", config, ours, None, "one tap: C = I on both sides (DP-SGD), nothing "
          "to optimize", "C = I", "—")
    else:
      other, note = theirs(f"binv_n{n}_k{k}_b{b}",
                           lambda a: score_inverse_taps(a["taps"], n, sep, k))
      add("BandInvMF", config, ours, other, note,
          f"{b} taps, {info['iterations']} it., from {info['start']}"
          + (", then Nelder-Mead" if "Nelder" in info["optimizer"] else ""),
          f"{b} taps, 1000 steps")
    if b == 2:
      search, wall, cpu = _timed(square_root.optimal_lambda, column, schema)
      lam = float(search.x)
      ours = dict(score_inverse_taps([1.0, -lam], n, sep, k), seconds=wall, cpu_seconds=cpu)
      other, note = theirs(f"binv_n{n}_k{k}_b{b}",
                           lambda a: score_inverse_taps(a["taps"], n, sep, k))
      add("λCGD (theirs: BandInvMF, 2 taps)", config, ours, other, note, f"λ = {lam:.4f}",
          "2 taps, 1000 steps")

    coeffs, wall, cpu = _timed(lambda m: square_root.series_sqrt(column[:m]), b)
    ours = dict(toeplitz_ops.evaluate(coeffs, n, None, sep, k), seconds=wall, cpu_seconds=cpu)
    other, note = theirs(f"bsr_b{b}", lambda a: toeplitz_ops.evaluate(
        np.asarray(a["coefficients"]), n, None, sep, k))
    add("BSR", config, ours, other, note, bands_text, bands_text)

    if b > 1 and (n, b) not in IN_MULTI_PARTICIPATION_TOEPLITZ:
      result, wall, cpu = _timed(toeplitz.optimize, n, b, min_sep=sep, max_participations=k,
                                 dense=False)
      ours = dict(result.info, seconds=wall, cpu_seconds=cpu)
      other, note = theirs(f"toep_n{n}_b{b}", lambda a: toeplitz_ops.evaluate(
          np.asarray(a["coefficients"]), n, None, sep, k))
      add("banded Toeplitz", config, ours, other, note, f"{b} bands", f"{b} bands")
      toep_cache[(n, k, b)] = ours["rmse"]

    if (n, sep, k) not in IN_MULTI_PARTICIPATION_BLT and (n, k) not in blt_cache:
      other, note = theirs(f"blt_n{n}_k{k}", lambda a: blt.evaluate(
          blt.BLT(np.asarray(a["theta"]), np.asarray(a["omega"])), n, None, sep, k))
      m = 2
      if other is not None:
        m = blt.BLT(np.asarray(peer[f"blt_n{n}_k{k}"]["arrays"]["theta"]),
                    np.asarray(peer[f"blt_n{n}_k{k}"]["arrays"]["omega"])).buffers
      result, wall, cpu = _timed(blt.optimize, n, m, min_sep=sep, max_participations=k,
                                 dense=False)
      blt_config = dict(config, bands="—")
      add("BLT, jax_privacy's buffers", blt_config, dict(result.info, seconds=wall,
                                                         cpu_seconds=cpu),
          other, note, f"{m} buffers" + ("" if other else " (jax_privacy's count unknown)"),
          f"{m} buffers" if other else "—")
      blt_cache[(n, k)] = result.info["rmse"]
    _log(f"n={n} k={k} b={b}: {len(rows)} rows")
  return {"rows": rows, "configs": configs}


# ----------------------------------------------------------------------------- output


def write_markdown(result, path, command, load_before, load_after, total_seconds, peer):
  fmt, secs = MP._fmt, MP._secs  # pylint: disable=protected-access
  jax_versions = sorted({e.get("jax", "?") for e in peer.values()})
  peer_seconds = sum(e.get("seconds", 0.0) for e in peer.values())
  lines = ["## Square-root and banded-inverse families: tff-mf vs jax_privacy", "",
           f"Command: `{command}` (tff-mf's side and the table; the jax_privacy side ran "
           "before, in processes of < 10 min each, up to three at a time, at a load average of "
           "10-19 (its wall seconds about 7× its CPU seconds), the last rounds at 5-8: `nice -n 10 "
           ".venv/bin/python benchmarks/bench_square_root.py --peer-only --shard i/2`, later "
           "`--kinds banded_inverse --shard i/2` (i = 0, 1) and `--kinds banded_toeplitz,blt`, "
           "each repeated, then stopped for time; its outputs are in "
           "`benchmarks/results/square_root_peer.jsonl`; `--peer-only --until-done` runs them "
           "all).", "",
           f"Machine: {MP.MACHINE} ({platform.processor() or platform.machine()}, Python "
           f"{platform.python_version()}, numpy {np.__version__}). Load average (1 min) at "
           f"start / end of the assembly run: {load_before:.1f} / {load_after:.1f}; it took "
           f"{total_seconds / 60:.1f} min. Peer: {PEER_VERSION}, jax {', '.join(jax_versions)}, "
           f"x64, CPU, {len(peer)} task(s), {peer_seconds / 60:.1f} min of calls.", "",
           "Workload: prefix sums S. Schema: k participations at least n/k rounds apart "
           "(min-sep n/k; the banded C and C⁻¹ have b ≤ n/k taps). Both sides are scored by "
           "tff-mf's evaluation (`toeplitz_ops`): rmse = sens·‖S·C⁻¹‖_F/√n, max error = "
           "sens·max_i ‖(S·C⁻¹)[i, :]‖, sensitivity recomputed from each side's C under the "
           "same schema (exact where marked: C's coefficients non-negative and "
           "non-increasing, or b ≤ the separation for a banded C). Ratios are ours / theirs "
           "(< 1: ours better). Seconds are wall (CPU) of one call each (jax_privacy's include "
           "jax compilation for a new shape; neither side builds dense matrices). BandInvMF: "
           "ours is L-BFGS-B on log rmse² with the closed-form gradient, restarted until a "
           "run stalls, from BISR's and λCGD's taps "
           "(`square_root.optimize_banded_inverse_taps`; `it.` counts all runs' iterations); theirs is "
           "`optimize_banded_inverse_toeplitz(n, min_sep, b, max_participations=k)`, 1000 "
           "L-BFGS steps from BISR. jax_privacy has no λCGD: its BandInvMF with 2 taps is the "
           "same family. BSR's peer is `optimal_max_error_strategy_coefs(b)` (the first b "
           "coefficients of S^{1/2}) taken as a banded Toeplitz C. Banded Toeplitz and BLT "
           "rows are only the configurations `bench_multi_participation.py`'s table lacks; "
           "BLT does not depend on b (one row per (n, k)).", "",
           "| pair | n | k (eff) | sep | b | ours rmse | theirs rmse | rmse ratio | "
           "ours max err | theirs max err | ours s (CPU) | theirs s (CPU) | ours | theirs | "
           "exact sens |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
  for r in result["rows"]:
    exact = all(r.get(f"{s}_sensitivity_exact", True) is not False for s in ("ours", "theirs"))
    lines.append(
        f"| {r['pair']} | {r['n']} | {r['k']} ({r['k_effective']}) | {r['min_sep']} | "
        f"{r['bands']} | {fmt(r.get('ours_rmse'))} | {fmt(r.get('theirs_rmse'))} | "
        f"{fmt(r.get('rmse_ratio'), 6)} | {fmt(r.get('ours_max_error'))} | "
        f"{fmt(r.get('theirs_max_error'))} | {secs(r, 'ours')} | {secs(r, 'theirs')} | "
        f"{r.get('ours_detail') or '—'} | {r.get('theirs_detail') or '—'} | "
        f"{'yes' if exact else 'upper bound'} |")
  lines.append("")
  notes = sorted({f"{r['pair']}, n = {r['n']}, k = {r['k']}, b = {r['bands']}: {r['note']}"
                  for r in result["rows"] if r.get("note")})
  if notes:
    lines += ["Without a jax_privacy side:", ""] + [f"- {note}" for note in notes] + [""]
  lines += MP.summary_lines(result["rows"])
  cpu = [r["theirs_cpu_seconds"] / r["ours_cpu_seconds"] for r in result["rows"]
         if r["pair"] == "BandInvMF" and r.get("theirs_cpu_seconds") and r.get("ours_cpu_seconds")]
  if cpu:
    lines.append(f"- BandInvMF, CPU seconds theirs/ours: from {min(cpu):.3g} to {max(cpu):.3g}, "
                 f"median {float(np.median(cpu)):.3g} (the two sides ran at different loads: "
                 "CPU time is the fairer speed ratio).")
  lines += ["", "Banded Toeplitz with 2 bands at n ≥ 1024: this benchmark found our "
            "optimizer stuck at its √S start (rmse ratio 1.05: L-BFGS-B's first step landed "
            "where C⁻¹ blows up, its line search gave up, and scipy reported convergence). "
            "`toeplitz.optimize` now restarts without gradient steps when L-BFGS-B made no "
            "decrease from its start (solver version banded_toeplitz-2); the rows above are "
            "after that fix.", ""]
  lines.append("")
  with open(path, "w", encoding="utf-8") as f:
    f.write("\n".join(lines))


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--peer-only", action="store_true",
                      help="run pending jax_privacy tasks (one process, --peer-budget) and exit")
  parser.add_argument("--shard", default="0/1", help="i/m: this call's share of the peer tasks")
  parser.add_argument("--kinds", default=None,
                      help="with --peer-only: only these task kinds (comma-separated, e.g. "
                           "banded_toeplitz,blt)")
  parser.add_argument("--reverse", action="store_true",
                      help="with --peer-only: take the pending tasks last first (a helper "
                           "process beside the shards: BLT and banded Toeplitz first)")
  parser.add_argument("--until-done", action="store_true",
                      help="with --peer-only: start peer processes (each stopped at "
                           "--peer-budget) until nothing is pending")
  parser.add_argument("--peer-python", default=os.environ.get("TFF_MF_PEER_PYTHON",
                                                              DEFAULT_PEER_PYTHON))
  parser.add_argument("--peer-budget", type=float, default=540.0,
                      help="seconds of one peer process (default 540)")
  parser.add_argument("--smoke", action="store_true", help="n = 32, our side only (seconds)")
  parser.add_argument("--out-dir", default=RESULTS)
  args = parser.parse_args(argv)
  os.makedirs(args.out_dir, exist_ok=True)
  peer_path = os.path.join(args.out_dir, "square_root_peer.jsonl")
  if args.peer_only:
    index, count = (int(x) for x in args.shard.split("/"))
    done = load_peer(peer_path)
    kinds = args.kinds.split(",") if args.kinds else None
    tasks = [t for t in peer_tasks(grid(args.smoke)) if kinds is None or t["kind"] in kinds]
    pending = [t for i, t in enumerate(tasks) if i % count == index and t["id"] not in done]
    if args.reverse:
      pending.reverse()
    if not pending:
      _log("peer: nothing pending")
      return 0
    if not os.path.exists(args.peer_python):
      print(f"error: peer interpreter {args.peer_python} not found", file=sys.stderr)
      return 1
    while pending:
      written = run_peer_chunk(args.peer_python, pending, args.peer_budget, peer_path)
      _log(f"peer: {written} of {len(pending)} pending task(s) recorded")
      done = load_peer(peer_path)
      pending = [t for t in pending if t["id"] not in done] if args.until_done else []
    return 0
  command = "nice -n 10 .venv/bin/python benchmarks/bench_square_root.py" + (
      " " + " ".join(argv if argv is not None else sys.argv[1:])
      if (argv if argv is not None else sys.argv[1:]) else "")
  start, load_before = time.perf_counter(), os.getloadavg()[0]
  result = run(args)
  load_after, total = os.getloadavg()[0], time.perf_counter() - start
  with open(os.path.join(args.out_dir, "square_root.json"), "w", encoding="utf-8") as f:
    json.dump(dict(result, machine=MP.MACHINE, load=[load_before, load_after], seconds=total,
                   peer=PEER_VERSION), f, indent=1, default=float)
  md = os.path.join(args.out_dir, "square_root.md")
  write_markdown(result, md, command, load_before, load_after, total, load_peer(peer_path))
  _log(f"wrote {md} in {total / 60:.1f} min")
  return 0


if __name__ == "__main__":
  sys.exit(main())
