"""The ServerApp: FedAvg wrapped by tff-mf's MatrixFactorizationFixedClipping (BLT noise by
default), with Flower's own PrivacyConfig: ε is logged after every round, ``max-epsilon``
stops the run before the release that would pass it, and ``state-path`` resumes a stopped
run from its last round. A refusal of the wrapper (more rounds than ``total-rounds`` has left,
a state file it cannot trust) ends the run with one logged line, before round 1."""

import importlib.metadata
import os
from logging import INFO, WARNING

import numpy as np
from flwr.app import ArrayRecord, Context
from flwr.serverapp import Grid, NeighboringRelation, PrivacyConfig, SamplingMethod, ServerApp
from flwr.serverapp.exception import PrivacyBudgetExhausted
from flwr.serverapp.strategy import FedAvg
from flwr.supercore import log

import tff_mf
from . import task
from tff_mf import participation
from tff_mf.flower import strategy as mf

app = ServerApp()


@app.main()
@mf.stops_cleanly
def main(grid: Grid, context: Context) -> None:
  """Runs ``num-server-rounds`` rounds; writes the last released model to ``model-path``."""
  cfg = context.run_config
  log(INFO, "tff-mf %s from %s", importlib.metadata.version("tff-mf"),
      os.path.dirname(tff_mf.__file__))
  max_epsilon = float(cfg["max-epsilon"]) or None
  state_path = str(cfg["state-path"]) or None
  strategy = mf.MatrixFactorizationFixedClipping(
      FedAvg(fraction_train=1.0, fraction_evaluate=0.0), str(cfg["mechanism"]),
      total_rounds=int(cfg["total-rounds"]), clipping_norm=float(cfg["clipping-norm"]),
      num_sampled_clients=int(cfg["num-sampled-clients"]),
      target_epsilon=float(cfg["target-epsilon"]), delta=float(cfg["delta"]),
      momentum=float(cfg["momentum"]), server_learning_rate=float(cfg["server-learning-rate"]),
      participation=participation.fixed_epoch(int(cfg["epochs"])), state_path=state_path,
      privacy_config=PrivacyConfig(
          target_delta=float(cfg["delta"]), population_size=int(cfg["population"]),
          neighboring_relation=NeighboringRelation.ADD_OR_REMOVE_ONE,
          sampling_method=SamplingMethod.NO_AMPLIFICATION, max_epsilon=max_epsilon))
  # A resumed run continues from the model its state file holds (the last release).
  resumed = state_path is not None and os.path.exists(state_path)
  start = ([mf.saved_model(state_path)["0"]] if resumed
           else [np.zeros(task.TRUE_W.size, np.float32)])
  try:
    result = strategy.start(grid=grid, initial_arrays=ArrayRecord(start),
                            num_rounds=int(cfg["num-server-rounds"]))
    final = result.arrays
  except PrivacyBudgetExhausted as e:
    log(WARNING, "Stopped by max_epsilon after %d rounds: %s", strategy.rounds_done, e)
    final = strategy.current_arrays  # the last released model
  w = final.to_numpy_ndarrays()[0]
  log(INFO, "Final model after %d of %d rounds: held-out loss %.4f, epsilon %.4f",
      strategy.rounds_done, strategy.spec.n, task.held_out_loss(w), strategy.epsilon())
  if cfg["model-path"]:
    np.savez(str(cfg["model-path"]), w=w, rounds_done=strategy.rounds_done)
