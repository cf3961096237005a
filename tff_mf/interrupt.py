"""Ctrl-C that loses nothing: one SIGINT handler for every long-running tool (no TensorFlow).

The first SIGINT asks the tool to stop. With ``install(defer=True)`` (the training loop,
the sweep, the main job) it only sets a flag, which the tool reads at its safe points
(``requested``, ``check``), e.g. once the current round is checkpointed (the processes it
starts afterwards do not see a Ctrl-C at the terminal: it stops them itself); with
``install(defer=False)`` (``tff-mf`` commands, which write nothing until they are done) it
raises ``Interrupted`` at once, between two Python bytecodes. Either way the tool prints one
line and exits with ``EXIT_CODE`` (130) without a traceback; in raising mode it first
prints "stopping…" as soon as the signal arrives (the main thread may be inside one long
LAPACK call). A second SIGINT exits at once with status 130, even while the main thread is blocked in C++ (TensorFlow, TFF's
executor): a helper thread reads every signal from ``signal.set_wakeup_fd``, so none is lost
or swallowed (TensorFlow's gc callback used to swallow Python's KeyboardInterrupt, and the
run went on). A process forked afterwards (MMCC's workers) gets Python's default SIGINT back.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from typing import Callable, Iterator, List, Optional

EXIT_CODE = 130


class Interrupted(KeyboardInterrupt):
  """The tool stops after a SIGINT; ``str()`` is the one line to print (what was kept)."""


_lock = threading.Lock()
_requested = threading.Event()
_on_request: List[Callable[[], None]] = []  # run once, at the first SIGINT
_on_force: List[Callable[[], None]] = []  # run at the second SIGINT, before exiting
_state = {"installed": False, "defer": True, "count": 0, "raised": False, "notified": False,
          "notice": None, "prog": None, "restore": None, "fork_hook": False, "stop_line": None,
          "generation": 0}


def install(defer: bool = True, notice: Optional[str] = None,
            prog: Optional[str] = None, stop_line: Optional[str] = None) -> bool:
  """Installs the SIGINT handling described in the module docstring, for good (a script's
  ``__main__``; ``handled`` scopes it to a ``with`` block).

  ``notice``: printed on stderr at the first SIGINT (deferred mode); ``prog`` names the
  tool in the line a second SIGINT prints. ``stop_line``: what the tool prints when it
  stops after ``Interrupted`` (raising mode); printed here, before exiting 130, when Python
  swallows the ``Interrupted`` (raised inside a gc or weakref callback, which cannot
  propagate it). Only from the main thread (returns False elsewhere, and SIGINT keeps its
  handler). Installing again only changes the mode.
  """
  if threading.current_thread() is not threading.main_thread():
    return False
  with _lock:
    _state.update(defer=bool(defer), notice=notice, prog=prog or _state["prog"],
                  stop_line=stop_line or _state["stop_line"])
    if _state["installed"]:
      return True
    _state["installed"] = True
    _state["generation"] += 1
    generation = _state["generation"]
  read_fd, write_fd = os.pipe()
  os.set_blocking(write_fd, False)
  previous_handler = signal.signal(signal.SIGINT, _python_handler)
  previous_hook, sys.unraisablehook = sys.unraisablehook, _unraisable
  previous_fd = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
  threading.Thread(target=_watch, args=(read_fd, generation), name="tff-mf-sigint",
                   daemon=True).start()
  # Deferred: SIGINT stays blocked in the main thread, hence in the threads and processes
  # started from it afterwards (TFF's worker_binary, the sweep's runs; a signal mask survives
  # exec), so that a Ctrl-C at the terminal, sent to the whole process group, stops them
  # through this process, in order, instead of killing them mid-round. The watcher thread
  # takes the signal. Raising: the main thread takes it, to be interrupted at once.
  previous_mask = signal.pthread_sigmask(signal.SIG_BLOCK if defer else signal.SIG_UNBLOCK,
                                         {signal.SIGINT})
  _state["restore"] = (previous_handler, previous_fd, write_fd, previous_mask,
                       len(_on_request), len(_on_force), previous_hook)
  if not _state["fork_hook"]:
    os.register_at_fork(after_in_child=_reset_in_child)
    _state["fork_hook"] = True
  return True


@contextlib.contextmanager
def handled(defer: bool = True, notice: Optional[str] = None,
            prog: Optional[str] = None, stop_line: Optional[str] = None) -> Iterator[None]:
  """``install`` for a ``with`` block (a tool's ``main``, also when called in-process): the
  previous SIGINT handling comes back afterwards. Nested or elsewhere installed: no-op."""
  if _state["installed"] or not install(defer, notice, prog, stop_line):
    yield
    return
  try:
    yield
  finally:
    _uninstall()


def _uninstall() -> None:
  _state["defer"] = True  # a SIGINT from here on no longer raises (the tool has returned)
  (previous_handler, previous_fd, write_fd, previous_mask, requests, forces,
   previous_hook) = _state["restore"]
  sys.unraisablehook = previous_hook
  signal.pthread_sigmask(signal.SIG_SETMASK, previous_mask)
  signal.set_wakeup_fd(previous_fd)
  signal.signal(signal.SIGINT, previous_handler)
  os.close(write_fd)  # the watcher reads EOF and ends
  with _lock:  # after this, the watcher ignores what it still reads (stale)
    _clear(requests, forces)  # the callbacks registered before ``install`` stay


def _clear(requests: int = 0, forces: int = 0) -> None:
  _requested.clear()
  _state.update(installed=False, count=0, raised=False, notified=False, restore=None,
                stop_line=None)
  del _on_request[requests:]
  del _on_force[forces:]


def on_request(callback: Callable[[], None]) -> None:
  """Calls ``callback`` (from any thread) at the first SIGINT, or now if it already came."""
  with _lock:
    _on_request.append(callback)
    late = _state["notified"]
  if late:
    callback()


def on_force_exit(callback: Callable[[], None]) -> None:
  """Calls ``callback`` at a second SIGINT, just before exiting (it must be quick)."""
  with _lock:
    _on_force.append(callback)


def installed() -> bool:
  """Whether ``install`` took SIGINT over in this process."""
  return bool(_state["installed"])


def requested() -> bool:
  """Whether a SIGINT came since ``install`` (always False when none was installed)."""
  return _requested.is_set()


def check(message: str) -> None:
  """Raises ``Interrupted(message)`` when a SIGINT came: call it at a safe point."""
  if _requested.is_set():
    raise Interrupted(message)


def _request(generation: Optional[int] = None) -> None:
  """The first SIGINT: the request flag, the notice, the callbacks. From the watcher
  (``generation``), only while its own handling is installed."""
  with _lock:
    if generation is not None and (not _state["installed"]
                                   or _state["generation"] != generation):
      return
    _requested.set()
    if _state["notified"]:
      return
    _state["notified"] = True
    callbacks = list(_on_request)
    # Raising mode: the main thread stops at its next bytecode, which may be seconds away
    # inside one LAPACK call; the line says at once that the Ctrl-C was taken.
    notice = _state["notice"] if _state["defer"] else f"{_prog()}: stopping…"
  if notice:
    _write(notice)
  for callback in callbacks:
    try:
      callback()
    except Exception:  # pylint: disable=broad-except
      pass  # stopping must not fail on a helper


def _python_handler(signum, frame) -> None:
  """Runs in the main thread between bytecodes (counting is ``_watch``'s job)."""
  del signum, frame
  _request()
  if not _state["defer"] and not _state["raised"]:
    _state["raised"] = True
    raise Interrupted("interrupted")


def _unraisable(hook_args) -> None:
  """Python could not propagate ``Interrupted`` (it was raised inside a gc or weakref
  callback, e.g. jax's ``_xla_gc_callback``) and would print "Exception ignored" and run
  on: stop here instead, with the tool's one line and status 130 (the force-exit callbacks
  stop its helper processes)."""
  if not isinstance(hook_args.exc_value, Interrupted) or _state["stop_line"] is None:
    # Not ours, or no tool's line to stop with (an in-process ``handled`` block): Python's way.
    previous = (_state["restore"] or (None,) * 7)[6] or sys.__unraisablehook__
    previous(hook_args)
    return
  _force_exit(_state["stop_line"])


def _watch(read_fd: int, generation: int) -> None:
  """Counts SIGINTs as the C-level handler reports them, even while Python is blocked.

  Only for its own ``install`` (``generation``): a signal it reads after that handling was
  uninstalled (the main thread's handler may have seen it first) is stale and ignored, so
  that it never requests a stop, or exits, in a later ``handled`` block or after it."""
  signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})  # blocked by a parent, maybe
  while True:
    try:
      data = os.read(read_fd, 64)
    except OSError:
      data = b""
    if not data:  # uninstalled: the write end is closed
      os.close(read_fd)
      return
    for signum in data:
      if signum != signal.SIGINT:
        continue
      with _lock:
        if not _state["installed"] or _state["generation"] != generation:
          continue
        _state["count"] += 1
        count = _state["count"]
      if count == 1:
        _request(generation)
      else:
        _force_exit()


def _force_exit(line: Optional[str] = None) -> None:
  """Runs the force-exit callbacks, prints ``line`` (default: the second-SIGINT line) and
  exits 130 at once."""
  with _lock:
    callbacks = list(_on_force)
  for callback in callbacks:
    try:
      callback()
    except Exception:  # pylint: disable=broad-except
      pass
  _write(line or f"{_prog()}: interrupted again: stopped at once")
  os._exit(EXIT_CODE)  # pylint: disable=protected-access


def _prog() -> str:
  return _state["prog"] or os.path.basename(sys.argv[0] or "python")


def _write(line: str) -> None:
  """``line`` on stderr; on a line of its own when a tqdm bar is showing (tqdm clears the
  bars, writes it and redraws them)."""
  bars = sys.modules.get("tqdm")
  try:
    if bars is not None and getattr(bars.tqdm, "_instances", None):
      bars.tqdm.write(line, file=sys.stderr)
      return
  except Exception:  # pylint: disable=broad-except
    pass  # stopping must not fail on the bars: the plain line below
  try:
    sys.stderr.write(line + "\n")
    sys.stderr.flush()
  except (OSError, ValueError):
    pass


def _reset_in_child() -> None:
  """A forked child (a worker of its parent): the default SIGINT action (a Ctrl-C at the
  terminal ends it quietly while its parent stops), no wakeup fd, no pending request."""
  global _lock  # pylint: disable=global-statement
  if not _state["installed"]:
    return
  _lock = threading.Lock()  # another thread of the parent may have held it at the fork
  try:
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGINT, signal.SIG_DFL)
  except ValueError:
    pass
  _clear()
