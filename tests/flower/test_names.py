"""Flower's names for its DP wrappers' arguments work on ours (issue 48, item 2): the positional
form ``(strategy, noise_multiplier, clipping_norm, num_sampled_clients)``, the keywords
``clipping_norm`` and ``num_sampled_clients``, and the adaptive wrapper's
``initial_clipping_norm``, ``target_clipped_quantile``, ``clip_norm_lr`` and
``clipped_count_stddev``, beside ours; a wrong or missing name is one line."""

import pytest
from flwr.serverapp.strategy import FedAvg

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
