"""One rule for a client's update before it enters a private sum (numpy; no TensorFlow).

Every matrix mechanism's sensitivity assumes each update it sums has ℓ2 norm at most ζ
(Denisov et al. 2022, arXiv:2202.08312, Alg. 1, line 4; McMahan et al. 2018,
arXiv:1710.06963, Alg. 1). Two inputs escaped a naive ``min(1, ζ/‖u‖)·u``:

- a non-finite update: ``min(1, ζ/NaN)`` is 1, so the update is added unclipped and its
  NaN/Inf reaches the release;
- a finite update whose squared norm overflows the dtype (float32: ‖u‖ above about
  2.6e19): TensorFlow's ``clip_by_global_norm`` returns NaN, the round is rejected, and
  the client's presence shows with certainty (ε = ∞).

The rule, for every framework (the TF twin is ``tff_mf.tf.clipping``, with TF ops):

1. an update with any NaN or Inf entry is replaced by zeros and counted
   (``ZEROED_METRIC``); a zero update has norm 0 ≤ ζ, so the guarantee is untouched;
2. the norm is computed as m·‖u/m‖ with m = max|u| when the plain sum of squares
   overflows (it is then finite for any finite float32 update), and an update above ζ is
   scaled by (ζ/‖u/m‖)·(u/m), which never overflows. Where the plain norm is finite the
   arithmetic is the plain one, so no result changes.
"""

from __future__ import annotations

import dataclasses
import math
from typing import List, Sequence

import numpy as np

from tff_mf import checks

# The per-round count of updates zeroed for NaN/Inf, under one name in every framework.
ZEROED_METRIC = "zeroed_client_updates"
# The per-round count of client-side clipped updates whose norm the server found above ζ
# (the client did not clip): zeroed like a non-finite one.
REJECTED_METRIC = "unclipped_client_updates"
# The refusal, where a framework asserts finiteness after zeroing (leaf index, then what).
NON_FINITE_MESSAGE = "client update leaf #{leaf} contains NaN or Inf"


def all_finite(arrays: Sequence[np.ndarray]) -> bool:
  """True when every entry of every array is finite."""
  return all(bool(np.all(np.isfinite(np.asarray(a)))) for a in arrays)


def _plain_norm(arrays: Sequence[np.ndarray]) -> float:
  """√Σ u², inf where the squares overflow (the callers then scale first)."""
  with np.errstate(over="ignore"):
    return float(np.sqrt(sum(float(np.sum(a * a)) for a in arrays)))


def global_norm(arrays: Sequence[np.ndarray]) -> float:
  """‖u‖₂ over all arrays of a finite update, in float64: the plain sum of squares, or
  m·‖u/m‖ (m = max|u|) where that overflows."""
  arrays = [np.asarray(a, np.float64) for a in arrays]
  norm = _plain_norm(arrays)
  if math.isfinite(norm):
    return norm
  m = max(float(np.max(np.abs(a), initial=0.0)) for a in arrays)
  return m * _plain_norm([a / m for a in arrays])


@dataclasses.dataclass(frozen=True)
class ClippedUpdate:
  """A client's update after the rule: ``values`` (float64, norm ≤ ζ), its norm before
  clipping (0 when zeroed; may be inf only past float64's range), whether it was zeroed
  for NaN/Inf, and whether it was at most ζ (the adaptive quantile's bit)."""
  values: List[np.ndarray]
  norm: float
  zeroed: bool
  unclipped: bool


def clip_update(arrays: Sequence[np.ndarray], clip_norm: float) -> ClippedUpdate:
  """The rule above on one update (a list of arrays) for clip norm ζ > 0."""
  clip_norm = checks.positive_float(clip_norm, "clip_norm")
  values = [np.asarray(a, np.float64) for a in arrays]
  if not all_finite(values):
    return ClippedUpdate([np.zeros_like(a) for a in values], 0.0, True, True)
  norm = _plain_norm(values)
  if math.isfinite(norm):
    scale = min(1.0, clip_norm / norm) if norm > 0 else 1.0
    return ClippedUpdate([scale * a for a in values], norm, False, norm <= clip_norm)
  m = max(float(np.max(np.abs(a), initial=0.0)) for a in values)
  scaled = [a / m for a in values]
  inner = _plain_norm(scaled)  # in [1, √d]
  return ClippedUpdate([(clip_norm / inner) * a for a in scaled], m * inner, False, False)


def within_clip(update: Sequence[np.ndarray], clip_norm: float,
                returned: Sequence[np.ndarray]) -> bool:
  """Whether a finite update a client clipped itself has norm at most ζ, up to the rounding of
  the model it returned (the clipped update added to the model in the model's dtype): ‖u‖ ≤
  ζ·(1 + 1e-6) + ‖spacing(returned)‖₂, one unit in the last place of each coordinate."""
  slack = _plain_norm([np.spacing(np.abs(np.asarray(r))).astype(np.float64) for r in returned])
  return global_norm(update) <= float(clip_norm) * (1.0 + 1e-6) + slack
