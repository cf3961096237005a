"""A tiny StackOverflow copy in the real on-disk format, for tests.

`write_tiny_stackoverflow(directory)` writes the files that
`tff.simulation.datasets.stackoverflow.load_data(cache_dir=directory)` and the
word-count reader of `stackoverflow.data` read:

  <directory>/stackoverflow.sqlite            SqlClientData database: tables
      `examples` (split_name, client_id, serialized_example_proto) and
      `client_metadata` (client_id, split_name, num_examples); splits `train`,
      `heldout`, `test`; each example a serialized tf.train.Example with the
      six StackOverflow features (creation_date, score, tags, title, tokens,
      type).
  <directory>/datasets/stackoverflow.word_count   "word count" lines, most
      frequent first (count = number of train clients using the word), as in
      the extracted `stackoverflow.word_count.tar.bz2`.

Content is deterministic (a fixed seed) and built from a few dozen
hand-written StackOverflow-style sentences, so loading, preprocessing and
training run through the real code path in seconds.

From a shell (the small stand-in for the download in docs/reproduce.md)::

  .venv/bin/python -m stackoverflow.fixtures out/stackoverflow [--num_train_clients 48]
"""

import argparse
import collections
import os
import sqlite3
import sys

import numpy as np

from stackoverflow import sqlite_format

SENTENCES = (
    "how do i sort a list in python ?",
    "you can use the sorted function .",
    "the list is sorted in place .",
    "i get an error when i run the script .",
    "what is the error message ?",
    "try to install the package with pip .",
    "this works for me , thanks .",
    "the function returns a new list .",
    "use a dictionary to count the words .",
    "edit : i found the answer .",
    "can you post the full stack trace ?",
    "the file is not found on the server .",
    "check the path of the file .",
    "i want to read a file line by line .",
    "open the file and loop over the lines .",
    "the query returns an empty result .",
    "add an index to the table .",
    "how can i convert a string to an int ?",
    "use int ( ) on the string .",
    "the loop never ends because the counter is not updated .",
    "in java you need a semicolon at the end of each statement and a class "
    "around every method , which is a long sentence to test truncation .",
    "thanks .",
    "what version of the compiler do you use ?",
    "the test fails on windows but works on linux .",
    "i would use a set instead of a list .",
    "the server returns a json object .",
    "parse the json with the json module .",
    "you're missing a closing bracket .",
    "it's a known bug in the library .",
    "see <URL> for details .",
)

# Words only some clients use, so the 2-client cut below leaves some of them
# out of the vocabulary and OOV targets appear in every split.
RARE_WORDS = ("zyzzyva", "quux", "frobnicate", "xyzzy", "plugh", "grault")

WORD_COUNT_RELATIVE_PATH = os.path.join("datasets", "stackoverflow.word_count")
SQLITE_FILENAME = "stackoverflow.sqlite"
SPLITS = ("train", "heldout", "test")


def _example_proto(tokens: str, title: str, tags: str, score: int,
                   kind: str, date: str) -> bytes:
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  def bytes_feature(value: str):
    return tf.train.Feature(
        bytes_list=tf.train.BytesList(value=[value.encode("utf-8")]))

  features = {
      "creation_date": bytes_feature(date),
      "score": tf.train.Feature(int64_list=tf.train.Int64List(value=[score])),
      "tags": bytes_feature(tags),
      "title": bytes_feature(title),
      "tokens": bytes_feature(tokens),
      "type": bytes_feature(kind),
  }
  return tf.train.Example(
      features=tf.train.Features(feature=features)).SerializeToString()


def tiny_stackoverflow_sentences(num_train_clients: int = 48,
                                 num_heldout_clients: int = 6,
                                 num_test_clients: int = 6,
                                 sentences_per_client: tuple = (3, 9),
                                 num_empty_train_clients: int = 0,
                                 seed: int = 20220000):
  """Returns {split: {client_id: [sentence, ...]}} of the tiny copy."""
  rng = np.random.RandomState(seed)
  low, high = sentences_per_client
  if not 1 <= low <= high:
    raise ValueError(f"sentences_per_client must be 1 <= low <= high, got "
                     f"{sentences_per_client}.")
  clients = {}
  counts = dict(train=num_train_clients, heldout=num_heldout_clients,
                test=num_test_clients)
  for split in SPLITS:
    clients[split] = collections.OrderedDict()
    for i in range(counts[split]):
      client_id = f"{split}_{i:05d}"
      n = int(rng.randint(low, high + 1))
      picks = rng.randint(0, len(SENTENCES), size=n)
      sentences = [SENTENCES[p] for p in picks]
      if rng.rand() < 0.3:
        rare = RARE_WORDS[int(rng.randint(0, len(RARE_WORDS)))]
        sentences.append(f"i do not know what {rare} means .")
      clients[split][client_id] = sentences
    if split == "train":
      for i in range(num_empty_train_clients):
        clients[split][f"train_empty_{i:03d}"] = []
  return clients


def word_counts(train_clients) -> list:
  """[(word, clients using it)] sorted by count desc, then word; count >= 2."""
  users = collections.Counter()
  for sentences in train_clients.values():
    users.update({w for s in sentences for w in s.split()})
  return sorted(((w, c) for w, c in users.items() if c >= 2),
                key=lambda item: (-item[1], item[0]))


def write_tiny_stackoverflow(directory: str,
                             num_train_clients: int = 48,
                             num_heldout_clients: int = 6,
                             num_test_clients: int = 6,
                             sentences_per_client: tuple = (3, 9),
                             num_empty_train_clients: int = 0,
                             seed: int = 20220000) -> str:
  """Writes the tiny StackOverflow copy into `directory`; returns `directory`.

  `num_empty_train_clients` adds train clients listed in `client_metadata`
  with no examples (to test that empty clients are skipped). Existing files
  are overwritten.
  """
  clients = tiny_stackoverflow_sentences(
      num_train_clients, num_heldout_clients, num_test_clients,
      sentences_per_client, num_empty_train_clients, seed)
  return write_stackoverflow_copy(directory, clients)


def standin_sentences(num_train_clients: int, sentences_per_client: int, vocab_words: int,
                      num_heldout_clients: int = 4, num_test_clients: int = 4,
                      words_per_sentence: tuple = (8, 30), seed: int = 20220001):
  """{split: {client_id: [sentence, ...]}}: a stand-in of StackOverflow's shape for timing.

  Every client has exactly ``sentences_per_client`` sentences of ``words_per_sentence``
  words drawn from ``vocab_words`` synthetic words (``w00000``, ...) with Zipf(1)
  frequencies, so the vocabulary of the word counts reaches the papers' 10,000 and a
  client fills the papers' cap of 256 sentences. Timing only: the content means nothing.
  """
  rng = np.random.RandomState(seed)
  words = np.array([f"w{i:05d}" for i in range(vocab_words)])
  weights = 1.0 / np.arange(1, vocab_words + 1)
  weights /= weights.sum()
  low, high = words_per_sentence
  clients = {}
  counts = dict(train=num_train_clients, heldout=num_heldout_clients, test=num_test_clients)
  for split in SPLITS:
    clients[split] = collections.OrderedDict()
    for i in range(counts[split]):
      lengths = rng.randint(low, high + 1, size=sentences_per_client)
      picks = words[rng.choice(vocab_words, size=int(lengths.sum()), p=weights)]
      ends = np.cumsum(lengths)
      clients[split][f"{split}_{i:05d}"] = [
          " ".join(picks[end - length:end]) for end, length in zip(ends, lengths)]
  return clients


def write_stackoverflow_copy(directory: str, clients) -> str:
  """Writes ``clients`` ({split: {client_id: [sentence, ...]}}) in TFF's on-disk format.

  ``stackoverflow.sqlite`` and ``datasets/stackoverflow.word_count`` go into ``directory``
  (existing files are overwritten); returns ``directory``.
  """
  os.makedirs(os.path.join(directory, "datasets"), exist_ok=True)
  db_path = os.path.join(directory, SQLITE_FILENAME)
  tmp_path = db_path + ".tmp"
  if os.path.exists(tmp_path):
    os.remove(tmp_path)
  connection = sqlite3.connect(tmp_path)
  with connection:
    sqlite_format.create_tables(connection)
    for split in SPLITS:
      for n, (client_id, sentences) in enumerate(clients[split].items()):
        for k, sentence in enumerate(sentences):
          proto = _example_proto(
              tokens=sentence, title=f"question {n} of {split}",
              tags="python|sql", score=k - 1,
              kind="question" if k == 0 else "answer",
              date=f"2017-{1 + n % 12:02d}-{1 + k % 28:02d} 10:00:00 UTC")
          connection.execute(
              "INSERT INTO examples (split_name, client_id, "
              "serialized_example_proto) VALUES (?, ?, ?);",
              (split, client_id, proto))
        connection.execute(
            "INSERT INTO client_metadata (client_id, split_name, num_examples)"
            " VALUES (?, ?, ?);", (client_id, split, len(sentences)))
  connection.close()
  os.replace(tmp_path, db_path)
  with open(os.path.join(directory, WORD_COUNT_RELATIVE_PATH), "w",
            encoding="utf-8") as f:
    for word, count in word_counts(clients["train"]):
      f.write(f"{word} {count}\n")
  return directory


def build_parser() -> argparse.ArgumentParser:
  """The parser of ``python -m stackoverflow.fixtures`` (the vocabulary of every tool)."""
  from tff_mf import clitools  # pylint: disable=g-import-not-at-top
  parser = clitools.ArgumentParser(
      prog="python -m stackoverflow.fixtures",
      description="Write a tiny StackOverflow copy in TFF's on-disk format (for --data_dir).")
  parser.add_argument("directory", help="where to write stackoverflow.sqlite and datasets/")
  parser.add_argument("--num_train_clients", type=int, default=48, help="training clients")
  parser.add_argument("--num_heldout_clients", type=int, default=6,
                      help="held-out (validation) clients")
  parser.add_argument("--num_test_clients", type=int, default=6, help="test clients")
  return parser


def main(argv=None) -> int:
  """``python -m stackoverflow.fixtures DIR``: writes the tiny copy into DIR."""
  parser = build_parser()
  args = parser.parse_args(argv)
  for name in ("num_train_clients", "num_heldout_clients", "num_test_clients"):
    if getattr(args, name) < 1:
      parser.error(f"--{name} must be >= 1, got {getattr(args, name)}")
  directory = write_tiny_stackoverflow(args.directory, args.num_train_clients,
                                       args.num_heldout_clients, args.num_test_clients)
  print(f"wrote a tiny StackOverflow copy ({args.num_train_clients} train, "
        f"{args.num_heldout_clients} heldout, {args.num_test_clients} test clients) to "
        f"{directory}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
