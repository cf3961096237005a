"""DP-FedAvg with a matrix-factorization aggregator from tff-mf, end to end.

A linear model on synthetic data, 16 rounds of 4 clients. Every client takes part
in 2 of the 16 rounds (fixed-epoch participation: 2 epochs over 8 cohorts), the
mechanism is the optimal factorization of the momentum workload for that schema,
and the noise multiplier z is calibrated so that the whole run is (ε = 8, δ = 1e-6)-DP.

  .venv/bin/python examples/fed_avg_with_mf.py
"""

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_mf import participation
from tff_mf.tf import aggregators, runtime

ROUNDS, CLIENTS_PER_ROUND, EPOCHS = 16, 4, 2
runtime.install_exit_hook()  # TFF 0.87 leaves its local worker_binary running at exit


def model_fn():
  keras_model = tf.keras.Sequential([tf.keras.layers.Dense(1, input_shape=(3,))])
  return tff.learning.models.from_keras_model(
      keras_model, loss=tf.keras.losses.MeanSquaredError(),
      input_spec=(tf.TensorSpec([None, 3], tf.float32), tf.TensorSpec([None, 1], tf.float32)))


def client_data(rng):
  x = rng.normal(size=(8, 3)).astype(np.float32)
  y = x @ np.array([[1.0], [-2.0], [0.5]], np.float32)
  return tf.data.Dataset.from_tensor_slices((x, y)).batch(4)


setup = aggregators.build_mechanism(
    "opt_momentum", total_rounds=ROUNDS, target_epsilon=8.0, delta=1e-6,
    participation=participation.fixed_epoch(EPOCHS), clients_per_round=CLIENTS_PER_ROUND,
    clip_norm=1.0, server_learning_rate=1.0, momentum=0.9)
process = tff.learning.algorithms.build_unweighted_fed_avg(
    model_fn, client_optimizer_fn=tff.learning.optimizers.build_sgdm(0.1),
    server_optimizer_fn=setup.server_optimizer, model_aggregator=setup.aggregation_factory)

rng = np.random.default_rng(0)
cohorts = [[client_data(rng) for _ in range(CLIENTS_PER_ROUND)]
           for _ in range(ROUNDS // EPOCHS)]  # cohort j trains in rounds j and j + 8
state = process.initialize()
for round_index in range(ROUNDS):
  state = process.next(state, cohorts[round_index % len(cohorts)]).state
weights = process.get_model_weights(state).trainable
print(f"z = {setup.info['noise_multiplier']:.4f} for epsilon = {setup.info['epsilon']:.4f} "
      f"(delta = 1e-6, sensitivity {setup.info['sensitivity']:.4f} under "
      f"{setup.info['participation']['label']}); kernel {np.ravel(weights[0]).round(3)}")
