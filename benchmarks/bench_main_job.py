"""The main job (``make demo``) end to end on an empty cache: wall time of each part.

Runs ``python -m training.main_job --output_dir <tmp>/demo`` (what ``make demo`` runs)
in a subprocess whose ``TFF_MF_CACHE`` is a fresh directory, so the run includes the
factorizations of the √L table and the docstring-dataset build. Parts: the √L table
and plots (``factorizations.json``), each mechanism's training run (its
``summary.json`` wall time), and the rest (the dataset build, task construction,
interpreter start) as the difference to the total. Then the job's own result table.
Writes ``benchmarks/results/main_job.md``.

  nice -n 10 .venv/bin/python benchmarks/bench_main_job.py           # about 7 min idle
  .venv/bin/python benchmarks/bench_main_job.py --smoke --out-dir /tmp/x  # table only, n = 16
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(REPO, "benchmarks", "results")
MACHINE = "2-core x86_64 CPU, 24 GB, no GPU"


def run_job(job_args, workdir):
  """(exit code, wall seconds, stderr tail, CPU seconds) of the main job on an empty cache.

  CPU seconds: user + system of the job and the processes it waited for (TFF's workers).
  """
  env = dict(os.environ, TFF_MF_CACHE=os.path.join(workdir, "cache"), PYTHONPATH=REPO,
             TF_CPP_MIN_LOG_LEVEL="3")
  before = resource.getrusage(resource.RUSAGE_CHILDREN)
  start = time.perf_counter()
  proc = subprocess.run([sys.executable, "-m", "training.main_job",
                         "--output_dir", os.path.join(workdir, "demo"), *job_args],
                        cwd=REPO, env=env, capture_output=True, text=True)
  wall = time.perf_counter() - start
  after = resource.getrusage(resource.RUSAGE_CHILDREN)
  cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
  return proc.returncode, wall, proc.stderr[-3000:], cpu


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--smoke", action="store_true",
                      help="n = 16 and --skip_training: checks that the script runs (seconds)")
  parser.add_argument("--out-dir", default=RESULTS)
  args = parser.parse_args(argv)
  job_args = ["--table_rounds", "16", "--skip_training"] if args.smoke else []
  os.makedirs(args.out_dir, exist_ok=True)
  load_start = os.getloadavg()[0]
  with tempfile.TemporaryDirectory() as workdir:
    code, total, stderr, cpu = run_job(job_args, workdir)
    if code not in (0, 2):
      print(stderr, file=sys.stderr)
      raise SystemExit(f"the main job failed with exit code {code}")
    with open(os.path.join(workdir, "demo", "factorizations.json"), encoding="utf-8") as f:
      table = json.load(f)
    results, job_table = None, ""
    results_path = os.path.join(workdir, "demo", "training", "results.json")
    if os.path.exists(results_path):
      with open(results_path, encoding="utf-8") as f:
        results = json.load(f)
      with open(os.path.join(workdir, "demo", "training", "results.md"), encoding="utf-8") as f:
        body = f.read().split("\n", 1)[1]  # without the title
      job_table = body.split("## How to read this")[0].replace("(training.png)",
                                                               "(main_job_training.png)")
      shutil.copy(os.path.join(workdir, "demo", "training", "training.png"),
                  os.path.join(args.out_dir, "main_job_training.png"))
  load_end = os.getloadavg()[0]
  parts = [("factorization table and plots", table["wall_seconds"])]
  if results:
    rounds = results["settings"]["total_rounds"]
    parts += [(f"{name} ({rounds} rounds, {len(entry['wall_seconds'])} seeds)",
               sum(entry["wall_seconds"])) for name, entry in results["mechanisms"].items()]
  parts.append(("dataset build, task, interpreter (the rest)",
                total - sum(seconds for _, seconds in parts)))
  settings = results["settings"] if results else {}
  command = ".venv/bin/python benchmarks/bench_main_job.py" + "".join(
      f" {a}" for a in (argv if argv is not None else sys.argv[1:]))
  lines = ["## Main job (`make demo`): wall time on 2 cores", "",
           f"Command: `{command}` — runs `python -m training.main_job"
           f"{''.join(' ' + a for a in job_args)}` (what `make demo` runs) with an empty "
           "cache, so the run includes the n = "
           f"{table['n']} factorizations and the docstring-dataset build. Machine: {MACHINE} "
           f"({platform.machine()}, Python {platform.python_version()}); 1-minute load "
           f"average {load_start:.1f} at the start, {load_end:.1f} at the end. Exit code "
           f"{code}.", ""]
  if settings:
    schedule = settings.get("lr_schedule", "constant")
    if schedule != "constant":
      schedule += f" over the last {settings['schedule_rounds']} rounds"
    lines += [f"Settings: `{settings['dataset']}`, {settings['total_rounds']} rounds × "
              f"{settings['clients_per_round']} clients per run (at most "
              f"{settings['max_elements_per_client']} sentences each), "
              f"{settings['schema_text']}, seeds {', '.join(map(str, results['seeds']))}, ε = "
              f"{settings['target_epsilon']:g}, δ = {settings['delta']:g}, client / server "
              f"learning rate {settings['client_lr']:g} / {settings['server_lr']:g} (momentum "
              f"{settings['server_momentum']:g}, {schedule}), LSTM "
              f"{settings['embedding_size']}/{settings['lstm_size']}/"
              f"{settings['projection_size']} ({settings.get('lstm_kernel', 'keras')} kernel), "
              f"vocabulary {settings['vocab_size']} with "
              f"{settings['num_oov_buckets']} OOV buckets, engine "
              f"{settings.get('engine', 'tff')}.", ""]
  lines += ["| part | wall s |", "| --- | --- |"]
  lines += [f"| {name} | {seconds:.0f} |" for name, seconds in parts]
  lines += [f"| **total** | **{total:.0f}** ({total / 60:.1f} min) |", "",
            f"CPU time of the job and its TFF worker processes: {cpu:.0f} s (user + system; "
            f"{cpu / 60:.1f} min): on 2 idle cores that is between {cpu / 120:.1f} min of wall "
            f"(both kept busy) and {cpu / 72:.1f} min (the about 1.2 cores the TensorFlow "
            "client step keeps busy).", ""]
  if job_table:
    lines += ["What the job reported in this run (its results.md without the reading notes):",
              "", job_table.strip(), ""]
  with open(os.path.join(args.out_dir, "main_job.md"), "w", encoding="utf-8") as f:
    f.write("\n".join(lines))
  print("\n".join(lines))
  return 0


if __name__ == "__main__":
  sys.exit(main())
