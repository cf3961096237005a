"""StackOverflow next-word-prediction preprocessing (Denisov et al. 2022, App I).

Denisov et al. (arXiv:2202.08312, App I, "Stackoverflow settings") share their
preprocessing with Kairouz et al. 2021 (arXiv:2103.00039): the 10,000 most frequent
words, one out-of-vocabulary (OOV) bucket, beginning/end-of-sentence (BOS/EOS)
and pad tokens, sentences cut to 20 words, at most 256 sentences per client and
client batches of 16.

Token ids (the convention of TFF's StackOverflow baseline, so checkpoints and
numbers are comparable):

  pad = 0, words = 1..V, OOV buckets = V+1..V+B, BOS = V+B+1, EOS = V+B+2,

for a vocabulary of V words and B OOV buckets; the model's output layer has
V+B+3 classes. A sentence w_1..w_k becomes [BOS, w_1..w_min(k,L), EOS?]: EOS is
appended only when the sentence has fewer than L = sequence_length words (a cut
sentence has no end). The sequence is padded with pad to L+1 ids and split
into inputs x = ids[:-1] and next-word targets y = ids[1:].
"""

import collections
from typing import Callable, Optional, Sequence

import numpy as np
import tensorflow as tf

DEFAULT_VOCAB_SIZE = 10000
DEFAULT_SEQUENCE_LENGTH = 20
DEFAULT_MAX_ELEMENTS_PER_CLIENT = 256
DEFAULT_CLIENT_BATCH_SIZE = 16
DEFAULT_NUM_OOV_BUCKETS = 1

SpecialTokens = collections.namedtuple("SpecialTokens",
                                       ["pad", "oov", "bos", "eos"])
SpecialTokens.__doc__ = (
    "Special token ids: `pad` (int), `oov` (tuple of ints, one per bucket), "
    "`bos` (int), `eos` (int).")


def special_token_ids(vocab_size: int,
                      num_oov_buckets: int = DEFAULT_NUM_OOV_BUCKETS
                     ) -> SpecialTokens:
  """Returns the (pad, oov, bos, eos) ids for a vocabulary of `vocab_size` words."""
  _check_positive_int("vocab_size", vocab_size)
  _check_positive_int("num_oov_buckets", num_oov_buckets)
  return SpecialTokens(
      pad=0,
      oov=tuple(vocab_size + 1 + i for i in range(num_oov_buckets)),
      bos=vocab_size + num_oov_buckets + 1,
      eos=vocab_size + num_oov_buckets + 2)


def extended_vocab_size(vocab_size: int,
                        num_oov_buckets: int = DEFAULT_NUM_OOV_BUCKETS) -> int:
  """Number of output classes: words + OOV buckets + pad, BOS and EOS."""
  return special_token_ids(vocab_size, num_oov_buckets).eos + 1


def _check_positive_int(name, value):
  if isinstance(value, bool) or not isinstance(value, int) or value < 1:
    raise ValueError(f"{name} must be a positive integer, got {value!r}.")


def _check_vocab(vocab: Sequence[str]) -> list:
  vocab = list(vocab)
  if not vocab:
    raise ValueError("vocab must be non-empty.")
  for word in vocab:
    if not isinstance(word, str) or not word or any(c.isspace() for c in word):
      raise ValueError(
          f"vocab entries must be non-empty strings without whitespace, "
          f"got {word!r}.")
  if len(set(vocab)) != len(vocab):
    duplicates = sorted(w for w, c in collections.Counter(vocab).items()
                        if c > 1)
    raise ValueError(f"vocab has duplicate words: {duplicates[:10]}.")
  return vocab


def _vocabulary_table(vocab: Sequence[str], sequence_length: int, num_oov_buckets: int):
  """(special token ids, table word -> id − 1) of a checked vocabulary: the one lookup both
  `build_to_ids_fn` and `build_client_ids_fn` use (OOV words hash into the buckets)."""
  vocab = _check_vocab(vocab)
  _check_positive_int("sequence_length", sequence_length)
  special = special_token_ids(len(vocab), num_oov_buckets)
  table = tf.lookup.StaticVocabularyTable(
      tf.lookup.KeyValueTensorInitializer(
          tf.constant(vocab, dtype=tf.string),
          tf.range(len(vocab), dtype=tf.int64)),
      num_oov_buckets=num_oov_buckets)
  return special, table


def build_to_ids_fn(vocab: Sequence[str],
                    sequence_length: int = DEFAULT_SEQUENCE_LENGTH,
                    num_oov_buckets: int = DEFAULT_NUM_OOV_BUCKETS
                   ) -> Callable[[dict], tf.Tensor]:
  """Returns fn(example) -> int64 ids [BOS, words..., EOS?] (length <= L+1).

  Words are the whitespace-separated pieces of `example["tokens"]` (empty
  pieces from repeated spaces are dropped).
  """
  special, table = _vocabulary_table(vocab, sequence_length, num_oov_buckets)
  bos = tf.constant([special.bos], dtype=tf.int64)
  eos = tf.constant([special.eos], dtype=tf.int64)

  def to_ids(example):
    words = tf.strings.split(tf.reshape(example["tokens"], []))
    words = words[:sequence_length]
    ids = table.lookup(words) + 1  # Word i of vocab gets id i + 1; pad is 0.
    ids = tf.cond(
        tf.size(ids) < sequence_length,
        lambda: tf.concat([ids, eos], axis=0),
        lambda: ids)
    return tf.concat([bos, ids], axis=0)

  return to_ids


def build_preprocess_fn(
    vocab: Sequence[str],
    sequence_length: int = DEFAULT_SEQUENCE_LENGTH,
    max_elements_per_client: Optional[int] = DEFAULT_MAX_ELEMENTS_PER_CLIENT,
    batch_size: int = DEFAULT_CLIENT_BATCH_SIZE,
    num_oov_buckets: int = DEFAULT_NUM_OOV_BUCKETS,
    shuffle_buffer_size: int = 0,
    shuffle_seed: Optional[int] = None,
) -> Callable[[tf.data.Dataset], tf.data.Dataset]:
  """Returns fn(raw client dataset) -> dataset of (x, y) int64 batches [b, L].

  Args:
    vocab: the vocabulary words (word i gets id i + 1).
    sequence_length: L, words kept per sentence (20 in the papers).
    max_elements_per_client: sentences kept per client (256 in the papers);
      None keeps all (use it for validation/test sets).
    batch_size: client batch size (16 in the papers).
    num_oov_buckets: OOV buckets (1 in the papers).
    shuffle_buffer_size: if > 1, shuffle a client's sentences before taking
      `max_elements_per_client`. The default 0 keeps the stored order, so runs
      are reproducible (a resumed run sees the same batches).
    shuffle_seed: seed of that shuffle (required when shuffling, so the data
      pipeline never depends on hidden global state).
  """
  if max_elements_per_client is not None:
    _check_positive_int("max_elements_per_client", max_elements_per_client)
  _check_positive_int("batch_size", batch_size)
  if shuffle_buffer_size < 0:
    raise ValueError(
        f"shuffle_buffer_size must be >= 0, got {shuffle_buffer_size}.")
  if shuffle_buffer_size > 1 and shuffle_seed is None:
    raise ValueError("shuffle_seed is required when shuffle_buffer_size > 1.")
  to_ids = build_to_ids_fn(vocab, sequence_length, num_oov_buckets)
  # Traced once here, not once per client dataset: tf.data traces a map
  # function every time a dataset is built, which made building a client's
  # pipeline ~3x slower than running it in the training loop. The per-dataset
  # wrappers below only call these concrete graphs.
  tokens_to_ids = tf.function(
      lambda tokens: to_ids({"tokens": tokens}),
      input_signature=[tf.TensorSpec(None, tf.string)], autograph=False)
  split_input_target = tf.function(
      lambda ids: (ids[:, :-1], ids[:, 1:]),
      input_signature=[tf.TensorSpec([None, sequence_length + 1], tf.int64)],
      autograph=False)

  @tf.autograph.experimental.do_not_convert
  def example_to_ids(example):
    return tokens_to_ids(example["tokens"])

  def preprocess_fn(dataset: tf.data.Dataset) -> tf.data.Dataset:
    if shuffle_buffer_size > 1:
      dataset = dataset.shuffle(shuffle_buffer_size, seed=shuffle_seed)
    if max_elements_per_client is not None:
      dataset = dataset.take(max_elements_per_client)
    # Parallel maps keep the element order (tf.data is deterministic unless
    # told otherwise).
    dataset = dataset.map(example_to_ids, num_parallel_calls=tf.data.AUTOTUNE)
    dataset = dataset.padded_batch(
        batch_size, padded_shapes=[sequence_length + 1],
        padding_values=tf.constant(0, dtype=tf.int64))
    return dataset.map(split_input_target,
                       num_parallel_calls=tf.data.AUTOTUNE)

  return preprocess_fn


def build_client_ids_fn(
    vocab: Sequence[str],
    sequence_length: int = DEFAULT_SEQUENCE_LENGTH,
    num_oov_buckets: int = DEFAULT_NUM_OOV_BUCKETS,
    backend: str = "auto",
) -> Callable[[Sequence[bytes]], np.ndarray]:
  """Returns fn(a client's sentences) -> int64 numpy ids [n, L+1], padded with pad.

  Row i is sentence i (a `tokens` string) exactly as `build_preprocess_fn` puts it
  in its batches before splitting x = ids[:, :-1], y = ids[:, 1:] (`client_dataset`
  batches the rows). `backend="tf"`: one pre-traced graph runs over all of a client's
  sentences at once (no per-client `tf.data` map, whose tracing dominated the clients'
  share of a training round). `backend="python"`: a dict lookup of each word, the same
  ids (words split at ASCII whitespace, as `tf.strings.split` splits), a fifth of the
  graph call's cost for a round's few sentences; it needs one OOV bucket (more hash
  with TensorFlow's Fingerprint64). `"auto"`: python with one bucket, else tf.
  """
  if backend not in ("auto", "tf", "python"):
    raise ValueError(f"backend must be auto, tf or python, got {backend!r}.")
  if backend == "python" and num_oov_buckets != 1:
    raise ValueError(f"backend python needs num_oov_buckets = 1, got {num_oov_buckets!r}.")
  if backend == "python" or (backend == "auto" and num_oov_buckets == 1):
    return _python_client_ids_fn(vocab, sequence_length)
  special, table = _vocabulary_table(vocab, sequence_length, num_oov_buckets)
  width = sequence_length + 1

  @tf.function(input_signature=[tf.TensorSpec([None], tf.string)],
               autograph=False)
  def sentences_to_ids(tokens):
    # build_to_ids_fn, vectorized over the sentences.
    words = tf.strings.split(tokens)[:, :sequence_length]
    ids = tf.ragged.map_flat_values(table.lookup, words) + 1
    lengths = ids.row_lengths()
    rows = tf.shape(lengths, out_type=tf.int64)[0]
    body = ids.to_tensor(default_value=special.pad,
                         shape=tf.stack([rows, sequence_length]))
    out = tf.concat([tf.fill([rows, 1], tf.constant(special.bos, tf.int64)),
                     body], axis=1)
    # EOS right after the last word of every sentence shorter than L.
    eos_at = tf.one_hot(lengths + 1, width, dtype=tf.int64) * tf.cast(
        tf.expand_dims(lengths < sequence_length, 1), tf.int64)
    return out + eos_at * special.eos

  def client_ids(sentences: Sequence[bytes]) -> np.ndarray:
    if not len(sentences):
      return np.zeros((0, width), dtype=np.int64)
    return sentences_to_ids(tf.constant(sentences, dtype=tf.string)).numpy()

  return client_ids


def _python_client_ids_fn(vocab: Sequence[str], sequence_length: int
                          ) -> Callable[[Sequence[bytes]], np.ndarray]:
  """`build_client_ids_fn`'s rows by dict lookups (one OOV bucket)."""
  vocab = _check_vocab(vocab)
  _check_positive_int("sequence_length", sequence_length)
  special = special_token_ids(len(vocab), 1)
  index = {word.encode("utf-8"): i + 1 for i, word in enumerate(vocab)}
  oov = special.oov[0]
  width = sequence_length + 1

  def client_ids(sentences: Sequence[bytes]) -> np.ndarray:
    out = np.zeros((len(sentences), width), dtype=np.int64)  # pad = 0
    out[:, 0] = special.bos
    for i, (row, sentence) in enumerate(zip(out, sentences)):
      if isinstance(sentence, str):
        text = sentence.encode("utf-8")
      elif isinstance(sentence, bytes):
        text = sentence
      else:
        raise TypeError(f"sentence {i} is a {type(sentence).__name__}, not str or bytes")
      words = text.split()[:sequence_length]  # bytes split: ASCII whitespace, as TF's
      row[1:len(words) + 1] = [index.get(w, oov) for w in words]
      if len(words) < sequence_length:
        row[len(words) + 1] = special.eos
    return out

  return client_ids


def client_dataset(ids: np.ndarray, batch_size: int = DEFAULT_CLIENT_BATCH_SIZE
                  ) -> tf.data.Dataset:
  """The (x, y) batches of `build_preprocess_fn` from `build_client_ids_fn`'s rows.

  An in-memory dataset (its graph holds the ids, no functions), so TFF
  serializes it cheaply and runs no preprocessing per round.
  """
  _check_positive_int("batch_size", batch_size)
  ids = np.asarray(ids, dtype=np.int64)
  return tf.data.Dataset.from_tensor_slices(
      (ids[:, :-1], ids[:, 1:])).batch(batch_size)


class ClientBatches:
  """A client's (x, y) batches as arrays: the rows of ``client_dataset``, without tf.data.

  ``ids`` [n, L+1] (int64) in the client's order, cut into batches of ``batch_size`` rows
  (the last one shorter), x = ids[:, :-1] and y = ids[:, 1:] as in ``client_dataset``. The
  compiled engine slices them in its traced client update: iterating a tf.data dataset
  inside a ``tf.function`` costs about 10 ms per client on 2 cores (its iterator is built
  anew at every call), more than the LSTM's step on the main job's model.
  """

  __slots__ = ("ids", "batch_size")

  def __init__(self, ids: np.ndarray, batch_size: int = DEFAULT_CLIENT_BATCH_SIZE):
    _check_positive_int("batch_size", batch_size)
    ids = np.asarray(ids, dtype=np.int64)
    if ids.ndim != 2 or ids.shape[1] < 2:
      raise ValueError(f"client ids must be [n, L+1] with L >= 1, got shape {ids.shape}")
    self.ids = ids
    self.batch_size = int(batch_size)

  def __len__(self) -> int:
    return len(self.ids)

  def dataset(self) -> tf.data.Dataset:
    """The same batches as a tf.data.Dataset (TFF's process takes datasets)."""
    return client_dataset(self.ids, self.batch_size)


def batch_spec(sequence_length: int = DEFAULT_SEQUENCE_LENGTH):
  """The element spec (x, y) of preprocessed batches (the model's input spec)."""
  spec = tf.TensorSpec(shape=[None, sequence_length], dtype=tf.int64)
  return (spec, spec)
