"""``tff-mf plot``: per-round variance and B/C heatmaps.

Per-round variance: Denisov et al. 2022, arXiv:2202.08312, Fig 1; McMahan, Rush,
Thakurta, arXiv:2202.08312 v1, Fig 1. Heatmaps: Denisov et al. 2022, App G.

Needs the plotting extra (matplotlib: ``pip install 'tff-mf[plot]'``). Factorizations come
from the cache (computed on a miss), so plotting after
``tff-mf factorize`` or ``tff-mf demo`` costs only the drawing.
"""

from __future__ import annotations

import argparse
import os

from tff_mf import clitools
from typing import List, Optional

EXTRAS = ("plot",)


def _factorization(workload, strategy: str, cache_dir: Optional[str], progress: bool = True):
  from tff_mf.factorization import cache, strategies  # pylint: disable=g-import-not-at-top
  spec = strategies.FactorizationSpec(workload=workload, strategy=strategy)
  f, _ = cache.load_or_factorize(spec, cache_dir=cache_dir, progress=progress)
  return f


def make_plots(output_dir: str, n: int, momentum: Optional[float] = None,
               cache_dir: Optional[str] = None, progress: bool = True) -> List[str]:
  """Writes the PNGs for prefix sums (and momentum β if given); returns their paths."""
  from tff_mf import plots  # pylint: disable=g-import-not-at-top
  from tff_mf import registry  # pylint: disable=g-import-not-at-top
  from tff_mf.factorization import strategies, workloads  # pylint: disable=g-import-not-at-top
  # Denisov et al. 2022 (arXiv:2202.08312) Fig 1: the tree mechanisms against the optimum.
  figure1 = (registry.HONAKER_ONLINE.name, registry.HONAKER_FULL.name, registry.OPTIMAL.name)
  os.makedirs(output_dir, exist_ok=True)
  paths = []
  prefix = workloads.WorkloadSpec(kind="prefix_sum", n=n)
  online, full, opt = (_factorization(prefix, s, cache_dir, progress) for s in figure1)
  paths.append(plots.plot_per_round_variance(
      {f"Honaker Online (√L={online.single_participation_sqrt_loss:.1f})":
           online.per_round_variance(),
       f"Honaker Full (√L={full.single_participation_sqrt_loss:.1f})":
           full.per_round_variance(),
       f"Opt Prefix Sum (√L={opt.single_participation_sqrt_loss:.1f})": opt.per_round_variance()},
      os.path.join(output_dir, f"variance_prefix_sum_n{n}.png"),
      f"Per-round squared error, prefix sums, n={n} (Denisov Fig 1 left)"))
  paths.append(plots.plot_heatmaps(
      opt.b, opt.c, os.path.join(output_dir, f"heatmap_optimal_prefix_sum_n{n}.png"),
      f"Optimal factorization S = BC, n={n} (Denisov App G)"))
  if momentum is not None:
    mom = workloads.WorkloadSpec(kind="momentum", n=n, momentum=momentum)
    m_online, m_full, m_opt = (_factorization(mom, s, cache_dir, progress) for s in figure1)
    # Opt Prefix Sum as post-processing: B = M·S⁻¹·B_S with C = C_S (Denisov Sec 4).
    post = strategies.post_processed(opt, m_opt.a, "opt_prefix_sum")
    curves = {}
    for label, f in (("Honaker Online", m_online), ("Honaker Full", m_full),
                     ("Opt Prefix Sum", post), ("Optimal M = BC", m_opt)):
      curves[f"{label} (√L={f.single_participation_sqrt_loss:.1f})"] = f.per_round_variance()
    paths.append(plots.plot_per_round_variance(
        curves, os.path.join(output_dir, f"variance_momentum{momentum:g}_n{n}.png"),
        f"Per-round squared error, momentum β={momentum:g}, n={n} (Denisov Fig 1 right)",
        log_y=True))
    paths.append(plots.plot_heatmaps(
        m_opt.b, m_opt.c, os.path.join(output_dir, f"heatmap_optimal_momentum{momentum:g}_n{n}.png"),
        f"Optimal factorization M = BC, β={momentum:g}, n={n} (Denisov App G)"))
  return paths


def register(subparsers) -> None:
  parser = subparsers.add_parser(
      "plot", help="write PNGs: per-round variance (tree vs optimal) and B/C heatmaps",
      description="Per-round variance of Honaker online/full vs the optimal factorization "
                  "(Denisov Fig 1, McMahan Fig 1) and heatmaps of B and C (Denisov App G).")
  clitools.add_rounds_flag(parser, required=True)
  from tff_mf import spec  # pylint: disable=g-import-not-at-top
  clitools.add_flag(parser, spec.workload_flag("server_momentum"),
                    spelling=spec.MOMENTUM_SPELLING,
                    note="; here also plot the momentum workload with this beta (Denisov et al. "
                         "Fig 1 right)", default_text="prefix sums only")
  parser.add_argument("--output_dir", required=True, help="directory for the PNGs (required)")
  clitools.add_cache_dir_flag(parser)
  clitools.add_progress_flags(parser, what="the solvers' progress bars on stderr")
  parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
  from tff_mf import checks  # pylint: disable=g-import-not-at-top
  if args.n < 2:
    raise checks.CheckError(f"--total_rounds must be at least 2, got {args.n}")
  if args.momentum is not None and not 0.0 <= args.momentum < 1.0:
    raise checks.CheckError(f"--momentum must be in [0, 1), got {args.momentum}")
  for path in make_plots(args.output_dir, args.n, args.momentum, args.cache_dir,
                         progress=args.progress):
    print(path)
  return 0
