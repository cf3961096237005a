"""Adaptive clipping with matrix-factorization noise: parameters, privacy split, reference (numpy).

The clip norm ζ_i of round i tracks a target quantile γ of the client update norms,
estimated privately by the geometric rule of Andrew, Thakkar, McMahan, Ramaswamy 2021
(arXiv:1905.03871, Alg. 1 with the geometric update; TFF's ``gaussian_adaptive``):

  b̄_i  = clamp((Σ_clients (1[‖Δ‖ ≤ ζ_i] − ½) + N(0, σ_b²)) / K + ½, 0, 1)
  ζ_{i+1} = ζ_i · exp(−η_ζ · (b̄_i − γ))

Round i clips every update to ζ_i, sums, and adds ζ_i·(C⁻¹Z)[i] with Z ~ N(0, z²):
the MF mechanism of the normalized contributions Δ/ζ_i (norm ≤ 1) at multiplier z,
multiplied back by ζ_i. Since ζ_i depends only on earlier outputs, the MF part is the
Gaussian mechanism of multiplier z/sens for adaptively chosen inputs (Denisov, McMahan,
Rush, Smith, Thakurta 2022, arXiv:2202.08312, Thm 2.1); the count query is a Gaussian
of sensitivity ½ per participation, so k participations give √k·½/σ_b. Stacking both
streams into one lower-triangular encoder, the run is one Gaussian mechanism with

  μ² = (sens/z)² + k·(½/σ_b)²        (Gaussian DP, Dong, Roth, Su 2019, arXiv:1905.02383)

The derivation and what changes for the utility analysis are in docs/mechanisms.md.
No TensorFlow here: ``tff_mf.tf.query`` runs the same rule in the graph.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Dict, Optional

import numpy as np

from tff_mf import checks

# TFF's ``DifferentiallyPrivateFactory.gaussian_adaptive`` defaults.
DEFAULT_TARGET_QUANTILE = 0.5
DEFAULT_INITIAL_CLIP_NORM = 0.1
DEFAULT_LEARNING_RATE = 0.2
DEFAULT_COUNT_STDDEV_PER_CLIENT = 0.05  # σ_b = 0.05 · clients per round
COUNT_SENSITIVITY = 0.5  # a client's bit, shifted by −½, moves the count by at most ½


@dataclasses.dataclass(frozen=True)
class AdaptiveClipping:
  """The quantile estimator of the clip norm (defaults follow TFF's ``gaussian_adaptive``).

  Attributes:
    target_quantile: γ, the fraction of client updates that should stay unclipped.
    initial_clip_norm: ζ_0 (> 0).
    learning_rate: η_ζ ≥ 0 of the geometric update (0 keeps ζ_0: the fixed-clip mechanism).
    clipped_count_stddev: σ_b ≥ 0 of the noise on the count (None: 0.05 · clients per round).
  """
  target_quantile: float = DEFAULT_TARGET_QUANTILE
  initial_clip_norm: float = DEFAULT_INITIAL_CLIP_NORM
  learning_rate: float = DEFAULT_LEARNING_RATE
  clipped_count_stddev: Optional[float] = None

  def checked(self, clients_per_round: float, prefix: str = "") -> "AdaptiveClipping":
    """A copy with every field checked and σ_b resolved for ``clients_per_round``; errors
    name ``prefix`` + the argument (``"--"``: a command line's flags)."""
    k = checks.positive_float(clients_per_round, f"{prefix}clients_per_round")
    stddev = (DEFAULT_COUNT_STDDEV_PER_CLIENT * k if self.clipped_count_stddev is None
              else checks.in_range(self.clipped_count_stddev, f"{prefix}clipped_count_stddev",
                                   0.0, math.inf))
    return AdaptiveClipping(
        target_quantile=checks.in_range(self.target_quantile, f"{prefix}target_quantile", 0.0,
                                        1.0, high_open=False),
        initial_clip_norm=checks.positive_float(self.initial_clip_norm,
                                                f"{prefix}initial_clip_norm"),
        learning_rate=checks.in_range(self.learning_rate, f"{prefix}clip_learning_rate", 0.0,
                                      math.inf),
        clipped_count_stddev=float(stddev))

  def as_dict(self) -> Dict[str, Any]:
    return dataclasses.asdict(self)


def count_mu(clipped_count_stddev: float, participations: int) -> float:
  """Gaussian-DP μ of the count queries of a whole run: √k·½/σ_b (∞ when σ_b = 0)."""
  k = checks.positive_int(participations, "participations")
  if clipped_count_stddev <= 0.0:
    return math.inf
  return math.sqrt(k) * COUNT_SENSITIVITY / float(clipped_count_stddev)


def combined_noise_multiplier(value_noise_multiplier: float, sensitivity: float,
                              clipped_count_stddev: float, participations: int) -> float:
  """1/μ of the run: the multiplier of the single Gaussian mechanism the run is."""
  mu_value = (math.inf if value_noise_multiplier <= 0.0
              else float(sensitivity) / float(value_noise_multiplier))
  mu = math.hypot(mu_value, count_mu(clipped_count_stddev, participations))
  return 0.0 if math.isinf(mu) else 1.0 / mu


def value_noise_multiplier(total_noise_multiplier: float, sensitivity: float,
                           clipped_count_stddev: float, participations: int) -> float:
  """The MF noise multiplier z whose run, with the count queries, has multiplier ``total``.

  Splits the budget as TFF's ``adaptive_clip_noise_params`` does, with the sensitivities
  under the schema: (sens/z)² = 1/total² − k·(½/σ_b)². Refuses a σ_b whose count queries
  alone already spend the whole budget.
  """
  total = checks.positive_float(total_noise_multiplier, "noise multiplier of the run")
  mu_count = count_mu(clipped_count_stddev, participations)
  rest = total ** -2 - mu_count ** 2
  if not rest > 0.0:
    raise checks.CheckError(
        f"clipped_count_stddev = {clipped_count_stddev:g} is too small: with {participations} "
        f"participation(s) the clip-norm estimate alone has noise multiplier "
        f"{1.0 / mu_count:.4g}, at or below the run's {total:.4g}; raise clipped_count_stddev "
        "or the privacy budget")
  return float(sensitivity) / math.sqrt(rest)


def next_clip(clip: float, noisy_count: float, clients_per_round: float, target: float,
              learning_rate: float) -> float:
  """ζ_{i+1} from ζ_i and the noisy Σ(1[‖Δ‖ ≤ ζ_i] − ½) (float64 reference of the graph)."""
  unclipped = min(1.0, max(0.0, noisy_count / clients_per_round + 0.5))
  return float(clip * math.exp(-learning_rate * (unclipped - target)))


def reference_clips(norms_per_round, config: AdaptiveClipping, clients_per_round: float,
                    count_noise=None) -> np.ndarray:
  """ζ_0..ζ_n for given update norms per round and count noise draws (default 0)."""
  clips = [float(config.initial_clip_norm)]
  for i, norms in enumerate(norms_per_round):
    norms = np.asarray(norms, dtype=np.float64)
    count = float(np.sum((norms <= clips[-1]).astype(np.float64) - 0.5))
    if count_noise is not None:
      count += float(count_noise[i])
    clips.append(next_clip(clips[-1], count, clients_per_round, config.target_quantile,
                           config.learning_rate))
  return np.asarray(clips)
