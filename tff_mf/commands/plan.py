"""``tff-mf plan``: which mechanism, participation schema and family parameters give the least
expected error at a deployment's size and target ε (``tff_mf.planner``)."""

from __future__ import annotations

import argparse

from tff_mf import clitools


def register(subparsers) -> None:
  from tff_mf import participation  # pylint: disable=g-import-not-at-top
  parser = subparsers.add_parser(
      "plan", help="rank mechanisms, schemas and family parameters by expected error at a "
                   "target epsilon for a deployment",
      description="For every trainable private mechanism, every schema the deployment can "
                  "enforce (each reaching --clients_per_round clients per round from "
                  "--population clients) and a small grid of family parameters (bands in "
                  "powers of 2 up to the separation, BLT buffers 1..4): calibrate z to the "
                  "target epsilon as a training run does (amplified where the schema's "
                  "sampling allows; every epsilon an upper bound) and score the expected "
                  "error of the workload at that z. Prints the candidates by expected error "
                  "(rmse), the recommendation, where it is fragile, what the deployment must "
                  "enforce and the flags that run it. docs/plan.md explains the table.")
  parser.add_argument("--population", type=int, required=True, metavar="P",
                      help="clients that can join the training (required)")
  clitools.add_rounds_flag(parser, required=True)
  from tff_mf import spec  # pylint: disable=g-import-not-at-top
  clitools.add_flag(parser, spec.CLIENTS_PER_ROUND_FLAG, required=True)
  clitools.add_target_epsilon_flag(parser)
  clitools.add_delta_flag(parser)
  parser.add_argument("--schemas", nargs="+", choices=participation.KINDS,
                      default=list(participation.KINDS), metavar="KIND",
                      help="the participation schemas the deployment can enforce: "
                           f"{', '.join(participation.KINDS)}")
  parser.add_argument("--mechanisms", nargs="+", default=None, metavar="NAME",
                      help="the mechanisms tried (default: every trainable private one)")
  parser.add_argument("--max_state_rows", type=int, default=None, metavar="ROWS",
                      help="a cap on the server's noise state in model-sized rows (default: "
                           "none)")
  clitools.add_flag(parser, spec.workload_flag("server_momentum"),
                    spelling=spec.MOMENTUM_SPELLING, note="; training's --server_momentum",
                    default_text="none, beta = 0: with a constant schedule, prefix sums")
  clitools.add_flag(parser, spec.workload_flag("lr_schedule"), default="constant",
                    default_text="constant")
  clitools.add_flag(parser, spec.workload_flag("schedule_rounds"), default_text="none")
  clitools.add_accountant_flag(parser)
  parser.add_argument("--skip_mmcc", action="store_true",
                      help="account candidates whose amplified analysis would be MMCC without "
                           "amplification (a valid, larger epsilon bound; MMCC takes minutes "
                           "per calibration)")
  parser.add_argument("--no_prune", action="store_true",
                      help="calibrate every candidate (default: prune those that one "
                           "evaluation of epsilon, or before factorizing a bound on every "
                           "factorization's error, shows worse than the best found)")
  parser.add_argument("--no_prefetch", action="store_true",
                      help="compute the dense families' factorizations in this process when "
                           "they are needed (default: a child process computes them, BLAS on "
                           "one thread, while the cheap families are calibrated)")
  clitools.add_cache_dir_flag(parser)
  parser.add_argument("--json", action="store_true", help="print JSON (default: off)")
  parser.add_argument("--plot", default=None, metavar="PATH",
                      help="write a PNG of expected error against epsilon for the best three "
                           "(default: none)")
  clitools.add_progress_flags(parser, what="a progress bar over the candidates on stderr")
  parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
  from tff_mf import jsonio  # pylint: disable=g-import-not-at-top
  from tff_mf import planner  # pylint: disable=g-import-not-at-top
  dep = planner.Deployment(
      population=args.population, total_rounds=args.n, clients_per_round=args.clients_per_round,
      target_epsilon=args.target_epsilon, delta=args.delta, schemas=tuple(args.schemas),
      max_state_rows=args.max_state_rows, momentum=args.momentum or 0.0,
      lr_schedule=args.lr_schedule, schedule_rounds=args.schedule_rounds,
      mechanisms=tuple(args.mechanisms) if args.mechanisms else None,
      accountant=args.accountant, skip_mmcc=args.skip_mmcc)
  result = planner.plan(dep, cache_dir=args.cache_dir, progress=args.progress,
                        prune=not args.no_prune, prefetch=not args.no_prefetch)
  if args.plot:
    from tff_mf import plots  # pylint: disable=g-import-not-at-top
    curves = planner.error_against_epsilon(dep, result, cache_dir=args.cache_dir)
    result["plot"] = plots.plot_error_against_epsilon(
        curves, args.plot, f"n={dep.total_rounds}, P={dep.population}, "
                           f"K={dep.clients_per_round}, delta={dep.delta:g}")
  if args.json:
    print(jsonio.dumps(result))
    return 0
  print_table(result)
  return 0


def print_table(result) -> None:
  """The ranked table, then the recommendation and what it needs."""
  from tff_mf import participation  # pylint: disable=g-import-not-at-top
  from tff_mf import planner  # pylint: disable=g-import-not-at-top
  d = planner.Deployment(**result["deployment"])
  print(f"n={d.total_rounds} P={d.population} K={d.clients_per_round} target "
        f"epsilon={d.target_epsilon:g} delta={d.delta:g}; rmse = z*||B||_F/sqrt(n) "
        "(units of clip_norm/K), max = z*max_i ||B_i||, rmse/E per expected participation")
  print(f"   {'mechanism':<16} {'schema':<24} {'params':<10} {'p':>7} {'z':>8} "
        f"{'epsilon':>8} {'bound':<17} {'rmse':>9} {'max':>9} {'rmse/E':>9} {'state':>5}")
  for i, c in enumerate(map(planner.Candidate.of_json, result["candidates"])):
    params = ",".join(f"{k}={v}" for k, v in c.params.items()) or "-"
    p = "-" if c.sampling_prob is None else f"{c.sampling_prob:.3g}"
    bound = c.bound + ("*" if c.mmcc_skipped else "")
    print(f"{'->' if i == 0 else '  '} {c.mechanism:<16} "
          f"{participation.from_dict(c.schema).label:<24} {params:<10} {p:>7} "
          f"{c.noise_multiplier:>8.4g} {c.epsilon:>8.4g} {bound:<17} {c.rmse:>9.4g} "
          f"{c.max_error:>9.4g} {c.rmse_per_participation:>9.4g} {c.state_rows:>5d}")
  print("-> recommended; * accounted without MMCC (--skip_mmcc); state: model-sized rows of noise "
        "state")
  print(f"deployment must enforce: {result['demands']}")
  print(f"train: {result['training_flags']}")
  print(f"Flower: {result['flower_arguments']}")
  for line in result["fragile"]:
    print(f"fragile: {line}")
  for x in result["left_out"]:
    print(f"left out: {x['what']}: {x['why']}")
  for x in result["pruned"]:
    print(f"pruned: {x['what']}: {x['why']}")
  if "plot" in result:
    print(f"plot: {result['plot']}")
  before = sum(1 for x in result["pruned"] if x.get("before_factorizing"))
  print(f"{len(result['candidates'])} candidates calibrated, {len(result['pruned'])} pruned "
        f"(shown worse by one evaluation of epsilon, or {before} of them before factorizing "
        f"by a bound on every factorization's error) in {result['seconds']:.1f} s")
