"""training.summarize on synthetic run summaries whose expected table is computed here independently."""

import json
import math
import os
import statistics

import pytest

from training import summarize
from tff_mf import accounting, registry

import statcheck


def _write(root, name, *, mechanism, z, setting, seed, val, test, schedule="constant",
           clients=100, finished=True, diverged=False, test_loss=2.0):
  server_lr, client_lr, momentum = setting
  config = {"mechanism": mechanism, "dataset": "stackoverflow", "total_rounds": 2048,
            "clients_per_round": clients, "client_lr": client_lr, "server_lr": server_lr,
            "server_momentum": momentum, "lr_schedule": schedule,
            "schedule_rounds": None if schedule == "constant" else 512,
            "noise_multiplier": z, "target_epsilon": None, "delta": 1e-6, "seed": seed,
            "experiment_name": name, "root_output_dir": str(root), "workers": [],
            "noise_seed": "os_entropy", "lstm_size": 670}
  summary = {"config": config, "mechanism": mechanism, "noise_multiplier": z,
             "epsilon": None if z is None else 1.0, "delta": 1e-6, "accountant": "pld",
             "total_rounds": 2048, "rounds_completed": 2048 if finished else 100,
             "finished": finished and not diverged, "diverged": diverged, "wall_seconds": 1.0,
             "single_participation_sqrt_loss": None,
             "validation_metrics": {"loss": 2.0, "accuracy": val + 0.05, "accuracy_no_oov": val + 0.02,
                                    "accuracy_no_oov_no_eos": val},
             "test_metrics": {"loss": test_loss, "accuracy": test + 0.05,
                              "accuracy_no_oov": test + 0.02, "accuracy_no_oov_no_eos": test}}
  os.makedirs(root / name)
  (root / name / "summary.json").write_text(json.dumps(summary))


A = (0.25, 1.0, 0.95)
B = (0.5, 1.0, 0.9)
C = (0.5, 1.0, 0.95)


@pytest.fixture
def synthetic_runs(tmp_path):
  root = tmp_path / "runs"
  runs = [
      # tree, z=0.341: A has the better mean validation accuracy; B's best seed alone is higher,
      # but B's mean is lower. One A seed diverged (dropped), one is incomplete.
      dict(mechanism="honaker_online", z=0.341, setting=A, seed=0, val=0.230, test=0.221),
      dict(mechanism="honaker_online", z=0.341, setting=A, seed=1, val=0.232, test=0.224),
      dict(mechanism="honaker_online", z=0.341, setting=A, seed=2, val=0.228, test=0.219),
      dict(mechanism="honaker_online", z=0.341, setting=A, seed=3, val=0.01, test=0.01, diverged=True),
      dict(mechanism="honaker_online", z=0.341, setting=A, seed=4, val=0.231, test=0.222, finished=False),
      dict(mechanism="honaker_online", z=0.341, setting=B, seed=0, val=0.240, test=0.230),
      dict(mechanism="honaker_online", z=0.341, setting=B, seed=1, val=0.200, test=0.190),
      # opt_momentum, z=0.341: B wins; one B seed has a NaN test loss (diverged by the rule).
      dict(mechanism="opt_momentum", z=0.341, setting=A, seed=0, val=0.235, test=0.226),
      dict(mechanism="opt_momentum", z=0.341, setting=B, seed=0, val=0.245, test=0.236),
      dict(mechanism="opt_momentum", z=0.341, setting=B, seed=1, val=0.243, test=0.233),
      dict(mechanism="opt_momentum", z=0.341, setting=B, seed=2, val=0.247, test=0.239),
      dict(mechanism="opt_momentum", z=0.341, setting=B, seed=3, val=0.250, test=0.240,
           test_loss=float("nan")),
      # opt_momentum at z=1.364: a single seed.
      dict(mechanism="opt_momentum", z=1.364, setting=A, seed=0, val=0.205, test=0.199),
      # Fig 3 style: cooldown with 100 and 167 clients at z=0.341.
      dict(mechanism="opt_momentum", z=0.341, setting=C, seed=0, val=0.251, test=0.243,
           schedule="cooldown"),
      dict(mechanism="opt_momentum", z=0.341, setting=C, seed=1, val=0.253, test=0.245,
           schedule="cooldown"),
      dict(mechanism="opt_momentum", z=0.341, setting=C, seed=0, val=0.256, test=0.249,
           schedule="cooldown", clients=167),
      dict(mechanism="opt_momentum", z=0.341, setting=C, seed=1, val=0.258, test=0.250,
           schedule="cooldown", clients=167),
      # Non-private reference.
      dict(mechanism="none", z=None, setting=A, seed=0, val=0.262, test=0.257),
  ]
  for i, run in enumerate(runs):
    _write(root, f"run{i:02d}", **run)
  return root


def _expected(test_values):
  mean = statistics.mean(test_values)
  std = statistics.stdev(test_values) if len(test_values) > 1 else None
  return mean, std


def test_summary_table_matches_independent_computation(synthetic_runs):
  rows = summarize.summarize(summarize.load_summaries(str(synthetic_runs)), accountant="rdp")
  by_key = {(r["mechanism"], r["noise_multiplier"], r["lr_schedule"], r["clients_per_round"]): r
            for r in rows}
  assert len(rows) == 6

  tree = by_key[("honaker_online", 0.341, "constant", 100)]
  assert tree["selected"] == {"server_lr": 0.25, "client_lr": 1.0, "server_momentum": 0.95}
  mean, std = _expected([0.221, 0.224, 0.219])
  assert tree["test_mean"] == pytest.approx(mean, abs=1e-12)
  assert tree["test_std"] == pytest.approx(std, abs=1e-12)
  assert tree["validation_mean"] == pytest.approx(statistics.mean([0.230, 0.232, 0.228]))
  assert (tree["runs"], tree["runs_converged"], tree["runs_diverged"], tree["runs_incomplete"]) == (
      7, 5, 1, 1)
  assert tree["seeds"] == 3 and tree["below_min_converged"]
  # RDP: an upper bound on the analytic Gaussian ε, within 3% of the paper's 18.9 (Denisov et
  # al. 2022, App I Table 4, z = 0.341; its accountant used a coarser order grid).
  assert statcheck.gaussian_epsilon(0.341, 1e-6) < tree["epsilon"] <= 1.03 * 18.9
  assert tree["epsilon"] >= 0.97 * 18.9

  mom = by_key[("opt_momentum", 0.341, "constant", 100)]
  assert mom["selected"] == {"server_lr": 0.5, "client_lr": 1.0, "server_momentum": 0.9}
  mean, std = _expected([0.236, 0.233, 0.239])
  assert (mom["test_mean"], mom["test_std"]) == (pytest.approx(mean), pytest.approx(std))
  assert mom["runs_diverged"] == 1 and mom["seeds"] == 3

  single = by_key[("opt_momentum", 1.364, "constant", 100)]
  assert single["test_mean"] == pytest.approx(0.199) and single["test_std"] is None

  cool167 = by_key[("opt_momentum", 0.341, "cooldown", 167)]
  mean, std = _expected([0.249, 0.250])
  assert (cool167["test_mean"], cool167["test_std"]) == (pytest.approx(mean), pytest.approx(std))

  nonprivate = by_key[("none", None, "constant", 100)]
  assert nonprivate["epsilon"] is None and nonprivate["test_mean"] == pytest.approx(0.257)

  table = summarize.markdown_table(rows)
  expected_tree_cell = "%.2f ± %.2f" % (100 * statistics.mean([0.221, 0.224, 0.219]),
                                        100 * statistics.stdev([0.221, 0.224, 0.219]))
  tree_line = [l for l in table.splitlines()
               if l.startswith(f"| {registry.label('honaker_online')} |")][0]
  assert expected_tree_cell in tree_line and "(0.25, 1, 0.95)" in tree_line
  assert "3 of 7 (1 diverged, 1 incomplete)" in tree_line
  assert "∞ (non-private)" in table


def test_min_val_accuracy_treats_collapsed_runs_as_diverged(synthetic_runs):
  rows = summarize.summarize(summarize.load_summaries(str(synthetic_runs)),
                             min_val_accuracy=0.21)
  tree = [r for r in rows if r["mechanism"] == "honaker_online"][0]
  # B's seed 1 (val 0.200) now counts as diverged, so B (one seed, val 0.240) wins.
  assert tree["selected"]["server_lr"] == 0.5 and tree["seeds"] == 1
  assert tree["test_mean"] == pytest.approx(0.230)


def test_selection_min_seeds_prefers_repeated_settings(synthetic_runs):
  rows = summarize.summarize(summarize.load_summaries(str(synthetic_runs)), selection_min_seeds=3)
  mom = [r for r in rows if r["mechanism"] == "opt_momentum" and r["noise_multiplier"] == 0.341
         and r["lr_schedule"] == "constant"][0]
  assert mom["seeds"] == 3  # B (3 converged seeds) stays selected; A has 1
  # z=1.364 has no setting with 3 seeds: all compete.
  single = [r for r in rows if r["noise_multiplier"] == 1.364][0]
  assert single["seeds"] == 1 and single["test_mean"] == pytest.approx(0.199)
  rows = summarize.summarize(summarize.load_summaries(str(synthetic_runs)), selection_min_seeds=4)
  tree = [r for r in rows if r["mechanism"] == "honaker_online"][0]
  assert tree["selected"]["server_lr"] == 0.25  # no setting has 4: the best mean wins


def test_command_writes_table_json_and_pngs(synthetic_runs, tmp_path, capsys):
  out = tmp_path / "out"
  assert summarize.main(["--root_output_dir", str(synthetic_runs), "--output_dir", str(out)]) == 0
  for name in ("fig2_accuracy_vs_epsilon.png", "fig3_schedules.png"):
    data = (out / name).read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
  md = (out / "summary.md").read_text()
  assert md.count("\n| ") == 7  # header + 6 cells
  rows = json.loads((out / "summary.json").read_text())["rows"]
  assert len(rows) == 6 and all(r["accountant"] == "exact" for r in rows)
  assert registry.label("honaker_online") in capsys.readouterr().out


def test_corrupt_or_missing_summaries_are_clear_errors(tmp_path, capsys):
  assert summarize.main(["--root_output_dir", str(tmp_path)]) == 2
  assert "no */summary.json" in capsys.readouterr().err
  (tmp_path / "bad").mkdir()
  (tmp_path / "bad" / "summary.json").write_text("{not json")
  with pytest.raises(ValueError, match="corrupt run summary .*bad/summary.json"):
    summarize.load_summaries(str(tmp_path))


def test_classify_rule():
  ok = {"finished": True, "diverged": False,
        "validation_metrics": {"loss": 1.0, "accuracy_no_oov_no_eos": 0.2},
        "test_metrics": {"loss": 1.0, "accuracy_no_oov_no_eos": 0.2}}
  assert summarize.classify(ok) == "converged"
  assert summarize.classify({**ok, "diverged": True, "finished": False}) == "diverged"
  assert summarize.classify({**ok, "finished": False}) == "incomplete"
  assert summarize.classify({**ok, "test_metrics": {"loss": math.inf,
                                                    "accuracy_no_oov_no_eos": 0.2}}) == "diverged"
  assert summarize.classify(ok, min_val_accuracy=0.5) == "diverged"


def test_outputs_inside_the_root_are_not_read_back_as_runs(synthetic_runs, capsys):
  """docs/reproduce.md step 3: two summaries written under the root, one after the other."""
  root = str(synthetic_runs)
  assert summarize.main(["--root_output_dir", root, "--output_dir",
                         os.path.join(root, "summary_search")]) == 0
  assert summarize.main(["--root_output_dir", root, "--selection_min_seeds", "7"]) == 0
  assert summarize.main(["--root_output_dir", root]) == 0  # default output: <root>/summary
  assert "error" not in capsys.readouterr().err
  runs = summarize.load_summaries(root)
  assert runs and all(isinstance(r["config"], dict) for r in runs)
  written = json.loads((synthetic_runs / "summary" / "summary.json").read_text())
  assert written["kind"] == summarize.SWEEP_SUMMARY_KIND


def test_multi_participation_cells_keep_the_epsilon_their_runs_recorded(tmp_path):
  """ε of a fixed-epoch run is not the single-participation Gaussian at z: the table takes
  the largest ε the runs recorded (None when one of them reported none)."""
  root = tmp_path / "runs"
  for seed, eps in ((0, 3.5), (1, 3.25)):
    _write(root, f"fe{seed}", mechanism="opt_momentum", z=0.682, setting=A, seed=seed,
           val=0.2, test=0.2)
    path = root / f"fe{seed}" / "summary.json"
    summary = json.loads(path.read_text())
    summary["config"].update(participation="fixed_epoch", epochs=2)
    summary["epsilon"] = eps
    path.write_text(json.dumps(summary))
  rows = summarize.summarize(summarize.load_summaries(str(root)))
  assert len(rows) == 1 and rows[0]["epsilon"] == 3.5
  assert rows[0]["epsilon"] != pytest.approx(accounting.epsilon(0.682, 1e-6, "pld"))
  summary = json.loads((root / "fe1" / "summary.json").read_text())
  summary["epsilon"] = None  # a run that broke its schema
  (root / "fe1" / "summary.json").write_text(json.dumps(summary))
  assert summarize.summarize(summarize.load_summaries(str(root)))[0]["epsilon"] is None


def test_error_bars_never_go_below_zero(tmp_path, monkeypatch):
  """A mean of 0.5% with a 2% std: the lower bar stops at 0 (accuracy is never negative), in
  both figures, and neither axis shows negative accuracy."""
  assert summarize._error_bars([0.5, 20.0], [2.0, 1.0]) == [[0.5, 1.0], [2.0, 1.0]]  # pylint: disable=protected-access
  root = tmp_path / "runs"
  k = 0
  for mechanism, z, schedule, tests in (
      ("honaker_online", 5.456, "constant", (0.0, 0.0, 0.015)),
      ("honaker_online", 0.341, "constant", (0.20, 0.21, 0.22)),
      ("opt_momentum", 0.341, "cooldown", (0.0, 0.001, 0.03))):
    for seed, value in enumerate(tests):
      _write(root, f"run{k:02d}", mechanism=mechanism, z=z, setting=A, seed=seed, val=value,
             test=value, schedule=schedule)
      k += 1
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  figures = []
  monkeypatch.setattr(plt, "close", figures.append)  # keep the figures to inspect them
  rows = summarize.summarize(summarize.load_summaries(str(root)))
  assert summarize.plot_fig2(rows, str(tmp_path / "fig2.png"))
  assert summarize.plot_fig3(rows, str(tmp_path / "fig3.png"))
  assert len(figures) == 2
  for fig in figures:
    ax = fig.axes[0]
    assert ax.get_ylim()[0] >= 0.0
    assert not ax.patches  # points with error bars, no bars on a truncated axis
    segments = [seg for coll in ax.collections for seg in coll.get_segments()]
    assert segments  # the error bars were drawn
    assert min(float(seg[:, 1].min()) for seg in segments) >= 0.0


# A run's summary.json as the training loop wrote it before ``training.records.RunSummary``
# existed (every key in the loop's order; abridged values), and a sweep summary's row.
OLD_RUN_SUMMARY = """{
  "config": {"mechanism": "opt_momentum", "total_rounds": 8, "clients_per_round": 4,
             "server_lr": 0.5, "client_lr": 1.0, "server_momentum": 0.9, "seed": 0,
             "lr_schedule": "constant", "delta": 1e-06},
  "mechanism": "opt_momentum", "mechanism_label": "Opt momentum", "noise_multiplier": 0.682,
  "epsilon": null, "epsilon_reason": "the sampled rounds broke the participation schema",
  "delta": 1e-06, "accountant": "pld", "analysis": "single_participation", "private": true,
  "privacy": {"noise_multiplier": 0.682, "delta": 1e-06, "epsilon": null, "sensitivity": 1.0},
  "participation": {"follows_schema": false},
  "privacy_statement": {"epsilon": null, "epsilon_text": null, "text": "Privacy statement"},
  "total_rounds": 8, "rounds_completed": 8, "finished": true, "diverged": false,
  "wall_seconds": 3.5,
  "validation_metrics": {"loss": 2.0, "accuracy_no_oov_no_eos": 0.2},
  "test_metrics": {"loss": 2.1, "accuracy_no_oov_no_eos": 0.19},
  "single_participation_sqrt_loss": null, "nonprivate_train_metrics": null, "notes": [],
  "empty_clients_skipped": 0, "zeroed_client_updates": 0, "num_train_clients": 40,
  "clients_used": 32, "mechanism_info": {"name": "opt_momentum"}, "versions": {"numpy": "1"},
  "dataset": {"name": "pydocs"}, "created_utc": "2026-01-01T00:00:00+00:00",
  "start_utc": "2026-01-01T00:00:00+00:00", "end_utc": "2026-01-01T00:00:03+00:00",
  "canary_audit": {"audited": false, "reason": "the run did not finish (diverged)"}
}"""


def test_a_summary_written_before_the_typed_record_reads_and_writes_back_the_same(tmp_path):
  """summary.json is read by its typed fields (``training.records.RunSummary``); one written
  before the type existed reads the same: every key kept, in its order, a null kept null."""
  from training.records import RunSummary  # pylint: disable=g-import-not-at-top
  old = json.loads(OLD_RUN_SUMMARY)
  summary = RunSummary.of_json(old)
  assert (summary.epsilon, summary.noise_multiplier, summary.delta) == (None, 0.682, 1e-6)
  assert summary.finished and summary.test_metrics["loss"] == 2.1
  assert summary.canary_audit == {"audited": False,
                                  "reason": "the run did not finish (diverged)"}
  assert json.dumps(summary.json(), indent=2) == json.dumps(old, indent=2)  # byte for byte
  assert list(summary) == list(old) and summary == old and summary["epsilon"] is None
  with pytest.raises(Exception):
    summary.epsilon = 1.0  # frozen
  again = summary.replace(epsilon=2.5, extra=1)
  assert again.epsilon == 2.5 and list(again) == list(old) + ["extra"]
  # The sweep's readers take it as written: summarize's cell, sweep's status.
  (tmp_path / "runs" / "a").mkdir(parents=True)
  (tmp_path / "runs" / "a" / "summary.json").write_text(OLD_RUN_SUMMARY)
  runs = summarize.load_summaries(str(tmp_path / "runs"))
  assert runs[0].epsilon is None and list(runs[0])[-1] == "_path"
  rows = summarize.summarize(runs)
  assert len(rows) == 1 and rows[0].seeds == 1 and rows[0].test_mean == 0.19


def test_the_sweep_summarys_rows_keep_their_keys_and_order(synthetic_runs, tmp_path):
  """summarize's rows are typed (``CellRow``); summary.json's rows have the keys they had."""
  out = tmp_path / "out"
  assert summarize.main(["--root_output_dir", str(synthetic_runs), "--output_dir", str(out)]) == 0
  rows = json.loads((out / "summary.json").read_text())["rows"]
  keys = ["mechanism", "label", "noise_multiplier", "delta", "accountant", "epsilon",
          "paper_epsilon", "lr_schedule", "schedule_rounds", "clients_per_round",
          "total_rounds", "dataset", "runs", "runs_converged", "runs_diverged",
          "runs_incomplete", "settings_tried", "selected", "seeds", "validation_mean",
          "test_mean", "test_std", "test_values", "below_min_converged"]
  assert all(list(r) in (keys, keys + ["seed_list"]) for r in rows)
  typed = [summarize.CellRow.of_json(r) for r in rows]
  assert [t.json() for t in typed] == rows and typed[0].epsilon == rows[0]["epsilon"]
  assert summarize.markdown_table(typed) == summarize.markdown_table(rows)
