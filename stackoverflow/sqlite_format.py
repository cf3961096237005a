"""TFF's ``SqlClientData`` on-disk format, as used by ``stackoverflow.sqlite``.

One table of serialized ``tf.train.Example`` protos per (split, client) and one
of per-client example counts; ``tff.simulation.datasets.SqlClientData`` and
TFF's StackOverflow loader read exactly this layout. Both the tiny test fixture
(``stackoverflow.fixtures``) and the docstring dataset (``stackoverflow.pydocs``)
write it, so the real loading path is what runs.
"""

import sqlite3

_CREATE_EXAMPLES = (
    "CREATE TABLE examples (split_name TEXT NOT NULL, client_id TEXT NOT "
    "NULL, serialized_example_proto BLOB NOT NULL);")
_CREATE_CLIENT_METADATA = (
    "CREATE TABLE client_metadata (client_id TEXT NOT NULL, split_name "
    "TEXT NOT NULL, num_examples INTEGER NOT NULL);")


def create_tables(connection: sqlite3.Connection) -> None:
  """Creates the ``examples`` and ``client_metadata`` tables of SqlClientData."""
  connection.execute(_CREATE_EXAMPLES)
  connection.execute(_CREATE_CLIENT_METADATA)
