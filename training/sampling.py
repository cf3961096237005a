"""Single-pass client sampling (Denisov et al. 2022, arXiv:2202.08312, Sec 5).

Each client is used at most once, so every user's data enters at most one round
(single participation, the setting of Denisov et al. Thm 4.1). No TensorFlow.
"""

from __future__ import annotations

from typing import Callable, List, Optional, Sequence, Tuple

import numpy as np

from training.config import TrainingError


class SinglePassSampler:
  """Each client at most once, in a permutation fixed by ``seed``.

  The permutation is recomputed from the seed; only ``cursor`` (the number of
  clients consumed, used or skipped) is state, so resuming restores the order.
  """

  def __init__(self, client_ids: Sequence[str], seed: int, cursor: int = 0):
    self.client_ids = sorted(client_ids)
    self.order = np.random.default_rng(seed).permutation(len(self.client_ids))
    self.cursor = int(cursor)

  def __len__(self) -> int:
    return len(self.client_ids)

  def next_round(self, count: int, load: Callable[[str], Optional[object]]
                 ) -> Tuple[List[str], List[object], int]:
    """The next ``count`` clients whose ``load(id)`` is not None (non-empty).

    Returns (client ids, their loaded datasets, number skipped as empty).
    """
    chosen, loaded, skipped = [], [], 0
    while len(chosen) < count:
      if self.cursor >= len(self.order):
        raise TrainingError(
            f"ran out of clients for a single pass: all {len(self.order)} training clients "
            f"are used ({skipped} skipped as empty this round) with {len(chosen)} of "
            f"{count} clients found for this round")
      client_id = self.client_ids[self.order[self.cursor]]
      self.cursor += 1
      value = load(client_id)
      if value is None:
        skipped += 1
      else:
        chosen.append(client_id)
        loaded.append(value)
    return chosen, loaded, skipped


def check_enough_clients(num_clients: int, total_rounds: int, clients_per_round: int) -> None:
  """Single pass needs total_rounds × clients_per_round distinct clients."""
  needed = total_rounds * clients_per_round
  if num_clients < needed:
    raise TrainingError(
        f"too few clients for a single pass: the dataset has {num_clients} training clients, "
        f"but --total_rounds={total_rounds} × --clients_per_round={clients_per_round} = "
        f"{needed} are needed (each client is used at most once)")
