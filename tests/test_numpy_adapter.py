"""The third adapter (``examples/numpy_federated.py``, plain numpy on ``tff_mf.plan``) gets every
rule from the plan: ε after each round and the budget stop, the noise, the state file's
binding and the refusal of foreign or older state, and a restart that continues the run bit
for bit. (The clipping attacks run on it in ``tests/test_edge_attacks.py``.)"""

import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

import userenv
from numpy_adapter import numpy_federated as nf
from tff_mf import checks
from tff_mf import participation
from tff_mf import plan as plan_lib
from tff_mf import spec as spec_lib

SEEDS = dict(noise_seed=5, sampling_seed=1, sampling_secret=2)


def spec(mechanism="blt", n=8):
  return spec_lib.MechanismSpec.from_args(
      mechanism, total_rounds=n, clients_per_round=4, clip_norm=1.0, noise_multiplier=1.0,
      delta=1e-5, participation=participation.fixed_epoch(2))


def run(s, **kwargs):
  return nf.simulate(s, nf.linear_clients(16, 3), [np.zeros(3)], **{**SEEDS, **kwargs})


def test_epsilon_each_round_and_the_budget_stop_keep_the_last_release():
  s = spec()
  full = run(s)
  record = plan_lib.build(s, noise_seed_pinned=True).record
  assert full["epsilons"] == pytest.approx(record.epsilon_by_round(), rel=0, abs=0)
  budget = (full["epsilons"][3] + full["epsilons"][4]) / 2
  stopped = run(s, max_epsilon=budget)
  assert len(stopped["epsilons"]) == 4 and stopped["epsilons"][-1] <= budget
  assert "would pass max_epsilon" in stopped["stopped"]
  assert np.array_equal(stopped["models"][-1][0], full["models"][4][0])


def test_the_noise_is_the_plans_rows():
  s = spec()
  quiet = nf.simulate(s, {f"c{i}": (lambda m: m) for i in range(16)}, [np.zeros(3)],
                      rounds=1, **SEEDS)
  plan = plan_lib.build(s, noise_seed_pinned=True)
  rows = plan.noise_rows([(3,)], plan_lib.rows_lib.seed_pair(SEEDS["noise_seed"]))
  expected = rows.next(plan.record.noise_multiplier * 1.0)[0] / 4 * plan.learning_rates[0]
  assert np.array_equal(quiet["models"][1][0], expected)


def test_a_restart_continues_bit_for_bit_and_foreign_or_older_state_is_refused(tmp_path):
  s = spec()
  straight = run(s)["models"][-1][0]
  path = str(tmp_path / "state.npz")
  run(s, state_path=path, rounds=3)
  shutil.copy2(path, tmp_path / "backup.npz")
  resumed = run(s, state_path=path)
  assert np.array_equal(resumed["models"][-1][0], straight)
  with pytest.raises(checks.CheckError, match="belongs to another run: its encoder_sha256"):
    run(spec("opt_prefix_sum"), state_path=path)
  shutil.copy2(tmp_path / "backup.npz", path)
  with pytest.raises(checks.CheckError, match="is an older copy"):
    run(s, state_path=path)
  os.chmod(path, 0o644)
  with pytest.raises(checks.CheckError, match="readable by group or others"):
    run(s, state_path=path)


def test_the_example_runs_from_a_clean_shell(tmp_path):
  res = subprocess.run([sys.executable, "examples/numpy_federated.py", "--rounds", "8",
                        "--max_epsilon", "5", "--state_path", str(tmp_path / "s.npz")],
                       cwd=userenv.REPO, env=userenv.env(), capture_output=True, text=True,
                       timeout=300, check=False)
  assert res.returncode == 0, res.stderr[-2000:]
  assert "stopped: the next release would pass max_epsilon=5.0" in res.stdout
  again = subprocess.run([sys.executable, "examples/numpy_federated.py", "--mechanism",
                          "banded", "--rounds", "8", "--state_path", str(tmp_path / "s.npz")],
                         cwd=userenv.REPO, env=userenv.env(), capture_output=True, text=True,
                         timeout=300, check=False)
  assert again.returncode == 2 and again.stderr.startswith("error: the state file")
  assert again.stderr.count("\n") == 1
