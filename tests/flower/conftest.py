"""Fixtures of the Flower tests that drive a wrapper's rounds directly (no simulation engine)."""

import pytest
from flwr.supercore.task_identity import TaskIdentity


@pytest.fixture
def flower_task():
  """The run, node and task ids Flower stamps messages with (a real run's engine sets them)."""
  names = ("_run_id", "_node_id", "_task_id")
  previous = [getattr(TaskIdentity, n) for n in names]
  TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 1
  yield
  for name, value in zip(names, previous):
    setattr(TaskIdentity, name, value)
