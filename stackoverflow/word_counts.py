"""Word-count files ("word count" lines, most frequent first) and the missing-data error.

Shared by ``stackoverflow.data`` (TFF's StackOverflow word counts) and
``stackoverflow.pydocs`` (the docstring dataset's own counts), so that neither
imports the other for them. No TensorFlow.
"""

from __future__ import annotations

import collections
from typing import Optional


class DatasetUnavailableError(RuntimeError):
  """A dataset's files are missing or unreadable; the message says what to do."""


def read_word_counts(path: str, vocab_size: Optional[int] = None
                    ) -> "collections.OrderedDict[str, int]":
  """Reads a word-count file ("word count" lines, top first); at most ``vocab_size`` words."""
  counts = collections.OrderedDict()
  with open(path, encoding="utf-8") as f:
    for line_number, line in enumerate(f, start=1):
      parts = line.split()
      if len(parts) != 2 or not parts[1].lstrip("-").isdigit():
        raise DatasetUnavailableError(
            f"{path}:{line_number}: expected 'word count', got {line!r}; the "
            "word-count file is corrupt.")
      counts[parts[0]] = int(parts[1])
      if vocab_size is not None and len(counts) >= vocab_size:
        break
  return counts
