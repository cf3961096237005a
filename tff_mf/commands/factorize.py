"""``tff-mf factorize``: the offline job that computes (or loads) a factorization A = B·C.

Writes the result into the cache (``tff_mf.factorization.cache``) and prints √L, the sensitivity,
rmse and max_error under the participation schema, and the solver figures;
``--json`` prints one JSON object. A repeated call is a cache hit. Module-level
imports stay light (no TensorFlow, no matplotlib) so a hit answers in about a second.
"""

from __future__ import annotations

import argparse
import sys
import time

from tff_mf import clitools

WORKLOADS = ("prefix_sum", "momentum", "file")
# After Ctrl-C (tff_mf.cli): cache entries are written atomically (tff_mf.factorization.cache).
INTERRUPTED = "interrupted; no partial cache entry was written (finished ones stay cached)"
DEFAULT_MOMENTUM = 0.95  # Denisov et al. 2022, arXiv:2202.08312, Fig 1 (right), Sec 5


def add_workload_arguments(parser, n_required: bool = False) -> None:
  """The workload flags, in a group of their own on a parser, or in the group given (argparse
  leaves a group nested in a group out of --help)."""
  group = (parser.add_argument_group("workload A")
           if isinstance(parser, argparse.ArgumentParser) else parser)
  group.add_argument("--workload", choices=WORKLOADS, default=None,
                     help="prefix_sum (S), momentum (M = M(η)M(β), Denisov et al. 2022 Prop "
                          "4.2), or file (implied by --matrix_file) (default: momentum when "
                          "--momentum is above 0 or --lr_schedule is not constant, as training "
                          "builds its workload from --server_momentum and --lr_schedule; else "
                          "prefix_sum)")
  from tff_mf import spec  # pylint: disable=g-import-not-at-top
  clitools.add_flag(group, spec.workload_flag("server_momentum"),
                    spelling=spec.MOMENTUM_SPELLING, note="; training's --server_momentum",
                    default_text=f"{DEFAULT_MOMENTUM} with --workload momentum, else 0")
  clitools.add_flag(group, spec.workload_flag("lr_schedule"), default="constant",
                    default_text="constant")
  clitools.add_flag(group, spec.workload_flag("schedule_rounds"),
                    default_text="n/4, as 512 of 2048 in Denisov et al. 2022")
  group.add_argument("--matrix_file", default=None, metavar="A.npy",
                     help="a lower-triangular, full-rank A of your own (.npy) (default: none)")
  clitools.add_rounds_flag(group, required=n_required,
                           what="" if n_required else "; required unless --matrix_file")


def add_participation_arguments(parser: argparse.ArgumentParser) -> None:
  """The schema flags (``clitools.add_schema_flags``)."""
  group = parser.add_argument_group("participation schema")
  clitools.add_schema_flags(group, default_text={
      "participation": "min_sep when --min_sep or --max_participations is given, fixed_epoch "
                       "when --epochs is given, else single"})


def add_parameter_arguments(group) -> None:
  """The family parameters: --bands, --rank, --buffers and every family's own
  (``clitools.add_family_flags``)."""
  clitools.add_family_flags(group)


def workload_from_args(args: argparse.Namespace):
  """A ``WorkloadSpec`` from the parsed flags (validating a matrix file at once)."""
  from tff_mf import checks  # pylint: disable=g-import-not-at-top
  from tff_mf.factorization import workloads  # pylint: disable=g-import-not-at-top
  kind = args.workload
  if args.matrix_file:
    if kind not in (None, "file"):
      raise checks.CheckError(f"--matrix_file conflicts with --workload {kind}")
    a = workloads.load_workload(args.matrix_file)
    n = a.shape[0]
    if args.n is not None and args.n != n:
      raise checks.CheckError(f"--total_rounds {args.n} but the matrix in {args.matrix_file} "
                              f"is {n}x{n}")
    return workloads.WorkloadSpec(kind="file", n=n, matrix_file=args.matrix_file)
  beta = DEFAULT_MOMENTUM if args.momentum is None else args.momentum
  if kind is None:  # as training builds its workload: β > 0 or a schedule is momentum
    kind = "momentum" if (args.momentum not in (None, 0.0) or
                          args.lr_schedule != "constant") else "prefix_sum"
    beta = 0.0 if args.momentum is None else args.momentum  # training's default β
  if kind == "file":
    raise checks.CheckError("--workload file needs --matrix_file A.npy")
  if args.n is None:
    raise checks.CheckError("--total_rounds is required (number of rounds n)")
  n = checks.positive_int(args.n, "--total_rounds")
  if kind == "prefix_sum":
    if args.momentum not in (None, 0.0) or args.lr_schedule != "constant":
      raise checks.CheckError("--momentum/--lr_schedule apply to --workload momentum only")
    return workloads.WorkloadSpec(kind="prefix_sum", n=n)
  beta = checks.in_range(beta, "--momentum", 0.0, 1.0)
  schedule_rounds = args.schedule_rounds
  if args.lr_schedule == "constant":
    if schedule_rounds is not None:
      raise checks.CheckError("--schedule_rounds needs --lr_schedule decay or cooldown")
  elif schedule_rounds is None:
    schedule_rounds = max(1, n // 4)
  workloads.learning_rates(n, args.lr_schedule, schedule_rounds)  # validates k
  return workloads.WorkloadSpec(kind="momentum", n=n, momentum=beta,
                                lr_schedule=args.lr_schedule, schedule_rounds=schedule_rounds)


def participation_from_args(args: argparse.Namespace, n: int):
  """The schema of ``--participation``, or the one its flags imply (as in every tool:
  ``clitools.implied_participation``)."""
  from tff_mf import participation  # pylint: disable=g-import-not-at-top
  kind = clitools.implied_participation(args.participation, args.epochs, args.min_sep,
                                        args.max_participations)
  return participation.from_args(kind, n, epochs=args.epochs, min_sep=args.min_sep,
                                 max_participations=args.max_participations)


def strategy_and_workload(name: str, args: argparse.Namespace):
  """(strategy name, ``WorkloadSpec``) of ``--mechanism NAME``: a strategy of the registry,
  or a mechanism (name or alias), which maps to its strategy and workload as the
  registry says: the prefix sum S for mechanisms that post-process a prefix-sum decoder,
  else the workload the flags describe (the training workload)."""
  from tff_mf import checks, registry  # pylint: disable=g-import-not-at-top
  from tff_mf.factorization import workloads  # pylint: disable=g-import-not-at-top
  if name in registry.STRATEGIES:
    return name, workload_from_args(args)
  if name not in registry.all_spellings():
    spellings = list(registry.STRATEGIES) + list(registry.all_spellings())
    raise registry.RegistryError(
        f"--mechanism: unknown strategy or mechanism {name!r}"
        f"{clitools.did_you_mean(name, spellings)} (strategies: {', '.join(registry.STRATEGIES)}; "
        f"mechanisms: {clitools.mechanism_help()})")
  mech = registry.mechanism(name)
  if mech.strategy is None:
    raise checks.CheckError(f"mechanism {mech.name} has no factorization to compute "
                            f"({mech.why_not_trainable or mech.description})")
  workload = workload_from_args(args)
  if mech.post_processes_prefix_decoder and workload.kind != "prefix_sum":
    raise checks.CheckError(
        f"mechanism {mech.name} factorizes the prefix sum S (the {workload.kind} workload is "
        f"post-processing of its decoder): drop --workload/--momentum/--matrix_file")
  if mech.post_processes_prefix_decoder:
    workload = workloads.WorkloadSpec(kind="prefix_sum", n=workload.n)
  return mech.strategy, workload


def spec_from_args(args: argparse.Namespace):
  from tff_mf import checks, registry  # pylint: disable=g-import-not-at-top
  from tff_mf import spec as spec_lib  # pylint: disable=g-import-not-at-top
  from tff_mf.factorization import strategies  # pylint: disable=g-import-not-at-top
  strategy, workload = strategy_and_workload(args.mechanism, args)
  schema = participation_from_args(args, workload.n)
  params = registry.default_parameters(strategy, workload.n, schema)
  for flag, value in spec_lib.family_values(vars(args)).items():
    if flag not in params:
      raise checks.CheckError(f"--{flag} does not apply to --mechanism {args.mechanism}")
    params[flag] = value
  if args.error is not None:
    params["error"] = args.error
  if args.als_iterations is not None:
    if "als_iterations" not in registry.strategy(strategy).declaration.parameters:
      raise checks.CheckError(f"--als_iterations does not apply to --mechanism {args.mechanism} "
                              "(structured only)")
    params["als_iterations"] = args.als_iterations
  if "target_gap" in registry.strategy(strategy).declaration.parameters:
    params.update(target_gap=args.target_gap, max_iterations=args.max_iterations,
                  allow_unconverged=args.allow_unconverged)
  elif (args.target_gap, args.max_iterations, args.allow_unconverged) != (1e-6, 10_000, False):
    solvers = [name for name, entry in registry.STRATEGIES.items()
               if "target_gap" in entry.declaration.parameters]
    raise checks.CheckError("--target_gap/--max_iterations/--allow_unconverged apply to "
                            f"--mechanism {' and '.join(solvers)} only")
  spec = strategies.FactorizationSpec.with_parameters(params, workload=workload,
                                                      strategy=strategy, participation=schema)
  spec.validate()
  return spec


def result_record(f, entry) -> dict:
  """The JSON object ``tff-mf factorize --json`` prints."""
  md = entry.metadata
  return {
      "strategy": f.strategy, "workload": md.get("spec", {}).get("workload"), "n": f.n,
      "m": f.m, "participation": md.get("participation"), "sensitivity": md.get("sensitivity"),
      "sensitivity_exact": md.get("info", {}).get("sensitivity_exact"),
      "rmse": md.get("rmse"), "max_error": md.get("max_error"),
      "single_participation_sqrt_loss": f.single_participation_sqrt_loss,
      "single_participation_loss": f.single_participation_loss,
      "relative_gap": md.get("relative_gap"), "iterations": md.get("iterations"),
      "seconds": md.get("seconds"),
      # A load rechecks every figure from C, but not the solver's own record of its dual
      # certificate (it needs the dual point): on a cache hit the gap is the solver's claim.
      "not_rechecked": ["relative_gap"] if entry.cache_hit else [],
      # Entries written before the rename call γ "sensitivity_before_normalization".
      "gamma_before_normalization": md.get("gamma_before_normalization",
                                           md.get("sensitivity_before_normalization")),
      "path": entry.npz_path, "metadata_path": entry.json_path, "cache_hit": entry.cache_hit,
      "key": md.get("key"), "params": md.get("params"),
      # What was asked and what was done (tff_mf.factorization.strategies.solver_outcome).
      "outcome": f.info.get("outcome"),
  }


def register(subparsers) -> None:
  from tff_mf import registry  # pylint: disable=g-import-not-at-top
  from tff_mf import spec as spec_lib  # pylint: disable=g-import-not-at-top
  parser = subparsers.add_parser(
      "factorize", help="compute (or load from the cache) a factorization A = B·C",
      description="Computes a factorization A = B·C of a workload and stores float64 A, B, C, "
                  "its family's parameters and a JSON sidecar in the cache (default "
                  "~/.cache/tff_mf, or $TFF_MF_CACHE, or --cache_dir).")
  add_workload_arguments(parser)
  clitools.add_flag(parser, spec_lib.MECHANISM_FLAG, required=True, note=(
      "; here the one whose C is factorized, as in account, audit and training: a strategy "
      "(how C is chosen): " + "; ".join(
          f"{s.name}: {s.description}" for s in registry.STRATEGIES.values()) +
      ". Or a mechanism name, which maps to its strategy and workload (tff_mf.registry): " +
      clitools.mechanism_help()))
  add_participation_arguments(parser)
  group = parser.add_argument_group("strategy parameters")
  add_parameter_arguments(group)
  group.add_argument("--error", choices=("mean", "max"), default=None,
                     help="banded_toeplitz, blt: optimize the mean (rmse) or the max error "
                          "(default: mean)")
  group.add_argument("--target_gap", type=float, default=1e-6,
                     help="optimal, structured: relative duality gap to reach (default: 1e-6)")
  group.add_argument("--max_iterations", type=int, default=10_000,
                     help="optimal, and structured's optimal decoder B*: iteration limit "
                          "(default: 10000)")
  group.add_argument("--als_iterations", type=int, default=None, metavar="SWEEPS",
                     help="structured: sweeps of the ALS fit of B*'s low-rank part; more fit "
                          "it closer (default: 100)")
  group.add_argument("--allow_unconverged", action="store_true",
                     help="optimal: return (and cache) a result above --target_gap instead of "
                          "failing; the gap reached is reported (default: off)")
  clitools.add_cache_dir_flag(parser)
  parser.add_argument("--force", action="store_true",
                      help="recompute even if the cache has this entry; replaces a corrupt one "
                           "(default: off)")
  parser.add_argument("--json", action="store_true", help="print one JSON object (default: off)")
  clitools.add_progress_flags(parser, what="the solver's progress bar on stderr",
                              note="; off with --json")
  parser.add_argument("--strict", action="store_true",
                      help="fail (exit 2) when the solver returns other parameters than "
                           "requested or does not converge, instead of warning; the result "
                           "stays cached (default: off)")
  parser.set_defaults(func=run)


def _fmt(value, spec) -> str:
  return "n/a" if value is None else format(value, spec)


def run(args: argparse.Namespace) -> int:
  from tff_mf.factorization import cache  # pylint: disable=g-import-not-at-top
  from tff_mf import jsonio  # pylint: disable=g-import-not-at-top
  start = time.perf_counter()
  spec = spec_from_args(args)
  f, entry = cache.load_or_factorize(spec, cache_dir=args.cache_dir, force=args.force,
                                     progress=args.progress and not args.json,
                                     strict=args.strict)
  record = result_record(f, entry)
  record["wall_seconds"] = time.perf_counter() - start
  record["participation_source"] = clitools.participation_source(
      args.participation, args.epochs, args.min_sep, args.max_participations) or "default"
  if args.json:
    print(jsonio.dumps(record))
    return 0
  info = entry.metadata.get("info", {})
  # A fit to the optimal decoder (structured) reports the optimal solver's figures too.
  structured = info.get("optimal_sqrt_loss") is not None
  lines = [
      f"{'cache hit' if entry.cache_hit else 'computed'}: {f.strategy} for "
      f"{record['workload']} n={f.n}, participation {record['participation']['label']} "
      f"(from {record['participation_source']})",
      f"  sensitivity    {record['sensitivity']:.6g}"
      f"{'' if record['sensitivity_exact'] else ' (upper bound)'}",
      f"  rmse           {record['rmse']:.6g}",
      f"  max_error      {record['max_error']:.6g}",
      f"  sqrt(L)        {f.single_participation_sqrt_loss:.4f}",
  ]
  for key, value in record["outcome"]["returned"].items():
    lines.append(f"  {key:<14} {value}")
  if structured and info.get("optimal_sqrt_loss") is not None:
    lines.append(f"  optimal sqrt(L) {info['optimal_sqrt_loss']:.4f}")
  if record["relative_gap"] is not None:
    # A hit cannot recheck the gap (it needs the solver's dual point): say whose figure it is.
    lines.append(f"  {'gap of B*' if structured else 'relative gap':<14} "
                 f"{record['relative_gap']:.3g}"
                 + (" (the solver's record, not rechecked)" if entry.cache_hit else ""))
  if record["iterations"] is not None:
    lines.append(f"  {'ALS iterations' if structured else 'iterations':<14} "
                 f"{record['iterations']}")
  lines.append(f"  solver seconds {_fmt(record['seconds'], '.2f')}")
  lines.append(f"  file           {entry.npz_path}")
  if record["outcome"]["why"]:
    lines.append(f"  warning: {record['outcome']['why']}")
  print("\n".join(lines))
  sys.stdout.flush()
  return 0
