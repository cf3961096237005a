"""A Flower state file belongs to one run (issue 46 items 3-5, 10, 11): bound to its
mechanism, private to its owner, locked, and checked against its release log; with
Flower's PrivacyConfig and client-side clipping mods refused where they claim what the
record does not account. The wrapper's rounds run directly (``configure_train`` then
``aggregate_train``) on clients that send fixed updates."""

import os
import shutil

import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord, Error, Message, MetricRecord, RecordDict
from flwr.serverapp import NeighboringRelation, PrivacyConfig, SamplingMethod
from flwr.serverapp.exception import PrivacyBudgetExhausted
from flwr.serverapp.strategy import FedAvg
from flwr.supercore.differential_privacy import KEY_CLIPPING_NORM, KEY_NORM_BIT

from tff_mf import checks
from tff_mf import participation
from tff_mf import plan as plan_lib
from tff_mf.flower import strategy as strategy_lib

N, K, NODES = 4, 2, list(range(201, 209))


pytestmark = pytest.mark.usefixtures("flower_task")


class Grid:
  def get_node_ids(self):
    return list(NODES)


def wrapper(mechanism="blt", cls=strategy_lib.MatrixFactorizationFixedClipping, **overrides):
  kwargs = dict(total_rounds=N, clients_per_round=K, clip_norm=1.0, noise_multiplier=1.0,
                delta=1e-5, noise_seed=3, sampling_seed=1, sampling_secret=2,
                population=len(NODES))
  kwargs.update(overrides)
  return cls(FedAvg(fraction_train=1.0, fraction_evaluate=0.0), mechanism, **kwargs)


def reply(message, step=0.25, metrics=None):
  current = message.content["arrays"].to_numpy_ndarrays()[0]
  content = RecordDict({"arrays": ArrayRecord([current + np.float32(step)]),
                        "metrics": MetricRecord(metrics or {"num-examples": 1})})
  return Message(content=content, reply_to=message)


def rounds(w, count, model=None, first=1, **reply_args):
  """``count`` rounds of ``w`` from round ``first`` (Flower's numbering restarts at 1)."""
  arrays = ArrayRecord([np.zeros(5, np.float32) if model is None else model])
  for r in range(first, first + count):
    messages = list(w.configure_train(r, arrays, ConfigRecord(), Grid()))
    arrays, _ = w.aggregate_train(r, [reply(m, **reply_args) for m in messages])
  return arrays.to_numpy_ndarrays()[0]


def test_a_restart_continues_and_a_state_of_another_mechanism_is_refused(tmp_path):
  path = str(tmp_path / "state.npz")
  w = wrapper("gaussian", state_path=path)
  model = rounds(w, 2)
  w.close()
  again = wrapper("gaussian", state_path=path)
  rounds(again, 1, model)
  assert again.rounds_done == 3
  again.close()
  other = wrapper("opt_prefix_sum", state_path=path)
  with pytest.raises(checks.CheckError, match=r"belongs to another run: its encoder_sha256") as e:
    rounds(other, 1, model)
  assert "\n" not in str(e.value)
  other.close()


@pytest.mark.parametrize("mode, words", [(0o666, "writable"), (0o644, "readable by group"),
                                         (0o620, "writable")])
def test_a_state_file_others_could_read_or_write_is_refused(tmp_path, mode, words):
  path = str(tmp_path / "state.npz")
  w = wrapper(state_path=path)
  rounds(w, 1)
  w.close()
  os.chmod(path, mode)
  with pytest.raises(checks.CheckError, match=words):
    wrapper(state_path=path)


def test_a_pinned_sampling_seed_is_not_overwritten_by_the_files(tmp_path):
  path = str(tmp_path / "state.npz")
  w = wrapper(state_path=path)
  model = rounds(w, 1)
  w.close()
  other = wrapper(state_path=path, sampling_seed=9)
  with pytest.raises(checks.CheckError, match="sampling_seed is pinned"):
    rounds(other, 1, model)
  other.close()
  free = wrapper(state_path=path, sampling_seed=None, sampling_secret=None)
  rounds(free, 1, model)
  assert free.seed_sources["sampling_seed"] == "pinned"  # the file's: the run was pinned
  free.close()


def test_an_older_copy_of_the_state_is_refused(tmp_path):
  path = str(tmp_path / "state.npz")
  w = wrapper(state_path=path)
  model = rounds(w, 1)
  shutil.copy2(path, tmp_path / "backup.npz")
  rounds(w, 1, model, first=2)
  w.close()
  shutil.copy2(tmp_path / "backup.npz", path)
  again = wrapper(state_path=path)
  with pytest.raises(checks.CheckError, match=r"at round 1 but .* shows round 2 released: it is "
                     "an older copy"):
    rounds(again, 1, model)
  again.close()


def test_one_server_per_state_file(tmp_path):
  path = str(tmp_path / "state.npz")
  w = wrapper(state_path=path)
  with pytest.raises(checks.CheckError, match="in use by another run"):
    wrapper(state_path=path)
  w.close()
  wrapper(state_path=path).close()


def test_a_kill_between_the_state_and_its_log_resumes(tmp_path):
  path = str(tmp_path / "state.npz")
  w = wrapper(state_path=path)
  model = rounds(w, 2)
  w.close()
  log = path + plan_lib.RELEASES_SUFFIX
  lines = open(log, encoding="utf-8").read().splitlines(keepends=True)
  with open(log, "w", encoding="utf-8") as f:
    f.writelines(lines[:1])  # round 2's state written, its log line not yet
  again = wrapper(state_path=path)
  rounds(again, 1, model)
  again.close()
  assert [int(l.split('"round": ')[1].split(",")[0]) for l in open(log, encoding="utf-8")] == [1, 2, 3]
  with open(log, "w", encoding="utf-8") as f:
    f.writelines(lines[:0])
  cut = wrapper(state_path=path)
  with pytest.raises(checks.CheckError, match="the log was cut"):
    rounds(cut, 1, model)
  cut.close()


def test_a_log_without_its_state_or_a_state_without_binding_is_refused(tmp_path):
  path = str(tmp_path / "state.npz")
  w = wrapper(state_path=path)
  rounds(w, 1)
  w.close()
  data = dict(np.load(path))
  os.remove(path)
  lost = wrapper(state_path=path)
  with pytest.raises(checks.CheckError, match="state file .* is missing"):
    rounds(lost, 1)
  lost.close()
  del data["binding"]
  with open(path, "wb") as f:
    np.savez(f, **data)
  os.chmod(path, 0o600)
  old = wrapper(state_path=path)
  with pytest.raises(checks.CheckError, match="no run binding"):
    rounds(old, 1)
  old.close()


@pytest.mark.parametrize("relation, method, words", [
    (NeighboringRelation.REPLACE_ONE, SamplingMethod.WITHOUT_REPLACEMENT, "replace-one"),
    (NeighboringRelation.ADD_OR_REMOVE_ONE, SamplingMethod.POISSON, "not by\\s+Poisson"),
])
def test_a_privacy_config_the_record_does_not_account_is_refused(relation, method, words):
  config = PrivacyConfig(target_delta=1e-5, population_size=len(NODES),
                         neighboring_relation=relation, sampling_method=method)
  with pytest.raises(checks.CheckError, match=words):
    wrapper(privacy_config=config)


def test_poisson_is_accepted_only_where_the_wrapper_samples_by_poisson():
  config = PrivacyConfig(target_delta=1e-5, population_size=len(NODES),
                         neighboring_relation=NeighboringRelation.ADD_OR_REMOVE_ONE,
                         sampling_method=SamplingMethod.POISSON)
  with pytest.raises(checks.CheckError, match="not by\\s+Poisson"):
    wrapper(privacy_config=config, participation=participation.min_sep(2))  # p = 1: cyclic
  w = wrapper(privacy_config=config, participation=participation.min_sep(2),
              sampling_prob=0.5)
  assert w.accountant is not None


def test_a_privacy_config_that_matches_is_accepted():
  config = PrivacyConfig(target_delta=1e-5, population_size=len(NODES),
                         neighboring_relation=NeighboringRelation.ADD_OR_REMOVE_ONE,
                         sampling_method=SamplingMethod.NO_AMPLIFICATION)
  w = wrapper(privacy_config=config)
  rounds(w, 1)
  assert w.accountant.num_releases == 1


def test_client_side_clipping_under_adaptive_clipping_is_refused():
  w = wrapper(cls=strategy_lib.MatrixFactorizationAdaptiveClipping, clip_norm="adaptive")
  messages = list(w.configure_train(1, ArrayRecord([np.zeros(5, np.float32)]), ConfigRecord(),
                                    Grid()))
  assert all(KEY_CLIPPING_NORM not in m.content["config"] for m in messages)
  failed = [Message(Error(code=0, reason=f"fixedclipping_mod requires the key "
                                         f"'{KEY_CLIPPING_NORM}'"), reply_to=m)
            for m in messages]
  with pytest.raises(checks.CheckError, match="quantile estimate needs the raw update norms"):
    w.aggregate_train(1, failed)


def test_the_adaptive_mods_norm_bit_is_refused():
  w = wrapper()
  messages = list(w.configure_train(1, ArrayRecord([np.zeros(5, np.float32)]), ConfigRecord(),
                                    Grid()))
  with pytest.raises(checks.CheckError, match="norm bit"):
    w.aggregate_train(1, [reply(m, metrics={"num-examples": 1, KEY_NORM_BIT: 1})
                          for m in messages])


def test_a_budget_stop_keeps_the_last_released_model():
  config = PrivacyConfig(target_delta=1e-5, population_size=len(NODES),
                         neighboring_relation=NeighboringRelation.ADD_OR_REMOVE_ONE,
                         sampling_method=SamplingMethod.NO_AMPLIFICATION)
  probe = wrapper()
  eps = probe.plan.epsilons
  w = wrapper(privacy_config=PrivacyConfig(**{**config.__dict__,
                                              "max_epsilon": (eps[1] + eps[2]) / 2}))
  arrays = ArrayRecord([np.zeros(5, np.float32)])
  for r in (1, 2):
    messages = list(w.configure_train(r, arrays, ConfigRecord(), Grid()))
    arrays, _ = w.aggregate_train(r, [reply(m) for m in messages])
  with pytest.raises(PrivacyBudgetExhausted):
    w.configure_train(3, arrays, ConfigRecord(), Grid())
  assert np.array_equal(w.current_arrays.to_numpy_ndarrays()[0], arrays.to_numpy_ndarrays()[0])


def test_more_rounds_than_the_mechanism_has_are_refused_before_round_1(tmp_path):
  w = wrapper(state_path=str(tmp_path / "state.npz"))
  with pytest.raises(checks.CheckError, match=f"num_rounds={N + 1} is more than the {N} rounds"):
    w.start(Grid(), ArrayRecord([np.zeros(5, np.float32)]), num_rounds=N + 1)
  assert w.rounds_done == 0 and not os.path.exists(tmp_path / "state.npz")
  wrapper(state_path=str(tmp_path / "state.npz")).close()  # the lock was released


class FewNodes(Grid):
  def get_node_ids(self):
    return NODES[:3]


def test_waiting_for_nodes_times_out_and_too_few_nodes_are_named_in_flowers_words():
  w = wrapper(node_wait_timeout=1)
  with pytest.raises(checks.CheckError, match=r"only 3 of the population's 8 nodes connected in "
                     r"1 s \(node_wait_timeout\); start more SuperNodes"):
    w.configure_train(1, ArrayRecord([np.zeros(5, np.float32)]), ConfigRecord(), FewNodes())
  few = wrapper(population=3)
  with pytest.raises(checks.CheckError, match="the population of 3 connected nodes is too few "
                     ".* start more SuperNodes") as e:
    few.configure_train(1, ArrayRecord([np.zeros(5, np.float32)]), ConfigRecord(), FewNodes())
  assert "\n" not in str(e.value) and "--" not in str(e.value).split("(")[0]
