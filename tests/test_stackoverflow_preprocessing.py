"""Preprocessing of Denisov et al. 2022 App I against hand-computed token ids."""

import numpy as np
import pytest
import tensorflow as tf

from stackoverflow import preprocessing

VOCAB = ["the", "cat", "sat", "on", "mat"]  # ids 1..5; OOV 6, BOS 7, EOS 8.


def _batches(sentences, **kwargs):
  dataset = tf.data.Dataset.from_tensor_slices({"tokens": sentences})
  fn = preprocessing.build_preprocess_fn(VOCAB, **kwargs)
  return [(x.numpy(), y.numpy()) for x, y in fn(dataset)]


def test_special_token_ids_follow_tff_convention():
  special = preprocessing.special_token_ids(5, 1)
  assert special == preprocessing.SpecialTokens(pad=0, oov=(6,), bos=7, eos=8)
  assert preprocessing.extended_vocab_size(5, 1) == 9
  # The papers' setting: 10,000 words + 1 OOV + pad, BOS, EOS.
  assert preprocessing.special_token_ids(10000, 1) == (0, (10001,), 10002,
                                                        10003)
  assert preprocessing.extended_vocab_size(10000, 1) == 10004
  assert preprocessing.special_token_ids(5, 3).oov == (6, 7, 8)


def test_hand_computed_ids_with_oov_eos_and_padding():
  [(x, y)] = _batches(["the cat sat on the mat", "dog sat"],
                      sequence_length=8, batch_size=4)
  # [BOS the cat sat on the mat EOS] padded to 9, and [BOS OOV sat EOS].
  np.testing.assert_array_equal(x, [[7, 1, 2, 3, 4, 1, 5, 8],
                                    [7, 6, 3, 8, 0, 0, 0, 0]])
  np.testing.assert_array_equal(y, [[1, 2, 3, 4, 1, 5, 8, 0],
                                    [6, 3, 8, 0, 0, 0, 0, 0]])
  assert x.dtype == np.int64


def test_long_sentence_is_cut_without_eos():
  [(x, y)] = _batches(["the cat sat on the mat", "the cat sat"],
                      sequence_length=3, batch_size=2)
  # Six words cut to three: no EOS (the sentence did not end there); a
  # sentence of exactly L = 3 words gets no EOS either, as in TFF's baseline.
  np.testing.assert_array_equal(x, [[7, 1, 2], [7, 1, 2]])
  np.testing.assert_array_equal(y, [[1, 2, 3], [1, 2, 3]])


def test_extra_spaces_do_not_create_tokens():
  [(x, _)] = _batches(["the  cat "], sequence_length=4, batch_size=1)
  np.testing.assert_array_equal(x, [[7, 1, 2, 8]])


def test_papers_defaults_256_sentences_in_batches_of_16():
  sentences = [f"the cat {i}" for i in range(300)]
  batches = _batches(sentences)
  assert len(batches) == 16  # 256 / 16; the other 44 sentences are dropped.
  assert all(x.shape == (16, 20) for x, _ in batches)
  # Stored order is kept without shuffling: sentence 255 is the last one.
  assert batches[-1][1][-1, 2] == 6  # "255" is OOV, target after "cat".
  assert (preprocessing.DEFAULT_SEQUENCE_LENGTH,
          preprocessing.DEFAULT_MAX_ELEMENTS_PER_CLIENT,
          preprocessing.DEFAULT_CLIENT_BATCH_SIZE,
          preprocessing.DEFAULT_NUM_OOV_BUCKETS,
          preprocessing.DEFAULT_VOCAB_SIZE) == (20, 256, 16, 1, 10000)


def test_no_cap_keeps_all_sentences_and_seeded_shuffle_is_reproducible():
  sentences = [f"the cat {i}" for i in range(40)]
  assert sum(len(x) for x, _ in _batches(
      sentences, max_elements_per_client=None, batch_size=7)) == 40
  first = _batches(sentences, max_elements_per_client=10,
                   shuffle_buffer_size=40, shuffle_seed=3)
  again = _batches(sentences, max_elements_per_client=10,
                   shuffle_buffer_size=40, shuffle_seed=3)
  for (a, _), (b, _) in zip(first, again):
    np.testing.assert_array_equal(a, b)


def test_empty_client_gives_no_batches():
  dataset = tf.data.Dataset.from_tensor_slices(
      {"tokens": tf.constant([], dtype=tf.string)})
  fn = preprocessing.build_preprocess_fn(VOCAB)
  assert not list(fn(dataset))
  assert fn(dataset).element_spec == preprocessing.batch_spec(20)


@pytest.mark.parametrize("kwargs, message", [
    (dict(vocab=[]), "vocab must be non-empty"),
    (dict(vocab=["a", "a"]), "duplicate"),
    (dict(vocab=["a b"]), "whitespace"),
    (dict(sequence_length=0), "sequence_length"),
    (dict(batch_size=0), "batch_size"),
    (dict(max_elements_per_client=0), "max_elements_per_client"),
    (dict(num_oov_buckets=0), "num_oov_buckets"),
    (dict(shuffle_buffer_size=10), "shuffle_seed"),
])
def test_bad_arguments_are_named(kwargs, message):
  kwargs = dict(dict(vocab=VOCAB), **kwargs)
  with pytest.raises(ValueError, match=message):
    preprocessing.build_preprocess_fn(**kwargs)


def test_matches_tffs_baseline_preprocessing_on_stackoverflow_style_text():
  # TFF's StackOverflow baseline without its shuffle gives the same batches.
  from stackoverflow import fixtures  # pylint: disable=g-import-not-at-top
  from tensorflow_federated.python.simulation.baselines import client_spec  # pylint: disable=g-import-not-at-top
  from tensorflow_federated.python.simulation.baselines.stackoverflow import word_prediction_preprocessing as tff_pre  # pylint: disable=g-import-not-at-top
  clients = fixtures.tiny_stackoverflow_sentences(num_train_clients=4)
  sentences = [s for v in clients["train"].values() for s in v]
  vocab = [w for w, _ in fixtures.word_counts(clients["train"])][:40]
  dataset = tf.data.Dataset.from_tensor_slices({"tokens": sentences})
  ours = preprocessing.build_preprocess_fn(vocab, sequence_length=10,
                                           max_elements_per_client=20,
                                           batch_size=4)(dataset)
  spec = client_spec.ClientSpec(num_epochs=1, batch_size=4, max_elements=20,
                                shuffle_buffer_size=1)
  theirs = tff_pre.create_preprocess_fn(spec, vocab, sequence_length=10)(
      dataset)
  pairs = list(zip(ours, theirs))
  assert len(pairs) == 5
  for (x, y), (tx, ty) in pairs:
    np.testing.assert_array_equal(x.numpy(), tx.numpy())
    np.testing.assert_array_equal(y.numpy(), ty.numpy())


@pytest.mark.parametrize("length", [1, 3, 20])
def test_the_python_client_ids_equal_the_graphs(length):
  """``build_client_ids_fn``'s dict lookups (one OOV bucket) give the graph's ids: words
  split at ASCII whitespace only (a no-break space, an em space and \\x1c are inside words
  for TensorFlow, though Python's str.split cuts there), cut to L, OOV, EOS after a short
  sentence, str or bytes sentences, an empty sentence and no sentence at all."""
  sentences = ["the cat sat", "", "   ", "the\tcat\nsat\x0bon\x0cmat\rthe", "  the   mat ",
               "the\u00a0cat sat\u2003on\x1cmat", "über cat ñ the", "cat " * 30, "mat",
               "THE Cat", "the cat sat on the mat the cat sat on the mat the cat"]
  sentences += [s.encode("utf-8") for s in sentences[:4]] + [b"the \xff\xfe cat"]
  graph = preprocessing.build_client_ids_fn(VOCAB, sequence_length=length, backend="tf")
  ours = preprocessing.build_client_ids_fn(VOCAB, sequence_length=length)  # auto: python
  got, want = ours(sentences), graph(np.asarray(sentences, object))
  assert got.dtype == want.dtype == np.int64 and got.shape == want.shape
  np.testing.assert_array_equal(got, want)
  assert ours([]).shape == graph([]).shape == (0, length + 1)


def test_the_client_ids_backend_is_checked():
  with pytest.raises(ValueError, match="backend must be"):
    preprocessing.build_client_ids_fn(VOCAB, backend="numpy")
  with pytest.raises(ValueError, match="num_oov_buckets = 1"):
    preprocessing.build_client_ids_fn(VOCAB, num_oov_buckets=2, backend="python")
  with pytest.raises(ValueError, match="duplicate"):
    preprocessing.build_client_ids_fn(["a", "a"])
  with pytest.raises(TypeError, match="sentence 1 is a int, not str or bytes"):
    preprocessing.build_client_ids_fn(VOCAB)([b"the", 1])
