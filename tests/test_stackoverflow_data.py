"""Dataset loading: offline StackOverflow error, the real loader on a tiny copy."""

import os
import shutil
import socket
import sqlite3
import time
import urllib.request

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from stackoverflow import data
from stackoverflow import fixtures
from stackoverflow import preprocessing


@pytest.fixture(name="no_network")
def _no_network(monkeypatch):
  """Fails the test if anything tries to open a network connection."""
  def refuse(*args, **kwargs):
    raise AssertionError(f"network access attempted: {args} {kwargs}")
  monkeypatch.setattr(urllib.request, "urlopen", refuse)
  monkeypatch.setattr(socket, "create_connection", refuse)
  monkeypatch.setattr(socket.socket, "connect", refuse)


@pytest.fixture(name="tiny_dir", scope="module")
def _tiny_dir(tiny_stackoverflow):
  return tiny_stackoverflow(num_empty_train_clients=1)


def test_offline_without_files_says_what_to_fetch_and_where(tmp_path,
                                                            no_network):
  start = time.monotonic()
  with pytest.raises(data.DatasetUnavailableError) as error:
    data.load_federated_data("stackoverflow", data_dir=str(tmp_path))
  assert time.monotonic() - start < 5.0
  message = str(error.value)
  assert data.STACKOVERFLOW_SQLITE_URL in message
  assert data.STACKOVERFLOW_WORD_COUNT_URL in message
  assert os.path.join(str(tmp_path), "stackoverflow.sqlite") in message
  assert os.path.join(str(tmp_path), "datasets",
                      "stackoverflow.word_count.tar.bz2") in message
  assert "--dataset pydocs" in message
  assert os.listdir(tmp_path) == []  # Nothing created, nothing downloaded.


def test_default_directory_comes_from_environment(tmp_path, monkeypatch,
                                                  no_network):
  monkeypatch.setenv(data.STACKOVERFLOW_DIR_ENV, str(tmp_path / "so"))
  with pytest.raises(data.DatasetUnavailableError, match=str(tmp_path / "so")):
    data.load_federated_data("stackoverflow")


def test_tiny_copy_loads_through_tffs_loader(tiny_dir, monkeypatch,
                                             no_network):
  calls = []
  real_load_data = tff.simulation.datasets.stackoverflow.load_data

  def spy(cache_dir=None):
    calls.append(cache_dir)
    return real_load_data(cache_dir=cache_dir)

  monkeypatch.setattr(tff.simulation.datasets.stackoverflow, "load_data", spy)
  federated = data.load_federated_data("stackoverflow", data_dir=tiny_dir,
                                       vocab_size=30)
  assert calls == [os.path.abspath(tiny_dir)]
  assert federated.name == "stackoverflow"
  assert len(federated.train_client_ids) == 48 + 1
  expected_vocab = [w for w, _ in fixtures.word_counts(
      fixtures.tiny_stackoverflow_sentences(num_empty_train_clients=1)
      ["train"])][:30]
  assert federated.vocab == expected_vocab
  clients = fixtures.tiny_stackoverflow_sentences(num_empty_train_clients=1)
  first = federated.train_client_ids[0]
  stored = [e["tokens"].numpy().decode() for e in
            federated.train.create_tf_dataset_for_client(first)]
  assert stored == clients["train"][first]
  example = next(iter(federated.train.create_tf_dataset_for_client(first)))
  assert set(example) == {"creation_date", "score", "tags", "title", "tokens",
                          "type"}
  # The empty client is listed and yields nothing.
  assert not list(federated.train.create_tf_dataset_for_client(
      "train_empty_000"))
  # Validation: held-out sentences; test: the test split.
  heldout = {s for v in clients["heldout"].values() for s in v}
  validation = [e["tokens"].numpy().decode() for e in federated.validation]
  assert len(validation) == sum(len(v) for v in clients["heldout"].values())
  assert set(validation) <= heldout
  assert len(list(federated.test)) == sum(
      len(v) for v in clients["test"].values())


def test_validation_size_and_test_cap(tiny_dir):
  federated = data.load_federated_data(
      "stackoverflow", data_dir=tiny_dir, num_validation_examples=5,
      max_test_examples=7)
  assert len(list(federated.validation)) == 5
  assert len(list(federated.test)) == 7
  again = data.load_federated_data(
      "stackoverflow", data_dir=tiny_dir, num_validation_examples=5)
  assert ([e["tokens"].numpy() for e in federated.validation]
          == [e["tokens"].numpy() for e in again.validation])


def test_preprocessed_tiny_client_has_hand_checkable_ids(tiny_dir):
  federated = data.load_federated_data("stackoverflow", data_dir=tiny_dir)
  vocab = federated.vocab
  special = preprocessing.special_token_ids(len(vocab), 1)
  fn = preprocessing.build_preprocess_fn(vocab)
  client = federated.train_client_ids[0]
  sentence = next(iter(federated.train.create_tf_dataset_for_client(client)))
  words = sentence["tokens"].numpy().decode().split()
  x, y = next(iter(fn(federated.train.create_tf_dataset_for_client(client))))
  expected = [special.bos] + [
      vocab.index(w) + 1 if w in vocab else special.oov[0]
      for w in words][:20]
  if len(words) < 20:
    expected.append(special.eos)
  np.testing.assert_array_equal(x[0, :len(expected) - 1], expected[:-1])
  np.testing.assert_array_equal(y[0, :len(expected) - 1], expected[1:])


def test_compressed_database_is_decompressed_locally(tiny_dir, tmp_path,
                                                     no_network):
  import lzma  # pylint: disable=g-import-not-at-top
  target = tmp_path / "so"
  (target / "datasets").mkdir(parents=True)
  shutil.copy(os.path.join(tiny_dir, fixtures.WORD_COUNT_RELATIVE_PATH),
              target / "datasets")
  with open(os.path.join(tiny_dir, "stackoverflow.sqlite"), "rb") as f:
    raw = f.read()
  (target / "stackoverflow.sqlite.lzma").write_bytes(
      lzma.compress(raw, format=lzma.FORMAT_ALONE))
  federated = data.load_federated_data("stackoverflow", data_dir=str(target),
                                       progress=False)
  assert len(federated.train_client_ids) == 49
  assert (target / "stackoverflow.sqlite").read_bytes() == raw


def test_corrupt_files_are_named(tiny_dir, tmp_path, no_network):
  target = tmp_path / "so"
  (target / "datasets").mkdir(parents=True)
  (target / "stackoverflow.sqlite").write_bytes(b"not a database" * 100)
  shutil.copy(os.path.join(tiny_dir, fixtures.WORD_COUNT_RELATIVE_PATH),
              target / "datasets")
  with pytest.raises(data.DatasetUnavailableError,
                     match="stackoverflow.sqlite could not be read"):
    data.load_federated_data("stackoverflow", data_dir=str(target))
  (target / "datasets" / "stackoverflow.word_count.tar.bz2").write_bytes(
      b"garbage")
  with pytest.raises(data.DatasetUnavailableError, match="sha256"):
    data.load_federated_data("stackoverflow", data_dir=str(target))
  (target / "datasets" / "stackoverflow.word_count.tar.bz2").unlink()
  (target / "datasets" / "stackoverflow.word_count").write_text("a 1\nb\n")
  with pytest.raises(data.DatasetUnavailableError,
                     match=r"stackoverflow.word_count:2"):
    data.load_federated_data("stackoverflow", data_dir=str(target))


def test_database_without_tables_is_rejected(tiny_dir, tmp_path):
  target = tmp_path / "so"
  (target / "datasets").mkdir(parents=True)
  shutil.copy(os.path.join(tiny_dir, fixtures.WORD_COUNT_RELATIVE_PATH),
              target / "datasets")
  sqlite3.connect(str(target / "stackoverflow.sqlite")).execute(
      "CREATE TABLE other (x INTEGER);")
  with pytest.raises(data.DatasetUnavailableError, match="examples"):
    data.load_federated_data("stackoverflow", data_dir=str(target))


def test_synthetic_is_deterministic():
  assert len(data.synthetic_client_sentences()["train"]) == 400
  first = data.load_federated_data("synthetic", num_train_clients=30,
                                   vocab_size=10)
  second = data.load_federated_data("synthetic", num_train_clients=30,
                                    vocab_size=10)
  assert first.vocab == second.vocab and len(first.vocab) == 10
  assert first.vocab == data.fit_vocab(data.synthetic_client_sentences(
      num_train_clients=30)["train"])[:10]
  assert len(first.train_client_ids) == 30
  client = first.train_client_ids[3]
  assert ([e["tokens"].numpy() for e in
           first.train.create_tf_dataset_for_client(client)] ==
          [e["tokens"].numpy() for e in
           second.train.create_tf_dataset_for_client(client)])
  assert isinstance(next(iter(first.validation))["tokens"], tf.Tensor)


def _tff_join(clients, seed):
  reference = tff.simulation.datasets.TestClientData(
      {cid: {"tokens": np.array(s, dtype=object)} for cid, s in clients.items()})
  return reference.create_tf_dataset_from_all_clients(seed)


def test_synthetic_joined_splits_equal_tffs_join():
  """The synthetic splits' validation and test sets (built from memory) hold TFF's joined
  dataset: the same sentences in the same client order, for any order seed."""
  heldout = data.synthetic_client_sentences(num_heldout_clients=25)["heldout"]
  with_empty = dict(heldout, heldout_00003=[])  # an empty client keeps its place
  joined = data._client_data(with_empty)  # pylint: disable=protected-access
  for seed in (0, 7, data.VALIDATION_CLIENT_ORDER_SEED):
    ours, theirs = joined.create_tf_dataset_from_all_clients(seed), _tff_join(with_empty, seed)
    assert ours.element_spec == theirs.element_spec
    assert [e["tokens"].numpy() for e in ours] == [e["tokens"].numpy() for e in theirs]
  loaded = data.load_federated_data("synthetic", num_heldout_clients=25, vocab_size=10,
                                    num_validation_examples=40)
  assert [e["tokens"].numpy() for e in loaded.validation] == [
      e["tokens"].numpy()
      for e in _tff_join(heldout, data.VALIDATION_CLIENT_ORDER_SEED).take(40)]


@pytest.mark.parametrize("kwargs, message", [
    (dict(dataset="mnist"), "dataset must be one of"),
    (dict(dataset="synthetic", vocab_size=0), "vocab_size"),
    (dict(dataset="synthetic", num_validation_examples=0),
     "num_validation_examples"),
    (dict(dataset="stackoverflow", unknown_option=1), "unexpected options"),
])
def test_bad_arguments(kwargs, message):
  with pytest.raises(ValueError, match=message):
    data.load_federated_data(**kwargs)


def test_standin_copy_has_full_clients_and_a_papers_size_vocabulary(tmp_path, no_network):
  """The timing stand-in (benchmarks/bench_paper_config.py) goes through the real loader:
  every client holds exactly the cap of sentences, and the word counts reach V words."""
  clients = fixtures.standin_sentences(num_train_clients=40, sentences_per_client=12,
                                       vocab_words=300, words_per_sentence=(5, 9))
  assert all(len(s) == 12 for split in clients.values() for s in split.values())
  lengths = {len(sentence.split()) for split in clients.values()
             for s in split.values() for sentence in s}
  assert min(lengths) >= 5 and max(lengths) <= 9
  directory = fixtures.write_stackoverflow_copy(str(tmp_path / "so"), clients)
  federated = data.load_federated_data("stackoverflow", data_dir=directory, vocab_size=100)
  assert len(federated.vocab) == 100  # words used by >= 2 train clients, most frequent first
  assert federated.vocab[0] == "w00000"  # Zipf: the first word is the most frequent
  first = federated.train_client_ids[0]
  stored = [e["tokens"].numpy().decode()
            for e in federated.train.create_tf_dataset_for_client(first)]
  assert stored == clients["train"][first]


def _example(**features):
  return tf.train.Example(features=tf.train.Features(feature=features)).SerializeToString()


def test_examples_parsed_by_protobuf_equal_the_graphs():
  """``data._tokens_of`` reads each example's ``tokens`` as the graph's ``parse_example``
  does (bytes, in order; empty, non-ASCII and invalid UTF-8 tokens, other features beside
  it); an example the graph refuses (``tokens`` missing, not bytes, two values, or not an
  Example at all) is refused with the graph's own error."""
  one = lambda v: tf.train.Feature(bytes_list=tf.train.BytesList(value=[v]))
  good = [_example(tokens=one(b"the cat sat")), _example(tokens=one(b"")),
          _example(tokens=one("über ñ".encode()), title=one(b"x")),
          _example(tokens=one(b"\xff\xfe bad utf-8"),
                   score=tf.train.Feature(int64_list=tf.train.Int64List(value=[3])))]
  got = data._tokens_of(good)  # pylint: disable=protected-access
  want = data._parse_tokens(tf.constant(good)).numpy()  # pylint: disable=protected-access
  assert got.dtype == want.dtype == object and list(got) == list(want)
  bad = [_example(title=one(b"x")),
         _example(tokens=tf.train.Feature(int64_list=tf.train.Int64List(value=[1]))),
         _example(tokens=tf.train.Feature(bytes_list=tf.train.BytesList(value=[b"a", b"b"]))),
         b"\x0a\x03not an example"]
  for row in bad:
    with pytest.raises(tf.errors.InvalidArgumentError):
      data._parse_tokens(tf.constant(good + [row]))  # pylint: disable=protected-access
    with pytest.raises(tf.errors.InvalidArgumentError):
      data._tokens_of(good + [row])  # pylint: disable=protected-access
  # Not in protobuf's canonical form (fields written twice: two examples' bytes
  # concatenated), where the two parsers' rules differ: the graph's outcome either way.
  floats = tf.train.Feature(float_list=tf.train.FloatList(value=[1.0]))
  for row in (good[0] + _example(tokens=one(b"second")), good[0] + _example(title=one(b"y")),
              good[0] + _example(tokens=floats), _example(tokens=floats) + good[0]):
    outcome = []
    for parse in (lambda r: data._parse_tokens(tf.constant(r)).numpy(),  # pylint: disable=protected-access
                  data._tokens_of):  # pylint: disable=protected-access
      try:
        outcome.append(list(parse([row])))
      except tf.errors.InvalidArgumentError:
        outcome.append("refused")
    assert outcome[0] == outcome[1]
