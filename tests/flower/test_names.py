"""Flower's names for its DP wrappers' arguments work on ours (issue 48, item 2), and a wrapped
strategy's optimizer post-processes the release where the workload allows it (item 3): the positional
form ``(strategy, noise_multiplier, clipping_norm, num_sampled_clients)``, the keywords
``clipping_norm`` and ``num_sampled_clients``, and the adaptive wrapper's
``initial_clipping_norm``, ``target_clipped_quantile``, ``clip_norm_lr`` and
``clipped_count_stddev``, beside ours; a wrong or missing name is one line."""

import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.serverapp.strategy import FedAdam, FedAvg

from tff_mf import checks
from tff_mf import spec as spec_lib
from tff_mf.flower import strategy as strategy_lib

FIXED = strategy_lib.MatrixFactorizationFixedClipping
ADAPTIVE = strategy_lib.MatrixFactorizationAdaptiveClipping
COMMON = dict(delta=1e-5, noise_seed=3, sampling_seed=1, sampling_secret=2, population=16)


def fedavg():
  return FedAvg(fraction_train=1.0, fraction_evaluate=0.0)


def test_flowers_positional_form_and_keywords_are_our_spec():
  ours = spec_lib.MechanismSpec.from_args("blt", total_rounds=8, clients_per_round=2,
                                          clip_norm=0.5, noise_multiplier=1.2, delta=1e-5)
  positional = FIXED(fedavg(), 1.2, 0.5, 2, total_rounds=8, **COMMON)
  keywords = FIXED(fedavg(), noise_multiplier=1.2, clipping_norm=0.5, num_sampled_clients=2,
                   total_rounds=8, mechanism="blt", **COMMON)
  named = FIXED(fedavg(), "blt", total_rounds=8, clients_per_round=2, clip_norm=0.5,
                noise_multiplier=1.2, **COMMON)
  assert positional.spec == keywords.spec == named.spec == ours
  assert strategy_lib.DEFAULT_MECHANISM == "blt"
  other = FIXED(fedavg(), 1.2, 0.5, 2, total_rounds=8, mechanism="banded", **COMMON)
  assert other.spec.mechanism.name == "banded"


def test_flowers_adaptive_names_and_positional_form():
  w = ADAPTIVE(fedavg(), 1.2, 2, total_rounds=8, initial_clipping_norm=0.5,
               target_clipped_quantile=0.7, clip_norm_lr=0.1, clipped_count_stddev=0.3,
               **COMMON)
  a = w.spec.adaptive
  assert (a.initial_clip_norm, a.target_quantile, a.learning_rate,
          a.clipped_count_stddev) == (0.5, 0.7, 0.1, 0.3)
  ours = ADAPTIVE(fedavg(), "blt", total_rounds=8, clients_per_round=2, noise_multiplier=1.2,
                  initial_clip_norm=0.5, target_quantile=0.7, clip_learning_rate=0.1,
                  clipped_count_stddev=0.3, **COMMON)
  assert ours.spec == w.spec
  defaults = ADAPTIVE(fedavg(), 1.2, 4, total_rounds=8, **COMMON).spec.adaptive
  assert defaults.clipped_count_stddev == pytest.approx(4 / 20)  # Flower's and TFF's default


@pytest.mark.parametrize("make, words", [
    (lambda: FIXED(fedavg(), 1.2, 0.5, 2, total_rounds=8, clipingnorm=1.0, **COMMON),
     "unknown argument 'clipingnorm'; did you mean"),
    (lambda: FIXED(fedavg(), 1.2, 0.5, 2, **COMMON), "needs total_rounds"),
    (lambda: FIXED(fedavg(), 1.2, 0.5, 2, clipping_norm=0.5, total_rounds=8, **COMMON),
     "clip_norm is given positionally and by keyword"),
    (lambda: FIXED(fedavg(), "blt", clip_norm=1.0, clipping_norm=1.0, total_rounds=8,
                   clients_per_round=2, noise_multiplier=1.0, **COMMON),
     "give clipping_norm .* or clip_norm, not both"),
    (lambda: FIXED(fedavg(), 1.2, 0.5, 2, 7, total_rounds=8, **COMMON), "Flower's positional"),
])
def test_a_wrong_or_missing_name_is_one_line(make, words):
  with pytest.raises(checks.CheckError, match=words) as e:
    make()
  assert "\n" not in str(e.value)


class Grid:
  def get_node_ids(self):
    return list(range(301, 317))


def _rounds(w, count):
  """``count`` rounds of ``w`` on clients that each move the model by +0.25."""
  arrays = ArrayRecord([np.zeros(5, np.float32)])
  for r in range(1, count + 1):
    messages = list(w.configure_train(r, arrays, ConfigRecord(), Grid()))
    replies = [Message(RecordDict({"arrays": ArrayRecord([
        m.content["arrays"].to_numpy_ndarrays()[0] + np.float32(0.25)]),
        "metrics": MetricRecord({"num-examples": 1})}), reply_to=m) for m in messages]
    arrays, _ = w.aggregate_train(r, replies)
  return arrays


@pytest.mark.usefixtures("flower_task")
def test_a_wrapped_optimizer_post_processes_the_released_estimate():
  """For a prefix-sum workload the wrapped FedAdam gets the released noisy mean: the same
  FedAdam fed, by hand, the model FedAvg's wrapper releases (current + noisy mean) gives the
  same model."""
  kwargs = dict(total_rounds=4, mechanism="blt", **COMMON)
  adam = FIXED(FedAdam(fraction_train=1.0, fraction_evaluate=0.0, eta=0.1), 1.2, 0.5, 2,
               **kwargs)
  assert adam.delegates_optimizer
  got = _rounds(adam, 1).to_numpy_ndarrays()[0]
  plain = FIXED(fedavg(), 1.2, 0.5, 2, **kwargs)
  assert not plain.delegates_optimizer
  estimate = _rounds(plain, 1)  # η = 1, momentum 0: the current model plus the noisy mean
  by_hand = FedAdam(fraction_train=1.0, fraction_evaluate=0.0, eta=0.1)
  start = ArrayRecord([np.zeros(5, np.float32)])
  list(by_hand.configure_train(1, start, ConfigRecord(), Grid()))
  source = Message(RecordDict(), dst_node_id=0, message_type=MessageType.TRAIN)
  want, _ = by_hand.aggregate_train(1, [Message(RecordDict({
      "arrays": estimate, "metrics": MetricRecord({"num-examples": 1})}), reply_to=source)])
  assert np.array_equal(got, want.to_numpy_ndarrays()[0])
  assert not np.array_equal(got, estimate.to_numpy_ndarrays()[0])


def test_an_optimizer_over_a_mechanism_that_owns_the_momentum_is_refused():
  with pytest.raises(checks.CheckError, match="FedAdam's optimizer cannot be applied"):
    FIXED(FedAdam(fraction_train=1.0, fraction_evaluate=0.0), 1.2, 0.5, 2, total_rounds=8,
          momentum=0.9, **COMMON)
  with pytest.raises(checks.CheckError, match="server_learning_rate=0.5 does not apply"):
    FIXED(FedAdam(fraction_train=1.0, fraction_evaluate=0.0), 1.2, 0.5, 2, total_rounds=8,
          server_learning_rate=0.5, **COMMON)
