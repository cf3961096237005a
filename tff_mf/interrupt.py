"""Ctrl-C that loses nothing: one SIGINT handler for every long-running tool (no TensorFlow).

The first SIGINT asks the tool to stop. With ``install(defer=True)`` (the training loop,
the sweep, the main job) it only sets a flag, which the tool reads at its safe points
(``requested``, ``check``), e.g. once the current round is checkpointed; with
``install(defer=False)`` (``tff-mf`` commands, which write nothing until they are done) it
raises ``Interrupted`` at once, between two Python bytecodes. Either way the tool prints one
line and exits with ``EXIT_CODE`` (130) without a traceback. A second SIGINT exits at once
with status 130, even while the main thread is blocked in C++ (TensorFlow, TFF's
executor): a helper thread reads every signal from ``signal.set_wakeup_fd``, so none is lost
or swallowed (TensorFlow's gc callback used to swallow Python's KeyboardInterrupt, and the
run went on). A process forked afterwards (MMCC's workers) gets Python's default SIGINT back.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from typing import Callable, List, Optional

EXIT_CODE = 130


class Interrupted(KeyboardInterrupt):
  """The tool stops after a SIGINT; ``str()`` is the one line to print (what was kept)."""


_lock = threading.Lock()
_requested = threading.Event()
_on_request: List[Callable[[], None]] = []  # run once, at the first SIGINT
_on_force: List[Callable[[], None]] = []  # run at the second SIGINT, before exiting
_state = {"installed": False, "defer": True, "count": 0, "raised": False, "notified": False,
          "notice": None, "prog": None}


def install(defer: bool = True, notice: Optional[str] = None,
            prog: Optional[str] = None) -> bool:
  """Installs the SIGINT handling described in the module docstring.

  ``notice``: printed on stderr at the first SIGINT (deferred mode); ``prog`` names the
  tool in the line a second SIGINT prints. Only from the main thread (returns False
  elsewhere, and SIGINT keeps its handler). Installing again only changes the mode.
  """
  if threading.current_thread() is not threading.main_thread():
    return False
  with _lock:
    _state.update(defer=bool(defer), notice=notice, prog=prog or _state["prog"])
    if _state["installed"]:
      return True
    _state["installed"] = True
  read_fd, write_fd = os.pipe()
  os.set_blocking(write_fd, False)
  signal.signal(signal.SIGINT, _python_handler)
  signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
  threading.Thread(target=_watch, args=(read_fd,), name="tff-mf-sigint", daemon=True).start()
  os.register_at_fork(after_in_child=_reset_in_child)
  return True


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


def _request() -> None:
  _requested.set()
  with _lock:
    if _state["notified"]:
      return
    _state["notified"] = True
    callbacks = list(_on_request)
    notice = _state["notice"] if _state["defer"] else None
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


def _watch(read_fd: int) -> None:
  """Counts SIGINTs as the C-level handler reports them, even while Python is blocked."""
  while True:
    try:
      data = os.read(read_fd, 64)
    except OSError:
      return
    if not data:
      return
    for signum in data:
      if signum != signal.SIGINT:
        continue
      with _lock:
        _state["count"] += 1
        count = _state["count"]
      if count == 1:
        _request()
      else:
        _force_exit()


def _force_exit() -> None:
  with _lock:
    callbacks = list(_on_force)
  for callback in callbacks:
    try:
      callback()
    except Exception:  # pylint: disable=broad-except
      pass
  prog = _state["prog"] or os.path.basename(sys.argv[0] or "python")
  _write(f"{prog}: interrupted again: stopped at once")
  os._exit(EXIT_CODE)  # pylint: disable=protected-access


def _write(line: str) -> None:
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
  _requested.clear()
  _state.update(installed=False, count=0, raised=False, notified=False)
  _on_request.clear()
  _on_force.clear()
