"""pfl's FedAvg per client update, without DP and with its banded MF mechanism (the peer).

Usage (a benchmark-only interpreter with pfl and torch, e.g. .venv-bench-pfl):
  .venv-bench-pfl/bin/python benchmarks/peer_pfl.py --json OUT [--rounds 10] [--clients 8]
``benchmarks/bench_engine.py --pfl-python PYTHON`` runs it and puts its figures beside the
compiled engine's. Imports neither TensorFlow nor this project.

The model: the main job's LSTM in PyTorch (embedding 16, LSTM 32, projection 16, output
1,004 classes: 40,060 parameters, against 39,932 in Keras: torch's LSTM has two bias
vectors), softmax cross-entropy. The round: pfl's ``FederatedAveraging`` on its
``SimulatedBackend``, ``--clients`` clients a round, each one epoch of SGD at learning rate
0.5 over its batches of 16 (5 sentences of 20 next-token pairs, random token ids with a
fixed seed, as bench_engine's), summed, then the central SGD step. With DP: pfl's
``BandedMatrixFactorizationMechanism`` (Choquette-Choo et al. 2023, arXiv:2306.08153) over
48 iterations, minimum separation 4 (its factorization computed once before the timing),
applied centrally (``CentrallyAppliedPrivacyMechanism``: each update clipped to norm 1, the
correlated noise added to the sum once a round). CPU seconds of this process per round,
divided by the clients: the median of ``--rounds`` rounds after one warm-up round.
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

ITERATIONS = 48
MIN_SEPARATION = 4
BATCH = 16
LR = 0.5
SIZES = dict(vocab=1004, embedding=16, lstm=32, projection=16, sentences=5, length=21)


def _model():
  import torch  # pylint: disable=g-import-not-at-top

  class Lstm(torch.nn.Module):
    """The main job's next-word LSTM (``stackoverflow/model.py``'s sizes)."""

    def __init__(self):
      super().__init__()
      self.embedding = torch.nn.Embedding(SIZES["vocab"], SIZES["embedding"])
      self.lstm = torch.nn.LSTM(SIZES["embedding"], SIZES["lstm"], batch_first=True)
      self.projection = torch.nn.Linear(SIZES["lstm"], SIZES["projection"])
      self.output = torch.nn.Linear(SIZES["projection"], SIZES["vocab"])

    def forward(self, x):
      h, _ = self.lstm(self.embedding(x))
      return self.output(self.projection(h))

    def loss(self, x, y, eval=False):  # pylint: disable=redefined-builtin
      self.eval() if eval else self.train()  # pylint: disable=expression-not-assigned
      logits = self(x)
      return torch.nn.functional.cross_entropy(logits.reshape(-1, SIZES["vocab"]),
                                               y.reshape(-1))

    @torch.no_grad()
    def metrics(self, x, y, eval=True):  # pylint: disable=redefined-builtin
      from pfl.metrics import Weighted  # pylint: disable=g-import-not-at-top
      loss = self.loss(x, y, eval=eval).item()
      return {"loss": Weighted(loss * y.numel(), y.numel())}
  torch.manual_seed(0)
  return Lstm()


def _data(users: int):
  import numpy as np  # pylint: disable=g-import-not-at-top
  import torch  # pylint: disable=g-import-not-at-top
  from pfl.data.dataset import Dataset  # pylint: disable=g-import-not-at-top
  from pfl.data.federated_dataset import FederatedDataset  # pylint: disable=g-import-not-at-top
  from pfl.data.sampling import get_user_sampler  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(0)
  ids = {u: torch.as_tensor(rng.integers(1, SIZES["vocab"],
                                         size=(SIZES["sentences"], SIZES["length"])))
         for u in range(users)}
  make = lambda u: Dataset(raw_data=[ids[u][:, :-1], ids[u][:, 1:]], user_id=str(u))
  return FederatedDataset(make, get_user_sampler("minimize_reuse", list(range(users))))


class _Accountant:
  """The one attribute pfl's banded mechanism reads of an accountant: z (not calibrated)."""
  cohort_noise_parameter = 1.0


def _run(private: bool, rounds: int, clients: int):
  """CPU seconds of each round after the first (pfl's FederatedAveraging)."""
  import torch  # pylint: disable=g-import-not-at-top
  from pfl.aggregate.simulate import SimulatedBackend  # pylint: disable=g-import-not-at-top
  from pfl.algorithm import FederatedAveraging, NNAlgorithmParams  # pylint: disable=g-import-not-at-top
  from pfl.callback.base import TrainingProcessCallback  # pylint: disable=g-import-not-at-top
  from pfl.hyperparam import NNTrainHyperParams  # pylint: disable=g-import-not-at-top
  from pfl.metrics import Metrics  # pylint: disable=g-import-not-at-top
  from pfl.model.pytorch import PyTorchModel  # pylint: disable=g-import-not-at-top
  from pfl.privacy import CentrallyAppliedPrivacyMechanism  # pylint: disable=g-import-not-at-top
  from pfl.privacy.ftrl_mechanism import BandedMatrixFactorizationMechanism  # pylint: disable=g-import-not-at-top
  postprocessors = []
  if private:
    mechanism = BandedMatrixFactorizationMechanism(
        clipping_bound=1.0, num_iterations=ITERATIONS, min_separation=MIN_SEPARATION,
        make_privacy_accountant=lambda _: _Accountant())
    postprocessors = [CentrallyAppliedPrivacyMechanism(mechanism)]
  marks = []

  class Clock(TrainingProcessCallback):
    def after_central_iteration(self, aggregate_metrics, model, *, central_iteration):
      marks.append(time.process_time())
      return False, Metrics()

  module = _model()
  model = PyTorchModel(module, local_optimizer_create=torch.optim.SGD,
                       central_optimizer=torch.optim.SGD(module.parameters(), lr=1.0))
  data = _data(max(64, clients * (rounds + 1)))
  backend = SimulatedBackend(training_data=data, val_data=data,
                             postprocessors=postprocessors)
  params = NNAlgorithmParams(central_num_iterations=rounds + 1,
                             evaluation_frequency=10**6, train_cohort_size=clients,
                             val_cohort_size=None)
  train = NNTrainHyperParams(local_num_epochs=1, local_learning_rate=LR,
                             local_batch_size=BATCH)
  start = time.process_time()
  FederatedAveraging().run(algorithm_params=params, backend=backend, model=model,
                           model_train_params=train, callbacks=[Clock()],
                           send_metrics_to_platform=False)
  ends = [start] + marks
  return [b - a for a, b in zip(ends, ends[1:])][1:]


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--rounds", type=int, default=10)
  parser.add_argument("--clients", type=int, default=8)
  parser.add_argument("--threads", type=int, default=1, help="torch's threads")
  parser.add_argument("--json", required=True, help="where the figures go")
  args = parser.parse_args(argv)
  import torch  # pylint: disable=g-import-not-at-top
  import pfl  # pylint: disable=g-import-not-at-top
  torch.set_num_threads(args.threads)
  os.chdir(tempfile.mkdtemp(prefix="peer_pfl_"))  # pfl saves its factorization here
  out = {"versions": f"pfl {pfl.__version__}, torch {torch.__version__}",
         "threads": args.threads, "rounds_cpu_s": {}, "per_client_cpu_s": {}}
  for name, private in (("none", False), ("banded", True)):
    cpu = _run(private, args.rounds, args.clients)
    out["rounds_cpu_s"][name] = cpu
    out["per_client_cpu_s"][name] = statistics.median(cpu) / args.clients
    print(f"[peer_pfl] {name}: {out['per_client_cpu_s'][name] * 1e3:.2f} ms a client update",
          file=sys.stderr, flush=True)
  with open(args.json, "w", encoding="utf-8") as f:
    json.dump(out, f, indent=1)
  return 0


if __name__ == "__main__":
  sys.exit(main())
