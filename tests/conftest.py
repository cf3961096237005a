"""Shared test configuration.

Every test session stops the TFF ``worker_binary`` helper servers its tests
started (TFF 0.87 leaves them running at exit; see ``tff_mf.tf.runtime``).
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def pytest_sessionfinish(session, exitstatus):
  del session, exitstatus
  import sys  # pylint: disable=g-import-not-at-top
  if "tensorflow_federated" in sys.modules:
    from tff_mf.tf import runtime  # pylint: disable=g-import-not-at-top
    runtime.stop_worker_binaries()
