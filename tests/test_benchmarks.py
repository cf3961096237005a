"""Every benchmark script runs against the current library (its smoke mode, in seconds).

The benchmarks import the library directly; an API change once left several of them
failing at import with nobody noticing. ``benchmarks/run_all.py`` lists a smoke run for
each script (``SMOKE``): a tiny configuration that writes only into a temporary
directory. Each runs here in a clean-shell subprocess (``tests/userenv.py``), and a
script without a smoke entry fails the test.
"""

import importlib.util
import os
import subprocess

import pytest

import userenv

REPO = userenv.REPO
BENCHMARKS = os.path.join(REPO, "benchmarks")


def _run_all():
  spec = importlib.util.spec_from_file_location("run_all", os.path.join(BENCHMARKS,
                                                                        "run_all.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


RUN_ALL = _run_all()
# Minutes of CPU even when tiny (TFF training runs): with the slow tests; their --help
# runs in the default suite.
# Smoke runs of more than ~10 s of CPU: the slow suite runs them (their --help runs here).
SLOW = {"training_pydocs.py", "training_adaptive.py", "bench_harness.py", "bench_engine.py",
        "bench_binary.py",
        "bench_paper_config.py",
        "peer_jax_privacy_bands.py",
        "stackoverflow_data.py", "bench_distributed.py", "bench_aggregation.py",
        "bench_audit.py",
        # The main job's table at n = 16 from a clean shell: test_training_main_job runs it
        # (test_factorization_table_from_a_clean_shell); the multi-participation
        # factorizations are each tested against their papers in the default suite.
        "bench_main_job.py", "bench_multi_participation.py",
        # 7-11 s smoke runs each (the suite's 15-minute budget): their --help runs by default.
        "peer_opake_fixed_bin.py", "bench_noise_limit.py", "bench_discrete_gaussian.py",
        "structured_cache.py"}


def test_every_script_has_a_smoke_run():
  """Every runnable script (a module with a __main__ block; baselines.py is a module the
  factorization benchmark imports) has a smoke run."""
  scripts = set()
  for name in os.listdir(BENCHMARKS):
    if name.endswith(".py"):
      with open(os.path.join(BENCHMARKS, name), encoding="utf-8") as f:
        if '__name__ == "__main__"' in f.read():
          scripts.add(name)
  assert "baselines.py" not in scripts
  assert scripts == set(RUN_ALL.SMOKE)


def test_every_section_has_a_command_and_a_known_script():
  for name, section, commands in RUN_ALL.BENCHMARKS:
    assert commands or name in RUN_ALL.RECORDS, f"section {name} ({section}) has no command"
    if not commands:  # a record written by hand says how its figures were produced
      with open(os.path.join(REPO, "benchmarks", "results", section), encoding="utf-8") as f:
        assert "`" in f.read().split("\n\n", 2)[1], f"record {section} names no command/test"
    for command in commands:
      assert os.path.basename(command[0]) in RUN_ALL.SMOKE, command


def _smoke(script, tmp_path, argv=None):
  out = tmp_path / "out"
  out.mkdir()
  command = RUN_ALL.smoke_command(script, str(out)) if argv is None else [
      RUN_ALL.sys.executable, os.path.join("benchmarks", script), *argv]
  return subprocess.run(command, cwd=REPO, env=userenv.env(home=tmp_path, pythonpath=True),
                        capture_output=True, text=True, timeout=900), out


@pytest.mark.parametrize("script", sorted(set(RUN_ALL.SMOKE) - SLOW))
def test_smoke_run(script, tmp_path):
  result, out = _smoke(script, tmp_path)
  assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
  if RUN_ALL.SMOKE[script] != ("--help",):
    assert any(name.endswith(".md") for _, _, files in os.walk(out) for name in files)


@pytest.mark.parametrize("script", sorted(SLOW))
def test_help_of_slow_scripts(script, tmp_path):
  result, _ = _smoke(script, tmp_path, ["--help"])
  assert result.returncode == 0, result.stderr[-4000:]


@pytest.mark.slow
@pytest.mark.parametrize("script", sorted(SLOW))
def test_smoke_run_slow(script, tmp_path):
  result, out = _smoke(script, tmp_path)
  assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
  assert any(name.endswith(".md") for _, _, files in os.walk(out) for name in files)


def test_training_notes_describe_the_square_root_families(tmp_path):
  """The multi-epoch section's notes state b and the noise state rows each run recorded."""
  spec = importlib.util.spec_from_file_location(
      "training_pydocs", os.path.join(BENCHMARKS, "training_pydocs.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  for name, bands, rows in (("banded_inverse", 24, 23), ("bsr", 12, 11)):
    run = tmp_path / "runs" / f"{name}-seed3"
    run.mkdir(parents=True)
    (run / "summary.json").write_text(
        f'{{"mechanism_info": {{"bands": {bands}, "state_rows": {rows}}}}}')
  notes = module.family_notes(str(tmp_path), ["tree", "banded_inverse", "bsr"], 3).splitlines()
  assert len(notes) == 2
  assert "b = 24 bands" in notes[0] and "b − 1 = 23 model-sized rows" in notes[0]
  assert "b = 12 bands" in notes[1] and "b − 1 = 11 noise rows" in notes[1]
  assert module.family_notes(str(tmp_path), ["tree", "blt"], 3) == ""


def test_benchmarks_md_is_exactly_what_run_all_assembles(tmp_path):
  """BENCHMARKS.md is assembled from benchmarks/results/*.md: text written into
  BENCHMARKS.md alone (a pilot record, a reading) would be lost by the next `make bench`.
  Edit the section's results file and run `benchmarks/run_all.py --assemble-only`."""
  assembled = RUN_ALL.assemble(str(tmp_path / "BENCHMARKS.md"))
  with open(assembled, encoding="utf-8") as f:
    ours = f.read()
  with open(os.path.join(REPO, "BENCHMARKS.md"), encoding="utf-8") as f:
    committed = f.read()
  drop_python = lambda text: "\n".join(  # noqa: E731  (the header names this interpreter)
      line for line in text.splitlines() if "no GPU (Python" not in line)
  assert drop_python(ours) == drop_python(committed), (
      "BENCHMARKS.md differs from the assembled results files: edit "
      "benchmarks/results/<section>.md and run benchmarks/run_all.py --assemble-only")
