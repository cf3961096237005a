"""The StackOverflow next-word-prediction LSTM (Denisov et al. 2022, arXiv:2202.08312, App I).

Architecture shared by Denisov et al. (App I) with Kairouz et al. 2021
(arXiv:2103.00039) / Reddi et al. 2021 (arXiv:2003.00295): token embedding of
size 96, one LSTM of 670 units, a dense projection to 96 units, and a dense
softmax layer (logits) over the extended vocabulary (V words + B OOV buckets +
pad, BOS, EOS; see `stackoverflow.preprocessing`). With V = 10,000 and B = 1
(10,004 classes):

  embedding  10,004 * 96                      =   960,384
  LSTM       4 * (670 * (96 + 670) + 670)     = 2,055,560
  projection 670 * 96 + 96                    =    64,416
  softmax    96 * 10,004 + 10,004             =   970,388
  total                                       = 4,050,748  (about 4.05M)

All sizes are parameters so small runs can use a smaller model.
"""

from typing import Callable, Optional

import tensorflow as tf
import tensorflow_federated as tff

from stackoverflow import metrics as metrics_lib
from stackoverflow import preprocessing

PAPER_EMBEDDING_SIZE = 96
PAPER_LSTM_SIZE = 670
PAPER_PROJECTION_SIZE = 96
PAPER_PARAMETER_COUNT = 4_050_748  # V = 10,000, B = 1; see the module docstring.


def parameter_count(vocab_size: int = preprocessing.DEFAULT_VOCAB_SIZE,
                    num_oov_buckets: int = preprocessing.DEFAULT_NUM_OOV_BUCKETS,
                    embedding_size: int = PAPER_EMBEDDING_SIZE,
                    lstm_size: int = PAPER_LSTM_SIZE,
                    projection_size: int = PAPER_PROJECTION_SIZE) -> int:
  """Closed-form number of trainable parameters of `create_keras_model`."""
  classes = preprocessing.extended_vocab_size(vocab_size, num_oov_buckets)
  return (classes * embedding_size
          + 4 * (lstm_size * (embedding_size + lstm_size) + lstm_size)
          + lstm_size * projection_size + projection_size
          + projection_size * classes + classes)


def _initializers(seed: Optional[int]):
  """Keras' default initializers, seeded per layer when `seed` is given."""
  if seed is None:
    return dict(embedding="uniform", kernel="glorot_uniform",
                recurrent="orthogonal")
  return dict(
      embedding=tf.keras.initializers.RandomUniform(-0.05, 0.05, seed=seed),
      kernel=[tf.keras.initializers.GlorotUniform(seed=seed + i + 1)
              for i in range(3)],
      recurrent=tf.keras.initializers.Orthogonal(seed=seed + 4))


def _lstm_layer(units: int, keras_lstm: Optional[bool] = None,
                **initializers) -> tf.keras.layers.Layer:
  """One LSTM layer over the sequence (return_sequences), named "lstm".

  Keras' ``LSTM`` also builds a cuDNN variant of its graph for the runtime to pick from;
  without a GPU that variant is never run, yet tracing it makes every model build and
  every TFF computation holding the model slower (a small model: 1.0 s against 0.14 s per
  build on 2 cores).
  Without a visible GPU the same cell runs in the generic ``RNN`` wrapper: the same
  variables (``lstm/lstm_cell/...``), initializers and outputs, the standard kernel
  Keras' ``LSTM`` itself picks on a CPU.
  """
  if keras_lstm is None:
    keras_lstm = bool(tf.config.list_physical_devices("GPU"))
  if keras_lstm:
    return tf.keras.layers.LSTM(units, return_sequences=True, name="lstm", **initializers)
  return tf.keras.layers.RNN(tf.keras.layers.LSTMCell(units, name="lstm_cell", **initializers),
                             return_sequences=True, name="lstm")


def create_keras_model(vocab_size: int = preprocessing.DEFAULT_VOCAB_SIZE,
                       num_oov_buckets: int = preprocessing.DEFAULT_NUM_OOV_BUCKETS,
                       embedding_size: int = PAPER_EMBEDDING_SIZE,
                       lstm_size: int = PAPER_LSTM_SIZE,
                       projection_size: int = PAPER_PROJECTION_SIZE,
                       seed: Optional[int] = None,
                       keras_lstm: Optional[bool] = None) -> tf.keras.Model:
  """Returns the uncompiled LSTM mapping ids [b, L] to logits [b, L, classes].

  `seed` makes the initial weights a deterministic function of it (None draws
  them from TensorFlow's random state). `keras_lstm`: Keras' LSTM layer (True) or
  the same cell in the generic RNN wrapper (False); None picks Keras' LSTM only
  when a GPU is visible (`_lstm_layer`).
  """
  for name, value in (("embedding_size", embedding_size),
                      ("lstm_size", lstm_size),
                      ("projection_size", projection_size)):
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
      raise ValueError(f"{name} must be a positive integer, got {value!r}.")
  classes = preprocessing.extended_vocab_size(vocab_size, num_oov_buckets)
  init = _initializers(seed)
  kernels = (init["kernel"] if isinstance(init["kernel"], list)
             else [init["kernel"]] * 3)
  inputs = tf.keras.layers.Input(shape=(None,), dtype=tf.int64, name="ids")
  embedded = tf.keras.layers.Embedding(
      input_dim=classes, output_dim=embedding_size, mask_zero=True,
      embeddings_initializer=init["embedding"], name="embedding")(inputs)
  hidden = _lstm_layer(lstm_size, keras_lstm, kernel_initializer=kernels[0],
                       recurrent_initializer=init["recurrent"])(embedded)
  projected = tf.keras.layers.Dense(
      projection_size, kernel_initializer=kernels[1],
      name="projection")(hidden)
  logits = tf.keras.layers.Dense(
      classes, kernel_initializer=kernels[2], name="logits")(projected)
  return tf.keras.Model(inputs=inputs, outputs=logits, name="stackoverflow_nwp")


def create_tff_model_fn(vocab_size: int = preprocessing.DEFAULT_VOCAB_SIZE,
                        num_oov_buckets: int = preprocessing.DEFAULT_NUM_OOV_BUCKETS,
                        embedding_size: int = PAPER_EMBEDDING_SIZE,
                        lstm_size: int = PAPER_LSTM_SIZE,
                        projection_size: int = PAPER_PROJECTION_SIZE,
                        sequence_length: int = preprocessing.DEFAULT_SEQUENCE_LENGTH,
                        seed: Optional[int] = None
                       ) -> Callable[[], tff.learning.models.VariableModel]:
  """Returns a no-arg fn building the TFF model with loss and metrics.

  Loss: `metrics.MaskedSparseCategoricalCrossentropy` (mean over non-pad
  targets). Metrics: num_tokens, accuracy, accuracy_no_oov,
  accuracy_no_oov_no_eos (`stackoverflow.metrics`). Input spec:
  `preprocessing.batch_spec(sequence_length)`.
  """
  special = preprocessing.special_token_ids(vocab_size, num_oov_buckets)
  input_spec = preprocessing.batch_spec(sequence_length)

  def model_fn() -> tff.learning.models.VariableModel:
    keras_model = create_keras_model(
        vocab_size=vocab_size, num_oov_buckets=num_oov_buckets,
        embedding_size=embedding_size, lstm_size=lstm_size,
        projection_size=projection_size, seed=seed)
    return tff.learning.models.from_keras_model(
        keras_model,
        loss=metrics_lib.MaskedSparseCategoricalCrossentropy(
            pad_token=special.pad),
        input_spec=input_spec,
        metrics=metrics_lib.build_metrics(vocab_size, num_oov_buckets))

  return model_fn
