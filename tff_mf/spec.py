"""The one input of the numpy mechanism layer: a frozen, typed ``MechanismSpec`` (no TF import).

A spec names a registry mechanism, the training workload A (n rounds, momentum β and the
learning-rate schedule: Denisov et al. 2022, arXiv:2202.08312, Eq. 9), the participation
schema, the privacy (z or a target ε, δ, the Gaussian accountant, the sampling
probability), the clipping (a fixed clip norm, or the adaptive quantile estimate of Andrew
et al. 2021, arXiv:1905.03871) and the family parameters. Each part checks itself when it
is built, and the spec checks how they fit together (the family parameters against the
family's ``tff_mf.factorization.families.Declaration``), once: every error is one line naming the
argument. ``MechanismSpec.from_args`` is the one keyword constructor; the spec is the only way
into the mechanism layer (``tff_mf.mechanisms.build``, ``tff_mf.plan.build``,
``tff_mf.tf.aggregators.build_mechanism``, the Flower wrappers).
"""

from __future__ import annotations

import dataclasses
import types
from typing import Any, Dict, Mapping, Optional, Tuple, Union

from tff_mf import accounting
from tff_mf.accounting import adaptive_clipping
from tff_mf.accounting import analyses
from tff_mf import checks
from tff_mf import flagspec
from tff_mf.factorization import families
from tff_mf.noise import discrete_gaussian
from tff_mf import participation as participation_lib
from tff_mf import registry
from tff_mf.factorization import workloads

LR_SCHEDULES = workloads.LR_SCHEDULES

# How a linear-noise mechanism produces C⁻¹·Z: "stateful" runs the family's recurrence and
# carries its k model-sized state rows between rounds; "stateless" regenerates the rows of Z
# that round i's noise needs from the secret seed and keeps no state (cost ∝ the non-zeros
# of C⁻¹'s row i: b for BISR, BandInvMF and λCGD, whose C⁻¹ is banded; Kalinin et al. 2025,
# arXiv:2505.12128). "auto": the registry's kind (stateful for linear, stateless for dense_rows).
NOISE_STREAMS = ("auto", "stateful", "stateless")


def _adaptive_only_error() -> checks.CheckError:
  """The refusal of the adaptive estimator's parameters without clip_norm 'adaptive'."""
  return checks.CheckError("target_quantile, initial_clip_norm, clip_learning_rate and "
                           "clipped_count_stddev go with clip_norm='adaptive' only",
                           arguments=("target_quantile", "initial_clip_norm",
                                      "clip_learning_rate", "clipped_count_stddev", "clip_norm"))


def check_one_of_noise(noise_multiplier: Optional[float],
                       target_epsilon: Optional[float]) -> None:
  """A private mechanism's noise is given as exactly one of z and a target ε (the rule of
  ``Privacy``, and of ``tff-mf account``, which accounts z = ∞ too)."""
  if (noise_multiplier is None) == (target_epsilon is None):
    given = ("neither was given" if noise_multiplier is None else
             f"both were given: {noise_multiplier:g} and {target_epsilon:g}")
    raise checks.CheckError(f"give exactly one of noise_multiplier and target_epsilon ({given})",
                            arguments=("noise_multiplier", "target_epsilon"))


def _set(obj, **values) -> None:
  """Stores checked values on a frozen dataclass while it is being built."""
  for name, value in values.items():
    object.__setattr__(obj, name, value)


@dataclasses.dataclass(frozen=True)
class Privacy:
  """How much noise a private mechanism adds, and how its ε is computed.

  Attributes:
    noise_multiplier: z, or None to calibrate it to ``target_epsilon`` (exactly one given).
    target_epsilon: the ε the smallest z is calibrated to (needs ``delta``).
    delta: δ of the reported (ε, δ); None: no ε is computed.
    accountant: the unamplified Gaussian's accountant (``tff_mf.accounting.analyses.ACCOUNTANTS``).
    sampling_prob: p < 1 of cyclic Poisson sampling under min_sep (amplified bounds).
    allow_no_noise: z = 0 is accepted (ε = ∞).
    amplification: a ``tff_mf.accounting.analyses.Analysis`` in place of the automatic choice of the
      amplified analysis (e.g. ``MonteCarloBound``), or None.
    noise_distribution: "gaussian" (continuous noise on C⁻¹·Z), or "discrete_gaussian"
      (integer noise on the integer release round(γ·C·x), ``tff_mf.noise.discrete_gaussian``:
      accounted by zCDP, never amplified by sampling).
    granularity: γ of the discrete Gaussian (None: the default for the model size).
  """
  noise_multiplier: Optional[float] = None
  target_epsilon: Optional[float] = None
  delta: Optional[float] = None
  accountant: str = accounting.DEFAULT_ACCOUNTANT
  sampling_prob: Optional[float] = None
  allow_no_noise: bool = False
  amplification: Optional[Any] = None
  noise_distribution: str = "gaussian"
  granularity: Optional[float] = None

  def __post_init__(self):
    analyses.accountant(self.accountant)
    self._check_distribution()
    if self.sampling_prob is not None:
      _set(self, sampling_prob=checks.probability(self.sampling_prob, "sampling_prob"))
    check_one_of_noise(self.noise_multiplier, self.target_epsilon)
    if self.target_epsilon is not None:
      _set(self, target_epsilon=checks.positive_float(self.target_epsilon, "target_epsilon"))
      if self.delta is None:
        raise checks.CheckError("target_epsilon needs delta", arguments=("delta",))
    else:
      _set(self, noise_multiplier=checks.noise_multiplier(
          self.noise_multiplier, allow_zero=self.allow_no_noise,
          no_noise_hint=checks.PYTHON_NO_NOISE_HINT))
    if self.delta is not None:
      _set(self, delta=checks.delta(self.delta))
    _set(self, allow_no_noise=bool(self.allow_no_noise))

  @property
  def discrete(self) -> bool:
    return self.noise_distribution == "discrete_gaussian"

  def _check_distribution(self) -> None:
    if self.noise_distribution not in discrete_gaussian.DISTRIBUTIONS:
      raise checks.CheckError(f"noise_distribution must be one of "
                              f"{', '.join(discrete_gaussian.DISTRIBUTIONS)}, got "
                              f"{self.noise_distribution!r}", arguments=("noise_distribution",))
    if not self.discrete:
      if self.granularity is not None:
        raise checks.CheckError("granularity goes with noise_distribution 'discrete_gaussian' "
                                "only", arguments=("granularity", "noise_distribution"))
      return
    if self.granularity is not None:
      try:
        _set(self, granularity=checks.positive_float(self.granularity, "granularity"))
      except checks.CheckError as e:
        raise checks.CheckError(str(e), arguments=("granularity",)) from None
    if self.noise_multiplier == 0.0:
      raise checks.CheckError("the discrete Gaussian with noise_multiplier 0 adds no noise: use "
                              "noise_distribution 'gaussian' to run without privacy",
                              arguments=("noise_multiplier", "noise_distribution"))
    if self.sampling_prob is not None or self.amplification is not None:
      raise checks.CheckError("the discrete Gaussian is accounted without amplification by "
                              "sampling: leave out sampling_prob and amplification",
                              arguments=("sampling_prob", "noise_distribution"))

  def check_schema(self, schema: participation_lib.Participation) -> None:
    """``sampling_prob`` goes with cyclic Poisson sampling only (or a chosen analysis)."""
    if self.sampling_prob is not None and not schema.poisson and self.amplification is None:
      raise checks.CheckError(f"sampling_prob applies to min_sep (cyclic Poisson) "
                              f"participation, not {schema.kind}")


@dataclasses.dataclass(frozen=True)
class Clipping:
  """Each client update's clip norm: fixed, or adaptive.

  Attributes:
    clip_norm: ζ of every round (fixed), or ζ_0 (adaptive: ``adaptive.initial_clip_norm``).
    adaptive: the checked quantile estimator (``tff_mf.accounting.adaptive_clipping``), None for a
      fixed clip norm.
  """
  clip_norm: float
  adaptive: Optional[adaptive_clipping.AdaptiveClipping] = None

  def __post_init__(self):
    _set(self, clip_norm=checks.positive_float(self.clip_norm, "clip_norm"))
    if self.adaptive is not None and self.adaptive.initial_clip_norm != self.clip_norm:
      raise checks.CheckError(f"clip_norm {self.clip_norm} is not the adaptive estimator's "
                              f"initial_clip_norm {self.adaptive.initial_clip_norm}")

  @classmethod
  def from_args(cls, clip_norm: Union[float, str],
                adaptive: adaptive_clipping.AdaptiveClipping,
                clients_per_round: float) -> "Clipping":
    """From ``clip_norm`` (a number, or "adaptive" with the estimator ``adaptive``)."""
    if isinstance(clip_norm, str):
      if clip_norm != "adaptive":
        raise checks.CheckError(f"clip_norm must be a positive number or 'adaptive', got "
                                f"{clip_norm!r}", arguments=("clip_norm",))
      checked = adaptive.checked(clients_per_round)
      return cls(checked.initial_clip_norm, checked)
    if adaptive != adaptive_clipping.AdaptiveClipping():
      raise _adaptive_only_error()
    return cls(clip_norm)

  @property
  def described(self) -> Union[float, str]:
    """The clip norm as the privacy statement names it (a number or "adaptive")."""
    return "adaptive" if self.adaptive is not None else self.clip_norm


def training_workload(n: int, momentum: float = 0.0, lr_schedule: str = "constant",
                      schedule_rounds: Optional[int] = None) -> workloads.WorkloadSpec:
  """The workload A a run trains with: S, or momentum with a learning-rate schedule
  (checked; errors name ``total_rounds``, ``momentum``, ``lr_schedule``, ``schedule_rounds``)."""
  n = checks.positive_int(n, "total_rounds")
  if lr_schedule not in LR_SCHEDULES:
    raise checks.CheckError(f"unknown lr_schedule {lr_schedule!r}; expected one of "
                            f"{LR_SCHEDULES}")
  if (lr_schedule == "constant") != (schedule_rounds is None):
    raise checks.CheckError(f"schedule_rounds goes with lr_schedule 'decay' or 'cooldown', and "
                            f"only with them (got lr_schedule {lr_schedule!r}, schedule_rounds "
                            f"{schedule_rounds})", arguments=("schedule_rounds", "lr_schedule"))
  momentum = checks.in_range(momentum, "momentum", 0.0, 1.0)
  if schedule_rounds is not None:
    schedule_rounds = checks.positive_int(schedule_rounds, "schedule_rounds")
    if schedule_rounds > n:
      raise checks.CheckError(f"schedule_rounds must be in [1, total_rounds={n}], got "
                              f"{schedule_rounds}", arguments=("schedule_rounds",))
  if momentum == 0.0 and lr_schedule == "constant":
    return workloads.WorkloadSpec(kind="prefix_sum", n=n)
  return workloads.WorkloadSpec(kind="momentum", n=n, momentum=momentum,
                                lr_schedule=lr_schedule, schedule_rounds=schedule_rounds)


@dataclasses.dataclass(frozen=True)
class MechanismSpec:
  """Everything the numpy layer needs to resolve a mechanism and account for it.

  Attributes:
    mechanism: the registry entry (``tff_mf.registry.Mechanism``), trainable.
    workload: the training workload A (``training_workload``); ``n`` is its rounds.
    participation: the schema clients are sampled under (a ``tff_mf.participation`` kind).
    privacy: ``Privacy``; None for a mechanism that adds no noise (``none``).
    clipping: ``Clipping``; None, with ``clients_per_round``, for an accounting spec: the
      mechanism, its factorization and its ε, which do not depend on the clip norm or K
      (``tff-mf account``), and which no run takes (``require_run``).
    clients_per_round: K, the clients a round's sum is divided by (and σ_b's default).
    params: the family parameters given (bands, rank, buffers, or a family's own), checked
      against the family's ``Declaration``; the others take its defaults.
    noise_stream: how a linear-noise mechanism realizes C⁻¹·Z (``NOISE_STREAMS``), "auto"
      resolved to the mechanism's own.
  """
  mechanism: registry.Mechanism
  workload: workloads.WorkloadSpec
  participation: participation_lib.Participation
  privacy: Optional[Privacy] = None
  clipping: Optional[Clipping] = None
  clients_per_round: Optional[float] = None
  params: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  noise_stream: str = "auto"

  def __post_init__(self):
    m = self.mechanism
    if not m.trainable:
      raise checks.CheckError(f"mechanism {m.name!r} cannot be trained: {m.why_not_trainable}")
    schema = self.participation
    if schema.kind not in m.participations:
      raise checks.CheckError(f"mechanism {m.name!r} supports participation "
                              f"{', '.join(m.participations)}, not {schema.kind!r}")
    schema.check(self.n)
    self._check_privacy()
    _check_run_pair(self.clipping, self.clients_per_round)
    _set(self, params=types.MappingProxyType(self.declaration.check_parameters(
        self.params, self.n, schema, f"mechanism {m.name!r}")),
         noise_stream=resolve_noise_stream(m, self.noise_stream))
    if self.clients_per_round is not None:
      _set(self, clients_per_round=checks.positive_float(self.clients_per_round,
                                                         "clients_per_round"))
    self._check_clipping()

  def _check_privacy(self) -> None:
    m = self.mechanism
    if m.private and self.privacy is None:
      check_one_of_noise(None, None)
    if not m.private and self.privacy is not None:
      raise _no_noise_error(m, self.privacy.noise_multiplier, self.privacy.target_epsilon)
    if self.privacy is not None:
      self.privacy.check_schema(self.participation)
      if self.privacy.discrete:
        self._check_discrete()

  def _check_discrete(self) -> None:
    """The discrete Gaussian needs a C whose encoder (C·x)_t streams with small state."""
    m = self.mechanism
    if m.name not in discrete_gaussian.MECHANISMS:
      raise checks.CheckError(
          f"mechanism {m.name!r} with the discrete Gaussian: its C-domain encoder (C·x)_t would "
          f"keep every past sum; use one of {', '.join(discrete_gaussian.MECHANISMS)}",
          arguments=("mechanism", "noise_distribution"))
    if self.noise_stream not in ("auto", "stateful"):
      raise checks.CheckError("the discrete Gaussian streams the encoder itself: noise_stream "
                              f"{self.noise_stream!r} does not apply",
                              arguments=("noise_stream",))

  def _check_clipping(self) -> None:
    m = self.mechanism
    if self.adaptive is None:
      return
    if not m.private:
      raise checks.CheckError(f"mechanism {m.name!r} adds no noise and clips nothing; "
                              "adaptive clipping (clip_norm 'adaptive') does not apply",
                              arguments=("clip_norm",))
    if self.privacy is not None and self.privacy.discrete:
      raise checks.CheckError("adaptive clipping with the discrete Gaussian is not supported "
                              "(its count queries are continuous Gaussians): give a clip_norm",
                              arguments=("clip_norm", "noise_distribution"))
    if m.noise_kind.tff_tree:
      raise checks.CheckError(
          f"adaptive clipping (clip_norm 'adaptive') with TFF's tree (mechanism {m.name!r}): use "
          "mechanism 'honaker_online' (the same tree and estimator as a matrix mechanism, "
          "which takes clip_norm='adaptive')", arguments=("clip_norm",))

  @property
  def n(self) -> int:
    return int(self.workload.n)

  @property
  def declaration(self) -> families.Declaration:
    """The family's declaration of the mechanism's strategy (empty without one)."""
    strategy = self.mechanism.strategy
    return (registry.strategy(strategy).declaration if strategy in registry.STRATEGIES
            else families.Declaration())

  @property
  def adaptive(self) -> Optional[adaptive_clipping.AdaptiveClipping]:
    return None if self.clipping is None else self.clipping.adaptive

  @property
  def runnable(self) -> bool:
    """Whether the spec clips and names K (a run's spec), not an accounting spec."""
    return self.clipping is not None

  def require_run(self) -> None:
    """Refuses an accounting spec where a run is built, in one line with the remedy."""
    if not self.runnable:
      raise checks.CheckError(
          f"the spec of mechanism {self.mechanism.name!r} has no clip_norm and no "
          "clients_per_round (an accounting spec): give both to build a run",
          arguments=("clip_norm", "clients_per_round"))

  @classmethod
  def from_args(cls, mechanism: Union[str, registry.Mechanism], *, total_rounds: int,
                clients_per_round: Optional[float] = None,
                clip_norm: Union[float, str, None] = None,
                noise_multiplier: Optional[float] = None,
                target_epsilon: Optional[float] = None, delta: Optional[float] = None,
                accountant: str = accounting.DEFAULT_ACCOUNTANT,
                sampling_prob: Optional[float] = None,
                allow_no_noise: bool = False, momentum: float = 0.0,
                lr_schedule: str = "constant", schedule_rounds: Optional[int] = None,
                participation: Optional[participation_lib.Participation] = None,
                params: Optional[Mapping[str, Any]] = None, noise_stream: str = "auto",
                adaptive: Optional[adaptive_clipping.AdaptiveClipping] = None,
                noise_distribution: str = "gaussian", granularity: Optional[float] = None,
                target_quantile: Optional[float] = None,
                initial_clip_norm: Optional[float] = None,
                clip_learning_rate: Optional[float] = None,
                clipped_count_stddev: Optional[float] = None,
                **family_params) -> "MechanismSpec":
    """The one keyword constructor of a spec (a mechanism by any spelling). With
    ``clip_norm="adaptive"``, the quantile estimator is ``adaptive`` or its four keywords
    (``target_quantile``, ``initial_clip_norm``, ``clip_learning_rate``,
    ``clipped_count_stddev``; TFF's ``gaussian_adaptive`` defaults). ``family_params``:
    bands=, rank=, buffers= or a family's own (None meaning not given); any other keyword is
    refused in one line naming the closest accepted one. Without ``clip_norm`` and
    ``clients_per_round``: an accounting spec (the mechanism and its ε; no run takes it)."""
    _check_keywords(family_params)
    estimator = {k: v for k, v in dict(
        target_quantile=target_quantile, initial_clip_norm=initial_clip_norm,
        learning_rate=clip_learning_rate, clipped_count_stddev=clipped_count_stddev).items()
                 if v is not None}
    if estimator and adaptive is not None:
      raise checks.CheckError("give adaptive= or the estimator's keywords, not both",
                              arguments=("adaptive",))
    if estimator:
      adaptive = adaptive_clipping.AdaptiveClipping(**estimator)
    m = mechanism if isinstance(mechanism, registry.Mechanism) else registry.mechanism(mechanism)
    workload = training_workload(total_rounds, momentum, lr_schedule, schedule_rounds)
    privacy = None
    if not m.private and (noise_multiplier not in (None, 0.0) or target_epsilon is not None):
      raise _no_noise_error(m, noise_multiplier, target_epsilon)
    if m.private:
      privacy = Privacy(noise_multiplier, target_epsilon, delta, accountant, sampling_prob,
                        allow_no_noise, noise_distribution=noise_distribution,
                        granularity=granularity)
    else:
      if noise_distribution != "gaussian" or granularity is not None:
        raise checks.CheckError(f"mechanism {m.name!r} adds no noise; noise_distribution and "
                                "granularity do not apply",
                                arguments=("noise_distribution", "granularity"))
      analyses.accountant(accountant)
      if delta is not None:  # no ε is computed without noise; a δ given is still a δ
        checks.delta(delta)
    if clip_norm is None and (estimator or adaptive is not None):
      raise _adaptive_only_error()
    _check_run_pair(clip_norm, clients_per_round)
    clipping = None if clip_norm is None else Clipping.from_args(
        clip_norm, adaptive or adaptive_clipping.AdaptiveClipping(), clients_per_round)
    return cls(mechanism=m, workload=workload, participation=participation or
               participation_lib.SINGLE, privacy=privacy, clipping=clipping,
               clients_per_round=clients_per_round, params=dict(params or {}, **family_params),
               noise_stream=noise_stream)

  def statement_setup(self, noise_seed_pinned: bool = False) -> Dict[str, Any]:
    """What the privacy statement names beside ε (``tff_mf.accounting.statement.setup_words``)."""
    self.require_run()
    out: Dict[str, Any] = {
        "mechanism": self.mechanism.name, "label": self.mechanism.label, "rounds": self.n,
        "clients_per_round": self.clients_per_round, "clip_norm": self.clipping.described,
        "participation": self.participation.as_dict(), "noise_seed_pinned": noise_seed_pinned}
    if self.adaptive is not None:
      out["adaptive_clipping"] = self.adaptive.as_dict()
    if self.privacy is not None and self.privacy.discrete:
      out["noise_distribution"] = self.privacy.noise_distribution
    return out

  def describe(self, noise_seed_pinned: bool = False) -> Dict[str, Any]:
    """The JSON-ready description of the mechanism asked for (no seed)."""
    self.require_run()
    w = self.workload
    info: Dict[str, Any] = {
        "mechanism": self.mechanism.name, "label": self.mechanism.label, "total_rounds": self.n,
        "clients_per_round": self.clients_per_round, "clip_norm": self.clipping.clip_norm,
        "momentum": w.momentum, "lr_schedule": w.lr_schedule,
        "schedule_rounds": w.schedule_rounds, "participation": self.participation.as_dict(),
        "noise_kind": self.mechanism.noise, "noise_stream": self.noise_stream,
        "noise_seed_pinned": noise_seed_pinned,
        "clipping": "fixed" if self.adaptive is None else "adaptive"}
    if self.privacy is not None and self.privacy.discrete:
      info["noise_distribution"] = self.privacy.noise_distribution
      info["granularity"] = self.privacy.granularity or "automatic (per model size)"
    if self.adaptive is not None:
      info["adaptive_clipping"] = self.adaptive.as_dict()
    return info


def _check_run_pair(clipping, clients_per_round) -> None:
  """A run's spec has both a clipping and K; an accounting spec neither."""
  if (clipping is None) != (clients_per_round is None):
    raise checks.CheckError(
        "clip_norm and clients_per_round go together: both for a run's spec, neither for an "
        "accounting spec", arguments=("clip_norm", "clients_per_round"))


def _no_noise_error(m: registry.Mechanism, noise_multiplier, target_epsilon) -> checks.CheckError:
  """The refusal of a noise multiplier or target ε for a mechanism that adds no noise."""
  return checks.CheckError(
      f"mechanism {m.name!r} adds no noise (it trains without privacy); it takes neither "
      f"noise_multiplier (got {noise_multiplier}) nor target_epsilon (got {target_epsilon})",
      arguments=("noise_multiplier", "target_epsilon"))


def keyword_names() -> Tuple[str, ...]:
  """Every keyword ``MechanismSpec.from_args`` accepts: its own and every family's parameters."""
  import inspect  # pylint: disable=g-import-not-at-top
  own = [p for p in inspect.signature(MechanismSpec.from_args).parameters
         if p not in ("cls", "mechanism", "family_params")]
  family = set(families.SPEC_PARAMETERS)
  for strategy in registry.STRATEGIES.values():
    family.update(getattr(strategy.declaration, "own_parameters", {}) or {})
  return tuple(own) + tuple(sorted(family))


# The flags of ``Privacy``'s own parameters, declared once for every tool that builds or
# accounts a spec (each tool adds what the flag means there as a note).
PRIVACY_FLAGS = (
    flagspec.Flag("noise_multiplier", float, "Z",
                  "noise multiplier z: the noise std of a round's sum in units of the clip norm "
                  "(give it or --target_epsilon)"),
    flagspec.Flag("target_epsilon", float, "EPS",
                  "calibrate z: the smallest z whose epsilon at --delta is at most EPS (give it "
                  "or --noise_multiplier)"),
    flagspec.Flag("delta", float, "DELTA", "delta in (0, 1) of the (epsilon, delta) guarantee"),
    flagspec.Flag("accountant", str, "NAME",
                  "accountant of the unamplified Gaussian mechanism: exact (analytic Gaussian, "
                  "Balle & Wang 2018, arXiv:1805.06530, Thm 8; the tightest), pld (dp_accounting "
                  "privacy-loss distributions), rdp (Renyi DP, the loosest)",
                  choices=tuple(analyses.ACCOUNTANTS)),
    flagspec.Flag("sampling_prob", float, "P",
                  "probability p in (0, 1] that a client joins each round it may be sampled in "
                  "(every round for b = 1, the rounds of its residue class under b-min-sep); "
                  "p < 1 without a binding --max_participations amplifies epsilon by sampling "
                  "(MMCC, or amplified banded MF)"),
    flagspec.Flag("noise_distribution", str, "DIST",
                  "gaussian: continuous noise C^-1 Z; discrete_gaussian: integer noise on the "
                  "integer release round(gamma C x), accounted by zCDP (Canonne, Kamath, "
                  "Steinke 2020, arXiv:2004.00010, Thm 14) without amplification, for "
                  f"--mechanism {', '.join(discrete_gaussian.MECHANISMS)}",
                  choices=discrete_gaussian.DISTRIBUTIONS),
    flagspec.Flag("granularity", float, "GAMMA",
                  "gamma of --noise_distribution discrete_gaussian: integer units per unit of "
                  "the summed update (default: the smallest power of two that keeps the "
                  "rounding below 0.1% of the sensitivity for the model's size)"),
)


def privacy_flag(name: str) -> flagspec.Flag:
  """The ``flagspec.Flag`` of ``Privacy``'s parameter ``name`` (``PRIVACY_FLAGS``)."""
  [flag] = [f for f in PRIVACY_FLAGS if f.name == name]
  return flag


# The flags of the training workload A (``training_workload``), declared once for every tool
# that builds, factorizes or plans one. The offline tools (factorize, plan, plot) spell the
# momentum β ``--momentum``; a run's tools (the binary, audit) ``--server_momentum``: the same
# β, which the server optimizer applies and the momentum workload M(β) factorizes.
WORKLOAD_FLAGS = (
    flagspec.Flag("total_rounds", int, "N",
                  "number of rounds n, the size of the matrices A, B and C"),
    flagspec.Flag("server_momentum", float, "BETA",
                  "momentum beta in [0, 1) of the server optimizer, and of the momentum "
                  "workload M(beta) a momentum mechanism factorizes (Denisov et al. 2022, "
                  "arXiv:2202.08312, Prop 4.2)"),
    flagspec.Flag("lr_schedule", str, "NAME",
                  "learning-rate schedule of the last --schedule_rounds rounds (the server "
                  "optimizer's, and the momentum workload's eta)", choices=LR_SCHEDULES),
    flagspec.Flag("schedule_rounds", int, "K",
                  "rounds k of the decay or cooldown at the end (with --lr_schedule decay or "
                  "cooldown only)"),
)
# The offline tools' spelling of --server_momentum.
MOMENTUM_SPELLING = "momentum"


def workload_flag(name: str) -> flagspec.Flag:
  """The ``flagspec.Flag`` of the workload's parameter ``name`` (``WORKLOAD_FLAGS``)."""
  [flag] = [f for f in WORKLOAD_FLAGS if f.name == name]
  return flag


def family_flags() -> Tuple[flagspec.Flag, ...]:
  """The flags of the family parameters for every tool: the shared ones (bands, rank, buffers;
  ``families.PARAMETER_FLAGS``), then each registered strategy's own
  (``Declaration.own_parameter_flags``), naming the strategies that take it."""
  shared = tuple(flagspec.Flag(name, int, metavar, text)
                 for name, (metavar, text) in families.PARAMETER_FLAGS.items())
  own = flagspec.merged(
      flagspec.Flag(name, kind, metavar, text, owners=(strategy.name,))
      for strategy in registry.STRATEGIES.values()
      for name, (kind, metavar, text) in getattr(strategy.declaration, "own_parameter_flags",
                                                 {}).items())
  return shared + own


def family_values(values: Mapping[str, Any]) -> Dict[str, Any]:
  """{parameter: value} of the family flags given (None: not given) in ``values`` (parsed
  flags as a mapping), for ``MechanismSpec.from_args``'s family keywords."""
  return {f.name: values.get(f.name) for f in family_flags() if values.get(f.name) is not None}


def _check_keywords(family_params: Mapping[str, Any]) -> None:
  """Refuses a keyword that is neither ``from_args``'s nor any family's parameter."""
  names = keyword_names()
  for name in family_params:
    if name not in names:
      close = checks.closest(name, names)
      raise checks.CheckError(f"unknown argument {name!r}" + (f"; did you mean {close!r}?"
                                                              if close else ""))


def resolve_noise_stream(mechanism: registry.Mechanism, value: str) -> str:
  """The noise stream asked for (``NOISE_STREAMS``), checked against the mechanism's noise
  kind; "auto" is the kind's own (stateful for linear, stateless for dense_rows)."""
  if value not in NOISE_STREAMS:
    raise checks.CheckError(f"noise_stream must be one of {', '.join(NOISE_STREAMS)}, got "
                            f"{value!r}")
  allowed = mechanism.noise_kind.stream_choices
  own = allowed[0] if allowed else "auto"
  if value in ("auto", own):
    return own
  if value not in allowed:
    raise checks.CheckError(f"noise_stream={value!r} does not apply to mechanism "
                            f"{mechanism.name!r} (its noise is {mechanism.noise}"
                            f"{': stateless only' if allowed else ''})")
  return value


# The flags of the clipping (``Clipping``): a fixed clip norm, or "adaptive" with the quantile
# estimator's parameters (``tff_mf.accounting.adaptive_clipping``; Andrew et al. 2021,
# arXiv:1905.03871), declared once for every tool that builds a spec from flags. A tool that
# clips at a fixed norm only reads ``--clip_norm`` as a number (``clitools.add_flag``'s kind).
CLIPPING_FLAGS = (
    flagspec.Flag("clip_norm", str, "ZETA",
                  "per-client L2 clip norm zeta; the training binary also takes 'adaptive': "
                  "zeta follows a private estimate of --target_quantile of the update norms "
                  "(Andrew et al. 2021, arXiv:1905.03871; docs/mechanisms.md)"),
    flagspec.Flag("target_quantile", float, "Q",
                  "--clip_norm=adaptive: fraction of client updates left unclipped"),
    flagspec.Flag("initial_clip_norm", float, "ZETA0",
                  "--clip_norm=adaptive: the clip norm of round 1"),
    flagspec.Flag("clip_learning_rate", float, "ETA",
                  "--clip_norm=adaptive: learning rate of the geometric clip update"),
    flagspec.Flag("clipped_count_stddev", float, "SIGMA_B",
                  "--clip_norm=adaptive: noise std of the count of unclipped updates (default: "
                  f"{adaptive_clipping.DEFAULT_COUNT_STDDEV_PER_CLIENT:g} x "
                  "--clients_per_round, TFF's gaussian_adaptive default)"),
)


def clipping_flag(name: str) -> flagspec.Flag:
  """The ``flagspec.Flag`` of the clipping's parameter ``name`` (``CLIPPING_FLAGS``)."""
  [flag] = [f for f in CLIPPING_FLAGS if f.name == name]
  return flag


# K, the clients a round's sum is divided by (``MechanismSpec.clients_per_round``). A tool
# that reads any positive number (``tff-mf audit``) says so through ``clitools.add_flag``'s kind.
CLIENTS_PER_ROUND_FLAG = flagspec.Flag(
    "clients_per_round", int, "K",
    "clients per round K, whose number the noised sum of a round is divided by; under a "
    "sampled schema (min_sep, balls_in_bins or random_allocation) the number varies from "
    "round to round and K is its expectation")

# The mechanism built, accounted, audited or trained (``tff_mf.registry``); each tool names the
# mechanisms it takes in its note (or its choices).
MECHANISM_FLAG = flagspec.Flag(
    "mechanism", str, "NAME", "the DP mechanism, by its tff_mf.registry name or alias")

# The spec's keyword of a flag whose name differs (both spellings of the momentum beta).
_KEYWORD_OF_FLAG = {"server_momentum": "momentum", MOMENTUM_SPELLING: "momentum"}


def spec_flag_names() -> Tuple[str, ...]:
  """The names of the flags a spec is read from (``from_flags``): the mechanism, the privacy,
  the workload (both spellings of beta), the clipping and K; the family parameters besides
  (``family_flags``)."""
  tables = (MECHANISM_FLAG,) + PRIVACY_FLAGS + WORKLOAD_FLAGS + CLIPPING_FLAGS + (
      CLIENTS_PER_ROUND_FLAG,)
  return tuple(f.name for f in tables) + (MOMENTUM_SPELLING,)


def from_flags(values: Mapping[str, Any],
               participation: Optional[participation_lib.Participation] = None,
               **given) -> MechanismSpec:
  """The spec of parsed flags: the one reader from a tool's flags to ``MechanismSpec.from_args``.

  ``values`` maps flag names (``spec_flag_names``, ``family_flags``) to their values, None
  meaning not given: argparse's ``vars(args)`` or a training config's fields. ``given``
  overrides a flag's value where the tool reads it its own way (e.g. ``total_rounds`` from
  another dest, a ``sampling_prob`` that is not the spec's: None); ``participation`` is the
  schema the tool built from its schema flags (default: single participation).
  """
  merged = {**values, **given}
  keywords = {_KEYWORD_OF_FLAG.get(name, name): merged[name] for name in spec_flag_names()
              if merged.get(name) is not None}
  mechanism = keywords.pop("mechanism", None)
  if mechanism is None:
    raise checks.CheckError("give the mechanism (a registry name or alias)",
                            arguments=("mechanism",))
  if keywords.get("total_rounds") is None:
    raise checks.CheckError("give total_rounds (the number of rounds n)",
                            arguments=("total_rounds",))
  return MechanismSpec.from_args(mechanism, participation=participation, **keywords,
                                 **family_values(merged))
