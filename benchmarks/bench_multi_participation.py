"""Multi-participation strategies: tff-mf against jax_privacy on the same configurations.

Prefix sums S, n ∈ {512, 1024}; k participations at least b rounds apart (b-min-sep,
Choquette-Choo et al. 2023, arXiv:2306.08153) with b ∈ {32, 64, 128}, or k epochs of
n/k rounds (fixed epoch, Choquette-Choo et al. 2023, arXiv:2211.06530). Pairs:

- banded Toeplitz (McKenna 2024, arXiv:2405.15913): ``tff_mf.factorization.families.toeplitz.optimize``
  (b bands, optimized under the min-sep schema) vs jax_privacy
  ``toeplitz.optimize_banded_toeplitz(n, b)``;
- BLT (Dvijotham et al. 2024, arXiv:2404.16706; McMahan, Xu, Zhang 2024,
  arXiv:2408.08868): ``tff_mf.factorization.families.blt.optimize`` with the number of buffers
  jax_privacy chose, and ``blt.optimize_buffers`` (our own choice), vs jax_privacy
  ``buffered_toeplitz.optimize(n=, min_sep=, max_participations=, error='mean')``;
- optimal fixed-epoch (``tff_mf.factorization.dense_fixed_epoch.solve_fixed_epoch``, certified duality gap)
  vs jax_privacy ``dense.optimize(n, epochs=k)``;
- banded (``tff_mf.factorization.families.banded.optimize``, b bands, unit columns; with b ≤ the
  separation the min-sep sensitivity is that of single participation times √k, so both
  optimize the same objective) vs jax_privacy ``banded.optimize(n, bands=b)``.

Every rmse = sens·‖B‖_F/√n and max_error = sens·max_i ‖B[i, :]‖ is computed by tff-mf's
own evaluation code for both sides: from their C (or its Toeplitz / BLT parameters),
B = S·C⁻¹ and the sensitivity under the same schema. jax_privacy runs in a separate
benchmark-only interpreter (``--peer-python``, default /tmp/peer/bin/python, x64 enabled)
through ``benchmarks/peer_jax_privacy.py``; it is no dependency of tff-mf. Each pair
reports the rmse ratio (ours / theirs, target ≤ 1) and the time ratio (theirs / ours, one
call each). Also plots rmse against k at fixed n for the binary tree, banded Toeplitz,
BLT, banded and tff-mf's optimal fixed-epoch strategy. Writes
``benchmarks/results/multi_participation.{md,png,json}``.

  nice -n 10 .venv/bin/python benchmarks/bench_multi_participation.py          # about 1 h
  nice -n 10 .venv/bin/python benchmarks/bench_multi_participation.py --quick  # a few min
  .venv/bin/python benchmarks/bench_multi_participation.py --smoke --out-dir /tmp/x  # seconds
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir))

from tff_mf.factorization import dense_fixed_epoch  # pylint: disable=g-import-not-at-top,wrong-import-position
from tff_mf import participation  # pylint: disable=g-import-not-at-top,wrong-import-position
from tff_mf.factorization import toeplitz_ops  # pylint: disable=g-import-not-at-top,wrong-import-position
from tff_mf.participation import toeplitz_bounds  # pylint: disable=g-import-not-at-top,wrong-import-position
from tff_mf.factorization import workloads  # pylint: disable=g-import-not-at-top,wrong-import-position
from tff_mf.factorization.families import banded  # pylint: disable=g-import-not-at-top,wrong-import-position
from tff_mf.factorization.families import blt  # pylint: disable=g-import-not-at-top,wrong-import-position
from tff_mf.factorization.families import square_root  # pylint: disable=g-import-not-at-top,wrong-import-position
from tff_mf.factorization.families import toeplitz  # pylint: disable=g-import-not-at-top,wrong-import-position
from tff_mf.factorization.families import tree  # pylint: disable=g-import-not-at-top,wrong-import-position

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
MACHINE = "2-core x86_64 CPU, 24 GB, no GPU (shared with other jobs)"
PEER_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "peer_jax_privacy.py")


def _log(msg: str) -> None:
  print(f"[multi_participation] {msg}", file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------- evaluation


def _pattern_weight_max(weights: np.ndarray, min_sep: int, k: int) -> float:
  """max over ≤ k indices pairwise ≥ min_sep apart of Σ weights (dynamic program, O(n·k))."""
  n = weights.shape[0]
  best = np.zeros((k + 1, n + 1))  # best[t][i]: t picks among indices < i
  for t in range(1, k + 1):
    for i in range(1, n + 1):
      take = weights[i - 1] + best[t - 1][max(0, i - min_sep)]
      best[t][i] = max(best[t][i - 1], take)
  return float(best[k][n])


def sensitivity_dense(c: np.ndarray, schema: Dict[str, Any]) -> Dict[str, Any]:
  """Sensitivity of a dense C under the schema, by our own code.

  fixed_epoch (k epochs of b = n/k rounds): max_j Σ_{p,q} |X[j+pb, j+qb]| (X = CᵀC), exact
  when those entries are ≥ 0 (Choquette-Choo et al. 2023, arXiv:2211.06530).
  min_sep with a banded C whose band width is ≤ min_sep: columns of a pattern are disjoint,
  so sens² = the best pattern's Σ column norms² (exact).
  """
  x = c.T @ c
  n = c.shape[1]
  if schema["kind"] == "fixed_epoch":
    k = schema["k"]
    b = n // k
    best, exact = 0.0, True
    for j in range(b):
      idx = j + b * np.arange(k)
      sub = x[np.ix_(idx, idx)]
      exact = exact and bool(np.all(sub >= -1e-12 * np.max(np.abs(sub))))
      best = max(best, float(np.sum(np.abs(sub))))
    return {"sensitivity": math.sqrt(best), "sensitivity_exact": exact}
  min_sep, k = toeplitz_bounds.participations(n, schema["min_sep"], schema["k"])
  rows, cols = np.nonzero(np.abs(c) > 1e-15 * np.max(np.abs(c)))
  # Columns at least `width` apart have disjoint supports.
  width = int(np.max(rows - cols)) + int(np.max(cols - rows)) + 1
  if width > min_sep:
    raise ValueError(f"dense min-sep sensitivity needs a band width ≤ min_sep "
                     f"({width} > {min_sep})")
  value = _pattern_weight_max(np.diag(x).copy(), min_sep, k)
  return {"sensitivity": math.sqrt(value), "sensitivity_exact": True}


def evaluate_dense(c: np.ndarray, schema: Dict[str, Any]) -> Dict[str, Any]:
  """rmse and max_error of C on S (B = S·C⁻¹) under the schema."""
  n = c.shape[0]
  b = np.linalg.solve(c.T, workloads.prefix_sum(n).T).T
  sens = sensitivity_dense(c, schema)
  rows = np.sum(b * b, axis=1)
  return {"rmse": sens["sensitivity"] * math.sqrt(np.sum(rows) / n),
          "max_error": sens["sensitivity"] * math.sqrt(np.max(rows)), **sens}


def _schema(kind: str, k: int, min_sep: Optional[int] = None) -> Dict[str, Any]:
  return {"kind": kind, "k": k, "min_sep": min_sep}


def tree_rmse(n: int, k: int) -> Dict[str, Any]:
  """Binary tree C_T with the streaming Honaker decoder, k epochs of n/k rounds."""
  c = tree.tree_encoder(n)
  b = tree.honaker_online_decoder(n)
  sens = sensitivity_dense(c, _schema("fixed_epoch", k))
  rows = np.sum(b * b, axis=1)
  return {"rmse": sens["sensitivity"] * math.sqrt(np.sum(rows) / n),
          "max_error": sens["sensitivity"] * math.sqrt(np.max(rows)), **sens}


def score_inverse_taps(taps, n: int, min_sep: Optional[int], k: int) -> Dict[str, Any]:
  """rmse, max error and sensitivity of the Toeplitz C whose C⁻¹ has the taps h (C = T(1/h))."""
  h = toeplitz_bounds.padded(np.asarray(taps, dtype=np.float64), n)
  c = toeplitz_ops.inverse_column(h, n)
  sens = toeplitz_bounds.min_sep_sensitivity(c, n, min_sep, k)
  out = toeplitz_ops.evaluate_inverse_column(h, sens, toeplitz_ops.workload_operator(n))
  out["sensitivity_exact"] = toeplitz_bounds.sensitivity_is_exact(c, n, min_sep, k)
  return out


def square_root_rmse(n: int, bands: int, min_sep: int, k: int) -> Dict[str, float]:
  """rmse of tff-mf's BSR, BISR and BandInvMF with ``bands`` taps, and of λCGD, under
  k participations ``min_sep`` apart (prefix sums; no dense matrices)."""
  column = np.ones(n)
  schema = participation.min_sep(min_sep, k)
  taps, _ = square_root.optimize_banded_inverse_taps(column, bands, schema)
  lam = float(square_root.optimal_lambda(column, schema).x)
  return {
      "BSR": toeplitz_ops.evaluate(square_root.series_sqrt(column[:bands]), n, None, min_sep,
                                   k)["rmse"],
      "BISR": score_inverse_taps(square_root.bisr_taps(column, bands), n, min_sep, k)["rmse"],
      "BandInvMF": score_inverse_taps(taps, n, min_sep, k)["rmse"],
      "λCGD": score_inverse_taps([1.0, -lam], n, min_sep, k)["rmse"],
  }


def bands_figure(n: int, k: int) -> Dict[str, Any]:
  """rmse against the noise memory at n rounds, k participations n/k apart: b − 1 rows of Z
  for b bands of C or taps of C⁻¹ (b = 1, 2, 4, …, n/k), m for BLT with m buffers."""
  sep = n // k
  bands = [2 ** j for j in range(int(np.log2(sep)) + 1)]
  curves: Dict[str, List[float]] = {}
  for b in bands:
    values = square_root_rmse(n, b, sep, k)
    for name in ("BSR", "BISR", "BandInvMF"):
      curves.setdefault(f"{name} (b bands of {'C' if name == 'BSR' else 'C⁻¹'})",
                        []).append(values[name])
    curves.setdefault("banded Toeplitz (b bands of C)", []).append(
        toeplitz.optimize(n, b, min_sep=sep, max_participations=k, dense=False).info["rmse"]
        if b > 1 else values["BISR"])
  one = square_root_rmse(n, 2, sep, k)
  auto = blt.optimize_buffers(n, min_sep=sep, max_participations=k, dense=False).info
  dense = evaluate_dense(ours_fixed_epoch(n, k)["c"], _schema("fixed_epoch", k))["rmse"]
  return {"n": n, "k": k, "min_sep": sep, "bands": bands,
          "memory": [b - 1 for b in bands], "curves": curves,
          "points": {"λCGD (1 row)": [1, one["λCGD"]],
                     f"BLT ({auto['buffers']} buffers)": [auto["buffers"], auto["rmse"]]},
          "lines": {"DP-SGD (C = I, no memory)": curves["BISR (b bands of C⁻¹)"][0],
                    f"optimal fixed-epoch (dense, {n} rows)": dense}}


# ----------------------------------------------------------------------------- ours


def ours_fixed_epoch(n: int, k: int) -> Dict[str, Any]:
  """tff-mf's optimal fixed-epoch C (dual fixed point, certified gap 1e-6)."""
  start, cpu = time.perf_counter(), time.process_time()
  result = dense_fixed_epoch.solve_fixed_epoch(workloads.prefix_sum(n), k)
  return {"c": np.asarray(result.c), "seconds": time.perf_counter() - start,
          "cpu_seconds": time.process_time() - cpu, "detail": f"gap {result.info['relative_gap']:.1e}"}


def ours_banded(n: int, bands: int) -> Dict[str, Any]:
  """tff-mf's b-banded C with unit columns (L-BFGS on ‖S·C⁻¹‖²_F)."""
  start, cpu = time.perf_counter(), time.process_time()
  result = banded.optimize(workloads.prefix_sum(n), bands)
  return {"c": np.asarray(result.c), "seconds": time.perf_counter() - start,
          "cpu_seconds": time.process_time() - cpu, "detail": f"{bands} bands"}


# ----------------------------------------------------------------------------- peer


def peer_process(peer_python: str, tasks: List[Dict[str, Any]], budget_s: float, tmp: str):
  """One peer process on the tasks (arrays to ``tmp``/<id>.npz), killed at ``budget_s``.

  Returns (its JSON lines: the jax version, then one per finished task; whether it was
  stopped at the budget).
  """
  task_path = os.path.join(tmp, "tasks.json")
  with open(task_path, "w", encoding="utf-8") as f:
    json.dump(tasks, f)
  cmd = [peer_python, PEER_SCRIPT, task_path, tmp]
  _log(f"peer: {len(tasks)} task(s), budget {budget_s:.0f} s: {' '.join(cmd)}")
  stopped = False
  with subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True,
                        env=dict(os.environ, JAX_PLATFORMS="cpu")) as proc:
    try:
      stdout, _ = proc.communicate(timeout=budget_s)
    except subprocess.TimeoutExpired:
      proc.kill()
      stdout, _ = proc.communicate()
      stopped = True
  return [json.loads(line) for line in stdout.splitlines() if line.startswith("{")], stopped


def run_peer(peer_python: str, tasks: List[Dict[str, Any]], budget_s: float):
  """Runs the tasks in order in the peer interpreter, stopping at the time budget.

  Returns (arrays by task id, metadata by task id, note); tasks not finished in time
  are reported as such.
  """
  if not tasks:
    return {}, {}, "no peer tasks"
  if not os.path.exists(peer_python):
    return {}, {}, f"peer interpreter {peer_python} not found (jax-privacy not installed)"
  with tempfile.TemporaryDirectory() as tmp:
    lines, stopped = peer_process(peer_python, tasks, budget_s, tmp)
    note = f"; stopped at its {budget_s:.0f} s budget" if stopped else ""
    jax_version = lines[0].get("jax", "?") if lines else "?"
    meta = {entry["id"]: entry for entry in lines[1:]}
    arrays = {}
    for task_id, entry in meta.items():
      if "error" not in entry:
        with np.load(os.path.join(tmp, f"{task_id}.npz")) as data:
          arrays.update({f"{task_id}/{key}": data[key] for key in data.files})
  finished = sum("error" not in entry for entry in meta.values())
  return arrays, meta, f"jax {jax_version}, {finished} of {len(tasks)} task(s) done{note}"


# ----------------------------------------------------------------------------- runs


def _timed(fn, *args, **kwargs):
  """(result, CPU seconds of this process) of one call."""
  cpu = time.process_time()
  result = fn(*args, **kwargs)
  return result, time.process_time() - cpu


def _row(pair, config, ours, theirs, note=""):
  out = {"pair": pair, **config, "note": note}
  for side, value in (("ours", ours), ("theirs", theirs)):
    if value:
      out.update({f"{side}_{key}": value.get(key) for key in
                  ("rmse", "max_error", "seconds", "cpu_seconds", "sensitivity",
                   "sensitivity_exact", "detail")})
  if ours and theirs and ours.get("rmse") and theirs.get("rmse"):
    out["rmse_ratio"] = ours["rmse"] / theirs["rmse"]
    out["max_error_ratio"] = ours["max_error"] / theirs["max_error"]
  return out


def _settings(args) -> Dict[str, Any]:
  """Sizes of one run: full, --quick, or --smoke (seconds; a check that the script runs)."""
  if args.smoke:
    return {"sizes": [32], "ks": [2], "seps": [8], "fig_ks": [1, 2], "fig_b_k": 4,
            "timing_n": 256, "timing_cases": ((16, None, None), (8, 8, 4)),
            "blt_timing_cases": ((2, None, None), (2, 16, 4))}
  return {"sizes": [512] if args.quick else [512, 1024], "ks": [4, 8],
          "seps": [64] if args.quick else [32, 64, 128],
          "fig_ks": [1, 2, 4, 8] if args.quick else [1, 2, 4, 8, 16], "fig_b_k": 8,
          "timing_n": 10_000,
          "timing_cases": ((16, None, None), (64, None, None), (64, 64, 16), (64, 32, 32)),
          "blt_timing_cases": ((4, None, None), (8, None, None), (4, 625, 16), (8, 625, 16))}


def run_table(args, settings) -> Dict[str, Any]:
  """The side-by-side rows and tff-mf's optimization times."""
  sizes, ks, seps = settings["sizes"], settings["ks"], settings["seps"]
  # Peer tasks in priority order (a run stopped at its budget keeps the first ones).
  tasks: List[Dict[str, Any]] = []
  for n in sizes:
    for b in seps:
      tasks.append({"id": f"toep_n{n}_b{b}", "kind": "banded_toeplitz", "n": n, "bands": b})
  for n in sizes:
    for b in seps:
      for k in ks:
        tasks.append({"id": f"blt_n{n}_b{b}_k{k}", "kind": "blt", "n": n, "min_sep": b,
                      "max_participations": k, "error": "mean"})
  for n in sizes:
    for k in ks:
      tasks.append({"id": f"dense_n{n}_k{k}", "kind": "dense", "n": n, "epochs": k})
  for n in sizes:
    for b in seps:
      tasks.append({"id": f"banded_n{n}_b{b}", "kind": "banded", "n": n, "bands": b})
  if args.no_peer:
    arrays, peer_meta, peer_note = {}, {}, "peer not run (--no-peer)"
  else:
    arrays, peer_meta, peer_note = run_peer(args.peer_python, tasks, args.peer_budget)
  _log(f"peer: {peer_note}")

  def theirs(task_id):
    meta = peer_meta.get(task_id)
    if meta is None:
      return None, "not run (time budget or no peer)"
    if "error" in meta:
      return None, meta["error"]
    return {key.split("/", 1)[1]: value for key, value in arrays.items()
            if key.startswith(task_id + "/")}, (meta["seconds"], meta["cpu_seconds"])

  def dense_side(c, seconds, cpu_seconds, schema, detail):
    return dict(evaluate_dense(c, schema), seconds=seconds, cpu_seconds=cpu_seconds,
                detail=detail)

  rows = []
  for n in sizes:
    for b in seps:
      their_toep, t_toep = theirs(f"toep_n{n}_b{b}")
      mine_banded = ours_banded(n, b)
      _log(f"banded n={n} b={b}: ours {mine_banded['seconds']:.1f} s")
      their_banded, t_banded = theirs(f"banded_n{n}_b{b}")
      for k in ks:
        config = {"n": n, "k": k, "min_sep": b,
                  "k_effective": toeplitz_bounds.participations(n, b, k)[1]}
        ours, cpu = _timed(toeplitz.optimize, n, b, min_sep=b, max_participations=k, dense=False)
        ours = dict(ours.info, detail=f"{b} bands", cpu_seconds=cpu)
        other = None
        if their_toep is not None:
          other = dict(toeplitz_ops.evaluate(their_toep["coefficients"], n, None, b, k),
                       seconds=t_toep[0], cpu_seconds=t_toep[1],
                       detail=f"{their_toep['coefficients'].size} bands")
        rows.append(_row("banded Toeplitz", config, ours, other,
                         "" if other else f"jax_privacy: {t_toep}"))
        _log(f"toeplitz n={n} b={b} k={k}: ours {ours['rmse']:.4f}"
             + (f", theirs {other['rmse']:.4f}" if other else ""))

        their_blt, t_blt = theirs(f"blt_n{n}_b{b}_k{k}")
        other, m_theirs = None, 4
        if their_blt is not None:
          peer_blt = blt.BLT(their_blt["theta"], their_blt["omega"])
          m_theirs = peer_blt.buffers
          other = dict(blt.evaluate(peer_blt, n, None, b, k), seconds=t_blt[0],
                       cpu_seconds=t_blt[1], detail=f"{m_theirs} buffers")
        same, cpu = _timed(blt.optimize, n, max(m_theirs, 1), min_sep=b, max_participations=k,
                           dense=False)
        same = dict(same.info, detail=f"{same.info['buffers']} buffers (as jax_privacy)",
                    cpu_seconds=cpu)
        rows.append(_row("BLT, jax_privacy's buffers", config, same, other,
                         "" if other else f"jax_privacy: {t_blt}"))
        auto, cpu = _timed(blt.optimize_buffers, n, min_sep=b, max_participations=k,
                           dense=False)
        auto = dict(auto.info, detail=f"{auto.info['buffers']} buffers (ours, rtol 1.01)",
                    cpu_seconds=cpu)
        rows.append(_row("BLT, own buffer choice", config, auto, other))
        _log(f"blt n={n} b={b} k={k}: ours {same['rmse']:.4f} / auto {auto['rmse']:.4f}"
             + (f", theirs {other['rmse']:.4f} ({m_theirs} buffers)" if other else ""))

        schema = _schema("min_sep", k, b)
        ours_row = dense_side(mine_banded["c"], mine_banded["seconds"],
                              mine_banded["cpu_seconds"], schema, mine_banded["detail"])
        other = (dense_side(their_banded["c"], t_banded[0], t_banded[1], schema,
                            f"{b} bands") if their_banded is not None else None)
        rows.append(_row("banded", config, ours_row, other,
                         "" if other else f"jax_privacy: {t_banded}"))
    for k in ks:
      config = {"n": n, "k": k, "min_sep": n // k, "k_effective": k}
      mine = ours_fixed_epoch(n, k)
      _log(f"fixed epoch n={n} k={k}: ours {mine['seconds']:.1f} s")
      their_dense, t_dense = theirs(f"dense_n{n}_k{k}")
      schema = _schema("fixed_epoch", k)
      ours_row = dense_side(mine["c"], mine["seconds"], mine["cpu_seconds"], schema,
                            mine["detail"])
      other = (dense_side(their_dense["c"], t_dense[0], t_dense[1], schema,
                          "dense.optimize") if their_dense is not None else None)
      rows.append(_row("optimal fixed-epoch", config, ours_row, other,
                       "" if other else f"jax_privacy: {t_dense}"))

  timings = []
  tn = settings["timing_n"]
  for size, min_sep, k in settings["timing_cases"]:
    cpu = time.process_time()
    info = toeplitz.optimize(tn, size, min_sep=min_sep, max_participations=k, dense=False).info
    timings.append({"family": "banded Toeplitz", "n": tn, "size": f"{size} bands",
                    "min_sep": min_sep, "k": info["max_participations"], "rmse": info["rmse"],
                    "seconds": info["seconds"], "cpu_seconds": time.process_time() - cpu,
                    "iterations": info["iterations"], "converged": info["converged"]})
  for size, min_sep, k in settings["blt_timing_cases"]:
    cpu = time.process_time()
    info = blt.optimize(tn, size, min_sep=min_sep, max_participations=k, dense=False).info
    timings.append({"family": "BLT (4 starts)", "n": tn, "size": f"{size} buffers",
                    "min_sep": min_sep, "k": info["max_participations"], "rmse": info["rmse"],
                    "seconds": info["seconds"], "cpu_seconds": time.process_time() - cpu,
                    "iterations": info["iterations"], "converged": info["converged"]})
  for t in timings:
    _log(f"timing {t}")
  return {"rows": rows, "timings": timings, "peer": peer_note}


def figure_k(fig_n: int, fig_ks: List[int]) -> Dict[str, Any]:
  """rmse against k at n = fig_n (k epochs of n/k rounds; b = n/k where banded)."""
  figure = {"n": fig_n, "k": fig_ks, "curves": {}}
  curves = figure["curves"]
  for k in fig_ks:
    sep = fig_n // k
    curves.setdefault("binary tree (Honaker online)", []).append(tree_rmse(fig_n, k)["rmse"])
    curves.setdefault("banded Toeplitz, b = n/k", []).append(
        toeplitz.optimize(fig_n, sep, min_sep=sep, max_participations=k,
                          dense=False).info["rmse"])
    curves.setdefault("BLT", []).append(
        blt.optimize_buffers(fig_n, min_sep=sep, max_participations=k,
                             dense=False).info["rmse"])
    curves.setdefault("banded, b = n/k", []).append(
        evaluate_dense(ours_banded(fig_n, sep)["c"], _schema("min_sep", k, sep))["rmse"])
    curves.setdefault("optimal fixed-epoch (tff-mf)", []).append(
        evaluate_dense(ours_fixed_epoch(fig_n, k)["c"], _schema("fixed_epoch", k))["rmse"])
    extra = square_root_rmse(fig_n, sep, sep, k)
    for name in ("BSR", "BISR", "BandInvMF"):
      curves.setdefault(f"{name}, b = n/k", []).append(extra[name])
    curves.setdefault("λCGD (b = 1)", []).append(extra["λCGD"])
  return figure


def run(args) -> Dict[str, Any]:
  settings = _settings(args)
  result = run_table(args, settings)
  result["figure"] = figure_k(args.figure_n, settings["fig_ks"])
  result["figure_bands"] = bands_figure(args.figure_b_n, settings["fig_b_k"])
  return result


# ----------------------------------------------------------------------------- output


def write_plot(figure, path, figure_bands=None):
  """rmse against k (left) and, when given, against the noise memory (right)."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  import matplotlib.ticker  # pylint: disable=g-import-not-at-top
  panels = 2 if figure_bands else 1
  fig, axes = plt.subplots(1, panels, figsize=(6.5 * panels, 5.0), squeeze=False)
  plain = matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}")

  def log_axes(ax, ticks):
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(ticks)
    ax.set_xticklabels([str(t) for t in ticks])
    ax.yaxis.set_major_locator(matplotlib.ticker.LogLocator(base=10, subs=(1.0, 2.0, 3.0, 5.0)))
    ax.yaxis.set_major_formatter(plain)
    ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.grid(True, which="both", alpha=0.3)

  ax = axes[0][0]
  for (label, values), marker in zip(figure["curves"].items(), "osD^vPX*hp<>"):
    ax.plot(figure["k"], values, marker=marker, label=label)
  log_axes(ax, figure["k"])
  ax.set_xlabel("participations k (k epochs of n/k rounds)")
  ax.set_ylabel("rmse = sens·‖B‖_F/√n (prefix sums)")
  ax.set_title(f"Prefix sums, n = {figure['n']}: error vs participations")
  ax.legend(fontsize=7)
  if figure_bands:
    ax = axes[0][1]
    fb = figure_bands
    for (label, values), marker in zip(fb["curves"].items(), "osD^v"):
      ax.plot(fb["memory"][1:], values[1:], marker=marker, label=label)
    for (label, (memory, value)), marker in zip(fb["points"].items(), "*P"):
      ax.plot([memory], [value], marker=marker, markersize=12, linestyle="none", label=label)
    for (label, value), style in zip(fb["lines"].items(), (":", "--")):
      ax.axhline(value, color="gray", linestyle=style, label=label)
    log_axes(ax, fb["memory"][1:])
    ax.set_xlabel("noise memory: rows of Z kept (b − 1 for b bands or taps; m for m buffers)")
    ax.set_ylabel("rmse = sens·‖B‖_F/√n (prefix sums)")
    ax.set_title(f"n = {fb['n']}, k = {fb['k']} participations ≥ {fb['min_sep']} apart: "
                 "error vs memory", fontsize=10)
    ax.legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def _fmt(x, digits=4):
  if x is None:
    return "—"
  if isinstance(x, bool):
    return "yes" if x else "no"
  if isinstance(x, float):
    return f"{x:.{digits}f}" if abs(x) < 1e4 else f"{x:.3g}"
  return str(x)


def _secs(row, side):
  wall, cpu = row.get(f"{side}_seconds"), row.get(f"{side}_cpu_seconds")
  if wall is None:
    return "—"
  return f"{wall:.2f} ({cpu:.2f})" if cpu is not None else f"{wall:.2f}"


def summary_lines(rows) -> List[str]:
  """Per pair: the range of rmse ratios ours/theirs and of time ratios theirs/ours."""
  ratios, speed, lines = {}, {}, []
  for r in rows:
    if r.get("rmse_ratio") is not None:
      ratios.setdefault(r["pair"], []).append(r["rmse_ratio"])
      if r.get("ours_seconds") and r.get("theirs_seconds"):
        speed.setdefault(r["pair"], []).append(r["theirs_seconds"] / r["ours_seconds"])
  for pair, values in ratios.items():
    times = speed.get(pair, [])
    lines.append(f"- {pair}: rmse ratio ours/theirs from {min(values):.6f} to "
                 f"{max(values):.6f} over {len(values)} configurations (no worse, to 1e-6: "
                 f"{'yes' if max(values) <= 1 + 1e-6 else 'NO'})"
                 + (f"; time ratio theirs/ours (wall, one call each) from {min(times):.3g} "
                    f"to {max(times):.3g}, median {float(np.median(times)):.3g}" if times else "")
                 + ".")
  return lines


def _value_table(column_names, curves) -> List[str]:
  lines = ["| strategy | " + " | ".join(column_names) + " |",
           "|---|" + "---|" * len(column_names)]
  return lines + [f"| {label} | " + " | ".join(f"{v:.3f}" for v in values) + " |"
                  for label, values in curves.items()]


FIGURE_MARKER = "Figure: rmse against k"


def figure_markdown(result, png_name) -> List[str]:
  """The figures' captions and values (the section from ``FIGURE_MARKER`` on)."""
  fig = result["figure"]
  lines = [f"{FIGURE_MARKER} at n = {fig['n']} (k epochs of n/k rounds; the "
           "banded Toeplitz, BLT, BSR, BISR, BandInvMF and λCGD strategies are optimized for "
           "b = n/k min-sep, whose worst pattern for non-negative non-increasing coefficients "
           "is a fixed-epoch pattern, so those curves use the same sensitivity; otherwise their "
           "min-sep value is an upper bound). Binary tree: C_T with the streaming Honaker "
           "decoder. BSR, BISR and BandInvMF have b = n/k bands of C or taps of C⁻¹; λCGD has "
           "one row of noise memory. Values:", ""]
  lines += _value_table([f"k = {k}" for k in fig["k"]], fig["curves"])
  fb = result.get("figure_bands")
  if fb:
    lines += ["", f"Right panel: rmse against the noise memory at n = {fb['n']}, k = {fb['k']} "
              f"participations at least {fb['min_sep']} rounds apart (prefix sums): b bands of "
              "C (BSR, banded Toeplitz) or taps of C⁻¹ (BISR, BandInvMF) keep b − 1 rows of Z; "
              "λCGD keeps 1 (or regenerates it from the seed), BLT with m buffers m, the dense "
              "fixed-epoch optimum all n (its schema, k epochs of n/k rounds, is the min-sep "
              "schema's worst case for the other strategies when their coefficients are "
              "non-negative and non-increasing). Values:", ""]
    lines += _value_table([f"b = {b}" for b in fb["bands"]], fb["curves"])
    lines += [""] + [f"- {label}: memory {memory} rows, rmse {value:.3f}"
                     for label, (memory, value) in fb["points"].items()]
    lines += [f"- {label}: rmse {value:.3f}" for label, value in fb["lines"].items()]
  lines += ["", f"![rmse vs participations and vs memory]({png_name})", ""]
  return lines


def write_markdown(result, path, png_name, command, load_before, load_after, total_seconds):
  lines = ["## Multi-participation strategies: tff-mf vs jax_privacy", ""]
  lines += [f"Command: `{command}`", "",
            f"Machine: {MACHINE} ({platform.processor() or platform.machine()}, Python "
            f"{platform.python_version()}, numpy {np.__version__}; peer: jax_privacy 2.0.0, "
            f"{result['peer']}, x64, CPU). Load average (1 min) at start / end: "
            f"{load_before:.1f} / {load_after:.1f}. Total run: {total_seconds / 60:.1f} min.", ""]
  lines += ["Workload: prefix sums S. Schema: k participations at least b rounds apart "
            "(b-min-sep; k_eff = min(k, ⌈n/b⌉)) for the banded Toeplitz, BLT and banded pairs "
            "(banded C with b bands ≤ the separation: sens = √k_eff for unit columns), or k "
            "epochs of n/k rounds for the fixed-epoch optimum. Both sides are scored by "
            "tff-mf's evaluation: rmse = sens·‖S·C⁻¹‖_F/√n, "
            "max error = sens·max_i ‖(S·C⁻¹)[i, :]‖, sensitivity recomputed from each side's C "
            "under the same schema (exact for every row marked exact). Ratios are ours / "
            "theirs (< 1: ours better). Seconds are one call each (jax_privacy's include jax "
            "compilation for a new shape); banded Toeplitz and BLT build no dense matrices, "
            "banded and the fixed-epoch optimum are dense on both sides; our banded C is "
            "optimized once per (n, b) and scored for each k. "
            "jax_privacy's `optimize_banded_toeplitz` and `banded.optimize` optimize single "
            "participation (their min-sep value is proportional when bands ≤ b); its "
            "`buffered_toeplitz.optimize` chooses the number of buffers (up to 10, stop below "
            "1% gain); ours: `dense_fixed_epoch.solve_fixed_epoch` stops at a certified "
            "relative duality gap of 1e-6, `banded.optimize` is L-BFGS with a relative-decrease "
            "stopping rule.",
            ""]
  lines += ["| pair | n | k (eff) | b | ours rmse | theirs rmse | rmse ratio | ours max err | "
            "theirs max err | max-err ratio | ours s (CPU) | theirs s (CPU) | ours | theirs | "
            "exact sens |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
  for r in result["rows"]:
    if r.get("ours_rmse") is None and r.get("theirs_rmse") is None:
      continue
    exact = all(r.get(f"{s}_sensitivity_exact", True) for s in ("ours", "theirs"))
    lines.append(
        f"| {r['pair']} | {r['n']} | {r['k']} ({r['k_effective']}) | {r['min_sep']} | "
        f"{_fmt(r.get('ours_rmse'))} | {_fmt(r.get('theirs_rmse'))} | "
        f"{_fmt(r.get('rmse_ratio'), 6)} | {_fmt(r.get('ours_max_error'))} | "
        f"{_fmt(r.get('theirs_max_error'))} | {_fmt(r.get('max_error_ratio'), 6)} | "
        f"{_secs(r, 'ours')} | {_secs(r, 'theirs')} | "
        f"{r.get('ours_detail') or '—'} | {r.get('theirs_detail') or '—'} | "
        f"{'yes' if exact else 'upper bound'} |")
  lines.append("")
  notes = sorted({f"{r['pair']}: {r['note']}" for r in result["rows"] if r.get("note")})
  if notes:
    lines += ["Skipped or incomplete:", ""] + [f"- {note}" for note in notes] + [""]
  lines += summary_lines(result["rows"])
  timing_n = result["timings"][0]["n"] if result["timings"] else 0
  lines += ["", f"Optimization time at n = {timing_n} (prefix sums, tff-mf only; wall and CPU "
            "seconds "
            "of the whole call, no dense matrices; BLT: L-BFGS from 4 initial grids):", "",
            "| family | size | schema | rmse | iterations | converged | wall s | CPU s |",
            "|---|---|---|---|---|---|---|---|"]
  for t in result["timings"]:
    schema = "single" if t["min_sep"] is None else f"min-sep {t['min_sep']}, k = {t['k']}"
    lines.append(f"| {t['family']} | {t['size']} | {schema} | {t['rmse']:.4f} | "
                 f"{t['iterations']} | {_fmt(t['converged'])} | {t['seconds']:.2f} | "
                 f"{t['cpu_seconds']:.2f} |")
  lines += [""] + figure_markdown(result, png_name)
  with open(path, "w", encoding="utf-8") as f:
    f.write("\n".join(lines))


def update_figures(args, json_path, png):
  """Recomputes both figures into an earlier run's JSON, PNG and Markdown (rows kept)."""
  settings = _settings(args)
  with open(json_path, encoding="utf-8") as f:
    stored = json.load(f)
  start = time.perf_counter()
  stored["figure"] = figure_k(args.figure_n, settings["fig_ks"])
  stored["figure_bands"] = bands_figure(args.figure_b_n, settings["fig_b_k"])
  stored["figure_seconds"] = time.perf_counter() - start
  write_plot(stored["figure"], png, stored["figure_bands"])
  with open(json_path, "w", encoding="utf-8") as f:
    json.dump(stored, f, indent=1, default=float)
  md = os.path.join(args.out_dir, f"{args.name}.md")
  with open(md, encoding="utf-8") as f:
    text = f.read()
  head = text.split(FIGURE_MARKER)[0].rstrip("\n")
  with open(md, "w", encoding="utf-8") as f:
    f.write(head + "\n\n" + "\n".join(figure_markdown(stored, os.path.basename(png))))
  _log(f"figures recomputed in {stored['figure_seconds'] / 60:.1f} min: {md}, {png}")


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--quick", action="store_true",
                      help="n = 512, b = 64 only, k ≤ 8 in the figure (a few minutes)")
  parser.add_argument("--smoke", action="store_true",
                      help="tiny sizes, no peer (seconds): checks that the script runs")
  parser.add_argument("--peer-python", default=os.environ.get("TFF_MF_PEER_PYTHON",
                                                              "/tmp/peer/bin/python"))
  parser.add_argument("--peer-budget", type=float, default=None,
                      help="seconds for the whole jax_privacy run (default 3600, quick 900)")
  parser.add_argument("--no-peer", action="store_true", help="tff-mf side only")
  parser.add_argument("--figure-n", type=int, default=None,
                      help="n of the figure (256; 32 with --smoke)")
  parser.add_argument("--figure-b-n", type=int, default=None,
                      help="n of the rmse-vs-memory panel (1024; 32 with --smoke)")
  parser.add_argument("--out-dir", default=RESULTS)
  parser.add_argument("--name", default="multi_participation")
  parser.add_argument("--plot-only", action="store_true",
                      help="redraw <out-dir>/<name>.png from the run's <name>.json (no run)")
  parser.add_argument("--figure-only", action="store_true",
                      help="recompute the figures (tff-mf only, minutes) into the earlier run's "
                           "<name>.json, .png and the figure section of <name>.md")
  args = parser.parse_args(argv)
  json_path = os.path.join(args.out_dir, f"{args.name}.json")
  png = os.path.join(args.out_dir, f"{args.name}.png")
  if args.plot_only:
    with open(json_path, encoding="utf-8") as f:
      stored = json.load(f)
    write_plot(stored["figure"], png, stored.get("figure_bands"))
    return
  if args.figure_n is None:
    args.figure_n = 32 if args.smoke else 256
  if args.figure_b_n is None:
    args.figure_b_n = 32 if args.smoke else 1024
  if args.figure_only:
    update_figures(args, json_path, png)
    return
  if args.peer_budget is None:
    args.peer_budget = 900.0 if args.quick else 3600.0
  if args.smoke:
    args.no_peer = True
  os.makedirs(args.out_dir, exist_ok=True)
  command = "nice -n 10 .venv/bin/python benchmarks/bench_multi_participation.py" + (
      " " + " ".join(shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:]))
      if (argv if argv is not None else sys.argv[1:]) else "")
  start = time.perf_counter()
  load_before = os.getloadavg()[0]
  result = run(args)
  load_after = os.getloadavg()[0]
  total = time.perf_counter() - start
  write_plot(result["figure"], png, result["figure_bands"])
  with open(json_path, "w") as f:
    json.dump(dict(result, machine=MACHINE, load=[load_before, load_after], seconds=total), f,
              indent=1, default=float)
  md = os.path.join(args.out_dir, f"{args.name}.md")
  write_markdown(result, md, os.path.basename(png), command, load_before, load_after, total)
  _log(f"wrote {md} and {png} in {total / 60:.1f} min")


if __name__ == "__main__":
  main()
