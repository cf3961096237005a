"""A real-text federated dataset from Python docstrings (no download needed).

Human-written technical English close in kind to StackOverflow posts, built
deterministically from the docstrings of the installed Python standard library
and installed packages, for the next-word-prediction task of Denisov et al.
2022 (arXiv:2202.08312, Sec 5 and App I)
when the StackOverflow files are not available.

- Sources: every `.py` file of the standard library (without its tests,
  `idlelib`, `lib2to3` and `site-packages`) and up to
  `max_files_per_package` files of every installed distribution (without
  tests; the project itself, pip, setuptools and wheel are left out, since
  their versions are not pinned by the lock). A package's files are chosen by
  sha256 of their paths, a fixed pseudo-random sample. Files are parsed with
  `ast` (`ast.get_docstring`); nothing is imported or executed.
- Clients (`client_unit`): "object" (default), one per documented module,
  class or function, named by its dotted path (e.g.
  `json.decoder.JSONDecoder.decode`); or "module", one per source module
  holding the docstrings of everything it documents (e.g. `json.decoder`),
  the unit closer to a StackOverflow user with many posts. A docstring whose sentences
  equal an earlier one (copied docs) is skipped, so no text is shared between
  clients or splits. Docstrings with fewer than `min_sentences_per_client`
  sentences are dropped (for module clients too, before the module's are joined).
- Examples: sentences. Doctest lines, code blocks, directives and rule lines
  are dropped; paragraphs are split after `.`, `!` or `?` followed by a space
  and a non-lowercase character. Tokens follow StackOverflow's style:
  lowercase ASCII, URLs replaced by `<URL>`, punctuation as separate tokens
  except inside words (apostrophes, hyphens). Sentences need at least
  `min_words_per_sentence` tokens, half of them with letters.
- Splits, by sha256 of the client id: 10% `heldout` (validation), 10% `test`,
  80% `train`. The vocabulary is fitted on the train split only: words by
  count, most frequent first, ties in alphabetical order.
- Cache: `<cache_dir>/<fingerprint>/` holds `pydocs.sqlite` (the SqlClientData
  format of TFF's StackOverflow: tables `examples` and `client_metadata`, each
  example a serialized tf.train.Example with a `tokens` feature),
  `word_count` ("word count" lines over the train split) and `metadata.json`
  (sources, counts, sha256 of both files). The fingerprint hashes the builder
  version, the Python version, the name and version of every scanned
  distribution and the options. The standard library's docstrings change with Python's
  patch version; with `include_stdlib=False` the sources are the pinned distributions
  alone, so the same lock file gives the same dataset under any Python 3.11.
"""

import ast
import collections
import dataclasses
import hashlib
import importlib.metadata
import json
import os
import platform
import re
import shutil
import sqlite3
import sys
import sysconfig
import time
from typing import Iterable, List, Optional, Sequence, Tuple

import tqdm

from stackoverflow import sqlite_format
from stackoverflow import word_counts as word_counts_lib
from tff_mf.factorization.cache import file_sha256

BUILDER_VERSION = 2
SPLITS = ("train", "heldout", "test")
DEFAULT_MAX_FILES_PER_PACKAGE = 120
DEFAULT_MIN_SENTENCES_PER_CLIENT = 2
DEFAULT_MIN_WORDS_PER_SENTENCE = 3
DEFAULT_MAX_FILE_BYTES = 400_000
CLIENT_UNITS = ("object", "module")
EXCLUDED_DISTRIBUTIONS = frozenset({"tff-mf", "pip", "setuptools", "wheel"})
EXCLUDED_STDLIB_DIRS = frozenset({
    "test", "tests", "idlelib", "lib2to3", "site-packages", "dist-packages",
    "__pycache__", "turtledemo", "ensurepip"})
TEST_DIR_NAMES = frozenset({"test", "tests", "testing", "__pycache__"})
SQLITE_FILENAME = "pydocs.sqlite"
WORD_COUNT_FILENAME = "word_count"
METADATA_FILENAME = "metadata.json"
CACHE_ENV = "TFF_MF_CACHE"


class PydocsCacheError(RuntimeError):
  """A cached pydocs dataset is corrupt or inconsistent; names the file."""


def default_cache_dir() -> str:
  """$TFF_MF_CACHE/datasets/pydocs, else ~/.cache/tff_mf/datasets/pydocs."""
  root = os.environ.get(CACHE_ENV) or os.path.join(
      os.path.expanduser("~"), ".cache", "tff_mf")
  return os.path.join(root, "datasets", "pydocs")


# ------------------------------------------------------------- text handling

_URL_RE = re.compile(r"(?:https?://|ftp://|www\.)\S+")
_TOKEN_RE = re.compile(r"<URL>|[a-z0-9_]+(?:['\-][a-z0-9_]+)*|[^\sa-z0-9_]")
_RULE_LINE_RE = re.compile(r"^\s*([-=~^*+#_.:`'\"])\1{2,}\s*$")
_DIRECTIVE_RE = re.compile(r"^\s*\.\.\s")
_DOCTEST_RE = re.compile(r"^\s*(>>>|\.\.\.)(\s|$)")
_FENCE_RE = re.compile(r"^\s*(```|~~~)")
# Lines that start a new item: section headers ("Args:") and Google-style
# parameter entries ("name (type): text").
_ITEM_START_RE = re.compile(r"^\s*(\w+( \w+)?:\s*$|[\w*]+( \([^)]*\))?:\s)")
_SECTION_HEADER_RE = re.compile(r"^\s*\w+( \w+)?:\s*$")
_SENTENCE_BREAK_RE = re.compile(r"[.!?]\s+(?=[^a-z\s])")
# Abbreviations after which a full stop does not end a sentence.
_ABBREVIATIONS = frozenset({"e.g.", "i.e.", "etc.", "vs.", "cf.", "resp.",
                            "approx.", "no.", "mr.", "dr.", "fig.", "eq.",
                            "sec.", "ref."})


def tokenize(sentence: str) -> List[str]:
  """StackOverflow-style tokens: lowercase ASCII words and punctuation.

  >>> tokenize("Use `os.path.join()` -- see https://docs.python.org/3/.")
  ['use', 'os', '.', 'path', '.', 'join', '(', ')', '-', '-', 'see', '<URL>', '.']
  """
  text = sentence.replace("`", "")
  text = text.encode("ascii", "ignore").decode("ascii").lower()
  # A URL's final full stop ends the sentence; it is not part of the URL.
  text = _URL_RE.sub(lambda m: " <URL> " + ("." if m.group(0).endswith(".")
                                           else ""), text)
  return _TOKEN_RE.findall(text)


def _paragraphs(docstring: str) -> List[str]:
  """Prose paragraphs of a cleaned docstring, each joined into one line."""
  paragraphs, current = [], []
  in_fence = in_doctest = False
  code_block_expected = False
  code_block_indent = None

  def flush():
    if current:
      paragraphs.append(" ".join(line.strip() for line in current))
      current.clear()

  for line in docstring.splitlines():
    stripped = line.strip()
    indent = len(line) - len(line.lstrip())
    if _FENCE_RE.match(line):
      flush()
      in_fence = not in_fence
      continue
    if in_fence:
      continue
    if not stripped:
      flush()
      in_doctest = False
      if code_block_indent is None and code_block_expected:
        code_block_indent = -1  # The literal block starts at the next line.
      continue
    if code_block_indent is not None:
      if code_block_indent == -1:
        code_block_indent = indent
      if indent >= code_block_indent and code_block_indent > 0:
        continue
      code_block_indent = None
      code_block_expected = False
    if _DOCTEST_RE.match(line):
      flush()
      in_doctest = True
      continue
    if in_doctest:  # Doctest output runs until a blank line.
      continue
    if _DIRECTIVE_RE.match(line) or _RULE_LINE_RE.match(line):
      flush()
      continue
    if _ITEM_START_RE.match(line):
      flush()
    current.append(line)
    code_block_expected = stripped.endswith("::")
    if _SECTION_HEADER_RE.match(line):
      flush()
  flush()
  return paragraphs


def split_sentences(paragraph: str) -> List[str]:
  """Splits after . ! ? + space + a non-lowercase character (not after e.g.).

  >>> split_sentences("See e.g. Foo. It works! Really.")
  ['See e.g. Foo.', 'It works!', 'Really.']
  """
  pieces, start = [], 0
  for match in _SENTENCE_BREAK_RE.finditer(paragraph):
    last_word = paragraph[start:match.start() + 1].rsplit(None, 1)[-1]
    if last_word.lower() in _ABBREVIATIONS:
      continue
    pieces.append(paragraph[start:match.start() + 1])
    start = match.end()
  pieces.append(paragraph[start:])
  return [p.strip() for p in pieces if p.strip()]


def docstring_sentences(docstring: str,
                        min_words: int = DEFAULT_MIN_WORDS_PER_SENTENCE
                       ) -> List[str]:
  """Tokenized sentences (tokens joined by single spaces) of a docstring."""
  sentences = []
  for paragraph in _paragraphs(docstring):
    for piece in split_sentences(paragraph):
      tokens = tokenize(piece)
      if len(tokens) < min_words:
        continue
      wordy = sum(1 for t in tokens if any(c.isalpha() for c in t))
      if 2 * wordy < len(tokens):
        continue
      sentences.append(" ".join(tokens))
  return sentences


# ------------------------------------------------------------ source listing

@dataclasses.dataclass(frozen=True)
class SourceFile:
  package: str  # "stdlib" or a distribution name.
  module: str   # Dotted module name.
  path: str     # Absolute path.


def _module_name(relative_path: str) -> Optional[str]:
  parts = relative_path.replace(os.sep, "/").split("/")
  if not parts[-1].endswith(".py"):
    return None
  parts[-1] = parts[-1][:-3]
  if parts[-1] == "__init__":
    parts = parts[:-1]
  if not parts or not all(p.isidentifier() for p in parts):
    return None
  return ".".join(parts)


def _is_test_path(relative_path: str) -> bool:
  parts = relative_path.replace(os.sep, "/").split("/")
  name = parts[-1]
  return (any(p in TEST_DIR_NAMES for p in parts[:-1])
          or name.startswith("test_") or name.endswith("_test.py")
          or name == "conftest.py" or name.endswith("_pb2.py"))


def _stdlib_files() -> List[SourceFile]:
  root = sysconfig.get_paths()["stdlib"]
  files = []
  for directory, subdirs, names in os.walk(root):
    subdirs[:] = sorted(d for d in subdirs if d not in EXCLUDED_STDLIB_DIRS)
    for name in sorted(names):
      path = os.path.join(directory, name)
      relative = os.path.relpath(path, root)
      module = _module_name(relative)
      if module is None or _is_test_path(relative):
        continue
      files.append(SourceFile("stdlib", module, path))
  return sorted(files, key=lambda f: f.module)


def _distribution_name(dist) -> str:
  return (dist.metadata["Name"] or "").lower().replace("_", "-")


def scanned_distributions() -> List[Tuple[str, str]]:
  """(name, version) of the installed distributions that are scanned, sorted."""
  seen = {}
  for dist in importlib.metadata.distributions():
    name = _distribution_name(dist)
    if name and name not in EXCLUDED_DISTRIBUTIONS and name not in seen:
      seen[name] = dist.version
  return sorted(seen.items())


def _distribution_files(name: str, max_files: int) -> List[SourceFile]:
  dist = importlib.metadata.distribution(name)
  candidates = []
  for entry in dist.files or ():
    relative = str(entry)
    if ".." in relative.split("/") or _is_test_path(relative):
      continue
    module = _module_name(relative)
    if module is None:
      continue
    path = str(dist.locate_file(entry))
    if os.path.isfile(path):
      candidates.append(SourceFile(name, module, path))
  candidates.sort(key=lambda f: hashlib.sha256(
      f.module.encode("utf-8")).hexdigest())
  return sorted(candidates[:max_files], key=lambda f: f.module)


def list_source_files(max_files_per_package: int = DEFAULT_MAX_FILES_PER_PACKAGE,
                      include_stdlib: bool = True,
                      distributions: Optional[Sequence[str]] = None
                     ) -> List[SourceFile]:
  """The files scanned, in build order (stdlib, then distributions by name)."""
  files = _stdlib_files() if include_stdlib else []
  names = ([n for n, _ in scanned_distributions()] if distributions is None
           else sorted(distributions))
  for name in names:
    files.extend(_distribution_files(name, max_files_per_package))
  return files


# ---------------------------------------------------------- docstring walking

_DEFINITIONS = (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
# Blocks whose definitions belong to the enclosing scope.
_BLOCKS = (ast.If, ast.Try, ast.With, ast.AsyncWith, ast.For, ast.While)


def _definitions(node):
  """Classes and functions defined directly in `node`'s scope, in order."""
  for child in ast.iter_child_nodes(node):
    if isinstance(child, _DEFINITIONS):
      yield child
    elif isinstance(child, _BLOCKS + (ast.ExceptHandler,)):
      yield from _definitions(child)


def documented_objects(source: bytes, module: str
                      ) -> Iterable[Tuple[str, str]]:
  """(dotted name, docstring) of the module, its classes and functions.

  Breadth-first from the module; definitions inside `if`/`try`/`with` blocks
  count as definitions of the enclosing scope.
  """
  tree = ast.parse(source)
  queue = collections.deque([(tree, module)])
  while queue:
    node, name = queue.popleft()
    docstring = ast.get_docstring(node, clean=True)
    if docstring:
      yield name, docstring
    for child in _definitions(node):
      queue.append((child, f"{name}.{child.name}"))


def split_of(client_id: str) -> str:
  """The split of a client: sha256 of its id, 10% heldout, 10% test."""
  bucket = int(hashlib.sha256(client_id.encode("utf-8")).hexdigest(), 16) % 10
  return "heldout" if bucket == 0 else "test" if bucket == 1 else "train"


def _file_docstrings(path: str, module: str, min_words: int,
                     max_file_bytes: int):
  """(status, [(client_id, sentences)]) of one source file."""
  try:
    if os.path.getsize(path) > max_file_bytes:
      return "files_too_large", []
    with open(path, "rb") as f:
      source = f.read()
    return "files_parsed", [
        (name, docstring_sentences(docstring, min_words))
        for name, docstring in documented_objects(source, module)]
  except (SyntaxError, ValueError, OSError, RecursionError, MemoryError):
    return "files_unparsable", []


def collect_clients(files: Sequence[SourceFile],
                    min_sentences_per_client: int = DEFAULT_MIN_SENTENCES_PER_CLIENT,
                    min_words_per_sentence: int = DEFAULT_MIN_WORDS_PER_SENTENCE,
                    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
                    progress: bool = True, client_unit: str = "object"):
  """Returns ({client_id: [sentence]} in build order, stats dict).

  ``client_unit``: "object" (a client per documented object) or "module" (a
  client per source module, its qualifying docstrings in source order).

  Runs in this process (no worker processes: a spawned worker would re-run
  an unguarded `__main__` of the caller, and forking a process that holds
  TensorFlow's threads is unsafe).
  """
  clients = collections.OrderedDict()
  seen_texts = set()
  stats = collections.Counter()
  for source_file in tqdm.tqdm(files, desc="pydocs: parsing docstrings",
                               unit="file", disable=not progress,
                               file=sys.stderr):
    status, objects = _file_docstrings(
        source_file.path, source_file.module, min_words_per_sentence,
        max_file_bytes)
    stats[status] += 1
    for client_id, sentences in objects:
      stats["docstrings"] += 1
      if len(sentences) < min_sentences_per_client:
        stats["docstrings_too_short"] += 1
        continue
      text_key = hashlib.sha256("\n".join(sentences).encode()).digest()
      if text_key in seen_texts:
        stats["docstrings_duplicate"] += 1
        continue
      seen_texts.add(text_key)
      if client_unit == "module":
        client_id = source_file.module
      if client_id in clients:  # E.g. a function defined in two branches.
        clients[client_id].extend(sentences)
      else:
        clients[client_id] = sentences
  return clients, dict(stats)


# -------------------------------------------------------------- build / load

def build_options(max_files_per_package: int = DEFAULT_MAX_FILES_PER_PACKAGE,
                  min_sentences_per_client: int = DEFAULT_MIN_SENTENCES_PER_CLIENT,
                  min_words_per_sentence: int = DEFAULT_MIN_WORDS_PER_SENTENCE,
                  max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
                  include_stdlib: bool = True,
                  distributions: Optional[Sequence[str]] = None,
                  client_unit: str = "object") -> dict:
  """Validated build options (the keys of the fingerprint's `options`)."""
  if client_unit not in CLIENT_UNITS:
    raise ValueError(f"client_unit must be one of {', '.join(CLIENT_UNITS)}, got "
                     f"{client_unit!r}.")
  for name, value in (("max_files_per_package", max_files_per_package),
                      ("min_sentences_per_client", min_sentences_per_client),
                      ("min_words_per_sentence", min_words_per_sentence),
                      ("max_file_bytes", max_file_bytes)):
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
      raise ValueError(f"{name} must be a positive integer, got {value!r}.")
  if distributions is not None:
    installed = dict(scanned_distributions())
    unknown = sorted(set(distributions) - set(installed))
    if unknown:
      raise ValueError(f"distributions not installed (or excluded): {unknown}.")
    distributions = sorted(distributions)
  options = dict(max_files_per_package=max_files_per_package,
              min_sentences_per_client=min_sentences_per_client,
              min_words_per_sentence=min_words_per_sentence,
              max_file_bytes=max_file_bytes, include_stdlib=include_stdlib,
              distributions=distributions)
  if client_unit != "object":  # the default keeps the fingerprint of earlier builds
    options["client_unit"] = client_unit
  return options


def fingerprint(options: dict) -> Tuple[str, dict]:
  """(sha256 hex, the hashed description) of the sources and options."""
  installed = scanned_distributions()
  if options["distributions"] is not None:
    installed = [(n, v) for n, v in installed if n in options["distributions"]]
  description = dict(
      builder_version=BUILDER_VERSION,
      python=f"{platform.python_implementation()} {platform.python_version()}",
      stdlib=options["include_stdlib"],
      distributions=[f"{n}=={v}" for n, v in installed],
      options={k: v for k, v in options.items() if k != "distributions"})
  digest = hashlib.sha256(json.dumps(description, sort_keys=True).encode())
  return digest.hexdigest(), description



def _serialize(sentence: str) -> bytes:
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  return tf.train.Example(features=tf.train.Features(feature={
      "tokens": tf.train.Feature(bytes_list=tf.train.BytesList(
          value=[sentence.encode("utf-8")]))})).SerializeToString()


def _write_sqlite(path: str, clients, progress: bool) -> dict:
  """Writes the SqlClientData database; returns per-split counts and digest."""
  counts = {s: dict(clients=0, sentences=0) for s in SPLITS}
  content = hashlib.sha256()
  connection = sqlite3.connect(path)
  with connection:
    sqlite_format.create_tables(connection)
    for client_id, sentences in tqdm.tqdm(
        clients.items(), desc="pydocs: writing clients", unit="client",
        disable=not progress, file=sys.stderr):
      split = split_of(client_id)
      connection.executemany(
          "INSERT INTO examples (split_name, client_id, "
          "serialized_example_proto) VALUES (?, ?, ?);",
          [(split, client_id, _serialize(s)) for s in sentences])
      connection.execute(
          "INSERT INTO client_metadata (client_id, split_name, num_examples) "
          "VALUES (?, ?, ?);", (client_id, split, len(sentences)))
      counts[split]["clients"] += 1
      counts[split]["sentences"] += len(sentences)
      content.update(json.dumps([split, client_id, sentences]).encode())
      content.update(b"\n")
    connection.execute("CREATE INDEX examples_client ON examples (client_id);")
  connection.close()
  return dict(counts=counts, content_sha256=content.hexdigest())


def word_counts(clients, split: str = "train") -> List[Tuple[str, int]]:
  """[(word, count)] over the clients of `split`, by count desc then word."""
  counts = collections.Counter()
  for client_id, sentences in clients.items():
    if split_of(client_id) == split:
      for sentence in sentences:
        counts.update(sentence.split())
  return sorted(counts.items(), key=lambda item: (-item[1], item[0]))


@dataclasses.dataclass(frozen=True)
class BuiltPydocs:
  directory: str
  sqlite_path: str
  word_count_path: str
  metadata: dict
  cache_hit: bool


def build(cache_dir: Optional[str] = None, *, force: bool = False,
          progress: bool = True, **options) -> BuiltPydocs:
  """Builds (or finds) the cached dataset; returns its paths and metadata.

  Options: see `build_options`. A cached copy with the same fingerprint is
  verified and reused unless `force`.
  """
  options = build_options(**options)
  key, description = fingerprint(options)
  cache_dir = os.path.abspath(os.path.expanduser(
      cache_dir or default_cache_dir()))
  directory = os.path.join(cache_dir, key[:20])
  if os.path.isdir(directory) and not force:
    return _verify(directory, key, cache_hit=True)
  start = time.time()
  os.makedirs(cache_dir, exist_ok=True)
  tmp_dir = f"{directory}.tmp-{os.getpid()}"
  shutil.rmtree(tmp_dir, ignore_errors=True)
  os.makedirs(tmp_dir)
  try:
    files = list_source_files(options["max_files_per_package"],
                              options["include_stdlib"],
                              options["distributions"])
    clients, stats = collect_clients(
        files, options["min_sentences_per_client"],
        options["min_words_per_sentence"], options["max_file_bytes"],
        progress, options.get("client_unit", "object"))
    written = _write_sqlite(os.path.join(tmp_dir, SQLITE_FILENAME), clients,
                            progress)
    with open(os.path.join(tmp_dir, WORD_COUNT_FILENAME), "w",
              encoding="utf-8") as f:
      for word, count in word_counts(clients, "train"):
        f.write(f"{word} {count}\n")
    files_per_package = collections.Counter(f.package for f in files)
    metadata = dict(
        fingerprint=key, source=description,
        files_per_package=dict(sorted(files_per_package.items())),
        stats=stats, splits=written["counts"],
        num_clients=len(clients), content_sha256=written["content_sha256"],
        sqlite_sha256=file_sha256(os.path.join(tmp_dir, SQLITE_FILENAME)),
        word_count_sha256=file_sha256(
            os.path.join(tmp_dir, WORD_COUNT_FILENAME)),
        build_seconds=round(time.time() - start, 2))
    with open(os.path.join(tmp_dir, METADATA_FILENAME), "w",
              encoding="utf-8") as f:
      json.dump(metadata, f, indent=1, sort_keys=True)
    if force and os.path.isdir(directory):
      shutil.rmtree(directory)
    try:
      os.rename(tmp_dir, directory)
    except OSError:
      if not os.path.isdir(directory):
        raise
      # Another process finished the same build first; its copy is identical.
      shutil.rmtree(tmp_dir, ignore_errors=True)
      return _verify(directory, key, cache_hit=True)
  except BaseException:
    shutil.rmtree(tmp_dir, ignore_errors=True)
    raise
  if progress:
    print(f"pydocs: built {metadata['num_clients']} clients from "
          f"{stats.get('files_parsed', 0)} files in "
          f"{metadata['build_seconds']:.1f} s -> {directory}", file=sys.stderr)
  return _verify(directory, key, cache_hit=False)


def _verify(directory: str, key: str, cache_hit: bool) -> BuiltPydocs:
  metadata_path = os.path.join(directory, METADATA_FILENAME)
  # One remedy for every caller: the training binary has no --force for its dataset.
  remedy = f"delete {directory} to rebuild it (force=True from Python)."
  try:
    with open(metadata_path, encoding="utf-8") as f:
      metadata = json.load(f)
  except (OSError, ValueError) as e:
    raise PydocsCacheError(
        f"{metadata_path} is missing or not valid JSON ({e}); {remedy}") from e
  if metadata.get("fingerprint") != key:
    raise PydocsCacheError(
        f"{metadata_path} has fingerprint {metadata.get('fingerprint')!r}, "
        f"expected {key!r}; {remedy}")
  paths = dict(sqlite_sha256=os.path.join(directory, SQLITE_FILENAME),
               word_count_sha256=os.path.join(directory, WORD_COUNT_FILENAME))
  for field, path in paths.items():
    if not os.path.isfile(path):
      raise PydocsCacheError(f"{path} is missing; {remedy}")
    actual = file_sha256(path)
    if actual != metadata.get(field):
      raise PydocsCacheError(
          f"{path} has sha256 {actual}, but {metadata_path} records "
          f"{metadata.get(field)}: the file is corrupt; {remedy}")
  return BuiltPydocs(directory=directory,
                     sqlite_path=paths["sqlite_sha256"],
                     word_count_path=paths["word_count_sha256"],
                     metadata=metadata, cache_hit=cache_hit)


@dataclasses.dataclass(frozen=True)
class LoadedPydocs:
  train: object    # tff.simulation.datasets.ClientData, examples {"tokens"}.
  heldout: object
  test: object
  vocab: list      # All train-split words, most frequent first.
  metadata: dict
  directory: str


def load(cache_dir: Optional[str] = None, *, force: bool = False,
         progress: bool = True, **options) -> LoadedPydocs:
  """Builds or reuses the cached dataset and opens its three splits."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
  built = build(cache_dir, force=force, progress=progress, **options)
  feature_spec = {"tokens": tf.io.FixedLenFeature([], tf.string)}

  def parse(dataset):
    return dataset.map(lambda proto: tf.io.parse_single_example(
        proto, feature_spec))

  splits = {split: tff.simulation.datasets.SqlClientData(
      built.sqlite_path, split).preprocess(parse) for split in SPLITS}
  try:
    vocab = list(word_counts_lib.read_word_counts(built.word_count_path).keys())
  except word_counts_lib.DatasetUnavailableError as e:
    raise PydocsCacheError(str(e)) from e
  return LoadedPydocs(train=splits["train"], heldout=splits["heldout"],
                      test=splits["test"], vocab=vocab,
                      metadata=built.metadata, directory=built.directory)


def build_parser():
  """The parser of ``python -m stackoverflow.pydocs`` (the vocabulary of every tool)."""
  from tff_mf import clitools  # pylint: disable=g-import-not-at-top
  parser = clitools.ArgumentParser(
      prog="python -m stackoverflow.pydocs",
      description="Build the docstring dataset and print where it is.")
  parser.add_argument("--data_dir", default=None,
                      help="the docstring-dataset cache, as training's --data_dir (default: "
                           "$TFF_MF_CACHE/datasets/pydocs)")
  parser.add_argument("--force", action="store_true",
                      help="rebuild even if a verified copy exists (default: off)")
  parser.add_argument("--max_files_per_package", type=int,
                      default=DEFAULT_MAX_FILES_PER_PACKAGE,
                      help="source files read per installed package")
  clitools.add_progress_flags(parser, what="progress bars on stderr (parsing, writing)")
  return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
  """`python -m stackoverflow.pydocs`: build (or verify) the cached dataset."""
  args = build_parser().parse_args(argv)
  try:
    built = build(args.data_dir, force=args.force, progress=args.progress,
                  max_files_per_package=args.max_files_per_package)
  except PydocsCacheError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  meta = built.metadata
  print(json.dumps(dict(
      directory=built.directory, cache_hit=built.cache_hit,
      fingerprint=meta["fingerprint"], num_clients=meta["num_clients"],
      splits=meta["splits"], content_sha256=meta["content_sha256"],
      build_seconds=meta["build_seconds"]), indent=1))
  return 0


if __name__ == "__main__":
  sys.exit(main())
