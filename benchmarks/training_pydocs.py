"""The main job's comparison with other seeds or settings (``training.main_job.run_main_job``).

The main job (``make demo``) trains TFF's tree against the MF mechanisms of
``training.main_job.MAIN_JOB_MECHANISMS`` once per pinned seed and compares them on
test loss (mean ± std, paired differences to the tree with a 95% t-interval,
``training.report``). This script runs the same comparison with the seeds and
overrides given here and copies its ``results.md`` and ``training.png`` to
``benchmarks/results/training.md`` / ``training_pydocs.png``.

  nice .venv/bin/python benchmarks/training_pydocs.py --seeds 0 1 2 3 4 --out out/bench_training
  .venv/bin/python benchmarks/training_pydocs.py --smoke --out /tmp/x \
      --results_md /tmp/x/training.md   # synthetic data, 2 rounds, one seed (a minute)

The section's command states every setting it ran with (rounds, clients, ε), so it
reproduces the section whatever the main job's defaults are.

With ``--mechanisms`` it compares other mechanisms (the first is the baseline), for
example the multi-epoch comparison of TFF's tree, independent noise (TFF's
``gaussian_fixed``), banded, BLT and the fixed-epoch optimum for momentum at equal ε
under the main job's fixed-epoch schema, and BandInvMF and BSR against the tree:

  nice .venv/bin/python benchmarks/training_pydocs.py --mechanisms tree gaussian banded blt \
      opt_momentum --out out/bench_multi_epoch --results_md benchmarks/results/training_multi_epoch.md
  nice .venv/bin/python benchmarks/training_pydocs.py --mechanisms tree banded_inverse bsr \
      --out out/bench_multi_epoch --results_md benchmarks/results/training_square_root.md

When ``gaussian`` is among them, the section adds each matrix mechanism's paired
test-loss difference to it (the papers' claim: MF ahead of independent noise in
multi-epoch training; Choquette-Choo et al. 2023, arXiv:2211.06530, Sec 6).

Finished runs under ``<out>/runs/`` are reused (the runs resume from checkpoints).
"""

import argparse
import json
import os
import platform
import shutil
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from training import config as config_lib  # pylint: disable=g-import-not-at-top,wrong-import-position

DEFAULT_OUT = os.path.join("out", "bench_training")
DEFAULT_RESULTS_MD = os.path.join(REPO, "benchmarks", "results", "training.md")
MACHINE = "2-core x86_64 CPU, 24 GB, no GPU"


# "How to read this" lines for the square-root families (formatted with the first seed's
# mechanism_info): what they are and the noise memory their stream takes.
FAMILY_NOTES = {
    "banded_inverse": (
        "- BandInvMF (`banded_inverse`; Kalinin, Lampert et al. 2025, arXiv:2505.12128): C⁻¹ "
        "is lower-triangular Toeplitz with b = {bands} bands (the family's default for this "
        "schema: its separation, n/k rounds for k fixed epochs), its b coefficients optimized "
        "for the schema's rmse, started from BISR's closed form. Round i's noise (C⁻¹Z)[i] "
        "needs only the last b rows of Z: the stateful stream trained here keeps "
        "b − 1 = {state_rows} model-sized rows; `noise_stream=\"stateless\"` (the same noise) "
        "keeps none and regenerates the b rows from the seed each round."),
    "bsr": (
        "- BSR (`bsr`; Kalinin and Lampert 2024, arXiv:2405.13763): C is the banded truncation "
        "of the workload's square root to b = {bands} bands (the same default), in closed form "
        "without optimization. C is banded, so the noise C⁻¹Z is a recurrence over the last "
        "b − 1 = {state_rows} noise rows, kept as model-sized state; its C⁻¹ is dense, so the "
        "stateless stream would regenerate all i rows of Z in round i."),
}


def family_notes(out: str, mechanisms, seed: int) -> str:
  """``FAMILY_NOTES`` lines of the trained mechanisms ("" when none is among them)."""
  lines = []
  for name in mechanisms:
    if name in FAMILY_NOTES:
      path = os.path.join(out, "runs", f"{name}-seed{seed}", "summary.json")
      with open(path, encoding="utf-8") as f:
        info = json.load(f)["mechanism_info"]
      lines.append(FAMILY_NOTES[name].format(bands=info["bands"], state_rows=info["state_rows"]))
  return "".join(line + "\n" for line in lines)


def vs_independent_noise(mechanisms: dict) -> str:
  """Paired test-loss differences of each matrix mechanism to ``gaussian`` ("" without it).

  ``mechanisms``: the ``mechanisms`` entry of the main job's results.json.
  """
  from training import report  # pylint: disable=g-import-not-at-top
  if "gaussian" not in mechanisms:
    return ""
  reference = mechanisms["gaussian"]["loss"]["per_seed"]
  rows = []
  for name, entry in mechanisms.items():
    if name in ("gaussian", "tree", "none"):
      continue
    d = report.paired(entry["loss"]["per_seed"], reference, lower_is_better=True)
    low, high = d["interval"]
    interval = "—" if low is None else f"[{low:+.4f}, {high:+.4f}]"
    rows.append(f"| {entry['label']} | {d['mean']:+.4f} ± {d['std']:.4f} ({interval}) | "
                 f"{d['verdict']}, better for {d['better_for_seeds']}/{len(d['per_seed'])} "
                 "seeds |")
  if not rows:
    return ""
  return "\n".join(["", "### Against independent noise (TFF's gaussian_fixed, same ε and schema)",
                    "", f"| mechanism | paired Δ test loss vs gaussian (mean ± std; "
                    f"{int(report.CONFIDENCE * 100)}% interval) | verdict |",
                    "| --- | --- | --- |", *rows]) + "\n"


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
  parser.add_argument("--out", default=DEFAULT_OUT)
  parser.add_argument("--cache_dir", default=None)
  parser.add_argument("--data_dir", default=None)
  parser.add_argument("--total_rounds", type=int, default=None)
  parser.add_argument("--clients_per_round", type=int, default=None)
  parser.add_argument("--target_epsilon", type=float, default=None)
  parser.add_argument("--results_md", default=DEFAULT_RESULTS_MD)
  parser.add_argument("--mechanisms", nargs="+", default=None,
                      help="mechanisms to train, the first is the baseline (default: the main "
                      "job's)")
  parser.add_argument("--smoke", action="store_true",
                      help="synthetic data, 2 rounds x 2 clients, seed 0 only: checks that the "
                      "script runs")
  config_lib.add_engine_flag(parser)
  args = parser.parse_args(argv)
  from training import main_job  # pylint: disable=g-import-not-at-top
  settings = {k: v if v is not None else main_job.MAIN_JOB_DEFAULTS[k]
              for k, v in (("total_rounds", args.total_rounds),
                           ("clients_per_round", args.clients_per_round),
                           ("target_epsilon", args.target_epsilon))}
  mechanisms = list(args.mechanisms or main_job.MAIN_JOB_MECHANISMS)
  flags = "".join(f" --{k} {v:g}" for k, v in settings.items())
  if args.mechanisms:
    flags = f" --mechanisms {' '.join(mechanisms)}{flags}"
  if args.engine != config_lib.DEFAULT_ENGINE:
    flags += f" --engine {args.engine}"
  if args.smoke:
    flags = " --smoke" + (f" --mechanisms {' '.join(mechanisms)}" if args.mechanisms else "")
    args.seeds = [0]
    settings.update(total_rounds=2, clients_per_round=2, dataset="synthetic", vocab_size=100,
                    rounds_per_eval=1, rounds_per_checkpoint=1, max_validation_elements=32,
                    max_test_elements=32)
  code = main_job.run_main_job(args.out, args.cache_dir, data_dir=args.data_dir,
                               mechanisms=mechanisms, seeds=args.seeds, engine=args.engine,
                               **settings)
  if code not in (0, 2):
    raise SystemExit(f"main job failed with exit code {code}")
  name = os.path.splitext(os.path.basename(args.results_md))[0]
  png = "training_pydocs.png" if name == "training" else f"{name}.png"
  with open(os.path.join(args.out, "results.md"), encoding="utf-8") as f:
    text = f.read().replace("(training.png)", f"({png})")
  for flag, value, default in (("out", args.out, DEFAULT_OUT),
                                ("results_md", args.results_md, DEFAULT_RESULTS_MD)):
    if os.path.abspath(value) != os.path.abspath(default):
      flags += f" --{flag} {os.path.relpath(value, REPO)}"
  command = (f"nice .venv/bin/python benchmarks/training_pydocs.py --seeds "
             f"{' '.join(map(str, args.seeds))}{flags}")
  title = ("## Training (main job settings):" if not args.mechanisms else
           f"## Training, {' vs '.join(mechanisms)}:")
  text = text.replace("# Main job:", title, 1)
  for heading in ("## Privacy", "## Results", "## How to read this"):  # subsections here
    text = text.replace(f"\n{heading}\n", f"\n#{heading}\n", 1)
  header, _, rest = text.partition("\n\n")
  with open(os.path.join(args.out, "results.json"), encoding="utf-8") as f:
    runs = json.load(f)["mechanisms"]
  rest = rest.rstrip("\n") + "\n" + family_notes(args.out, mechanisms, args.seeds[0])
  rest += vs_independent_noise(runs)
  trained = sum(sum(e["wall_seconds"]) for e in runs.values())
  section = (f"{header}\n\nCommand: `{command}`  \nMachine: {MACHINE} (wall times depend on "
             f"the load; {trained:.0f} s of training in all, the sum of the runs' wall times; "
             f"Python {platform.python_version()}).\n\n{rest}")
  os.makedirs(os.path.dirname(os.path.abspath(args.results_md)), exist_ok=True)
  with open(args.results_md, "w", encoding="utf-8") as f:
    f.write(section)
  shutil.copy(os.path.join(args.out, "training.png"),
              os.path.join(os.path.dirname(os.path.abspath(args.results_md)), png))
  print(section)


if __name__ == "__main__":
  main()
