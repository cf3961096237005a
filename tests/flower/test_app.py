"""The Flower App (examples/flower_app) under `flwr run`, as its README runs it: built by
`make flower-app` and `make flower-wheelhouse` (which fills dist/wheelhouse from the registry
once), then run in a clean shell (PATH/HOME/LANG, an empty HOME) with no registry (uv offline,
from dist/wheelhouse), on a local simulation federation of 16 SuperNodes.

One run of 3 rounds writes its state; a second run resumes from it and continues the round
count until ``max-epsilon`` stops it before the release that would pass it, keeping the last
released model. ε is in the log after every round. Two more runs are refused before round 1
(more rounds than are left; a state file others can read), each with one logged line
(``tff_mf.flower.strategy.stops_cleanly``), not a traceback. The SuperLink that the first
`flwr run` starts in the background is stopped at the end (found by its port, this test's
own)."""

import logging
import os
import re
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest
from flwr.serverapp.exception import PrivacyBudgetExhausted

import userenv
from tff_mf import checks
from tff_mf import plan as plan_lib
from tff_mf.flower import strategy as strategy_lib

APP = "examples/flower_app"
EPSILON_LINE = re.compile(r"Privacy spent: epsilon=([\d.]+) at delta=1e-05 after (\d+) of 8 rounds")


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _superlinks(port: int):
  """Ids of the flower-superlink processes serving ``port`` (this test's own port)."""
  found = []
  for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
      with open(f"/proc/{pid}/cmdline", "rb") as f:
        args = f.read().decode(errors="replace").split("\0")
    except OSError:
      continue
    if any(a.endswith("flower-superlink") for a in args) and str(port) in args:
      found.append(int(pid))
  return found


@pytest.fixture(scope="module")
def flwr_env(tmp_path_factory):
  """The clean-shell environment of `flwr run` (its SuperLink stopped afterwards)."""
  # FLOWER_PYTHON: the interpreter this .venv-flower was made with, so that `make` keeps it
  # (in an empty HOME, bootstrap_flower.sh would not find a pyenv Python and start anew).
  base = os.path.join(sys.base_prefix, "bin", "python%d.%d" % sys.version_info[:2])
  for target in ("flower-app", "flower-wheelhouse"):
    build = subprocess.run(["make", target], cwd=userenv.REPO,
                           env=userenv.env(FLOWER_PYTHON=base),
                           capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, build.stderr[-2000:]
  home = tmp_path_factory.mktemp("home")
  port = _free_port()
  venv = os.path.join(userenv.REPO, ".venv-flower")
  env = userenv.env(  # as after `source .venv-flower/bin/activate`
      home=home, PATH=f"{venv}/bin:{userenv.PATH}", VIRTUAL_ENV=venv,
      UV_OFFLINE="1", UV_NO_INDEX="1",
      UV_FIND_LINKS=os.path.join(userenv.REPO, "dist", "wheelhouse"),
      FLWR_LOCAL_SUPERLINK_HTTP_API_PORT=str(port),
      FLWR_LOCAL_CONTROL_API_PORT=str(_free_port()))
  yield env
  for pid in _superlinks(port):
    os.kill(pid, signal.SIGTERM)
  deadline = time.monotonic() + 30
  while _superlinks(port) and time.monotonic() < deadline:
    time.sleep(0.5)


def flwr_run(env, run_config: str) -> str:
  res = subprocess.run(
      ["flwr", "run", APP, "--stream", "--federation-config", "num-supernodes=16",
       "--run-config", run_config],
      cwd=userenv.REPO, env=env, capture_output=True, text=True, timeout=300)
  out = res.stdout + res.stderr
  assert res.returncode == 0, out[-3000:]
  assert "Traceback" not in out, out[-3000:]
  return out


def test_app_under_flwr_run(flwr_env, tmp_path):
  state, model = tmp_path / "state.npz", tmp_path / "model.npz"
  first = flwr_run(flwr_env, f"num-server-rounds=3 state-path='{state}' model-path='{model}'")
  # The run imports the tff-mf that uv installed from the wheel, not the checkout.
  origin = re.search(r"tff-mf 0\.1\.0 from (\S+)", first)
  assert origin and "/runtime-envs/" in origin.group(1), first[-3000:]
  eps = [(int(r), float(e)) for e, r in EPSILON_LINE.findall(first)]
  assert [r for r, _ in eps] == [1, 2, 3], first[-3000:]
  assert all(b > a > 0 for (_, a), (_, b) in zip(eps, eps[1:]))
  assert "Final model after 3 of 8 rounds" in first
  saved = np.load(model)
  assert int(saved["rounds_done"]) == 3
  np.testing.assert_array_equal(saved["w"], plan_lib.saved_model(str(state))["0"])

  # Resumed: rounds 4, 5, ... until the release that would pass max-epsilon.
  second = flwr_run(flwr_env, f"num-server-rounds=5 state-path='{state}' model-path='{model}' "
                              "max-epsilon=5.0")
  more = [(int(r), float(e)) for e, r in EPSILON_LINE.findall(second)]
  assert more and [r for r, _ in more] == list(range(4, 4 + len(more))), second[-3000:]
  assert all(e <= 5.0 for _, e in more) and more[0][1] > eps[-1][1]
  done = more[-1][0]
  assert done < 8, "max-epsilon=5 should stop the run before round 8"
  assert re.search(rf"Stopped by max_epsilon after {done} rounds: The next private release "
                   r"would exceed max_epsilon", second), second[-3000:]
  # The last released model is kept: the one the state file holds after round `done`.
  saved = np.load(model)
  assert int(saved["rounds_done"]) == done
  np.testing.assert_array_equal(saved["w"], plan_lib.saved_model(str(state))["0"])
  assert f"Final model after {done} of 8 rounds" in second

  # Refusals end the run before its first round, with one logged line and no traceback:
  # more rounds than the mechanism has left (8 − done), and a state file others can read.
  left = 8 - done
  refused = flwr_run(flwr_env, f"num-server-rounds={left + 1} state-path='{state}'")
  assert re.search(rf"ServerApp stopped: num_rounds={left + 1} is more than the {left} rounds "
                   "the mechanism has left", refused), refused[-3000:]
  assert not EPSILON_LINE.search(refused) and "[ROUND 1" not in refused
  os.chmod(state, 0o644)
  refused = flwr_run(flwr_env, f"num-server-rounds=1 state-path='{state}'")
  assert re.search(rf"ServerApp stopped: refusing to use {re.escape(str(state))}: it is "
                   "readable by group or others", refused), refused[-3000:]
  assert not EPSILON_LINE.search(refused) and "[ROUND 1" not in refused


def test_stops_cleanly_logs_a_refusal_in_one_line_and_passes_other_errors():
  records = []
  handler = logging.Handler()
  handler.emit = records.append
  logger = logging.getLogger("flwr")
  logger.addHandler(handler)
  try:
    @strategy_lib.stops_cleanly
    def refused(grid, context):
      del grid, context
      raise checks.CheckError("num_rounds=9 is more than the 8 rounds the mechanism has left")

    assert refused(None, None) is None
    [record] = [r for r in records if r.levelno == logging.ERROR]
    assert record.getMessage() == ("ServerApp stopped: num_rounds=9 is more than the 8 rounds "
                                   "the mechanism has left") and record.exc_info is None

    @strategy_lib.stops_cleanly
    def exhausted(grid, context):
      del grid, context
      raise PrivacyBudgetExhausted("The next private release would exceed max_epsilon")

    with pytest.raises(PrivacyBudgetExhausted):
      exhausted(None, None)
  finally:
    logger.removeHandler(handler)
