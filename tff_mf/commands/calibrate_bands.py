"""``tff-mf calibrate-bands``: the number of bands (and z) with the least expected error at a
target ε under cyclic Poisson sampling, with the amplified banded analysis
(``tff_mf.accounting.band_calibration``; Choquette-Choo et al. 2023, arXiv:2306.08153, Thm 4)."""

from __future__ import annotations

import argparse

from tff_mf import clitools


def register(subparsers) -> None:
  parser = subparsers.add_parser(
      "calibrate-bands", help="choose the number of bands b and z at a target epsilon, with "
                              "amplification",
      description="For each number of bands b (powers of 2 up to --min_sep and --max_bands, and "
                  "--min_sep itself): factorize a b-banded C (through the cache), sample with "
                  "cyclic Poisson of cycle b at probability p*b/B (the same expected "
                  "participations E = p*n/B), calibrate z to the target epsilon with the "
                  "amplified banded analysis (arXiv:2306.08153, Thm 4), and score "
                  "z*rmse/E (jax_privacy's BandMFConfig.rmse). Prints every candidate and the "
                  "best.")
  clitools.add_rounds_flag(parser, required=True)
  clitools.add_flag(parser, clitools.schema_flag("min_sep"), required=True,
                    note="; here the cycle B of the cyclic Poisson sampling --sampling_prob is "
                         "given for, and the largest b tried")
  from tff_mf import spec  # pylint: disable=g-import-not-at-top
  clitools.add_flag(parser, spec.privacy_flag("sampling_prob"), required=True,
                    note="; here at cycle B (required)")
  clitools.add_target_epsilon_flag(parser)
  clitools.add_delta_flag(parser)
  parser.add_argument("--max_bands", type=int, default=None,
                      help="a further cap on b (default: none)")
  from tff_mf.accounting import band_calibration  # pylint: disable=g-import-not-at-top
  clitools.add_flag(parser, spec.MECHANISM_FLAG, choices=band_calibration.STRATEGIES,
                    default=band_calibration.DEFAULT_STRATEGY,
                    note="; here the banded mechanism factorized",
                    default_text=f"{band_calibration.DEFAULT_STRATEGY}, the family jax_privacy "
                                 "optimizes")
  clitools.add_cache_dir_flag(parser)
  parser.add_argument("--tolerance", type=float, default=1e-3,
                      help="relative tolerance of each z (default: 1e-3)")
  parser.add_argument("--json", action="store_true", help="print JSON (default: off)")
  clitools.add_progress_flags(parser, what="the solvers' progress bars on stderr",
                              note="; off with --json")
  parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
  from tff_mf.accounting import band_calibration  # pylint: disable=g-import-not-at-top
  from tff_mf import jsonio  # pylint: disable=g-import-not-at-top
  result = band_calibration.calibrate_bands(
      args.n, args.target_epsilon, args.delta, min_sep=args.min_sep,
      sampling_prob=args.sampling_prob, max_bands=args.max_bands, strategy=args.mechanism,
      cache_dir=args.cache_dir, tolerance=args.tolerance,
      progress=args.progress and not args.json)
  if args.json:
    print(jsonio.dumps(result))
    return 0
  print(f"n={result['n']} target epsilon={result['target_epsilon']:g} delta="
        f"{result['delta']:g}, cyclic Poisson (cycle B={result['min_sep']}, p="
        f"{result['sampling_prob']:g}): expected participations E="
        f"{result['expected_participations']:.4g}; {result['strategy']}, amplified banded")
  print(f"{'bands':>6} {'p_b':>9} {'z':>9} {'epsilon':>9} {'bound':>11} {'rmse':>9} "
        f"{'z*rmse/E':>10}")
  best = band_calibration.BandCandidate(**result["best"])
  for c in (band_calibration.BandCandidate(**row) for row in result["candidates"]):
    mark = "  <- best" if c.bands == best.bands else ""
    print(f"{c.bands:>6d} {c.sampling_prob:>9.4g} {c.noise_multiplier:>9.5g} "
          f"{c.epsilon:>9.4g} {c.bound:>11} {c.rmse:>9.5g} {c.expected_error:>10.5g}{mark}")
  return 0
