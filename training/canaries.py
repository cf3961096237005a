"""Canary clients planted in a training run, and the run's one-run privacy audit (no TensorFlow).

``--canaries m`` adds m synthetic clients to the run in the style of Andrew et al. 2023
(arXiv:2302.03098, one-shot empirical privacy estimation for FL): canary j's client update is
a fixed random unit direction u_j of the model's parameter space, of norm ``SCALE``·ζ, so the
run's own DP query clips it to ζ; it goes through the same query (clipping, sum, noise) as
every real client. Each canary is included by a fair coin, and an included canary is a client
of the participation schema: it joins exactly the rounds of one schema pattern (one round
under ``single``, its cohort's rounds under ``fixed_epoch``, its bin's under
``balls_in_bins``), so the sensitivity behind ε covers it. Real clients, the noise and its
seed are untouched, and the mean's denominator stays ``--clients_per_round``: the run
releases what it would release without canaries, plus their clipped contributions.

Before round 1 the run writes the canaries' secret (directions' seed, coins, rounds; 0600,
``SECRET_FILE``) and the guess counts planned on a model of the scores (``PLAN_FILE``,
``tff_mf.audit.plan_one_run``). After the last round, ``audit`` reads the released models
(θ_0 and the model after every round, ``MODELS_FILE``) and the secret, and scores each canary
from the releases alone: the server applies the workload A, so X = A⁻¹(θ_0 − θ_t)·K/η is the
per-round noised sum, whose noise has covariance ∝ N·Nᵀ (N = A⁻¹B, the mechanism's reported
noise matrix; the identity where the mechanism reports none). The score of canary j with
rounds P is the whitened projection ⟨X·u_j, Σ⁻¹p⟩/√(pᵀΣ⁻¹p), p = 1_P: the Neyman–Pearson
statistic of a shift p under correlated Gaussian noise, which under a matrix mechanism's
strongly correlated noise separates far better than the final model change alone. Any score
computed from the releases gives a valid bound; a wrong N costs power, never validity. The
bounds are ``tff_mf.audit.one_run_audit``'s (Steinke, Nasr, Jagielski 2023,
arXiv:2305.08846, Thm 3.1; Mahloujifar, Melis, Chaudhuri 2024, arXiv:2410.22235), and the
run's (ε, δ) claim is checked with the f-DP ε bound, the bound of its kind.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
import scipy.linalg

from tff_mf import audit as audit_lib
from tff_mf import checks
from training import outputs
from training import config as config_lib
from training import identity as identity_lib
from training.config import TrainingError

SECRET_FILE = "canaries.json"
PLAN_FILE = "canary_plan.json"
MODELS_FILE = "canary_models.npy"
REPORT_FILE = "canary_audit.json"
# A canary's update has norm SCALE·ζ before the query clips it to ζ.
SCALE = 2.0
# Generator streams under the canary seed (neither touches the run's own seeds).
COIN_STREAM = 0xC01
DIRECTION_STREAM = 0xD1E
# The bound a run's (ε, δ) claim is checked with (tff_mf.audit.one_run_audit's key).
DECIDING = "fdp_epsilon_lower_bound"
BOUND_KINDS = {
    "epsilon_lower_bound": "epsilon at delta, Steinke, Nasr, Jagielski 2023 (Thm 3.1)",
    "fdp_epsilon_lower_bound": "epsilon at delta, f-DP audit with (epsilon, delta)-DP's curve "
                               "(Mahloujifar, Melis, Chaudhuri 2024)",
    "mu_lower_bound": "Gaussian-DP mu, f-DP audit with the Gaussian curve",
    "epsilon_of_mu_lower_bound": "epsilon(delta) of the mu bound: an epsilon lower bound only "
                                 "for a Gaussian trade-off curve",
}


# The schemas whose patterns are fixed in advance (the amplified ones draw secret coins).
SUPPORTED = config_lib.CANARY_PARTICIPATIONS


def patterns(config) -> List[Tuple[int, ...]]:
  """The schema's participation patterns (1-based rounds) a canary may take."""
  kind = config.participation
  if kind not in SUPPORTED:
    raise TrainingError(f"--canaries does not support --participation={kind}")
  found = audit_lib.canary_patterns(kind, config.total_rounds, epochs=config.epochs)
  return [tuple(t + 1 for t in p) for p in found]


@dataclasses.dataclass
class Canaries:
  """The planted canaries: seed of their directions and coins, inclusions, rounds."""
  seed: int
  seed_source: str
  included: np.ndarray  # bool, one per canary
  rounds: List[Tuple[int, ...]]  # 1-based rounds of each canary's pattern
  clip_norm: float

  @property
  def count(self) -> int:
    return int(self.included.size)

  @classmethod
  def draw(cls, config, seed: Optional[int] = None) -> "Canaries":
    """m canaries for ``config``: coins and directions from ``seed`` (the pinned
    ``--canary_seed``, else fresh from OS entropy); canary j takes pattern j mod P."""
    source = "pinned" if seed is not None else "os_entropy"
    seed = checks.new_seed() if seed is None else int(seed)
    found = patterns(config)
    m = int(config.canaries)
    included = np.random.default_rng([seed, COIN_STREAM]).random(m) < 0.5
    return cls(seed=seed, seed_source=source, included=included,
               rounds=[found[j % len(found)] for j in range(m)],
               clip_norm=float(config.clip_norm))

  def in_round(self, round_num: int) -> List[int]:
    """The included canaries that join round ``round_num``."""
    return [j for j in range(self.count) if self.included[j] and round_num in self.rounds[j]]

  def direction(self, j: int, size: int) -> np.ndarray:
    """u_j: a uniformly random unit vector of R^size (float64)."""
    u = np.random.default_rng([self.seed, DIRECTION_STREAM, int(j)]).standard_normal(size)
    return u / np.linalg.norm(u)

  def updates(self, round_num: int, shapes: Sequence[Tuple[int, ...]]) -> List[List[np.ndarray]]:
    """The client updates (one float32 array per variable) of the canaries in this round."""
    sizes = [int(np.prod(s)) for s in shapes]
    out = []
    for j in self.in_round(round_num):
      flat = (SCALE * self.clip_norm * self.direction(j, sum(sizes))).astype(np.float32)
      parts = np.split(flat, np.cumsum(sizes)[:-1])
      out.append([p.reshape(s) for p, s in zip(parts, shapes)])
    return out

  def to_json(self) -> Dict[str, Any]:
    return {"canaries": self.count, "seed": self.seed, "seed_source": self.seed_source,
            "included": [int(x) for x in self.included],
            "rounds": [list(r) for r in self.rounds], "clip_norm": self.clip_norm,
            "scale": SCALE, "directions": "unit Gaussian vectors from (seed, "
                                          f"{DIRECTION_STREAM}, j)"}

  @classmethod
  def from_json(cls, value: Dict[str, Any]) -> "Canaries":
    return cls(seed=int(value["seed"]), seed_source=str(value["seed_source"]),
               included=np.asarray(value["included"], bool),
               rounds=[tuple(int(t) for t in r) for r in value["rounds"]],
               clip_norm=float(value["clip_norm"]))


def save(run_dir: str, canaries: Canaries) -> None:
  outputs.write_json(os.path.join(run_dir, SECRET_FILE), canaries.to_json(), private=True)


def load(run_dir: str) -> Canaries:
  path = os.path.join(run_dir, SECRET_FILE)
  try:
    with open(path, encoding="utf-8") as f:
      return Canaries.from_json(json.load(f))
  except (OSError, ValueError, KeyError) as e:
    raise TrainingError(f"{path}: cannot read the canaries' record ({e}); use a new "
                        "--experiment_name") from None


# ----------------------------------------------------------------------------- plan


def plan(config, claimed_mu: Optional[float]) -> Dict[str, Any]:
  """The guess counts, planned before round 1 on N(0, 1) against N(μ, 1) scores, μ the
  ``--canary_plan_mu`` or the claim's Gaussian μ = sens/z (``tff_mf.audit.plan_one_run``)."""
  mu = config.canary_plan_mu if config.canary_plan_mu is not None else claimed_mu
  if mu is None or not math.isfinite(mu):
    raise TrainingError("--canaries needs --canary_plan_mu: the claim gives no finite mu to "
                        "plan the guesses on")
  model_out, model_in = audit_lib.gaussian_model(float(mu), draws=20_000)
  k_in, k_out = audit_lib.plan_one_run(model_in, model_out, int(config.canaries),
                                       config.canary_alpha, config.delta,
                                       target="fdp_epsilon")
  return {"k_in": int(k_in), "k_out": int(k_out), "alpha": config.canary_alpha,
          "delta": config.delta, "plan_mu": float(mu), "canaries": int(config.canaries),
          "model": "scores N(0, 1) excluded, N(plan_mu, 1) included",
          "target": DECIDING}


def save_plan(run_dir: str, value: Dict[str, Any]) -> None:
  outputs.write_json(os.path.join(run_dir, PLAN_FILE), value, private=True)


def load_plan(run_dir: str) -> Dict[str, Any]:
  with open(os.path.join(run_dir, PLAN_FILE), encoding="utf-8") as f:
    return json.load(f)


# ----------------------------------------------------------------------------- releases


# The released models the audit keeps (float32, θ_0 and one per round), at most.
MAX_MODELS_BYTES = 4 * 2**30


def check_models_size(total_rounds: int, size: int) -> None:
  """Refuses (before anything is written) a run whose released models would not fit."""
  needed = 4 * (total_rounds + 1) * size
  if needed > MAX_MODELS_BYTES:
    raise TrainingError(f"--canaries keeps the model after every round for the audit: "
                        f"{total_rounds + 1} x {size} parameters is {needed / 2**30:.1f} GiB, "
                        f"over {MAX_MODELS_BYTES / 2**30:.0f} GiB; audit a smaller model or "
                        "fewer --total_rounds")


class ReleasedModels:
  """θ_0 and the model after every round, flattened float32, one row each (``MODELS_FILE``)."""

  def __init__(self, run_dir: str, total_rounds: int, size: int):
    path = os.path.join(run_dir, MODELS_FILE)
    if os.path.exists(path):
      self.array = np.load(path, mmap_mode="r+")
      if self.array.shape != (total_rounds + 1, size):
        raise TrainingError(f"{path} holds models of shape {self.array.shape}, not "
                            f"{(total_rounds + 1, size)}; use a new --experiment_name")
    else:
      self.array = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32,
                                             shape=(total_rounds + 1, size))
      os.chmod(path, 0o600)

  def record(self, round_num: int, trainable: Sequence[np.ndarray]) -> None:
    self.array[round_num] = np.concatenate([np.ravel(w) for w in trainable])
    self.array.flush()


# ----------------------------------------------------------------------------- scores


def release_projections(models: np.ndarray, a: np.ndarray, directions: np.ndarray) -> np.ndarray:
  """X·u_j for each canary (columns): A⁻¹(θ_0 − θ_t) projected on the directions (n x m)."""
  models = np.asarray(models)
  moved = np.asarray(models[0], np.float64)[None, :] - np.asarray(models[1:], np.float64)
  return scipy.linalg.solve_triangular(np.asarray(a, np.float64), moved @ directions.T,
                                       lower=True)


def scores(models: np.ndarray, a: np.ndarray, cov: Optional[np.ndarray],
           canaries: Canaries, chunk: int = 256) -> np.ndarray:
  """Each canary's whitened projection score (module docstring); Σ = I when ``cov`` is None."""
  n, size = np.asarray(models).shape[0] - 1, np.asarray(models).shape[1]
  cov = np.eye(n) if cov is None else np.asarray(cov, np.float64)
  proj = np.empty((n, canaries.count))
  for start in range(0, canaries.count, chunk):
    idx = range(start, min(start + chunk, canaries.count))
    directions = np.stack([canaries.direction(j, size) for j in idx])
    proj[:, start:start + len(idx)] = release_projections(models, a, directions)
  out = np.empty(canaries.count)
  for rounds in sorted(set(canaries.rounds)):
    idx = [j for j in range(canaries.count) if canaries.rounds[j] == rounds]
    shift = np.zeros(n)
    shift[[t - 1 for t in rounds]] = 1.0
    out[idx] = audit_lib.projection_scores(proj[:, idx].T, shift, cov)
  return out


def check_released(models: np.ndarray, shapes: Sequence[Tuple[int, ...]],
                   logged: Dict[int, Dict[str, Any]]) -> None:
  """Each kept model (rows 1..n) is the one the run released in that round: its digest is the
  one ``releases.jsonl`` logged (``training.identity.model_digest``); TrainingError if not."""
  offsets = np.cumsum([int(np.prod(s)) for s in shapes])[:-1]
  for t in range(1, np.asarray(models).shape[0]):
    arrays = [p.reshape(s) for p, s in zip(np.split(np.asarray(models[t]), offsets), shapes)]
    if t not in logged or identity_lib.model_digest(arrays)["sha256"] != logged[t]["sha256"]:
      raise TrainingError(f"{MODELS_FILE} round {t} is not the model the run released then "
                          "(releases.jsonl); the audit scores released models only")


def audit(run_dir: str, a: np.ndarray, noise_matrix: Optional[np.ndarray],
          claimed_epsilon: Optional[float], claimed_mu: Optional[float],
          shapes: Sequence[Tuple[int, ...]], logged: Dict[int, Dict[str, Any]]
          ) -> Dict[str, Any]:
  """The run's one-run audit from its releases and the canaries' secret; writes
  ``REPORT_FILE`` (with the scores and coins) and returns the report (every bound with its
  kind, and the check). The kept models are checked against the release log first."""
  canaries = load(run_dir)
  planned = load_plan(run_dir)
  models = np.load(os.path.join(run_dir, MODELS_FILE), mmap_mode="r")
  check_released(models, shapes, logged)
  cov = None if noise_matrix is None else np.asarray(noise_matrix) @ np.asarray(noise_matrix).T
  s = scores(models, a, cov, canaries)
  result = audit_lib.one_run_audit(s, canaries.included, planned["alpha"], planned["delta"],
                                   (planned["k_in"], planned["k_out"]))
  deciding = result[DECIDING]
  exceeds = claimed_epsilon is not None and deciding > claimed_epsilon
  report = {
      "canaries": canaries.count, "included": int(canaries.included.sum()),
      "canary_seed_source": canaries.seed_source, "plan": planned,
      "bounds": {k: {"value": result[k], "kind": v} for k, v in BOUND_KINDS.items()},
      "guesses": result["guesses"], "correct": result["correct"],
      "alpha": result["alpha"], "delta": result["delta"],
      "deciding_bound": DECIDING, "epsilon_lower_bound": deciding,
      "claimed_epsilon": claimed_epsilon, "claimed_mu": claimed_mu,
      "exceeds_claim": bool(exceeds),
      "score": ("whitened projection of the per-round releases A^-1 (theta_0 - theta_t) on "
                "each canary's direction, noise covariance N N^T " +
                ("of the mechanism's reported noise matrix" if noise_matrix is not None else
                 "taken as the identity (the mechanism reports no noise matrix)")),
  }
  report["text"] = statement(report)
  # The evidence, for a recheck with any other auditor: each canary's score and coin (0600).
  outputs.write_json(os.path.join(run_dir, REPORT_FILE),
                     dict(report, scores=[float(x) for x in s],
                          included_canaries=[int(x) for x in canaries.included]), private=True)
  return report


def statement(report: Dict[str, Any]) -> str:
  """The audit's sentences for the privacy statement."""
  conf = 1.0 - report["alpha"]
  claim = report["claimed_epsilon"]
  text = (f"Canary audit (one run): {report['canaries']} synthetic canary clients were "
          f"planted, {report['included']} included by fair coins; their clipped updates are "
          "part of what this run released. Empirical lower bound on epsilon at delta = "
          f"{report['delta']:g}: {report['epsilon_lower_bound']:.3f} ({BOUND_KINDS[DECIDING]}; "
          f"{report['correct']} of {report['guesses']} guesses right, confidence {conf:g}); "
          f"Steinke et al.'s: {report['bounds']['epsilon_lower_bound']['value']:.3f}; "
          f"mu >= {report['bounds']['mu_lower_bound']['value']:.3f}.")
  if claim is None:
    text += " The run reports no epsilon to check."
  elif report["exceeds_claim"]:
    text += (f" WARNING: the lower bound EXCEEDS the claimed epsilon {claim:.4g}: the claim is "
             f"refuted at confidence {conf:g}.")
  else:
    text += f" It does not exceed the claimed epsilon {claim:.4g} (an audit never proves privacy)."
  return text
