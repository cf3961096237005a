"""``tff-mf account``: ε of a run under a participation schema, with or without amplification.

Without a matrix, single participation (Denisov et al. 2022, arXiv:2202.08312,
Thm 4.1): the run is one Gaussian mechanism with multiplier z (C normalized to
sensitivity 1)::

  tff-mf account --noise-multiplier 4.2 --delta 1e-6 [--accountant exact|pld|rdp] [--json]
  tff-mf account --target-epsilon 1.0 --delta 1e-6 --json

With a built-in mechanism (``--mechanism``) or a cached factorization (``--matrix``),
under any schema, unamplified (one Gaussian at z / sensitivity) or amplified by
Poisson sampling (MMCC, Choquette-Choo et al. 2024, arXiv:2310.15526; amplified banded,
Choquette-Choo et al. 2023, arXiv:2306.08153)::

  tff-mf account --mechanism binary_tree --n 1024 --amplification mmcc \\
      --sampling-prob 0.001 --noise-multiplier 16 --delta 1e-6 --json
  tff-mf account --matrix CACHE.npz --participation min_sep --min-sep 8 \\
      --amplification banded --sampling-prob 0.5 --target-epsilon 2 --delta 1e-6

Imports nothing heavy at module level (numpy and dp_accounting only inside ``run``).
"""

from __future__ import annotations

import argparse
import math
import sys
import textwrap

# Deprecated --strategy spellings -> mechanism (None: the legacy banded Toeplitz matrix).
LEGACY_STRATEGIES = {"identity": "gaussian", "binary_tree": "honaker_online",
                     "tree_restart": "tree_restart", "banded_toeplitz": None}
# Mechanisms whose C is built in (closed form); the others have an optimized C that
# lives in the cache (pass it with --matrix).
BUILTIN_ENCODERS = {"gaussian": "identity", "tree": "binary_tree",
                    "honaker_online": "binary_tree", "honaker_full": "binary_tree",
                    "tree_restart": "tree_restart"}

_EXAMPLES = """examples:
  tff-mf account --noise-multiplier 4.2 --delta 1e-6
  tff-mf account --target-epsilon 1 --delta 1e-6 --json
  tff-mf account --mechanism gaussian --n 64 --participation min_sep --min-sep 8 \\
      --noise-multiplier 4 --delta 1e-6
  tff-mf account --mechanism binary_tree --n 1024 --amplification mmcc \\
      --sampling-prob 0.001 --noise-multiplier 16 --delta 1e-6
  tff-mf account --mechanism tree_restart --height 4 --n 512 --participation min_sep \\
      --min-sep 8 --amplification banded --sampling-prob 0.5 --target-epsilon 2 --delta 1e-6
  tff-mf account --matrix ~/.cache/tff_mf/<entry>/<file>.npz --amplification mmcc \\
      --sampling-prob 0.01 --noise-multiplier 8 --delta 1e-6

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
          "with at most b non-zero bands under b-min-sep sampling."),
      epilog=_EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
  _add_run_arguments(parser)
  _add_schema_arguments(parser.add_argument_group("participation schema"))
  _add_encoder_arguments(
      parser.add_argument_group("encoder C (needed for other schemas and amplification)"))
  _add_amplification_arguments(parser.add_argument_group("amplification by Poisson sampling"))
  _add_deprecated_arguments(parser.add_argument_group("deprecated"))
  parser.set_defaults(func=run)

  def one_line_error(message):  # argparse's usage block would make errors several lines
    print(f"tff-mf account: error: {message} (tff-mf account --help lists the flags)",
          file=sys.stderr)
    sys.exit(2)

  parser.error = one_line_error


def _add_run_arguments(parser) -> None:
  """The noise (or target ε), δ, the accountant and the output format."""
  parser.add_argument("--noise-multiplier", type=float, default=None, metavar="Z",
                      help="noise multiplier z: noise std / clip norm (default: none; give this "
                           "or --target-epsilon)")
  parser.add_argument("--target-epsilon", type=float, default=None, metavar="EPS",
                      help="calibrate: the smallest z (within --tolerance) whose epsilon is at "
                           "most EPS (default: none; give this or --noise-multiplier)")
  parser.add_argument("--delta", type=float, required=True, help="delta in (0, 1) (required)")
  parser.add_argument("--accountant", choices=("exact", "pld", "rdp"), default="exact",
                      help="accountant of the unamplified Gaussian mechanism: exact (analytic "
                           "Gaussian, Balle & Wang 2018, arXiv:1805.06530, Thm 8), pld "
                           "(dp_accounting privacy-loss distributions) or rdp (Renyi DP, the "
                           "loosest) (default: exact)")
  parser.add_argument("--tolerance", type=float, default=1e-3,
                      help="relative tolerance of --target-epsilon calibration: the z printed "
                           "exceeds the smallest valid z by less than this fraction "
                           "(default: 1e-3)")
  parser.add_argument("--json", action="store_true",
                      help="print one strict JSON object instead of key: value lines "
                           "(default: off)")


def _add_schema_arguments(schema) -> None:
  from tff_mf import participation  # pylint: disable=g-import-not-at-top
  schema.add_argument("--participation", choices=participation.KINDS,
                      default=None,
                      help="how often and how far apart a user may contribute (default: the "
                           "schema --matrix was built for; otherwise min_sep when --min-sep or "
                           "--max-participations is given or the run is amplified, fixed_epoch "
                           "when --epochs is given, else single). With amplification the schema "
                           "names the rounds a user may be sampled in: min_sep b = one residue "
                           "class mod b (b = 1: every round), fixed_epoch k = one round per "
                           "epoch of n/k rounds")
  schema.add_argument("--epochs", type=int, default=None, metavar="K",
                      help="fixed_epoch, balls_in_bins: number of epochs k, dividing n "
                           "(default: none)")
  schema.add_argument("--min-sep", type=int, default=None, metavar="B",
                      help="min_sep: rounds between two contributions of a user, b >= 1 "
                           "(default: 1 when amplified)")
  schema.add_argument("--max-participations", type=int, default=None, metavar="K",
                      help="min_sep: most contributions of a user (default: ceil(n / b), all "
                           "that b allows)")


def _add_encoder_arguments(matrix) -> None:
  matrix.add_argument("--mechanism", default=None, metavar="NAME",
                      help="mechanism with a built-in C, by its registry name or alias: gaussian "
                           "(identity, dp_fedavg: C = I), tree / honaker_online (binary_tree) / "
                           "honaker_full (binary tree C), tree_restart (needs --height); other "
                           "mechanisms have an optimized C: pass it with --matrix (default: none)")
  matrix.add_argument("--matrix", default=None, metavar="PATH",
                      help="a cached factorization .npz (tff-mf factorize prints its path); it "
                           "is checked on load and its normalized C is used (default: none)")
  matrix.add_argument("--n", type=int, default=None,
                      help="number of rounds n (needed with --mechanism; checked against "
                           "--matrix) (default: none)")
  matrix.add_argument("--height", type=int, default=None,
                      help="tree_restart: height h of each tree, restarted every 2^(h-1) rounds "
                           "(default: none)")
  matrix.add_argument("--bands", type=int, default=None,
                      help="deprecated --strategy banded_toeplitz: number of bands (default: "
                           "none)")


def _add_amplification_arguments(amp) -> None:
  amp.add_argument("--amplification", choices=("none", "mmcc", "banded"), default=None,
                   help="none: one Gaussian at z / sensitivity; mmcc: MMCC for any "
                        "lower-triangular non-negative C; banded: amplified banded MF for C "
                        "with at most b non-zero bands under b-min-sep sampling (default: none)")
  amp.add_argument("--sampling-prob", type=float, default=None, metavar="P",
                   help="probability p in (0, 1] that a user joins a round it may be sampled in "
                        "(every round for b = 1, the rounds of its residue class for b-min-sep); "
                        "needed with --amplification mmcc or banded (default: none)")
  amp.add_argument("--non-adaptive", action="store_true",
                   help="mmcc: assert the data are fixed in advance (allows non-triangular or "
                        "signed C; |C| is used) (default: off)")
  amp.add_argument("--workers", type=int, default=2,
                   help="mmcc: processes computing distinct row PLDs (default: 2)")
  amp.add_argument("--grid-resolution", type=int, default=64,
                   help="mmcc: entries of C are rounded up to multiples of max|C| / this "
                        "(default: 64)")
  amp.add_argument("--pld-discretization", type=float, default=1e-4,
                   help="mmcc, banded: privacy-loss grid step of the PLDs, coarsened "
                        "automatically where a PLD would be too large (default: 1e-4)")
  amp.add_argument("--no-progress", action="store_true",
                   help="mmcc: no progress bars on stderr (default: off)")


def _add_deprecated_arguments(old) -> None:
  old.add_argument("--mmcc", action="store_true",
                   help="same as --amplification mmcc, except that --sampling-prob is then the "
                        "average rate p: with --min-sep b a user joins each of its rounds with "
                        "probability b*p (MMCC App D) (default: off)")
  old.add_argument("--strategy", choices=tuple(LEGACY_STRATEGIES), default=None,
                   help="built-in C by its old name: identity = --mechanism gaussian, "
                        "binary_tree = --mechanism honaker_online, tree_restart; "
                        "banded_toeplitz is the square root of the prefix-sum matrix truncated "
                        "to --bands bands (MMCC App E) (default: none)")


# ----------------------------------------------------------------------------- inputs


def _fail(message: str):
  from tff_mf import checks  # pylint: disable=g-import-not-at-top
  raise checks.CheckError(message)


def _note(message: str) -> None:
  print(f"tff-mf account: {message}", file=sys.stderr)


def _legacy(args: argparse.Namespace) -> None:
  """Maps the deprecated --mmcc and --strategy onto the current flags (in place)."""
  if args.strategy is not None:
    if args.mechanism is not None or args.matrix is not None:
      _fail("--strategy is deprecated; give --mechanism or --matrix instead, not both")
    args.legacy_strategy = args.strategy
  else:
    args.legacy_strategy = None
    if args.bands is not None:
      _fail("--bands belongs to the deprecated --strategy banded_toeplitz")
  if not args.mmcc:
    return
  if args.amplification is not None:
    _fail("--mmcc is deprecated; give --amplification mmcc instead, not both")
  args.amplification = "mmcc"
  b = args.min_sep
  if b is not None and b > 1 and args.participation is None and args.sampling_prob is not None:
    p = args.sampling_prob
    if not (isinstance(p, float) and math.isfinite(p) and 0 < p <= 1):
      _fail(f"sampling_prob must be in (0, 1], got {p:g}")
    if b * p > 1.0 + 1e-12:
      _fail(f"with --mmcc, --min-sep {b} joins each of a user's rounds with probability "
            f"b*p = {b * p:g} > 1; need --sampling-prob <= {1.0 / b:g}")
    args.sampling_prob = min(1.0, b * p)
    _note(f"--mmcc is deprecated; running --amplification mmcc --participation min_sep "
          f"--min-sep {b} --sampling-prob {args.sampling_prob:g} (a user joins each of its "
          f"rounds with probability b*p)")
  else:
    _note("--mmcc is deprecated; use --amplification mmcc")


def _encoder(args: argparse.Namespace):
  """(C or None, source label, the cached schema dict or None)."""
  from tff_mf import checks  # pylint: disable=g-import-not-at-top
  if args.matrix is not None and (args.mechanism is not None or args.legacy_strategy):
    _fail("give one of --matrix and --mechanism")
  if args.matrix is not None:
    from tff_mf import cache  # pylint: disable=g-import-not-at-top
    for flag in ("height", "bands"):
      if getattr(args, flag) is not None:
        _fail(f"--{flag} describes a built-in mechanism, not --matrix")
    f = cache.load(args.matrix)
    n = f.c.shape[1]
    if args.n is not None and args.n != n:
      _fail(f"--n {args.n} does not match the matrix in {args.matrix} ({n} rounds)")
    return f.c, args.matrix, (f.info or {}).get("participation")
  if args.mechanism is None and args.legacy_strategy is None:
    for flag in ("n", "height", "bands"):
      if getattr(args, flag) is not None:
        _fail(f"--{flag} needs --mechanism")
    return None, None, None
  from tff_mf import mmcc  # pylint: disable=g-import-not-at-top
  from tff_mf import registry  # pylint: disable=g-import-not-at-top
  if args.n is None:
    _fail("--mechanism needs --n (the number of rounds)")
  n = checks.positive_int(args.n, "--n")
  if args.legacy_strategy == "banded_toeplitz":
    if args.height is not None:
      _fail("--height belongs to tree_restart")
    if args.bands is None:
      _fail("--strategy banded_toeplitz needs --bands")
    checks.dense_matrices_fit(n, 2, f"banded_toeplitz at n = {n}")
    return (mmcc.truncated_sqrt_prefix_matrix(n, checks.positive_int(args.bands, "--bands")),
            "truncated_sqrt_prefix (square root of S truncated to bands, MMCC App E; "
            "--strategy banded_toeplitz)", None)
  name = LEGACY_STRATEGIES[args.legacy_strategy] if args.legacy_strategy else args.mechanism
  mech = registry.mechanism(name)
  if mech.name == "none":
    _fail("mechanism none adds no noise: its epsilon is infinite")
  kind = BUILTIN_ENCODERS.get(mech.name)
  if kind is None:
    _fail(f"mechanism {mech.name} has an optimized C: pass its cached factorization with "
          f"--matrix (tff-mf factorize prints the path); built-in: "
          f"{', '.join(BUILTIN_ENCODERS)}")
  if kind == "tree_restart":
    if args.height is None:
      _fail("tree_restart needs --height")
    height = checks.positive_int(args.height, "--height")
  elif args.height is not None:
    _fail("--height belongs to tree_restart")
  rows = 2 * n if kind != "identity" else n
  checks.dense_matrices_fit(n, 2, f"mechanism {mech.name} at n = {n}", m=rows)
  if kind == "identity":
    c = mmcc.identity_matrix(n)
  elif kind == "binary_tree":
    c = mmcc.binary_tree_matrix(n)
  else:
    c = mmcc.tree_restart_matrix(n, height)
  return c, mech.name, None


def _schema_source(args: argparse.Namespace, cached, amplified: bool) -> str:
  """Where the schema accounted for came from (printed with it)."""
  if args.participation is not None:
    return "--participation"
  for flag in ("epochs", "min_sep", "max_participations"):
    if getattr(args, flag) is not None:
      return f"--{flag.replace('_', '-')}"
  if cached:
    return ("the cache entry's key (its C was built for this schema)" if not amplified or
            cached.get("kind") != "single" else
            "the cache entry's key (single), as min_sep b = 1 for amplification")
  return "default (min_sep b = 1 when amplified)" if amplified else "default (single)"


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
      if amplified and schema.kind == "single":
        return participation.Participation("min_sep", min_sep=1)
      return schema
    else:
      kind = "min_sep" if amplified else "single"
  if kind not in ("fixed_epoch", "balls_in_bins") and args.epochs is not None:
    _fail("--epochs belongs to --participation fixed_epoch or balls_in_bins")
  if kind != "min_sep":
    for flag in ("min_sep", "max_participations"):
      if getattr(args, flag) is not None:
        _fail(f"--{flag.replace('_', '-')} belongs to --participation min_sep")
  if kind == "single":
    return participation.SINGLE
  if kind in ("fixed_epoch", "balls_in_bins"):
    if args.epochs is None:
      _fail(f"--participation {kind} needs --epochs")
    return participation.Participation(kind, epochs=checks.positive_int(args.epochs, "--epochs"))
  if args.min_sep is None and not amplified:
    _fail("--participation min_sep needs --min-sep")
  b = checks.positive_int(1 if args.min_sep is None else args.min_sep, "--min-sep")
  k = args.max_participations
  if k is not None:
    k = checks.positive_int(k, "--max-participations")
  elif n is not None:
    k = -(-n // b)
  return participation.Participation("min_sep", min_sep=b, max_participations=k)


# ----------------------------------------------------------------------------- output


def _print(record: dict, as_json: bool) -> None:
  from tff_mf import jsonio  # pylint: disable=g-import-not-at-top
  record = jsonio.jsonable(record)
  if as_json:
    print(jsonio.dumps(record))
    return
  for key in sorted(record):
    value = record[key]
    if isinstance(value, (dict, list)):
      value = jsonio.dumps(value)
    print(f"{key}: {value}")


# ----------------------------------------------------------------------------- run


def run(args: argparse.Namespace) -> int:
  from tff_mf import accounting  # pylint: disable=g-import-not-at-top
  _legacy(args)
  if (args.noise_multiplier is None) == (args.target_epsilon is None):
    _fail("give exactly one of --noise-multiplier and --target-epsilon")
  analysis = args.amplification or "none"
  amplified = analysis != "none"
  if not amplified and args.sampling_prob is not None:
    _fail("--sampling-prob needs --amplification mmcc or banded")
  if amplified and args.sampling_prob is None:
    _fail(f"--amplification {analysis} needs --sampling-prob")
  if args.non_adaptive and analysis != "mmcc":
    _fail("--non-adaptive applies to --amplification mmcc")
  c, source, cached = _encoder(args)
  schema = _schema(args, None if c is None else c.shape[1], cached, amplified)
  if c is None:
    if schema.kind != "single" or amplified:
      _fail(f"{'amplification' if amplified else schema.kind + ' participation'} needs the "
            "encoder C: give --mechanism (with --n) or --matrix")
    if args.target_epsilon is not None:
      z = accounting.calibrate_noise_multiplier(args.target_epsilon, args.delta,
                                                args.accountant, tolerance=args.tolerance)
      record = accounting.summary(z, args.delta, args.accountant,
                                  target_epsilon=args.target_epsilon)
      record["tolerance"] = args.tolerance
    else:
      record = accounting.summary(args.noise_multiplier, args.delta, args.accountant)
    _print(record, args.json)
    return 0
  options = {}
  if amplified:
    options["pld_discretization"] = args.pld_discretization
  if analysis == "mmcc":
    options["non_adaptive"] = args.non_adaptive
    options["mmcc_options"] = {"workers": args.workers, "grid_resolution": args.grid_resolution,
                               "progress": not args.no_progress}
  if args.target_epsilon is not None:
    record = accounting.calibrate(c, schema, args.target_epsilon, args.delta, analysis,
                                  args.sampling_prob, args.accountant, args.tolerance, **options)
  else:
    record = accounting.epsilon_for(c, schema, args.noise_multiplier, args.delta, analysis,
                                    args.sampling_prob, args.accountant, **options)
  record["matrix"] = source
  record["schema"] = schema.as_dict()
  record["schema_source"] = _schema_source(args, cached, amplified)
  for flag in ("height", "bands"):
    if getattr(args, flag) is not None:
      record.setdefault(flag, getattr(args, flag))
  _print(record, args.json)
  sys.stdout.flush()
  return 0
