"""Dataset ids chosen by the user (issue 13, point 7): ``register_dataset(..., dataset_id="imagenet-train-v3")``
binds the name to the pipeline for the dispatcher's lifetime, ``from_dataset_id`` reads by it, and the binding
is part of the dispatcher's state: journaled, checkpointed, replayed by a fault-tolerant restart, shown by
``GetStatus`` and ``dataservice status``. Numeric ids work as before."""

from __future__ import annotations

import io
import re

import grpc
import pytest

from dataservice import Dataset, errors, from_dataset_id, register_dataset
from dataservice import cli
from dataservice.dispatcher import request_checks as rc
from dataservice.dispatcher.core import DispatcherCore
from dataservice.dispatcher.journaled_store import JournaledStore
from dataservice.dispatcher.state import DispatcherState, StateUpdateError
from dataservice.proto import dispatcher_pb2 as pb
from dataservice.proto import dispatcher_pb2_grpc, state_pb2
from dataservice.service.config import DispatcherConfig
from dataservice.service.dispatcher_client import DispatcherClient
from dataservice.service.rpc import make_channel
from tests.cluster import TestCluster, run_with_deadline
from tests.journals import comparable

pytestmark = pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning")

READ_DEADLINE_S = 30


def pipeline(n: int = 10) -> Dataset:
    """Built anew on each call: the same pipeline, a new object (what a second run of a script registers)."""
    return Dataset.range(n).map(lambda x: x * 3)


def read(dataset: Dataset) -> list[int]:
    return sorted(run_with_deadline(lambda: [int(x) for x in dataset], READ_DEADLINE_S))


def names_in_state(cluster: TestCluster) -> dict[str, int]:
    core = cluster.dispatcher.core
    with core._cond:  # the core's lock: a consistent state
        return dict(core.state.datasets_by_name)


def numeric_id(cluster: TestCluster, name: str) -> int:
    client = DispatcherClient(cluster.dispatcher_address, timeout_ms=10_000)
    try:
        return client.get_dataset_id(name)
    finally:
        client.close()


# --- registering and reading by a chosen id --------------------------------------------------------------

def test_a_chosen_id_registers_and_reads_in_both_modes(cluster):
    assert register_dataset(cluster.target, pipeline(), dataset_id="imagenet-train-v3") == "imagenet-train-v3"
    expected = [3 * x for x in range(10)]
    # Two workers: parallel_epochs gives every element from each, distributed_epoch every element once.
    assert read(from_dataset_id("parallel_epochs", cluster.target, "imagenet-train-v3")) == sorted(expected * 2)
    assert read(from_dataset_id("distributed_epoch", cluster.target, "imagenet-train-v3")) == expected
    # A shared job under a chosen dataset id: two readers of one job share one pass.
    readers = [from_dataset_id("distributed_epoch", cluster.target, "imagenet-train-v3", job_name="shared")
               for _ in range(2)]
    assert sorted(read(readers[0]) + read(readers[1])) == expected
    # The name is an alias of a numeric id, which every other RPC takes and which still works.
    dataset_id = numeric_id(cluster, "imagenet-train-v3")
    assert names_in_state(cluster) == {"imagenet-train-v3": dataset_id}
    assert read(from_dataset_id("distributed_epoch", cluster.target, dataset_id)) == expected


def test_registering_the_same_pipeline_again_is_idempotent(cluster):
    assert register_dataset(cluster.target, pipeline(), dataset_id="train") == "train"
    dataset_id = numeric_id(cluster, "train")
    assert register_dataset(cluster.target, pipeline(), dataset_id="train") == "train"
    assert numeric_id(cluster, "train") == dataset_id
    # Without a name the same pipeline is the same (numeric) dataset, as before.
    assert register_dataset(cluster.target, pipeline()) == dataset_id
    # The same pipeline under a second name: one dataset with two names, not a copy of the pipeline.
    assert register_dataset(cluster.target, pipeline(), dataset_id="train.alias") == "train.alias"
    assert names_in_state(cluster) == {"train": dataset_id, "train.alias": dataset_id}
    core = cluster.dispatcher.core
    with core._cond:
        assert len(core.state.datasets) == 1 and core.state.datasets[dataset_id].names == ["train", "train.alias"]
    assert read(from_dataset_id("distributed_epoch", cluster.target, "train.alias")) == [3 * x for x in range(10)]


def test_a_pipeline_registered_without_a_name_can_be_named_later(cluster):
    dataset_id = register_dataset(cluster.target, Dataset.range(4))
    assert isinstance(dataset_id, int)
    assert register_dataset(cluster.target, Dataset.range(4), dataset_id="range-4") == "range-4"
    assert numeric_id(cluster, "range-4") == dataset_id
    assert read(from_dataset_id("distributed_epoch", cluster.target, "range-4")) == [0, 1, 2, 3]


def test_another_pipeline_under_a_taken_id_is_already_exists(cluster):
    register_dataset(cluster.target, pipeline(), dataset_id="imagenet-train-v3")
    with pytest.raises(errors.AlreadyExistsError) as info:
        register_dataset(cluster.target, pipeline(11), dataset_id="imagenet-train-v3")
    message = str(info.value)
    assert "dataset id 'imagenet-train-v3' is already registered, with another pipeline" in message, message
    assert "register a changed pipeline under a new dataset_id" in message, message
    # Also when the other pipeline is registered already (under another name, or none).
    register_dataset(cluster.target, pipeline(12), dataset_id="other")
    with pytest.raises(errors.AlreadyExistsError, match="'other' is already registered"):
        register_dataset(cluster.target, pipeline(), dataset_id="other")
    # The refusals changed nothing.
    assert read(from_dataset_id("distributed_epoch", cluster.target, "imagenet-train-v3")) == [3 * x for x in range(10)]
    assert set(names_in_state(cluster)) == {"imagenet-train-v3", "other"}


def test_an_unknown_id_is_not_found_naming_it(cluster):
    dataset = from_dataset_id("parallel_epochs", cluster.target, "no-such-dataset", timeout_ms=10_000)
    with pytest.raises(errors.NotFoundError) as info:
        read(dataset)
    message = str(info.value)
    assert "dataset id 'no-such-dataset' is not registered" in message, message
    assert "register_dataset(service, dataset, dataset_id='no-such-dataset')" in message, message
    # ... and once registered, the same reader reads it.
    register_dataset(cluster.target, Dataset.range(3), dataset_id="no-such-dataset")
    assert read(dataset) == [0, 0, 1, 1, 2, 2]


# --- bad ids -----------------------------------------------------------------------------------------------

BAD_IDS = [
    ("", "dataset_id '' is empty"),
    ("x" * 257, "has 257 characters, more than 256"),
    ("-v3", "starts with '-'"),
    (".hidden", "starts with '.'"),
    ("my data", "holds the character ' '"),
    ("imagenet/train", "holds the character '/'"),
    ("train\n", "holds the character '\\n'"),
    ("daten-ü", "holds the character 'ü'"),
]


@pytest.mark.parametrize("bad, expected", BAD_IDS, ids=[repr(b[:12]) for b, _ in BAD_IDS])
@pytest.mark.parametrize("call", ["register_dataset", "from_dataset_id"])
def test_a_bad_id_is_a_value_error_naming_it_and_the_rule(call, bad, expected):
    # No dispatcher listens at this address: the id is checked before anything is sent.
    with pytest.raises(ValueError) as info:
        if call == "register_dataset":
            register_dataset("grpc://localhost:1", Dataset.range(3), dataset_id=bad)
        else:
            from_dataset_id("parallel_epochs", "grpc://localhost:1", bad)
    message = str(info.value)
    assert expected in message and rc.DATASET_NAME_RULE in message, message
    assert len(message) < 400, message  # a long id is cut short in the message


@pytest.mark.parametrize("bad", [7, 7.0, b"train", ["train"]])
def test_register_dataset_takes_only_a_str_id(bad):
    with pytest.raises(ValueError, match=re.escape(f"dataset_id must be a str (or None: the dispatcher picks a "
                                                   f"numeric id), got {bad!r}")):
        register_dataset("grpc://localhost:1", Dataset.range(3), dataset_id=bad)


@pytest.mark.parametrize("bad", [0, -3, None, True, 2.0, b"x"])
def test_from_dataset_id_refuses_what_is_neither_a_positive_int_nor_a_str(bad):
    with pytest.raises(ValueError, match="dataset_id must be a positive int returned by register_dataset, or a str"):
        from_dataset_id("parallel_epochs", "grpc://localhost:1", bad)


@pytest.mark.parametrize("method, request_, expected", [
    ("RegisterDataset", pb.RegisterDatasetRequest(dataset_def=b"p", num_splits=1, dataset_name="n" * 300),
     f"RegisterDataset: dataset_name {'n' * 60!r}... has 300 characters, more than 256"),
    ("RegisterDataset", pb.RegisterDatasetRequest(dataset_def=b"p", num_splits=1, dataset_name="a b"),
     "RegisterDataset: dataset_name 'a b' holds the character ' '"),
    ("GetDatasetId", pb.GetDatasetIdRequest(dataset_name=""), "GetDatasetId: dataset_name '' is empty"),
    ("GetDatasetId", pb.GetDatasetIdRequest(dataset_name="x" * 10_000_000), "has 10,000,000 characters, more than 256"),
    ("GetDatasetId", pb.GetDatasetIdRequest(dataset_name="42"), "'42' is all digits"),
])
def test_the_dispatcher_refuses_a_bad_name_as_invalid_argument(cluster, method, request_, expected):
    """What a client other than ours might send: refused before it reaches the core, naming field and bound."""
    channel = make_channel(cluster.dispatcher_address)
    try:
        stub = dispatcher_pb2_grpc.DispatcherStub(channel)
        with pytest.raises(grpc.RpcError) as info:
            run_with_deadline(lambda: getattr(stub, method)(request_, timeout=10), 15)
    finally:
        channel.close()
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, info.value
    details = info.value.details()
    assert expected in details and rc.DATASET_NAME_RULE in details, details
    assert names_in_state(cluster) == {}


# --- restarts, journal and checkpoints ------------------------------------------------------------------------

def test_a_fault_tolerant_restart_keeps_the_names(tmp_path):
    with TestCluster(num_workers=1, fault_tolerant_mode=True, work_dir=str(tmp_path)) as cluster:
        register_dataset(cluster.target, pipeline(), dataset_id="imagenet-train-v3")
        anonymous = register_dataset(cluster.target, Dataset.range(5))
        register_dataset(cluster.target, Dataset.range(5), dataset_id="five")  # names the existing dataset
        before = {name: numeric_id(cluster, name) for name in ("imagenet-train-v3", "five")}
        assert before["five"] == anonymous
        reader = from_dataset_id("distributed_epoch", cluster.target, "imagenet-train-v3")

        cluster.restart_dispatcher()
        assert names_in_state(cluster) == before
        assert read(reader) == [3 * x for x in range(10)]  # made before the restart, read after it
        assert read(from_dataset_id("parallel_epochs", cluster.target, "five")) == [0, 1, 2, 3, 4]
        assert register_dataset(cluster.target, pipeline(), dataset_id="imagenet-train-v3") == "imagenet-train-v3"
        assert numeric_id(cluster, "imagenet-train-v3") == before["imagenet-train-v3"]
        with pytest.raises(errors.AlreadyExistsError, match="'imagenet-train-v3' is already registered"):
            register_dataset(cluster.target, pipeline(11), dataset_id="imagenet-train-v3")
        with pytest.raises(errors.NotFoundError, match="'unknown' is not registered"):
            read(from_dataset_id("parallel_epochs", cluster.target, "unknown", timeout_ms=10_000))


def test_a_reader_by_name_follows_a_registration_made_again_after_a_plain_restart():
    """Without fault tolerance a restart forgets the name; registered again, it names a new numeric id,
    and a reader holding only the name reads that one (it resolves the name on every read)."""
    with TestCluster(num_workers=1) as cluster:
        register_dataset(cluster.target, Dataset.range(4), dataset_id="ephemeral")
        old_id = numeric_id(cluster, "ephemeral")
        reader = from_dataset_id("distributed_epoch", cluster.target, "ephemeral", timeout_ms=10_000)
        assert read(reader) == [0, 1, 2, 3]
        cluster.restart_dispatcher()
        with pytest.raises(errors.NotFoundError, match="without fault_tolerant_mode, so a restart forgets"):
            read(reader)
        register_dataset(cluster.target, Dataset.range(4), dataset_id="ephemeral")
        assert numeric_id(cluster, "ephemeral") != old_id
        assert read(reader) == [0, 1, 2, 3]


def test_names_survive_checkpoints_and_journal_replay(tmp_path):
    """Through a real JournaledStore whose checkpoints come every few records: a restart replays a
    checkpoint (to_updates) and the journal after it, and the names are all there."""
    store = JournaledStore(str(tmp_path), checkpoint_records=3)
    store.open()
    core = DispatcherCore(DispatcherConfig(), store=store)

    def register(blob: bytes, name: str = "") -> int:
        return core.register_dataset(pb.RegisterDatasetRequest(dataset_def=blob, num_splits=4,
                                                               dataset_name=name)).dataset_id

    ids = {}
    for i in range(10):
        ids[f"set-{i}"] = register(b"pipeline %d" % i, f"set-{i}")
    assert register(b"pipeline 3", "set-3.alias") == ids["set-3"]  # a second name: NameDatasetUpdate
    unnamed = register(b"unnamed")
    assert register(b"unnamed", "named-later") == unnamed
    store.wait_durable()
    expected = comparable(core.state)
    store.close()

    restarted = JournaledStore(str(tmp_path), checkpoint_records=3)
    restarted.open()
    try:
        assert comparable(restarted.state) == expected
        assert restarted.state.datasets_by_name == {**ids, "set-3.alias": ids["set-3"], "named-later": unnamed}
        assert restarted.state.datasets[ids["set-3"]].names == ["set-3", "set-3.alias"]
        core = DispatcherCore(DispatcherConfig(), store=restarted)
        assert core.get_dataset_id(pb.GetDatasetIdRequest(dataset_name="named-later")).dataset_id == unnamed
        with pytest.raises(errors.AlreadyExistsError):
            register(b"pipeline 4", "set-3")
    finally:
        restarted.close()


def test_the_state_never_rebinds_a_name():
    """The core never commits such an update; replayed from a damaged journal, it is refused whole."""
    state = DispatcherState()
    state.apply(state_pb2.Update(register_dataset=state_pb2.RegisterDatasetUpdate(
        dataset_id=5, fingerprint="f5", dataset_def=b"a", num_splits=1, dataset_name="taken")))
    state.apply(state_pb2.Update(register_dataset=state_pb2.RegisterDatasetUpdate(
        dataset_id=6, fingerprint="f6", dataset_def=b"b", num_splits=1)))
    before = comparable(state)
    for update in (
            state_pb2.Update(register_dataset=state_pb2.RegisterDatasetUpdate(
                dataset_id=7, fingerprint="f7", dataset_def=b"c", num_splits=1, dataset_name="taken")),
            state_pb2.Update(name_dataset=state_pb2.NameDatasetUpdate(dataset_id=6, dataset_name="taken")),
            state_pb2.Update(name_dataset=state_pb2.NameDatasetUpdate(dataset_id=5, dataset_name="taken")),
            state_pb2.Update(name_dataset=state_pb2.NameDatasetUpdate(dataset_id=99, dataset_name="new")),
            state_pb2.Update(name_dataset=state_pb2.NameDatasetUpdate(dataset_id=6, dataset_name=""))):
        with pytest.raises(StateUpdateError):
            state.apply(update)
        assert comparable(state) == before
    # A checkpoint of several names per dataset rebuilds the same state, names in order.
    state.apply(state_pb2.Update(name_dataset=state_pb2.NameDatasetUpdate(dataset_id=6, dataset_name="b1")))
    state.apply(state_pb2.Update(name_dataset=state_pb2.NameDatasetUpdate(dataset_id=6, dataset_name="b2")))
    rebuilt = DispatcherState()
    for update in state.to_updates():
        rebuilt.apply(update)
    assert comparable(rebuilt) == comparable(state)
    assert rebuilt.datasets[6].names == ["b1", "b2"] and rebuilt.datasets_by_name == {"taken": 5, "b1": 6, "b2": 6}


# --- status --------------------------------------------------------------------------------------------------

def test_status_shows_the_names(cluster):
    register_dataset(cluster.target, pipeline(), dataset_id="imagenet-train-v3")
    register_dataset(cluster.target, pipeline(), dataset_id="imagenet-latest")
    anonymous = register_dataset(cluster.target, Dataset.range(2))
    client = DispatcherClient(cluster.dispatcher_address, timeout_ms=10_000)
    try:
        status = cli.status_as_dict(client.get_status(), cluster.target)
    finally:
        client.close()
    by_id = {d["dataset_id"]: d["dataset_names"] for d in status["datasets"]}
    assert by_id == {numeric_id(cluster, "imagenet-train-v3"): ["imagenet-train-v3", "imagenet-latest"],
                     anonymous: []}
    out = io.StringIO()
    cli.format_status(status, out)
    lines = out.getvalue().splitlines()
    assert "NAMES" in lines[lines.index("datasets: 2") + 1]
    assert any(line.startswith(f"{numeric_id(cluster, 'imagenet-train-v3')}  imagenet-train-v3,imagenet-latest ")
               for line in lines), out.getvalue()
    assert any(line.startswith(f"{anonymous}  -") for line in lines), out.getvalue()
