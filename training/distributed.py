"""Training on TFF's distributed C++ runtime: each round's clients split across workers.

Denisov et al. 2022 (arXiv:2202.08312, App I, "Integration with federated learning") ran the
StackOverflow grids on TFF's distributed C++ runtime, one machine per 10
clients per round. This module reproduces that arrangement with TFF 0.87:

* Every worker machine runs TFF's C++ executor service, the ``worker_binary``
  shipped inside the ``tensorflow_federated`` wheel
  (``python -m training.distributed serve --port 8000`` execs it).
* The coordinator (the training binary given ``--workers host:port,...``)
  installs a :func:`coordinator_context_class` as TFF's default execution context.
  Each federated computation whose argument holds clients is compiled to TFF's
  *mergeable form* (``up_to_merge`` / ``merge`` / ``after_merge``; TFF's
  ``compile_to_mergeable_comp_form``). The clients are split into contiguous
  slices, one per worker, and ``up_to_merge`` (broadcast, local training,
  clipping, and the partial sum of the clipped updates) runs on the workers in
  parallel. ``merge`` (the partial sums, added in worker order) and
  ``after_merge`` (the DP aggregator's noise, the server optimizer, metrics
  finalization) run on the coordinator's own local executor. So the noise of
  the matrix mechanism (Denisov Algorithm 1, line 11) is drawn on the
  coordinator, never on a worker.

Why not TFF's stock ``create_mergeable_comp_execution_context``: it runs
``after_merge`` (hence the DP noise) on whichever worker finished last, merges
partial results in completion order (non-deterministic float sums with three or
more workers), and its remote calls block the event loop, so the workers run
one after another. Its async contexts also retry a dead worker forever.
:func:`coordinator_context_class` fixes all four: noise on the coordinator, merge in
worker order, one thread per worker, and a worker failure raises
:class:`WorkerError` naming the worker's address at once. The training binary
then exits non-zero; its last checkpoint is intact, and rerunning the same
command with a healthy ``--workers`` list resumes from it (docs/distributed.md).

Exactness: with one client per worker per round the distributed sums equal the
single-process sums bit for bit; with more, each worker's partial sum is added
to the others in a different order than the single-process sequential sum,
which changes float32 rounding by about one ulp; later rounds of local training
can amplify that (benchmarks/results/distributed.md).
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import importlib.util
import os
import re
import socket
import subprocess
import sys
import time
from typing import Iterator, List, Optional, Sequence, Tuple

GRPC_MAX_MESSAGE_BYTES = 2 * 1000 * 1000 * 1000
_GRPC_CHANNEL_OPTIONS = (
    ("grpc.max_message_length", GRPC_MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", GRPC_MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", GRPC_MAX_MESSAGE_BYTES),
)
DEFAULT_CONNECT_TIMEOUT_SECONDS = 30.0
_ADDRESS_PATTERN = re.compile(r"^(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9_.-]+):(\d{1,5})$")


class WorkerError(RuntimeError):
  """A TFF worker could not be reached or failed during a round; names the worker's address."""

  def __init__(self, address: str, detail: str):
    self.address = address
    self.detail = detail
    super().__init__(
        f"TFF worker {address} failed: {detail}. The round did not complete and "
        "no state was saved for it; the last checkpoint is intact. Restart the "
        f"worker (or remove {address} from --workers) and rerun the same "
        "command to resume from the last checkpoint.")


def worker_binary_path() -> str:
  """Path of TFF's C++ executor service binary inside the installed TFF wheel."""
  spec = importlib.util.find_spec("tensorflow_federated")
  if spec is None or not spec.submodule_search_locations:
    raise RuntimeError("tensorflow_federated is not installed; the worker binary ships with it")
  path = os.path.join(list(spec.submodule_search_locations)[0], "data", "worker_binary")
  if not os.path.isfile(path):
    raise RuntimeError(f"TFF worker binary not found at {path}")
  return path


def parse_worker_addresses(workers) -> List[str]:
  """Parses ``host:port,...`` (a string or a sequence); rejects malformed or duplicate addresses."""
  if isinstance(workers, str):
    items = [w.strip() for w in workers.split(",")]
  else:
    items = [str(w).strip() for w in workers]
  items = [w for w in items if w]
  if not items:
    raise ValueError("--workers is empty: give at least one host:port")
  seen = set()
  for address in items:
    match = _ADDRESS_PATTERN.match(address)
    if not match or not 1 <= int(match.group(2)) <= 65535:
      raise ValueError(f"bad worker address {address!r}: expected host:port with 1 <= port <= 65535")
    if address in seen:
      raise ValueError(f"worker address {address} is listed twice in --workers")
    seen.add(address)
  return items


def _describe_grpc_error(error: BaseException) -> str:
  import grpc  # pylint: disable=g-import-not-at-top
  from tensorflow_federated.python.core.impl.executors import executors_errors  # pylint: disable=g-import-not-at-top
  if isinstance(error, executors_errors.RetryableGRPCError) and error.args:
    error = error.args[0]
  if isinstance(error, grpc.Call):
    return f"gRPC {error.code().name}: {error.details()}"
  return f"{type(error).__name__}: {error}"


def wait_for_worker(address: str, timeout: float = DEFAULT_CONNECT_TIMEOUT_SECONDS):
  """Opens a gRPC channel to ``address`` and waits until it is ready; raises WorkerError if not."""
  import grpc  # pylint: disable=g-import-not-at-top
  channel = grpc.insecure_channel(address, options=list(_GRPC_CHANNEL_OPTIONS))
  try:
    grpc.channel_ready_future(channel).result(timeout=timeout)
  except grpc.FutureTimeoutError:
    channel.close()
    raise WorkerError(
        address, f"not reachable within {timeout:g} s (is `python -m training.distributed "
        f"serve --port {address.rsplit(':', 1)[1]}` running there?)") from None
  return channel


class _WorkerContext:
  """An async TFF context backed by one remote ``worker_binary``.

  Runs TFF's own ``AsyncExecutionContext`` logic without its retry-forever
  decorator, on a private event loop thread (TFF's remote stub makes blocking
  gRPC calls, so each worker needs its own thread to run in parallel), and
  turns every gRPC failure into a :class:`WorkerError` naming the address.
  """

  def __init__(self, address: str, channel):
    from tensorflow_federated.python.common_libs import async_utils  # pylint: disable=g-import-not-at-top
    from tensorflow_federated.python.core.backends.native import compiler  # pylint: disable=g-import-not-at-top
    from tensorflow_federated.python.core.environments.tensorflow_frontend import tensorflow_computation  # pylint: disable=g-import-not-at-top
    from tensorflow_federated.python.core.impl.execution_contexts import async_execution_context  # pylint: disable=g-import-not-at-top
    from tensorflow_federated.python.core.impl.executor_stacks import python_executor_stacks  # pylint: disable=g-import-not-at-top
    from tensorflow_federated.python.core.impl.executors import remote_executor  # pylint: disable=g-import-not-at-top
    from tensorflow_federated.python.core.impl.executors import remote_executor_grpc_stub  # pylint: disable=g-import-not-at-top
    from tensorflow_federated.python.core.impl.types import placements  # pylint: disable=g-import-not-at-top

    self.address = address
    self._channel = channel
    stub = remote_executor_grpc_stub.RemoteExecutorGrpcStub(channel)

    def stack_fn(cardinalities):
      cardinalities.setdefault(placements.CLIENTS, 0)
      executor = remote_executor.RemoteExecutor(stub)
      executor.set_cardinalities(cardinalities)
      return executor

    self._context = async_execution_context.AsyncExecutionContext(
        executor_fn=python_executor_stacks.ResourceManagingExecutorFactory(stack_fn),
        compiler_fn=compiler.desugar_and_transform_to_native,
        transform_args=tensorflow_computation.transform_args,
        transform_result=tensorflow_computation.transform_result)
    invoke = type(self._context).invoke
    # TFF wraps invoke in retrying.retry(functools.wraps(...)); __wrapped__ is the single attempt.
    self._invoke_once = getattr(invoke, "__wrapped__", None)
    if self._invoke_once is None:
      raise RuntimeError(
          "this TFF version's AsyncExecutionContext.invoke has no __wrapped__ single attempt; "
          "training.distributed supports TFF 0.87")
    self._runner = async_utils.AsyncThreadRunner()

  async def _invoke_here(self, comp, arg):
    try:
      return await self._invoke_once(self._context, comp, arg)
    except Exception as e:  # pylint: disable=broad-except
      import grpc  # pylint: disable=g-import-not-at-top
      from tensorflow_federated.python.core.impl.executors import executors_errors  # pylint: disable=g-import-not-at-top
      if isinstance(e, (grpc.RpcError, executors_errors.RetryableError)):
        raise WorkerError(self.address, _describe_grpc_error(e)) from e
      raise

  async def invoke(self, comp, arg):
    """Runs ``comp(arg)`` on this worker in the worker's own thread."""
    return await self._runner.await_coro_and_return_result(self._invoke_here(comp, arg))

  def close(self):
    self._channel.close()


def _contains_clients(value, type_spec) -> bool:
  from tensorflow_federated.python.core.impl.executors import cardinalities_utils  # pylint: disable=g-import-not-at-top
  from tensorflow_federated.python.core.impl.types import placements  # pylint: disable=g-import-not-at-top
  if value is None or type_spec is None:
    return False
  cardinalities = cardinalities_utils.infer_cardinalities(value, type_spec)
  return bool(cardinalities.get(placements.CLIENTS))


class _CoordinatorContextImpl:
  """TFF sync context: client work on remote workers, merge and DP aggregation on the coordinator.

  Computations without clients in their argument (initialize, get_model_weights,
  central evaluation) run entirely on the coordinator's local C++ executor.
  Computations with clients are compiled to mergeable form (one aggregation
  layer; FedAvg with a DP aggregator qualifies); ``up_to_merge`` runs on the
  workers (one contiguous client slice each, in parallel), ``merge`` folds the
  partial results in worker order and ``after_merge`` runs on the coordinator.
  """

  def __init__(self, worker_contexts: Sequence[_WorkerContext], coordinator_context):
    from tensorflow_federated.python.common_libs import async_utils  # pylint: disable=g-import-not-at-top
    from tensorflow_federated.python.core.backends.native import mergeable_comp_compiler  # pylint: disable=g-import-not-at-top
    from tensorflow_federated.python.core.impl.execution_contexts import compiler_pipeline  # pylint: disable=g-import-not-at-top
    if not worker_contexts:
      raise ValueError("CoordinatorContext needs at least one worker")
    self.workers = list(worker_contexts)
    self._coordinator = coordinator_context
    self._runner = async_utils.AsyncThreadRunner()
    self._mergeable = compiler_pipeline.CompilerPipeline(
        mergeable_comp_compiler.compile_to_mergeable_comp_form)
    self.distributed_calls = 0  # invocations split across workers (observable in tests)
    self.coordinator_calls = 0

  @property
  def addresses(self) -> List[str]:
    return [w.address for w in self.workers]

  def invoke(self, comp, arg=None):
    from tensorflow_federated.python.core.impl.types import type_conversions  # pylint: disable=g-import-not-at-top
    if not _contains_clients(arg, getattr(comp.type_signature, "parameter", None)):
      self.coordinator_calls += 1
      return self._runner.run_coro_and_return_result(self._coordinator.invoke(comp, arg))
    form = self._mergeable.compile(comp)
    self.distributed_calls += 1
    result = self._runner.run_coro_and_return_result(self._invoke_mergeable(form, arg))
    return type_conversions.type_to_py_container(result, form.after_merge.type_signature.result)

  async def _invoke_mergeable(self, form, arg):
    from tensorflow_federated.python.common_libs import structure  # pylint: disable=g-import-not-at-top
    from tensorflow_federated.python.core.impl.execution_contexts import mergeable_comp_execution_context as mce  # pylint: disable=g-import-not-at-top
    from tensorflow_federated.python.core.impl.types import computation_types  # pylint: disable=g-import-not-at-top
    from tensorflow_federated.python.core.impl.types import type_analysis  # pylint: disable=g-import-not-at-top

    slices = mce._split_value_into_subrounds(  # pylint: disable=protected-access
        arg, form.up_to_merge.type_signature.parameter, len(self.workers))
    partials = await asyncio.gather(
        *[worker.invoke(form.up_to_merge, piece) for worker, piece in zip(self.workers, slices)])
    merged = partials[0]
    for partial in partials[1:]:  # worker order: deterministic float sums
      merged = await self._coordinator.invoke(form.merge, structure.Struct.unnamed(merged, partial))

    def all_equal_or_unplaced(type_spec):
      return not isinstance(type_spec, computation_types.FederatedType) or type_spec.all_equal

    result_type = form.after_merge.type_signature.result
    if type_analysis.contains_only(result_type, all_equal_or_unplaced):
      return await self._coordinator.invoke(form.after_merge, structure.Struct.unnamed(slices[0], merged))
    results = []
    for piece in slices:  # clients-placed outputs: one after_merge per slice, still on the coordinator
      results.append(await self._coordinator.invoke(form.after_merge, structure.Struct.unnamed(piece, merged)))
    return mce._repackage_partitioned_values(results, result_type)  # pylint: disable=protected-access

  def close(self):
    for worker in self.workers:
      worker.close()


_coordinator_context_class = None


def coordinator_context_class():
  """The CoordinatorContext class (a ``tff.framework.SyncContext``), built on first use.

  Built lazily so that importing this module (for ``serve``/``check``) does not
  import TensorFlow.
  """
  global _coordinator_context_class
  if _coordinator_context_class is None:
    import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
    _coordinator_context_class = type(
        "CoordinatorContext", (_CoordinatorContextImpl, tff.framework.SyncContext),
        {"__doc__": _CoordinatorContextImpl.__doc__, "__module__": __name__})
  return _coordinator_context_class


_active_context = None
_retired_contexts: list = []


def configure_execution_context(workers: Sequence[str],
                                connect_timeout: float = DEFAULT_CONNECT_TIMEOUT_SECONDS) -> None:
  """Makes TFF run each round's clients across the ``worker_binary`` services at ``workers``.

  Args:
    workers: ``host:port`` addresses (a sequence, or one comma-separated string).
    connect_timeout: seconds to wait for each worker to accept connections.

  Raises:
    ValueError: a malformed or duplicate address.
    WorkerError: a worker is not reachable (the message names its address).
  """
  global _active_context
  addresses = parse_worker_addresses(workers)
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
  from tff_mf.tf import runtime  # pylint: disable=g-import-not-at-top
  runtime.install_exit_hook()
  from tensorflow_federated.python.core.backends.native import execution_contexts  # pylint: disable=g-import-not-at-top
  channels = []
  try:
    for address in addresses:
      channels.append(wait_for_worker(address, connect_timeout))
  except WorkerError:
    for channel in channels:
      channel.close()
    raise
  worker_contexts = [_WorkerContext(a, c) for a, c in zip(addresses, channels)]
  coordinator = execution_contexts.create_async_local_cpp_execution_context()
  context = coordinator_context_class()(worker_contexts, coordinator)
  # Keep the replaced default context alive. When TFF's local C++ context is
  # garbage collected, its ServiceManager.__del__ sends SIGINT to its
  # worker_binary and waits for it; a process started with SIGINT ignored (a
  # background job of a non-interactive shell, as under nohup or `make &`)
  # passes that on, the worker ignores it, and the wait never returns. The
  # retired servers are stopped at exit by tff_mf.tf.runtime's exit hook.
  from tensorflow_federated.python.core.impl.context_stack import context_stack_impl  # pylint: disable=g-import-not-at-top
  stack = getattr(context_stack_impl.context_stack, "_stack", None)
  _retired_contexts.append(stack[0] if stack else tff.framework.get_context_stack().current)
  tff.framework.set_default_context(context)
  if _active_context is not None:
    _active_context.close()
  _active_context = context


def active_context():
  """The context installed by the last configure_execution_context call (None if none)."""
  return _active_context


def _pick_loopback_port() -> int:
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def stop_local_workers(workers: Sequence[Tuple[str, subprocess.Popen]], timeout: float = 5.0) -> None:
  """Terminates (then kills) the worker processes started by start_local_workers."""
  for _, process in workers:
    if process.poll() is None:
      process.terminate()
  deadline = time.monotonic() + timeout
  for _, process in workers:
    try:
      process.wait(timeout=max(0.1, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
      process.kill()
      process.wait()


def start_local_workers(count: int, startup_timeout: float = 60.0,
                        log_dir: Optional[str] = None) -> List[Tuple[str, subprocess.Popen]]:
  """Starts ``count`` local ``worker_binary`` services; returns [(\"127.0.0.1:port\", process)].

  Ports are picked free on the loopback interface and the coordinator connects
  through 127.0.0.1 (note that worker_binary itself listens on all interfaces).
  The processes are stopped at interpreter exit if the caller does not stop
  them first (use :func:`local_workers` for a scoped version).
  """
  if count < 1:
    raise ValueError(f"count must be >= 1, got {count}")
  binary = worker_binary_path()
  started: List[Tuple[str, subprocess.Popen]] = []
  try:
    for index in range(count):
      port = _pick_loopback_port()
      if log_dir:
        os.makedirs(log_dir, exist_ok=True)
        log = open(os.path.join(log_dir, f"worker_{index}_{port}.log"), "wb")  # pylint: disable=consider-using-with
      else:
        log = subprocess.DEVNULL
      process = subprocess.Popen([binary, f"--port={port}"], stdout=log, stderr=log,
                                 stdin=subprocess.DEVNULL)
      if log_dir:
        log.close()
      started.append((f"127.0.0.1:{port}", process))
      atexit.register(stop_local_workers, [(f"127.0.0.1:{port}", process)])
    for address, process in started:
      deadline = time.monotonic() + startup_timeout
      while True:
        if process.poll() is not None:
          raise RuntimeError(f"worker_binary for {address} exited with code {process.returncode} at start-up")
        try:
          wait_for_worker(address, timeout=min(2.0, max(0.1, deadline - time.monotonic()))).close()
          break
        except WorkerError:
          if time.monotonic() > deadline:
            raise
  except BaseException:
    stop_local_workers(started)
    raise
  return started


@contextlib.contextmanager
def local_workers(count: int, **kwargs) -> Iterator[List[Tuple[str, subprocess.Popen]]]:
  """Context manager around start_local_workers that always stops the processes."""
  workers = start_local_workers(count, **kwargs)
  try:
    yield workers
  finally:
    stop_local_workers(workers)


def build_parser():
  """The parser of ``python -m training.distributed``."""
  from tff_mf import clitools  # pylint: disable=g-import-not-at-top
  parser = clitools.ArgumentParser(
      prog="python -m training.distributed",
      description="Start or check TFF C++ executor services (worker_binary) for --workers. "
                  "Exit status 0, 1 when a worker is not ready, 2 on a usage error.")
  sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
  serve = sub.add_parser("serve", help="run worker_binary in the foreground (exec) on --port")
  serve.add_argument("--port", type=int, required=True,
                     help="TCP port the worker listens on, 1..65535")
  serve.add_argument("--max_concurrent_computation_calls", type=int, default=-1,
                     help="limit of parallel client computations on this worker (-1: no limit)")
  check = sub.add_parser("check", help="check that every worker in --workers accepts connections")
  check.add_argument("--workers", required=True,
                     help="TFF worker addresses host:port,host:port,... (as the training "
                          "binary's --workers)")
  check.add_argument("--timeout", type=float, default=10.0,
                     help="seconds to wait for each worker to accept a connection")
  sub.add_parser("binary", help="print the path of worker_binary")
  return parser


def main(argv: Optional[List[str]] = None) -> int:
  """``python -m training.distributed {serve,check,binary}``: start or probe TFF workers."""
  parser = build_parser()
  args = parser.parse_args(argv)
  if args.command == "binary":
    print(worker_binary_path())
    return 0
  if args.command == "serve":
    if not 1 <= args.port <= 65535:
      parser.error(f"--port must be in 1..65535, got {args.port}")
    binary = worker_binary_path()
    sys.stdout.flush()
    os.execv(binary, [binary, f"--port={args.port}",
                      f"--max_concurrent_computation_calls={args.max_concurrent_computation_calls}"])
  try:
    addresses = parse_worker_addresses(args.workers)
  except ValueError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  failures = 0
  for address in addresses:
    try:
      wait_for_worker(address, args.timeout).close()
      print(f"{address}: ready")
    except WorkerError as e:
      failures += 1
      print(f"{address}: NOT READY ({e.detail})", file=sys.stderr)
  return 1 if failures else 0


if __name__ == "__main__":
  sys.exit(main())
