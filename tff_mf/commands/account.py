"""``tff-mf account``: ε of a run, noise calibration, and MMCC amplification.

Single participation (Denisov et al. Thm 4.1, ``001_…``)::

  tff-mf account --noise-multiplier 4.2 --delta 1e-6 [--accountant pld|rdp] [--json]
  tff-mf account --target-epsilon 1.0 --delta 1e-6 --json

Sampled matrix mechanism (MMCC, Choquette-Choo et al., ``004_…`` Fig 1, App D)::

  tff-mf account --mmcc --strategy binary_tree --n 1024 --sampling-prob 0.001 \\
      --noise-multiplier 16 --delta 1e-6 --json
  tff-mf account --mmcc --matrix CACHE.npz --n 256 --sampling-prob 0.01 \\
      --noise-multiplier 2 --delta 1e-6 [--min-sep b]

Imports nothing heavy at module level (dp_accounting only inside ``run``).
"""

from __future__ import annotations

import argparse
import json
import sys

STRATEGY_CHOICES = ("identity", "binary_tree", "tree_restart", "banded_toeplitz")


def register(subparsers) -> None:
  parser = subparsers.add_parser(
      "account",
      help="privacy accounting: epsilon of a run, noise calibration, MMCC amplification",
      description=(
          "Without --mmcc: single-participation accounting (Denisov et al. Thm 4.1): the run is "
          "one Gaussian mechanism with the noise multiplier z (C normalized to sensitivity 1). "
          "With --mmcc: amplification by Poisson sampling for a matrix mechanism "
          "(Choquette-Choo et al. 2024, MMCC). All reported epsilons are upper bounds."))
  parser.add_argument("--noise-multiplier", type=float, default=None,
                      help="noise std / clip norm (z, or sigma for MMCC)")
  parser.add_argument("--target-epsilon", type=float, default=None,
                      help="calibrate: smallest noise multiplier with epsilon <= this")
  parser.add_argument("--delta", type=float, required=True, help="delta in (0, 1)")
  parser.add_argument("--accountant", choices=("pld", "rdp"), default="pld",
                      help="single-participation accountant (default pld, the tightest)")
  parser.add_argument("--tolerance", type=float, default=1e-3,
                      help="relative tolerance of --target-epsilon calibration (default 1e-3)")
  parser.add_argument("--json", action="store_true", help="print one JSON object")
  group = parser.add_argument_group("MMCC (sampled matrix mechanisms)")
  group.add_argument("--mmcc", action="store_true", help="use the MMCC amplification accountant")
  group.add_argument("--matrix", default=None,
                     help="cached factorization .npz (its C is used, normalized to sensitivity 1)")
  group.add_argument("--strategy", choices=STRATEGY_CHOICES, default=None,
                     help="built-in encoder C (normalized to sensitivity 1)")
  group.add_argument("--height", type=int, default=None, help="tree_restart: tree height h")
  group.add_argument("--bands", type=int, default=None, help="banded_toeplitz: number of bands b")
  group.add_argument("--n", type=int, default=None, help="number of rounds")
  group.add_argument("--sampling-prob", type=float, default=None,
                     help="per-round participation probability p")
  group.add_argument("--min-sep", type=int, default=1,
                     help="b of b-min-sep sampling (App D); 1 = i.i.d. sampling every round")
  group.add_argument("--non-adaptive", action="store_true",
                     help="assert the data are fixed in advance (allows non-triangular or "
                          "signed C; |C| is used)")
  group.add_argument("--workers", type=int, default=2,
                     help="processes computing distinct row PLDs (default 2)")
  group.add_argument("--grid-resolution", type=int, default=64,
                     help="entries of C are rounded up to multiples of max|C|/this (default 64)")
  group.add_argument("--pld-discretization", type=float, default=1e-4,
                     help="privacy-loss grid of the PLDs (default 1e-4)")
  group.add_argument("--no-progress", action="store_true", help="no progress bars on stderr")
  parser.set_defaults(func=run)


def _load_matrix(path: str):
  """C of a cached factorization, normalized to γ = 1 (via tff_mf.cache.load when present)."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  try:
    from tff_mf import cache  # pylint: disable=g-import-not-at-top
  except ImportError:
    cache = None
  if cache is not None and hasattr(cache, "load"):
    return np.asarray(cache.load(path).c, dtype=np.float64)
  try:
    with np.load(path, allow_pickle=False) as data:
      if "C" not in data and "c" not in data:
        raise ValueError(f"{path}: no array named C in the file (keys: {sorted(data.keys())})")
      c = np.asarray(data["C"] if "C" in data else data["c"], dtype=np.float64)
  except (OSError, EOFError) as e:
    raise ValueError(f"{path}: cannot read factorization: {e}") from None
  if c.ndim != 2:
    raise ValueError(f"{path}: C must be 2-D, got shape {c.shape}")
  gamma = float(np.sqrt(np.max(np.sum(c * c, axis=0))))
  if not np.isfinite(gamma) or gamma <= 0:
    raise ValueError(f"{path}: C has invalid sensitivity {gamma}")
  return c / gamma


def _print(record: dict, as_json: bool) -> None:
  if as_json:
    # Strict JSON: an unbounded ε (MMCC at tiny noise) is written as the string "inf".
    print(json.dumps({k: ("inf" if isinstance(v, float) and v == float("inf") else v)
                      for k, v in record.items()}, sort_keys=True, allow_nan=False))
    return
  for key in sorted(record):
    print(f"{key}: {record[key]}")


def run(args: argparse.Namespace) -> int:
  from tff_mf import accounting  # pylint: disable=g-import-not-at-top
  if args.mmcc:
    return _run_mmcc(args)
  for flag in ("matrix", "strategy", "sampling_prob", "n"):
    if getattr(args, flag) is not None:
      raise ValueError(f"--{flag.replace('_', '-')} needs --mmcc")
  if (args.noise_multiplier is None) == (args.target_epsilon is None):
    raise ValueError("give exactly one of --noise-multiplier and --target-epsilon")
  if args.target_epsilon is not None:
    z = accounting.calibrate_noise_multiplier(
        args.target_epsilon, args.delta, args.accountant, tolerance=args.tolerance)
    record = accounting.summary(z, args.delta, args.accountant, target_epsilon=args.target_epsilon)
    record["tolerance"] = args.tolerance
  else:
    record = accounting.summary(args.noise_multiplier, args.delta, args.accountant)
  _print(record, args.json)
  return 0


def _run_mmcc(args: argparse.Namespace) -> int:
  from tff_mf import mmcc  # pylint: disable=g-import-not-at-top
  if args.target_epsilon is not None:
    raise ValueError("--target-epsilon is for single participation; MMCC takes --noise-multiplier")
  if args.noise_multiplier is None:
    raise ValueError("--mmcc needs --noise-multiplier")
  if args.sampling_prob is None:
    raise ValueError("--mmcc needs --sampling-prob")
  if (args.matrix is None) == (args.strategy is None):
    raise ValueError("--mmcc needs exactly one of --matrix and --strategy")
  if args.matrix is not None:
    c = _load_matrix(args.matrix)
    if args.n is not None and args.n != c.shape[1]:
      raise ValueError(f"--n {args.n} does not match the matrix in {args.matrix} "
                       f"({c.shape[1]} rounds)")
    source = args.matrix
  else:
    if args.n is None:
      raise ValueError("--strategy needs --n")
    c = mmcc.strategy_matrix(args.strategy, args.n, height=args.height, bands=args.bands)
    source = args.strategy
  result = mmcc.mmcc(
      c, args.sampling_prob, args.noise_multiplier, args.delta, min_sep=args.min_sep,
      non_adaptive=args.non_adaptive, grid_resolution=args.grid_resolution,
      pld_discretization=args.pld_discretization, workers=args.workers,
      progress=not args.no_progress)
  record = result.as_dict()
  record["matrix"] = source
  if args.strategy == "tree_restart":
    record["height"] = args.height
  if args.strategy == "banded_toeplitz":
    record["bands"] = args.bands
  _print(record, args.json)
  sys.stdout.flush()
  return 0
