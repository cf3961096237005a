"""``tff-mf factorize``: the offline job that computes (or loads) a factorization A = B·C.

Writes the result into the cache (``tff_mf.cache``) and prints √L and the solver
figures; ``--json`` prints one JSON object. A repeated call is a cache hit.
Module-level imports stay light (no TensorFlow, no matplotlib) so that a hit
answers in about a second.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time

WORKLOADS = ("prefix_sum", "momentum", "file")
DEFAULT_MOMENTUM = 0.95  # Denisov et al. Fig 1 (right), Sec 5


def default_structured_shape(n: int):
  """(h, r) with h + r = ⌈log₂ n⌉, h = ⌈·/2⌉ (Denisov Table 2 / McMahan Table 1 choices)."""
  total = max(1, math.ceil(math.log2(max(n, 2))))
  bands = (total + 1) // 2
  return bands, total - bands


def add_workload_arguments(parser: argparse.ArgumentParser) -> None:
  group = parser.add_argument_group("workload A")
  group.add_argument("--workload", choices=WORKLOADS, default=None,
                     help="prefix_sum (S), momentum (M = M(η)M(β), Denisov Prop 4.2), or file "
                          "(implied by --matrix-file). Default: prefix_sum.")
  group.add_argument("--momentum", type=float, default=None,
                     help=f"momentum β for --workload momentum (default {DEFAULT_MOMENTUM})")
  group.add_argument("--lr-schedule", choices=("constant", "decay", "cooldown"), default="constant",
                     help="learning-rate schedule η of the momentum workload")
  group.add_argument("--schedule-rounds", type=int, default=None, metavar="K",
                     help="rounds k of the decay/cooldown at the end (default n/4, as 512 of 2048 "
                          "in Denisov et al.)")
  group.add_argument("--matrix-file", default=None, metavar="A.npy",
                     help="a user-supplied lower-triangular full-rank A (.npy)")
  group.add_argument("--n", type=int, default=None,
                     help="number of rounds n (the size of A)")


def workload_from_args(args: argparse.Namespace):
  """A ``WorkloadSpec`` from the parsed flags (validating a matrix file at once)."""
  from tff_mf import workloads  # pylint: disable=g-import-not-at-top
  kind = args.workload
  if args.matrix_file:
    if kind not in (None, "file"):
      raise ValueError(f"--matrix-file conflicts with --workload {kind}")
    a = workloads.load_workload(args.matrix_file)
    n = a.shape[0]
    if args.n is not None and args.n != n:
      raise ValueError(f"--n {args.n} but the matrix in {args.matrix_file} is {n}x{n}")
    return workloads.WorkloadSpec(kind="file", n=n, matrix_file=args.matrix_file)
  kind = kind or "prefix_sum"
  if kind == "file":
    raise ValueError("--workload file needs --matrix-file A.npy")
  if args.n is None:
    raise ValueError("--n is required (number of rounds)")
  if args.n < 1:
    raise ValueError(f"--n must be a positive integer, got {args.n}")
  if kind == "prefix_sum":
    if args.momentum not in (None, 0.0) or args.lr_schedule != "constant":
      raise ValueError("--momentum/--lr-schedule apply to --workload momentum only")
    return workloads.WorkloadSpec(kind="prefix_sum", n=args.n)
  beta = DEFAULT_MOMENTUM if args.momentum is None else args.momentum
  schedule_rounds = args.schedule_rounds
  if args.lr_schedule == "constant":
    if schedule_rounds is not None:
      raise ValueError("--schedule-rounds needs --lr-schedule decay or cooldown")
  elif schedule_rounds is None:
    schedule_rounds = max(1, args.n // 4)
  spec = workloads.WorkloadSpec(kind="momentum", n=args.n, momentum=beta,
                                lr_schedule=args.lr_schedule, schedule_rounds=schedule_rounds)
  workloads.learning_rates(args.n, args.lr_schedule, schedule_rounds)  # validates k
  if not 0.0 <= beta < 1.0:
    raise ValueError(f"--momentum must be in [0, 1), got {beta}")
  return spec


def spec_from_args(args: argparse.Namespace):
  from tff_mf import strategies  # pylint: disable=g-import-not-at-top
  workload = workload_from_args(args)
  bands, rank = args.bands, args.rank
  if args.strategy == "structured":
    default_bands, default_rank = default_structured_shape(workload.n)
    bands = default_bands if bands is None else bands
    rank = default_rank if rank is None else rank
  elif bands is not None or rank is not None:
    raise ValueError("--bands/--rank apply to --strategy structured only")
  spec = strategies.FactorizationSpec(
      workload=workload, strategy=args.strategy, target_gap=args.target_gap,
      max_iterations=args.max_iterations, allow_unconverged=args.allow_unconverged,
      bands=bands or 0, rank=rank or 0)
  spec.validate()
  return spec


def result_record(f, entry) -> dict:
  """The JSON object ``tff-mf factorize --json`` prints."""
  md = entry.metadata
  return {
      "strategy": f.strategy,
      "workload": md.get("spec", {}).get("workload"),
      "n": f.n,
      "m": f.m,
      "sqrt_loss": f.sqrt_loss,
      "loss": f.loss,
      "relative_gap": md.get("relative_gap"),
      "iterations": md.get("iterations"),
      "seconds": md.get("seconds"),
      "sensitivity_before_normalization": md.get("sensitivity_before_normalization"),
      "path": entry.npz_path,
      "metadata_path": entry.json_path,
      "cache_hit": entry.cache_hit,
      "key": md.get("key"),
      "params": md.get("params"),
  }


def register(subparsers) -> None:
  parser = subparsers.add_parser(
      "factorize", help="compute (or load from the cache) a factorization A = B·C",
      description="Computes a factorization A = B·C of a workload and stores float64 A, B, C "
                  "with a JSON sidecar in the cache (default ~/.cache/tff_mf, or $TFF_MF_CACHE).")
  add_workload_arguments(parser)
  parser.add_argument("--strategy", required=True,
                      choices=("optimal", "honaker_online", "honaker_full", "identity",
                               "structured"))
  parser.add_argument("--bands", type=int, default=None, metavar="H",
                      help="structured: diagonals kept exactly (default ⌈log₂n/2⌉)")
  parser.add_argument("--rank", type=int, default=None, metavar="R",
                      help="structured: rank of the low-rank part (default ⌊log₂n/2⌋)")
  parser.add_argument("--target-gap", type=float, default=1e-6,
                      help="optimal: relative duality gap to reach (default 1e-6)")
  parser.add_argument("--max-iterations", type=int, default=10_000,
                      help="optimal: iteration limit (default 10000)")
  parser.add_argument("--allow-unconverged", action="store_true",
                      help="optimal: return (and cache) a result above --target-gap instead of "
                           "failing; the gap reached is reported")
  parser.add_argument("--cache-dir", default=None, help="cache directory (overrides $TFF_MF_CACHE)")
  parser.add_argument("--force", action="store_true",
                      help="recompute even if the cache has this entry (replaces a corrupt one)")
  parser.add_argument("--json", action="store_true", help="print one JSON object")
  parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
  from tff_mf import cache  # pylint: disable=g-import-not-at-top
  start = time.perf_counter()
  spec = spec_from_args(args)
  f, entry = cache.load_or_factorize(spec, cache_dir=args.cache_dir, force=args.force,
                                     progress=True)
  record = result_record(f, entry)
  record["wall_seconds"] = time.perf_counter() - start
  if args.json:
    print(json.dumps(record, sort_keys=True))
    return 0
  gap = record["relative_gap"]
  iterations = record["iterations"]
  structured = f.strategy == "structured"
  lines = [
      f"{'cache hit' if entry.cache_hit else 'computed'}: {f.strategy} for "
      f"{record['workload']} n={f.n}",
      f"  sqrt(L)        {f.sqrt_loss:.4f}",
      f"  loss L         {f.loss:.6g}",
  ]
  if structured:
    info = entry.metadata.get("info", {})
    lines.append(f"  bands, rank    {info.get('bands')}, {info.get('rank')}")
    if info.get("optimal_sqrt_loss") is not None:
      lines.append(f"  optimal sqrt(L) {info['optimal_sqrt_loss']:.4f}")
  label = "gap of B*" if structured else "relative gap"
  lines.append(f"  {label:<14} {gap:.3g}" if gap is not None else f"  {label:<14} n/a")
  label = "ALS iterations" if structured else "iterations"
  lines.append(f"  {label:<14} {iterations if iterations is not None else 'n/a'}")
  if record["seconds"] is not None:
    lines.append(f"  solver seconds {record['seconds']:.2f}")
  lines.append(f"  file           {entry.npz_path}")
  print("\n".join(line for line in lines if line))
  sys.stdout.flush()
  return 0
