"""Issue 46's attacks on TFF's process, the compiled engine and the numpy adapter.

The same attacks (``edge_attacks.ATTACKS``) and the same assertion run on Flower in
``tests/flower/test_edge_attacks.py``. Each engine runs one round of the run's own
aggregator (TF: ``NonFiniteZeroingFactory`` around the mechanism's DP factory; numpy:
``tff_mf.plan.ServerRun`` through ``examples/numpy_federated.py``) on a linear model, with
the attacker and without it (it drops out), at a pinned noise seed: the release is finite
and the attacker moves it by at most server_lr·ζ/K.
"""

import functools
import types

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

import edge_attacks
from numpy_adapter import numpy_federated
from tff_mf import participation
from tff_mf import spec as spec_lib
from tff_mf.tf import aggregators
from tff_mf.tf import clipping as tf_clipping
from tff_mf.tf import runtime
from training import engine as engine_lib

K, CLIP, SERVER_LR, Z, SEED = 3, 1.0, 1.0, 0.5, 11
INPUT_SPEC = (tf.TensorSpec([None, edge_attacks.D_IN], tf.float32),
              tf.TensorSpec([None, 1], tf.float32))

runtime.install_exit_hook()


def model_fn():
  keras_model = tf.keras.Sequential([tf.keras.layers.Dense(
      1, kernel_initializer="zeros", bias_initializer="zeros",
      input_shape=(edge_attacks.D_IN,))])
  return tff.learning.models.from_keras_model(
      keras_model, loss=tf.keras.losses.MeanSquaredError(), input_spec=INPUT_SPEC)


def dataset(x, y):
  x = np.asarray(x, np.float32).reshape(1, -1)
  y = np.asarray([[y]], np.float32)
  return tf.data.Dataset.from_tensor_slices((x, y)).batch(1)


def numpy_released(mechanism, clients):
  """One round of the numpy adapter: every client of the population (fixed epochs of one
  cohort) is drawn; an absent one drops out."""
  spec = spec_lib.MechanismSpec.from_args(
      mechanism, total_rounds=4, clients_per_round=K, clip_norm=CLIP, noise_multiplier=Z,
      participation=participation.fixed_epoch(4))

  def client(data):
    def train(model):
      if data is None:
        return None
      w = model[0].astype(np.float64)
      delta = edge_attacks.local_update(*data, w[:-1], w[-1])
      return [(w - delta).astype(np.float32)]
    return train

  data = list(clients) + [None] * (K - len(clients))
  out = numpy_federated.simulate(
      spec, {f"c{k}": client(d) for k, d in enumerate(data)},
      [np.zeros(edge_attacks.D_IN + 1, np.float32)], rounds=1, noise_seed=SEED,
      sampling_seed=1, sampling_secret=2)
  return out["models"][0][0], out["models"][1][0]


@functools.lru_cache(maxsize=None)
def process_of(engine, mechanism):
  """The engine's process for the mechanism and its initial state (built once: every attack
  starts its rounds, with and without the attacker, from this state)."""
  library = aggregators.build_mechanism(spec_lib.MechanismSpec.from_args(
      mechanism, total_rounds=4, clients_per_round=K, clip_norm=CLIP,
      noise_multiplier=Z), server_learning_rate=SERVER_LR, noise_seed=SEED)
  setup = types.SimpleNamespace(
      aggregation_factory=tf_clipping.NonFiniteZeroingFactory(library.aggregation_factory),
      server_optimizer=library.server_optimizer)
  process = engine_lib.build_process(engine, model_fn, setup, client_lr=edge_attacks.CLIENT_LR)
  return process, process.initialize()


def released(engine, mechanism, clients):
  if engine == "numpy":
    return numpy_released(mechanism, clients)
  process, state = process_of(engine, mechanism)

  def flat(state):
    return np.concatenate([np.asarray(v, np.float64).ravel()
                           for v in process.get_model_weights(state).trainable])

  return flat(state), flat(process.next(state, [dataset(x, y) for x, y in clients]).state)


@pytest.mark.parametrize("attack", sorted(edge_attacks.ATTACKS))
@pytest.mark.parametrize("mechanism", ["gaussian", "opt_prefix_sum", "banded", "tree"])
@pytest.mark.parametrize("engine", ["tff", "compiled", "numpy"])
def test_an_attacker_moves_the_release_by_at_most_its_clipped_share(engine, mechanism, attack):
  if engine == "numpy" and mechanism == "tree":
    mechanism = "honaker_online"  # TFF's own tree runs in TFF; this is its matrix form
  honest = edge_attacks.HONEST
  before, with_attacker = released(engine, mechanism, honest + [edge_attacks.ATTACKS[attack]])
  _, without = released(engine, mechanism, honest)
  edge_attacks.check_round(before, with_attacker, without, CLIP, SERVER_LR, K)
