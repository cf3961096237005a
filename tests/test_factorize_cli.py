"""`tff-mf factorize`, `tff-mf cache` and `tff-mf plot`, run as the user runs them."""

import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest

import userenv
from tff_mf.factorization import cache
from tff_mf.factorization import toeplitz_ops

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
JSON_KEYS = ("single_participation_sqrt_loss", "single_participation_loss", "n", "relative_gap", "iterations", "seconds", "path",
             "cache_hit")


def error_lines(stderr):
  """The command's own messages (progress bars also write to stderr)."""
  return [line for line in stderr.splitlines() if line.startswith("tff-mf")]


def run_cli(*args, cache_dir=None, env_cache=None):
  env = userenv.env()
  env.pop("TFF_MF_CACHE", None)
  if env_cache is not None:
    env["TFF_MF_CACHE"] = str(env_cache)
  argv = [sys.executable, "-m", "tff_mf.cli", *map(str, args)]
  if cache_dir is not None:
    argv += ["--cache_dir", str(cache_dir)]
  return subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)


def test_factorize_json_then_fast_hit(tmp_path):
  first = run_cli("factorize", "--workload", "prefix_sum", "--mechanism", "optimal",
                  "--total_rounds", 64,
                  "--json", cache_dir=tmp_path)
  assert first.returncode == 0, first.stderr
  record = json.loads(first.stdout)
  for key in JSON_KEYS:
    assert key in record
  assert record["n"] == 64 and record["cache_hit"] is False
  assert record["relative_gap"] <= 1e-6
  assert record["single_participation_loss"] == pytest.approx(record["single_participation_sqrt_loss"] ** 2)
  assert os.path.isfile(record["path"])
  before = os.stat(record["path"]).st_mtime_ns
  second = run_cli("factorize", "--workload", "prefix_sum", "--mechanism", "optimal",
                   "--total_rounds", 64,
                   "--json", cache_dir=tmp_path)
  assert second.returncode == 0, second.stderr
  hit = json.loads(second.stdout)
  assert hit["cache_hit"] is True and hit["path"] == record["path"]
  # JSON says the same as the text below: the gap of a hit is the solver's record.
  assert record["not_rechecked"] == [] and hit["not_rechecked"] == ["relative_gap"]
  assert hit["single_participation_sqrt_loss"] == record["single_participation_sqrt_loss"]
  # A hit reads the entry and recomputes nothing (its speed is measured in BENCHMARKS.md's
  # cache section, not asserted here: wall time depends on the machine's load).
  assert os.stat(record["path"]).st_mtime_ns == before
  assert hit.get("iterations") == record.get("iterations")
  # The text of a hit shows the recomputed figures; the duality gap, which a hit cannot
  # recompute, is labelled as the solver's record.
  text = run_cli("factorize", "--workload", "prefix_sum", "--mechanism", "optimal",
                 "--total_rounds", 64,
                 cache_dir=tmp_path)
  gap = [line for line in text.stdout.splitlines() if "relative gap" in line]
  assert len(gap) == 1 and gap[0].endswith("(the solver's record, not rechecked)"), text.stdout


def test_hit_path_imports_no_tensorflow_or_matplotlib(tmp_path):
  code = (
      "import sys\n"
      "from tff_mf import cli\n"
      f"rc = cli.main(['factorize', '--mechanism', 'identity', '--total_rounds', '8', '--json', "
      f"'--cache_dir', {str(tmp_path)!r}])\n"
      "heavy = [m for m in ('tensorflow', 'tensorflow_federated', 'matplotlib') "
      "if m in sys.modules]\n"
      "print('HEAVY', heavy)\n"
      "sys.exit(rc)\n")
  for _ in range(2):  # miss, then hit
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                         timeout=120, env=userenv.env())
    assert out.returncode == 0, out.stderr
    assert "HEAVY []" in out.stdout


def test_momentum_schedule_and_structured_flags(tmp_path):
  out = run_cli("factorize", "--workload", "momentum", "--momentum", 0.9, "--lr_schedule",
                "cooldown", "--schedule_rounds", 8, "--mechanism", "structured", "--bands", 2,
                "--rank", 2, "--total_rounds", 32, "--json", cache_dir=tmp_path)
  assert out.returncode == 0, out.stderr
  record = json.loads(out.stdout)
  assert record["params"]["workload"] == {"kind": "momentum", "n": 32, "momentum": 0.9,
                                          "lr_schedule": "cooldown", "schedule_rounds": 8}
  assert record["params"]["bands"] == 2 and record["params"]["rank"] == 2
  f = cache.load(record["path"], full_check=True)
  assert f.strategy == "structured"
  # Progress goes to stderr, never into the JSON on stdout.
  assert out.stdout.count("\n") == 1


def test_structured_als_flag_drives_the_fit_and_the_warning_names_it(tmp_path):
  """The README's structured example warned "not converged" with no remedy, and no flag
  changed the ALS fit behind it: --als_iterations does, and the warning names it."""
  args = ("factorize", "--mechanism", "structured", "--bands", 5, "--rank", 4, "--total_rounds",
          512)
  text = run_cli(*args, cache_dir=tmp_path)
  assert text.returncode == 0, text.stderr
  warnings = [line for line in text.stdout.splitlines() if "warning" in line]
  assert all("--als_iterations" in line for line in warnings), warnings
  records = {}
  for sweeps in (3, 7):
    out = run_cli(*args, "--als_iterations", sweeps, "--json", cache_dir=tmp_path)
    assert out.returncode == 0, out.stderr
    records[sweeps] = json.loads(out.stdout)
    assert records[sweeps]["cache_hit"] is False and records[sweeps]["iterations"] == sweeps
    assert "--als_iterations" in records[sweeps]["outcome"]["why"]
  assert records[3]["path"] != records[7]["path"]  # part of the cache key
  refused = run_cli("factorize", "--mechanism", "optimal", "--total_rounds", 8, "--als_iterations",
                    5,
                    cache_dir=tmp_path)
  assert refused.returncode == 2 and "--als_iterations does not apply" in refused.stderr


def test_env_var_cache_location(tmp_path):
  out = run_cli("factorize", "--mechanism", "honaker_online", "--total_rounds", 16, "--json",
                env_cache=tmp_path / "env_cache")
  assert out.returncode == 0, out.stderr
  assert json.loads(out.stdout)["path"].startswith(str(tmp_path / "env_cache"))


def test_force_recomputes(tmp_path):
  args = ("factorize", "--mechanism", "honaker_full", "--total_rounds", 16, "--json")
  assert json.loads(run_cli(*args, cache_dir=tmp_path).stdout)["cache_hit"] is False
  assert json.loads(run_cli(*args, "--force", cache_dir=tmp_path).stdout)["cache_hit"] is False
  assert json.loads(run_cli(*args, cache_dir=tmp_path).stdout)["cache_hit"] is True


def test_cache_list_and_verify_exit_codes(tmp_path):
  for strategy in ("identity", "honaker_online"):
    assert run_cli("factorize", "--mechanism", strategy, "--total_rounds", 16,
                   cache_dir=tmp_path).returncode == 0
  listed = run_cli("cache", "list", "--json", cache_dir=tmp_path)
  assert listed.returncode == 0, listed.stderr
  entries = json.loads(listed.stdout)["entries"]
  assert sorted(e["strategy"] for e in entries) == ["honaker_online", "identity"]
  table = run_cli("cache", "list", cache_dir=tmp_path)
  assert "honaker_online" in table.stdout and "74" not in table.stderr
  ok = run_cli("cache", "verify", cache_dir=tmp_path)
  assert ok.returncode == 0, ok.stdout + ok.stderr
  # Corrupt one entry: verify fails and names it.
  bad_path = next(e["npz_path"] for e in entries if e["strategy"] == "identity")
  with open(bad_path, "r+b") as f:
    f.seek(200)
    f.write(b"\x00garbage\x00")
  bad = run_cli("cache", "verify", cache_dir=tmp_path)
  assert bad.returncode == 1
  assert os.path.dirname(bad_path) in bad.stdout and "BAD" in bad.stdout
  as_json = json.loads(run_cli("cache", "verify", "--json", cache_dir=tmp_path).stdout)
  assert as_json["bad"] == 1
  # The corrupt entry is refused by factorize too (exit 2, one line naming it), and --force fixes it.
  refused = run_cli("factorize", "--mechanism", "identity", "--total_rounds", 16,
                    cache_dir=tmp_path)
  assert refused.returncode == 2 and os.path.dirname(bad_path) in refused.stderr
  assert len(error_lines(refused.stderr)) == 1
  assert "--force" in error_lines(refused.stderr)[0]  # the one line says how to recompute it
  assert run_cli("factorize", "--mechanism", "identity", "--total_rounds", 16, "--force",
                 cache_dir=tmp_path).returncode == 0
  assert run_cli("cache", "verify", cache_dir=tmp_path).returncode == 0


def test_user_matrix_file_workload(tmp_path):
  rng = np.random.default_rng(3)
  a = np.tril(rng.uniform(0.2, 1.0, (24, 24))) + np.eye(24)
  path = tmp_path / "a.npy"
  np.save(path, a)
  out = run_cli("factorize", "--matrix_file", path, "--mechanism", "optimal", "--json",
                cache_dir=tmp_path / "c")
  assert out.returncode == 0, out.stderr
  record = json.loads(out.stdout)
  assert record["n"] == 24 and record["params"]["workload"]["kind"] == "file"
  f = cache.load(record["path"], full_check=True)
  np.testing.assert_allclose(f.a, a)
  np.testing.assert_allclose(f.b @ f.c, a, atol=1e-8)
  # Same contents under another name: a cache hit.
  np.save(tmp_path / "copy.npy", a)
  again = json.loads(run_cli("factorize", "--matrix_file", tmp_path / "copy.npy", "--mechanism",
                             "optimal", "--json", cache_dir=tmp_path / "c").stdout)
  assert again["cache_hit"] is True


@pytest.mark.parametrize("name,matrix,message", [
    ("singular", np.tril(np.ones((6, 6))) - np.diag([0, 0, 1, 0, 0, 0]), "singular"),
    ("upper", np.triu(np.ones((6, 6))), "lower triangular"),
    ("nonsquare", np.ones((6, 5)), "square"),
    ("nan", np.where(np.eye(6) > 0, np.nan, 0.0), "non-finite"),
])
def test_invalid_matrix_files_fail_with_one_line(tmp_path, name, matrix, message):
  path = tmp_path / f"{name}.npy"
  np.save(path, matrix)
  out = run_cli("factorize", "--matrix_file", path, "--mechanism", "optimal", "--json",
                cache_dir=tmp_path / "c")
  assert out.returncode == 2
  lines = error_lines(out.stderr)
  assert len(lines) == 1 and message in lines[0] and str(path) in lines[0]
  assert "Traceback" not in out.stderr
  assert out.stdout == ""
  assert not (tmp_path / "c").exists() or cache.list_entries(str(tmp_path / "c")) == []


@pytest.mark.parametrize("args,message", [
    (("--mechanism", "optimal"), "--total_rounds is required"),
    (("--mechanism", "optimal", "--total_rounds", 0), "--total_rounds must be"),
    (("--mechanism", "identity", "--total_rounds", 8, "--bands", 2), "--bands does not apply"),
    (("--mechanism", "identity", "--total_rounds", 8, "--rank", 2), "--rank does not apply"),
    (("--mechanism", "structured", "--total_rounds", 8, "--bands", 0, "--rank", 1), "bands"),
    (("--workload", "momentum", "--momentum", 1.5, "--mechanism", "identity", "--total_rounds", 8),
     "[0, 1)"),
    (("--workload", "momentum", "--lr_schedule", "decay", "--schedule_rounds", 99,
      "--mechanism", "identity", "--total_rounds", 8), "schedule_rounds"),
    (("--mechanism", "optimal", "--total_rounds", 8, "--target_gap", 0), "target_gap"),
    (("--matrix_file", "/nonexistent/a.npy", "--mechanism", "optimal"), "does not exist"),
])
def test_invalid_arguments_fail_with_one_line(tmp_path, args, message):
  out = run_cli("factorize", *args, cache_dir=tmp_path)
  assert out.returncode == 2, out.stdout + out.stderr
  lines = error_lines(out.stderr)
  assert len(lines) == 1 and message in lines[0], out.stderr
  assert "Traceback" not in out.stderr


def test_unconverged_is_an_error_unless_allowed(tmp_path):
  args = ("factorize", "--workload", "momentum", "--mechanism", "optimal", "--total_rounds", 64,
          "--target_gap", 1e-12, "--max_iterations", 2, "--json")
  refused = run_cli(*args, cache_dir=tmp_path)
  assert refused.returncode == 2 and len(error_lines(refused.stderr)) == 1
  assert "gap reached" in error_lines(refused.stderr)[0]
  assert cache.list_entries(str(tmp_path)) == []
  allowed = run_cli(*args, "--allow_unconverged", cache_dir=tmp_path)
  assert allowed.returncode == 0, allowed.stderr
  assert json.loads(allowed.stdout)["relative_gap"] > 1e-12


def test_plot_writes_pngs(tmp_path):
  out = run_cli("plot", "--total_rounds", 32, "--momentum", 0.9, "--output_dir", tmp_path / "plots",
                cache_dir=tmp_path / "c")
  assert out.returncode == 0, out.stderr
  paths = out.stdout.split()
  assert len(paths) == 4
  for path in paths:
    with open(path, "rb") as f:
      assert f.read(8) == b"\x89PNG\r\n\x1a\n"
  names = sorted(os.path.basename(p) for p in paths)
  assert names == ["heatmap_optimal_momentum0.9_n32.png", "heatmap_optimal_prefix_sum_n32.png",
                   "variance_momentum0.9_n32.png", "variance_prefix_sum_n32.png"]


def test_bare_command_prints_help_and_version_exists():
  out = run_cli()
  assert out.returncode == 0 and "usage: tff-mf" in out.stdout and "factorize" in out.stdout
  version = run_cli("--version")
  assert version.returncode == 0 and version.stdout.startswith("tff-mf ")


@pytest.mark.parametrize("strategy", ["optimal", "honaker_online", "banded", "blt",
                                      "banded_toeplitz", "structured", "identity"])
def test_one_round_is_a_valid_factorization(tmp_path, strategy):
  out = run_cli("factorize", "--mechanism", strategy, "--total_rounds", 1, "--json",
                cache_dir=tmp_path)
  assert out.returncode == 0, out.stderr
  record = json.loads(out.stdout)
  with np.load(record["path"]) as d:  # dense A, B, C or (Toeplitz) their first columns
    a, b, c = (d[k] if k in d.files else toeplitz_ops.lower_toeplitz(d[f"{k}_column"])
               for k in "ABC")
    np.testing.assert_allclose(b @ c, a)
  assert record["sensitivity"] == pytest.approx(1.0) and record["rmse"] == pytest.approx(1.0)


@pytest.mark.parametrize("n,strategy", [(10**6, "optimal"), (10**6, "banded"),
                                        (300_000, "identity")])
def test_sizes_that_cannot_fit_are_refused_before_allocating(tmp_path, n, strategy):
  """n = 10⁶ asked for a 7 TiB allocation; now a one-line error with the memory it needs,
  in about the time of the interpreter start, under a 2 GiB address-space limit."""
  code = ("import resource, sys\n"
          "resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))\n"
          "from tff_mf import cli\n"
          f"sys.exit(cli.main(['factorize', '--mechanism', '{strategy}', '--total_rounds', '{n}', "
          f"'--cache_dir', {str(tmp_path)!r}]))\n")
  start = time.perf_counter()
  out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=userenv.env(),
                       capture_output=True, text=True, timeout=120)
  assert out.returncode == 2, out.stderr[-2000:]
  lines = error_lines(out.stderr)
  assert len(lines) == 1 and "needs about" in lines[0] and "iB of memory" in lines[0], out.stderr
  assert "Traceback" not in out.stderr and time.perf_counter() - start < 60


def test_complex_matrix_file_is_refused(tmp_path):
  path = tmp_path / "complex.npy"
  np.save(path, np.tril(np.ones((4, 4))) * (1 + 1j))
  out = run_cli("factorize", "--matrix_file", path, "--mechanism", "optimal", cache_dir=tmp_path)
  assert out.returncode == 2 and "real numbers" in error_lines(out.stderr)[0]


def test_json_is_strict_even_with_unbounded_figures(tmp_path):
  """A non-finite figure is written as the string "inf" (tff_mf.jsonio), never as the non-JSON
  Infinity/NaN."""
  out = run_cli("factorize", "--mechanism", "optimal", "--total_rounds", 8, "--allow_unconverged",
                "--max_iterations", 1, "--target_gap", 1e-12, "--json", cache_dir=tmp_path)
  assert out.returncode == 0, out.stderr
  json.loads(out.stdout, parse_constant=lambda c: pytest.fail(f"non-JSON constant {c}"))
