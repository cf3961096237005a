"""The numpy mechanism layer: what a registry mechanism is, before TensorFlow (no TF import).

``resolve`` turns a registry mechanism, the training workload and a participation schema
into a ``Resolved`` mechanism: its factorization (from the cache where the strategy is
cached), the noise stream of linear-noise mechanisms (a ``tff_mf.streams.LinearStream``),
the encoder the noise is calibrated for and its sensitivity under the schema. ``privacy``
then fixes the noise multiplier — given, or found by the one ``calibrate`` — and returns a
typed ``PrivacyRecord`` (z, sensitivity, z/sens, ε, analysis). ``tff_mf.tf.aggregators``
only turns a ``Resolved`` and its record into TFF objects; the harness accounts for the
same encoder (``encoder``).

The encoder the noise is calibrated for:

- matrix mechanisms (dense and linear noise): the normalized C of the factorization;
- TFF's tree (``tff_tree``): C_T/√levels. TFF adds noise of multiplier z·√levels to every
  node of C_T (``tree_node_multiplier``), so per unit of z the sensitivity is
  sens(C_T)/√levels (McMahan et al. 2022, Sec 2.1); when n is not a power of two no leaf
  is in all ``levels`` released nodes and this is below 1;
- TFF's ``gaussian_fixed`` (``tff_gaussian``): C = I.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Dict, Optional

import numpy as np

from tff_mf import checks
from tff_mf import factorization as fz
from tff_mf import participation as participation_lib
from tff_mf import registry
from tff_mf import streams
from tff_mf import strategies
from tff_mf import workloads
from tff_mf.families import tree

EPSILON_ANALYSIS = "one Gaussian at z/sens, without amplification"


@dataclasses.dataclass(frozen=True)
class Resolved:
  """A registry mechanism resolved for n rounds, a workload and a schema (numpy only).

  Attributes:
    mechanism: the registry entry.
    workload: the training workload A (``WorkloadSpec``).
    participation: the schema the sensitivity is for.
    factorization: the normalized A = B·C for the training workload (None for TFF's tree
      and for ``none``; C = I for TFF's gaussian).
    a_factorized: the A the strategy factorized (S when the mechanism post-processes a
      prefix-sum decoder), which linear streams are rebuilt for.
    stream: C⁻¹·Z as a ``LinearStream`` (linear-noise mechanisms), else None.
    encoder: the C the noise is calibrated for (see the module docstring); None for
      ``none``.
    sensitivity_report: {value, exact, method} of the encoder's sensitivity under the
      schema (for TFF's tree: of C_T, per node); None for ``none``.
    sensitivity: sens per unit of z (for TFF's tree sens(C_T)/√levels); None for ``none``.
    info: JSON-ready fields for the run record (the factorization's parameters, the cache
      entry, the sensitivity and how it was computed).
  """
  mechanism: registry.Mechanism
  workload: workloads.WorkloadSpec
  participation: participation_lib.Participation
  factorization: Optional[fz.Factorization]
  a_factorized: Optional[np.ndarray]
  stream: Optional[streams.LinearStream]
  encoder: Optional[np.ndarray]
  sensitivity_report: Optional[Dict[str, Any]]
  sensitivity: Optional[float]
  info: Dict[str, Any] = dataclasses.field(default_factory=dict)

  @property
  def n(self) -> int:
    return int(self.workload.n)


@dataclasses.dataclass(frozen=True)
class PrivacyRecord:
  """The privacy of a resolved mechanism at its noise multiplier z (given or calibrated)."""
  private: bool
  noise_multiplier: float
  sensitivity: Optional[float] = None
  delta: Optional[float] = None
  accountant: Optional[str] = None
  epsilon: Optional[float] = None
  target_epsilon: Optional[float] = None
  analysis: str = EPSILON_ANALYSIS

  @property
  def effective_noise_multiplier(self) -> Optional[float]:
    """z/sens: the multiplier of the one Gaussian mechanism the run is."""
    return None if self.sensitivity is None else self.noise_multiplier / self.sensitivity

  def info(self, clip_norm: float) -> Dict[str, Any]:
    """The JSON-ready fields ``build_mechanism`` records."""
    if not self.private:
      return {"noise_multiplier": 0.0, "private": False}
    out: Dict[str, Any] = {}
    if self.target_epsilon is not None:
      out.update(target_epsilon=self.target_epsilon, calibrated=True)
    out.update(noise_multiplier=self.noise_multiplier,
               stddev_per_round_sum=self.noise_multiplier * clip_norm,
               effective_noise_multiplier=self.effective_noise_multiplier)
    if self.delta is not None:
      out.update(delta=self.delta, accountant=self.accountant, epsilon=self.epsilon,
                 epsilon_analysis=self.analysis)
    return out


def training_workload(n: int, momentum: float, lr_schedule: str,
                      schedule_rounds: Optional[int]) -> workloads.WorkloadSpec:
  """The workload A a run trains with: S, or momentum with a learning-rate schedule."""
  if momentum == 0.0 and lr_schedule == "constant":
    return workloads.WorkloadSpec(kind="prefix_sum", n=n)
  return workloads.WorkloadSpec(kind="momentum", n=n, momentum=momentum,
                                lr_schedule=lr_schedule, schedule_rounds=schedule_rounds)


def tree_encoder(n: int) -> np.ndarray:
  """C_T/√levels: the encoder TFF's tree aggregation is calibrated for (module docstring)."""
  return np.asarray(tree.tree_encoder(n), np.float64) / math.sqrt(tree.tree_levels(n))


def tree_node_multiplier(noise_multiplier: float, n: int) -> float:
  """z·√levels: the multiplier TFF's tree adds to every node of C_T for run multiplier z."""
  return noise_multiplier * math.sqrt(tree.tree_levels(n))


def resolve(mechanism: registry.Mechanism, workload: workloads.WorkloadSpec,
            participation: participation_lib.Participation, *, cache_dir: Optional[str] = None,
            bands: Optional[int] = None, rank: Optional[int] = None,
            buffers: Optional[int] = None, progress: bool = False) -> Resolved:
  """The ``Resolved`` mechanism (see the class)."""
  info: Dict[str, Any] = {}
  f = a_factorized = stream = encoder = report = sens = None
  n = workload.n
  if mechanism.noise in ("dense", "linear"):
    f, a_factorized = _matrix_factorization(mechanism, workload, participation, cache_dir,
                                            bands, rank, buffers, progress, info)
    if mechanism.noise == "linear":
      stream = strategies.stream(mechanism.strategy, f.extras, a_factorized)
    encoder = f.c
    report = f.sensitivity_report(participation)
    sens = float(report["value"])
  elif mechanism.noise == "tff_tree":
    levels = tree.tree_levels(n)
    report = participation_lib.sensitivity_report(tree.tree_encoder(n), participation)
    sens = report["value"] / math.sqrt(levels)
    encoder = tree_encoder(n)
    info.update(tree_levels=levels, sensitivity_per_node=report["value"])
  elif mechanism.noise == "tff_gaussian":
    f = strategies.factorize(strategies.FactorizationSpec(workload=workload,
                                                          strategy="identity"))
    encoder = f.c
    report = participation_lib.sensitivity_report(encoder, participation)
    sens = float(report["value"])
  if report is not None:
    info.update(sensitivity=sens, sensitivity_exact=report["exact"],
                sensitivity_method=report["method"])
  return Resolved(mechanism=mechanism, workload=workload, participation=participation,
                  factorization=f, a_factorized=a_factorized, stream=stream, encoder=encoder,
                  sensitivity_report=report, sensitivity=sens, info=info)


def _matrix_factorization(m: registry.Mechanism, w_spec: workloads.WorkloadSpec,
                          participation: participation_lib.Participation,
                          cache_dir: Optional[str], bands: Optional[int], rank: Optional[int],
                          buffers: Optional[int], progress: bool, info: Dict[str, Any]):
  """(factorization for the training A, workload of the stream) from the cache, checked."""
  from tff_mf import cache  # pylint: disable=g-import-not-at-top
  n = w_spec.n
  factorized = workloads.WorkloadSpec("prefix_sum", n) if m.post_processes_prefix_decoder \
      else w_spec
  params = registry.default_parameters(m.strategy, n, participation)
  params.update({k: v for k, v in (("bands", bands), ("rank", rank),
                                   ("buffers", buffers)) if v is not None and k in params})
  # C is optimized for the schema where its strategy can be; the noise stream computes the
  # sensitivity under the schema from C either way.
  optimized_for = (participation if participation.kind in
                   registry.strategy(m.strategy).participations else participation_lib.SINGLE)
  spec = strategies.FactorizationSpec(workload=factorized, strategy=m.strategy,
                                      participation=optimized_for, **params)
  if strategies.cached(m.strategy):
    f, entry = cache.load_or_factorize(spec, cache_dir=cache_dir, progress=progress)
    info.update(cache_npz=entry.npz_path, cache_hit=entry.cache_hit)
  else:
    f = strategies.factorize(spec, progress=progress)
  info.update(params, optimized_for=optimized_for.as_dict())
  a_factorized = f.a
  if factorized != w_spec:
    f = strategies.post_processed(f, w_spec.build(), m.name)
  # Every path above ran every check of ``checks.factors`` once (B·C = A on every entry,
  # γ(C) = 1): the cache's load, ``strategies.factorize`` and ``post_processed``.
  return f, a_factorized


def calibrate(resolved: Resolved, target_epsilon: float, delta: float,
              accountant: str) -> PrivacyRecord:
  """The one calibration: the smallest z (relative tolerance 1e-3) whose ε (one Gaussian at
  z/sens, no amplification) is at most ``target_epsilon``, and its record."""
  from tff_mf import accounting  # pylint: disable=g-import-not-at-top
  z = accounting.calibrate_noise_multiplier(target_epsilon, delta, accountant,
                                            sensitivity=resolved.sensitivity)
  return _record(resolved, float(z), delta, accountant, target_epsilon)


def privacy(resolved: Resolved, noise_multiplier: Optional[float],
            target_epsilon: Optional[float], delta: Optional[float],
            accountant: str) -> PrivacyRecord:
  """The ``PrivacyRecord`` at the given z, or ``calibrate``d to ``target_epsilon``."""
  if not resolved.mechanism.private:
    return PrivacyRecord(private=False, noise_multiplier=0.0)
  if noise_multiplier is None:
    return calibrate(resolved, checks.positive_float(target_epsilon, "target_epsilon"),
                     delta, accountant)
  return _record(resolved, float(noise_multiplier), delta, accountant, None)


def _record(resolved: Resolved, z: float, delta: Optional[float], accountant: str,
            target_epsilon: Optional[float]) -> PrivacyRecord:
  from tff_mf import accounting  # pylint: disable=g-import-not-at-top
  eps = None
  if delta is not None:
    eps = accounting.epsilon(z, delta, accountant, sensitivity=resolved.sensitivity)
  return PrivacyRecord(private=True, noise_multiplier=z, sensitivity=resolved.sensitivity,
                       delta=delta, accountant=accountant if delta is not None else None,
                       epsilon=eps, target_epsilon=target_epsilon)
