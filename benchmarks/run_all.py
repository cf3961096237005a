"""Runs the benchmarks and assembles BENCHMARKS.md from their result sections.

Each benchmark script writes a markdown section (command, machine, figures as
ratios against a baseline measured in the same run) and PNGs under
``benchmarks/results/``. This script runs them in sequence and then
concatenates the sections, in a fixed order, into ``BENCHMARKS.md``.

  python benchmarks/run_all.py                 # run everything (hours on 2 cores)
  python benchmarks/run_all.py --only mmcc     # one benchmark
  python benchmarks/run_all.py --assemble-only # just rebuild BENCHMARKS.md
  python benchmarks/run_all.py --smoke         # every script at a tiny size (minutes)

Every section's command below is the one its section states, so ``make bench`` rebuilds
exactly what BENCHMARKS.md shows. ``SMOKE`` gives each script in benchmarks/ a mode that
runs in seconds into a temporary directory (``tests/test_benchmarks.py`` runs them all).
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile
from typing import Dict, List, Sequence, Tuple

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(REPO, "benchmarks", "results")

# (name, result section file, commands). Order = order in BENCHMARKS.md.
BENCHMARKS: Tuple[Tuple[str, str, Tuple[Tuple[str, ...], ...]], ...] = (
    ("factorization", "factorization.md", (("benchmarks/bench_factorization.py",),)),
    ("dense_optimum", "dense_optimum.md", (("benchmarks/bench_dense_optimum.py",
                                            "--baseline-sizes", "1024", "2048", "4096"),)),
    ("structured", "structured_cache.md", (("benchmarks/structured_cache.py", "--full"),)),
    ("aggregation", "aggregation.md", (
        ("benchmarks/bench_aggregation.py", "--rounds", "1", "256", "1024", "2047", "2048",
         "--dense-rounds", "1", "256", "1024", "2048", "--reps", "15", "--dense-reps", "1",
         "--window", "64"),)),
    # BISR's two noise streams beside BLT and gaussian_fixed (the stateless one draws b rows a
    # round, so a shorter run than the full table's).
    ("aggregation_streams", "aggregation_streams.md", (
        ("benchmarks/bench_aggregation.py", "--mechanisms", "blt", "bisr", "bisr_stateless",
         "--reps", "7", "--window", "16", "--name", "aggregation_streams"),)),
    # Each streaming mechanism's noise against its own limit (Philox floor + one pass a state
    # row), and its state's checkpoint save and restore (issue 49, item 5).
    ("noise_limit", "noise_limit.md", (("benchmarks/bench_noise_limit.py",),)),
    # Before (the same script on a checkout of the commit before the change) and more runs:
    # written by hand from those runs.
    ("noise_limit_before", "noise_limit_before.md", ()),
    ("mmcc", "mmcc.md", (("benchmarks/bench_mmcc.py", "fig2"),
                         ("benchmarks/bench_mmcc.py", "fig2", "--c", "4", "8", "--max-log2", "8",
                          "--out", "fig2_small_c"),
                         ("benchmarks/bench_mmcc.py", "fig4"),
                         ("benchmarks/bench_mmcc.py", "speed"),
                         ("benchmarks/bench_mmcc.py", "edges"),
                         ("benchmarks/bench_mmcc.py", "report"))),
    ("toeplitz_on", "toeplitz_on.md", ()),  # a record: tff-mf factorize/account, n ≤ 65,536
    ("multi_participation", "multi_participation.md",
     (("benchmarks/bench_multi_participation.py",),)),  # needs /tmp/peer (jax-privacy)
    ("square_root", "square_root.md", (  # peer: /tmp/peer24 (jax_privacy's newest source)
        ("benchmarks/bench_square_root.py", "--peer-only", "--until-done"),
        ("benchmarks/bench_square_root.py",))),
    ("data", "stackoverflow_data.md", (("benchmarks/stackoverflow_data.py",),)),
    ("harness", "harness.md", (("benchmarks/bench_harness.py",),)),
    ("harness_main_job", "harness_main_job.md", (
        ("benchmarks/bench_harness.py", "--only", "main_job/none:32x16",
         "main_job/opt_momentum:32x16", "--rounds", "5", "--name", "harness_main_job"),)),
    ("engine", "engine.md", (("benchmarks/bench_engine.py",),)),
    # The binary against the engine alone (issue 49); before: the same script on a checkout of
    # the commit before the change (written by hand from that run: it needs the checkout).
    ("binary", "binary.md", (("benchmarks/bench_binary.py",),)),
    ("binary_before", "binary_before.md", ()),
    ("paper_config", "paper_config.md", (("benchmarks/bench_paper_config.py",),)),
    ("main_job", "main_job.md", (("benchmarks/bench_main_job.py",),)),
    # Written by hand: the pilots that chose the main job's regime (issues 21 and 36).
    ("main_job_regimes", "main_job_regimes.md", ()),
    ("multi_epoch_training", "training_multi_epoch.md", (
        ("benchmarks/training_pydocs.py", "--mechanisms", "tree", "gaussian", "banded", "blt",
         "opt_momentum",
         "--seeds", "0", "1", "2", "--out", "out/bench_multi_epoch", "--results_md",
         "benchmarks/results/training_multi_epoch.md"),)),
    # BandInvMF and BSR against TFF's tree, same settings and out directory (the tree's runs
    # are the above's when that ran first).
    ("square_root_training", "training_square_root.md", (
        ("benchmarks/training_pydocs.py", "--mechanisms", "tree", "banded_inverse", "bsr",
         "--seeds", "0", "1", "2", "--out", "out/bench_multi_epoch", "--results_md",
         "benchmarks/results/training_square_root.md"),)),
    ("adaptive_training", "training_adaptive.md", (
        ("benchmarks/training_adaptive.py", "--total_rounds", "24", "--clips", "1", "0.3", "3",
         "--seeds", "0", "1", "2", "--grid_seeds", "0"),)),
    ("distributed", "distributed.md", (("benchmarks/bench_distributed.py", "--rounds=4",
                                        "--clients=4", "--examples=400", "--hidden=256"),)),
    ("audit", "audit.md", (("benchmarks/bench_audit.py",),)),  # peer: /tmp/peer24 (jax_privacy)
    ("one_run_audit", "one_run_audit.md", (("benchmarks/bench_one_run_audit.py",),)),  # peer
    # Written by hand from the runs it names (the binary with --canaries; no script reruns it).
    ("canary_audit", "canary_audit.md", ()),
    ("peer_bands", "peer_bands.md", (("benchmarks/peer_jax_privacy_bands.py",),)),  # /tmp/peer24
    # peer: /tmp/peer-audit (jax_privacy's newest source with jax and optax)
    ("monte_carlo", "monte_carlo.md", (("benchmarks/bench_monte_carlo.py",),)),
    # peer: /tmp/opake-venv (pip install opake-accounting); without it, our side only.
    ("fixed_bin", "fixed_bin.md", (("benchmarks/peer_opake_fixed_bin.py",),)),
    ("flower", "flower.md", (("benchmarks/bench_flower.py",),)),
    ("discrete_gaussian", "discrete_gaussian.md", (("benchmarks/bench_discrete_gaussian.py",),)),
    # Issue 50's planner: where its time goes (a reading of the runs below), then the issue's
    # size (n = 2048, P = 1e5, K = 500) before and after the bound that prunes before
    # factorizing, then smaller sizes with its ratio of rounds to cohorts of K clients (about
    # 10 participations a client); each run stops at its budget.
    ("planner_speed", "planner_speed.md", ()),
    ("planner", "planner.md", (("benchmarks/bench_planner.py", "--skip-mmcc", "--budget", "600",
                                "--name", "planner"),)),
    ("planner_2048", "planner_2048.md", (("benchmarks/bench_planner.py", "--skip-mmcc",
                                          "--budget", "600", "--name", "planner_2048"),)),
    ("planner_2048_mmcc", "planner_2048_mmcc.md", (("benchmarks/bench_planner.py", "--budget",
                                                    "1800", "--name", "planner_2048_mmcc"),)),
    ("planner_128", "planner_128.md", (("benchmarks/bench_planner.py", "--total-rounds", "128",
                                        "--population", "400", "--clients-per-round", "32",
                                        "--skip-mmcc", "--budget", "600", "--name",
                                        "planner_128"),)),
    ("planner_64", "planner_64.md", (("benchmarks/bench_planner.py", "--total-rounds", "64",
                                      "--population", "256", "--clients-per-round", "32",
                                      "--skip-mmcc", "--budget", "600", "--name",
                                      "planner_64"),)),
    ("planner_64_mmcc", "planner_64_mmcc.md", (("benchmarks/bench_planner.py", "--total-rounds",
                                                "64", "--population", "256",
                                                "--clients-per-round", "32", "--budget",
                                                "1200", "--name", "planner_64_mmcc"),)),
)

# script -> arguments of a run in seconds that writes only under OUT (a temporary directory).
SMOKE: Dict[str, Tuple[str, ...]] = {
    "bench_factorization.py": ("--smoke", "--out-dir", "{out}"),
    "bench_dense_optimum.py": ("--smoke", "--out-dir", "{out}"),
    "structured_cache.py": ("--smoke", "--out-dir", "{out}"),
    "bench_aggregation.py": ("--smoke", "--out", "{out}", "--cache-dir", "{out}/cache"),
    "bench_noise_limit.py": ("--smoke", "--out", "{out}", "--cache-dir", "{out}/cache"),
    "bench_mmcc.py": ("--results-dir", "{out}", "smoke"),
    # Writes benchmarks/results/ only; each part runs minutes (n = 2048 MMCC): --help here.
    "bench_mmcc_toeplitz.py": ("--help",),
    "bench_multi_participation.py": ("--smoke", "--out-dir", "{out}"),
    "bench_square_root.py": ("--smoke", "--out-dir", "{out}"),  # our side only
    "peer_jax_privacy.py": ("--help",),  # runs in the jax-privacy interpreter; --help anywhere
    "stackoverflow_data.py": ("--smoke", "--out-dir", "{out}"),
    "bench_harness.py": ("--smoke", "--out-dir", "{out}"),
    "bench_engine.py": ("--smoke", "--out-dir", "{out}"),
    "peer_pfl.py": ("--help",),  # runs in .venv-bench-pfl (make venv-bench-pfl); --help anywhere
    "bench_binary.py": ("--smoke", "--out-dir", "{out}"),
    "bench_paper_config.py": ("--smoke", "--out-dir", "{out}", "--cache_dir", "{out}/cache"),
    "bench_main_job.py": ("--smoke", "--out-dir", "{out}"),
    "training_pydocs.py": ("--smoke", "--out", "{out}/runs", "--results_md", "{out}/training.md"),
    "training_adaptive.py": ("--smoke", "--out", "{out}/runs", "--results_md",
                             "{out}/training_adaptive.md"),
    "bench_distributed.py": ("--smoke", "--out", "{out}"),
    "run_all.py": ("--help",),
    "bench_audit.py": ("--smoke", "--out-dir", "{out}"),
    "peer_jax_privacy_audit.py": ("--help",),  # runs in the jax_privacy interpreter
    "bench_one_run_audit.py": ("--smoke", "--out-dir", "{out}"),  # our side only
    "peer_jax_privacy_bands.py": ("--smoke", "--out-dir", "{out}"),  # our side only
    "bench_monte_carlo.py": ("--smoke", "--out-dir", "{out}"),  # our side only
    "peer_opake_fixed_bin.py": ("--smoke", "--out-dir", "{out}"),  # our side only
    "bench_flower.py": ("--help",),  # measures in .venv-flower (make venv-flower)
    "bench_discrete_gaussian.py": ("--smoke", "--out-dir", "{out}"),
    "bench_planner.py": ("--smoke", "--out-dir", "{out}"),
}


def smoke_command(script: str, out: str) -> List[str]:
  """The smoke run of ``benchmarks/<script>`` writing under ``out``."""
  return [sys.executable, os.path.join("benchmarks", script),
          *(a.format(out=out) for a in SMOKE[script])]


HEADER = """# Benchmarks

Speed and quality targets of the issues, measured by the scripts in
`benchmarks/` as ratios against a baseline from the same run. Regenerate with
`make bench` (all of them; hours on 2 cores) or
`.venv/bin/python benchmarks/run_all.py --only NAME`; this file is assembled
from the sections in `benchmarks/results/` by
`benchmarks/run_all.py --assemble-only`.

Machine for every figure below unless a section says otherwise: 2-core x86_64
CPU, 24 GB memory, no GPU ({python}). Most measurements of this release were
taken on a machine shared with other jobs (load average 4-14). Each section
states the load it was measured at, and gives CPU seconds where contention
matters. Ratios are always between measurements of the same run.
"""


# Sections written by hand from the runs they name: no script regenerates them, so `make bench`
# keeps them as they are.
RECORDS = frozenset(name for name, _, commands in BENCHMARKS if not commands)


def run(names: Sequence[str]) -> List[str]:
  failed = []
  env = dict(os.environ, PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL="3")
  for name, _, commands in BENCHMARKS:
    if names and name not in names:
      continue
    for command in commands:
      print(f"[bench] {name}: {' '.join(command)}", file=sys.stderr, flush=True)
      code = subprocess.call([sys.executable, *command], cwd=REPO, env=env)
      if code != 0:
        failed.append(f"{name}: {' '.join(command)} (exit {code})")
  return failed


def assemble(path: str = os.path.join(REPO, "BENCHMARKS.md")) -> str:
  parts = [HEADER.format(python=f"Python {platform.python_version()}")]
  for name, section, _ in BENCHMARKS:
    section_path = os.path.join(RESULTS, section)
    if not os.path.exists(section_path):
      parts.append(f"## {name}\n\nNot measured yet: run `benchmarks/run_all.py --only {name}`.\n")
      continue
    with open(section_path, encoding="utf-8") as f:
      text = f.read().strip()
    # Images are referenced relative to benchmarks/results/ inside the sections.
    text = text.replace("](", "](benchmarks/results/").replace(
        "](benchmarks/results/http", "](http").replace(
            "](benchmarks/results/benchmarks/results/", "](benchmarks/results/")
    parts.append(text + "\n")
  content = "\n".join(parts)
  with open(path, "w", encoding="utf-8") as f:
    f.write(content)
  return path


def smoke() -> int:
  """Every script's smoke run, each into its own temporary directory; the failures."""
  env = dict(os.environ, PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL="3")
  failed = 0
  for script in sorted(SMOKE):
    with tempfile.TemporaryDirectory() as out:
      code = subprocess.call(smoke_command(script, out), cwd=REPO, env=env,
                             stdout=subprocess.DEVNULL)
    print(f"[smoke] {script}: {'ok' if code == 0 else f'FAILED (exit {code})'}",
          file=sys.stderr)
    failed += code != 0
  return 1 if failed else 0


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--only", nargs="*", default=[],
                      choices=[name for name, _, _ in BENCHMARKS], help="benchmarks to run")
  parser.add_argument("--assemble-only", action="store_true")
  parser.add_argument("--smoke", action="store_true",
                      help="run every script at a tiny size into temporary directories")
  args = parser.parse_args(argv)
  if args.smoke:
    return smoke()
  failed = [] if args.assemble_only else run(args.only)
  print(f"wrote {assemble()}", file=sys.stderr)
  for line in failed:
    print(f"[bench] FAILED {line}", file=sys.stderr)
  return 1 if failed else 0


if __name__ == "__main__":
  sys.exit(main())
