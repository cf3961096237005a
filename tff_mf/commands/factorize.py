"""``tff-mf factorize``: the offline job that computes (or loads) a factorization A = B·C.

Writes the result into the cache (``tff_mf.cache``) and prints √L, the sensitivity,
rmse and max_error under the participation schema, and the solver figures;
``--json`` prints one JSON object. A repeated call is a cache hit. Module-level
imports stay light (no TensorFlow, no matplotlib) so a hit answers in about a second.
"""

from __future__ import annotations

import argparse
import sys
import time

WORKLOADS = ("prefix_sum", "momentum", "file")
DEFAULT_MOMENTUM = 0.95  # Denisov et al. 2022, arXiv:2202.08312, Fig 1 (right), Sec 5


def add_workload_arguments(parser: argparse.ArgumentParser, n_required: bool = False) -> None:
  group = parser.add_argument_group("workload A")
  group.add_argument("--workload", choices=WORKLOADS, default=None,
                     help="prefix_sum (S), momentum (M = M(η)M(β), Denisov et al. 2022 Prop "
                          "4.2), or file (implied by --matrix-file) (default: prefix_sum)")
  group.add_argument("--momentum", type=float, default=None,
                     help=f"momentum β for --workload momentum (default: {DEFAULT_MOMENTUM})")
  group.add_argument("--lr-schedule", choices=("constant", "decay", "cooldown"), default="constant",
                     help="learning-rate schedule η of the momentum workload (default: constant)")
  group.add_argument("--schedule-rounds", type=int, default=None, metavar="K",
                     help="rounds k of the decay/cooldown at the end (default: n/4, as 512 of "
                          "2048 in Denisov et al. 2022)")
  group.add_argument("--matrix-file", default=None, metavar="A.npy",
                     help="a lower-triangular, full-rank A of your own (.npy) (default: none)")
  group.add_argument("--n", type=int, default=None, required=n_required,
                     help="number of rounds n, the size of A (required unless --matrix-file)")


def add_participation_arguments(parser: argparse.ArgumentParser) -> None:
  from tff_mf import participation  # pylint: disable=g-import-not-at-top
  group = parser.add_argument_group("participation schema")
  group.add_argument("--participation", choices=participation.KINDS,
                     default="single",
                     help="how often a user contributes: at most once; every b = n/K rounds for "
                          "K epochs; at most --max-participations times, --min-sep apart "
                          "(default: single)")
  group.add_argument("--epochs", type=int, default=None, metavar="K",
                     help="fixed_epoch, balls_in_bins: number of epochs K, dividing n "
                          "(default: none)")
  group.add_argument("--min-sep", type=int, default=None, metavar="B",
                     help="min_sep: rounds between two participations of a user, at least B "
                          "(default: none)")
  group.add_argument("--max-participations", type=int, default=None, metavar="K",
                     help="min_sep: participations per user, at most K (default: ⌈n/B⌉)")


def workload_from_args(args: argparse.Namespace):
  """A ``WorkloadSpec`` from the parsed flags (validating a matrix file at once)."""
  from tff_mf import checks, workloads  # pylint: disable=g-import-not-at-top
  kind = args.workload
  if args.matrix_file:
    if kind not in (None, "file"):
      raise checks.CheckError(f"--matrix-file conflicts with --workload {kind}")
    a = workloads.load_workload(args.matrix_file)
    n = a.shape[0]
    if args.n is not None and args.n != n:
      raise checks.CheckError(f"--n {args.n} but the matrix in {args.matrix_file} is {n}x{n}")
    return workloads.WorkloadSpec(kind="file", n=n, matrix_file=args.matrix_file)
  kind = kind or "prefix_sum"
  if kind == "file":
    raise checks.CheckError("--workload file needs --matrix-file A.npy")
  if args.n is None:
    raise checks.CheckError("--n is required (number of rounds)")
  n = checks.positive_int(args.n, "--n")
  if kind == "prefix_sum":
    if args.momentum not in (None, 0.0) or args.lr_schedule != "constant":
      raise checks.CheckError("--momentum/--lr-schedule apply to --workload momentum only")
    return workloads.WorkloadSpec(kind="prefix_sum", n=n)
  beta = checks.in_range(DEFAULT_MOMENTUM if args.momentum is None else args.momentum,
                         "--momentum", 0.0, 1.0)
  schedule_rounds = args.schedule_rounds
  if args.lr_schedule == "constant":
    if schedule_rounds is not None:
      raise checks.CheckError("--schedule-rounds needs --lr-schedule decay or cooldown")
  elif schedule_rounds is None:
    schedule_rounds = max(1, n // 4)
  workloads.learning_rates(n, args.lr_schedule, schedule_rounds)  # validates k
  return workloads.WorkloadSpec(kind="momentum", n=n, momentum=beta,
                                lr_schedule=args.lr_schedule, schedule_rounds=schedule_rounds)


def participation_from_args(args: argparse.Namespace, n: int):
  from tff_mf import participation  # pylint: disable=g-import-not-at-top
  return participation.from_args(args.participation, n, epochs=args.epochs,
                                 min_sep=args.min_sep,
                                 max_participations=args.max_participations)


def spec_from_args(args: argparse.Namespace):
  from tff_mf import checks, registry, strategies  # pylint: disable=g-import-not-at-top
  workload = workload_from_args(args)
  schema = participation_from_args(args, workload.n)
  params = registry.default_parameters(args.strategy, workload.n, schema)
  for flag in ("bands", "rank", "buffers"):
    value = getattr(args, flag)
    if value is None:
      continue
    if flag not in params:
      raise checks.CheckError(f"--{flag} does not apply to --strategy {args.strategy}")
    params[flag] = value
  if args.error is not None:
    params["error"] = args.error
  if args.strategy in ("optimal", "structured"):
    params.update(target_gap=args.target_gap, max_iterations=args.max_iterations,
                  allow_unconverged=args.allow_unconverged)
  elif (args.target_gap, args.max_iterations, args.allow_unconverged) != (1e-6, 10_000, False):
    raise checks.CheckError("--target-gap/--max-iterations/--allow-unconverged apply to "
                            "--strategy optimal and structured only")
  spec = strategies.FactorizationSpec(workload=workload, strategy=args.strategy,
                                      participation=schema, **params)
  spec.validate()
  return spec


def result_record(f, entry) -> dict:
  """The JSON object ``tff-mf factorize --json`` prints."""
  md = entry.metadata
  return {
      "strategy": f.strategy, "workload": md.get("spec", {}).get("workload"), "n": f.n,
      "m": f.m, "participation": md.get("participation"), "sensitivity": md.get("sensitivity"),
      "sensitivity_exact": md.get("info", {}).get("sensitivity_exact"),
      "rmse": md.get("rmse"), "max_error": md.get("max_error"), "sqrt_loss": f.sqrt_loss,
      "loss": f.loss, "relative_gap": md.get("relative_gap"), "iterations": md.get("iterations"),
      "seconds": md.get("seconds"),
      # Entries written before the rename call γ "sensitivity_before_normalization".
      "gamma_before_normalization": md.get("gamma_before_normalization",
                                           md.get("sensitivity_before_normalization")),
      "path": entry.npz_path, "metadata_path": entry.json_path, "cache_hit": entry.cache_hit,
      "key": md.get("key"), "params": md.get("params"),
  }


def register(subparsers) -> None:
  from tff_mf import registry  # pylint: disable=g-import-not-at-top
  parser = subparsers.add_parser(
      "factorize", help="compute (or load from the cache) a factorization A = B·C",
      description="Computes a factorization A = B·C of a workload and stores float64 A, B, C, "
                  "its family's parameters and a JSON sidecar in the cache (default "
                  "~/.cache/tff_mf, or $TFF_MF_CACHE, or --cache-dir).")
  add_workload_arguments(parser)
  parser.add_argument("--strategy", required=True, choices=tuple(registry.STRATEGIES),
                      help="how C is chosen: " + "; ".join(
                          f"{s.name}: {s.description}" for s in registry.STRATEGIES.values()))
  add_participation_arguments(parser)
  group = parser.add_argument_group("strategy parameters")
  group.add_argument("--bands", type=int, default=None, metavar="B",
                     help="structured: diagonals h kept exactly (default: ⌈log₂n/2⌉); banded, "
                          "banded_toeplitz: bands b of C (default: the schema's separation, "
                          "at most 64; 16 under single participation)")
  group.add_argument("--rank", type=int, default=None, metavar="R",
                     help="structured: rank r of the low-rank part (default: ⌊log₂n/2⌋)")
  group.add_argument("--buffers", type=int, default=None, metavar="M",
                     help="blt: buffers m (default: 4)")
  group.add_argument("--error", choices=("mean", "max"), default=None,
                     help="banded_toeplitz, blt: optimize the mean (rmse) or the max error "
                          "(default: mean)")
  group.add_argument("--target-gap", type=float, default=1e-6,
                     help="optimal, structured: relative duality gap to reach (default: 1e-6)")
  group.add_argument("--max-iterations", type=int, default=10_000,
                     help="optimal: iteration limit (default: 10000)")
  group.add_argument("--allow-unconverged", action="store_true",
                     help="optimal: return (and cache) a result above --target-gap instead of "
                          "failing; the gap reached is reported (default: off)")
  parser.add_argument("--cache-dir", default=None,
                      help="cache directory (default: $TFF_MF_CACHE or ~/.cache/tff_mf)")
  parser.add_argument("--force", action="store_true",
                      help="recompute even if the cache has this entry; replaces a corrupt one "
                           "(default: off)")
  parser.add_argument("--json", action="store_true", help="print one JSON object (default: off)")
  parser.set_defaults(func=run)


def _fmt(value, spec) -> str:
  return "n/a" if value is None else format(value, spec)


def run(args: argparse.Namespace) -> int:
  from tff_mf import cache  # pylint: disable=g-import-not-at-top
  from tff_mf import jsonio  # pylint: disable=g-import-not-at-top
  start = time.perf_counter()
  spec = spec_from_args(args)
  f, entry = cache.load_or_factorize(spec, cache_dir=args.cache_dir, force=args.force,
                                     progress=not args.json)
  record = result_record(f, entry)
  record["wall_seconds"] = time.perf_counter() - start
  if args.json:
    print(jsonio.dumps(record))
    return 0
  info = entry.metadata.get("info", {})
  structured = f.strategy == "structured"
  lines = [
      f"{'cache hit' if entry.cache_hit else 'computed'}: {f.strategy} for "
      f"{record['workload']} n={f.n}, participation {record['participation']['label']}",
      f"  sensitivity    {record['sensitivity']:.6g}"
      f"{'' if record['sensitivity_exact'] else ' (upper bound)'}",
      f"  rmse           {record['rmse']:.6g}",
      f"  max_error      {record['max_error']:.6g}",
      f"  sqrt(L)        {f.sqrt_loss:.4f}",
  ]
  for key in ("bands", "rank", "buffers"):
    if key in record["params"]:
      lines.append(f"  {key:<14} {record['params'][key]}")
  if structured and info.get("optimal_sqrt_loss") is not None:
    lines.append(f"  optimal sqrt(L) {info['optimal_sqrt_loss']:.4f}")
  if record["relative_gap"] is not None:
    lines.append(f"  {'gap of B*' if structured else 'relative gap':<14} "
                 f"{record['relative_gap']:.3g}")
  if record["iterations"] is not None:
    lines.append(f"  {'ALS iterations' if structured else 'iterations':<14} "
                 f"{record['iterations']}")
  lines.append(f"  solver seconds {_fmt(record['seconds'], '.2f')}")
  lines.append(f"  file           {entry.npz_path}")
  print("\n".join(lines))
  sys.stdout.flush()
  return 0
