"""``tff-mf account``: ε of a run under a participation schema, with or without amplification.

Without a matrix, single participation (Denisov et al. 2022, arXiv:2202.08312,
Thm 4.1): the run is one Gaussian mechanism with multiplier z (C normalized to
sensitivity 1)::

  tff-mf account --noise_multiplier 4.2 --delta 1e-6 [--accountant exact|pld|rdp] [--json]
  tff-mf account --target_epsilon 1.0 --delta 1e-6 --json

With a mechanism (``--mechanism``, any registry name, alias or strategy name: its C is
built, or factorized once into the cache and reused, exactly as training resolves it,
``tff_mf.mechanisms.resolve``) or a cached factorization (``--matrix``), under any schema,
unamplified (one Gaussian at z / sensitivity) or amplified by Poisson sampling (MMCC,
Choquette-Choo et al. 2024, arXiv:2310.15526; amplified banded, Choquette-Choo et al.
2023, arXiv:2306.08153), or by random allocation (``--participation random_allocation
--amplification amplified_allocation``, ``tff_mf.accounting.random_allocation``, after Schuchardt &
Kalinin 2026, arXiv:2601.21636). ``--participation balls_in_bins`` is the field's
fixed-bin scheme (arXiv:2410.06266), amplified by ``--amplification amplified_fixed_bin``
(``tff_mf.accounting.fixed_bin``)::

  tff-mf account --mechanism blt --total_rounds 256 --min_sep 32 --amplification mmcc \\
      --sampling_prob 0.25 --noise_multiplier 2 --delta 1e-6 --cache_dir D --json
  tff-mf account --matrix CACHE.npz --participation min_sep --min_sep 8 \\
      --amplification amplified_banded --sampling_prob 0.5 --target_epsilon 2 --delta 1e-6

Imports nothing heavy at module level (numpy and dp_accounting only inside ``run``).
"""

from __future__ import annotations

import argparse
import math
import sys
import textwrap
from typing import Optional

from tff_mf import clitools
from tff_mf.commands import factorize as factorize_cmd

# MMCC's own matrices (Choquette-Choo et al. 2024, arXiv:2310.15526, Sec 6.3 and App E),
# closed forms of tff_mf.accounting.mmcc that are no registry strategy, under names that say what they
# are: binary trees restarted every 2^(h-1) rounds (also the registry's accounting-only
# mechanism tree_restart) and the square root of the prefix-sum matrix truncated to b bands.
MMCC_MATRICES = {
    "tree_restart": "binary trees restarted every 2^(h-1) rounds (needs --height)",
    "truncated_sqrt_prefix": "the square root of the prefix-sum matrix truncated to --bands "
                             "bands (MMCC App E)",
}
# Flags that no longer exist, and what replaces them (a one-line error names it).
REMOVED_FLAGS = {
    "strategy": "use --mechanism (strategy and mechanism names both work; the old "
                "banded_toeplitz is --mechanism truncated_sqrt_prefix)",
    "mmcc": "use --amplification mmcc; --sampling_prob is the probability of each round a "
            "user may join (with --min_sep b: b times the old average rate)",
    "workers": "use --processes (local processes; --workers means TFF worker addresses in "
               "every tool)",
}

_EXAMPLES = """examples:
  tff-mf account --noise_multiplier 4.2 --delta 1e-6
  tff-mf account --target_epsilon 1 --delta 1e-6 --json
  tff-mf account --mechanism gaussian --total_rounds 64 --participation min_sep --min_sep 8 \\
      --noise_multiplier 4 --delta 1e-6
  tff-mf account --mechanism honaker_online --total_rounds 1024 --amplification mmcc \\
      --sampling_prob 0.001 --noise_multiplier 16 --delta 1e-6
  tff-mf account --mechanism blt --total_rounds 256 --min_sep 32 --amplification mmcc \\
      --sampling_prob 0.25 --noise_multiplier 2 --delta 1e-6
  tff-mf account --mechanism tree_restart --height 4 --total_rounds 512 --participation min_sep \\
      --min_sep 8 --amplification amplified_banded --sampling_prob 0.5 --target_epsilon 2 --delta 1e-6
  tff-mf account --matrix ~/.cache/tff_mf/<entry>/<file>.npz --amplification mmcc \\
      --sampling_prob 0.01 --noise_multiplier 8 --delta 1e-6
  tff-mf account --mechanism blt --total_rounds 256 --participation random_allocation --epochs 8 \\
      --amplification amplified_allocation --noise_multiplier 2 --delta 1e-6
  tff-mf account --mechanism blt --total_rounds 256 --participation balls_in_bins --epochs 8 \\
      --noise_multiplier 2 --delta 1e-6

Every epsilon printed is an upper bound. --json prints one strict JSON object (an
unbounded epsilon is the string "inf")."""


def register(subparsers) -> None:
  parser = subparsers.add_parser(
      "account",
      help="privacy accounting: epsilon of a run or the noise for a target epsilon, under a "
           "participation schema, with or without amplification by sampling",
      description=textwrap.fill(
          "Epsilon (an upper bound) of a matrix-factorization run, or the smallest noise "
          "multiplier reaching a target epsilon. Unamplified: the run is one Gaussian mechanism "
          "with multiplier z / sensitivity, the sensitivity of C under the participation schema "
          "(Denisov et al. 2022, arXiv:2202.08312, Thm 4.1; Choquette-Choo et al. 2023, "
          "arXiv:2211.06530). Amplified by Poisson sampling: MMCC (Choquette-Choo et al. 2024, "
          "arXiv:2310.15526, Fig 1 and App D) for any lower-triangular non-negative C, or "
          "amplified banded MF (Choquette-Choo et al. 2023, arXiv:2306.08153, Thm 4) for a C "
          "with at most b non-zero bands under b-min-sep sampling. Amplified by random "
          "allocation (--participation random_allocation, a new random round each epoch): "
          "Renyi bounds of the random-allocation pair after Schuchardt & Kalinin 2026, "
          "arXiv:2601.21636 (--amplification amplified_allocation). --participation "
          "balls_in_bins is the field's fixed-bin scheme (one secret bin per user, every "
          "b-th round; arXiv:2410.06266), amplified by --amplification amplified_fixed_bin "
          "(tff_mf.accounting.fixed_bin)."),
      epilog=_EXAMPLES, removed=REMOVED_FLAGS)
  _add_run_arguments(parser)
  _add_schema_arguments(parser.add_argument_group("participation schema"))
  _add_encoder_arguments(
      parser.add_argument_group("encoder C (needed for other schemas and amplification)"))
  _add_amplification_arguments(parser.add_argument_group(
      "amplification by sampling (Poisson, or random allocation)"))
  _add_slack_arguments(parser.add_argument_group("below the bound (amplified analyses)"))
  parser.set_defaults(func=run)


class _Default(str):
  """A flag's default that knows it is one (an explicit ``--accountant`` is a plain str)."""


# Above this z the accountants' arithmetic (z², ρ = sens²/(2z²)) leaves float64's range; every
# distribution and accountant refuses it alike (the continuous PLD and RDP ones overflowed at
# about 1.3e154, the discrete Gaussian's ρ underflowed).
MAX_NOISE_MULTIPLIER = 1e100


def _add_run_arguments(parser) -> None:
  """The noise (or target ε), δ, the accountant and the output format."""
  from tff_mf import spec  # pylint: disable=g-import-not-at-top
  clitools.add_flag(parser, spec.privacy_flag("noise_multiplier"), default_text="none")
  clitools.add_flag(parser, spec.privacy_flag("target_epsilon"), default_text="none",
                    note="; here within --tolerance, by the analysis --amplification names")
  clitools.add_delta_flag(parser)
  clitools.add_accountant_flag(parser)
  from tff_mf import accounting  # pylint: disable=g-import-not-at-top
  parser.set_defaults(accountant=_Default(accounting.DEFAULT_ACCOUNTANT))
  clitools.add_flag(parser, spec.privacy_flag("noise_distribution"), default="gaussian",
                    default_text="gaussian",
                    note=", or a --matrix of theirs; discrete_gaussian takes no --accountant")
  parser.add_argument("--tolerance", type=float, default=1e-3,
                      help="relative tolerance of --target_epsilon calibration: the z printed "
                           "exceeds the smallest valid z by less than this fraction "
                           "(default: 1e-3)")
  parser.add_argument("--json", action="store_true",
                      help="print one strict JSON object instead of key: value lines "
                           "(default: off)")


def _add_schema_arguments(schema) -> None:
  clitools.add_schema_flags(schema, default_text={
      "participation": "the schema --matrix was built for; otherwise min_sep when --min_sep "
                       "or --max_participations is given or the run is amplified, fixed_epoch "
                       "when --epochs is given, else single",
      "min_sep": "1 when amplified", "epochs": "none"}, notes={
      "participation": ". With amplification the schema names the rounds a user may be "
                       "sampled in: min_sep b = one residue class mod b (b = 1: every round), "
                       "fixed_epoch k = one round per epoch of n/k rounds"})


def _add_encoder_arguments(matrix) -> None:
  from tff_mf import spec  # pylint: disable=g-import-not-at-top
  clitools.add_flag(matrix, spec.MECHANISM_FLAG, default_text="none", note=(
      "; here the one whose C is accounted for: a registry mechanism or strategy name, its C "
      "built or factorized into the cache and reused (as training resolves it: optimized for "
      "the schema where its strategy can be, for the workload below); or one of MMCC's own "
      f"matrices: {'; '.join(f'{k}: {v}' for k, v in MMCC_MATRICES.items())}. "
      f"{clitools.mechanism_help()}"))
  matrix.add_argument("--matrix", default=None, metavar="PATH",
                      help="a cached factorization .npz (tff-mf factorize prints its path); it "
                           "is checked on load and its normalized C is used (default: none)")
  factorize_cmd.add_workload_arguments(matrix)
  factorize_cmd.add_parameter_arguments(matrix)  # truncated_sqrt_prefix: --bands too
  matrix.add_argument("--height", type=int, default=None,
                      help="tree_restart: height h of each tree, restarted every 2^(h-1) rounds "
                           "(default: none)")
  clitools.add_cache_dir_flag(matrix)


def _add_amplification_arguments(amp) -> None:
  from tff_mf.accounting import analyses  # pylint: disable=g-import-not-at-top
  amp.add_argument("--amplification",
                   # former names (analyses.RENAMED) are refused, naming the new; the
                   # usage line shows the current ones only
                   choices=analyses.SELECTABLE + tuple(analyses.RENAMED),
                   metavar="{" + ",".join(analyses.SELECTABLE) + "}",
                   default=None,
                   help="none: one Gaussian at z / sensitivity; mmcc: MMCC for any "
                        "lower-triangular non-negative C; amplified_banded (formerly banded, "
                        "a name now refused): amplified banded MF for C "
                        "with at most b non-zero bands under b-min-sep sampling; "
                        "monte_carlo_bound: Monte-Carlo accounting with a proof for any "
                        "lower-triangular C >= 0 under min_sep / fixed_epoch Poisson sampling "
                        "(with --sampling_prob) or fixed-bin balls_in_bins, its epsilon labelled "
                        "with --failure_probability; "
                        "amplified_allocation (formerly random_allocation, now only the "
                        "kind's name): random allocation (--participation "
                        "random_allocation --epochs K, no --sampling_prob; never fixed-bin "
                        "balls_in_bins) for any square lower-triangular "
                        "non-negative C, Renyi bounds after arXiv:2601.21636; "
                        "amplified_fixed_bin (formerly balls_in_bins, now only the kind's "
                        "name): "
                        "fixed-bin balls-in-bins (--participation balls_in_bins --epochs K), "
                        "tff_mf.accounting.fixed_bin, for the same C as amplified_allocation "
                        "(default: none; "
                        "with --sampling_prob, the analysis training uses: amplified_banded when C has at "
                        "most b bands, else mmcc, under min_sep with p < 1 and no binding "
                        "--max_participations, else none; the output names it)")
  from tff_mf import spec  # pylint: disable=g-import-not-at-top
  clitools.add_flag(amp, spec.privacy_flag("sampling_prob"), default_text="none",
                    note="; needed with --amplification mmcc or amplified_banded; alone, it "
                         "picks the analysis as training does")
  amp.add_argument("--non_adaptive", action="store_true",
                   help="mmcc: assert the data are fixed in advance (allows non-triangular or "
                        "signed C; |C| is used) (default: off)")
  amp.add_argument("--processes", type=int, default=2,
                   help="mmcc: local processes computing distinct row PLDs (default: 2)")
  amp.add_argument("--grid_resolution", type=int, default=64,
                   help="mmcc: entries of C are rounded up to multiples of max|C| / this "
                        "(default: 64)")
  amp.add_argument("--pld_discretization", type=float, default=1e-4,
                   help="mmcc, amplified_banded: privacy-loss grid step of the PLDs, coarsened "
                        "automatically where a PLD would be too large (default: 1e-4)")
  amp.add_argument("--bound_samples", type=int, default=1_000_000, metavar="N",
                   help="monte_carlo_bound: draws of the privacy loss per direction and class "
                        "(default: 1000000)")
  amp.add_argument("--failure_probability", type=float, default=1e-3, metavar="BETA",
                   help="monte_carlo_bound: its epsilon holds with probability >= 1 - BETA over "
                        "the accountant's own draws of one run whose seed was fixed before any "
                        "result was seen, and is printed with that label (default: 0.001)")
  amp.add_argument("--accountant_seed", type=int, default=None, metavar="S",
                   help="monte_carlo_bound: pin the seed of the accountant's draws, chosen before "
                        "seeing any result: rerunning with other seeds and keeping the smallest "
                        "epsilon voids BETA (default: OS entropy; the seed is recorded either "
                        "way)")
  clitools.add_progress_flags(amp, what="progress bars on stderr (mmcc, factorizing)")


def _add_slack_arguments(slack) -> None:
  slack.add_argument("--lower_bound", action="store_true",
                     help="mmcc, amplified_banded, amplified_allocation, amplified_fixed_bin: also "
                          "print a "
                          "proven LOWER bound on the true epsilon (lower_bound_epsilon; "
                          "b-min-sep: one residue class's first rounds, each joined with "
                          "probability p, tff_mf.accounting.mixture_pair; random allocation: "
                          "tff_mf.accounting.random_allocation; fixed bin: tff_mf.accounting.fixed_bin) and "
                          "slack = epsilon / lower_bound_epsilon (default: off)")
  slack.add_argument("--monte_carlo_samples", type=int, default=None, metavar="N",
                     help="mmcc, amplified_banded: also print a Monte-Carlo ESTIMATE of the same pair's "
                          "epsilon from N draws (Choquette-Choo et al. 2024, arXiv:2410.06266; "
                          "monte_carlo_estimate): sampling error, not a bound, never the run's "
                          "epsilon (default: none)")


def _check_slack_flags(args: argparse.Namespace, analysis: Optional[type]) -> None:
  """One-line errors for --lower_bound / --monte_carlo_samples where they do not apply
  (``analysis``: the class of ``tff_mf.accounting.analyses``, None while training's choice is pending)."""
  flags = [f for f, on in (("--lower_bound", args.lower_bound),
                           ("--monte_carlo_samples", args.monte_carlo_samples is not None)) if on]
  if flags and analysis is not None and not analysis.amplified:
    _fail(f"{flags[0]} needs --amplification mmcc, amplified_banded, "
          "amplified_allocation or amplified_fixed_bin "
          "(it bounds the sampled run's epsilon from below)")
  if args.monte_carlo_samples is not None and args.monte_carlo_samples < 1000:
    _fail(f"--monte_carlo_samples must be an integer >= 1000, got {args.monte_carlo_samples}")
  if flags and args.non_adaptive:
    _fail(f"{flags[0]} needs a non-negative lower-triangular C (not --non_adaptive)")


def _add_slack(record: dict, bound, c, args: argparse.Namespace) -> None:
  """The proven lower bound, the slack and the Monte-Carlo estimate, as separate fields of
  the printed ``record``, for the ``bound`` it prints (``tff_mf.accounting.Bound``).

  Residue class 0 of b-min-sep Poisson sampling (fixed_epoch k: b = n/k), each of its
  rounds joined with probability p, at the z of the record (``tff_mf.accounting.mixture_pair``).
  """
  from tff_mf.accounting import mixture_pair  # pylint: disable=g-import-not-at-top
  from tff_mf import participation  # pylint: disable=g-import-not-at-top
  schema = participation.from_dict(record["schema"])
  if schema.allocation_amplified and args.monte_carlo_samples is None:
    from tff_mf.accounting import fixed_bin  # pylint: disable=g-import-not-at-top
    from tff_mf.accounting import random_allocation  # pylint: disable=g-import-not-at-top
    module = fixed_bin if schema.marks_fixed_bin else random_allocation
    lower = module.lower_bound(c, record["schema"]["epochs"], bound.noise_multiplier,
                               bound.delta)
    record["lower_bound_epsilon"] = lower
    record["lower_bound_method"] = (
        f"proven lower bound on the true epsilon: the all-ones adversary of {schema.kind}, "
        f"threshold tests on projections ({module.__name__}.lower_bound)")
    record["slack"] = bound.epsilon / lower if lower > 0 else float("inf")
    return
  if schema.not_poisson is not None:
    _fail(f"--lower_bound covers b-min-sep Poisson sampling (--participation min_sep or "
          f"fixed_epoch), random_allocation and balls_in_bins, --monte_carlo_samples only the "
          f"first; not "
          f"{record['schema']['kind']}")
  pair = (c, bound.sampling_prob, bound.noise_multiplier, bound.delta)
  options = {"min_sep": bound.min_sep}
  if args.lower_bound:
    lower = mixture_pair.lower_bound(*pair, **options)
    record["lower_bound_epsilon"] = lower.epsilon
    record["lower_bound_method"] = (
        f"proven lower bound on the true epsilon: residue class 0, its first "
        f"{lower.columns} rounds joined with probability p, threshold tests on projections "
        "(tff_mf.accounting.mixture_pair.lower_bound)")
    record["slack"] = bound.epsilon / lower.epsilon if lower.epsilon > 0 else float("inf")
  if args.monte_carlo_samples is not None:
    from tff_mf.accounting import analyses  # pylint: disable=g-import-not-at-top
    estimator = analyses.MonteCarlo(samples=args.monte_carlo_samples)
    record["monte_carlo_estimate"] = estimator.estimate(*pair, **options)


# ----------------------------------------------------------------------------- inputs


def _fail(message: str):
  from tff_mf import checks  # pylint: disable=g-import-not-at-top
  raise checks.CheckError(message)


_WORKLOAD_FLAGS = ("workload", "momentum", "schedule_rounds", "matrix_file", "cache_dir")
def _parameter_flags() -> tuple:
  """The family flags (``tff_mf.spec.family_flags``) and MMCC's --height."""
  from tff_mf import spec as spec_lib  # pylint: disable=g-import-not-at-top
  return tuple(f.name for f in spec_lib.family_flags()) + ("height",)


def _given(args: argparse.Namespace, flags) -> list:
  """The flags among ``flags`` given a value (--lr_schedule: other than constant)."""
  given = [f for f in flags if getattr(args, f) is not None]
  if "workload" in flags and args.lr_schedule != "constant":
    given.append("lr_schedule")
  return given


def _encoder(args: argparse.Namespace, amplified: bool):
  """(C or None, source label, the cached schema dict or None, extra record fields)."""
  from tff_mf import checks  # pylint: disable=g-import-not-at-top
  if args.matrix is not None and args.mechanism is not None:
    _fail("give one of --matrix and --mechanism")
  if args.matrix is not None:
    from tff_mf.factorization import cache  # pylint: disable=g-import-not-at-top
    for flag in _given(args, _parameter_flags() + _WORKLOAD_FLAGS):
      _fail(f"--{flag} describes a mechanism, not --matrix")
    f = cache.load(args.matrix)
    _check_schema_named(args, f)
    if args.noise_distribution == "discrete_gaussian":
      _check_discrete_matrix(f, args.matrix)
    n = f.c.shape[1]
    if args.n is not None and args.n != n:
      _fail(f"--total_rounds {args.n} does not match the matrix in {args.matrix} ({n} rounds)")
    return f.c, args.matrix, (f.info or {}).get("participation"), {}
  if args.mechanism is None:
    for flag in ["total_rounds"] + _given(args, _parameter_flags() + _WORKLOAD_FLAGS):
      if flag == "total_rounds" and args.n is None:
        continue
      _fail(f"--{flag} needs --mechanism")
    return None, None, None, {}
  if args.n is None and args.matrix_file is None:
    _fail("--mechanism needs --total_rounds (the number of rounds n)")
  if args.mechanism in MMCC_MATRICES:
    return _mmcc_matrix(args) + (None, {})
  mech = clitools.resolve_mechanism(args.mechanism)  # every strategy name is one too
  if mech.name == "none":
    _fail("mechanism none adds no noise: its epsilon is infinite")
  if args.height is not None:
    _fail("--height belongs to tree_restart")
  if mech.strategy is None:
    _fail(f"mechanism {mech.name}: {mech.why_not_trainable or 'no encoder C'}")
  # The run's β decides its workload (training_workload); --workload momentum alone would
  # account factorize's default β, which no run without --server_momentum trains with.
  if mech.momentum_workload and args.workload != "prefix_sum" and not _given(
      args, ("momentum", "matrix_file")) and args.lr_schedule == "constant":
    _fail(f"--mechanism {mech.name} factorizes the run's momentum workload: give the run's "
          f"--momentum BETA (training's --server_momentum; with --lr_schedule if it has one), "
          f"or --workload prefix_sum for a run without momentum")
  workload = factorize_cmd.workload_from_args(args)
  n = workload.n
  from tff_mf import mechanisms, registry  # pylint: disable=g-import-not-at-top
  from tff_mf.factorization import strategies  # pylint: disable=g-import-not-at-top
  if mech.post_processes_prefix_decoder or strategies.toeplitz_column(mech.strategy,
                                                                      workload) is None:
    checks.dense_matrices_fit(n, 3, f"mechanism {mech.name} at n = {n}", m=2 * n)
  schema = _schema(args, n, None, amplified)
  from tff_mf import spec as spec_lib  # pylint: disable=g-import-not-at-top
  takes = registry.default_parameters(mech.strategy, n, schema)
  params = spec_lib.family_values(vars(args))
  for flag in params:
    if flag not in takes:
      _fail(f"--{flag} does not apply to --mechanism {args.mechanism}")
  # The accounting spec: the mechanism as a run resolves it, checked as a run's spec is, and
  # its privacy; ε does not depend on the clip norm or K, which it leaves out.
  spec = spec_lib.MechanismSpec(mech, workload, schema, _privacy(args, schema), params=params)
  resolved = mechanisms.resolve_spec(spec, cache_dir=args.cache_dir, progress=args.progress)
  info = resolved.info
  extra = {"mechanism": mech.name, "workload": workload.kind}
  for key in ("cache_npz", "cache_hit", "bands", "rank", "buffers", "optimized_for"):
    if key in info:
      extra[key] = info[key]
  label = f"{mech.name} ({mech.label})"
  if info.get("cache_npz"):
    label += f", {'cache hit' if info.get('cache_hit') else 'factorized into the cache'}: " \
             f"{info['cache_npz']}"
  return resolved.encoder, label, None, extra


def _privacy(args: argparse.Namespace, schema):
  """The spec's ``Privacy`` of the flags (the sampling probability where the schema samples
  by Poisson; the other analyses are this command's own choice)."""
  from tff_mf import spec as spec_lib  # pylint: disable=g-import-not-at-top
  return spec_lib.Privacy(
      args.noise_multiplier, args.target_epsilon, args.delta, str(args.accountant),
      args.sampling_prob if schema.poisson else None,
      allow_no_noise=args.noise_multiplier == 0.0, noise_distribution=args.noise_distribution)


def _mmcc_matrix(args: argparse.Namespace):
  """(C, source label) of one of MMCC's own matrices."""
  from tff_mf import checks  # pylint: disable=g-import-not-at-top
  from tff_mf.accounting import mmcc  # pylint: disable=g-import-not-at-top
  for flag in _given(args, ("rank", "buffers") + _WORKLOAD_FLAGS):
    if flag != "cache_dir":  # accepted (nothing to cache), so one command fits every mechanism
      _fail(f"--{flag} does not apply to --mechanism {args.mechanism}")
  n = checks.positive_int(args.n, "--total_rounds")
  checks.dense_matrices_fit(n, 2, f"{args.mechanism} at n = {n}", m=2 * n)
  if args.mechanism == "tree_restart":
    if args.bands is not None:
      _fail("--bands does not apply to --mechanism tree_restart")
    if args.height is None:
      _fail("tree_restart needs --height")
    return (mmcc.tree_restart_matrix(n, checks.positive_int(args.height, "--height")),
            "tree_restart (binary trees restarted every 2^(h-1) rounds, MMCC Sec 6.3)")
  if args.height is not None:
    _fail("--height belongs to tree_restart")
  if args.bands is None:
    _fail("truncated_sqrt_prefix needs --bands")
  return (mmcc.truncated_sqrt_prefix_matrix(n, checks.positive_int(args.bands, "--bands")),
          "truncated_sqrt_prefix (square root of S truncated to --bands bands, MMCC App E)")


def _schema_source(args: argparse.Namespace, cached, amplified: bool) -> str:
  """Where the schema accounted for came from (printed with it)."""
  if args.participation is not None:
    return "--participation"
  for flag in ("epochs", "min_sep", "max_participations"):
    if getattr(args, flag) is not None:
      return f"--{flag}"
  if cached:
    from tff_mf import participation  # pylint: disable=g-import-not-at-top
    return ("the cache entry's key (its C was built for this schema)" if not amplified or
            not participation.from_dict(cached).at_most_once else
            "the cache entry's key (single), as min_sep b = 1 for amplification")
  return "default (min_sep b = 1 when amplified)" if amplified else "default (single)"


def _check_schema_named(args: argparse.Namespace, f) -> None:
  """A C that serves every schema (``families.Declaration.schema_free``: one cache entry, the
  single-participation one, for every schema a mechanism runs it under) does not say which
  schema a run used: its schema must be named, never taken from the entry."""
  from tff_mf import registry  # pylint: disable=g-import-not-at-top
  if not registry.strategy(f.strategy).declaration.schema_free:
    return
  if args.participation is None and all(getattr(args, flag) is None for flag in
                                        ("epochs", "min_sep", "max_participations")):
    _fail(f"--matrix {args.matrix}: the C of {f.strategy} serves every schema (one cache "
          "entry for all of them), so it does not say which one the run used; name it "
          "(--participation, --epochs, --min_sep)")


def _schema(args: argparse.Namespace, n, cached, amplified: bool):
  """The participation schema of the run (see --participation's help)."""
  from tff_mf import checks  # pylint: disable=g-import-not-at-top
  from tff_mf import participation  # pylint: disable=g-import-not-at-top
  kind = args.participation
  if kind is None:
    if args.epochs is not None:
      kind = "fixed_epoch"
    elif args.min_sep is not None or args.max_participations is not None:
      kind = "min_sep"
    elif cached:
      schema = participation.from_dict(cached)
      if amplified and schema.at_most_once:
        return participation.min_sep(1)
      return schema
    else:
      kind = "min_sep" if amplified else "single"
  takes = participation.CLASSES[participation.canonical_kind(kind)].takes
  if "epochs" not in takes and args.epochs is not None:
    _fail("--epochs belongs to --participation fixed_epoch, balls_in_bins or random_allocation")
  for flag in ("min_sep", "max_participations"):
    if flag not in takes and getattr(args, flag) is not None:
      _fail(f"--{flag} belongs to --participation min_sep")
  if not takes:
    return participation.SINGLE
  if "epochs" in takes:
    if args.epochs is None:
      _fail(f"--participation {kind} needs --epochs")
    return participation.Participation(kind, epochs=checks.positive_int(args.epochs, "--epochs"))
  if args.min_sep is None and not amplified:
    _fail("--participation min_sep needs --min_sep")
  b = checks.positive_int(1 if args.min_sep is None else args.min_sep, "--min_sep")
  k = args.max_participations
  if k is not None:
    k = checks.positive_int(k, "--max_participations")
  elif n is not None:
    k = -(-n // b)
  return participation.Participation("min_sep", min_sep=b, max_participations=k)


def _analysis_as_training(c, schema, sampling_prob: float):
  """(analysis class, why) for --sampling_prob without --amplification: the analysis a
  training run of the same C, schema and p uses (``tff_mf.mechanisms``)."""
  from tff_mf.accounting import analyses  # pylint: disable=g-import-not-at-top
  from tff_mf import mechanisms  # pylint: disable=g-import-not-at-top
  if schema.allocation_amplified:
    _fail(f"--sampling_prob does not apply to --participation {schema.kind} (a user's rounds "
          f"are allocated, not sampled)")
  if not mechanisms.amplification_applies(schema, c.shape[1], sampling_prob):
    return analyses.Unamplified, ("chosen as training chooses: none (amplification by "
                                  "sampling needs min_sep with p < 1 and no binding "
                                  "--max_participations)")
  analysis = analyses.REGISTRY[mechanisms.amplified_analysis(c, schema)]
  return analysis, (f"chosen as training chooses: {analysis.name} "
                    f"({analysis.chosen_because})")


# ----------------------------------------------------------------------------- output


def _with_statement(record: dict) -> dict:
  """The record and its privacy statement (``tff_mf.accounting.statement``, for the configuration
  given: no run, nothing sampled)."""
  from tff_mf import registry  # pylint: disable=g-import-not-at-top
  from tff_mf.accounting import statement  # pylint: disable=g-import-not-at-top
  setup = {}
  if record.get("mechanism"):
    setup.update(mechanism=record["mechanism"], label=registry.label(record["mechanism"]))
  elif record.get("matrix"):
    setup["matrix"] = record["matrix"]
  return dict(record, privacy_statement=statement.privacy_statement(record, run=False,
                                                                    setup=setup))


# The fields that carry a high-probability analysis's ε (printed with its label).
LABELLED = ("epsilon", "amplified_epsilon", "target_epsilon")


def _print(record: dict, as_json: bool) -> None:
  """key: value lines (the privacy statement last, as text), or one JSON object."""
  from tff_mf import jsonio  # pylint: disable=g-import-not-at-top
  record = jsonio.jsonable(record)
  if as_json:
    print(jsonio.dumps(record))
    return
  text = record.pop("privacy_statement", {}).get("text")
  label = record.get("epsilon_label")  # an ε that holds with probability >= 1 - beta
  for key in sorted(record):
    value = record[key]
    if isinstance(value, (dict, list)):
      value = jsonio.dumps(value)
    elif label and key in LABELLED:
      value = f"{value} ({label})"
    print(f"{key}: {value}")
  if text:
    print(f"\n{text}")


# ----------------------------------------------------------------------------- run


def _check_allocation_schema(spelling: Optional[str], analysis) -> None:
  """--amplification amplified_allocation / amplified_fixed_bin analyzes its own schema only
  (``analysis.kind``; or no --participation)."""
  from tff_mf import participation  # pylint: disable=g-import-not-at-top
  kind = None if spelling is None else participation.CLASSES[participation.canonical_kind(spelling)]
  if kind is None or kind.kind == analysis.kind:
    return
  name = analysis.name
  if kind.allocation_amplified:
    what = "the field's fixed-bin scheme" if kind.marks_fixed_bin else "a new round each epoch"
    _fail(f"--amplification {name} analyzes --participation {analysis.kind}, not {kind.kind} "
          f"({what}: a different mechanism, which it does not bound)")
  _fail(f"--amplification {name} needs --participation {analysis.kind}")


def _analysis_options(args: argparse.Namespace) -> dict:
  """The analyses' options the flags give (each analysis takes its own fields)."""
  return {"pld_discretization": args.pld_discretization, "non_adaptive": args.non_adaptive,
          "mmcc_options": {"workers": args.processes, "grid_resolution": args.grid_resolution,
                           "progress": args.progress},
          "samples": args.bound_samples, "failure_probability": args.failure_probability,
          "seed": args.accountant_seed}


def _check_bound_flags(args: argparse.Namespace, sampled: bool) -> None:
  """One-line errors for the Monte-Carlo bound's flags (out of range, or without it)."""
  if sampled and not 0.0 < args.failure_probability < 1.0:
    _fail(f"--failure_probability must be in (0, 1), got {args.failure_probability}")
  if sampled and args.bound_samples < 1000:
    _fail(f"--bound_samples must be an integer >= 1000, got {args.bound_samples}")
  if not sampled:
    for flag, given in (("--bound_samples", args.bound_samples != 1_000_000),
                        ("--failure_probability", args.failure_probability != 1e-3),
                        ("--accountant_seed", args.accountant_seed is not None)):
      if given:
        _fail(f"{flag} applies to --amplification monte_carlo_bound")


def _refuse_renamed_amplification(args: argparse.Namespace) -> None:
  """A former analysis name (``analyses.RENAMED``) is refused in one line naming the new."""
  from tff_mf.accounting import analyses  # pylint: disable=g-import-not-at-top
  if args.amplification in analyses.RENAMED:
    _fail(analyses.renamed_refusal(args.amplification, spell=lambda n: f"--amplification {n}"))


def _discrete_strategies():
  """The strategies of the mechanisms the discrete Gaussian runs (``discrete_gaussian.MECHANISMS``,
  the rule training applies, ``tff_mf.spec``)."""
  from tff_mf.noise import discrete_gaussian as dg  # pylint: disable=g-import-not-at-top
  from tff_mf import registry  # pylint: disable=g-import-not-at-top
  return {registry.mechanism(name).strategy: name for name in dg.MECHANISMS}


def _check_discrete_matrix(f, path: str) -> None:
  """--matrix with the discrete Gaussian: a C some run can stream with integer noise (a
  strategy of ``discrete_gaussian.MECHANISMS``, square lower-triangular with a non-zero
  diagonal, ``discrete_gaussian.band_coefficients``), else one line naming why."""
  from tff_mf import checks  # pylint: disable=g-import-not-at-top
  from tff_mf.noise import discrete_gaussian as dg  # pylint: disable=g-import-not-at-top
  allowed = _discrete_strategies()
  if f.strategy not in allowed:
    _fail(f"--matrix {path} (strategy {f.strategy}) with --noise_distribution discrete_gaussian: "
          f"no run can use that C with integer noise (its C-domain encoder would keep every "
          f"past sum; training refuses it); use a matrix of "
          f"{', '.join(f'{s} (--mechanism {m})' for s, m in allowed.items())}")
  try:
    dg.band_coefficients(f.c)
  except checks.CheckError as e:
    _fail(f"--matrix {path} with --noise_distribution discrete_gaussian: {e}")


def _run_discrete(args: argparse.Namespace, accountant_given: bool) -> int:
  """--noise_distribution discrete_gaussian: the zCDP record of ``tff_mf.mechanisms``."""
  from tff_mf import accounting  # pylint: disable=g-import-not-at-top
  from tff_mf.noise import discrete_gaussian as dg  # pylint: disable=g-import-not-at-top
  from tff_mf import mechanisms  # pylint: disable=g-import-not-at-top
  from tff_mf import registry  # pylint: disable=g-import-not-at-top
  from tff_mf import spec as spec_lib  # pylint: disable=g-import-not-at-top
  if args.amplification is not None or args.sampling_prob is not None:
    _fail("--noise_distribution discrete_gaussian is accounted without amplification by "
          "sampling: leave out --amplification and --sampling_prob")
  if accountant_given:
    _fail(f"--accountant {args.accountant} does not apply to --noise_distribution "
          f"discrete_gaussian: its epsilon is zCDP's (Canonne, Kamath, Steinke 2020, "
          f"arXiv:2004.00010, Thm 14, Cor 13) whichever accountant is named; leave out "
          f"--accountant")
  if args.mechanism in MMCC_MATRICES:
    _fail(f"--mechanism {args.mechanism} with --noise_distribution discrete_gaussian: it is one "
          f"of MMCC's own matrices, which no run uses; use one of {', '.join(dg.MECHANISMS)}")
  if args.mechanism is not None and registry.mechanism(args.mechanism).name not in dg.MECHANISMS:
    _fail(f"--mechanism {args.mechanism} with --noise_distribution discrete_gaussian: its "
          f"C-domain encoder would keep every past sum; use one of {', '.join(dg.MECHANISMS)}")
  c, label, cached, extra = _encoder(args, False)
  schema = _schema(args, None if c is None else c.shape[1], cached, False)
  privacy = spec_lib.Privacy(args.noise_multiplier, args.target_epsilon, args.delta,
                             args.accountant, noise_distribution="discrete_gaussian")
  report = accounting.sensitivity_report(c, schema)
  record = dict(mechanisms.discrete_record(c if c is not None else [[1.0]], schema, report,
                                           privacy, tolerance=args.tolerance).details)
  if args.target_epsilon is not None:
    record["tolerance"] = args.tolerance
  record.update(matrix=label, schema=schema.as_dict(), participation=schema.label,
                schema_source=_schema_source(args, cached, False))
  if c is not None:
    record.update(n=c.shape[1], m=c.shape[0])
  return _finish(record, args, extra)


def _finish(record: dict, args: argparse.Namespace, extra: dict) -> int:
  """Prints ``record`` with the encoder's fields and the parameter flags given."""
  for key, value in extra.items():
    record.setdefault(key, value)
  for flag in ("height", "bands"):
    if getattr(args, flag) is not None:
      record.setdefault(flag, getattr(args, flag))
  _print(_with_statement(record), args.json)
  sys.stdout.flush()
  return 0


def run(args: argparse.Namespace) -> int:
  from tff_mf import accounting  # pylint: disable=g-import-not-at-top
  from tff_mf.accounting import analyses  # pylint: disable=g-import-not-at-top
  from tff_mf import spec as spec_lib  # pylint: disable=g-import-not-at-top
  spec_lib.check_one_of_noise(args.noise_multiplier, args.target_epsilon)
  if args.noise_multiplier is not None and MAX_NOISE_MULTIPLIER < args.noise_multiplier < math.inf:
    _fail(f"--noise_multiplier {args.noise_multiplier:g} is above {MAX_NOISE_MULTIPLIER:g}, "
          f"where the accountants' arithmetic (z^2, rho = sens^2/(2 z^2)) leaves float64's "
          f"range; give a z of at most {MAX_NOISE_MULTIPLIER:g}")
  accountant_given = not isinstance(args.accountant, _Default)
  args.accountant = str(args.accountant)
  _refuse_renamed_amplification(args)
  # None: --sampling_prob alone, the analysis is chosen below as training chooses it.
  analysis = (None if args.amplification is None and args.sampling_prob is not None
              else analyses.analysis_class(args.amplification))
  sampled = analysis is not None and analysis.high_probability  # Poisson or fixed bin
  allocation = (analysis is not None and analysis.amplified and not analysis.poisson
                and not sampled)
  amplified = analysis is None or analysis.poisson or (  # Poisson sampling
      sampled and args.sampling_prob is not None)
  _check_bound_flags(args, sampled)
  if allocation:
    if args.sampling_prob is not None:
      _fail(f"--sampling_prob does not apply to --amplification {analysis.name} (a user's "
            f"rounds are allocated, not sampled)")
    _check_allocation_schema(args.participation, analysis)
    if args.epochs is None:
      _fail(f"--amplification {analysis.name} needs --epochs K ({analysis.kind})")
    args.participation = analysis.kind
  if not amplified and not allocation and not sampled and args.sampling_prob is not None:
    _fail("--sampling_prob needs --amplification mmcc or amplified_banded")
  if amplified and args.sampling_prob is None:
    _fail(f"--amplification {analysis.name} needs --sampling_prob")
  if args.non_adaptive and (analysis is None or not analyses.takes(analysis, "non_adaptive")):
    _fail("--non_adaptive applies to --amplification mmcc")
  _check_slack_flags(args, analysis)
  if args.noise_distribution == "discrete_gaussian":
    return _run_discrete(args, accountant_given)
  c, label, cached, extra = _encoder(args, amplified)
  schema = _schema(args, None if c is None else c.shape[1], cached, amplified)
  if c is None:
    if not schema.at_most_once or amplified:
      _fail(f"{'amplification' if amplified else schema.kind + ' participation'} needs the "
            "encoder C: give --mechanism (with --total_rounds) or --matrix")
    if args.target_epsilon is not None:
      z = accounting.calibrate_noise_multiplier(args.target_epsilon, args.delta,
                                                args.accountant, tolerance=args.tolerance)
      record = accounting.summary(z, args.delta, args.accountant,
                                  target_epsilon=args.target_epsilon)
      record["tolerance"] = args.tolerance
    else:
      record = accounting.summary(args.noise_multiplier, args.delta, args.accountant)
    _print(_with_statement(record), args.json)
    return 0
  sampling_prob = args.sampling_prob
  source = "--amplification" if args.amplification else "default (none)"
  if analysis is None:
    analysis, source = _analysis_as_training(c, schema, sampling_prob)
    if not analysis.amplified:
      amplified, sampling_prob = False, None  # as a run reports it: unamplified, p recorded
    _check_slack_flags(args, analysis)
  options = {k: v for k, v in _analysis_options(args).items() if analyses.takes(analysis, k)}
  chosen = analysis(**options) if sampled else analysis.name
  options = {} if sampled else options
  if args.target_epsilon is not None:
    bound = accounting.calibrate(c, schema, args.target_epsilon, args.delta, chosen,
                                 sampling_prob, args.accountant, args.tolerance, **options)
  else:
    bound = accounting.epsilon_for(c, schema, args.noise_multiplier, args.delta,
                                   chosen, sampling_prob, args.accountant, **options)
  record = bound.json()  # what the command prints: the bound, and what it adds below
  if args.sampling_prob is not None:
    record.setdefault("sampling_prob", args.sampling_prob)
  record["amplification_source"] = source
  record["matrix"] = label
  record["schema"] = schema.as_dict()
  if args.lower_bound or args.monte_carlo_samples is not None:
    _add_slack(record, bound, c, args)
  record["schema_source"] = _schema_source(args, cached, amplified)
  return _finish(record, args, extra)
