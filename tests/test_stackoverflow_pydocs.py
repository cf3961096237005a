"""The docstring dataset: tokenization, determinism, size, train-only vocab."""

import collections
import json
import os

import pytest

from stackoverflow import data
from stackoverflow import pydocs

SMALL = dict(include_stdlib=False, distributions=["absl-py"])


def test_tokenize_is_stackoverflow_style():
  assert pydocs.tokenize("Don't use `os.path.join()`; see https://a.b/c.") == [
      "don't", "use", "os", ".", "path", ".", "join", "(", ")", ";", "see",
      "<URL>", "."]
  assert pydocs.tokenize("Non-ASCII café, 5-tuples & x_y!") == [
      "non-ascii", "caf", ",", "5-tuples", "&", "x_y", "!"]


def test_sentences_skip_code_doctests_and_directives():
  docstring = "\n".join([
      "Return the sum of the values.",
      "",
      "The result is exact, e.g. For small ints. It may overflow!",
      "",
      "Args:",
      "  values: The numbers to add up.",
      "  start (int): Where the sum",
      "    begins.",
      "",
      "Example::",
      "",
      "    total = add(1, 2)",
      "",
      ">>> add(1, 2)",
      "3",
      "",
      ".. note:: ignored directive",
      "-----------",
      "```",
      "fenced = code",
      "```",
      "x",
  ])
  assert pydocs.docstring_sentences(docstring) == [
      "return the sum of the values .",
      "the result is exact , e . g . for small ints .",
      "it may overflow !",
      "values : the numbers to add up .",
      "start ( int ) : where the sum begins .",
  ]


def test_documented_objects_are_found_without_importing():
  source = b'''"""Module doc."""
import this_module_does_not_exist
def f():
  """Function doc."""
class C:
  """Class doc."""
  def m(self):
    """Method doc."""
  def undocumented(self):
    pass
try:
  class D:
    """Conditional class doc."""
    def n(self):
      """Conditional method doc."""
except ImportError:
  def g():
    """Fallback doc."""
'''
  assert list(pydocs.documented_objects(source, "pkg.mod")) == [
      ("pkg.mod", "Module doc."), ("pkg.mod.f", "Function doc."),
      ("pkg.mod.C", "Class doc."), ("pkg.mod.D", "Conditional class doc."),
      ("pkg.mod.g", "Fallback doc."), ("pkg.mod.C.m", "Method doc."),
      ("pkg.mod.D.n", "Conditional method doc.")]


def test_split_is_a_fixed_function_of_the_client_id():
  ids = [f"module.function_{i}" for i in range(2000)]
  counts = collections.Counter(pydocs.split_of(i) for i in ids)
  assert set(counts) == {"train", "heldout", "test"}
  assert 0.75 < counts["train"] / len(ids) < 0.85
  assert pydocs.split_of("json.dumps") == pydocs.split_of("json.dumps")


def test_two_builds_are_identical(tmp_path):
  first = pydocs.build(str(tmp_path / "a"), progress=False, **SMALL)
  second = pydocs.build(str(tmp_path / "b"), progress=False, **SMALL)
  assert not first.cache_hit and not second.cache_hit
  for key in ("fingerprint", "content_sha256", "sqlite_sha256",
              "word_count_sha256", "splits"):
    assert first.metadata[key] == second.metadata[key], key
  with open(first.word_count_path, "rb") as a, open(second.word_count_path,
                                                    "rb") as b:
    assert a.read() == b.read()
  again = pydocs.build(str(tmp_path / "a"), progress=False, **SMALL)
  assert again.cache_hit and again.metadata == first.metadata
  # The fingerprint names the sources: package versions and options.
  assert "absl-py==1.4.0" in first.metadata["source"]["distributions"]
  other = pydocs.fingerprint(pydocs.build_options(
      max_files_per_package=3, **SMALL))[0]
  assert other != first.metadata["fingerprint"]


def test_corrupt_cache_is_an_error_naming_the_file(tmp_path):
  built = pydocs.build(str(tmp_path), progress=False, **SMALL)
  with open(built.word_count_path, "a", encoding="utf-8") as f:
    f.write("extra 1\n")
  with pytest.raises(pydocs.PydocsCacheError, match="word_count has sha256"):
    pydocs.build(str(tmp_path), progress=False, **SMALL)
  rebuilt = pydocs.build(str(tmp_path), progress=False, force=True, **SMALL)
  assert rebuilt.metadata["content_sha256"] == built.metadata["content_sha256"]
  os.remove(os.path.join(rebuilt.directory, pydocs.METADATA_FILENAME))
  with pytest.raises(pydocs.PydocsCacheError, match="metadata.json"):
    pydocs.build(str(tmp_path), progress=False, **SMALL)
  # Binaries see it as an unavailable dataset (non-zero exit, clear message).
  with pytest.raises(data.DatasetUnavailableError, match="metadata.json") as e:
    data.load_federated_data("pydocs", data_dir=str(tmp_path), progress=False,
                             **SMALL)
  # The binary has no --force for its dataset: the remedy it shows works from a shell.
  assert f"delete {rebuilt.directory} to rebuild it (force=True from Python)" in str(e.value)


@pytest.fixture(name="stdlib_data", scope="module")
def _stdlib_data(tmp_path_factory):
  """The standard-library part of the dataset (the default adds packages)."""
  cache = str(tmp_path_factory.mktemp("pydocs"))
  return data.load_federated_data("pydocs", data_dir=cache, progress=False,
                                  distributions=[])


def _stored_sentences(sqlite_path):
  """{split: {client_id: [sentence]}} read straight from the database."""
  import sqlite3  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  stored = collections.defaultdict(lambda: collections.defaultdict(list))
  connection = sqlite3.connect(sqlite_path)
  for split, client, proto in connection.execute(
      "SELECT split_name, client_id, serialized_example_proto FROM examples "
      "ORDER BY rowid;"):
    example = tf.train.Example.FromString(proto)
    tokens = example.features.feature["tokens"].bytes_list.value[0]
    stored[split][client].append(tokens.decode())
  connection.close()
  return stored


def test_thousands_of_clients_and_train_only_vocabulary(stdlib_data):
  info = stdlib_data.info
  assert info["splits"]["train"]["clients"] > 2500
  assert len(stdlib_data.train_client_ids) == info["splits"]["train"][
      "clients"]
  assert info["num_clients"] == sum(s["clients"]
                                    for s in info["splits"].values())
  stored = _stored_sentences(os.path.join(info["cache_path"],
                                          pydocs.SQLITE_FILENAME))
  all_clients = {c for split in stored.values() for c in split}
  assert {"json", "subprocess.run", "os.walk"} <= all_clients
  assert sorted(stored["train"]) == stdlib_data.train_client_ids
  for split, clients in stored.items():
    assert all(pydocs.split_of(c) == split for c in clients)
  # The vocabulary is the train split's words, by count; nothing else.
  train_counts = collections.Counter(
      w for sentences in stored["train"].values() for s in sentences
      for w in s.split())
  ranked = [w for w, _ in sorted(train_counts.items(),
                                 key=lambda x: (-x[1], x[0]))]
  assert stdlib_data.vocab == ranked[:10000]
  other_words = {w for split in ("heldout", "test")
                 for sentences in stored[split].values() for s in sentences
                 for w in s.split()}
  only_outside_train = other_words - set(train_counts)
  assert only_outside_train  # Such words exist, and the vocab excludes them.
  assert not only_outside_train & set(stdlib_data.vocab)
  # Through TFF's SqlClientData, a client's sentences come back in order.
  client = stdlib_data.train_client_ids[7]
  assert [e["tokens"].numpy().decode() for e in
          stdlib_data.train.create_tf_dataset_for_client(client)] == (
              stored["train"][client])


def test_validation_is_heldout_sentences(stdlib_data):
  validation = [e["tokens"].numpy().decode() for e in stdlib_data.validation]
  assert 1000 < len(validation) <= 10000
  assert all(len(s.split()) >= pydocs.DEFAULT_MIN_WORDS_PER_SENTENCE
             for s in validation)
  with open(os.path.join(stdlib_data.info["cache_path"],
                         pydocs.METADATA_FILENAME), encoding="utf-8") as f:
    metadata = json.load(f)
  assert len(validation) == min(10000,
                                metadata["splits"]["heldout"]["sentences"])


@pytest.mark.slow
def test_default_build_is_deterministic_and_fast(tmp_path):
  first = pydocs.build(str(tmp_path / "a"), progress=False)
  second = pydocs.build(str(tmp_path / "b"), progress=False)
  assert first.metadata["content_sha256"] == second.metadata["content_sha256"]
  assert first.metadata["num_clients"] > 10000
  assert first.metadata["build_seconds"] < 180


def test_module_clients_hold_every_docstring_of_their_module(tmp_path):
  """client_unit="module": one client per source module with the same sentences, in order."""
  objects, _ = pydocs.collect_clients(
      pydocs.list_source_files(include_stdlib=False, distributions=["absl-py"]),
      progress=False)
  modules, _ = pydocs.collect_clients(
      pydocs.list_source_files(include_stdlib=False, distributions=["absl-py"]),
      progress=False, client_unit="module")
  grouped = collections.OrderedDict()
  for client_id, sentences in objects.items():
    module = max((m for m in modules if client_id == m or client_id.startswith(m + ".")),
                 key=len)  # the innermost module: absl.flags._defines, not absl.flags
    grouped.setdefault(module, []).extend(sentences)
  assert list(grouped) == list(modules) and grouped == modules
  assert len(modules) < len(objects)
  built = pydocs.build(str(tmp_path), progress=False, client_unit="module", **SMALL)
  default = pydocs.fingerprint(pydocs.build_options(**SMALL))[0]
  assert built.metadata["fingerprint"] != default
  assert built.metadata["num_clients"] == len(modules)
  loaded = data.load_federated_data("pydocs_modules", data_dir=str(tmp_path),
                                    progress=False, **SMALL)
  assert set(loaded.train_client_ids) <= set(modules)
  with pytest.raises(ValueError, match="client_unit must be one of object, module"):
    pydocs.build_options(client_unit="file")
  with pytest.raises(ValueError, match="pydocs_modules sets client_unit itself"):
    data.load_federated_data("pydocs_modules", data_dir=str(tmp_path), progress=False,
                             client_unit="object", **SMALL)


def _fake_stdlib(root, text):
  """A standard library of one documented module, ``textmod``."""
  os.makedirs(root, exist_ok=True)
  with open(os.path.join(root, "textmod.py"), "w", encoding="utf-8") as f:
    f.write(f'"""{text} It has a second sentence here.\n\nAnd a third one, for luck."""\n')
  return str(root)


def test_without_the_standard_library_the_dataset_is_the_same_under_any_python(
    tmp_path, monkeypatch):
  """The standard library's docstrings follow Python's patch version (3.11.2 and 3.11.7
  differ); include_stdlib=False (--nopydocs_stdlib, the main job's) reads the pinned
  distributions alone, so another interpreter's standard library changes nothing."""
  options = dict(distributions=["absl-py"], client_unit="module")
  builds = {}
  for name, text in (("a", "The first interpreter documents this module."),
                     ("b", "Another patch release rewrote this docstring entirely.")):
    stdlib = _fake_stdlib(tmp_path / f"stdlib_{name}", text)
    monkeypatch.setattr(pydocs.sysconfig, "get_paths", lambda stdlib=stdlib: {"stdlib": stdlib})
    with_stdlib = pydocs.build(str(tmp_path / f"with_{name}"), progress=False,
                               include_stdlib=True, **options)
    without = pydocs.build(str(tmp_path / f"without_{name}"), progress=False,
                           include_stdlib=False, **options)
    builds[name] = (with_stdlib.metadata, without.metadata)
  (with_a, without_a), (with_b, without_b) = builds["a"], builds["b"]
  assert with_a["files_per_package"]["stdlib"] == 1
  assert with_a["num_clients"] == without_a["num_clients"] + 1  # textmod, a client of its own
  assert with_a["content_sha256"] != with_b["content_sha256"]  # the stdlib is in the data
  for key in ("content_sha256", "sqlite_sha256", "word_count_sha256", "splits"):
    assert without_a[key] == without_b[key], key
  assert "stdlib" not in without_a["files_per_package"]
