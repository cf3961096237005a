"""Shared test configuration and fixtures.

Every test session stops the TFF ``worker_binary`` helper servers its tests
started and disarms TFF's noisy ServiceManager finalizer (TFF 0.87 leaves the
servers running at exit; see ``tff_mf.tf.runtime``).

The fixtures build what many test files train on, once: ``tiny_config`` (TrainingConfigs
of the tiny model), ``tiny_task`` (the task of a config, built once a session) and
``tiny_stackoverflow`` (a tiny StackOverflow copy, written once a session and only read;
a test that writes into its data writes its own copy).
"""

import inspect
import os

import pytest

import userenv

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
# Tests never write into the user's matrix/dataset cache (~/.cache/tff_mf):
# they share one under .pytest_cache/, which is reused between runs (subprocesses get the
# same through userenv.env()).
os.environ["TFF_MF_CACHE"] = userenv.CACHE


def pytest_runtest_setup(item):
  """Once a test has imported TFF: its ServiceManager signals only live children
  (tff_mf.tf.runtime.guard_service_manager_signals), never a reused pid in this worker."""
  del item
  import sys  # pylint: disable=g-import-not-at-top
  if "tensorflow_federated" in sys.modules:
    from tff_mf.tf import runtime  # pylint: disable=g-import-not-at-top
    runtime.guard_service_manager_signals()


def pytest_sessionfinish(session, exitstatus):
  del session, exitstatus
  import sys  # pylint: disable=g-import-not-at-top
  if "tensorflow_federated" in sys.modules:
    from tff_mf.tf import runtime  # pylint: disable=g-import-not-at-top
    runtime.shutdown_tff_runtime()


# The tiny model most training tests use (seconds per round on one CPU core).
TINY_MODEL = dict(dataset="synthetic", vocab_size=50, embedding_size=4, lstm_size=4,
                  projection_size=4, max_validation_elements=16, max_test_elements=16)
# What ``training.task.build_task`` reads from a config: configs that agree on these share
# one task.
TASK_FIELDS = ("dataset", "data_dir", "pydocs_stdlib", "vocab_size",
               "max_validation_elements", "max_test_elements", "sequence_length",
               "max_elements_per_client",
               "client_batch_size", "num_oov_buckets", "embedding_size", "lstm_size",
               "projection_size", "lstm_kernel")


class TinyConfigs:
  """Builds fresh TrainingConfigs of ``TINY_MODEL`` without progress bars:
  ``configs(root, **overrides)`` writes under ``root``; ``configs.using(**defaults)`` is a
  builder with a test file's own defaults (``cache_subdir``: ``cache_dir`` under root)."""

  def __init__(self, defaults):
    self._defaults = dict(defaults)

  def using(self, **defaults) -> "TinyConfigs":
    return TinyConfigs(dict(self._defaults, **defaults))

  def flags(self):
    """The defaults as the training binary's flags (``--name=value``)."""
    return [f"--{k}={v}" for k, v in self._defaults.items()
            if k not in ("progress", "cache_subdir")]

  def __call__(self, root=None, **overrides):
    from training import config as config_lib  # pylint: disable=g-import-not-at-top
    values = dict(self._defaults, **overrides)
    cache_subdir = values.pop("cache_subdir", None)
    if root is not None:
      values.setdefault("root_output_dir", str(root))
      if cache_subdir is not None:
        values.setdefault("cache_dir", os.path.join(str(root), cache_subdir))
    return config_lib.TrainingConfig(**values)


@pytest.fixture(scope="session")
def tiny_config():
  """A ``TinyConfigs``: ``tiny_config(root, **overrides)``, ``tiny_config.using(...)``."""
  return TinyConfigs(dict(TINY_MODEL, progress=False))


@pytest.fixture(scope="session")
def tiny_task():
  """``tiny_task(config)``: ``training.task.build_task(config)``, built once a session for
  the config's ``TASK_FIELDS`` (a task is read, never changed, by the tests)."""
  from training import task as task_lib  # pylint: disable=g-import-not-at-top
  built = {}

  def make(config):
    key = tuple(getattr(config, f) for f in TASK_FIELDS)
    if key not in built:
      built[key] = task_lib.build_task(config)
    return built[key]
  return make


@pytest.fixture(scope="session")
def tiny_stackoverflow(tmp_path_factory):
  """``tiny_stackoverflow(**options)``: the directory of a tiny StackOverflow copy
  (``stackoverflow.fixtures.write_tiny_stackoverflow`` options), written once a session;
  tests only read it."""
  from stackoverflow import fixtures  # pylint: disable=g-import-not-at-top
  written = {}

  def make(**options):
    bound = inspect.signature(fixtures.write_tiny_stackoverflow).bind("", **options)
    bound.apply_defaults()  # the same copy however its options are spelled
    key = tuple((k, v) for k, v in bound.arguments.items() if k != "directory")
    if key not in written:
      written[key] = fixtures.write_tiny_stackoverflow(
          str(tmp_path_factory.mktemp("tiny_so")), **options)
    return written[key]
  return make



# tests/flower run in Flower's own environment (``make test-flower``: .venv-flower, whose flwr
# needs a protobuf TensorFlow 2.14 cannot share); an environment without flwr skips them.
def _has_flwr() -> bool:
  import importlib.util  # pylint: disable=g-import-not-at-top
  return importlib.util.find_spec("flwr") is not None


collect_ignore = [] if _has_flwr() else ["flower"]
