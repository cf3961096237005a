"""Federated next-word-prediction datasets: StackOverflow, pydocs, synthetic.

`load_federated_data(dataset, ...)` returns a `FederatedData`: train clients as
a `tff.simulation.datasets.ClientData` of raw examples (dicts with at least a
`tokens` string of space-separated lowercase tokens), validation and test sets
as `tf.data.Dataset`s of raw examples, and the vocabulary. Preprocess them with
`stackoverflow.preprocessing.build_preprocess_fn(vocab, ...)`. `train_tokens`
reads a train client's `tokens` strings without building a dataset (for
`stackoverflow.preprocessing.build_client_ids_fn`).

- "stackoverflow": TFF's federated StackOverflow (Denisov et al. 2022, Sec 5
  and App I, arXiv:2202.08312), read
  from an already downloaded copy through
  `tff.simulation.datasets.stackoverflow.load_data(cache_dir=data_dir)`; the
  vocabulary is the `vocab_size` most frequent words of TFF's word counts. The
  validation set is `num_validation_examples` (10,000) sentences of the
  held-out clients, which are outside the train and test sets (App I,
  "Evaluation accuracy details"); the test set is the test split. Nothing is
  ever downloaded: missing files raise `DatasetUnavailableError` saying what to
  fetch and where to put it.
- "pydocs": sentences of Python docstrings, one client per documented module,
  class or function (`stackoverflow.pydocs`); built once and cached.
- "pydocs_modules": the same docstrings, one client per source module
  (`stackoverflow.pydocs` with ``client_unit="module"``): fewer, larger clients.
- "synthetic": a small deterministic corpus from a fixed random Markov chain
  over a few dozen words, generated in memory (for quick tests).
"""

import collections
import dataclasses
import hashlib
import json
import lzma
import os
import pathlib
import sqlite3
from typing import Any, Callable, List, Optional, Sequence

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff
import tqdm

from stackoverflow import DATASETS
from stackoverflow import PYDOCS_CLIENT_UNITS
from stackoverflow.word_counts import DatasetUnavailableError  # pylint: disable=unused-import
from stackoverflow.word_counts import read_word_counts
from tff_mf.factorization.cache import file_sha256

DEFAULT_NUM_VALIDATION_EXAMPLES = 10000
# The deterministic client order from which the validation sentences are taken.
VALIDATION_CLIENT_ORDER_SEED = 0

# The files and URLs of `tff.simulation.datasets.stackoverflow` (TFF 0.87).
STACKOVERFLOW_SQLITE_URL = (
    "https://storage.googleapis.com/tff-datasets-public/"
    "stackoverflow.sqlite.lzma")
STACKOVERFLOW_WORD_COUNT_URL = (
    "https://storage.googleapis.com/tff-datasets-public/"
    "stackoverflow.word_count.tar.bz2")
STACKOVERFLOW_WORD_COUNT_SHA256 = (
    "1dc00256d6e527c54b9756d968118378ae14e6692c0b3b6cad470cdd3f0c519c")
STACKOVERFLOW_SQLITE = "stackoverflow.sqlite"
STACKOVERFLOW_SQLITE_LZMA = "stackoverflow.sqlite.lzma"
STACKOVERFLOW_WORD_COUNT_TARBALL = os.path.join(
    "datasets", "stackoverflow.word_count.tar.bz2")
STACKOVERFLOW_WORD_COUNT = os.path.join("datasets", "stackoverflow.word_count")
# Where to look when no data_dir is given: TFF's own default cache directory.
STACKOVERFLOW_DIR_ENV = "TFF_MF_STACKOVERFLOW_DIR"


@dataclasses.dataclass(frozen=True)
class FederatedData:
  """A federated next-word-prediction dataset.

  Attributes:
    name: one of DATASETS.
    train: ClientData of raw train examples (dicts with a `tokens` string).
    validation: tf.data.Dataset of raw validation examples.
    test: tf.data.Dataset of raw test examples.
    vocab: the vocabulary words, most frequent first (word i has id i + 1).
    train_client_ids: the train client ids, sorted.
    info: facts about the data (paths, counts, fingerprint).
    fingerprint: sha256 hex that changes whenever the data can (see
      `dataset_fingerprint`); record it with results.
    train_tokens: fn(client_id, limit=None) -> numpy array of the `tokens`
      strings (bytes) of the train client's first `limit` examples (all when
      None), the ones `train.create_tf_dataset_for_client` yields, in its order;
      read without building a `tf.data` pipeline.
  """
  name: str
  train: Any
  validation: tf.data.Dataset
  test: tf.data.Dataset
  vocab: list
  train_client_ids: list
  info: dict
  fingerprint: str
  train_tokens: Callable[..., np.ndarray]


def load_federated_data(dataset: str,
                        data_dir: Optional[str] = None,
                        vocab_size: int = 10000,
                        num_validation_examples: int = DEFAULT_NUM_VALIDATION_EXAMPLES,
                        max_test_examples: Optional[int] = None,
                        progress: bool = True,
                        **dataset_options) -> FederatedData:
  """Loads `dataset` (one of DATASETS).

  Args:
    dataset: "stackoverflow", "pydocs", "pydocs_modules" or "synthetic".
    data_dir: StackOverflow: the directory holding the downloaded copy (default
      $TFF_MF_STACKOVERFLOW_DIR, else ~/.tff, TFF's cache directory). pydocs:
      the cache directory of built datasets (default
      `stackoverflow.pydocs.default_cache_dir()`). Unused for synthetic.
    vocab_size: number of most frequent words kept (10,000 in the papers).
    num_validation_examples: sentences in the validation set (10,000).
    max_test_examples: cap on the test set (None: the whole test split).
    progress: show tqdm progress on stderr for long steps.
    **dataset_options: pydocs: options of `pydocs.load`; synthetic: options of
      `synthetic_client_sentences`.

  Raises:
    DatasetUnavailableError: StackOverflow files missing or corrupt, or a
      corrupt pydocs cache.
    ValueError: unknown dataset or bad argument.
  """
  if dataset not in DATASETS:
    raise ValueError(f"dataset must be one of {DATASETS}, got {dataset!r}.")
  if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or (
      vocab_size < 1):
    raise ValueError(f"vocab_size must be a positive integer, got "
                     f"{vocab_size!r}.")
  if num_validation_examples < 1:
    raise ValueError("num_validation_examples must be positive, got "
                     f"{num_validation_examples}.")
  if max_test_examples is not None and max_test_examples < 1:
    raise ValueError(f"max_test_examples must be positive or None, got "
                     f"{max_test_examples}.")
  if dataset == "stackoverflow":
    if dataset_options:
      raise ValueError(f"unexpected options for stackoverflow: "
                       f"{sorted(dataset_options)}.")
    train, heldout, test, vocab, info = _load_stackoverflow(
        data_dir, vocab_size, progress)
    train_tokens = sqlite_train_tokens(info["sqlite_path"])
  elif dataset in PYDOCS_CLIENT_UNITS:
    from stackoverflow import pydocs  # pylint: disable=g-import-not-at-top
    if "client_unit" in dataset_options:
      raise ValueError(f"{dataset} sets client_unit itself; got {dataset_options}.")
    try:
      loaded = pydocs.load(cache_dir=data_dir, progress=progress,
                           client_unit=PYDOCS_CLIENT_UNITS[dataset], **dataset_options)
    except pydocs.PydocsCacheError as e:
      raise DatasetUnavailableError(f"pydocs cache is corrupt: {e}") from e
    train, heldout, test = loaded.train, loaded.heldout, loaded.test
    vocab = loaded.vocab[:vocab_size]
    info = dict(loaded.metadata)
    info["cache_path"] = loaded.directory
    train_tokens = sqlite_train_tokens(
        os.path.join(loaded.directory, pydocs.SQLITE_FILENAME))
  else:
    train, heldout, test, vocab, info, train_tokens = _load_synthetic(
        vocab_size, **dataset_options)
  if not train.client_ids:
    raise DatasetUnavailableError(f"{dataset}: the train split has no clients.")
  validation = heldout.create_tf_dataset_from_all_clients(
      seed=VALIDATION_CLIENT_ORDER_SEED).take(num_validation_examples)
  test_dataset = test.create_tf_dataset_from_all_clients(
      seed=VALIDATION_CLIENT_ORDER_SEED)
  if max_test_examples is not None:
    test_dataset = test_dataset.take(max_test_examples)
  info = dict(info, num_train_clients=len(train.client_ids),
              num_validation_examples=num_validation_examples,
              max_test_examples=max_test_examples, vocab_size=len(vocab))
  return FederatedData(name=dataset, train=train, validation=validation,
                       test=test_dataset, vocab=list(vocab),
                       train_client_ids=sorted(train.client_ids), info=info,
                       fingerprint=dataset_fingerprint(dataset, info, vocab),
                       train_tokens=train_tokens)


# The `tokens` feature of the stored tf.train.Examples, as the loaders parse it.
_TOKENS_FEATURE = {"tokens": tf.io.FixedLenFeature([], tf.string)}


@tf.function(input_signature=[tf.TensorSpec([None], tf.string)], autograph=False)
def _parse_tokens(serialized):
  return tf.io.parse_example(serialized, _TOKENS_FEATURE)["tokens"]


def _tokens_of(serialized: Sequence[bytes]) -> np.ndarray:
  """``_parse_tokens`` of the serialized examples (an object array of bytes): each parsed
  by protobuf in this process, a tenth of the graph call's CPU for a round's few examples.
  Unless every example is in protobuf's canonical form (it serializes back to as many
  bytes: no unknown field, no field written twice; where TensorFlow's parser and
  protobuf's could read such bytes differently) and holds ``tokens`` as exactly one bytes
  value, the graph parses them all (and raises TensorFlow's own error where it does)."""
  from google.protobuf import message  # pylint: disable=g-import-not-at-top
  out = []
  try:
    for row in serialized:
      example = tf.train.Example.FromString(row)
      example.DiscardUnknownFields()
      if example.ByteSize() != len(row):
        raise ValueError("not in canonical form")
      features = example.features.feature
      feature = features["tokens"] if "tokens" in features else None
      if (feature is None or feature.WhichOneof("kind") != "bytes_list"
          or len(feature.bytes_list.value) != 1):
        raise ValueError("not one bytes value")
      out.append(feature.bytes_list.value[0])
  except (ValueError, TypeError, message.DecodeError):
    return _parse_tokens(tf.constant(serialized)).numpy()
  tokens = np.empty(len(out), dtype=object)
  tokens[:] = out
  return tokens


def sqlite_train_tokens(sqlite_path: str, split: str = "train"
                       ) -> Callable[..., np.ndarray]:
  """`FederatedData.train_tokens` of a database in TFF's SqlClientData format.

  The query is `tff.simulation.datasets.SqlClientData`'s (its rows come in the
  same stored order), run by Python's sqlite3 on a read-only connection; the
  examples are parsed by protobuf (`_tokens_of`). No per-client `tf.data` pipeline
  (SqlClientData's dataset plus the parse map it traces for every client).
  """
  uri = pathlib.Path(os.path.abspath(sqlite_path)).as_uri() + "?mode=ro"
  query = ("SELECT serialized_example_proto FROM examples WHERE client_id = ? "
           "and split_name = ?")
  connection = []

  def rows_of(client_id: str, limit: Optional[int]) -> list:
    if not connection:
      connection.append(sqlite3.connect(uri, uri=True, check_same_thread=False))
    cursor = connection[0].execute(query, (client_id, split))
    rows = cursor.fetchmany(limit) if limit is not None else cursor.fetchall()
    cursor.close()
    return [row[0] for row in rows]

  def train_tokens(client_id: str, limit: Optional[int] = None) -> np.ndarray:
    rows = rows_of(client_id, limit)
    if not rows:
      return np.zeros([0], dtype=object)
    return _tokens_of(rows)

  def many(client_ids: Sequence[str], limit: Optional[int] = None) -> List[np.ndarray]:
    """``train_tokens`` of each client, the examples of all parsed in one call (the same
    rows: parsing is example by example)."""
    if not client_ids:
      return []
    rows = [rows_of(c, limit) for c in client_ids]
    flat = [r for client in rows for r in client]
    tokens = _tokens_of(flat) if flat else np.zeros([0], object)
    return np.split(tokens, np.cumsum([len(client) for client in rows])[:-1])

  train_tokens.many = many  # type: ignore[attr-defined]
  return train_tokens


def dataset_fingerprint(dataset: str, info: dict, vocab: list) -> str:
  """sha256 hex identifying the data a run trains and evaluates on.

  It hashes the dataset's own identity and the vocabulary and split sizes used:
  pydocs its build fingerprint (builder version, Python version, every scanned
  distribution's version and the options; the docstrings change with installed
  packages) and the sha256 of its content; synthetic the sha256 of its sentences;
  StackOverflow the sha256 of the verified word-count archive and the size of the
  database (hashing gigabytes on every start would be too slow).
  """
  keys = {"pydocs": ("fingerprint", "content_sha256"),
          "pydocs_modules": ("fingerprint", "content_sha256"),
          "synthetic": ("content_sha256",),
          "stackoverflow": ("word_count_sha256", "sqlite_bytes")}[dataset]
  described = {k: info.get(k) for k in keys}
  described.update(dataset=dataset, vocab=list(vocab),
                   num_validation_examples=info["num_validation_examples"],
                   max_test_examples=info["max_test_examples"])
  return hashlib.sha256(json.dumps(described, sort_keys=True).encode()).hexdigest()


def default_stackoverflow_dir() -> str:
  return os.environ.get(STACKOVERFLOW_DIR_ENV) or os.path.join(
      os.path.expanduser("~"), ".tff")


def _fetch_instructions(data_dir: str, missing: list) -> str:
  datasets_dir = os.path.join(data_dir, "datasets")
  lines = [
      f"StackOverflow data not found in {data_dir!r} (nothing is downloaded; "
      "fetch the files on a machine with internet access and copy them here).",
      "Missing:"]
  lines += [f"  {m}" for m in missing]
  lines += [
      "Fetch and place them with:",
      f"  mkdir -p {datasets_dir}",
      f"  curl -L -o {os.path.join(data_dir, STACKOVERFLOW_SQLITE_LZMA)} "
      f"{STACKOVERFLOW_SQLITE_URL}",
      f"  curl -L -o {os.path.join(data_dir, STACKOVERFLOW_WORD_COUNT_TARBALL)}"
      f" {STACKOVERFLOW_WORD_COUNT_URL}",
      f"The .lzma file is decompressed to {STACKOVERFLOW_SQLITE} on first use "
      f"(or run `xz -d --format=lzma` on it yourself); the word-count archive "
      f"must have sha256 {STACKOVERFLOW_WORD_COUNT_SHA256}.",
      "Point --data_dir (or $" + STACKOVERFLOW_DIR_ENV + ") at that directory,"
      " or use --dataset pydocs, which needs no download."]
  return "\n".join(lines)



def _decompress_lzma(source: str, target: str, progress: bool) -> None:
  """Decompresses TFF's `stackoverflow.sqlite.lzma` next to it (atomically)."""
  tmp = target + ".partial"
  try:
    with open(source, "rb") as fin, open(tmp, "wb") as fout, tqdm.tqdm(
        total=os.path.getsize(source), unit="B", unit_scale=True,
        disable=not progress,
        desc=f"decompressing {os.path.basename(source)}") as bar:
      decompressor = lzma.LZMADecompressor()
      for block in iter(lambda: fin.read(1 << 20), b""):
        fout.write(decompressor.decompress(block))
        bar.update(len(block))
      if not decompressor.eof:
        raise DatasetUnavailableError(
            f"{source} is truncated (the LZMA stream does not end); fetch it "
            f"again from {STACKOVERFLOW_SQLITE_URL}.")
  except lzma.LZMAError as e:
    os.remove(tmp)
    raise DatasetUnavailableError(
        f"{source} is not a valid LZMA file ({e}); fetch it again from "
        f"{STACKOVERFLOW_SQLITE_URL}.") from e
  except BaseException:
    if os.path.exists(tmp):
      os.remove(tmp)
    raise
  os.replace(tmp, target)


def _stackoverflow_word_counts(data_dir: str, vocab_size: int):
  tarball = os.path.join(data_dir, STACKOVERFLOW_WORD_COUNT_TARBALL)
  extracted = os.path.join(data_dir, STACKOVERFLOW_WORD_COUNT)
  if os.path.exists(tarball):
    actual = file_sha256(tarball)
    if actual != STACKOVERFLOW_WORD_COUNT_SHA256:
      raise DatasetUnavailableError(
          f"{tarball} has sha256 {actual}, expected "
          f"{STACKOVERFLOW_WORD_COUNT_SHA256}: the file is corrupt or not the "
          f"StackOverflow word counts. Fetch it again from "
          f"{STACKOVERFLOW_WORD_COUNT_URL}.")
    # The archive is present and verified, so TFF's loader (keras get_file)
    # only extracts it; it does not touch the network.
    return tff.simulation.datasets.stackoverflow.load_word_counts(
        cache_dir=data_dir, vocab_size=vocab_size), tarball
  if os.path.exists(extracted):
    return read_word_counts(extracted, vocab_size), extracted
  return None, None


def _load_stackoverflow(data_dir, vocab_size, progress):
  data_dir = os.path.abspath(os.path.expanduser(
      data_dir or default_stackoverflow_dir()))
  sqlite_path = os.path.join(data_dir, STACKOVERFLOW_SQLITE)
  lzma_path = os.path.join(data_dir, STACKOVERFLOW_SQLITE_LZMA)
  missing = []
  if not os.path.exists(sqlite_path) and not os.path.exists(lzma_path):
    missing.append(f"{sqlite_path} (or {lzma_path}) from "
                   f"{STACKOVERFLOW_SQLITE_URL}")
  word_counts, word_count_path = _stackoverflow_word_counts(data_dir,
                                                            vocab_size)
  if word_counts is None:
    missing.append(
        f"{os.path.join(data_dir, STACKOVERFLOW_WORD_COUNT_TARBALL)} from "
        f"{STACKOVERFLOW_WORD_COUNT_URL}")
  if missing:
    raise DatasetUnavailableError(_fetch_instructions(data_dir, missing))
  if not os.path.exists(sqlite_path):
    _decompress_lzma(lzma_path, sqlite_path, progress)
  # TFF's loader returns the existing extracted database without any network
  # access (it downloads only when `stackoverflow.sqlite` is absent).
  try:
    train, heldout, test = tff.simulation.datasets.stackoverflow.load_data(
        cache_dir=data_dir)
  except Exception as e:  # sqlite3.DatabaseError, DatabaseFormatError.
    raise DatasetUnavailableError(
        f"{sqlite_path} could not be read as TFF's StackOverflow database "
        f"({type(e).__name__}: {e}); delete it and fetch "
        f"{STACKOVERFLOW_SQLITE_URL} again.") from e
  if not word_counts:
    raise DatasetUnavailableError(f"{word_count_path} holds no words.")
  vocab = list(word_counts.keys())[:vocab_size]
  info = dict(data_dir=data_dir, sqlite_path=sqlite_path,
              word_count_path=word_count_path,
              word_count_sha256=file_sha256(word_count_path),
              sqlite_bytes=os.path.getsize(sqlite_path))
  return train, heldout, test, vocab, info


# ----------------------------------------------------------------- synthetic

SYNTHETIC_WORDS = (
    "the a an of to in is it you that for on with as this be are use can "
    "function list file error value return string python code data table "
    "query server class method type test run call set get loop").split()


def synthetic_client_sentences(num_train_clients: int = 400,
                               num_heldout_clients: int = 40,
                               num_test_clients: int = 40,
                               max_sentences_per_client: int = 12,
                               seed: int = 5):
  """{split: {client_id: [sentence]}} drawn from a fixed random Markov chain.

  Each word has three likely successors, so a model can learn the text;
  sentence lengths vary from 2 to 30 words (longer than L = 20 sometimes).
  """
  rng = np.random.RandomState(seed)
  num_words = len(SYNTHETIC_WORDS)
  successors = np.stack([rng.choice(num_words, size=3, replace=False)
                         for _ in range(num_words)])
  result = {}
  counts = dict(train=num_train_clients, heldout=num_heldout_clients,
                test=num_test_clients)
  for split in ("train", "heldout", "test"):
    clients = collections.OrderedDict()
    for i in range(counts[split]):
      sentences = []
      for _ in range(int(rng.randint(1, max_sentences_per_client + 1))):
        length = int(rng.randint(2, 31))
        word = int(rng.randint(num_words))
        words = [word]
        for _ in range(length - 1):
          if rng.rand() < 0.85:
            word = int(successors[word, rng.randint(3)])
          else:
            word = int(rng.randint(num_words))
          words.append(word)
        sentences.append(" ".join(SYNTHETIC_WORDS[w] for w in words))
      clients[f"{split}_{i:05d}"] = sentences
    result[split] = clients
  return result


def fit_vocab(sentences_by_client) -> list:
  """Words of the given clients, most frequent first (ties alphabetical)."""
  counts = collections.Counter()
  for sentences in sentences_by_client.values():
    for sentence in sentences:
      counts.update(sentence.split())
  return [w for w, _ in sorted(counts.items(), key=lambda x: (-x[1], x[0]))]


class _InMemoryClientData(tff.simulation.datasets.TestClientData):
  """TFF's ``TestClientData`` of {client id: sentences}, whose joined dataset is built
  from memory: the same examples in the same client order as TFF's
  ``create_tf_dataset_from_all_clients``, without tracing a graph over every client
  (seconds per split)."""

  def __init__(self, clients):
    self._sentences = {cid: list(s) for cid, s in clients.items()}
    super().__init__({cid: collections.OrderedDict(tokens=np.array(s, dtype=object))
                      for cid, s in clients.items()})

  def create_tf_dataset_from_all_clients(self, seed=None) -> tf.data.Dataset:
    client_ids = self.client_ids.copy()
    np.random.RandomState(seed=seed).shuffle(client_ids)  # TFF's client order for `seed`
    tokens = [s for cid in client_ids for s in self._sentences[cid]]
    return tf.data.Dataset.from_tensor_slices(collections.OrderedDict(
        tokens=tf.constant(tokens, dtype=tf.string, shape=[len(tokens)])))


def _client_data(clients) -> Any:
  return _InMemoryClientData(clients)


def _load_synthetic(vocab_size, **options):
  clients = synthetic_client_sentences(**options)
  vocab = fit_vocab(clients["train"])[:vocab_size]
  info = dict(generator="synthetic_client_sentences", options=options,
              content_sha256=hashlib.sha256(
                  json.dumps(clients, sort_keys=True).encode()).hexdigest())

  def train_tokens(client_id, limit=None):
    return np.array([s.encode() for s in clients["train"][client_id][:limit]],
                    dtype=object)

  return (_client_data(clients["train"]), _client_data(clients["heldout"]),
          _client_data(clients["test"]), vocab, info, train_tokens)
