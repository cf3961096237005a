"""The task: a linear model y = x·w, 16 examples per client, squared loss."""

import numpy as np

TRUE_W = np.array([1.0, -2.0, 0.5, 3.0], np.float32)


def client_data(partition: int):
  """Client ``partition``'s 16 examples (a fixed generator per client: the data, not noise)."""
  rng = np.random.default_rng(1000 + partition)
  x = rng.normal(size=(16, TRUE_W.size)).astype(np.float32)
  return x, x @ TRUE_W + 0.1 * rng.normal(size=16).astype(np.float32)


def local_train(w: np.ndarray, partition: int, steps: int = 5, lr: float = 0.1) -> np.ndarray:
  """``steps`` steps of gradient descent on the client's squared loss."""
  x, y = client_data(partition)
  for _ in range(steps):
    w = w - lr * (2.0 / len(y)) * x.T @ (x @ w - y)
  return w.astype(np.float32)


def held_out_loss(w: np.ndarray) -> float:
  """Mean squared error of ``w`` on 256 held-out examples."""
  x = np.random.default_rng(1).normal(size=(256, TRUE_W.size))
  return float(np.mean((x @ (np.asarray(w, np.float64) - TRUE_W)) ** 2))
