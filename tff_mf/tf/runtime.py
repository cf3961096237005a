"""Process hygiene for TFF's local C++ runtime.

The first TFF computation starts a ``worker_binary`` server on a loopback port
as a child process, and TFF 0.87 fails to stop it at interpreter exit (its
atexit hook raises ``AttributeError: 'NoneType' object has no attribute
'Popen'``), so it outlives the program and keeps piped output open.
``install_exit_hook()`` stops it; ``tff_mf.tf.aggregators.build_mechanism`` installs
the hook, so a user's script needs no call of its own. At exit the
hook also disarms TFF's ``ServiceManager.__del__``, which would otherwise run
during interpreter teardown, when ``subprocess`` is already gone, and print
"Exception ignored in ... ServiceManager.__del__ ... 'NoneType' object has no
attribute 'Popen'" after every program that ran a TFF computation.
"""

from __future__ import annotations

import atexit
import gc
import os
import signal
import subprocess
import threading
from typing import List

import psutil

from tff_mf import interrupt

WORKER_BINARY_NAME = "worker_binary"
_hook_installed = False
# Servers TFF started through ``_TrackedPopen``, and whether this process is exiting (then
# TFF starts none: a computation still in flight on TFF's event-loop thread would otherwise
# restart the server that ``shutdown_tff_runtime`` just stopped, and leave it orphaned).
_launch_lock = threading.Lock()
_launched: List[subprocess.Popen] = []
_exiting = False


class _TrackedPopen(subprocess.Popen):
  """``subprocess.Popen`` for TFF's ``executor_factory``: records each server it starts, and
  starts none once this process is exiting. A thread of TFF's that asks then (its event
  loop, a daemon) waits for the process to end, silently: raising there would print a
  traceback after the tool's last line."""

  def __init__(self, *args, **kwargs):
    with _launch_lock:
      exiting = _exiting
      if not exiting:
        super().__init__(*args, **kwargs)
        _launched.append(self)
    if exiting:
      if threading.current_thread() is threading.main_thread():
        raise RuntimeError("tff_mf: this process is exiting; TFF's server is not restarted")
      threading.Event().wait()  # until the process ends


class _TrackedSubprocess:
  """``subprocess`` as TFF's ``executor_factory`` sees it, with ``_TrackedPopen``."""
  Popen = _TrackedPopen

  def __getattr__(self, name):
    return getattr(subprocess, name)


def _worker_children() -> List[psutil.Process]:
  out = []
  try:
    children = psutil.Process().children(recursive=True)
  except psutil.Error:
    return out
  for child in children:
    try:
      if WORKER_BINARY_NAME in child.name() or any(
          WORKER_BINARY_NAME in part for part in child.cmdline()[:1]):
        out.append(child)
    except psutil.Error:
      continue
  return out


def stop_worker_binaries(timeout: float = 5.0) -> int:
  """Terminates (then kills) every ``worker_binary`` child of this process, and every server
  TFF started through ``_TrackedPopen`` that still runs; returns the count."""
  procs = _worker_children()
  known = {p.pid for p in procs}
  with _launch_lock:
    launched = [p for p in _launched if p.poll() is None and p.pid not in known]
  for popen in launched:
    try:
      procs.append(psutil.Process(popen.pid))
    except psutil.Error:
      continue
  for p in procs:
    try:
      p.terminate()
    except psutil.Error:
      pass
  _, alive = psutil.wait_procs(procs, timeout=timeout)
  for p in alive:
    try:
      p.kill()
    except psutil.Error:
      pass
  return len(procs)


def _tff_service_managers() -> list:
  """Live instances of TFF's local ``ServiceManager`` (a class local to
  ``executor_factory.local_cpp_executor_factory``)."""
  out = []
  for obj in gc.get_objects():
    cls = type(obj)
    if cls.__name__ == "ServiceManager" and cls.__module__.endswith(".executor_factory"):
      out.append(obj)
  return out


def shutdown_tff_runtime(timeout: float = 5.0) -> int:
  """At program exit: stops the helper servers, then disarms ``ServiceManager.__del__``.

  Only for exit: TFF cannot run computations afterwards in this process (nor start a server).
  Returns the number of servers stopped.
  """
  global _exiting
  with _launch_lock:  # a launch in progress completes first, and is then stopped below
    _exiting = True
  stopped = stop_worker_binaries(timeout=timeout)
  for manager in _tff_service_managers():
    type(manager).__del__ = lambda self: None  # its server is stopped above
    manager._process = None  # pylint: disable=protected-access
    manager._stub = None  # pylint: disable=protected-access
  return stopped


class _ChildOnlyOs:
  """``os`` for TFF's ``executor_factory`` module, whose ``ServiceManager`` stops its server
  with ``os.kill(pid, SIGINT)`` (when its stub is not ready, and in ``__del__``) even after
  that pid was reaped (by ``stop_worker_binaries`` or a ``wait`` elsewhere). A reused pid
  may then be another program's, or a thread id of this very process, which the SIGINT
  would stop. Here ``kill`` signals only a live child of this process."""

  def __getattr__(self, name):
    return getattr(os, name)

  @staticmethod
  def kill(pid: int, sig: int) -> None:
    try:
      child = psutil.Process(pid)
      if child.ppid() != os.getpid() or child.status() == psutil.STATUS_ZOMBIE:
        return
    except psutil.Error:
      return
    os.kill(pid, sig)


def guard_service_manager_signals() -> None:
  """Makes TFF's ``ServiceManager`` signal only a live child of this process (idempotent)."""
  from tensorflow_federated.python.core.impl.executor_stacks import executor_factory  # pylint: disable=g-import-not-at-top
  if not isinstance(executor_factory.os, _ChildOnlyOs):
    executor_factory.os = _ChildOnlyOs()
  if not isinstance(executor_factory.subprocess, _TrackedSubprocess):
    executor_factory.subprocess = _TrackedSubprocess()


def install_exit_hook() -> None:
  """Stops TFF's helper servers at normal exit, on SIGTERM and at a second Ctrl-C, and
  guards TFF's server signals (``guard_service_manager_signals``); idempotent. Called from
  another thread than the main one, it leaves SIGTERM alone (only that thread may set it)."""
  global _hook_installed
  guard_service_manager_signals()
  if _hook_installed:
    return
  _hook_installed = True
  atexit.register(shutdown_tff_runtime)
  # A second Ctrl-C exits at once (tff_mf.interrupt): the helper servers go with it.
  interrupt.on_force_exit(lambda: stop_worker_binaries(timeout=0.5))
  if threading.current_thread() is not threading.main_thread():
    return
  previous = signal.getsignal(signal.SIGTERM)

  def _on_sigterm(signum, frame):
    stop_worker_binaries(timeout=2.0)
    if callable(previous):
      previous(signum, frame)
    else:
      raise SystemExit(128 + signum)

  signal.signal(signal.SIGTERM, _on_sigterm)
