"""PNG plots of factorizations (matplotlib, Agg backend, imported lazily).

- Per-round variance of the released estimates (row norms² of B at γ(C) = 1):
  Denisov et al. 2022, arXiv:2202.08312, Fig 1 (left: prefix sums, right:
  momentum) and McMahan, Rush, Thakurta, arXiv:2202.08312 v1, Fig 1.
- Heatmaps of B and C (Denisov et al. 2022, App G, Fig 5): each matrix on its own
  color scale with a colorbar, entries mapped to their rank, and a histogram of
  the non-zero magnitudes.
- √L per strategy on a log scale, with the lower bound for any factorization.
"""

from __future__ import annotations

import os
from typing import Dict, Optional

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
  return _save(plt, fig, path, dpi=100)


def plot_sqrt_loss_bars(table: Dict[str, Dict[str, Optional[float]]], path: str, title: str,
                        lower_bounds: Optional[Dict[str, float]] = None) -> str:
  """Grouped bars of √L, ``table[workload][strategy]``, on a log scale.

  ``lower_bounds[workload]`` (√ of McMahan et al. App C's bound for any
  factorization) is drawn as a dashed line.
  """
  plt = _pyplot()
  workload_names = list(table)
  strategies = list(dict.fromkeys(s for row in table.values() for s in row))
  fig, axes = plt.subplots(1, len(workload_names), figsize=(5.5 * len(workload_names), 4.8),
                           squeeze=False)
  for ax, workload in zip(axes[0], workload_names):
    values = [table[workload].get(s) for s in strategies]
    positions = [k for k, v in enumerate(values) if v]
    bars = ax.bar(positions, [values[k] for k in positions], color="steelblue")
    for bar, k in zip(bars, positions):
      ax.text(bar.get_x() + bar.get_width() / 2, values[k], f"{values[k]:.1f}", ha="center",
              va="bottom", fontsize=8)
    if lower_bounds and lower_bounds.get(workload):
      ax.axhline(lower_bounds[workload], color="black", linestyle="--", linewidth=1,
                 label=f"lower bound {lower_bounds[workload]:.1f}")
      ax.legend(loc="upper right", fontsize=8)
    ax.set_yscale("log")
    ax.set_xticks(range(len(strategies)))
    ax.set_xticklabels(strategies, rotation=30, ha="right")
    ax.set_ylabel("√L (log scale)")
    ax.set_title(workload)
  fig.suptitle(title)
  return _save(plt, fig, path, dpi=120)


def _save(plt, fig, path: str, dpi: int) -> str:
  """Lays out, writes (creating the folder) and closes ``fig``; returns ``path``."""
  fig.tight_layout()
  _makedirs_for(path)
  fig.savefig(path, dpi=dpi)
  plt.close(fig)
  return path


def _makedirs_for(path: str) -> None:
  directory = os.path.dirname(os.path.abspath(path))
  os.makedirs(directory, exist_ok=True)
