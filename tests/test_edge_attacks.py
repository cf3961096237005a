"""Issue 46's attacks on the TF path, on TFF's process and on the compiled engine.

The same attacks (``edge_attacks.ATTACKS``) and the same assertion run on Flower in
``tests/flower/test_edge_attacks.py``. Each engine runs one round of the run's own
aggregator (``NonFiniteZeroingFactory`` around the mechanism's DP factory) on a linear
model, with the attacker and without it, at a pinned noise seed: the release is finite
and the attacker moves it by at most server_lr·ζ/K.
"""

import types

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

import edge_attacks
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


def released(engine, mechanism, clients):
  library = aggregators.build_mechanism(
      mechanism, total_rounds=4, clients_per_round=K, clip_norm=CLIP, noise_multiplier=Z,
      server_learning_rate=SERVER_LR, noise_seed=SEED)
  setup = types.SimpleNamespace(
      aggregation_factory=tf_clipping.NonFiniteZeroingFactory(library.aggregation_factory),
      server_optimizer=library.server_optimizer)
  process = engine_lib.build_process(engine, model_fn, setup, client_lr=edge_attacks.CLIENT_LR)
  state = process.initialize()

  def flat(state):
    return np.concatenate([np.asarray(v, np.float64).ravel()
                           for v in process.get_model_weights(state).trainable])

  before = flat(state)
  state = process.next(state, [dataset(x, y) for x, y in clients]).state
  return before, flat(state)


@pytest.mark.parametrize("attack", sorted(edge_attacks.ATTACKS))
@pytest.mark.parametrize("mechanism", ["gaussian", "opt_prefix_sum", "banded", "tree"])
@pytest.mark.parametrize("engine", ["tff", "compiled"])
def test_an_attacker_moves_the_release_by_at_most_its_clipped_share(engine, mechanism, attack):
  honest = edge_attacks.HONEST
  before, with_attacker = released(engine, mechanism, honest + [edge_attacks.ATTACKS[attack]])
  _, without = released(engine, mechanism, honest)
  edge_attacks.check_round(before, with_attacker, without, CLIP, SERVER_LR, K)
