"""A federated simulation in plain numpy on tff-mf's plan: the third adapter (no TF, no Flower).

Everything private comes from the plan (``tff_mf.plan``): the round's clients from the
schema's sampler, the clipping rule (a non-finite update zeroed and counted, a norm that
cannot overflow), the noise rows, the workload's momentum and learning rates, the state file
bound to the run (foreign, shared or older state refused), and ε after each round with a
stop before the release that would pass the budget. A client is a function from the model it
gets (a list of arrays) to the model it returns, or None when it drops out.

  .venv/bin/python examples/numpy_federated.py --mechanism blt --rounds 16 --max_epsilon 8
"""

from __future__ import annotations

import argparse
import sys
from typing import Callable, Dict, List, Optional, Sequence

import numpy as np

from tff_mf import checks
from tff_mf import clipping
from tff_mf import participation
from tff_mf import plan as plan_lib
from tff_mf import spec as spec_lib

Client = Callable[[List[np.ndarray]], Optional[Sequence[np.ndarray]]]


def simulate(spec: spec_lib.MechanismSpec, clients: Dict[str, Client],
             model: Sequence[np.ndarray], *, rounds: Optional[int] = None,
             max_epsilon: Optional[float] = None, state_path: Optional[str] = None,
             log: Callable[[str], None] = lambda line: None, **seeds) -> Dict[str, object]:
  """Runs ``rounds`` rounds (default: the spec's n, or what a state file left) of ``spec``.

  Returns the models released (the first is the one given, or the state file's), ε after
  each release, the zeroed updates per round and ``stopped`` (why it stopped early, or None).
  ``seeds``: ``noise_seed``, ``sampling_seed``, ``sampling_secret`` (None: OS entropy).
  """
  plan = plan_lib.build(spec, noise_seed_pinned=seeds.get("noise_seed") is not None)
  run = plan_lib.ServerRun(plan, state_path=state_path, **seeds)
  keys = [f"array_{t}" for t in range(len(model))]
  try:
    run.start(keys, list(model), sorted(clients))
    if run.rounds_done:
      model = [plan_lib.saved_model(state_path)[key] for key in keys]
    out = {"models": [list(model)], "epsilons": [], "zeroed": [], "stopped": None}
    for _ in range(plan.n - run.rounds_done if rounds is None else rounds):
      if plan.epsilons is not None and plan.would_exceed(max_epsilon, run.rounds_done):
        out["stopped"] = (f"the next release would pass max_epsilon={max_epsilon} (epsilon "
                          f"{plan.epsilon_after(run.rounds_done):.4f} after round "
                          f"{run.rounds_done})")
        break
      i, chosen = run.next_round()
      delta = plan_lib.update_fn(model)
      replies = [clients[c]([np.copy(a) for a in model]) for c in chosen]
      model, counts = run.release(model, [delta(r) for r in replies if r is not None])
      zeroed = counts[clipping.ZEROED_METRIC]
      out["models"].append(model)
      out["zeroed"].append(zeroed)
      if plan.epsilons is not None:
        out["epsilons"].append(plan.epsilon_after(i))
        log(f"round {i}: {len(chosen)} clients, {zeroed} zeroed, epsilon "
            f"{out['epsilons'][-1]:.4f} at delta {plan.record.delta:g}")
    return out
  finally:
    run.close()


def linear_clients(count: int, dim: int, lr: float = 0.5, seed: int = 0) -> Dict[str, Client]:
  """Clients with a noisy linear-regression shard each: one local gradient step on w."""
  rng = np.random.default_rng(seed)
  truth = rng.normal(size=dim)
  clients = {}
  for c in range(count):
    x = rng.normal(size=(8, dim))
    y = x @ truth + 0.1 * rng.normal(size=8)

    def train(model, x=x, y=y):
      w = model[0]
      return [w - lr * 2.0 * x.T @ (x @ w - y) / len(y)]
    clients[f"client_{c:03d}"] = train
  return clients


def main(argv: Optional[Sequence[str]] = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--mechanism", default="blt")
  parser.add_argument("--rounds", type=int, default=16)
  parser.add_argument("--clients", type=int, default=64)
  parser.add_argument("--clients_per_round", type=int, default=8)
  parser.add_argument("--epochs", type=int, default=2)
  parser.add_argument("--noise_multiplier", type=float, default=1.0)
  parser.add_argument("--clip_norm", type=float, default=1.0)
  parser.add_argument("--max_epsilon", type=float, default=None)
  parser.add_argument("--state_path", default=None)
  args = parser.parse_args(argv)
  try:
    spec = spec_lib.MechanismSpec.from_args(
        args.mechanism, total_rounds=args.rounds, clients_per_round=args.clients_per_round,
        clip_norm=args.clip_norm, noise_multiplier=args.noise_multiplier, delta=1e-5,
        participation=participation.fixed_epoch(args.epochs))
    out = simulate(spec, linear_clients(args.clients, 4), [np.zeros(4)],
                   max_epsilon=args.max_epsilon, state_path=args.state_path, log=print)
  except checks.CheckError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  if out["stopped"]:
    print(f"stopped: {out['stopped']}")
  print(f"released {len(out['models']) - 1} rounds; model {np.round(out['models'][-1][0], 3)}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
