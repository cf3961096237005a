"""``tff-mf audit``: empirical privacy audit of the running TFF aggregator.

Builds the mechanism with ``build_mechanism`` inside ``build_unweighted_fed_avg``,
runs it many times with and without a canary client placed in the schema's worst
participation pattern on the noise observed in canary-free runs, and reports empirical
LOWER bounds on ε at δ and on the Gaussian-DP μ, against the claim
(``tff_mf.tf.audit``)::

  tff-mf audit --mechanism opt_prefix_sum --total_rounds 8 --noise_multiplier 0.5 \\
      --participation fixed_epoch --epochs 2 --json --plot out/audit.png

Exit status 1 when the bounds refute the claim (at the stated confidence), 0
otherwise, 2 for bad input. Imports TensorFlow only inside ``run``; without the TensorFlow
extra (``tff_mf.optional``) it stops at once with one line.
"""

from __future__ import annotations

import argparse
import json
import os
import textwrap

from tff_mf import clitools
from tff_mf import participation

EXTRAS = ("tff",)
_EXAMPLES = """examples:
  tff-mf audit --mechanism opt_prefix_sum --total_rounds 8 --noise_multiplier 0.5 \\
      --participation fixed_epoch --epochs 2
  tff-mf audit --mechanism banded --total_rounds 8 --bands 2 --noise_multiplier 0.6 \\
      --participation min_sep --min_sep 2 --max_participations 4 --json --plot out/audit_banded.png
  tff-mf audit --mechanism blt --total_rounds 8 --noise_multiplier 0.3 --participation min_sep \\
      --min_sep 4 --sampling_prob 0.5 --json

Every epsilon printed by the audit is an empirical LOWER bound (probability >= 1 - alpha
over its trials); the claimed epsilon is the mechanism's upper bound."""


def register(subparsers) -> None:
  parser = subparsers.add_parser(
      "audit",
      help="empirical privacy audit: lower bounds on epsilon and GDP mu from runs of the real "
           "aggregator with and without a worst-case canary",
      description=textwrap.fill(
          "Runs federated averaging with the mechanism's aggregator on a linear model many "
          "times, with fresh noise seeds, on two neighbouring datasets (with and without one "
          "canary client in the schema's worst participation pattern on the noise observed "
          "in canary-free calibration runs), applies the "
          "optimal test for a Gaussian mean shift in correlated noise and reports empirical "
          "LOWER bounds on epsilon at delta and on the Gaussian-DP mu with Clopper-Pearson "
          "confidence (Jagielski et al. 2020, arXiv:2006.07709; Nasr et al. 2023, "
          "arXiv:2302.07956), against the claimed mu = sens/z or the amplified epsilon."),
      epilog=_EXAMPLES)
  _add_mechanism_arguments(parser.add_argument_group("the audited configuration"))
  _add_audit_arguments(parser.add_argument_group("the audit"))
  parser.set_defaults(func=run)


def _add_mechanism_arguments(g) -> None:
  from tff_mf import spec  # pylint: disable=g-import-not-at-top
  clitools.add_flag(g, spec.MECHANISM_FLAG, required=True)
  clitools.add_rounds_flag(g, default=8, what=" (default: 8; the canary search is brute "
                                              "force, keep n small)")
  clitools.add_flag(g, spec.privacy_flag("noise_multiplier"), default_text="none")
  clitools.add_flag(g, spec.privacy_flag("target_epsilon"), default_text="none",
                    note="; here unamplified")
  clitools.add_flag(g, spec.CLIENTS_PER_ROUND_FLAG, default=2.0, default_text="2", kind=float,
                    note="; here any positive number")
  clitools.add_flag(g, spec.clipping_flag("clip_norm"), default=1.0, default_text="1",
                    kind=float, note="; here a number (the audit clips at a fixed norm)")
  clitools.add_flag(g, spec.workload_flag("server_momentum"), default=0.0, default_text="0",
                    note="; as training's")
  g.add_argument("--server_lr", type=float, default=1.0, help="server learning rate (default: 1)")
  clitools.add_schema_flags(g, default_text={
      "participation": "min_sep when --min_sep, --max_participations or --sampling_prob is "
                       "given, fixed_epoch when --epochs is given, else single"}, notes={
      "participation": ". The schema of the sampler"})
  g.add_argument("--accounted_as", choices=participation.SPELLINGS,
                 type=participation.canonical_kind, default=None,
                 help="build and account the mechanism under this schema instead (with the "
                      "same --epochs/--min_sep), while the canary follows --participation: "
                      "audits a run accounted for the wrong schema (default: --participation)")
  clitools.add_family_flags(g)


def _add_audit_arguments(g) -> None:
  from tff_mf import spec  # pylint: disable=g-import-not-at-top
  clitools.add_flag(g, spec.privacy_flag("sampling_prob"),
                    default_text="none, every round of its worst pattern",
                    note="; here the canary's, under min_sep: the claim is then MMCC's "
                         "amplified epsilon")
  clitools.add_delta_flag(g, what=" the bounds are stated at")
  g.add_argument("--alpha", type=float, default=0.01,
                 help="the bounds hold with probability >= 1 - alpha (default: 0.01)")
  g.add_argument("--trials", type=int, default=2048, help="trials per world (default: 2048)")
  g.add_argument("--trials_per_run", type=int, default=256,
                 help="trials packed into the coordinates of one run (default: 256)")
  g.add_argument("--calibration_trials", type=int, default=1024,
                 help="canary-free trials that estimate the covariance for the second "
                      "statistic (0: reported covariance only) (default: 1024)")
  g.add_argument("--others", choices=("zero", "random"), default="zero",
                 help="updates of the other clients (default: zero)")
  g.add_argument("--seed", type=int, default=None,
                 help="seed of the audit's own randomness (Poisson canary, random others); the "
                      "mechanism's noise seeds are always fresh (default: OS entropy)")
  g.add_argument("--plant_fault", default=None, metavar="FAULT",
                 help="audit a copy of the mechanism with this fault planted, to see that the "
                      "audit has the power to catch it at these trials: "
                      "under_reported_sensitivity (claim sens/1.25), noise_divided (noise/1.25), "
                      "repeated_noise_row (dense streams, at the reported worst canary), "
                      "schema_ignored (a single-participation mechanism, canary in fixed_epoch "
                      "2); away from the reported worst canary (dense streams): "
                      "repeated_noise_row_elsewhere, noise_row_scaled (one round's noise / 2), "
                      "noise_row_dropped (one row of the inverse encoder left out) "
                      "(default: none)")
  g.add_argument("--json", action="store_true", help="print one strict JSON object")
  g.add_argument("--plot", default=None, metavar="PNG",
                 help="write the score distributions and trade-off curves to this PNG")
  clitools.add_progress_flags(g, what="a progress bar on stderr")


def _schema(kind, args):
  takes = participation.CLASSES[participation.canonical_kind(kind)].takes
  if "epochs" in takes:
    return participation.from_args(kind, args.n, epochs=args.epochs)
  if takes:
    return participation.Participation(
        kind, **{name: getattr(args, name) for name in takes}).check(args.n)
  if args.epochs is not None or args.min_sep is not None or args.max_participations is not None:
    if args.accounted_as is None:
      raise ValueError("--epochs, --min_sep and --max_participations need --participation "
                       "fixed_epoch or min_sep")
  return participation.SINGLE


def run(args: argparse.Namespace) -> int:
  from tff_mf import audit as audit_lib  # pylint: disable=g-import-not-at-top
  clitools.resolve_mechanism(args.mechanism)  # an unknown name: the closest spelling
  audit_lib.check_auditable(args.mechanism)
  if args.plant_fault is not None and args.plant_fault not in audit_lib.FAULTS:
    from tff_mf import checks  # pylint: disable=g-import-not-at-top
    raise checks.CheckError(f"--plant_fault {args.plant_fault!r}: expected one of "
                            f"{', '.join(audit_lib.FAULTS)}")
  if args.noise_multiplier is not None:  # z = 0 is no claim to audit (no flag allows it)
    from tff_mf import checks  # pylint: disable=g-import-not-at-top
    checks.noise_multiplier(args.noise_multiplier, "--noise-multiplier")
  args.participation = clitools.implied_participation(
      args.participation, args.epochs, args.min_sep, args.max_participations, args.sampling_prob)
  schema = _schema(args.participation, args)
  accounted = _schema(args.accounted_as, args) if args.accounted_as else schema
  options = audit_lib.AuditOptions(
      trials=args.trials, trials_per_run=args.trials_per_run,
      calibration_trials=args.calibration_trials, delta=args.delta, alpha=args.alpha,
      others=args.others, sampling_prob=args.sampling_prob).checked()
  if args.plot:
    from tff_mf import optional  # pylint: disable=g-import-not-at-top
    optional.require("plot", "--plot")
    os.makedirs(os.path.dirname(os.path.abspath(args.plot)), exist_ok=True)
  from tff_mf.tf import audit, runtime  # pylint: disable=g-import-not-at-top
  runtime.install_exit_hook()
  from tff_mf import spec as spec_lib  # pylint: disable=g-import-not-at-top
  # The audit's --sampling_prob is the canary's (``AuditOptions``), not the spec's.
  spec = spec_lib.from_flags(
      vars(args), participation=accounted, total_rounds=args.n, sampling_prob=None,
      delta=args.delta if args.target_epsilon is not None else None)
  claimed, packed = audit.build_pair(spec, options.trials_per_run,
                                     server_learning_rate=args.server_lr)
  if args.plant_fault:
    claimed, packed, schema = audit.plant_fault(args.plant_fault, claimed, packed)
  report = audit.audit_setups(claimed, packed, options, schema=schema,
                              progress=args.progress, seed=args.seed)
  report["planted_fault"] = args.plant_fault
  if args.plot:
    report["plot"] = audit_lib.plot_audit(report, args.plot)
  out = audit.json_ready(report)
  if args.json:
    print(json.dumps(out, indent=1, allow_nan=False))
  else:
    _print_text(out)
  return 1 if out["violation"] else 0


def _statistic_line(name, st, claimed_mu) -> str:
  mark = "  <- decided" if st["decided"] else ""
  if claimed_mu:
    return (f"  {name}: estimated mu {st['mu_estimate']:.4g} +- {st['mu_standard_error']:.2g}, "
            f"mu lower bound {st['mu_lower_bound']:.4g}, epsilon lower bound "
            f"{st['epsilon_lower_bound']:.4g} (alpha {st['alpha']:g}){mark}")
  return (f"  {name}: epsilon lower bound {st['epsilon_lower_bound']:.4g} "
          f"(alpha {st['alpha']:g}){mark}")


def _print_text(r) -> None:
  c = r["canary"]
  lines = [
      f"mechanism: {r['mechanism']} (n={r['total_rounds']}, z={r['noise_multiplier']:g}, "
      f"{r['participation']['label']}, accounted as {r['claimed_participation']['label']})",
      f"canary: rounds {c['pattern']} signs {c['signs']}, the worst pattern on "
      f"{c['chosen_from']} (the reported noise matrix's worst: rounds "
      f"{c['reported_worst_pattern']})"
      + (f", Poisson p={r['sampling_prob']:g} over rounds {c['poisson_rounds']}"
         if r["sampling_prob"] else ""),
      f"trials: {r['trials']} per world ({r['trials_per_run']} per run), "
      f"confidence {r['confidence']:g}",
  ]
  if r.get("claimed_mu"):
    lines.append(f"GDP mu: claimed {r['claimed_mu']:.4g} (sens {r['claimed_sensitivity']:.4g} / "
                 f"z); of the reported noise: {r['release_mu']:.4g} at the canary's pattern, "
                 f"{r['reported_worst_mu']:.4g} at its worst")
  lines.append("statistics (each: estimate, empirical LOWER bounds):")
  lines += [_statistic_line(name, st, r.get("claimed_mu"))
            for name, st in r["statistics"].items()]
  ratio = r["power"]["detectable_mu_ratio"]
  power = f"probability >= {r['power']['probability']:g} at {r['trials']} trials per world"
  if ratio == "inf":
    lines.append(f"power: no fault is flagged with {power} (raise --trials)")
  elif ratio is not None:
    lines.append(f"power: a true mu of {ratio:.3g} x the claim at the canary's pattern is flagged "
                 f"with {power}")
  lines.append(f"epsilon at delta={r['delta']:g}: empirical LOWER bound "
               f"{r['epsilon_lower_bound']:.4g}, claimed (upper bound) "
               f"{r['claimed_epsilon']:.4g}")
  if r.get("claimed_mu"):
    lines.append(f"epsilon at delta={r['delta']:g} of the mu lower bound: "
                 f"{r['epsilon_of_mu_lower_bound']:.4g} (a LOWER bound if the trade-off curve "
                 "is Gaussian, as claimed)")
  lines += [f"warning: {w}" for w in r.get("warnings", [])]
  if r.get("planted_fault"):
    lines.append(f"planted fault: {r['planted_fault']} (a violation is the expected outcome)")
  lines.append("verdict: " + ("VIOLATION: the audit refutes the claim" if r["violation"]
                              else "no violation found (an audit cannot prove privacy)"))
  if r.get("plot"):
    lines.append(f"plot: {r['plot']}")
  print("\n".join(lines))
