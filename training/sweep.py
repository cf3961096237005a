"""Runs a grid of training/grids.py with a local process pool; idempotent after a crash.

Usage::

  python -m training.sweep --grid table3_search --dry_run            # table with ε
  python -m training.sweep --grid table3_search --dry_run --json     # the same as JSON
  python -m training.sweep --grid table4_repeats --root_output_dir D --processes 2
  python -m training.sweep --grid table3_search --slice 0:120 --root_output_dir D \\
      --extra_flags="--workers=w1:8000,w2:8000"

Each configuration runs ``training/run_stackoverflow.py`` (by path, so the sweep
works from any directory) with the grid's flags, ``--root_output_dir=D`` and
``--experiment_name=<run name>``
(then the ``--extra_flags``, which override). A run whose
``D/<name>/summary.json`` says ``finished: true`` is skipped, so rerunning the
same command after a crash or a kill only runs what is missing; an unfinished
run is started again with the same command, and the training binary resumes it
from its last checkpoint. A finished summary whose recorded flags differ from
the requested ones is a conflict: it is reported and not overwritten.
Each run's outcome (status, exit code, wall time, summary path, ε, test
accuracy) is appended to ``D/sweep_<grid>.jsonl``; the run's output goes to
``D/<name>/sweep.log``. Run directories are created private (0700), as the
training binary requires (``training.rundir``). Ctrl-C (``tff_mf.interrupt``) is forwarded
to the runs in flight, which checkpoint their current round and exit 130; no new run
starts, and the sweep exits 130 with one line (rerunning resumes); a second Ctrl-C is
forwarded too and the sweep exits at once.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import json
import math
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

from tff_mf import interrupt
from tff_mf import jsonio
from training import config as config_lib
from training import grids
from training import rundir
from training.records import RunSummary

SUMMARY_FILE = "summary.json"
LOG_FILE = "sweep.log"
TRAINING_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "run_stackoverflow.py")
DEFAULT_BINARY = f"{shlex.quote(sys.executable)} {shlex.quote(TRAINING_SCRIPT)}"
# Flags that may differ between a finished run and a rerequest without making it a different run.
FREE_FLAGS = frozenset({"root_output_dir", "experiment_name", "workers", "rounds_per_checkpoint",
                        "cache_dir", "data_dir", "progress", "noise_seed",
                        "report_train_metrics", "engine"})


def parse_slice(text: Optional[str], length: int) -> Tuple[int, int]:
  """``i:j`` (Python slice semantics, negative and empty ends allowed) -> (start, stop)."""
  if text is None:
    return 0, length
  parts = text.split(":")
  if len(parts) != 2:
    raise ValueError(f"--slice must look like i:j, got {text!r}")
  try:
    start = int(parts[0]) if parts[0].strip() else None
    stop = int(parts[1]) if parts[1].strip() else None
  except ValueError:
    raise ValueError(f"--slice must hold integers, got {text!r}") from None
  start, stop, _ = slice(start, stop).indices(length)
  return start, max(start, stop)


def parse_extra_flags(items: Optional[Sequence[str]]) -> List[str]:
  """Splits each ``--extra_flags`` value (shell syntax) into ``--name=value`` arguments."""
  out: List[str] = []
  for item in items or ():
    for token in shlex.split(item):
      if not token.startswith("--") or "=" not in token:
        raise ValueError(f"--extra_flags entries must look like --name=value, got {token!r}")
      if token.split("=", 1)[0][2:].replace("-", "_") == "engine":
        raise ValueError("--engine is a flag of the sweep: give --engine=... to the sweep, not "
                         "in --extra_flags")
      if token.split("=", 1)[0][2:] in ("experiment_name", "root_output_dir"):
        raise ValueError(f"{token.split('=', 1)[0]} is set by the sweep; do not pass it in --extra_flags")
      name, value = token[2:].split("=", 1)
      out.append(f"--{name.replace('-', '_')}={value}")  # one spelling, as the binary reads it
  return out


# Flags the dry run's ε cannot depend on (one Gaussian at z, sensitivity 1: each grid runs
# single participation with C normalized): data, model, optimizer, logistics. Any other flag
# in --extra_flags (z, δ, the schema, the clip norm, the mechanism, a pinned seed...) may
# change the runs' ε, so the dry run then shows none rather than one they may not have.
EPSILON_NEUTRAL_FLAGS = frozenset((
    "dataset", "data_dir", "pydocs_stdlib", "nopydocs_stdlib", "total_rounds",
    "clients_per_round", "client_lr", "server_lr", "server_momentum", "lr_schedule", "schedule_rounds", "cache_dir", "rounds_per_eval",
    "rounds_per_checkpoint", "vocab_size", "num_oov_buckets", "embedding_size", "lstm_size",
    "projection_size", "lstm_kernel", "sequence_length", "max_elements_per_client", "client_batch_size",
    "max_validation_elements", "max_test_elements", "progress", "report_train_metrics",
    "workers", "seed", "engine"))  # both engines add the same noise (tests/test_engine.py)


def epsilon_withheld(extra_flags: Sequence[str]) -> Optional[str]:
  """Why the dry run shows no ε (an --extra_flags flag it does not model), or None."""
  names = [t.split("=", 1)[0] for t in extra_flags
           if t[2:].split("=", 1)[0] not in EPSILON_NEUTRAL_FLAGS]
  if not names:
    return None
  return (f"--extra_flags sets {', '.join(names)}, which the dry run's epsilon (one Gaussian "
          f"at the grid's z, sensitivity 1) does not model; each run's summary.json reports "
          f"its own")


def requested_flag_values(run: grids.RunConfig, extra_flags: Sequence[str]) -> Dict[str, object]:
  values = dict(run.flag_values())
  for token in extra_flags:
    name, value = token[2:].split("=", 1)
    values[name] = value
  return values


def _same_value(recorded, requested, name: str = "") -> bool:
  if name == "mechanism":  # names and aliases of the registry are the same mechanism
    from tff_mf import registry  # pylint: disable=g-import-not-at-top
    try:
      return registry.mechanism(str(recorded)).name == registry.mechanism(str(requested)).name
    except registry.RegistryError:
      return str(recorded) == str(requested)
  if recorded is None or requested is None:
    return recorded is None and (requested is None or str(requested).lower() in ("none", ""))
  if isinstance(recorded, bool) or str(requested).lower() in ("true", "false"):
    return str(recorded).lower() == str(requested).lower()
  if isinstance(recorded, (list, tuple)):
    return ",".join(str(v) for v in recorded) == str(requested)
  try:
    return math.isclose(float(recorded), float(requested), rel_tol=1e-12, abs_tol=0.0)
  except (TypeError, ValueError):
    return str(recorded) == str(requested)


@dataclasses.dataclass(frozen=True, eq=False)
class GridRow(jsonio.Record):
  """One configuration of a dry run (``dry_run_rows``; the ``runs`` of ``--dry_run --json``):
  the grid's run, its ε (None when withheld) and its status in the output directory."""
  index: Optional[int] = None
  name: Optional[str] = None
  mechanism: Optional[str] = None
  noise_multiplier: Optional[float] = None
  delta: Optional[float] = None
  epsilon: Optional[float] = None
  accountant: Optional[str] = None
  paper_epsilon: Optional[float] = None
  client_lr: Optional[float] = None
  server_lr: Optional[float] = None
  server_momentum: Optional[float] = None
  lr_schedule: Optional[str] = None
  schedule_rounds: Optional[int] = None
  clients_per_round: Optional[int] = None
  total_rounds: Optional[int] = None
  seed: Optional[int] = None
  status: Optional[str] = None
  status_detail: Optional[str] = None
  flags: Optional[List[str]] = None


@dataclasses.dataclass(frozen=True, eq=False)
class EpsilonRow(jsonio.Record):
  """ε at one noise multiplier of a grid (``epsilon_table``), with the paper's."""
  noise_multiplier: Optional[float] = None
  delta: Optional[float] = None
  accountant: Optional[str] = None
  epsilon: Optional[float] = None
  paper_epsilon: Optional[float] = None


def read_summary(path: str) -> Optional[RunSummary]:
  """The run's summary.json, or None if absent; ValueError naming the file if corrupt."""
  if not os.path.exists(path):
    return None
  try:
    with open(path) as f:
      summary = json.load(f)
  except (OSError, json.JSONDecodeError) as e:
    raise ValueError(f"corrupt run summary {path}: {e}") from None
  if not isinstance(summary, dict):
    raise ValueError(f"corrupt run summary {path}: expected a JSON object")
  return RunSummary.of_json(summary)


def run_status(run: grids.RunConfig, root_output_dir: Optional[str],
               extra_flags: Sequence[str] = ()) -> Tuple[str, str]:
  """(status, detail): finished | diverged | partial | pending | conflict | corrupt.

  ``finished`` and ``diverged`` are complete runs (summary.json with
  finished=true, or the binary's verdict that the model diverged) and are
  skipped. ``conflict``: a finished summary recorded different flags.
  """
  if not root_output_dir:
    return "pending", ""
  run_dir = os.path.join(root_output_dir, run.name)
  try:
    summary = read_summary(os.path.join(run_dir, SUMMARY_FILE))
  except ValueError as e:
    return "corrupt", str(e)
  if summary is None:
    return ("partial", "output directory exists, no summary yet") if os.path.isdir(run_dir) else (
        "pending", "")
  config = summary.config or {}
  mismatches = []
  for name, value in requested_flag_values(run, extra_flags).items():
    if name in FREE_FLAGS or name not in config:
      continue
    if not _same_value(config[name], value, name):
      mismatches.append(f"{name}: recorded {config[name]!r}, requested {value!r}")
  if summary.finished or summary.diverged:
    if mismatches:
      return "conflict", "; ".join(mismatches)
    return ("diverged" if summary.diverged else "finished"), ""
  return "partial", f"rounds_completed={summary.rounds_completed}"


def dry_run_rows(grid: grids.Grid, start: int, stop: int, root_output_dir: Optional[str],
                 extra_flags: Sequence[str] = (), accountant: Optional[str] = None
                 ) -> List[GridRow]:
  """One row per configuration of the slice, with ε from tff_mf.accounting (``accountant``:
  the library's default when None)."""
  accountant = accountant or _default_accountant()
  eps_cache: Dict[Tuple[Optional[float], float, str], Optional[float]] = {}

  def eps(z, delta, accountant):
    key = (z, delta, accountant)
    if key not in eps_cache:
      eps_cache[key] = grids.epsilon_for(z, delta, accountant)
    return eps_cache[key]

  withheld = epsilon_withheld(extra_flags)
  rows = []
  for index in range(start, stop):
    run = grid.runs[index]
    status, detail = run_status(run, root_output_dir, extra_flags)
    rows.append(GridRow.of_json({
        "index": index, "name": run.name, "mechanism": run.mechanism,
        "noise_multiplier": run.noise_multiplier, "delta": run.delta,
        "epsilon": None if withheld else eps(run.noise_multiplier, run.delta, accountant),
        "accountant": accountant,
        "paper_epsilon": run.paper_epsilon,
        "client_lr": run.client_lr, "server_lr": run.server_lr,
        "server_momentum": run.server_momentum, "lr_schedule": run.lr_schedule,
        "schedule_rounds": run.schedule_rounds, "clients_per_round": run.clients_per_round,
        "total_rounds": run.total_rounds, "seed": run.seed, "status": status,
        "status_detail": detail, "flags": run.flags() + list(extra_flags),
    }))
  return rows


def _fmt(value, spec=".2f") -> str:
  if value is None:
    return "-"
  return format(value, spec) if isinstance(value, float) else str(value)


def format_table(rows: Sequence[Any]) -> str:
  """A plain-text table of dry-run rows (``GridRow``s, or their JSON forms)."""
  rows = [GridRow.of_json(r) for r in rows]
  header = ("#", "mechanism", "z", f"eps_{rows[0].accountant if rows else ''}", "paper_eps",
            "server_lr", "client_lr", "momentum", "schedule", "clients", "seed", "status")
  body = [(str(r.index), r.mechanism, _fmt(r.noise_multiplier, "g"),
           _fmt(r.epsilon), _fmt(r.paper_epsilon, "g"),
           _fmt(r.server_lr, "g"), _fmt(r.client_lr, "g"), _fmt(r.server_momentum, "g"),
           r.lr_schedule + (f"/{r.schedule_rounds}" if r.schedule_rounds else ""),
           str(r.clients_per_round), str(r.seed), r.status) for r in rows]
  widths = [max(len(h), *(len(b[i]) for b in body)) if body else len(h)
            for i, h in enumerate(header)]
  lines = ["  ".join(h.rjust(w) for h, w in zip(header, widths))]
  lines += ["  ".join(c.rjust(w) for c, w in zip(b, widths)) for b in body]
  return "\n".join(lines)


def _default_accountant() -> str:
  from tff_mf import accounting  # pylint: disable=g-import-not-at-top
  return accounting.DEFAULT_ACCOUNTANT


def epsilon_table(grid: grids.Grid, accountant: Optional[str] = None) -> List[EpsilonRow]:
  """ε per distinct noise multiplier of the grid (``accountant``: the library's default when
  None), with the paper's ε (Denisov et al. 2022 accounted with RDP)."""
  accountant = accountant or _default_accountant()
  out = []
  for z in sorted({r.noise_multiplier for r in grid.runs if r.noise_multiplier is not None}):
    delta = grid.runs[0].delta
    out.append(EpsilonRow.of_json({"noise_multiplier": z, "delta": delta, "accountant": accountant,
                                   "epsilon": grids.epsilon_for(z, delta, accountant),
                                   "paper_epsilon": grids.PAPER_EPSILON.get(z)}))
  return out


class _Children:
  """The training processes in flight, so that a signal stops them all."""

  def __init__(self):
    self._lock = threading.Lock()
    self._procs: Dict[int, subprocess.Popen] = {}
    self.stopping = False
    self.interrupted = False

  def add(self, proc):
    with self._lock:
      self._procs[proc.pid] = proc
      interrupted = self.interrupted
    if interrupted:  # started as a Ctrl-C came: it stops at its first safe point
      _signal_group(proc, signal.SIGINT)

  def interrupt_all(self):
    """Ctrl-C: each run stops at the end of its current round, checkpointed (a second
    Ctrl-C, forwarded the same way, stops them at once); no new run starts."""
    with self._lock:
      self.stopping = self.interrupted = True
      procs = list(self._procs.values())
    for proc in procs:
      _signal_group(proc, signal.SIGINT)

  def remove(self, proc):
    with self._lock:
      self._procs.pop(proc.pid, None)

  def terminate_all(self):
    self.stopping = True
    with self._lock:
      procs = list(self._procs.values())
    for proc in procs:
      if proc.poll() is None:
        try:
          os.killpg(proc.pid, signal.SIGTERM)
        except OSError:
          pass
    for proc in procs:
      try:
        proc.wait(timeout=20)
      except subprocess.TimeoutExpired:
        try:
          os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
          pass


def _signal_group(proc: subprocess.Popen, signum: int) -> None:
  if proc.poll() is None:
    try:
      os.killpg(proc.pid, signum)
    except OSError:
      pass


def _run_one(run: grids.RunConfig, binary: List[str], root_output_dir: str,
             extra_flags: Sequence[str], children: _Children) -> dict:
  run_dir = os.path.join(root_output_dir, run.name)
  try:
    rundir.make_private_dir(run_dir)
  except ValueError as e:
    return {"name": run.name, "status": "failed", "returncode": None, "error": str(e)}
  command = binary + run.flags() + [f"--root_output_dir={root_output_dir}"] + list(extra_flags)
  started = time.time()
  log_fd = os.open(os.path.join(run_dir, LOG_FILE), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
  with open(log_fd, "ab") as log:
    log.write(f"\n# {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())} "
              f"{' '.join(shlex.quote(c) for c in command)}\n".encode())
    log.flush()
    if children.stopping:
      return {"name": run.name, "status": "not_started", "returncode": None}
    proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    children.add(proc)
    try:
      returncode = proc.wait()
    finally:
      children.remove(proc)
  record = {"name": run.name, "returncode": returncode,
            "wall_seconds": round(time.time() - started, 3),
            "summary": os.path.join(run_dir, SUMMARY_FILE),
            "log": os.path.join(run_dir, LOG_FILE)}
  try:
    summary = read_summary(record["summary"])
  except ValueError as e:
    summary = None
    record["error"] = str(e)
  if returncode == interrupt.EXIT_CODE and children.interrupted:
    record["status"] = "interrupted"  # checkpointed: the same command resumes it
  elif summary is not None and (summary.finished or summary.diverged):
    record["status"] = "diverged" if summary.diverged else "finished"
    record["epsilon"] = summary.epsilon
    record["test_accuracy_no_oov_no_eos"] = (summary.test_metrics or {}).get(
        "accuracy_no_oov_no_eos")
  else:
    record["status"] = "failed"
    record.setdefault("error", f"exit code {returncode}; see {record['log']}")
  return record


def run_grid(grid: grids.Grid, start: int, stop: int, root_output_dir: str, processes: int = 1,
             extra_flags: Sequence[str] = (), binary: Optional[Sequence[str]] = None,
             progress: bool = True) -> List[dict]:
  """Runs the slice [start, stop) of ``grid``, skipping complete runs; returns one record per run."""
  import tqdm  # pylint: disable=g-import-not-at-top
  if processes < 1:
    raise ValueError(f"--processes must be >= 1, got {processes}")
  binary = list(binary) if binary else shlex.split(DEFAULT_BINARY)
  os.makedirs(root_output_dir, exist_ok=True)
  records_path = os.path.join(root_output_dir, f"sweep_{grid.name}.jsonl")
  records: List[dict] = []
  todo: List[grids.RunConfig] = []
  for index in range(start, stop):
    run = grid.runs[index]
    status, detail = run_status(run, root_output_dir, extra_flags)
    if status in ("finished", "diverged"):
      records.append({"name": run.name, "status": "skipped_" + status})
    elif status in ("conflict", "corrupt"):
      records.append({"name": run.name, "status": status, "error": detail})
    else:
      todo.append(run)
  children = _Children()
  previous_handlers = {}
  # Ctrl-C (tff_mf.interrupt, installed by main): forwarded to the runs, which checkpoint
  # the current round and exit 130; a second one is forwarded too, and the sweep exits.
  interrupt.on_request(children.interrupt_all)
  interrupt.on_force_exit(children.interrupt_all)

  def _on_signal(signum, frame):
    del frame
    children.terminate_all()
    raise SystemExit(128 + signum)

  if threading.current_thread() is threading.main_thread():
    for signum in (signal.SIGTERM,) + (() if interrupt.installed() else (signal.SIGINT,)):
      previous_handlers[signum] = signal.signal(signum, _on_signal)
  lock = threading.Lock()
  try:
    with tqdm.tqdm(total=len(todo), desc=f"sweep {grid.name}", unit="run", file=sys.stderr,
                   disable=not progress) as bar, \
        concurrent.futures.ThreadPoolExecutor(max_workers=processes) as pool:
      futures = [pool.submit(_run_one, run, binary, root_output_dir, extra_flags, children)
                 for run in todo]
      for future in concurrent.futures.as_completed(futures):
        record = future.result()
        record["grid"] = grid.name
        record["finished_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        with lock, open(records_path, "a") as f:
          f.write(json.dumps(record, sort_keys=True) + "\n")
        records.append(record)
        bar.update(1)
        if record["status"] == "failed":
          tqdm.tqdm.write(f"sweep: {record['name']} failed ({record.get('error')})", file=sys.stderr)
  except BaseException:
    children.terminate_all()
    raise
  finally:
    for signum, handler in previous_handlers.items():
      signal.signal(signum, handler)
  return records


def build_parser() -> argparse.ArgumentParser:
  from tff_mf import clitools  # pylint: disable=g-import-not-at-top
  parser = clitools.ArgumentParser(
      prog="python -m training.sweep",
      description="List (--dry_run) or run a named grid of training/grids.py. Exit status 0, "
                  "2 on a usage error, 1 when a run failed or conflicts.")
  parser.add_argument("--grid", required=True, help=f"one of: {', '.join(grids.GRIDS)}")
  parser.add_argument("--dry_run", action="store_true",
                      help="list the configurations with their epsilon; run nothing")
  parser.add_argument("--json", action="store_true", help="with --dry_run: print JSON")
  parser.add_argument("--slice", default=None, metavar="I:J",
                      help="the configurations i..j-1 to list or run, Python slice syntax "
                           "(default: all)")
  parser.add_argument("--processes", type=int, default=1,
                      help="training processes run at a time on this machine (each may use "
                           "TFF workers given by --extra_flags=--workers=...)")
  parser.add_argument("--root_output_dir", default=None,
                      help="where each run writes <name>/summary.json (default: none; needed "
                           "to run, and to show the status of each run with --dry_run)")
  parser.add_argument("--extra_flags", action="append", default=[],
                      help='more run_stackoverflow.py flags, e.g. "--workers=h:8000" '
                           "(repeatable; default: none)")
  config_lib.add_engine_flag(parser)
  parser.add_argument("--binary", default=DEFAULT_BINARY,
                      help="training command the flags are appended to (default: %(default)s)")
  clitools.add_accountant_flag(parser, "the dry run's epsilon (one Gaussian mechanism, "
                                       "sensitivity 1, Denisov et al. 2022 Thm 4.1)")
  clitools.add_progress_flags(parser, what="a progress bar on stderr")
  return parser


def main(argv: Optional[List[str]] = None) -> int:
  args = build_parser().parse_args(argv)
  with interrupt.handled(defer=True, prog="sweep",
                         notice="sweep: Ctrl-C: each run stops at the end of its current "
                                "round, checkpointed (Ctrl-C again stops at once)"):
    return _main(args)


def _main(args: argparse.Namespace) -> int:
  from tff_mf import clitools  # pylint: disable=g-import-not-at-top
  try:
    if args.grid not in grids.GRIDS:
      raise ValueError(f"unknown grid {args.grid!r}{clitools.did_you_mean(args.grid, grids.GRIDS)}"
                       f"; known grids: {', '.join(grids.GRIDS)}")
    grid = grids.get_grid(args.grid)
    start, stop = parse_slice(args.slice, len(grid.runs))
    extra_flags = parse_extra_flags(args.extra_flags)
    workers = [t.split("=", 1)[1] for t in extra_flags if t.startswith("--workers=")]
    config_lib.used_engine(args.engine, workers[-1] if workers else "")  # one line if impossible
    extra_flags = [f"--engine={args.engine}"] + extra_flags
    if args.dry_run:
      rows = dry_run_rows(grid, start, stop, args.root_output_dir, extra_flags, args.accountant)
      withheld = epsilon_withheld(extra_flags)
      epsilons = [] if withheld else epsilon_table(grid, args.accountant)
      if args.json:
        json.dump({"grid": grid.name, "description": grid.description, "source": grid.source,
                   "slice": [start, stop], "size": len(grid.runs),
                   "accountant": args.accountant, "epsilons": [e.json() for e in epsilons],
                   "epsilon_withheld": withheld, "runs": [r.json() for r in rows]},
                  sys.stdout, indent=1)
        print()
      else:
        print(f"grid {grid.name}: {grid.description}\nsource: {grid.source}\n"
              f"configurations {start}:{stop} of {len(grid.runs)}\n")
        if withheld:
          print(f"epsilon not shown: {withheld}")
        else:
          print(f"epsilon per noise multiplier ({args.accountant} accountant, delta = "
                f"{grid.runs[0].delta:g}; one Gaussian mechanism, sensitivity 1, Denisov Thm "
                f"4.1):")
        for e in epsilons:
          print(f"  z = {e.noise_multiplier:<6g} eps = {e.epsilon:6.2f}   "
                f"paper (RDP): {_fmt(e.paper_epsilon, 'g')}")
        print()
        print(format_table(rows))
      return 0
    if not args.root_output_dir:
      raise ValueError("running a grid needs --root_output_dir")
    records = run_grid(grid, start, stop, args.root_output_dir, args.processes, extra_flags,
                       shlex.split(args.binary), progress=args.progress)
  except ValueError as e:
    print(f"python -m training.sweep: error: {clitools.one_line(e)}", file=sys.stderr)
    return 2
  if interrupt.requested():
    print("sweep: interrupted; run the same command to resume", file=sys.stderr)
    return interrupt.EXIT_CODE
  counts: Dict[str, int] = {}
  for record in records:
    counts[record["status"]] = counts.get(record["status"], 0) + 1
  print(f"sweep {grid.name} [{start}:{stop}] in {args.root_output_dir}: " +
        ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
  for record in records:
    if record["status"] in ("failed", "conflict", "corrupt"):
      print(f"  {record['status']}: {record['name']}: {record.get('error')}", file=sys.stderr)
  bad = sum(counts.get(k, 0) for k in ("failed", "conflict", "corrupt", "not_started"))
  return 1 if bad else 0


if __name__ == "__main__":
  sys.exit(main())
