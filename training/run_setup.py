"""The DP mechanism, server optimizer and FedAvg process of a run, and its privacy record.

Every DP mechanism is built once by ``tff_mf.tf.aggregators.build_mechanism``, through one
function, :func:`build_library_mechanism`, from the run's ``tff_mf.spec.MechanismSpec``
(``TrainingConfig.spec``: the schema, sampling probability, privacy and
clipping); ``none`` is plain FedAvg with the same server momentum and learning-rate
schedule. The library resolves the mechanism in numpy (``tff_mf.mechanisms.build``), fixes
the noise multiplier z (the flag's, or calibrated to ``--target_epsilon``) and decides the
run's ε and its ε after each round: the run writes that record, and computes no other.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, Optional, Tuple

from training.config import TrainingConfig
from training.config import TrainingError
from training.config import is_private

@dataclasses.dataclass
class RunSetup:
  """What a run trains with: the library's ``tff_mf.tf.aggregators.MechanismSetup`` wrapped
  for the harness.

  Attributes:
    aggregation_factory: the model aggregator (wrapped to zero non-finite updates).
    server_optimizer: applies momentum β and the learning-rate schedule.
    single_participation_sqrt_loss: √L(B, C) of the factorization (Denisov et al. 2022,
      Eq. 2), None without one.
    info: JSON-ready description of the mechanism (never the noise seed).
    factorization: the library's A = B·C (None for TFF's tree and ``none``).
    encoder: the C the noise is calibrated for (``tff_mf.mechanisms``: C_T/√levels for
      TFF's tree, I for gaussian); None for ``none``.
    privacy: the library's ``tff_mf.mechanisms.PrivacyRecord`` (None for ``none``).
  """
  aggregation_factory: Any
  server_optimizer: Any
  single_participation_sqrt_loss: Optional[float]
  info: Dict[str, Any]
  factorization: Any = None
  encoder: Any = None
  privacy: Any = None


def resolve_privacy(config: TrainingConfig, noise_seed: Optional[int]
                    ) -> Tuple["RunSetup", Optional[float], Any]:
  """(setup, z, ε record): the mechanism built once, and the library's privacy record of it.

  z is the flag's or calibrated by the library (``--target_epsilon``, with amplification
  under cyclic Poisson sampling); the record is ``setup.privacy.details``, the one the
  library computed for the encoder it built (a ``tff_mf.accounting.Bound``). Both are None
  for a non-private run.
  """
  setup = build_run_setup(config, noise_seed)
  if setup.privacy is None:
    return setup, None, None
  return setup, setup.privacy.noise_multiplier, setup.privacy.details


def build_library_mechanism(name: str, config: TrainingConfig, noise_seed: Optional[int],
                            **kwargs):
  """``tff_mf.tf.aggregators.build_mechanism`` for the run's spec
  (``TrainingConfig.spec``) with registry mechanism ``name`` (canonical);
  ``kwargs`` override its wiring keywords; a library error is a TrainingError naming the
  flag."""
  from tff_mf.tf import aggregators  # pylint: disable=g-import-not-at-top
  if name != config.canonical_mechanism:
    config = dataclasses.replace(config, mechanism=name)
  spec = config.spec
  wiring = dict(server_learning_rate=config.server_lr, noise_seed=noise_seed,
                cache_dir=config.cache_dir, progress=config.progress)
  wiring.update(kwargs)
  try:
    return aggregators.build_mechanism(spec, **wiring)
  except ValueError as e:
    raise TrainingError(f"--mechanism={config.mechanism}: {e}") from e


def build_run_setup(config: TrainingConfig, noise_seed: Optional[int]) -> RunSetup:
  """The run's aggregator and server optimizer (conflicting flags raise TrainingError).

  For the DP mechanisms, momentum β and the learning-rate schedule are part of the
  mechanism's workload (opt_momentum) or its post-processing, and the server
  optimizer realizes the rest.
  """
  from tff_mf.tf import clipping as tf_clipping  # pylint: disable=g-import-not-at-top
  mechanism = config.canonical_mechanism
  setup = build_library_mechanism(mechanism, config, noise_seed)
  # The library's own dict: the discrete Gaussian records γ and σ in it once TFF has built the
  # aggregator for the model's size.
  info = setup.info if setup.info is not None else {}
  info["private"] = is_private(mechanism)
  resolved = setup.mechanism
  return RunSetup(tf_clipping.NonFiniteZeroingFactory(setup.aggregation_factory),
                        setup.server_optimizer, setup.single_participation_sqrt_loss, info,
                        setup.factorization,
                        encoder=None if resolved is None else resolved.encoder,
                        privacy=setup.privacy if info["private"] else None)


def build_process(model_fn, setup: RunSetup, client_lr: float):
  """Unweighted FedAvg (each client one clipped update, Denisov et al. Sec 5)."""
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
  return tff.learning.algorithms.build_unweighted_fed_avg(
      model_fn,
      client_optimizer_fn=tff.learning.optimizers.build_sgdm(learning_rate=client_lr),
      server_optimizer_fn=setup.server_optimizer,
      model_aggregator=setup.aggregation_factory)
