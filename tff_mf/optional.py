"""The package's extras: what ``pip install tff-mf`` leaves out, and the one line that says so.

``pip install tff-mf`` installs the numpy core (numpy, scipy, dp-accounting, tqdm) on any
Python >= 3.11. Three extras add the rest (setup.cfg's ``options.extras_require``):

- ``tff``: the TensorFlow Federated layer ``tff_mf.tf`` (TensorFlow 2.14, TFF 0.87 and
  TensorFlow Privacy 0.9, which exist for Python 3.11 only; see requirements/README.md);
- ``plot``: matplotlib, for ``tff-mf plot`` and ``tff-mf audit --plot``;
- ``flower``: Flower (flwr with its simulation engine), for the Flower layer
  ``tff_mf.flower.strategy`` (its own environment: flwr's protobuf cannot share
  TensorFlow 2.14's).

``require`` is the check a command runs before it starts work: a missing extra is one
``CheckError`` line naming the extra and the command that installs it, never an
ImportError traceback halfway through.
"""

from __future__ import annotations

import dataclasses
import importlib.util
from typing import Tuple

from tff_mf import checks


@dataclasses.dataclass(frozen=True)
class Extra:
  """One extra: the modules it provides and how a user installs it."""
  name: str
  what: str
  modules: Tuple[str, ...]
  install: str


EXTRAS = {
    "tff": Extra(
        "tff", "the TensorFlow extra",
        ("tensorflow", "tensorflow_federated", "tensorflow_privacy"),
        "pip install 'tff-mf[tff]' (Python 3.11), then pip install --no-deps "
        "tensorflow-federated==0.87.0 tensorflow-privacy==0.9.0; or `make venv` in a clone"),
    "plot": Extra("plot", "the plotting extra", ("matplotlib",), "pip install 'tff-mf[plot]'"),
    "flower": Extra(
        "flower", "the Flower extra", ("flwr",),
        "pip install '<a tff-mf wheel or clone>[flower]' in an environment without "
        "TensorFlow, or `make venv-flower` in a clone"),
}


def missing(name: str) -> Tuple[str, ...]:
  """The modules of extra ``name`` that cannot be imported here (found without importing)."""
  return tuple(m for m in EXTRAS[name].modules if importlib.util.find_spec(m) is None)


def message(name: str, user: str = "") -> str:
  """The line that says extra ``name`` is missing ("" when it is installed); ``user`` is what
  needs it (a flag such as ``--plot``; a command's own error prefix names the command)."""
  absent = missing(name)
  if not absent:
    return ""
  extra = EXTRAS[name]
  return (f"{user + ' ' if user else ''}needs {extra.what} ({', '.join(absent)} not "
          f"installed): {extra.install}")


def require(name: str, user: str = "") -> None:
  """Raises ``message`` as a ``CheckError`` when extra ``name`` is not installed."""
  line = message(name, user)
  if line:
    raise checks.CheckError(line)
