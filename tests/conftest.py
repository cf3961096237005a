"""Shared test configuration.

Every test session stops the TFF ``worker_binary`` helper servers its tests
started and disarms TFF's noisy ServiceManager finalizer (TFF 0.87 leaves the
servers running at exit; see ``tff_mf.tf.runtime``).
"""

import os

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
