"""One training run's settings as data: ``TrainingConfig``, its checks, the mechanism names.

Every flag of ``training/run_stackoverflow.py`` is a field here (the flag help is
written in that file). Mechanism names come from ``tff_mf.registry``: any trainable
mechanism's canonical name or alias is accepted and the run records the canonical
name, so ``--mechanism=dp_ftrl`` and ``--mechanism=honaker_online`` are the same
run. Nothing here imports TensorFlow.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import re
from typing import Any, Dict, Optional, Tuple, Union

from tff_mf import accounting
from tff_mf.accounting import adaptive_clipping
from tff_mf import checks
from tff_mf import clitools
from tff_mf import participation
from tff_mf import registry

import stackoverflow

DATASETS = stackoverflow.DATASETS
# The docstring datasets; --pydocs_stdlib says whether they include the standard library's
# docstrings, which change with Python's patch version (without them the dataset is a function
# of the lock file alone).
PYDOCS_DATASETS = tuple(stackoverflow.PYDOCS_CLIENT_UNITS)
# What runs the rounds (training.engine): TFF's learning process, or the compiled engine that
# runs the same round on one model in this process. "auto" (the default) is the compiled
# engine on one machine and TFF's process with --workers (TFF's distributed runtime); a run
# records the engine it used.
ENGINES = ("auto", "tff", "compiled")
DEFAULT_ENGINE = "auto"
LR_SCHEDULES = ("constant", "decay", "cooldown")
# tff_mf.accounting's accountants of the unamplified Gaussian, and its default (every tool's).
ACCOUNTANTS = accounting.ACCOUNTANTS
# Every --participation spelling (cyclic_poisson is min_sep: the run records min_sep).
PARTICIPATIONS = participation.SPELLINGS
# Per user and private, never a shared world-writable place such as /tmp: run
# directories hold checkpoints with the secret noise seed (see training/rundir.py).
DEFAULT_ROOT_OUTPUT_DIR = "~/tff_mf_runs"
# Flags that may differ between the run that wrote a checkpoint and the one resuming it.
RESUME_FREE_FIELDS = ("noise_seed", "workers", "rounds_per_checkpoint", "rounds_per_eval",
                      "progress", "root_output_dir", "cache_dir", "report_train_metrics",
                      "engine")
POSITIVE_INT_FIELDS = ("total_rounds", "clients_per_round", "rounds_per_eval",
                       "rounds_per_checkpoint", "max_validation_elements", "vocab_size",
                       "num_oov_buckets", "embedding_size", "lstm_size", "projection_size",
                       "sequence_length", "max_elements_per_client", "client_batch_size")


class TrainingError(checks.CheckError):
  """A configuration, data or run-directory problem that stops training (one-line message)."""


def trainable_mechanisms() -> Tuple[str, ...]:
  """Every accepted ``--mechanism`` spelling: names and aliases of trainable mechanisms."""
  return tuple(s for s in registry.all_spellings() if registry.mechanism(s).trainable)


def canonical_mechanism(name: str) -> str:
  """The registry's canonical name of a trainable mechanism spelling; TrainingError otherwise."""
  if name not in trainable_mechanisms():
    if name in registry.all_spellings():
      why = f" ({registry.mechanism(name).why_not_trainable})"
    else:
      why = clitools.did_you_mean(name, trainable_mechanisms())
    raise TrainingError(f"--mechanism={name!r} is not a trainable mechanism{why} (expected one "
                        f"of {', '.join(registry.mechanism_names(trainable=True))} or an alias)")
  return registry.mechanism(name).name


def used_engine(engine: str, workers=()) -> str:
  """The engine that runs the rounds: ``auto`` is ``tff`` with ``workers``, else ``compiled``.

  TrainingError (one line) for an unknown engine or ``compiled`` with ``workers``.
  """
  if engine not in ENGINES:
    raise TrainingError(f"--engine={engine!r}; expected one of {', '.join(ENGINES)}"
                        f"{clitools.did_you_mean(engine, ENGINES, prefix='--engine=')}")
  if engine == "compiled" and workers:
    raise TrainingError("--engine=compiled trains in this process; --workers needs TFF's "
                        "runtime (--engine=tff or auto)")
  if engine == "auto":
    return "tff" if workers else "compiled"
  return engine


ENGINE_HELP = ("what runs the rounds: auto (compiled on one machine, tff with --workers), tff "
               "(TFF's learning process: the reference, and TFF's distributed runtime for "
               "--workers) or compiled (the same FedAvg round, client update, DP query and "
               "server optimizer on one model in this process, many times faster; "
               "training/engine.py); the run records the engine it used")


def add_engine_flag(parser) -> None:
  """``--engine`` on an argparse tool that runs training (the binary's absl flag says the same)."""
  parser.add_argument("--engine", choices=ENGINES, default=DEFAULT_ENGINE, help=ENGINE_HELP)


def is_seedless(mechanism: str) -> bool:
  """True when the mechanism adds no noise (the non-private ones); every other one takes the
  secret seed."""
  return not registry.mechanism(mechanism).private


def is_private(mechanism: str) -> bool:
  return registry.mechanism(mechanism).private


# The one-run audit's flags besides --canaries, and their defaults (training.canaries).
CANARY_FLAGS = {"canary_alpha": 0.05, "canary_plan_mu": None, "canary_seed": None}
CANARY_PARTICIPATIONS = ("single", "fixed_epoch", "balls_in_bins")


@dataclasses.dataclass
class TrainingConfig:
  """Every flag of run_stackoverflow.py (defaults: the papers' model, a small schedule)."""
  mechanism: str = "opt_prefix_sum"
  dataset: str = "pydocs"
  data_dir: Optional[str] = None
  pydocs_stdlib: bool = True
  total_rounds: int = 100
  clients_per_round: int = 10
  client_lr: float = 0.5
  server_lr: float = 1.0
  server_momentum: float = 0.0
  lr_schedule: str = "constant"
  schedule_rounds: Optional[int] = None
  noise_multiplier: Optional[float] = None
  target_epsilon: Optional[float] = None
  delta: float = checks.DEFAULT_DELTA
  accountant: str = accounting.DEFAULT_ACCOUNTANT
  noise_distribution: str = "gaussian"
  granularity: Optional[float] = None
  clip_norm: Union[float, str] = 1.0  # or "adaptive"
  target_quantile: float = 0.5
  initial_clip_norm: float = 0.1
  clip_learning_rate: float = 0.2
  clipped_count_stddev: Optional[float] = None
  noise_seed: Optional[int] = None
  cache_dir: Optional[str] = None
  bands: Optional[int] = None
  rank: Optional[int] = None
  buffers: Optional[int] = None
  # ((name, value), ...): parameters a family declares itself (``tff_mf.spec.family_flags``).
  family_params: Tuple[Tuple[str, Any], ...] = ()
  participation: str = "single"
  epochs: Optional[int] = None
  min_sep: Optional[int] = None
  sampling_prob: Optional[float] = None
  max_participations: Optional[int] = None
  root_output_dir: str = DEFAULT_ROOT_OUTPUT_DIR
  experiment_name: str = "run"
  rounds_per_eval: int = 10
  rounds_per_checkpoint: int = 10
  vocab_size: int = 10000
  num_oov_buckets: int = 1
  embedding_size: int = 96
  lstm_size: int = 670
  projection_size: int = 96
  lstm_kernel: str = stackoverflow.DEFAULT_LSTM_KERNEL
  sequence_length: int = 20
  max_elements_per_client: int = 256
  client_batch_size: int = 16
  max_validation_elements: int = 10000
  max_test_elements: Optional[int] = None
  workers: Tuple[str, ...] = ()
  engine: str = DEFAULT_ENGINE
  seed: int = 0
  progress: bool = True
  report_train_metrics: bool = False
  canaries: int = 0
  canary_alpha: float = 0.05
  canary_plan_mu: Optional[float] = None
  canary_seed: Optional[int] = None

  def __post_init__(self):
    self.participation = participation.canonical_kind(self.participation)

  @property
  def adaptive_clipping(self) -> bool:
    """--clip_norm=adaptive: the clip norm follows a private quantile estimate."""
    return self.clip_norm == "adaptive"

  @functools.cached_property
  def spec(self):
    """The run's ``tff_mf.spec.MechanismSpec``, built once from its flags. The library checks
    every rule of the mechanism there (its privacy, clipping, workload, schema and family
    parameters); the config re-checks none of them and only spells an error's arguments as
    this binary's flags (a TrainingError). No code assigns a config's fields after reading
    it (a changed config is a new one, ``dataclasses.replace``)."""
    from tff_mf import spec as spec_lib  # pylint: disable=g-import-not-at-top
    flags = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
    try:  # the fields are the binary's flags, a family's own parameters in family_params
      return spec_lib.from_flags(
          dict(flags, **dict(self.family_params)), participation=self.schema(),
          mechanism=self.canonical_mechanism,
          sampling_prob=self.sampling_prob if self.participation_kind.poisson else None)
    except TrainingError:
      raise
    except checks.CheckError as e:
      raise TrainingError(flag_message(e, self.mechanism)) from None

  @property
  def canonical_mechanism(self) -> str:
    return canonical_mechanism(self.mechanism)

  @property
  def run_dir(self) -> str:
    """``<root_output_dir>/<experiment_name>``, with ``~`` expanded."""
    return os.path.join(os.path.expanduser(self.root_output_dir), self.experiment_name)

  def validate(self) -> None:
    """Raises TrainingError naming the first bad or conflicting value."""
    try:
      self._check_names()
      self._check_numbers()
      self._check_participation()
      self._check_harness_privacy()
      self._check_canaries()
      self.spec  # pylint: disable=pointless-statement  (the library checks the mechanism)
    except TrainingError:
      raise
    except checks.CheckError as e:
      raise TrainingError(str(e)) from None

  def _check_names(self) -> None:
    canonical_mechanism(self.mechanism)
    for name, value, allowed in (("dataset", self.dataset, DATASETS),
                                 ("lr_schedule", self.lr_schedule, LR_SCHEDULES),
                                 ("accountant", self.accountant, ACCOUNTANTS),
                                 ("participation", self.participation, PARTICIPATIONS),
                                 ("lstm_kernel", self.lstm_kernel, stackoverflow.LSTM_KERNELS)):
      if value not in allowed:
        raise TrainingError(f"--{name}={value!r}; expected one of {', '.join(allowed)}")
    used_engine(self.engine, self.workers)
    if not isinstance(self.pydocs_stdlib, bool):
      raise TrainingError(f"--pydocs_stdlib must be true or false, got {self.pydocs_stdlib!r}")
    if not self.pydocs_stdlib and self.dataset not in PYDOCS_DATASETS:
      raise TrainingError(f"--nopydocs_stdlib applies to the docstring datasets "
                          f"({', '.join(PYDOCS_DATASETS)}), not --dataset={self.dataset}")
    checks.path_component(self.experiment_name, "--experiment_name")
    if not self.root_output_dir:
      raise TrainingError("--root_output_dir must not be empty")

  def _check_numbers(self) -> None:
    for name in POSITIVE_INT_FIELDS:
      value = getattr(self, name)
      if isinstance(value, float):  # 3.0 is not an integer flag value
        raise TrainingError(f"--{name} must be a positive integer, got {value!r}")
      checks.positive_int(value, f"--{name}")
    if self.max_test_elements is not None:
      checks.positive_int(self.max_test_elements, "--max_test_elements")
    for name in ("client_lr", "server_lr"):
      checks.positive_float(getattr(self, name), f"--{name}")
    checks.nonnegative_int(self.seed, "--seed")

  def _check_participation(self) -> None:
    """The schema's flags go with their --participation, and only with it."""
    kind = self.participation_kind
    takes = kind.takes + (("sampling_prob",) if kind.poisson else ())
    for name in ("epochs", "min_sep", "sampling_prob", "max_participations"):
      value = getattr(self, name)
      if value is not None and name not in takes:
        raise TrainingError(f"--{name}={value} does not apply to --participation="
                            f"{self.participation}")
    if "epochs" in takes and self.epochs is None:
      raise TrainingError(f"--participation={self.participation} needs --epochs=k")
    if kind.poisson:  # the harness samples each client's rounds with probability p
      if self.noise_distribution == "discrete_gaussian":  # so p is always given
        raise TrainingError(f"--participation={self.participation} samples clients (cyclic "
                            "Poisson), and --noise_distribution=discrete_gaussian is accounted "
                            "without amplification by sampling: use --participation single, "
                            "fixed_epoch, balls_in_bins or random_allocation")
      if self.min_sep is None or self.sampling_prob is None:
        raise TrainingError("--participation=min_sep needs --min_sep=b and --sampling_prob=p "
                            f"(got {self.min_sep} and {self.sampling_prob})")
      checks.probability(self.sampling_prob, "--sampling_prob")  # the sampler's p

  @property
  def participation_kind(self) -> type:
    """The class of ``--participation``'s kind (``tff_mf.participation``), for its rules."""
    return participation.CLASSES[participation.canonical_kind(self.participation)]

  def schema(self):
    """The ``tff_mf.participation`` schema the run samples clients under (validated)."""
    try:
      return participation.from_args(self.participation, self.total_rounds, epochs=self.epochs,
                                     min_sep=self.min_sep,
                                     max_participations=self.max_participations)
    except checks.CheckError as e:  # the kind's parameters are this binary's flags
      text = str(e).removeprefix(f"{self.participation}: ")
      named = checks.CheckError(text, arguments=self.participation_kind.takes + ("n",))
      raise TrainingError(f"--participation={self.participation}: "
                          f"{flag_message(named, self.mechanism)}") from None

  def _check_harness_privacy(self) -> None:
    """What the binary adds to the library's rules: no flag turns noise off (the library's
    ``allow_no_noise``), and a pinned noise seed is a valid seed."""
    if is_private(self.canonical_mechanism) and self.noise_multiplier == 0.0:
      raise TrainingError("--noise_multiplier=0 adds no noise: --mechanism=none trains without "
                          "noise")
    if self.adaptive_clipping and self.clipped_count_stddev == 0.0:
      raise TrainingError(
          "--clipped_count_stddev=0 releases the count of unclipped updates without noise; "
          "give a positive value (default: "
          f"{adaptive_clipping.DEFAULT_COUNT_STDDEV_PER_CLIENT:g} x --clients_per_round)")
    if self.noise_seed is not None:
      checks.seed(self.noise_seed, "--noise_seed")

  def canary_slots(self) -> int:
    """Canaries a run may plant: as many per participation pattern as real clients per round
    (so canaries are at most half of any round's clients), 0 where unsupported."""
    patterns = {"single": self.total_rounds, "fixed_epoch": self.total_rounds // (self.epochs or 1),
                "balls_in_bins": self.total_rounds // (self.epochs or 1)}
    return patterns.get(self.participation, 0) * self.clients_per_round

  def _check_canaries(self) -> None:
    """--canaries m (training.canaries): a one-run audit of the run's DP claim."""
    if isinstance(self.canaries, bool) or not isinstance(self.canaries, int) or self.canaries < 0:
      raise TrainingError(f"--canaries must be a non-negative integer, got {self.canaries!r}")
    if self.canaries == 0:
      for name, default in CANARY_FLAGS.items():
        if getattr(self, name) != default:
          raise TrainingError(f"--{name} goes with --canaries=m (m > 0) only")
      return
    if not is_private(self.canonical_mechanism):
      raise TrainingError(f"--canaries audits a DP claim; --mechanism={self.mechanism} makes "
                          "none (and its mean's denominator counts the clients present)")
    if self.adaptive_clipping:
      raise TrainingError("--canaries needs a fixed --clip_norm (a canary's update is scaled "
                          "past the clip norm; --clip_norm=adaptive is not supported)")
    if used_engine(self.engine, self.workers) != "compiled":
      raise TrainingError("--canaries needs the compiled engine (--engine=compiled or auto "
                          "without --workers); --engine=tff and --workers are not supported")
    if self.participation not in CANARY_PARTICIPATIONS:
      raise TrainingError(f"--canaries supports --participation={', '.join(CANARY_PARTICIPATIONS)}"
                          f" (the canary's rounds are a fixed schema pattern), not "
                          f"{self.participation}")
    slots = self.canary_slots()
    if self.canaries > slots:
      raise TrainingError(f"--canaries={self.canaries} exceeds the schema's {slots} client slots "
                          f"({slots // self.clients_per_round} participation patterns x "
                          f"--clients_per_round={self.clients_per_round})")
    if not 0.0 < self.canary_alpha < 1.0:
      raise TrainingError(f"--canary_alpha must be in (0, 1), got {self.canary_alpha}")
    if self.canary_plan_mu is not None:
      checks.positive_float(self.canary_plan_mu, "--canary_plan_mu")
    if self.canary_seed is not None:
      checks.seed(self.canary_seed, "--canary_seed")

  def with_used_engine(self) -> "TrainingConfig":
    """This config with ``engine`` the one that runs the rounds (``used_engine``), as the
    run's config.json, summary and TensorBoard hparams record it."""
    return dataclasses.replace(self, engine=used_engine(self.engine, self.workers))

  def public_dict(self) -> Dict[str, object]:
    """Every flag value (mechanism by canonical name), except the noise seed.

    The seed is kept only in the run's identity file and checkpoints; here it is replaced
    by where this invocation's flags say it comes from (a resumed run's summary records
    the source of the run's start, ``training.identity``).
    """
    out = dataclasses.asdict(self)
    out["mechanism"] = self.canonical_mechanism
    out["workers"] = list(self.workers)
    if self.participation_kind.marks_fixed_bin:  # a pre-rename balls_in_bins run has no marker
      out[participation.FIXED_BIN_MARKER] = True
    if self.canaries:
      out["canary_seed"] = "os_entropy" if self.canary_seed is None else "pinned"
    else:  # a run without canaries records (and fingerprints) no canary field
      for name in CANARY_FLAGS:
        del out[name]
      del out["canaries"]
    if self.noise_distribution == "gaussian" and self.granularity is None:
      del out["noise_distribution"], out["granularity"]  # as runs before the flag fingerprint
    if self.lstm_kernel == stackoverflow.DEFAULT_LSTM_KERNEL:
      del out["lstm_kernel"]  # likewise
    if self.pydocs_stdlib:
      del out["pydocs_stdlib"]  # likewise
    if self.family_params:
      out["family_params"] = dict(self.family_params)
    else:
      del out["family_params"]  # likewise
    if self.noise_seed is not None:
      out["noise_seed"] = "pinned"
    elif out["mechanism"] == "none":
      out["noise_seed"] = "no_noise"
    else:
      out["noise_seed"] = "os_entropy"
    return out

  def fingerprint(self) -> str:
    """Hash of the fields a resumed run must share with the run that checkpointed."""
    return _fingerprint(self.public_dict())

  def accepted_fingerprints(self) -> Tuple[str, ...]:
    """``fingerprint()``, and for random_allocation also the fingerprint its flags had when
    the scheme was spelled balls_in_bins (a run directory of that version resumes as the
    scheme it sampled, never as fixed-bin balls_in_bins)."""
    out = (self.fingerprint(),)
    if self.participation in participation.LEGACY_KINDS.values():
      legacy = {v: k for k, v in participation.LEGACY_KINDS.items()}
      out += (_fingerprint(dict(self.public_dict(), participation=legacy[self.participation])),)
    return out

  def changed_fields(self, recorded: Dict[str, object]) -> Tuple[str, ...]:
    """The resume-relevant fields whose value differs from ``recorded`` (a public_dict)."""
    return tuple(sorted(k for k, v in self.public_dict().items()
                        if k not in RESUME_FREE_FIELDS and recorded.get(k) != v))


# The library's argument names that this binary spells as another flag.
FLAG_OF_SPEC_ARGUMENT = {"momentum": "server_momentum", "learning_rate": "clip_learning_rate"}


def flag_message(error: checks.CheckError, mechanism: str) -> str:
  """The library's ``error`` in this binary's words: each argument it names
  (``error.arguments``, or its first word) spelled as the flag, and "mechanism 'x'" as
  ``--mechanism=x``."""
  flags = tuple(f.name for f in dataclasses.fields(TrainingConfig)) + tuple(FLAG_OF_SPEC_ARGUMENT)
  text = clitools.flag_message(error, flags=flags)
  for name, flag in FLAG_OF_SPEC_ARGUMENT.items():
    text = re.sub(rf"--{name}\b", f"--{flag}", text)
  canonical = canonical_mechanism(mechanism)
  text = re.sub(rf"(--)?mechanism '{re.escape(canonical)}'", f"--mechanism={mechanism}", text)
  return re.sub(r"(--)?mechanism '(\w+)'", r"--mechanism=\2", text)


def _fingerprint(public: Dict[str, object]) -> str:
  values = {k: v for k, v in public.items() if k not in RESUME_FREE_FIELDS}
  return hashlib.sha256(json.dumps(values, sort_keys=True).encode()).hexdigest()
