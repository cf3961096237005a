"""PNG plots of factorizations (matplotlib, Agg backend, imported lazily).

- Per-round variance of the released estimates (row norms² of B at γ(C) = 1):
  Denisov et al. 2022, arXiv:2202.08312, Fig 1 (left: prefix sums, right:
  momentum) and McMahan, Rush, Thakurta, arXiv:2202.08312 v1, Fig 1.
- Heatmaps of B and C (Denisov et al. 2022, App G, Fig 5): each matrix on its own
  color scale with a colorbar, entries mapped to their rank, and a histogram of
  the non-zero magnitudes.
- Expected error against ε of the planner's best candidates (``tff_mf.planner``), z
  recalibrated at each ε.
- √L per strategy as markers on a log axis (a log axis has no zero for bars to start
  from), each value labeled, with the lower bound for any factorization.
"""

from __future__ import annotations

import os
from typing import Dict, Optional, Sequence, Tuple

import numpy as np


def _pyplot():
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  return plt


def plot_per_round_variance(curves: Dict[str, np.ndarray], path: str, title: str,
                            log_y: bool = False) -> str:
  """One line per mechanism: variance of round t's estimate for unit-variance noise."""
  plt = _pyplot()
  fig, ax = plt.subplots(figsize=(8, 4.5))
  for label, variance in curves.items():
    variance = np.asarray(variance, dtype=np.float64)
    ax.plot(np.arange(1, len(variance) + 1), variance, label=label, linewidth=1.0)
  ax.set_xlabel("round t")
  ax.set_ylabel("variance of estimate t (γ(C) = 1)")
  if log_y:
    ax.set_yscale("log")
  ax.set_title(title)
  ax.grid(alpha=0.3)
  ax.legend()
  return _save(plt, fig, path, dpi=120)


def _rank_normalized(x: np.ndarray) -> np.ndarray:
  """Magnitudes mapped to their rank in [0, 1] (zeros to 0), as in Denisov App G row 2."""
  mags = np.abs(x).ravel()
  out = np.zeros_like(mags)
  nonzero = mags > 0
  if np.any(nonzero):
    order = np.argsort(mags[nonzero], kind="stable")
    ranks = np.empty(order.size)
    ranks[order] = np.arange(1, order.size + 1)
    out[nonzero] = ranks / order.size
  return out.reshape(x.shape)


def _heatmap(fig, ax, values: np.ndarray, vmax: float, label: str, title: str) -> None:
  """``values`` (row i, column j) on a white-to-red scale [0, vmax] with a colorbar."""
  image = ax.imshow(values, cmap="Reds", vmin=0.0, vmax=vmax, interpolation="nearest")
  fig.colorbar(image, ax=ax, label=label)
  ax.set_title(title)
  ax.set_xlabel("column j")
  ax.set_ylabel("row i")


def plot_heatmaps(b: np.ndarray, c: np.ndarray, path: str, title: str) -> str:
  """B and C side by side: |entries| (own scale, colorbar), rank of |entries|, histograms."""
  plt = _pyplot()
  fig, axes = plt.subplots(3, 2, figsize=(11, 14))
  for col, (name, x) in enumerate((("B (decoder)", b), ("C (encoder)", c))):
    _heatmap(fig, axes[0, col], np.abs(x), float(np.max(np.abs(x))) or 1.0, "|entry|",
             f"{name}: |entry|")
    _heatmap(fig, axes[1, col], _rank_normalized(x), 1.0,
             "rank of |entry| (fraction of non-zeros)", f"{name}: rank of |entry|")
    ax = axes[2, col]
    nonzero = np.abs(x[x != 0])
    counts, edges = np.histogram(nonzero, bins=100) if nonzero.size else (np.zeros(1), [0, 1])
    ax.stairs(counts, edges, fill=True, color="firebrick")
    ax.set_yscale("log")
    ax.set_xlabel("|entry| of non-zero entries")
    ax.set_ylabel("count")
    ax.set_title(f"{name}: histogram")
  fig.suptitle(title)
  return _save(plt, fig, path, dpi=100, rect=(0, 0, 1, 0.975))  # suptitle clear of the panels


def plot_sqrt_loss(table: Dict[str, Dict[str, Optional[float]]], path: str, title: str,
                   lower_bounds: Optional[Dict[str, float]] = None) -> str:
  """√L, ``table[workload][strategy]``, one panel per workload, one row per strategy.

  Markers on a log axis with plain-number ticks, each labeled with its value;
  ``lower_bounds[workload]`` (√ of the bound ‖A‖²_*/n for any factorization,
  ``tff_mf.factorization.lower_bound_nuclear``) is drawn as a dashed line.
  """
  import matplotlib.ticker  # pylint: disable=g-import-not-at-top
  plt = _pyplot()
  workload_names = list(table)
  strategies = list(dict.fromkeys(s for row in table.values() for s in row))
  rows = list(range(len(strategies)))[::-1]  # the first strategy on top
  fig, axes = plt.subplots(1, len(workload_names), sharey=True, squeeze=False,
                           figsize=(4.5 * len(workload_names) + 3.0,
                                    0.5 * len(strategies) + 2.0))
  plain = matplotlib.ticker.FuncFormatter(lambda x, _: f"{x:g}")
  for ax, workload in zip(axes[0], workload_names):
    values = [table[workload].get(s) for s in strategies]
    shown = [(v, y) for v, y in zip(values, rows) if v]
    ax.plot([v for v, _ in shown], [y for _, y in shown], "o", color="steelblue", markersize=7)
    for v, y in shown:
      ax.annotate(f"{v:.1f}", (v, y), xytext=(7, 0), textcoords="offset points", va="center",
                  fontsize=9)
    low, high = min(v for v, _ in shown), max(v for v, _ in shown)
    bound = (lower_bounds or {}).get(workload)
    if bound:
      ax.axvline(bound, color="black", linestyle="--", linewidth=1,
                 label=f"lower bound ‖A‖_*/√n = {bound:.1f}")
      ax.legend(loc="lower right", fontsize=8)
      low = min(low, bound)
    ax.set_xscale("log")
    ax.set_xlim(low / 1.2, high * 1.5)  # room for the value labels
    ax.xaxis.set_major_locator(matplotlib.ticker.LogLocator(base=10, subs=(1.0, 2.0, 3.0, 5.0)))
    ax.xaxis.set_major_formatter(plain)
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.set_ylim(-0.6, len(strategies) - 0.4)
    ax.set_yticks(rows)
    ax.set_yticklabels(strategies)
    ax.set_xlabel("√L (log scale; lower is better)")
    ax.set_title(workload)
    ax.grid(True, axis="x", which="both", alpha=0.3)
  fig.suptitle(title)
  return _save(plt, fig, path, dpi=120)


def plot_error_against_epsilon(curves: Dict[str, Sequence[Tuple[float, float]]], path: str,
                               title: str) -> str:
  """One line per candidate: its expected error (rmse at the z calibrated to ε) against ε,
  both axes logarithmic. The values are exact expectations (no sampling), so no error bars."""
  plt = _pyplot()
  fig, ax = plt.subplots(figsize=(7, 4.5))
  for label, points in curves.items():
    eps, err = zip(*points)
    ax.plot(eps, err, marker="o", linewidth=1.0, label=label)
  ax.set_xscale("log")
  ax.set_yscale("log")
  ax.set_xlabel("target ε (δ fixed)")
  ax.set_ylabel("expected error: rmse = z·‖B‖_F/√n")
  ax.set_title(title)
  ax.grid(alpha=0.3, which="both")
  ax.legend(fontsize=8)
  return _save(plt, fig, path, dpi=120)


def _save(plt, fig, path: str, dpi: int, rect=(0, 0, 1, 1)) -> str:
  """Lays out (within ``rect``), writes (creating the folder) and closes ``fig``; returns ``path``."""
  fig.tight_layout(rect=rect)
  _makedirs_for(path)
  fig.savefig(path, dpi=dpi)
  plt.close(fig)
  return path


def _makedirs_for(path: str) -> None:
  directory = os.path.dirname(os.path.abspath(path))
  os.makedirs(directory, exist_ok=True)
