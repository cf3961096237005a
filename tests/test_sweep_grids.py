"""Grids against Denisov et al. App I Tables 3 and 4 and Fig 3; sweep dry-run ε; sweep idempotence."""

import io
import itertools
import json
import os
import re
import subprocess
import shlex
import sys
import textwrap
from contextlib import redirect_stdout

import pytest

import userenv
from tff_mf import registry
from training import grids
from training import run_stackoverflow  # imported plainly: an import crash fails here
from training import sweep

# Transcribed independently from Denisov, McMahan, Rush, Smith, Thakurta 2022
# (arXiv:2202.08312), App I Table 4 (the paper's DP-FTRL tree is honaker_online):
# mechanism -> [(paper ε, server LR, client LR, momentum)].
PAPER_TABLE4 = {
    "honaker_full": [(18.9, .5, 1., .95), (8.2, .25, 1., .95), (3.7, .25, 1., .9),
                     (1.7, .25, .5, .9), (0.8, .25, .5, 0.)],
    "honaker_online": [(18.9, .25, 1., .95), (8.2, .25, 1., .9), (3.7, .25, .5, .9),
             (1.7, .25, 1., 0.), (0.8, .25, .5, 0.)],
    "opt_prefix_sum": [(18.9, .5, 1., .95), (8.2, .25, .5, .95), (3.7, .25, 1., .9),
                       (1.7, .25, .5, .9), (0.8, .5, .5, 0.)],
    "opt_momentum": [(18.9, 1., 1., .9), (8.2, .25, 1., .95), (3.7, .25, .5, .9),
                     (1.7, .25, .5, .9), (0.8, .5, .5, 0.)],
}
PAPER_Z_TO_EPS = [(0.341, 18.9), (0.682, 8.2), (1.364, 3.7), (2.728, 1.7), (5.456, 0.8)]


def test_every_grid_is_2048_rounds_delta_1e6_with_unique_names():
  for grid in grids.GRIDS.values():
    assert grid.description and grid.source
    assert len({r.name for r in grid.runs}) == len(grid.runs)
    for run in grid.runs:
      assert run.total_rounds == 2048 and run.delta == 1e-6
      flags = run.flags()
      assert "--total_rounds=2048" in flags and "--delta=1e-06" in flags
      assert "--dataset=stackoverflow" in flags
      assert f"--experiment_name={run.name}" in flags


def test_table3_search_grid_is_the_full_product():
  runs = grids.get_grid("table3_search").runs
  assert len(runs) == 4 * 2 * 4 * 3 * 5
  expected = set(itertools.product(
      ("honaker_full", "honaker_online", "opt_prefix_sum", "opt_momentum"),
      (0.5, 1.0), (0.25, 0.5, 1.0, 2.0), (0.0, 0.9, 0.95),
      (0.341, 0.682, 1.364, 2.728, 5.456)))
  got = {(r.mechanism, r.client_lr, r.server_lr, r.server_momentum, r.noise_multiplier)
         for r in runs}
  assert got == expected
  assert {r.seed for r in runs} == {0}
  assert {r.clients_per_round for r in runs} == {100}
  assert {r.lr_schedule for r in runs} == {"constant"}


def test_table4_repeats_match_the_paper_with_ten_seeds():
  runs = grids.get_grid("table4_repeats").runs
  assert len(runs) == 4 * 5 * 10
  z_of = {eps: z for z, eps in PAPER_Z_TO_EPS}
  for mechanism, rows in PAPER_TABLE4.items():
    for eps, server_lr, client_lr, momentum in rows:
      cell = [r for r in runs if r.mechanism == mechanism and r.noise_multiplier == z_of[eps]]
      assert sorted(r.seed for r in cell) == list(range(10))
      assert {(r.server_lr, r.client_lr, r.server_momentum) for r in cell} == {
          (server_lr, client_lr, momentum)}
      assert cell[0].paper_epsilon == eps


def test_fig3_schedules():
  runs = grids.get_grid("fig3_schedules").runs
  assert {r.noise_multiplier for r in runs} == {0.341}
  groups = {}
  for r in runs:
    groups.setdefault((r.mechanism, r.lr_schedule, r.schedule_rounds, r.clients_per_round),
                      []).append(r)
  for mechanism in ("opt_prefix_sum", "opt_momentum"):
    eps189 = [row for row in PAPER_TABLE4[mechanism] if row[0] == 18.9][0]
    constant = groups[(mechanism, "constant", None, 100)]
    assert {(r.server_lr, r.client_lr, r.server_momentum) for r in constant} == {eps189[1:]}
    for key in ((mechanism, "decay", 512, 100), (mechanism, "cooldown", 512, 100),
                (mechanism, "cooldown", 512, 167)):
      assert {(r.server_lr, r.client_lr, r.server_momentum) for r in groups[key]} == {
          (0.5, 1.0, 0.95)}
      assert sorted(r.seed for r in groups[key]) == list(range(10))
  assert len(groups) == 8 and len(runs) == 80
  # 167 clients x 2048 rounds fits in StackOverflow's 342,477 training clients (single pass).
  assert 167 * 2048 <= 342477 < 168 * 2048


def test_paper_config_is_the_papers_stackoverflow_setting_on_the_compiled_engine():
  """Issue 36: the papers' configuration as one grid entry: 4.05M-parameter LSTM, 100 clients
  a round, 2048 rounds, at most 256 sentences; Fig 2's pair at eps 18.9, Table 4 settings."""
  grid = grids.get_grid("paper_config")
  assert [r.mechanism for r in grid.runs] == ["opt_momentum", "honaker_online"]
  table4 = {r.name: r for r in grids.get_grid("table4_repeats").runs}
  for run in grid.runs:
    assert run.name in table4 and table4[run.name] == run  # the same run and directory
    eps189 = [row for row in PAPER_TABLE4[run.mechanism] if row[0] == 18.9][0]
    assert (run.server_lr, run.client_lr, run.server_momentum) == eps189[1:]
    values = run.flag_values()
    assert (values["clients_per_round"], values["total_rounds"],
            values["max_elements_per_client"], values["noise_multiplier"]) == (100, 2048, 256,
                                                                               0.341)
    assert "engine" not in values  # the sweep's --engine=auto: compiled on one machine
  from stackoverflow import model as so_model
  assert so_model.parameter_count(
      **{k: grids.PAPER_FIXED_FLAGS[k] for k in ("vocab_size", "embedding_size", "lstm_size",
                                                  "projection_size")}) == 4050748


def test_grid_flags_are_flags_of_the_training_binary():
  binary = run_stackoverflow
  names = {run_flag for grid in grids.GRIDS.values() for run in grid.runs
           for run_flag in run.flag_values()}
  assert {name for name in names if name not in binary.FLAGS} == set()


def test_grid_mechanisms_and_labels_come_from_the_registry():
  for grid in grids.GRIDS.values():
    for run in grid.runs:
      assert registry.mechanism(run.mechanism).name == run.mechanism  # canonical names
      assert registry.mechanism(run.mechanism).trainable
  assert grids.label("honaker_online") == registry.label("honaker_online")
  assert grids.label("not_a_mechanism") == "not_a_mechanism"
  assert not hasattr(grids, "MECHANISM_LABELS")


def test_unknown_grid_is_a_clear_error():
  with pytest.raises(ValueError, match="known grids: table3_search"):
    grids.get_grid("table9")
  assert sweep.main(["--grid", "nope", "--dry-run"]) == 2


def test_dry_run_epsilons_rdp_close_to_paper_and_the_default_tighter():
  """The paper's ε came from RDP; the default accountant (exact, the binary's, summarize's and
  tff-mf account's) gives a smaller valid bound."""
  from tff_mf import accounting  # pylint: disable=g-import-not-at-top
  data = {}
  for accountant in (None, "rdp"):
    out = io.StringIO()
    with redirect_stdout(out):
      assert sweep.main(["--grid", "table3_search", "--dry-run", "--json"]
                        + ([] if accountant is None else ["--accountant", accountant])) == 0
    data[accountant] = json.loads(out.getvalue())
  assert data[None]["accountant"] == accounting.DEFAULT_ACCOUNTANT == "exact"
  assert data[None]["size"] == 480 and len(data[None]["runs"]) == 480
  rdp = {e["noise_multiplier"]: e for e in data["rdp"]["epsilons"]}
  default = {e["noise_multiplier"]: e for e in data[None]["epsilons"]}
  for z, paper_eps in PAPER_Z_TO_EPS:
    # The paper rounds to one decimal; its RDP accountant used a coarser order grid.
    assert abs(rdp[z]["epsilon"] - paper_eps) <= 0.03 * paper_eps, (z, rdp[z])
    assert default[z]["epsilon"] < rdp[z]["epsilon"], (z, default[z])
    assert rdp[z]["paper_epsilon"] == paper_eps
  for row in data[None]["runs"]:
    assert row["epsilon"] == default[row["noise_multiplier"]]["epsilon"]
    assert row["accountant"] == "exact" and row["status"] == "pending"
  text = io.StringIO()
  with redirect_stdout(text):
    assert sweep.main(["--grid", "table3_search", "--dry-run", "--slice", "0:3",
                       "--accountant", "rdp"]) == 0
  lines = text.getvalue().splitlines()
  printed = [re.search(r"z = 0\.341\b.* eps = +([0-9.]+)", line) for line in lines]
  printed = [float(m.group(1)) for m in printed if m]
  assert printed and all(abs(eps - 18.9) <= 0.03 * 18.9 for eps in printed), printed  # paper
  assert sum(1 for line in lines if "honaker_full" in line) == 3


def test_dry_run_shows_no_epsilon_when_extra_flags_may_change_it():
  """--extra_flags override the grid's flags in every run: a dry run that still listed the
  grid's epsilon beside --noise_multiplier=0.1 (or a schema, a clip norm, a nan) showed an
  epsilon the runs do not have. Data and model flags keep it."""
  def dry(extra):
    out = io.StringIO()
    with redirect_stdout(out):
      assert sweep.main(["--grid", "table3_search", "--dry-run", "--json", "--slice", "0:2",
                         "--extra_flags=" + extra]) == 0
    return json.loads(out.getvalue())
  kept = dry("--data_dir=/d --total_rounds=8 --vocab_size=100")
  assert kept.get("epsilon_withheld") is None and kept["epsilons"]
  assert all(row["epsilon"] is not None for row in kept["runs"])
  for extra in ("--noise_multiplier=0.1", "--participation=fixed_epoch --epochs=2",
                "--clip-norm=adaptive", "--target_quantile=nan", "--noise_seed=3"):
    data = dry(extra)
    assert not data["epsilons"] and all(row["epsilon"] is None for row in data["runs"])
    flag = "--" + extra.split("=", 1)[0][2:].replace("-", "_")
    assert flag in data["epsilon_withheld"], (extra, data["epsilon_withheld"])
  text = io.StringIO()
  with redirect_stdout(text):
    assert sweep.main(["--grid", "table3_search", "--dry-run", "--slice", "0:2",
                       "--extra_flags=--noise_multiplier=0.1"]) == 0
  assert "epsilon not shown: --extra_flags sets --noise_multiplier" in text.getvalue()
  assert " eps = " not in text.getvalue()


def test_parse_slice_and_extra_flags():
  assert sweep.parse_slice("2:5", 10) == (2, 5)
  assert sweep.parse_slice(":3", 10) == (0, 3)
  assert sweep.parse_slice("-2:", 10) == (8, 10)
  assert sweep.parse_slice(None, 4) == (0, 4)
  with pytest.raises(ValueError):
    sweep.parse_slice("3", 10)
  assert sweep.parse_extra_flags(["--a=1 --b=x", "--c=2"]) == ["--a=1", "--b=x", "--c=2"]
  with pytest.raises(ValueError, match="--name=value"):
    sweep.parse_extra_flags(["--flag"])
  with pytest.raises(ValueError, match="set by the sweep"):
    sweep.parse_extra_flags(["--root_output_dir=/x"])



def test_sweep_engine_flag_reaches_every_run_and_refuses_compiled_with_workers(tmp_path,
                                                                             capsys):
  """--engine (default auto, the binary's) is the sweep's flag, passed to every run; a
  finished run recorded on another engine is the same run (the engines are equal by test)."""
  out = io.StringIO()
  with redirect_stdout(out):
    assert sweep.main(["--grid", "table4_repeats", "--slice", "0:1", "--dry-run", "--json"]) == 0
  assert "--engine=auto" in json.loads(out.getvalue())["runs"][0]["flags"]
  with redirect_stdout(io.StringIO()):
    assert sweep.main(["--grid", "table4_repeats", "--slice", "0:1", "--dry-run",
                       "--engine", "tff"]) == 0
  capsys.readouterr()
  assert sweep.main(["--grid", "table4_repeats", "--slice", "0:1", "--dry-run",
                     "--extra_flags=--engine=tff"]) == 2
  assert "--engine is a flag of the sweep" in capsys.readouterr().err
  assert sweep.main(["--grid", "table4_repeats", "--slice", "0:1", "--dry-run", "--engine",
                     "compiled", "--extra_flags=--workers=w1:8000"]) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and "--workers" in err[0] and "--engine=compiled" in err[0]
  run = grids.get_grid("table4_repeats").runs[0]
  os.makedirs(tmp_path / run.name)
  summary = {"finished": True, "config": dict(run.flag_values(), engine="tff")}
  (tmp_path / run.name / "summary.json").write_text(json.dumps(summary))
  assert sweep.run_status(run, str(tmp_path), ["--engine=compiled"]) == ("finished", "")


FAKE_BINARY = textwrap.dedent("""
    # A fast stand-in for run_stackoverflow.py: writes the summary.json schema.
    import json, os, sys
    flags = dict(a[2:].split("=", 1) for a in sys.argv[1:])
    name = flags["experiment_name"]
    run_dir = os.path.join(flags["root_output_dir"], name)
    os.makedirs(run_dir, exist_ok=True)
    with open(os.environ["FAKE_CALLS"], "a") as f:
      f.write(name + "\\n")
    config = {k: (float(v) if k in ("client_lr", "server_lr", "server_momentum",
                                     "noise_multiplier", "delta") else v)
              for k, v in flags.items()}
    crash = os.environ.get("FAKE_CRASH") == name
    summary = {"config": config, "mechanism": flags["mechanism"],
               "noise_multiplier": float(flags["noise_multiplier"]), "epsilon": 1.0,
               "delta": 1e-6, "accountant": "pld", "total_rounds": 2048,
               "rounds_completed": 7 if crash else 2048, "finished": not crash,
               "diverged": False, "wall_seconds": 0.01, "single_participation_sqrt_loss": 1.0,
               "validation_metrics": {"loss": 1.0, "accuracy": 0.2, "accuracy_no_oov": 0.2,
                                      "accuracy_no_oov_no_eos": 0.2},
               "test_metrics": {"loss": 1.0, "accuracy": 0.2, "accuracy_no_oov": 0.2,
                                "accuracy_no_oov_no_eos": 0.2}}
    with open(os.path.join(run_dir, "summary.json"), "w") as f:
      json.dump(summary, f)
    sys.exit(3 if crash else 0)
    """)


def _calls(path):
  if not os.path.exists(path):
    return []
  with open(path) as f:
    return f.read().split()


def _sweep(args, tmp_path, **extra_env):
  """``python -m training.sweep ARGS`` from a clean shell (its children inherit that env)."""
  result = subprocess.run([sys.executable, "-m", "training.sweep", *args], cwd=userenv.REPO,
                          env=userenv.env(home=tmp_path, **extra_env), capture_output=True,
                          text=True, timeout=900)
  return result


def test_sweep_runs_slice_skips_finished_and_resumes_after_a_crash(tmp_path):
  binary = tmp_path / "fake_binary.py"
  binary.write_text(FAKE_BINARY)
  calls = str(tmp_path / "calls.txt")
  root = str(tmp_path / "runs")
  grid = grids.get_grid("table4_repeats")
  names = [r.name for r in grid.runs[2:6]]
  args = ["--grid", "table4_repeats", "--slice", "2:6", "--processes", "2",
          "--root_output_dir", root, "--binary", f"{shlex.quote(sys.executable)} {shlex.quote(str(binary))}",
          "--no_progress"]
  result = _sweep(args, tmp_path, FAKE_CALLS=calls, FAKE_CRASH=names[1])
  assert result.returncode == 1, result.stderr  # one run crashed
  assert sorted(_calls(calls)) == sorted(names)
  records = [json.loads(line) for line in open(os.path.join(root, "sweep_table4_repeats.jsonl"))]
  assert {r["name"]: r["status"] for r in records} == {
      n: ("failed" if n == names[1] else "finished") for n in names}
  assert sweep.run_status(grid.runs[3], root) == ("partial", "rounds_completed=7")
  assert os.path.exists(os.path.join(root, names[1], "sweep.log"))
  assert oct(os.stat(os.path.join(root, names[1])).st_mode & 0o777) == oct(0o700)

  assert _sweep(args, tmp_path, FAKE_CALLS=calls).returncode == 0  # only the crashed run again
  assert _calls(calls)[4:] == [names[1]]
  assert _sweep(args, tmp_path, FAKE_CALLS=calls).returncode == 0  # nothing left to run
  assert len(_calls(calls)) == 5

  # A finished summary with other flags is reported, never overwritten.
  path = os.path.join(root, names[0], "summary.json")
  summary = json.load(open(path))
  summary["config"]["server_lr"] = 99.0
  json.dump(summary, open(path, "w"))
  status, detail = sweep.run_status(grid.runs[2], root)
  assert status == "conflict" and "server_lr" in detail
  assert _sweep(args, tmp_path, FAKE_CALLS=calls).returncode == 1
  assert len(_calls(calls)) == 5
  out = io.StringIO()
  with redirect_stdout(out):
    sweep.main(["--grid", "table4_repeats", "--slice", "2:6", "--dry-run", "--json",
                "--root_output_dir", root])
  statuses = [r["status"] for r in json.loads(out.getvalue())["runs"]]
  assert statuses == ["conflict", "finished", "finished", "finished"]


def test_recorded_alias_of_a_requested_mechanism_is_the_same_run(tmp_path):
  run = next(r for r in grids.get_grid("table4_repeats").runs if r.mechanism == "honaker_online")
  os.makedirs(tmp_path / run.name)
  config = dict(run.flag_values(), mechanism=registry.mechanism(run.mechanism).aliases[0])
  (tmp_path / run.name / "summary.json").write_text(json.dumps(
      {"config": config, "finished": True, "diverged": False}))
  assert sweep.run_status(run, str(tmp_path)) == ("finished", "")


def test_running_needs_root_output_dir():
  assert sweep.main(["--grid", "table4_repeats", "--slice", "0:1", "--no_progress"]) == 2


@pytest.mark.slow
def test_sweep_with_the_real_binary_on_tiny_data_then_summarize(tmp_path):
  """Two table4_repeats runs through run_stackoverflow.py, shrunk by --extra_flags; rerun skips."""
  from stackoverflow import fixtures
  from training import summarize
  data_dir = fixtures.write_tiny_stackoverflow(str(tmp_path / "data"))
  root = str(tmp_path / "runs")
  tiny = (f"--data_dir={data_dir} --cache_dir={tmp_path / 'cache'} --total_rounds=2 "
          "--clients_per_round=2 --vocab_size=100 --embedding_size=8 --lstm_size=16 "
          "--projection_size=8 --max_validation_elements=40 --rounds_per_eval=2 "
          "--rounds_per_checkpoint=1")
  args = ["--grid", "table4_repeats", "--slice", "0:2", "--root_output_dir", root,
          "--extra_flags", tiny, "--no_progress"]
  first = _sweep(args, tmp_path)
  assert first.returncode == 0, first.stdout + first.stderr
  grid = grids.get_grid("table4_repeats")
  for run in grid.runs[:2]:
    summary = json.load(open(os.path.join(root, run.name, "summary.json")))
    assert summary["finished"] and summary["config"]["server_lr"] == run.server_lr
    assert summary["noise_multiplier"] == run.noise_multiplier
  records_before = open(os.path.join(root, "sweep_table4_repeats.jsonl")).read()
  assert _sweep(args, tmp_path).returncode == 0
  assert open(os.path.join(root, "sweep_table4_repeats.jsonl")).read() == records_before
  assert summarize.main(["--root_output_dir", root]) == 0
  rows = json.load(open(os.path.join(root, "summary", "summary.json")))["rows"]
  assert len(rows) == 1 and rows[0]["seeds"] == 2 and rows[0]["test_std"] is not None
