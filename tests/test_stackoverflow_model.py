"""Model size (Denisov et al. 2022 App I) and metrics on hand-made predictions."""

import numpy as np
import pytest
import tensorflow as tf

from stackoverflow import metrics
from stackoverflow import model
from stackoverflow import preprocessing

# Vocabulary of 5 words, 1 OOV bucket: pad 0, words 1..5, OOV 6, BOS 7, EOS 8.
V, PAD, OOV, BOS, EOS = 5, 0, 6, 7, 8


def test_papers_model_has_4_050_748_parameters():
  keras_model = model.create_keras_model()
  # 10,004*96 + 4*(670*(96+670)+670) + (670*96+96) + (96*10,004+10,004).
  assert keras_model.count_params() == 4_050_748
  assert model.parameter_count() == 4_050_748 == model.PAPER_PARAMETER_COUNT
  shapes = {w.name.split("/")[0]: w.shape for w in keras_model.weights}
  assert shapes["embedding"] == (10004, 96)
  assert keras_model.get_layer("lstm").cell.units == 670
  assert keras_model.get_layer("projection").units == 96
  assert keras_model.output_shape == (None, None, 10004)


def test_small_model_sizes_and_seeded_initialization():
  kwargs = dict(vocab_size=50, embedding_size=8, lstm_size=12,
                projection_size=6)
  first = model.create_keras_model(seed=7, **kwargs)
  second = model.create_keras_model(seed=7, **kwargs)
  other = model.create_keras_model(seed=8, **kwargs)
  assert first.count_params() == model.parameter_count(**kwargs)
  for a, b in zip(first.get_weights(), second.get_weights()):
    np.testing.assert_array_equal(a, b)
  assert not np.array_equal(first.get_weights()[0], other.get_weights()[0])
  with pytest.raises(ValueError, match="lstm_size"):
    model.create_keras_model(lstm_size=0)


def test_cpu_lstm_equals_keras_lstm_with_its_gpu_variant(monkeypatch):
  """Without a GPU the LSTM runs in the generic RNN wrapper (no cuDNN variant to trace):
  the same variables, seeded initial values, outputs and gradients as Keras' LSTM layer,
  which is what a host with a GPU builds."""
  kwargs = dict(vocab_size=50, embedding_size=8, lstm_size=12, projection_size=6, seed=3)
  cpu = model.create_keras_model(**kwargs)
  assert not isinstance(cpu.get_layer("lstm"), tf.keras.layers.LSTM)
  real = tf.config.list_physical_devices
  monkeypatch.setattr(tf.config, "list_physical_devices",
                      lambda kind=None: ["GPU:0"] if kind == "GPU" else real(kind))
  gpu = model.create_keras_model(**kwargs)
  assert isinstance(gpu.get_layer("lstm"), tf.keras.layers.LSTM)
  assert [v.name for v in cpu.weights] == [v.name for v in gpu.weights]
  for a, b in zip(cpu.get_weights(), gpu.get_weights()):
    np.testing.assert_array_equal(a, b)
  ids = tf.constant(np.random.default_rng(0).integers(0, V + 4, size=(4, 7)), tf.int64)
  grads = []
  for keras_model in (cpu, gpu):
    with tf.GradientTape() as tape:
      logits = keras_model(ids)
      loss = tf.reduce_sum(tf.square(logits))
    grads.append((logits, tape.gradient(loss, keras_model.trainable_variables)))
  np.testing.assert_array_equal(grads[0][0].numpy(), grads[1][0].numpy())
  for a, b in zip(grads[0][1], grads[1][1]):
    np.testing.assert_array_equal(tf.convert_to_tensor(a).numpy(), tf.convert_to_tensor(b).numpy())


def _one_hot_logits(predicted):
  return tf.one_hot(predicted, depth=V + 4) * 10.0


def _result(metric_list, y_true, predicted):
  values = {}
  for metric in metric_list:
    metric.update_state(tf.constant(y_true), _one_hot_logits(predicted))
    values[metric.name] = float(metric.result())
  return values


def test_metrics_mask_pad_oov_and_eos_by_hand():
  # Targets:     w1 w2 OOV EOS pad pad
  # Predictions: w1 w3 OOV EOS w1  pad
  y_true = [[1, 2, OOV, EOS, PAD, PAD]]
  predicted = [[1, 3, OOV, EOS, 1, PAD]]
  values = _result(metrics.build_metrics(V, 1), y_true, predicted)
  assert values["num_tokens"] == 4           # pad never counts.
  assert values["accuracy"] == pytest.approx(3 / 4)  # w1, OOV, EOS right.
  assert values["accuracy_no_oov"] == pytest.approx(2 / 3)  # w1, EOS of 3.
  assert values["accuracy_no_oov_no_eos"] == pytest.approx(1 / 2)  # w1 of 2.
  assert metrics.ACCURACY_METRIC_NAMES == (
      "accuracy", "accuracy_no_oov", "accuracy_no_oov_no_eos")


@pytest.mark.parametrize("masked", [[0], [0, 5, 6, 7, 8], [9, 0, 3, 4, 4, 12, 10], [7, 2, 3]])
def test_kept_targets_is_one_test_per_masked_token(masked):
  """The mask built from runs of consecutive ids equals the token-by-token one, on every id
  in and around the runs."""
  y = tf.constant(np.arange(-1, 15, dtype=np.int64).reshape(4, 4))
  by_token = np.isin(y.numpy(), masked, invert=True)
  np.testing.assert_array_equal(metrics.kept_targets(y, masked).numpy(), by_token)


def test_metrics_accumulate_over_batches_and_handle_all_masked():
  metric = metrics.MaskedCategoricalAccuracy("accuracy_no_oov_no_eos",
                                             masked_tokens=[PAD, EOS, OOV])
  metric.update_state(tf.constant([[PAD, EOS]]), _one_hot_logits([[1, 1]]))
  assert float(metric.result()) == 0.0  # Nothing counted: 0, not NaN.
  metric.update_state(tf.constant([[1, 2]]), _one_hot_logits([[1, 1]]))
  metric.update_state(tf.constant([[3, OOV]]), _one_hot_logits([[3, 3]]))
  assert float(metric.result()) == pytest.approx(2 / 3)
  metric.reset_state()
  assert float(metric.total) == 0.0


def test_masked_loss_is_mean_over_non_pad_targets():
  loss_fn = metrics.MaskedSparseCategoricalCrossentropy(pad_token=PAD)
  logits = tf.random.stateless_normal([2, 3, V + 4], seed=[1, 2])
  y_true = tf.constant([[1, 2, PAD], [EOS, PAD, PAD]])
  log_probs = tf.nn.log_softmax(logits).numpy()
  expected = -np.mean([log_probs[0, 0, 1], log_probs[0, 1, 2],
                       log_probs[1, 0, EOS]])
  assert float(loss_fn(y_true, logits)) == pytest.approx(expected, rel=1e-5)
  assert float(loss_fn(tf.zeros([1, 3], tf.int64), logits[:1])) == 0.0


def test_tff_model_reports_loss_and_all_metrics():
  model_fn = model.create_tff_model_fn(
      vocab_size=V, embedding_size=4, lstm_size=8, projection_size=4,
      sequence_length=6, seed=1)
  tff_model = model_fn()
  dataset = tf.data.Dataset.from_tensor_slices(
      {"tokens": ["the cat sat", "on the mat mat mat mat mat"]})
  fn = preprocessing.build_preprocess_fn(
      ["the", "cat", "sat", "on", "mat"], sequence_length=6, batch_size=2)
  batch = next(iter(fn(dataset)))
  output = tff_model.forward_pass(batch, training=False)
  assert np.isfinite(float(output.loss))
  unfinalized = tff_model.report_local_unfinalized_metrics()
  assert {"loss", "num_tokens", "accuracy", "accuracy_no_oov",
          "accuracy_no_oov_no_eos"} <= set(unfinalized)
  # Targets: 'the cat sat EOS' (4) and the 7-word sentence cut to 6 words (6).
  assert float(unfinalized["num_tokens"][0]) == 4 + 6


def _padded_ids(lengths, width, seed=0):
  """Rows of random ids (never pad) followed by pad (0): row r keeps lengths[r] ids."""
  ids = np.random.default_rng(seed).integers(1, V + 4, size=(len(lengths), width))
  for row, length in enumerate(lengths):
    ids[row, length:] = PAD
  return tf.constant(ids, tf.int64)


def test_block_lstm_is_the_keras_lstm_on_trailing_padding():
  """lstm_kernel="block" (TensorFlow's fused BlockLSTMV2): the same variables and seeded
  values as the Keras cell, and the same logits and gradients on rows with trailing padding
  (a full row, shorter ones, one id, an empty row), within float32 rounding of the two
  kernels' arithmetic (about 1e-7 relative; asserted at 1e-5 of each array's scale)."""
  kwargs = dict(vocab_size=V, embedding_size=8, lstm_size=12, projection_size=6, seed=3)
  keras_model = model.create_keras_model(**kwargs)
  block_model = model.create_keras_model(lstm_kernel="block", **kwargs)
  assert isinstance(block_model.get_layer("lstm"), model.BlockLSTM)
  assert block_model.get_layer("lstm").cell.units == 12
  assert [v.name for v in keras_model.weights] == [v.name for v in block_model.weights]
  for a, b in zip(keras_model.get_weights(), block_model.get_weights()):
    np.testing.assert_array_equal(a, b)
  ids = _padded_ids([9, 5, 1, 0, 3], 9)
  results = []
  for keras_or_block in (keras_model, block_model):
    with tf.GradientTape() as tape:
      logits = keras_or_block(ids)
      loss = tf.reduce_sum(tf.square(logits))
    grads = tape.gradient(loss, keras_or_block.trainable_variables)
    results.append([logits.numpy()] + [tf.convert_to_tensor(g).numpy() for g in grads])
  for a, b in zip(*results):
    np.testing.assert_allclose(b, a, rtol=0, atol=1e-5 * np.abs(a).max())


def test_block_lstm_does_not_clip_the_cell_state():
  """BlockLSTM clips its cell state at a positive cell_clip (3 by default): the layer passes
  none, so a cell state far beyond 3 gives Keras' outputs."""
  layer = model.BlockLSTM(4, kernel_initializer="ones", recurrent_initializer="ones")
  cell = tf.keras.layers.RNN(tf.keras.layers.LSTMCell(
      4, kernel_initializer="ones", recurrent_initializer="ones"), return_sequences=True)
  inputs = tf.fill([2, 12, 3], 2.0)
  expected = cell(inputs).numpy()
  np.testing.assert_allclose(layer(inputs).numpy(), expected, rtol=1e-6)
  assert np.abs(expected[:, -1]).min() > 0.99  # tanh(c) with c = 12 steps of ~1, far past 3


def test_block_lstm_refuses_padding_that_does_not_trail():
  block_model = model.create_keras_model(vocab_size=V, embedding_size=4, lstm_size=4,
                                         projection_size=4, seed=1, lstm_kernel="block")
  with pytest.raises(tf.errors.InvalidArgumentError, match="padding must trail"):
    block_model(tf.constant([[3, PAD, 4]], tf.int64))
  with pytest.raises(ValueError, match="lstm_kernel"):
    model.create_keras_model(lstm_kernel="cudnn")


def test_the_loss_runs_its_softmax_once_a_batch():
  """TFF's Keras model calls the loss twice on one batch (the loss, then its "loss" metric):
  the second call returns the first's tensor, so one softmax cross-entropy runs, and the
  metric holds the batch's loss."""
  model_fn = model.create_tff_model_fn(vocab_size=V, embedding_size=4, lstm_size=4,
                                       projection_size=4, sequence_length=6, seed=1)
  tff_model = model_fn()
  batch = (_padded_ids([6, 2], 6), _padded_ids([6, 1], 6, seed=1))
  graph = tff_model.forward_pass.get_concrete_function(batch, training=True).graph
  ops = [op.type for f in [graph, *[g.graph for g in graph._functions.values()  # pylint: disable=protected-access
                                       if hasattr(g, "graph")]] for op in f.get_operations()]
  assert ops.count("SparseSoftmaxCrossEntropyWithLogits") == 1
  output = tff_model.forward_pass(batch, training=True)
  metrics_now = tff_model.report_local_unfinalized_metrics()
  total, count = (float(t) for t in metrics_now["loss"])
  assert total / count == pytest.approx(float(output.loss), rel=1e-6)
  loss_fn = metrics.MaskedSparseCategoricalCrossentropy(pad_token=PAD)
  logits = tf.random.stateless_normal([2, 3, V + 4], seed=[1, 2])
  y_true = tf.constant([[1, 2, PAD], [EOS, PAD, PAD]], tf.int64)
  first = loss_fn(y_true, logits)
  assert loss_fn(y_true, logits) is first
  assert float(loss_fn(y_true, logits * 2.0)) != float(first)  # other tensors: computed
