"""A tiny numpy federation run in Flower's simulation engine (helpers of the Flower tests).

Each client's "training" returns the model it got moved by ``update(node_id, array)`` (zero
unless a test gives one; the ClientApps run in Ray's worker processes, so an update depends
only on its arguments), so the released iterates are the wrapper's output exactly. ``run``
records the model after every round.
"""

from __future__ import annotations

from typing import Callable, Dict, List

import numpy as np
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp
from flwr.simulation import run_simulation

MODEL_KEY = "arrays"


def client_app(update: Callable[[int, np.ndarray], np.ndarray], mods=()) -> ClientApp:
  """A ClientApp whose training adds ``update(node_id, array)`` to each array it gets
  (``mods``: Flower's client-side modifiers)."""
  app = ClientApp(mods=list(mods))

  @app.train()
  def train(msg: Message, context: Context) -> Message:
    arrays = msg.content["arrays"].to_numpy_ndarrays()
    node = int(context.node_id)
    new = [a + update(node, a).astype(a.dtype).reshape(a.shape) for a in arrays]
    content = RecordDict({"arrays": ArrayRecord(new),
                          "metrics": MetricRecord({"num-examples": 1})})
    return Message(content=content, reply_to=msg)

  return app


# What the last ``run`` recorded (kept when the run raised).
LAST: Dict[str, object] = {}


def run(make_strategy: Callable[[], object], shapes: List[tuple], rounds: int,
        num_clients: int, update=lambda p, a: np.zeros_like(a), initial=None,
        record: bool = True, mods=()) -> Dict[str, object]:
  """Runs ``rounds`` rounds in Flower's simulation engine; returns (and keeps in ``LAST``)
  the strategy and the model (flat float64) after round 0..rounds."""
  del record
  out: Dict[str, object] = {"models": []}
  LAST.clear()
  LAST.update(out)
  out = LAST
  server = ServerApp()

  @server.main()
  def main(grid: Grid, context: Context) -> None:
    del context
    strategy = make_strategy()
    out["strategy"] = strategy
    arrays = ([np.zeros(s, np.float32) for s in shapes] if initial is None
              else [np.asarray(a, np.float32) for a in initial])
    initial_record = ArrayRecord(arrays)

    def evaluate(round_num, arrays):
      del round_num
      out["models"].append(np.concatenate([a.ravel().astype(np.float64)
                                           for a in arrays.to_numpy_ndarrays()]))
      return None

    try:
      strategy.start(grid=grid, initial_arrays=initial_record, num_rounds=rounds, evaluate_fn=evaluate)
    except Exception as e:  # the engine logs and swallows errors: hand them to the test
      out["error"] = e

  run_simulation(server_app=server, client_app=client_app(update, mods), num_supernodes=num_clients,
                 backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0},
                                 "init_args": {"num_cpus": 1, "include_dashboard": False}})
  if "error" in out:
    raise out["error"]
  return out
