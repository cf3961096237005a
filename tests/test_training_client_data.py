"""The training loop's materialized client datasets equal the lazy tf.data pipeline's.

``training.task.ClientDatasets`` reads each client's sentences straight from the
data (``FederatedData.train_tokens``), preprocesses them once in one vectorized
graph and feeds TFF an in-memory dataset; the lazy pipeline
(``stackoverflow.preprocessing.build_preprocess_fn`` on the client's raw
``tf.data`` examples) is what the loop used before. Same sentences, order, ids and
batches, on the synthetic corpus, on a tiny copy of TFF's StackOverflow database
(empty clients, sentences longer than L, clients cut at max_elements_per_client)
and on a small pydocs build.
"""

import numpy as np
import pytest

from stackoverflow import data
from stackoverflow import preprocessing
from training import config as config_lib
from training import engine
from training import loop
from training import task as task_lib


def _batches(dataset):
  return [(x.numpy(), y.numpy()) for x, y in dataset]


def _assert_same_batches(ours, lazy):
  assert len(ours) == len(lazy)
  for (x, y), (lx, ly) in zip(ours, lazy):
    assert x.dtype == lx.dtype == np.int64
    np.testing.assert_array_equal(x, lx)
    np.testing.assert_array_equal(y, ly)


@pytest.fixture(name="tiny_dir", scope="module")
def _tiny_dir(tiny_stackoverflow):
  return tiny_stackoverflow(num_train_clients=12, sentences_per_client=(5, 30),
                            num_empty_train_clients=3)


class _CompiledStub(engine.CompiledProcess):
  """Only its type: which form of a client's batches the loop gives the compiled engine."""

  def __init__(self):  # pylint: disable=super-init-not-called
    pass


@pytest.mark.parametrize("dataset,kw", [
    ("synthetic", dict(max_elements_per_client=5, client_batch_size=2, sequence_length=8)),
    ("stackoverflow", dict(max_elements_per_client=17, client_batch_size=4,
                           sequence_length=6)),
    ("stackoverflow", dict(vocab_size=10, num_oov_buckets=3, max_elements_per_client=7,
                           sequence_length=5)),
])
def test_materialized_clients_equal_the_lazy_pipeline(dataset, kw, tiny_dir, tmp_path):
  config = config_lib.TrainingConfig(
      dataset=dataset, data_dir=tiny_dir if dataset == "stackoverflow" else None,
      vocab_size=kw.pop("vocab_size", 30), progress=False, root_output_dir=str(tmp_path), **kw)
  task = task_lib.build_task(config)
  # Each engine's form: TFF's process takes datasets, the compiled engine the same rows as
  # arrays (ClientBatches, whose dataset() is its batches).
  loads = {"tff": loop._client_loader(task, object()),  # pylint: disable=protected-access
           "compiled": loop._client_loader(task, _CompiledStub())}  # pylint: disable=protected-access
  cut = long = empty = 0
  for client_id in task.train_client_ids[:16]:
    raw = [e["tokens"].numpy().decode() for e in
           task.train.create_tf_dataset_for_client(client_id)]
    lazy = _batches(task.preprocess_fn(task.train.create_tf_dataset_for_client(client_id)))
    ours, arrays = loads["tff"](client_id), loads["compiled"](client_id)
    if not raw:
      assert ours is None and arrays is None and not lazy
      empty += 1
      continue
    _assert_same_batches(_batches(ours), lazy)
    _assert_same_batches(_batches(arrays.dataset()), lazy)
    cut += len(raw) > config.max_elements_per_client
    long += any(len(s.split()) > config.sequence_length for s in raw)
  # The clients compared exercise the cut, the sentences without EOS (and the empty clients).
  assert cut and long and (empty or dataset == "synthetic")


def test_pydocs_sentences_are_read_in_the_stored_order(tmp_path):
  federated = data.load_federated_data("pydocs", data_dir=str(tmp_path), progress=False,
                                       include_stdlib=False, distributions=["absl-py"])
  vocab = federated.vocab[:200]
  lazy_fn = preprocessing.build_preprocess_fn(vocab, max_elements_per_client=6, batch_size=4)
  clients = task_lib.ClientDatasets(lambda c: federated.train_tokens(c, 6),
                                    preprocessing.build_client_ids_fn(vocab), batch_size=4)
  compared = 0
  for client_id in federated.train_client_ids[:40]:
    raw = federated.train.create_tf_dataset_for_client(client_id)
    stored = [e["tokens"].numpy() for e in raw]
    assert list(federated.train_tokens(client_id)) == stored
    _assert_same_batches(_batches(clients.load(client_id)), _batches(lazy_fn(raw)))
    compared += len(stored) > 6
  assert compared  # some clients were cut


def test_client_ids_are_cached_and_evicted_least_recently_used_first(tiny_dir):
  federated = data.load_federated_data("stackoverflow", data_dir=tiny_dir, vocab_size=30,
                                       progress=False)
  ids_fn = preprocessing.build_client_ids_fn(federated.vocab)
  reads = []

  def read(client_id):
    reads.append(client_id)
    return federated.train_tokens(client_id)

  a, b, c = [i for i in federated.train_client_ids if "empty" not in i][:3]
  size = {i: ids_fn(federated.train_tokens(i)).nbytes for i in (a, b, c)}
  clients = task_lib.ClientDatasets(read, ids_fn, batch_size=16,
                                    cache_bytes=sum(size.values()) - 1)
  first = clients.token_ids(a)
  assert clients.token_ids(a) is first and reads == [a]  # read once
  assert not first.flags.writeable
  clients.token_ids(b)
  clients.token_ids(c)  # over the budget: a, the least recently used, goes
  clients.token_ids(c)
  assert reads == [a, b, c]
  np.testing.assert_array_equal(clients.token_ids(a), first)
  clients.token_ids(c)
  assert reads == [a, b, c, a]
  clients.token_ids(b)  # b went when a came back
  assert reads == [a, b, c, a, b]


@pytest.mark.parametrize("dataset", ["stackoverflow", "synthetic"])
def test_a_prefetched_batch_of_clients_equals_the_clients_read_one_by_one(dataset, tiny_dir):
  """ClientDatasets.prefetch (the training loop's, before a round) reads the clients in one
  batch (one parse and one ids call on the database; the synthetic corpus has no batch
  reader): every client's ids, empty clients and clients cut at the limit included, are
  those read alone, and are then served without another read."""
  federated = data.load_federated_data(dataset, data_dir=tiny_dir, vocab_size=30,
                                       progress=False)
  ids_fn = preprocessing.build_client_ids_fn(federated.vocab, sequence_length=6)
  many = getattr(federated.train_tokens, "many", None)
  assert (many is not None) == (dataset == "stackoverflow")
  reads = []

  def read(client_id):
    reads.append(client_id)
    return federated.train_tokens(client_id, 7)

  alone = task_lib.ClientDatasets(read, ids_fn, batch_size=4)
  batched = task_lib.ClientDatasets(read, ids_fn, batch_size=4,
                                    read_many=many and (lambda ids: many(ids, 7)))
  ids = federated.train_client_ids
  chosen = list(dict.fromkeys(ids[:10] + [c for c in ids if "empty" in c][:2]))
  expected = {c: alone.token_ids(c) for c in chosen}
  assert any(not len(v) for v in expected.values()) == (dataset == "stackoverflow")
  assert any(len(federated.train_tokens(c)) > 7 for c in chosen)
  reads.clear()
  batched.prefetch(chosen[:3] + chosen + chosen[:1])
  assert reads == ([] if many else chosen)
  for c in chosen:
    np.testing.assert_array_equal(batched.token_ids(c), expected[c])
    assert batched.token_ids(c).dtype == np.int64 and not batched.token_ids(c).flags.writeable
  assert reads == ([] if many else chosen)  # served from the batch
  batched.prefetch([])
