"""The compiled simulation engine: TFF's FedAvg round on one Keras model in this process.

``--engine=compiled`` runs the round of ``tff.learning.algorithms.build_unweighted_fed_avg``
(McMahan et al. 2017, arXiv:1602.05629; with the aggregation of Denisov et al. 2022,
arXiv:2202.08312, Algorithm 1) without TFF's runtime, the way single-machine simulators
train (Granqvist et al. 2024, arXiv:2404.06430, Sec 3: one model, clients one after
another, central noise added once to the sum). It is built from the parts the TFF
process is built from, not from copies of them:

- the client update is TFF's (``model_delta_client_work``'s
  ``build_model_delta_update_with_tff_optimizer``: the client optimizer over the client's
  batches in the client's order, the delta zeroed when not finite), traced once on one
  model and run for each client in turn: a round whose clients are all arrays runs them in
  one call, a loop over the clients inside the graph (Python's per-call dispatch cost
  about 1 ms a client on the main job's model); the round's model, sample parameters and
  hyperparameters are set once a round, in variables. The harness gives a client as arrays
  (``stackoverflow.preprocessing.ClientBatches``) and the traced update slices its batches
  (``_array_client_update``: TFF's loop body, the same kernels on the same rows): a tf.data
  dataset iterated inside the graph builds its iterator at every call, about 10 ms per
  client on 2 cores, and ``dataset.reduce`` (TFF's default) instantiates the step function
  again at every call (0.24 s per client on a 650-parameter model). A dataset is still
  taken, through TFF's own function (tests and benchmarks feed both forms);
- each update then goes through ``tff_mf.tf.clipping.zero_if_non_finite`` and the DP
  query's ``preprocess_record`` (clipping), and is summed into one accumulator, as
  ``NonFiniteZeroingFactory`` and ``tff.aggregators.DifferentiallyPrivateFactory`` do (the
  non-private ``nonprivate_clipped`` clips as TFF's ``clipping_factory`` does);
- the query is the one ``tff_mf.tf.aggregators.build_mechanism`` wires into TFF
  (``DPAggregatorFactory.dp_query``): its ``initial_global_state``,
  ``derive_sample_params``, ``get_noised_result`` (the noise, once per round) and
  ``derive_metrics`` run here as ``tf.function`` s, the query's state passed in and out as
  one vector per dtype (``_PackedLayout``: the banded stream's state is 123 tensors on the
  main job's model, and each argument tensor costs a call more than the noise does) and
  the state a round returned taken back as it is;
- the server optimizer is the run's ``tff.learning.optimizers`` optimizer, applied as
  TFF's finalizer applies it (a non-finite update is rejected).

The process has the interface of TFF's ``LearningProcess`` that ``training.loop`` uses
(``initialize``, ``next``, ``get_model_weights``, ``set_model_weights``) and a state of the
same structure (``LearningAlgorithmState`` of numpy arrays), so checkpoints, the DpEvent
ledger and the metrics are those of the TFF path, and a checkpoint of one engine resumes
on the other. ``--workers`` (TFF's distributed runtime) keeps the TFF process.
"""

from __future__ import annotations

import collections
import logging
import os
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

def _numpy(structure):
  """Tensors and Python scalars as numpy, of the dtypes TFF's runtime returns them in."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  def leaf(x):
    if hasattr(x, "numpy"):
      return x.numpy()
    if isinstance(x, (bool, int, float)):
      return tf.constant(x).numpy()  # as a TFF computation returns a Python constant
    return x
  return tf.nest.map_structure(leaf, structure)


def _event_numpy(event):
  """A DpEvent as TFF's state holds it (``DpEvent.to_named_tuple``; floats as float64)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  def leaf(x):
    if hasattr(x, "numpy"):
      return x.numpy()
    if isinstance(x, str):
      return x.encode()
    if isinstance(x, float):
      return np.float64(x)
    return x
  return tf.nest.map_structure(leaf, event.to_named_tuple())


class _NoRetracingWarning(logging.Filter):
  """Drops TensorFlow's warning that a tf.function was traced frequently: every run of a job
  builds its process, and so its functions, anew (the main job has 7 runs), and TensorFlow
  counts the fresh functions of one name as retracing of one."""

  def filter(self, record: logging.LogRecord) -> bool:
    return "triggered tf.function retracing" not in record.getMessage()


def quiet_retracing_warnings() -> None:
  """Installs ``_NoRetracingWarning`` on TensorFlow's logger (once)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  logger = tf.get_logger()
  if not any(isinstance(f, _NoRetracingWarning) for f in logger.filters):
    logger.addFilter(_NoRetracingWarning())


def _array_client_update(model, optimizer):
  """TFF's client update on a client's batches given as arrays (``ClientBatches``).

  The body of ``build_model_delta_update_with_tff_optimizer`` (dataset-iterator loop): the
  weights set to the round's model, the optimizer initialized with the round's
  hyperparameters, then for each batch in order the model's ``forward_pass``, the gradient
  of its loss and ``optimizer.next``; the update is the initial weights minus the final
  ones, zeroed when not finite (TFF's ``zero_all_if_any_non_finite``, the metrics reset).
  The batches are row slices of x and y, the rows and values tf.data's ``batch`` yields, so
  every batch runs the same kernels on the same inputs as in TFF's process.
  """
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
  from tensorflow_federated.python.learning import tensor_utils  # pylint: disable=g-import-not-at-top
  weights = tff.learning.models.ModelWeights.from_model(model)
  specs = tuple(tf.TensorSpec(v.shape, v.dtype) for v in tf.nest.flatten(weights.trainable))

  def client_update(initial_weights, x, y, batch_size, hparams):
    tf.nest.map_structure(lambda a, b: a.assign(b), weights, initial_weights)
    state = optimizer.set_hparams(optimizer.initialize(specs), hparams)
    rows = tf.shape(x, out_type=tf.int64)[0]
    for start in tf.range(tf.constant(0, tf.int64), rows, batch_size):
      stop = tf.minimum(start + batch_size, rows)
      with tf.GradientTape() as tape:
        output = model.forward_pass((x[start:stop], y[start:stop]), training=True)
      gradients = tape.gradient(output.loss, weights.trainable)
      state, updated = optimizer.next(state, tuple(tf.nest.flatten(weights.trainable)),
                                      tuple(tf.nest.flatten(gradients)))
      tf.nest.map_structure(lambda a, b: a.assign(b), weights.trainable,
                            tf.nest.pack_sequence_as(weights.trainable, updated))
    update = tf.nest.map_structure(tf.subtract, initial_weights.trainable, weights.trainable)
    update, non_finite = tensor_utils.zero_all_if_any_non_finite(update)
    if non_finite > 0:
      model.reset_metrics()
    return update, model.report_local_unfinalized_metrics()
  return client_update


def _add_update_fn(query, accumulator, plain_clip: Optional[float], clipped):
  """add_update(update, sample_params): a client's update into the round's sum, as the
  aggregators take it: zeroed when not finite (``NonFiniteZeroingFactory``), then the
  query's clipping (``preprocess_record``), or for a non-private clipped mean TFF's
  ``clipping_factory`` clip (its global L2 norm, float32; ``clipped`` counts the clipped
  updates as its ``clipped_count``); returns whether the update was zeroed."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from tensorflow_federated.python.aggregators import robust  # pylint: disable=g-import-not-at-top
  from tff_mf.tf import clipping as tf_clipping  # pylint: disable=g-import-not-at-top

  def add_update(update, sample_params):
    value, zeroed = tf_clipping.zero_if_non_finite(list(update))
    if query is not None:
      record = query.preprocess_record(sample_params, value)
    elif plain_clip is not None:
      norm = tf.constant(plain_clip, robust.NORM_TF_TYPE)
      record, global_norm = robust._clip_by_global_l2_norm(value, norm)  # pylint: disable=protected-access
      clipped.assign_add(tf.cast(global_norm > norm, robust.COUNT_TF_TYPE))
    else:
      record = value
    tf.nest.map_structure(lambda a, r: a.assign_add(r), accumulator, record)
    return zeroed
  return add_update


def _round_step_builder(model, array_update, add_update, round_model, report: bool):
  """``round_step_for(round_inputs)``: the step on arrays (one client or a whole round) for
  one structure of the round's inputs (sample parameters, hyperparameters)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  def round_step_for(round_inputs):
    """The step on arrays, its round's sample parameters and hyperparameters read from
    ``round_inputs`` (variables set once a round, as the model is: a call then passes only
    the clients' batches, which saves the canonicalization of nested arguments, about 1 ms
    a call on the main job's model)."""

    @tf.function(reduce_retracing=True)  # one trace for every round's row count
    def round_step(x, y, bounds, batch_sizes):
      """Clients in order, in one call: client k's rows are x[bounds[k]:bounds[k + 1]]
      (the metrics reset before each when reported, TFF's client update, then the
      aggregators' zeroing, clipping and sum); the zeroed-update flags and the metrics are
      summed in client order, as the per-client loop sums them."""
      start = tf.nest.map_structure(lambda v: v.read_value(), round_model)
      sample_params, hparams = tf.nest.map_structure(lambda v: v.read_value(), round_inputs)
      zeroed = tf.constant(0, tf.int32)
      summed = tf.nest.map_structure(tf.zeros_like, model.report_local_unfinalized_metrics())
      for k in tf.range(tf.shape(batch_sizes)[0]):
        if report:
          model.reset_metrics()
        lo, hi = bounds[k], bounds[k + 1]
        update, metrics = array_update(start, x[lo:hi], y[lo:hi], batch_sizes[k], hparams)
        zeroed += add_update(update, sample_params)
        summed = tf.nest.map_structure(tf.add, summed, metrics)
      return zeroed, summed
    return round_step
  return round_step_for


def _rebuilder(structure) -> Callable[[List[Any]], Any]:
  """``flat -> structure`` around the leaves ``flat``: ``tf.nest.pack_sequence_as`` without
  its checks on every call (about 1.5 ms a round on the banded stream's 123 leaves), for
  tuples, lists and namedtuples, checked once here; other structures pack through tf.nest."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  def build(node):
    if isinstance(node, tuple) and hasattr(node, "_fields"):
      parts, kind = [build(x) for x in node], type(node)
      return lambda it: kind(*[part(it) for part in parts])
    if type(node) in (tuple, list):  # pylint: disable=unidiomatic-typecheck
      parts, kind = [build(x) for x in node], type(node)
      return lambda it: kind([part(it) for part in parts])
    if tf.nest.is_nested(node):
      raise TypeError(type(node).__name__)
    return next
  fallback = lambda flat: tf.nest.pack_sequence_as(structure, flat)
  try:
    fn = build(structure)
  except TypeError:
    return fallback
  count = len(tf.nest.flatten(structure))
  probe = fn(iter(range(count)))
  try:
    tf.nest.assert_same_structure(probe, structure, check_types=True)
  except (ValueError, TypeError):
    return fallback
  if tf.nest.flatten(probe) != list(range(count)):
    return fallback
  return lambda flat: fn(iter(flat))


# A state leaf of at least this many entries crosses as its own vector (``_PackedLayout``).
_OWN_VECTOR = 1 << 16


class _PackedLayout:
  """Where each leaf of a nested state lies in one flat vector per dtype, a large leaf (a
  stream's state row of a large model) in a vector of its own.

  The DP query's state crosses the engine's ``tf.function`` boundaries as these few vectors
  instead of one tensor a leaf: a call canonicalizes every argument leaf in Python, and the
  banded stream's 123 leaves on the main job's model cost more than its noise. A large leaf
  alone is not copied into a concatenation each round (232 MiB of banded state at d = 4M).
  Packing is concatenation and splitting, so every value (the stream's rows, the seed) is bit
  for bit the one a leaf would carry.
  """

  def __init__(self, structure, specs: Sequence[Tuple[Any, Tuple[int, ...]]]):
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    self.structure = tf.nest.map_structure(lambda _: None, structure)
    self.key = (tuple((np.dtype(d), tuple(int(x) for x in shape)) for d, shape in specs),
                str(self.structure))
    self.specs = self.key[0]
    size = lambda k: int(np.prod(self.specs[k][1]))
    large = [k for k in range(len(self.specs)) if size(k) >= _OWN_VECTOR]
    dtypes = sorted({d for k, (d, _) in enumerate(self.specs) if k not in large}, key=str)
    # One vector per dtype of the small leaves, then each large leaf as its own vector.
    self.groups = tuple(tuple(k for k, (d, _) in enumerate(self.specs)
                              if d == dtype and k not in large) for dtype in dtypes) + tuple(
                                  (k,) for k in large)
    self.dtypes = tuple(self.specs[group[0]][0] for group in self.groups)
    self.sizes = tuple(tuple(int(np.prod(self.specs[k][1])) for k in group)
                       for group in self.groups)
    ends = [np.cumsum(sizes).tolist() for sizes in self.sizes]
    self.bounds = [list(zip([0] + e[:-1], e)) for e in ends]  # each leaf's [start, end)
    self.rebuild = _rebuilder(self.structure)
    self.steps: Optional[Tuple[Any, Any, Dict[str, Any]]] = None  # _query_steps_for's

  @classmethod
  def of_arrays(cls, structure, flat) -> "_PackedLayout":
    """The layout of a state of numpy arrays (or scalars), ``flat`` its leaves."""
    return cls(structure, [(np.asarray(a).dtype, np.shape(a)) for a in flat])

  @classmethod
  def of_tensors(cls, structure) -> Optional["_PackedLayout"]:
    """The layout of a traced state, or None when a shape is known only at run time."""
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    flat = tf.nest.flatten(structure)
    if not all(t.shape.is_fully_defined() for t in flat):
      return None
    return cls(structure, [(t.dtype.as_numpy_dtype, tuple(t.shape)) for t in flat])

  def signature(self):
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    return [tf.TensorSpec([sum(sizes)], tf.as_dtype(d)) for d, sizes in zip(self.dtypes,
                                                                             self.sizes)]

  def pack_arrays(self, flat):
    """The vectors of numpy leaves ``flat``, as tensors."""
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    line = lambda k: np.ravel(np.asarray(flat[k]))  # a view where the leaf is contiguous
    return [tf.constant(line(group[0]) if len(group) == 1 else
                        np.concatenate([line(k) for k in group])) for group in self.groups]

  def pack_tensors(self, structure):
    """The vectors of a traced state of this layout (in the graph)."""
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    flat = tf.nest.flatten(structure)
    line = lambda k: flat[k] if len(self.specs[k][1]) == 1 else tf.reshape(flat[k], [-1])
    return [tf.concat([line(k) for k in group], 0) for group in self.groups]

  def _leaves(self, vectors, split, reshape):
    """The leaves from the vectors: ``split(vector, group index)``, ``reshape(part, shape)``."""
    flat: List[Any] = [None] * len(self.specs)
    for g, (group, vector) in enumerate(zip(self.groups, vectors)):
      parts = split(vector, g) if len(group) > 1 else [vector]
      for k, part in zip(group, parts):
        flat[k] = reshape(part, self.specs[k][1])
    return flat

  def unpack_tensors(self, vectors):
    """The state of this layout from its vectors (in the graph)."""
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    split = lambda v, g: tf.split(v, self.sizes[g])
    reshape = lambda part, shape: part if len(shape) == 1 else tf.reshape(part, shape)
    return tf.nest.pack_sequence_as(self.structure, self._leaves(vectors, split, reshape))

  def unpack_arrays(self, vectors):
    """The state of this layout as read-only numpy arrays (views of each vector's buffer,
    so the engine may take a state it returned back by identity)."""
    def numpy(vector):
      array = np.asarray(vector)  # the tensor's buffer, not a copy (``numpy()`` copies)
      array.flags.writeable = False
      return array
    split = lambda v, g: [v[a:b] for a, b in self.bounds[g]]
    # a scalar as TFF's runtime returns it: a numpy scalar, not a 0-d array
    reshape = lambda v, shape: v.reshape(shape) if shape else v.reshape(())[()]
    return self.rebuild(self._leaves([numpy(v) for v in vectors], split, reshape))


def _query_steps_for(query, layout: _PackedLayout, accumulator, update):
  """``(sample_params, noised, traced)``: the query's once-a-round steps for states of
  ``layout``, each one ``tf.function`` on the state's packed vectors. ``noised`` puts the
  noised sum of ``accumulator`` (the query's ``get_noised_result``) in the variables
  ``update`` and returns the new state packed, its DpEvent, the query's metrics of it
  (``derive_metrics``) and its sample parameters for the next round; tracing it puts the
  new state's layout in ``traced["layout"]`` (None, and the new state's leaves returned
  unpacked, when a shape is known only at run time)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  traced: Dict[str, Any] = {}

  @tf.function(input_signature=[layout.signature()])
  def sample_params(vectors):
    return query.derive_sample_params(layout.unpack_tensors(vectors))

  @tf.function(input_signature=[layout.signature()])
  def noised(vectors):
    sample_state = tf.nest.map_structure(tf.identity, accumulator)
    result, new_state, event = query.get_noised_result(sample_state,
                                                       layout.unpack_tensors(vectors))
    for variable, value in zip(update, tf.nest.flatten(result)):
      variable.assign(value)
    traced["layout"] = new_layout = _PackedLayout.of_tensors(new_state)
    packed = new_state if new_layout is None else new_layout.pack_tensors(new_state)
    return (packed, event, query.derive_metrics(new_state),
            query.derive_sample_params(new_state))
  return sample_params, noised, traced


def _arrays_of_one_length(clients) -> bool:
  """Whether there are clients, all given as ``ClientBatches`` of one sequence length."""
  ids = [getattr(c, "ids", None) for c in clients]
  return bool(ids) and all(i is not None for i in ids) and len({i.shape[1] for i in ids}) == 1


class CompiledProcess:
  """FedAvg rounds with the run's DP query, compiled once, on one model.

  Args:
    model_fn: the no-argument ``tff.learning.models.VariableModel`` builder of the task.
    aggregation_factory: the run's ``tff_mf.tf.clipping.NonFiniteZeroingFactory``
      around ``tff_mf.tf.aggregators.DPAggregatorFactory``.
    server_optimizer: the run's ``tff.learning.optimizers.Optimizer``.
    client_lr: the client SGD learning rate (``tff.learning.optimizers.build_sgdm``).
    report_train_metrics: also sum the clients' training metrics (the metric state is then
      reset before each client, as TFF's fresh model per client starts from zero).
  """

  def __init__(self, model_fn: Callable[[], Any], aggregation_factory, server_optimizer,
               client_lr: float, report_train_metrics: bool = False):
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
    from tensorflow_federated.python.learning.templates import model_delta_client_work  # pylint: disable=g-import-not-at-top

    quiet_retracing_warnings()
    built: List[Any] = []

    def recording_model_fn():
      built.append(model_fn())
      return built[-1]

    self._client_update = model_delta_client_work.build_model_delta_update_with_tff_optimizer(
        recording_model_fn, weighting=tff.learning.ClientWeighting.UNIFORM,
        loop_implementation=tff.learning.LoopImplementation.DATASET_ITERATOR)
    self._model = model = built[-1]
    self._weights = tff.learning.models.ModelWeights.from_model(model)
    self._specs = [tf.TensorSpec(v.shape, v.dtype) for v in self._weights.trainable]
    self._client_optimizer = tff.learning.optimizers.build_sgdm(learning_rate=client_lr)
    self._server_optimizer = server_optimizer
    self._query = aggregation_factory.inner.dp_query(self._specs)
    self._report_metrics = bool(report_train_metrics)
    query, specs = self._query, self._specs
    zero_records = (query.initial_sample_state(specs) if query is not None
                    else [tf.zeros(s.shape, s.dtype) for s in specs])
    self._sum = tf.nest.map_structure(lambda t: tf.Variable(tf.zeros_like(t), trainable=False),
                                      zero_records)
    client_update, client_optimizer = self._client_update, self._client_optimizer
    accumulator = self._sum
    report = self._report_metrics

    self._plain_clip = aggregation_factory.inner.plain_clip_norm
    self._clipped = tf.Variable(0, dtype=tf.int32, trainable=False)
    add_update = _add_update_fn(query, accumulator, self._plain_clip, self._clipped)

    @tf.function
    def client_step(initial_weights, dataset, sample_params, hparams):
      if report:
        model.reset_metrics()
      result, metrics = client_update(client_optimizer, initial_weights, dataset, hparams)
      return add_update(result.update, sample_params), metrics

    array_update = _array_client_update(model, client_optimizer)
    # The round's model, set once a round: a client's call then passes only its batches (the
    # weights as arguments cost about 0.4 ms a call on the main job's model).
    self._round_model = round_model = tf.nest.map_structure(
        lambda v: tf.Variable(tf.zeros(v.shape, v.dtype), trainable=False), self._weights)

    round_step_for = _round_step_builder(model, array_update, add_update, round_model, report)
    self._client_step, self._round_step_for = client_step, round_step_for
    # (structure and specs of the round's inputs) -> (their variables, the round step)
    self._round_steps: Dict[Any, Any] = {}
    # A canary client (training.canaries): its fixed update goes the way of every client's.
    self._canary_step = tf.function(add_update)

    @tf.function
    def server_step(optimizer_state, trainable, update):
      new_state, new_weights = server_optimizer.next(optimizer_state, trainable, update)
      reject, measurements = tff.learning.templates.reject_non_finite_update(new_state, update)
      if reject:
        return optimizer_state, list(trainable), measurements
      return new_state, list(new_weights), measurements

    self._server_step = server_step
    self._compile_round_ends()
    if query is not None:
      self._compile_query(query, specs, accumulator)
    self._finalizers = model.metric_finalizers()
    self._finalize = None

  def _compile_round_ends(self) -> None:
    """A round's start and a non-private round's end, one call each."""
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    round_model, accumulator, clipped = self._round_model, self._sum, self._clipped
    server_step = self._server_step

    @tf.function
    def start_round(weights):
      """The round's model into its variables; the round's sum and clipped count to zero."""
      tf.nest.map_structure(lambda v, w: v.assign(w), round_model, weights)
      for variable in tf.nest.flatten(accumulator):
        variable.assign(tf.zeros_like(variable))
      clipped.assign(0)

    @tf.function
    def mean_server_step(optimizer_state, trainable, count):
      """A non-private round's end: the mean of the sum (UnweightedMeanFactory's division by
      the count of clients), then the server step."""
      return server_step(optimizer_state, trainable, [v / count for v in accumulator])

    self._start_round, self._mean_server_step = start_round, mean_server_step

  def _compile_query(self, query, specs, accumulator) -> None:
    """The query's initial state with its DpEvent, and a private round's server step, as
    ``tf.function`` s; the query's once-a-round steps are compiled for each layout of its
    state (``_query_inputs``)."""
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    # layout key -> layout with its steps; TFF's tree keeps one buffered node per completed
    # level, so its state takes a few layouts in a run
    self._query_layouts: Dict[Any, _PackedLayout] = {}
    # (the query state the last round returned, its layout, vectors, sample parameters)
    self._last_query: Optional[Tuple[Any, _PackedLayout, Any, Any]] = None
    self._events: Dict[str, Any] = {}  # _event_arrays
    # the round's noised mean, written by the query's step and read by the server step
    self._update = update = [tf.Variable(tf.zeros(s.shape, s.dtype), trainable=False)
                             for s in specs]
    server_step = self._server_step

    @tf.function
    def initial_aggregator_state():
      global_state = query.initial_global_state()
      _, _, event = query.get_noised_result(query.initial_sample_state(specs), global_state)
      return global_state, event

    @tf.function
    def private_server_step(optimizer_state, trainable):
      return server_step(optimizer_state, trainable, [v.read_value() for v in update])

    self._initial_aggregator_state = initial_aggregator_state
    self._private_server_step = private_server_step

  def _layout(self, layout: _PackedLayout) -> _PackedLayout:
    """The registered layout equal to ``layout`` (registered now if new), with its steps."""
    layout = self._query_layouts.setdefault(layout.key, layout)
    if layout.steps is None:
      layout.steps = _query_steps_for(self._query, layout, self._sum, self._update)
    return layout

  def _query_inputs(self, query_state):
    """(layout, packed vectors, sample parameters) of the round's query state: those the
    last round computed when ``query_state`` is the (read-only) state it returned."""
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    if self._last_query is not None and query_state is self._last_query[0]:
      return self._last_query[1:]
    flat = tf.nest.flatten(query_state)
    layout = self._layout(_PackedLayout.of_arrays(query_state, flat))
    vectors = layout.pack_arrays(flat)
    return layout, vectors, layout.steps[0](vectors)

  def _private_round_end(self, layout: _PackedLayout, vectors, finalizer, trainable):
    """A private round's end: the noised sum and the query's next state (one call), then the
    server step; (aggregator state, its measurements, the server step's three results)."""
    _, noised, traced = layout.steps
    packed, event, query_metrics, params = noised(vectors)
    if traced["layout"] is None:  # a shape known only at run time: the leaves themselves
      query_state, self._last_query = _numpy(packed), None
    else:
      if "registered" not in traced:
        traced["registered"] = self._layout(traced["layout"])
      out = traced["registered"]
      query_state = out.unpack_arrays(packed)
      self._last_query = (query_state, out, packed, params)
    aggregator = self._aggregator_state(query_state, self._event_arrays(event), False)
    inner = collections.OrderedDict(dp_query_metrics=_numpy(query_metrics), dp=())
    return (aggregator, inner, *self._private_server_step(finalizer, trainable))

  def _event_arrays(self, event):
    """``_event_numpy(event)``, kept by the event's text when all its values are scalars
    (then immutable numpy scalars): a query reports a few distinct events (the matrix
    mechanisms: their guarantee in round 0, nothing after), and converting one through
    ``to_named_tuple`` costs about 0.5 ms."""
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    if not all(np.ndim(x) == 0 for x in tf.nest.flatten(event)):
      return _event_numpy(event)
    key = repr(event)
    if key not in self._events:
      self._events[key] = _event_numpy(event)
    return self._events[key]

  def _aggregator_state(self, query_state, event, is_init_state: bool):
    from tensorflow_federated.python.aggregators import differential_privacy  # pylint: disable=g-import-not-at-top
    return differential_privacy.DPAggregatorState(query_state, (), event, np.bool_(is_init_state))

  def initialize(self):
    """The state TFF's ``initialize`` returns: the model's weights, no-op states, the
    client optimizer's hyperparameters, the query's initial state and the server
    optimizer's."""
    import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
    hparams = self._client_optimizer.get_hparams(self._client_optimizer.initialize(
        self._specs[0]))
    if self._query is None:
      aggregator = ((), ())  # UnweightedMeanFactory's: its two sums keep no state
      if self._plain_clip is not None:  # TFF's clipping_factory's (a constant norm) around it
        aggregator = collections.OrderedDict(clipping_norm=(), inner_agg=aggregator,
                                             clipped_count_agg=())
    else:
      query_state, event = self._initial_aggregator_state()
      aggregator = self._aggregator_state(_numpy(query_state), _event_numpy(event), True)
    weights = tff.learning.models.ModelWeights(
        trainable=[v.numpy() for v in self._weights.trainable],
        non_trainable=[v.numpy() for v in self._weights.non_trainable])
    return tff.learning.templates.LearningAlgorithmState(
        global_model_weights=weights, distributor=(), client_work=_numpy(hparams),
        aggregator=aggregator,
        finalizer=_numpy(self._server_optimizer.initialize(self._specs)))

  def get_model_weights(self, state):
    return state.global_model_weights

  def set_model_weights(self, state, model_weights):
    import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
    weights = tff.learning.models.ModelWeights(
        trainable=[_numpy(w) for w in model_weights.trainable],
        non_trainable=[_numpy(w) for w in model_weights.non_trainable])
    return state._replace(global_model_weights=weights)

  def _train_metrics(self, summed) -> "collections.OrderedDict[str, Any]":
    """The model's finalizers on the round's summed metrics (TFF's ``sum_then_finalize``).

    Keras finalizers build metric variables, so they run, as in TFF, in a graph of their
    own (built once, fed each round).
    """
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    if self._finalize is None:
      graph = tf.Graph()
      with graph.as_default():
        inputs = tf.nest.map_structure(
            lambda a: tf.compat.v1.placeholder(tf.as_dtype(np.asarray(a).dtype),
                                               np.shape(a)), summed)
        outputs = collections.OrderedDict(
            (name, finalizer(inputs[name])) for name, finalizer in self._finalizers.items())
        init = tf.compat.v1.global_variables_initializer()
      session = tf.compat.v1.Session(graph=graph)
      self._finalize = (session, init, inputs, outputs)
    session, init, inputs, outputs = self._finalize
    session.run(init)
    feed = dict(zip(tf.nest.flatten(inputs), tf.nest.flatten(summed)))
    return session.run(outputs, feed_dict=feed)

  def _round_step(self, params, hparams):
    """The step on arrays for this round's inputs, which it reads from variables set here."""
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    inputs = (params, hparams)
    key = str(tf.nest.map_structure(lambda t: (t.dtype.name, tuple(t.shape)), inputs))
    if key not in self._round_steps:
      variables = tf.nest.map_structure(lambda t: tf.Variable(t, trainable=False), inputs)
      self._round_steps[key] = (variables, self._round_step_for(variables))
    variables, round_step = self._round_steps[key]
    tf.nest.map_structure(lambda v, t: v.assign(t), variables, inputs)
    return round_step

  @staticmethod
  def _run_arrays(clients, round_step) -> Tuple[Any, Any]:
    """Clients given as ``ClientBatches`` of one sequence length, in one call of
    ``round_step``: (updates zeroed, the metrics summed in client order), as tensors."""
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    ids = np.concatenate([c.ids for c in clients])
    bounds = np.concatenate([[0], np.cumsum([len(c.ids) for c in clients])]).astype(np.int64)
    sizes = np.array([c.batch_size for c in clients], np.int64)
    return round_step(tf.constant(ids[:, :-1]), tf.constant(ids[:, 1:]), tf.constant(bounds),
                      tf.constant(sizes))

  def _one_client(self, initial, data, params, hparams, round_step):
    """One client's update into the round's sum: ``data`` its ``ClientBatches`` (the
    harness's form) or a tf.data.Dataset of (x, y) batches (TFF's form)."""
    if getattr(data, "ids", None) is None:
      return self._client_step(initial, data, params, hparams)
    return self._run_arrays([data], round_step)

  def next(self, state, client_datasets: Sequence[Any], canaries: Sequence[Any] = ()):
    """One round on ``client_datasets`` (clients in this order); a ``LearningProcessOutput``.

    ``canaries``: the client updates (one array per trainable variable) of the canary
    clients in this round (``training.canaries``), summed after the clients through the
    same zeroing and clipping; the mean's denominator stays the query's.
    """
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
    from tff_mf.tf import clipping as tf_clipping  # pylint: disable=g-import-not-at-top
    query = self._query
    trainable = [tf.constant(w) for w in state.global_model_weights.trainable]
    initial = tff.learning.models.ModelWeights(
        trainable=trainable,
        non_trainable=[tf.constant(w) for w in state.global_model_weights.non_trainable])
    hparams = tf.nest.map_structure(tf.constant, state.client_work)
    self._start_round(initial)
    if query is not None:
      layout, vectors, params = self._query_inputs(state.aggregator.query_state)
    else:
      params = ()
    zeroed, summed = 0, None
    round_step = self._round_step(params, hparams)
    if _arrays_of_one_length(client_datasets):
      flags, all_summed = self._run_arrays(client_datasets, round_step)
      zeroed = int(flags)
      summed = _numpy(all_summed) if self._report_metrics else None
    else:
      for data in client_datasets:
        flag, metrics = self._one_client(initial, data, params, hparams, round_step)
        zeroed += int(flag)
        if self._report_metrics:
          metrics = _numpy(metrics)
          summed = metrics if summed is None else tf.nest.map_structure(
              lambda a, b: a + b, summed, metrics)
    for update in canaries:
      if query is None:
        raise ValueError("canary clients need a DP query (a private mechanism)")
      self._canary_step([tf.constant(u) for u in update], params)
    finalizer = tf.nest.map_structure(tf.constant, state.finalizer)
    if query is None:
      optimizer_state, new_trainable, finalizer_metrics = self._mean_server_step(
          finalizer, trainable, tf.constant(float(len(client_datasets))))
      aggregator, inner = state.aggregator, collections.OrderedDict(mean_value=(),
                                                                     mean_count=())
      if self._plain_clip is not None:  # the measurements of TFF's clipping_factory
        inner = collections.OrderedDict(
            clipping=inner, clipping_norm=np.float32(self._plain_clip),
            clipped_count=self._clipped.numpy())
    else:
      aggregator, inner, optimizer_state, new_trainable, finalizer_metrics = (
          self._private_round_end(layout, vectors, finalizer, trainable))
    weights = tff.learning.models.ModelWeights(
        trainable=[w.numpy() for w in new_trainable],
        non_trainable=list(state.global_model_weights.non_trainable))
    new_state = tff.learning.templates.LearningAlgorithmState(
        global_model_weights=weights, distributor=(), client_work=state.client_work,
        aggregator=aggregator, finalizer=_numpy(optimizer_state))
    if self._report_metrics and summed is None:  # a round without clients: sums of zero
      self._model.reset_metrics()
      summed = _numpy(self._model.report_local_unfinalized_metrics())
    train = self._train_metrics(summed) if summed is not None else collections.OrderedDict()
    metrics = collections.OrderedDict(
        distributor=(), client_work=collections.OrderedDict(train=train),
        aggregator=collections.OrderedDict(inner=inner, **{tf_clipping.ZEROED_METRIC: zeroed}),
        finalizer=_numpy(finalizer_metrics))
    return tff.learning.templates.LearningProcessOutput(new_state, metrics)


# The compiled engine runs TensorFlow on one thread (intra- and inter-op) for a model of
# fewer trainable parameters than this: its ops are then too small to split, and handing them
# to thread pools costs more than they do. The main job's model (39,932 parameters): 2.56 ms
# of CPU a client update on one thread against 4.06 ms with TF's default pools on 2 cores,
# and less wall time too; the papers' (4.05M): the default pools halve a step's wall time.
SINGLE_THREAD_PARAMETERS = 1_000_000
THREAD_VARIABLES = ("TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS")


def configure_threads(config) -> str:
  """Sets TensorFlow's thread pools for the run ``config`` (a ``TrainingConfig`` whose
  engine is resolved) before TensorFlow starts, and says what they are.

  One thread each when the compiled engine trains a model under
  ``SINGLE_THREAD_PARAMETERS``; otherwise, or when the environment sets TensorFlow's own
  ``TF_NUM_INTRAOP_THREADS``/``TF_NUM_INTEROP_THREADS``, TensorFlow's choice. Pools are fixed
  once TensorFlow runs: a process that already ran ops keeps its pools. Threads change the
  speed only, never what a run computes or releases (a checkpoint resumes under any).
  """
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from stackoverflow import model as so_model  # pylint: disable=g-import-not-at-top
  if any(os.environ.get(name) for name in THREAD_VARIABLES):
    return "set by " + ", ".join(f"{n}={os.environ[n]}" for n in THREAD_VARIABLES
                                 if os.environ.get(n))
  parameters = so_model.parameter_count(
      config.vocab_size, config.num_oov_buckets, config.embedding_size, config.lstm_size,
      config.projection_size)
  current = (tf.config.threading.get_intra_op_parallelism_threads(),
             tf.config.threading.get_inter_op_parallelism_threads())
  if config.engine != "compiled" or parameters >= SINGLE_THREAD_PARAMETERS:
    return "one thread" if current == (1, 1) else "TensorFlow's default"
  if current != (1, 1):
    try:
      tf.config.threading.set_intra_op_parallelism_threads(1)
      tf.config.threading.set_inter_op_parallelism_threads(1)
    except RuntimeError:  # TensorFlow already runs: its pools stay
      return "TensorFlow's default (it was running before the run started)"
  return "one thread"


def build_process(engine: str, model_fn, setup, client_lr: float,
                  report_train_metrics: bool = False):
  """The run's FedAvg process: TFF's (``engine="tff"``) or the compiled one.

  ``engine`` is the one that runs (``training.config.used_engine``), never ``auto``.
  """
  if engine not in ("tff", "compiled"):
    raise ValueError(f"engine {engine!r} is not tff or compiled (resolve auto first)")
  if engine == "compiled":
    return CompiledProcess(model_fn, setup.aggregation_factory, setup.server_optimizer,
                           client_lr, report_train_metrics=report_train_metrics)
  from training import run_setup  # pylint: disable=g-import-not-at-top
  return run_setup.build_process(model_fn, setup, client_lr)
