"""The DP mechanism, server optimizer and FedAvg process of a run, and its privacy numbers.

Every DP mechanism is resolved in numpy once (``tff_mf.mechanisms``, through
``tff_mf.tf.aggregators.resolve_mechanism``), accounted for on the encoder it resolved, and
built once by ``tff_mf.tf.aggregators.build_mechanism`` from that same resolution, through
one function, :func:`build_library_mechanism`, with the run's participation schema
(the library computes the sensitivity of C under it); ``none`` is plain FedAvg with
the same server momentum and learning-rate schedule. The noise multiplier z is the
flag's or calibrated to ``--target_epsilon`` under the schema, and ε comes from
``tff_mf.accounting`` (``training.privacy``).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, Optional, Tuple

from training.config import TrainingConfig
from training.config import TrainingError
from training.config import is_private

@dataclasses.dataclass
class MechanismSetup:
  """What a run trains with.

  Attributes:
    aggregation_factory: the model aggregator (wrapped to zero non-finite updates).
    server_optimizer: applies momentum β and the learning-rate schedule.
    single_participation_sqrt_loss: √L(B, C) of the factorization (Denisov et al. Eq. 2), None without one.
    info: JSON-ready description of the mechanism (never the noise seed).
    factorization: the library's A = B·C (None for TFF's tree and ``none``).
  """
  aggregation_factory: Any
  server_optimizer: Any
  single_participation_sqrt_loss: Optional[float]
  info: Dict[str, Any]
  factorization: Any = None


def resolve_privacy(config: TrainingConfig, noise_seed: Optional[int]
                    ) -> Tuple["MechanismSetup", Optional[float], Optional[Dict[str, Any]]]:
  """(setup, z, ε record): the mechanism built once, at the run's noise multiplier.

  The mechanism is resolved in numpy first (its C, from the cache); z is the flag's or
  calibrated on that C's encoder (``--target_epsilon``); then the TFF objects are built
  once from the same resolution. The aggregator's sensitivity must agree with the
  accountant's (``training.privacy``). Both z and the record are None for a non-private
  run.
  """
  from training import privacy  # pylint: disable=g-import-not-at-top
  if not is_private(config.canonical_mechanism):
    return build_mechanism_setup(config, None, noise_seed), None, None
  z = config.noise_multiplier
  resolved = _library_call("resolve_mechanism", config, 1.0 if z is None else z, noise_seed)
  z, record = privacy.guarantee(config, resolved.encoder)
  setup = build_mechanism_setup(config, z, noise_seed, resolved=resolved)
  privacy.check_against_mechanism(z, record, setup.info)
  return setup, z, record


def _library_call(function: str, config: TrainingConfig, noise_multiplier: Optional[float],
                  noise_seed: Optional[int], **kwargs):
  """``tff_mf.tf.aggregators.<function>`` for the run's mechanism; errors as TrainingError."""
  try:
    return build_library_mechanism(config.canonical_mechanism, config, noise_multiplier,
                                   noise_seed, function=function, **kwargs)
  except ValueError as e:
    raise TrainingError(f"--mechanism={config.mechanism}: {e}") from e


def build_library_mechanism(name: str, config: TrainingConfig, noise_multiplier: float,
                            noise_seed: Optional[int], function: str = "build_mechanism",
                            **kwargs):
  """``tff_mf.tf.aggregators.build_mechanism`` (or ``resolve_mechanism``) for registry
  mechanism ``name`` (canonical)."""
  from tff_mf.tf import aggregators  # pylint: disable=g-import-not-at-top
  return getattr(aggregators, function)(
      name, total_rounds=config.total_rounds,
      noise_multiplier=noise_multiplier, clients_per_round=config.clients_per_round,
      clip_norm=config.clip_norm, server_learning_rate=config.server_lr,
      momentum=config.server_momentum, lr_schedule=config.lr_schedule,
      schedule_rounds=config.schedule_rounds, noise_seed=noise_seed,
      cache_dir=config.cache_dir, bands=config.bands, rank=config.rank,
      buffers=config.buffers, participation=config.schema(), progress=config.progress,
      **config.adaptive_kwargs(), **kwargs)


def build_mechanism_setup(config: TrainingConfig, noise_multiplier: Optional[float],
                          noise_seed: Optional[int], resolved=None) -> MechanismSetup:
  """The run's aggregator and server optimizer (conflicting flags raise TrainingError).

  For the DP mechanisms, momentum β and the learning-rate schedule are part of the
  mechanism's workload (opt_momentum) or its post-processing, and the server
  optimizer realizes the rest. ``resolved``: the run's numpy mechanism, when already
  resolved (``resolve_privacy``).
  """
  from training import robustness  # pylint: disable=g-import-not-at-top
  mechanism = config.canonical_mechanism
  kwargs = {} if resolved is None else {"resolved": resolved}
  setup = _library_call("build_mechanism", config, noise_multiplier, noise_seed, **kwargs)
  info = dict(setup.info or {})
  info["private"] = is_private(mechanism)
  return MechanismSetup(robustness.NonFiniteZeroingFactory(setup.aggregation_factory),
                        setup.server_optimizer, setup.single_participation_sqrt_loss, info, setup.factorization)


def build_process(model_fn, setup: MechanismSetup, client_lr: float):
  """Unweighted FedAvg (each client one clipped update, Denisov et al. Sec 5)."""
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
  return tff.learning.algorithms.build_unweighted_fed_avg(
      model_fn,
      client_optimizer_fn=tff.learning.optimizers.build_sgdm(learning_rate=client_lr),
      server_optimizer_fn=setup.server_optimizer,
      model_aggregator=setup.aggregation_factory)
