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

import stackoverflow
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


# "block" runs a sequence in one op (one more for its gradient): a train step of the main
# job's model (LSTM 32) about 2.2x faster than "keras" on a CPU; at the papers' 670 units it
# is slower than Keras' cell on oneDNN's matmuls (BENCHMARKS "Compiled engine speed").
LSTM_KERNELS, DEFAULT_LSTM_KERNEL = stackoverflow.LSTM_KERNELS, stackoverflow.DEFAULT_LSTM_KERNEL


def _block_lstm_sequence(xt, w, b):
  """BlockLSTMV2 over time-major inputs xt [L, batch, D] from zero states: h [L, batch, U].

  TensorFlow 2.14 registers for BlockLSTMV2 the gradient of BlockLSTM, whose gate order
  (i, c, f, o) is not V2's (Keras' i, f, c, o); this applies BlockLSTMGradV2 instead.
  """
  from tensorflow.python.ops import gen_rnn_ops  # pylint: disable=g-import-not-at-top

  @tf.custom_gradient
  def sequence(xt, w, b):
    units = tf.shape(b)[0] // 4
    zeros = tf.zeros(tf.stack([tf.shape(xt)[1], units]), xt.dtype)
    no_peephole = tf.zeros(tf.reshape(units, [1]), xt.dtype)
    steps = tf.cast(tf.shape(xt)[0], tf.int64)
    common = dict(seq_len_max=steps, x=xt, cs_prev=zeros, h_prev=zeros, w=w,
                  wci=no_peephole, wcf=no_peephole, wco=no_peephole, b=b, use_peephole=False)
    # cell_clip 0: no clipping of the cell state (the op clips only at a positive value).
    i, cs, f, o, ci, co, h = gen_rnn_ops.block_lstmv2(cell_clip=0.0, **common)

    def grad(dh):
      grads = gen_rnn_ops.block_lstm_grad_v2(i=i, cs=cs, f=f, o=o, ci=ci, co=co, h=h,
                                             cs_grad=tf.zeros_like(cs), h_grad=dh, **common)
      return grads[0], grads[3], grads[7]  # x, w, b
    return h, grad
  return sequence(xt, w, b)


class BlockLSTM(tf.keras.layers.Layer):
  """An LSTM over the sequence (return_sequences) on TensorFlow's fused BlockLSTMV2 kernel.

  Its variables are those of a Keras ``LSTMCell`` named "lstm_cell" (``lstm/lstm_cell/
  kernel``, ``recurrent_kernel``, ``bias``; the same initializers and seeded values), and
  its outputs are the generic ``RNN`` wrapper's on sequences whose padding (mask False)
  only trails: at a padded step that wrapper repeats the last output of the row (zeros for
  an empty row), which is what this layer returns there; it refuses, in the graph, a mask
  that is not trailing. The function is the same; the float32 arithmetic is the fused
  kernel's (Hochreiter & Schmidhuber 1997; Keras' gate order i, f, c, o; no peepholes).
  """

  def __init__(self, units: int, name: str = "lstm", **initializers):
    super().__init__(name=name)
    self.units = units
    self.cell = tf.keras.layers.LSTMCell(units, name="lstm_cell", **initializers)
    self.supports_masking = True

  def build(self, input_shape):
    with tf.name_scope(self.cell.name):
      self.cell.build(tf.TensorShape([input_shape[0], input_shape[-1]]))
    super().build(input_shape)

  def call(self, inputs, mask=None):
    w = tf.concat([self.cell.kernel, self.cell.recurrent_kernel], axis=0)
    hidden = tf.transpose(
        _block_lstm_sequence(tf.transpose(inputs, [1, 0, 2]), w, self.cell.bias), [1, 0, 2])
    if mask is None:
      return hidden
    mask = tf.cast(mask, tf.bool)
    # Trailing padding: a kept step is never preceded by a padded one.
    trailing = tf.reduce_all(tf.logical_or(tf.logical_not(mask[:, 1:]), mask[:, :-1]))
    lengths = tf.reduce_sum(tf.cast(mask, tf.int32), axis=1)
    with tf.control_dependencies([tf.debugging.Assert(trailing, ["BlockLSTM: padding must "
                                                                 "trail each row"])]):
      last = tf.gather(hidden, tf.maximum(lengths - 1, 0), axis=1, batch_dims=1)
    last = tf.where(lengths[:, tf.newaxis] > 0, last, tf.zeros_like(last))
    return tf.where(mask[:, :, tf.newaxis], hidden, last[:, tf.newaxis, :])

  def compute_mask(self, inputs, mask=None):
    return mask

  def get_config(self):
    return dict(super().get_config(), units=self.units)


def _lstm_layer(units: int, keras_lstm: Optional[bool] = None,
                lstm_kernel: str = DEFAULT_LSTM_KERNEL,
                **initializers) -> tf.keras.layers.Layer:
  """One LSTM layer over the sequence (return_sequences), named "lstm".

  ``lstm_kernel="block"``: ``BlockLSTM`` (on any device). "keras": Keras' ``LSTM`` also
  builds a cuDNN variant of its graph for the runtime to pick from;
  without a GPU that variant is never run, yet tracing it makes every model build and
  every TFF computation holding the model slower (a small model: 1.0 s against 0.14 s per
  build on 2 cores).
  Without a visible GPU the same cell runs in the generic ``RNN`` wrapper: the same
  variables (``lstm/lstm_cell/...``), initializers and outputs, the standard kernel
  Keras' ``LSTM`` itself picks on a CPU.
  """
  if lstm_kernel not in LSTM_KERNELS:
    raise ValueError(f"lstm_kernel must be one of {', '.join(LSTM_KERNELS)}, "
                     f"got {lstm_kernel!r}.")
  if lstm_kernel == "block":
    return BlockLSTM(units, **initializers)
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
                       keras_lstm: Optional[bool] = None,
                       lstm_kernel: str = DEFAULT_LSTM_KERNEL) -> tf.keras.Model:
  """Returns the uncompiled LSTM mapping ids [b, L] to logits [b, L, classes].

  `seed` makes the initial weights a deterministic function of it (None draws
  them from TensorFlow's random state). `lstm_kernel` (`LSTM_KERNELS`): "block" runs the
  LSTM on TensorFlow's fused kernel (`BlockLSTM`); with "keras", `keras_lstm` picks Keras'
  LSTM layer (True) or the same cell in the generic RNN wrapper (False); None picks Keras'
  LSTM only when a GPU is visible (`_lstm_layer`). Every choice has the same variables and
  seeded initial values.
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
  hidden = _lstm_layer(lstm_size, keras_lstm, lstm_kernel, kernel_initializer=kernels[0],
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
                        seed: Optional[int] = None,
                        lstm_kernel: str = DEFAULT_LSTM_KERNEL
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
        projection_size=projection_size, seed=seed, lstm_kernel=lstm_kernel)
    return tff.learning.models.from_keras_model(
        keras_model,
        loss=metrics_lib.MaskedSparseCategoricalCrossentropy(
            pad_token=special.pad),
        input_spec=input_spec,
        metrics=metrics_lib.build_metrics(vocab_size, num_oov_buckets))

  return model_fn
