"""Empirical privacy audit of the running TFF aggregator (the TensorFlow part).

``audit(mechanism, ...)`` builds the mechanism with ``build_mechanism`` inside
``tff.learning.algorithms.build_unweighted_fed_avg`` on a linear model, runs federated
averaging many times with fresh noise seeds on two neighbouring datasets — with and
without one canary client placed in the schema's worst participation pattern on the
covariance estimated from canary-free calibration runs — and hands the released models
to ``tff_mf.audit``, which turns them into empirical LOWER bounds on ε at δ and on the
Gaussian-DP μ with a stated confidence (Jagielski, Ullman, Oprea 2020,
arXiv:2006.07709; Nasr et al. 2023, arXiv:2302.07956; Steinke, Nasr, Jagielski 2023,
arXiv:2305.08846).

Model. Each client's loss is the mean of its model's outputs, w·x, so its update
(after one SGD step at learning rate 1) is its data x whatever the model: the
canary's update is fixed in advance and exactly clipped by the aggregator.

Trials packed into coordinates. A (z, ζ) run's privacy is that of its release
projected on the canary's direction (the noise is isotropic). A run of the same
mechanism on a d = T parameter model with clip ζ·√T and noise multiplier z/√T, whose
canary update is ζ in every coordinate, has in each coordinate exactly that
projection's distribution; its T coordinates are T trials when the noise is
independent across coordinates, which the audit checks (``packing_check``). One
TFF run thus gives T trials, and a trial costs n·T model entries, not n rounds of
TFF.

The release is read with what the aggregator reports (the workload A of the server
optimizer, z, ζ, clients per round K, server learning rate). Where the canary goes
and the second statistic's Σ come from held-out canary-free runs; the first
statistic's Σ from the reported noise matrix N = A⁻¹·B; the claim (sens/z, or the
amplified ε) from the mechanism's own report.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Dict, List, Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_mf import audit as audit_lib
from tff_mf import checks
from tff_mf import participation as participation_lib
from tff_mf import spec as spec_lib
from tff_mf.tf import aggregators
from tff_mf.tf import noise as noise_lib

AUDITABLE_NOISE = audit_lib.AUDITABLE_NOISE


AuditOptions = audit_lib.AuditOptions

# The canary is placed from the estimated covariance when there are more calibration
# trials than this many per round; otherwise from the reported noise matrix.
MIN_CALIBRATION = 4


@dataclasses.dataclass
class Released:
  """What the audit knows of a packed aggregator, read from its own report."""
  a: np.ndarray            # workload the server optimizer applies
  noise_matrix: np.ndarray  # N = A⁻¹·B (n x m)
  z_eff: float             # noise std per unit of canary contribution per coordinate
  unit: float              # canary contribution per coordinate (ζ)
  clip: float              # clip of the packed run (ζ·√T)
  clients: float           # K, the denominator
  server_lr: float
  packed: int              # T


def released_model(packed: aggregators.MechanismSetup) -> Released:
  """Σ and the shift's scale from a packed setup's matrices and info (never accounting)."""
  info = packed.info
  f = packed.factorization
  kind = packed.mechanism.mechanism.noise_kind if packed.mechanism is not None else None
  if kind is None or not kind.auditable or f is None:
    raise checks.CheckError(f"mechanism {info.get('mechanism')!r} cannot be audited: its noise "
                            f"seed is fixed when it is built (audit {', '.join(AUDITABLE_NOISE)} "
                            "noise kinds)")
  if info.get("noise_seed_pinned"):
    raise checks.CheckError("the audit needs fresh noise seeds: build without noise_seed")
  nm = packed.noise.noise_matrix() if packed.noise is not None else f.noise_matrix()
  t = int(info["audit_trials_per_run"])
  clip = float(info["clip_norm"])
  unit = clip / math.sqrt(t)
  return Released(a=np.asarray(f.a, np.float64), noise_matrix=nm,
                  z_eff=float(info["noise_multiplier"]) * clip / unit, unit=unit, clip=clip,
                  clients=float(info["clients_per_round"]),
                  server_lr=float(info["server_learning_rate"]), packed=t)


def build_pair(spec: spec_lib.MechanismSpec, trials_per_run: int, *,
               server_learning_rate: float = 1.0, cache_dir: Optional[str] = None):
  """(claimed, packed) setups: the user's configuration (a ``tff_mf.spec.MechanismSpec``) and
  its T-trial packing, the same spec at clip ζ·√T and multiplier z/√T (z as given or as
  calibrated for the claim)."""
  if not isinstance(spec, spec_lib.MechanismSpec):
    raise checks.CheckError("the audit takes a MechanismSpec: "
                            "tff_mf.spec.MechanismSpec.from_args(mechanism, ...)")
  audit_lib.check_auditable(spec.mechanism.name)
  wiring = dict(server_learning_rate=server_learning_rate, cache_dir=cache_dir)
  claimed = aggregators.build_mechanism(spec, **wiring)
  t = checks.positive_int(trials_per_run, "trials_per_run")
  z = claimed.info.get("noise_multiplier")
  if not claimed.info.get("private", True) or not z:
    raise checks.CheckError(f"mechanism {claimed.info['mechanism']!r} adds no noise: nothing "
                            "to audit")
  packed_spec = dataclasses.replace(
      spec, privacy=dataclasses.replace(spec.privacy, noise_multiplier=z / math.sqrt(t),
                                        target_epsilon=None),
      clipping=dataclasses.replace(spec.clipping,
                                   clip_norm=claimed.info["clip_norm"] * math.sqrt(t)))
  packed = aggregators.build_mechanism(packed_spec, **wiring)
  packed.info["audit_trials_per_run"] = t
  return claimed, packed


def _model_fn(dim: int):
  spec = (tf.TensorSpec([None, dim], tf.float32), tf.TensorSpec([None, 1], tf.float32))

  class LinearLoss(tf.keras.losses.Loss):
    def call(self, y_true, y_pred):  # gradient w.r.t. the kernel: the client's x
      del y_true
      return tf.reduce_mean(y_pred, axis=-1)

  def model_fn():
    keras_model = tf.keras.Sequential([tf.keras.layers.Dense(
        1, use_bias=False, kernel_initializer="zeros", input_shape=(dim,))])
    return tff.learning.models.from_keras_model(keras_model, loss=LinearLoss(), input_spec=spec)

  return model_fn


def build_process(packed: aggregators.MechanismSetup, dim: int):
  """``build_unweighted_fed_avg`` with the packed aggregator; client updates equal their data."""
  return tff.learning.algorithms.build_unweighted_fed_avg(
      _model_fn(dim), client_optimizer_fn=tff.learning.optimizers.build_sgdm(1.0),
      server_optimizer_fn=packed.server_optimizer, model_aggregator=packed.aggregation_factory)


def _dataset(x: np.ndarray):
  x = np.asarray(x, np.float32)[None, :]
  return tf.data.Dataset.from_tensor_slices((x, np.zeros((1, 1), np.float32))).batch(1)


def _clipped(x: np.ndarray, clip: float) -> np.ndarray:
  norm = float(np.linalg.norm(x))
  return x * min(1.0, clip / norm) if norm > 0 else x


@dataclasses.dataclass
class Canary:
  """Per round, the canary's data in each packed coordinate (rounds x T), or None."""
  updates: Optional[np.ndarray]


def run_world(process, rel: Released, canary: Canary, runs: int, others: str,
              rng: np.random.Generator, bar=None) -> np.ndarray:
  """Runs fed_avg ``runs`` times; returns the releases X/ζ, one row per trial (n columns).

  X = −(K/η)·A⁻¹(θ − θ₀) minus the other clients' (known) clipped updates: the
  aggregator's sums G + σ·N·Z, per packed coordinate.
  """
  n, t = rel.a.shape[0], rel.packed
  n_others = max(1, int(round(rel.clients)) - 1)
  out = []
  for _ in range(runs):
    state = process.initialize()
    theta0 = np.asarray(process.get_model_weights(state).trainable[0], np.float64).ravel()
    known = np.zeros((n, t))
    thetas = []
    for i in range(n):
      clients = []
      for _ in range(n_others):
        x = np.zeros(t) if others == "zero" else rng.normal(size=t) * 0.5 * rel.clip / math.sqrt(t)
        clients.append(_dataset(x))
        known[i] += _clipped(x.astype(np.float32).astype(np.float64), rel.clip)
      if canary.updates is not None and np.any(canary.updates[i]):
        clients.append(_dataset(canary.updates[i]))
      state = process.next(state, clients).state
      thetas.append(np.asarray(process.get_model_weights(state).trainable[0], np.float64).ravel())
    y = np.array(thetas) - theta0
    x = -(rel.clients / rel.server_lr) * np.linalg.solve(rel.a, y) - known
    out.append((x / rel.unit).T)
    if bar is not None:
      bar.update(1)
  return np.concatenate(out, axis=0)


def canary_updates(rel: Released, vector: np.ndarray, prob: Optional[float],
                   rng: np.random.Generator) -> np.ndarray:
  """The canary's data per round and coordinate: 2ζ·√T·s_t/√T per coordinate (clipped to ζ
  per coordinate by the aggregator), or, Poisson, ζ with probability p per round and
  coordinate (norm ≤ ζ·√T, not clipped)."""
  t = rel.packed
  if prob is None:
    return 2.0 * rel.unit * np.outer(vector, np.ones(t))
  joined = rng.random((len(vector), t)) < prob
  return rel.unit * (vector[:, None] != 0) * joined


def packing_check(scores: np.ndarray, per_run: int) -> Dict[str, Any]:
  """Coordinates of one run are independent: the run means of standardized scores have
  variance 1/T, so Σ_runs T·mean² is about χ² with runs − 1 degrees of freedom (two-sided
  p-value; correlated coordinates inflate it). With one run there is nothing to compare:
  the p-value is None."""
  import scipy.stats  # pylint: disable=g-import-not-at-top
  s = np.asarray(scores).reshape(-1, per_run)
  if s.shape[0] < 2:
    return {"statistic": None, "dof": 0, "p_value": None, "runs": int(s.shape[0])}
  s = (s - s.mean()) / s.std()
  stat = float(np.sum(per_run * s.mean(axis=1) ** 2))
  dof = s.shape[0] - 1
  cdf = float(scipy.stats.chi2.cdf(stat, dof))
  return {"statistic": stat, "dof": dof, "p_value": 2 * min(cdf, 1 - cdf),
          "runs": int(s.shape[0])}


def _schema_patterns(schema: participation_lib.Participation, n: int):
  return audit_lib.canary_patterns(schema.kind, n, epochs=schema.epochs, min_sep=schema.min_sep,
                                   max_participations=schema.max_participations)


def _poisson_rounds(schema: participation_lib.Participation, n: int, canary) -> List[int]:
  """The residue class mod b of the canary's pattern (every round it may join)."""
  if not schema.poisson:
    raise checks.CheckError("sampling_prob (Poisson canary) needs min_sep participation")
  rounds = list(range(canary["pattern"][0] % schema.min_sep, n, schema.min_sep))
  k = schema.max_participations
  if k is not None and k < len(rounds):
    raise checks.CheckError(f"a Poisson canary may join all {len(rounds)} rounds of its class; "
                            f"max_participations={k} caps it (leave it unset)")
  return rounds


def where_to_look(cal: Optional[np.ndarray], patterns, reported: Dict[str, Any]):
  """The canary's pattern: the schema's worst on the covariance estimated from the
  canary-free calibration trials (``audit_lib.observed_canary``), so that a fault anywhere
  in the stream draws the canary to it; the reported noise matrix's worst only when there
  are too few calibration trials (with a warning). The test then runs on fresh trials."""
  if cal is not None and cal.shape[0] > MIN_CALIBRATION * cal.shape[1]:
    observed = audit_lib.observed_canary(cal, patterns)
    return dict(observed, chosen_from=f"the covariance estimated from {cal.shape[0]} "
                "canary-free trials"), None
  return dict(reported, chosen_from="the reported noise matrix"), (
      "the canary follows the reported noise matrix (calibration trials <= "
      f"{MIN_CALIBRATION} x n): a fault away from its pattern goes unseen; give more "
      "calibration trials")


def _claim(claimed: aggregators.MechanismSetup, schema, opts: AuditOptions) -> Dict[str, Any]:
  """What the mechanism claims: GDP μ = sens/z (unamplified), or the amplified ε at δ."""
  info = claimed.info
  out = {"claimed_mu": float(info["sensitivity"]) / float(info["noise_multiplier"]),
         "claimed_sensitivity": float(info["sensitivity"]),
         "noise_multiplier": float(info["noise_multiplier"])}
  out["claimed_epsilon"] = audit_lib.gdp_epsilon(out["claimed_mu"], opts.delta)
  if opts.sampling_prob is not None:
    from tff_mf import accounting  # pylint: disable=g-import-not-at-top
    record = accounting.epsilon_for(claimed.factorization.c, schema, out["noise_multiplier"],
                                    opts.delta, amplification="mmcc",
                                    sampling_prob=opts.sampling_prob)
    out.update(claimed_epsilon=float(record.epsilon), claimed_analysis=record.analysis,
               claimed_bound=record.bound, claimed_mu=None)
  return out


def _scores(x0, x1, cal_cov, shift, cov_rep, poisson, opts: AuditOptions,
            claimed_mu: Optional[float]) -> Dict[str, Any]:
  """Per statistic (reported Σ; Σ estimated from the calibration trials): scores, bounds,
  and the smallest true μ / claimed μ it flags with probability ≥ POWER."""
  covs = {"reported_sigma": cov_rep}
  if cal_cov is not None:
    covs["estimated_sigma"] = cal_cov
  alpha = opts.alpha / len(covs)
  out = {}
  for name, cov in covs.items():
    if poisson is None:
      s0 = audit_lib.projection_scores(x0, shift, cov)
      s1 = audit_lib.projection_scores(x1, shift, cov)
      w = np.linalg.solve(cov, shift)
      m0, m1 = audit_lib.gaussian_model(math.sqrt(float(shift @ w)))
      grid = audit_lib.planned_thresholds(m0, m1, len(s0), len(s1), alpha, opts.delta)
    else:
      s0 = audit_lib.mixture_log_likelihood_ratio(x0, poisson, opts.sampling_prob, cov)
      s1 = audit_lib.mixture_log_likelihood_ratio(x1, poisson, opts.sampling_prob, cov)
      m0, m1 = _simulated_mixture(shift.size, poisson, opts.sampling_prob, cov)
      grid = audit_lib.planned_thresholds(m0, m1, len(s0), len(s1), alpha, opts.delta)
    report = audit_lib.score_report(s0, s1, grid, alpha, opts.delta)
    ratio = None if claimed_mu is None else audit_lib.detectable_mu_ratio(
        grid, len(s0), len(s1), claimed_mu)
    out[name] = dict(report, scores=(s0, s1), alpha=alpha, detectable_mu_ratio=ratio)
  return out


def _simulated_mixture(n: int, rounds, prob: float, cov: np.ndarray):
  """The mixture statistic's laws without and with the Poisson canary under the model
  (simulated with a fixed seed, before and independently of the audit's data)."""
  rng = np.random.default_rng(audit_lib.PLAN_SEED)
  chol = np.linalg.cholesky(cov)
  z0 = rng.standard_normal((50000, n)) @ chol.T
  z1 = rng.standard_normal((50000, n)) @ chol.T
  z1[:, rounds] += (rng.random((50000, len(rounds))) < prob).astype(np.float64)
  return tuple(audit_lib.mixture_log_likelihood_ratio(z, rounds, prob, cov) for z in (z0, z1))


def audit_setups(claimed: aggregators.MechanismSetup, packed: aggregators.MechanismSetup,
                 options: AuditOptions = AuditOptions(),
                 schema: Optional[participation_lib.Participation] = None,
                 progress: bool = False, seed: Optional[int] = None) -> Dict[str, Any]:
  """Audits ``packed`` (see ``build_pair``) against what ``claimed`` reports.

  ``schema``: the participation the canary follows (default: the claimed one), so that
  a run accounted under another schema than its sampler's can be audited. Returns a
  JSON-ready report (``scores`` holds the raw score arrays, for plots).
  """
  opts = options.checked()
  rel = released_model(packed)
  n = rel.a.shape[0]
  schema = schema or participation_lib.from_dict(claimed.info["participation"])
  patterns = _schema_patterns(schema, n)
  reported = audit_lib.worst_canary(rel.noise_matrix, patterns)
  rng = np.random.default_rng(seed)
  runs = -(-opts.trials // rel.packed)
  cal_runs = -(-opts.calibration_trials // rel.packed) if opts.calibration_trials else 0
  process = build_process(packed, rel.packed)
  bar = _bar(progress, 2 * runs + cal_runs)
  try:
    cal = run_world(process, rel, Canary(None), cal_runs, opts.others, rng, bar) \
        if cal_runs else None
    canary, look_warning = where_to_look(cal, patterns, reported)
    poisson = None if opts.sampling_prob is None else _poisson_rounds(schema, n, canary)
    shift = canary["vector"] if poisson is None else np.zeros(n)
    if poisson is not None:
      shift[poisson] = 1.0
    x0 = run_world(process, rel, Canary(None), runs, opts.others, rng, bar)
    x1 = np.concatenate([run_world(
        process, rel, Canary(canary_updates(rel, shift, opts.sampling_prob, rng)), 1,
        opts.others, rng, bar) for _ in range(runs)])
  finally:
    if bar is not None:
      bar.close()
  cov_rep = rel.z_eff ** 2 * (rel.noise_matrix @ rel.noise_matrix.T)
  claim = _claim(claimed, schema, opts)
  stats = _scores(x0, x1, canary.get("covariance"), shift, cov_rep, poisson, opts,
                  claim["claimed_mu"])
  verdict = audit_lib.compare_with_claim(
      {k: v for k, v in stats.items()}, opts.delta, claim["claimed_mu"],
      claim["claimed_epsilon"] if poisson is not None else None)
  out = _report(claimed, schema, opts, rel, canary, reported, poisson, stats, claim, verdict)
  if look_warning:
    out["warnings"].insert(0, look_warning)
  return out


def _bar(progress: bool, total: int):
  if not progress:
    return None
  import sys  # pylint: disable=g-import-not-at-top
  from tqdm import tqdm  # pylint: disable=g-import-not-at-top
  return tqdm(total=total, desc="audit runs", unit="run", file=sys.stderr)


def _report(claimed, schema, opts, rel, canary, reported, poisson, stats, claim, verdict):
  prec = audit_lib.precision_matrix(rel.noise_matrix)
  release_mu = math.sqrt(float(canary["vector"] @ prec @ canary["vector"])) / rel.z_eff
  statistics = {}
  for name, r in stats.items():
    statistics[name] = {k: r[k] for k in ("epsilon_lower_bound", "mu_lower_bound",
                                          "mu_estimate", "mu_standard_error", "alpha",
                                          "detectable_mu_ratio")}
    statistics[name]["packing_check"] = packing_check(r["scores"][0], rel.packed)
    statistics[name]["decided"] = name == verdict["decided_by"]
  main = stats[verdict["decided_by"]]
  out = {
      "mechanism": claimed.info["mechanism"], "total_rounds": rel.a.shape[0],
      "participation": schema.as_dict(), "claimed_participation": claimed.info["participation"],
      "noise_multiplier": claim["noise_multiplier"], "clip_norm": claimed.info["clip_norm"],
      "clients_per_round": rel.clients, "trials": opts.trials,
      "trials_per_run": rel.packed, "calibration_trials": opts.calibration_trials,
      "others": opts.others, "delta": opts.delta, "alpha": opts.alpha,
      "confidence": 1.0 - opts.alpha, "sampling_prob": opts.sampling_prob,
      "canary": {"pattern": canary["pattern"], "signs": canary["signs"],
                 "chosen_from": canary["chosen_from"],
                 "calibration_mu": canary.get("mu"),
                 "reported_worst_pattern": reported["pattern"],
                 "reported_worst_signs": reported["signs"],
                 "poisson_rounds": poisson, "patterns_searched": canary["patterns_searched"]},
      "claimed_mu": claim["claimed_mu"], "claimed_sensitivity": claim["claimed_sensitivity"],
      "claimed_epsilon": claim["claimed_epsilon"],
      "release_mu": None if poisson is not None else release_mu,
      "reported_worst_mu": reported["sensitivity"] / rel.z_eff,
      "mu_estimate": main["mu_estimate"], "mu_standard_error": main["mu_standard_error"],
      "statistics": statistics, **verdict,
      "epsilon_kind": "empirical LOWER bound on epsilon (holds with probability >= "
                      f"{1 - opts.alpha:g} over the trials); never an upper bound",
  }
  ratios = [s["detectable_mu_ratio"] for s in statistics.values()
            if s["detectable_mu_ratio"] is not None]
  # The audit flags when any statistic does: its power is at least each one's.
  out["power"] = {"probability": audit_lib.POWER,
                  "detectable_mu_ratio": min(ratios) if ratios else None,
                  "trials": opts.trials}
  out["warnings"] = [
      f"{name}: the trials packed into one run look dependent (packing check p = "
      f"{stat['packing_check']['p_value']:.2g}); the confidence assumes independent "
      "coordinates: rerun with trials_per_run = 1"
      for name, stat in statistics.items()
      if stat["packing_check"]["p_value"] is not None
      and stat["packing_check"]["p_value"] < opts.alpha]
  if claim["claimed_mu"]:
    out["mu_ratio"] = main["mu_estimate"] / claim["claimed_mu"]
  if poisson is not None:
    out.update(claimed_analysis=claim.get("claimed_analysis"),
               claimed_bound=claim.get("claimed_bound"),
               epsilon_ratio=verdict["epsilon_lower_bound"] / claim["claimed_epsilon"])
  out["scores"] = {k: v["scores"] for k, v in stats.items()}
  out["points"] = {k: v["points"] for k, v in stats.items()}
  return out


def audit(spec: spec_lib.MechanismSpec, *, options: AuditOptions = AuditOptions(),
          schema: Optional[participation_lib.Participation] = None, progress: bool = False,
          seed: Optional[int] = None, server_learning_rate: float = 1.0) -> Dict[str, Any]:
  """Builds the mechanism of ``spec`` (a ``tff_mf.spec.MechanismSpec``) and audits it.

  The report's ``epsilon_lower_bound`` and ``mu_lower_bound`` are empirical LOWER
  bounds (probability ≥ 1 − alpha); ``violation`` says they refute the claim.
  """
  claimed, packed = build_pair(spec, options.trials_per_run,
                               server_learning_rate=server_learning_rate)
  return audit_setups(claimed, packed, options, schema=schema, progress=progress, seed=seed)


def json_ready(report: Dict[str, Any]) -> Dict[str, Any]:
  """The report without its score arrays, numbers as plain floats (inf as "inf")."""
  def clean(v):
    if isinstance(v, dict):
      return {k: clean(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
      return [clean(x) for x in v]
    if isinstance(v, (np.floating, float)):
      return float(v) if math.isfinite(v) else ("inf" if v > 0 else "-inf")
    if isinstance(v, np.integer):
      return int(v)
    if isinstance(v, np.bool_):
      return bool(v)
    return v
  return clean({k: v for k, v in report.items() if k not in ("scores", "points")})


# ----------------------------------------------------------------------------- planted faults

FAULTS = audit_lib.FAULTS


class FaultyRowNoise(noise_lib.DenseNoise):
  """A faulty copy of a dense stream, for checking the audit (never used in training).

  ``reuse``: round ``row + 1`` adds round ``row``'s noise row again (as after a resume
  that did not advance the round index); ``scale``: round ``row``'s noise is multiplied
  by ``factor``; ``drop``: the stream leaves out row ``row`` of C⁻¹ (that round adds no
  noise). ``noise_matrix()`` still reports the stream as built.
  """

  def __init__(self, c, participation, kind: str, row: int, factor: float = 1.0):
    super().__init__(c, participation=participation)
    if kind not in ("reuse", "scale", "drop"):
      raise checks.CheckError(f"unknown row fault {kind!r}")
    self.kind, self.row, self.factor = kind, int(row), float(factor)

  def _noise_row(self, seed, i, stream_state, specs, stddev):
    if self.kind == "reuse":
      j = tf.where(tf.equal(i, self.row + 1), tf.constant(self.row, i.dtype), i)
      return super()._noise_row(seed, j, stream_state, specs, stddev)
    rows, stream_state = super()._noise_row(seed, i, stream_state, specs, stddev)
    factor = 0.0 if self.kind == "drop" else self.factor
    hit = tf.equal(i, self.row)
    return [tf.where(hit, r * tf.cast(factor, r.dtype), r) for r in rows], stream_state


def _away_from(pattern, n: int, span: int) -> int:
  """The last round r with rounds r, …, r + span − 1 all outside ``pattern``."""
  for r in range(n - span, -1, -1):
    if not set(range(r, r + span)) & set(pattern):
      return r
  raise checks.CheckError(f"every {span} consecutive rounds meet the canary's pattern {pattern}")


def _factory_with(noise, packed, noise_multiplier: float):
  import tensorflow_privacy as tfp  # pylint: disable=g-import-not-at-top
  from tff_mf.tf import query as query_lib  # pylint: disable=g-import-not-at-top
  info = packed.info

  def make(specs):
    q = query_lib.MatrixFactorizationQuery(noise, l2_norm_clip=info["clip_norm"],
                                           noise_multiplier=noise_multiplier, record_specs=specs)
    return tfp.NormalizedQuery(q, denominator=info["clients_per_round"])

  return aggregators.DPAggregatorFactory(make, f"{info['mechanism']} (planted fault)")


def plant_fault(fault: str, claimed, packed, factor: Optional[float] = None):
  """(claimed, packed, canary schema) with one known fault planted in copies of the setups.

  ``under_reported_sensitivity``: the claim's sensitivity divided by ``factor`` (1.25);
  ``noise_divided``: the aggregator's noise divided by ``factor`` (1.25);
  ``repeated_noise_row``: the noise row of the reported worst canary's first round added
  again in the next round; ``schema_ignored``: the mechanism built and accounted for
  single participation while the canary follows fixed_epoch(2). Away from the reported
  worst canary's pattern (dense square streams; ``noise_matrix()`` reports the stream as
  built): ``repeated_noise_row_elsewhere``: a noise row added again in the next round;
  ``noise_row_scaled``: one round's noise divided by ``factor`` (2); ``noise_row_dropped``:
  one row of C⁻¹ left out. The audit should refute each claim; its power on a
  configuration is how often it does.
  """
  schema = participation_lib.from_dict(claimed.info["participation"])
  if fault == "under_reported_sensitivity":
    info = dict(claimed.info, sensitivity=claimed.info["sensitivity"] / (factor or 1.25))
    return dataclasses.replace(claimed, info=info), packed, schema
  if fault == "noise_divided":
    if packed.noise is None:
      raise checks.CheckError("noise_divided needs a matrix mechanism's stream")
    faulty = _factory_with(packed.noise, packed,
                           packed.info["noise_multiplier"] / (factor or 1.25))
    return claimed, dataclasses.replace(packed, aggregation_factory=faulty), schema
  if fault == "schema_ignored":
    if not schema.at_most_once:
      raise checks.CheckError("schema_ignored takes a mechanism built for single participation")
    return claimed, packed, participation_lib.fixed_epoch(2)
  if fault not in FAULTS:
    raise checks.CheckError(f"unknown fault {fault!r}; expected one of {', '.join(FAULTS)}")
  if not isinstance(packed.noise, noise_lib.DenseNoise) or packed.noise.m != packed.noise.n:
    raise checks.CheckError(f"{fault} is planted in a square dense stream")
  n = packed.noise.n
  pattern = audit_lib.worst_canary(packed.noise.noise_matrix(),
                                   _schema_patterns(schema, n))["pattern"]
  kind, row, scale = {
      "repeated_noise_row": ("reuse", min(pattern[0], n - 2), 1.0),
      "repeated_noise_row_elsewhere": ("reuse", _away_from(pattern, n, 2), 1.0),
      "noise_row_scaled": ("scale", _away_from(pattern, n, 1), 1.0 / (factor or 2.0)),
      "noise_row_dropped": ("drop", _away_from(pattern, n, 1), 0.0)}[fault]
  noise = FaultyRowNoise(packed.noise.encoder(), packed.noise.participation, kind, row, scale)
  faulty = _factory_with(noise, packed, packed.info["noise_multiplier"])
  return claimed, dataclasses.replace(packed, aggregation_factory=faulty), schema
