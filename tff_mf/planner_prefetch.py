"""The planner's dense factorizations computed beside its first stage (numpy core).

``tff_mf.planner.plan`` calibrates the cheap families first: Python and PLD work that keeps
one core busy. The dense families' factorizations (the banded family's L-BFGS at n = 2048
takes minutes) do not depend on that work, so a child process computes them meanwhile, with
BLAS on one thread (two thread pools on two cores spin against each other), into the same
factorization cache, in the order the dense stage needs them. The dense stage waits for an
entry the child has not finished, then loads it like any cache entry: every check of
``tff_mf.factorization.cache`` runs in the planner's process, so the child is trusted with
nothing. If the child fails or is gone, the planner computes what it needs itself.

Each entry may come with a lower bound on the rmse of every candidate that uses it
(``tff_mf.planner_bounds``). The planner sends the child its pruning cut (the best rmse so
far, widened by the calibration tolerance) whenever it falls; the child skips an entry whose
bound is above the latest cut. The best rmse only falls, so the planner prunes each of that
entry's candidates before its factorization too: skipping changes no decision of the
planner, only the work spent on entries it will not read.
"""

from __future__ import annotations

import os
import pickle
import select
import signal
import subprocess
import sys
from typing import Dict, List, Optional, Sequence

# BLAS threads of the child (the planner's own process keeps its own setting).
CHILD_ENV = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def missing(specs: Sequence, cache_dir: Optional[str]) -> Dict[str, object]:
  """{cache entry directory: spec} of the specs (``FactorizationSpec``s, in order) whose entry
  has no sidecar yet, each once."""
  from tff_mf.factorization import cache  # pylint: disable=g-import-not-at-top
  out: Dict[str, object] = {}
  for spec in specs:
    directory = cache.entry_paths(spec, cache_dir)[0]
    if directory not in out and not os.path.exists(os.path.join(directory,
                                                                cache.METADATA_FILE)):
      out[directory] = spec
  return out


class Prefetch:
  """A child computing the cache entries of ``specs`` ({directory: spec}, in order).

  ``bounds`` ({directory: a lower bound on the rmse of every candidate using that entry})
  and ``cut`` (the planner's pruning cut so far, lowered later with ``lower_cut``) let the
  child skip entries the planner will prune before factorizing. ``wait(directory)`` returns
  once the child reported that entry (done, skipped or failed), or has exited; ``close()``
  stops it. Without entries or a second core it starts nothing."""

  def __init__(self, specs: Dict[str, object], cache_dir: Optional[str],
               bounds: Optional[Dict[str, float]] = None, cut: Optional[float] = None):
    self.order: List[str] = list(specs)
    self.reported: Dict[str, str] = {}
    self.proc: Optional[subprocess.Popen] = None
    self.cut = cut
    if not self.order or (os.cpu_count() or 1) < 2:
      return
    import tff_mf  # pylint: disable=g-import-not-at-top
    root = os.path.dirname(os.path.dirname(os.path.abspath(tff_mf.__file__)))
    env = dict(os.environ, **CHILD_ENV)
    env["PYTHONPATH"] = os.pathsep.join([root] + [p for p in [env.get("PYTHONPATH")] if p])
    bounds = bounds or {}
    payload = pickle.dumps((cache_dir, [(specs[d], bounds.get(d)) for d in self.order], cut))
    try:
      self.proc = subprocess.Popen(self.command(), stdin=subprocess.PIPE,
                                   stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
      self.proc.stdin.write(b"%d\n" % len(payload) + payload)
      self.proc.stdin.flush()
    except OSError:  # no child: the planner computes everything itself
      self.close()

  def lower_cut(self, cut: Optional[float]) -> None:
    """Tells the child the planner's pruning cut fell to ``cut`` (ignored unless lower)."""
    if cut is None or (self.cut is not None and cut >= self.cut):
      return
    self.cut = cut
    if self.proc is not None and self.proc.poll() is None:
      try:
        self.proc.stdin.write(f"{cut!r}\n".encode())
        self.proc.stdin.flush()
      except OSError:  # the child is gone: ``wait`` finds out
        pass

  @staticmethod
  def command() -> List[str]:
    """The child's command line: it reads on stdin the pickled (cache_dir, [(spec, bound)],
    cut), after a line with its length, then each lowered cut on a line of its own."""
    return [sys.executable, "-m", "tff_mf.planner_prefetch"]

  def pending(self, directory: str) -> bool:
    """Whether the child will still report ``directory``."""
    return (self.proc is not None and directory in self.order
            and directory not in self.reported)

  def wait(self, directory: str) -> Optional[str]:
    """Blocks until the child reported ``directory`` ("done", "skipped" or "failed: ..."),
    or exited (None then, as for an entry it was not asked for)."""
    while self.pending(directory):
      line = self.proc.stdout.readline()
      if not line:  # the child exited
        self.close()
        break
      index, _, status = line.decode("utf-8", "replace").strip().partition(" ")
      if index.isdigit() and int(index) < len(self.order):
        self.reported[self.order[int(index)]] = status
    return self.reported.get(directory)

  def close(self) -> None:
    """Stops the child (an entry it was writing is written atomically or not at all)."""
    if self.proc is not None:
      proc, self.proc = self.proc, None
      if proc.poll() is None:
        proc.terminate()
      try:
        proc.stdin.close()
      except OSError:
        pass
      try:
        proc.wait(timeout=30)
      except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
      proc.stdout.close()


class _Cuts:
  """The child's end of its stdin: the payload, then the planner's cuts, one per line."""

  def __init__(self, fd: int):
    self.fd = fd
    self.buffer = b""
    self.open = True

  def _more(self) -> bool:
    data = os.read(self.fd, 1 << 16)
    self.buffer += data
    self.open = bool(data)
    return self.open

  def payload(self):
    while b"\n" not in self.buffer and self._more():
      pass
    size, _, self.buffer = self.buffer.partition(b"\n")
    while len(self.buffer) < int(size) and self._more():
      pass
    data, self.buffer = self.buffer[:int(size)], self.buffer[int(size):]
    return pickle.loads(data)

  def latest(self, cut: Optional[float]) -> Optional[float]:
    """``cut`` lowered by every cut the planner sent so far (without waiting for more)."""
    try:
      while self.open and select.select([self.fd], [], [], 0)[0]:
        self._more()
    except (OSError, ValueError):  # no select on this pipe: no skipping, the same plan
      self.open = False
    *lines, self.buffer = self.buffer.split(b"\n")
    for line in lines:
      cut = float(line) if cut is None else min(cut, float(line))
    return cut


def above_cut(bound: Optional[float], cut: Optional[float]) -> bool:
  """Whether a lower bound on rmse is above the pruning cut: the planner's test to prune a
  candidate before factorizing it (``tff_mf.planner.staged_search``), and the child's to
  skip an entry (the least bound of its candidates)."""
  return bound is not None and cut is not None and bound > cut


def main() -> None:
  """The child: factorize each spec read from stdin into the cache, unless the planner's
  latest cut is below its bound; print "i done", "i skipped" or "i failed: reason" after
  each."""
  from tff_mf.factorization import cache  # pylint: disable=g-import-not-at-top
  # ``close`` terminates: exit through Python, so that an entry being written removes its
  # temporary files (the cache writes each entry atomically).
  signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(1))
  cuts = _Cuts(sys.stdin.fileno())
  cache_dir, work, cut = cuts.payload()
  for i, (spec, bound) in enumerate(work):
    cut = cuts.latest(cut)
    if above_cut(bound, cut):
      print(i, "skipped", flush=True)
      continue
    try:
      cache.load_or_factorize(spec, cache_dir=cache_dir)
      status = "done"
    except Exception as e:  # pylint: disable=broad-except
      status = "failed: " + " ".join(str(e).split())
    print(i, status, flush=True)


if __name__ == "__main__":
  main()
