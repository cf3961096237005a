"""The numpy adapter of ``examples/numpy_federated.py``, loaded for the tests (numpy only)."""

import importlib.util
import os

import userenv

_spec = importlib.util.spec_from_file_location(
    "numpy_federated", os.path.join(userenv.REPO, "examples", "numpy_federated.py"))
numpy_federated = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(numpy_federated)
