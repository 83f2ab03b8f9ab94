"""The bounds every RPC's request must meet before the dispatcher's core (or a worker) sees it.

The gRPC adapters call ``check_request`` (dispatcher) and ``check_get_elements`` (worker) on
every parsed request. A field out of bounds raises ``errors.InvalidRequestError`` (gRPC
INVALID_ARGUMENT) naming the RPC, the field, its value or size, and the bound: absurd values
never reach the state, the journal or a worker's task. The bounds sit far beyond anything our
own clients and workers send (an 800,000-range heartbeat of 4.8 MB passes).

Worker addresses are not checked here: the core's ``worker_heartbeat`` checks them first
thing (``core.MAX_WORKER_ADDRESS_CHARS``, host:port).

Example::

    >>> check_request("GetOrCreateJob", dispatcher_pb2.GetOrCreateJobRequest(
    ...     dataset_id=7, processing_mode=state_pb2.PARALLEL_EPOCHS, job_name="x" * 300), DispatcherConfig())
    Traceback (most recent call last):
    dataservice.errors.InvalidRequestError: GetOrCreateJob: job_name has 300 characters, more than 256
"""

from __future__ import annotations

import itertools
import re
from typing import Callable, Optional

import numpy as np

from dataservice import errors
from dataservice.proto import dispatcher_pb2, state_pb2, worker_pb2
from dataservice.service.config import MAX_DATASET_DEF_LIMIT_BYTES, DispatcherConfig
from dataservice.service.processing_modes import MODE_NAMES

__all__ = ["check_request", "check_get_elements", "MAX_JOB_NAME_CHARS", "MAX_WORKER_UID_CHARS", "MAX_KEY_BYTES",
           "MAX_TASK_IDS", "MAX_PROGRESS_SPLITS", "MAX_PROGRESS_RANGES", "MAX_REPETITION", "MAX_WAIT_MS",
           "MAX_DATASET_NAME_CHARS", "DATASET_NAME_RULE", "dataset_name_problem", "shown_name"]

#: GetOrCreateJob.resume.seeks[].state: a group iterator's state as a worker recorded it (task_runner.MAX_MARK_BYTES,
#: with room for another version's larger states).
MAX_SEEK_STATE_BYTES = 64 * 1024
#: GetOrCreateJob.job_name: a name people choose and read in ``dataservice status``.
MAX_JOB_NAME_CHARS = 256
#: RegisterDataset.dataset_name and GetDatasetId.dataset_name: a dataset id people choose
#: (``register_dataset(..., dataset_id="imagenet-train-v3")``), bounded like a job name.
MAX_DATASET_NAME_CHARS = 256
#: What a chosen dataset id may hold, said in every refusal. A restricted set, unlike job names:
#: ids travel through command lines, environment variables and file names unquoted. All digits is
#: how the dispatcher's numeric ids are written (``from_dataset_id(..., "42")`` reads dataset 42).
DATASET_NAME_RULE = (f"1 to {MAX_DATASET_NAME_CHARS} characters among ASCII letters, digits, '.', '_' and '-', "
                     f"starting with a letter or digit, and not all digits")
_DATASET_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_DATASET_NAME_CHAR = re.compile(r"[A-Za-z0-9._-]")
#: WorkerHeartbeat.worker_uid: a worker sends a uuid4 in hex (32 characters).
MAX_WORKER_UID_CHARS = 64
#: read_key and request_token: keys are 32 bytes (core.READ_KEY_BYTES), tokens 16.
MAX_KEY_BYTES = 64
#: current_tasks, finished_tasks (WorkerHeartbeat) and stopped_tasks (ClientHeartbeat).
MAX_TASK_IDS = 100_000
#: ClientHeartbeat: progress entries (one per split), and [start, end) ranges over all of them.
#: A reader holding 800,000 scattered ranges sends a 4.8 MB heartbeat, which must pass.
MAX_PROGRESS_SPLITS = 1_000_000
MAX_PROGRESS_RANGES = 2_000_000
#: GetOrCreateIteration.repetition: a reader counts its epochs from 0.
MAX_REPETITION = 2 ** 31 - 1
#: WorkerHeartbeat.wait_ms and GetElements.wait_ms: the servers wait far less (the dispatcher at
#: most worker_timeout_ms / 2, a worker 5 s); more than an hour is no plausible request.
MAX_WAIT_MS = 3_600_000

#: GetOrCreateJob.num_consumers, and the consumer_index of GetOrCreateIteration and GetElements: coordinated
#: reads by this many trainers at most (a worker keeps a slot per consumer in each round).
MAX_CONSUMERS = 100_000
#: GetElements.trainer_id: a name people choose (CrossTrainerCache), kept by a worker per trainer.
MAX_TRAINER_ID_CHARS = 256
#: GetElements.compression: "", "AUTO" or a codec name (a worker names the codecs it knows in its refusal).
MAX_COMPRESSION_CHARS = 16
#: GetElements.receive_bytes_per_s and decompress_bytes_per_s: 10 TB/s, far past any link or core.
MAX_REPORTED_RATE = 10 ** 13
#: GetOrCreateJob.target_workers: "" (AUTO) or one of read_options.TARGET_WORKERS, any case.
_TARGET_WORKERS = ("AUTO", "ANY", "LOCAL")

_NOT_SPLITTABLE = -2
_MODES = {mode: state_pb2.ProcessingMode.Name(mode) for mode in MODE_NAMES}  # static sharding's too


def dataset_name_problem(name: str) -> Optional[str]:
    """What is wrong with ``name`` as a chosen dataset id (see DATASET_NAME_RULE), or None if nothing.

    Example::

        >>> dataset_name_problem("imagenet-train-v3") is None
        True
        >>> dataset_name_problem("my data")
        "holds the character ' '"
    """
    if not name:
        return "is empty"
    if len(name) > MAX_DATASET_NAME_CHARS:
        # Checked first: a 10 MB name is refused without a scan.
        return f"has {len(name):,} characters, more than {MAX_DATASET_NAME_CHARS}"
    if _DATASET_NAME.fullmatch(name):
        return "is all digits, the form of the dispatcher's numeric ids" if name.isdigit() else None
    if not _DATASET_NAME_CHAR.fullmatch(name[0]) or name[0] in "._-":
        return f"starts with {name[0]!r}"
    bad = next(c for c in name if not _DATASET_NAME_CHAR.fullmatch(c))
    return f"holds the character {bad!r}"


def shown_name(name: str) -> str:
    """``name`` quoted for an error message, cut short when long (a refused name may be megabytes)."""
    return repr(name) if len(name) <= 80 else f"{name[:60]!r}..."


def check_request(method: str, request, config: DispatcherConfig) -> None:
    """Raises InvalidRequestError if a field of ``request`` (of dispatcher RPC ``method``) is out of bounds."""
    check = _CHECKS.get(method)
    if check is not None:
        check(request, config)


def check_get_elements(request: worker_pb2.GetElementsRequest) -> None:
    """A worker's GetElements (gRPC port); raises InvalidRequestError naming the field out of bounds."""
    rpc = "GetElements"
    _positive_id(rpc, "task_id", request.task_id)
    _at_least(rpc, "client_id", request.client_id, 0)
    _at_least(rpc, "max_elements", request.max_elements, 1)
    _at_least(rpc, "max_bytes", request.max_bytes, 0)
    _in_range(rpc, "wait_ms", request.wait_ms, 0, MAX_WAIT_MS)
    _max_bytes(rpc, "read_key", request.read_key, MAX_KEY_BYTES)
    # Issue 18's read options: their meaning the worker checks (responses.prepare); here their size.
    _in_range(rpc, "consumer_index", request.consumer_index, 0, MAX_CONSUMERS - 1)
    _at_least(rpc, "round_index", request.round_index, 0)
    _max_chars(rpc, "trainer_id", request.trainer_id, MAX_TRAINER_ID_CHARS)
    _max_chars(rpc, "compression", request.compression, MAX_COMPRESSION_CHARS)
    _in_range(rpc, "receive_bytes_per_s", request.receive_bytes_per_s, 0, MAX_REPORTED_RATE, "(bytes/s)")
    _in_range(rpc, "decompress_bytes_per_s", request.decompress_bytes_per_s, 0, MAX_REPORTED_RATE, "(bytes/s)")


# --- one check per dispatcher RPC --------------------------------------------------------------
def _register_dataset(req: dispatcher_pb2.RegisterDatasetRequest, config: DispatcherConfig) -> None:
    rpc = "RegisterDataset"
    size = len(req.dataset_def)
    if not size:
        raise errors.InvalidRequestError(f"{rpc}: dataset_def is empty: it must hold a serialized pipeline")
    if size > config.max_dataset_def_bytes:
        raise errors.InvalidRequestError(
            f"{rpc}: dataset_def is {size:,} bytes, more than this dispatcher accepts ({config.max_dataset_def_bytes:,}"
            f" bytes: DispatcherConfig.max_dataset_def_bytes, `dataservice dispatcher --max-dataset-def-bytes`, at "
            f"most {MAX_DATASET_DEF_LIMIT_BYTES:,}). A pipeline this large usually captures a big array or object: "
            f"read it from a file inside the pipeline instead, or raise the limit")
    _at_least(rpc, "num_splits", req.num_splits, _NOT_SPLITTABLE, "(-1: infinite, -2: not splittable)")
    if req.dataset_name:  # "": registered without a chosen id
        _dataset_name(rpc, req.dataset_name)


def _get_dataset_def(req: dispatcher_pb2.GetDatasetDefRequest, config: DispatcherConfig) -> None:
    _positive_id("GetDatasetDef", "dataset_id", req.dataset_id)


def _get_dataset_id(req: dispatcher_pb2.GetDatasetIdRequest, config: DispatcherConfig) -> None:
    _dataset_name("GetDatasetId", req.dataset_name)


def _get_or_create_job(req: dispatcher_pb2.GetOrCreateJobRequest, config: DispatcherConfig) -> None:
    rpc = "GetOrCreateJob"
    _positive_id(rpc, "dataset_id", req.dataset_id)
    if req.processing_mode not in _MODES:
        raise errors.InvalidRequestError(
            f"{rpc}: processing_mode is {req.processing_mode}, not a known mode "
            f"({', '.join(f'{v} = {n}' for v, n in sorted(_MODES.items()))})")
    name = req.job_name
    if len(name) > MAX_JOB_NAME_CHARS:
        raise errors.InvalidRequestError(f"{rpc}: job_name has {len(name):,} characters, more than "
                                         f"{MAX_JOB_NAME_CHARS}")
    if not name.isprintable():
        bad = next(c for c in name if not c.isprintable())
        raise errors.InvalidRequestError(f"{rpc}: job_name {name!r} holds the unprintable character {bad!r}: "
                                         f"use a name people can read in `dataservice status`")
    _in_range(rpc, "num_consumers", req.num_consumers, 0, MAX_CONSUMERS, "(0: no coordinated reads)")
    _in_range(rpc, "num_readers", req.num_readers, 0, MAX_CONSUMERS, "(0: no elastic readers)")
    if req.target_workers and (len(req.target_workers) > MAX_COMPRESSION_CHARS or
                               req.target_workers.upper() not in _TARGET_WORKERS):
        raise errors.InvalidRequestError(f"{rpc}: target_workers {shown_name(req.target_workers)} is not one of "
                                         f"{', '.join(repr(t) for t in _TARGET_WORKERS)} ('': AUTO)")
    if req.dataset_name:  # "": the reader named the numeric id
        _dataset_name(rpc, req.dataset_name)
    if req.HasField("resume"):
        _check_resume_point(rpc, req.resume)


def _check_resume_point(rpc: str, resume: state_pb2.ResumePoint) -> None:
    """A restored read's start: done groups as sorted, disjoint [start, end) ranges; taken offsets of
    groups of stream 0 (as delivered offsets are checked)."""
    flat = list(resume.done_groups)
    if len(flat) % 2:
        raise errors.InvalidRequestError(f"{rpc}: resume.done_groups has {len(flat):,} numbers, an odd count: it "
                                         f"must hold [start, end) pairs")
    if len(flat) // 2 > MAX_PROGRESS_RANGES:
        raise errors.InvalidRequestError(f"{rpc}: resume.done_groups holds more than {MAX_PROGRESS_RANGES:,} ranges")
    previous = 0
    for j in range(0, len(flat), 2):
        if not previous <= flat[j] < flat[j + 1]:
            raise errors.InvalidRequestError(
                f"{rpc}: resume.done_groups[{j}:{j + 2}] is [{flat[j]}, {flat[j + 1]}): ranges must be sorted, "
                f"disjoint, with 0 <= start < end")
        previous = flat[j + 1]
    _check_progress(f"{rpc} (resume.partial)", resume.partial)
    if len(resume.seeks) > MAX_PROGRESS_SPLITS:
        raise errors.InvalidRequestError(f"{rpc}: resume.seeks has {len(resume.seeks):,} entries, more than "
                                         f"{MAX_PROGRESS_SPLITS:,}")
    for i, seek in enumerate(resume.seeks):
        _at_least(rpc, f"resume.seeks[{i}].group", seek.group, 0)
        _at_least(rpc, f"resume.seeks[{i}].offset", seek.offset, 1)
        _max_bytes(rpc, f"resume.seeks[{i}].state", seek.state, MAX_SEEK_STATE_BYTES)
    for i, p in enumerate(resume.partial):
        if p.stream_id:
            raise errors.InvalidRequestError(f"{rpc}: resume.partial[{i}].stream_id is {p.stream_id}: a "
                                             f"distributed_epoch read has one stream, 0")


def check_resumable_job(req: dispatcher_pb2.GetOrCreateJobRequest,
                        resume: Optional[state_pb2.ResumePoint]) -> None:
    """What a deterministic or restored job must be: a distributed_epoch read, not coordinated and not
    through a cross-trainer cache (those hand each element to whichever reader asks first). The client
    says so before asking; this is for other clients.

    Example::

        >>> check_resumable_job(dispatcher_pb2.GetOrCreateJobRequest(
        ...     dataset_id=7, processing_mode=state_pb2.PARALLEL_EPOCHS, deterministic=True), None)
        Traceback (most recent call last):
        dataservice.errors.InvalidRequestError: GetOrCreateJob: deterministic=True needs distributed_epoch...
    """
    if req.num_readers and not (req.deterministic and req.job_name):
        raise errors.InvalidRequestError("GetOrCreateJob: num_readers (elastic readers) needs deterministic=True and "
                                         "a job_name: the readers share one job's deterministic sequence")
    what = "deterministic=True" if req.deterministic else "a restored read (resume)" if resume is not None else None
    if what is None:
        return
    if req.processing_mode != state_pb2.DISTRIBUTED_EPOCH:
        raise errors.InvalidRequestError(
            f"GetOrCreateJob: {what} needs distributed_epoch, and this job reads in "
            f"{MODE_NAMES.get(req.processing_mode, req.processing_mode)}: only a distributed_epoch read hands out "
            f"each element once, numbered by split group, which is what is ordered and resumed")
    if req.num_consumers or req.cross_trainer_cache:
        raise errors.InvalidRequestError(
            f"GetOrCreateJob: {what} does not go with "
            f"{'coordinated reads (num_consumers)' if req.num_consumers else 'cross_trainer_cache'}")


def _get_or_create_iteration(req: dispatcher_pb2.GetOrCreateIterationRequest, config: DispatcherConfig) -> None:
    rpc = "GetOrCreateIteration"
    _positive_id(rpc, "job_id", req.job_id)
    _in_range(rpc, "repetition", req.repetition, 0, MAX_REPETITION)
    _max_bytes(rpc, "request_token", req.request_token, MAX_KEY_BYTES)
    if req.HasField("consumer_index"):
        _in_range(rpc, "consumer_index", req.consumer_index, 0, MAX_CONSUMERS - 1)


def _client_heartbeat(req: dispatcher_pb2.ClientHeartbeatRequest, config: DispatcherConfig) -> None:
    rpc = "ClientHeartbeat"
    _positive_id(rpc, "client_id", req.client_id)
    _max_bytes(rpc, "read_key", req.read_key, MAX_KEY_BYTES)
    _task_ids(rpc, "stopped_tasks", req.stopped_tasks)
    _check_progress(rpc, req.progress)
    _at_least(rpc, "current_round", req.current_round, 0)
    _at_least(rpc, "acknowledged_block_round", req.acknowledged_block_round, 0, "(0: none)")
    if req.HasField("stats"):
        _at_least(rpc, "stats.elements", req.stats.elements, 0)
        _at_least(rpc, "stats.bytes", req.stats.bytes, 0)
        _micros(rpc, "stats.elapsed_us", req.stats.elapsed_us)
        _micros(rpc, "stats.stall_us", req.stats.stall_us)
        if req.stats.stall_us > req.stats.elapsed_us:
            raise errors.InvalidRequestError(f"{rpc}: stats.stall_us is {req.stats.stall_us:,}, more than "
                                             f"stats.elapsed_us ({req.stats.elapsed_us:,}): a consumer cannot wait "
                                             f"longer than it ran")


def _release_iteration_client(req: dispatcher_pb2.ReleaseIterationClientRequest, config: DispatcherConfig) -> None:
    rpc = "ReleaseIterationClient"
    _positive_id(rpc, "client_id", req.client_id)
    _max_bytes(rpc, "read_key", req.read_key, MAX_KEY_BYTES)


def _worker_heartbeat(req: dispatcher_pb2.WorkerHeartbeatRequest, config: DispatcherConfig) -> None:
    rpc = "WorkerHeartbeat"
    # worker_address and data_address: the core checks them (core._check_worker_address).
    if len(req.worker_uid) > MAX_WORKER_UID_CHARS:
        raise errors.InvalidRequestError(f"{rpc}: worker_uid has {len(req.worker_uid):,} characters, more than "
                                         f"{MAX_WORKER_UID_CHARS}")
    _task_ids(rpc, "current_tasks", req.current_tasks)
    _task_ids(rpc, "finished_tasks", req.finished_tasks)
    _task_deltas(rpc, req)
    _in_range(rpc, "wait_ms", req.wait_ms, 0, MAX_WAIT_MS)
    if len(req.current_saves) > MAX_TASK_IDS:
        raise errors.InvalidRequestError(f"{rpc}: current_saves has {len(req.current_saves):,} ids, more than "
                                         f"{MAX_TASK_IDS:,}")
    if req.HasField("load"):
        _micros(rpc, "load.interval_us", req.load.interval_us)
        _micros(rpc, "load.busy_us", req.load.busy_us)
        _micros(rpc, "load.blocked_us", req.load.blocked_us)
        _in_range(rpc, "load.running_tasks", req.load.running_tasks, 0, MAX_TASK_IDS)


def _task_deltas(rpc: str, req: dispatcher_pb2.WorkerHeartbeatRequest) -> None:
    """The task-delta fields (WorkerHeartbeatRequest.tasks_delta in dispatcher.proto): a delta carries no
    current_tasks and names the answered heartbeat it is relative to; a full list carries no added or
    removed tasks.

    >>> _task_deltas("WorkerHeartbeat", dispatcher_pb2.WorkerHeartbeatRequest(
    ...     tasks_delta=True, heartbeat_seq=3, base_seq=2, added_tasks=[7]))
    """
    _at_least(rpc, "heartbeat_seq", req.heartbeat_seq, 0, "(0: a worker that sends no deltas)")
    _at_least(rpc, "base_seq", req.base_seq, 0, "(0: no answered heartbeat yet)")
    _task_ids(rpc, "added_tasks", req.added_tasks)
    _task_ids(rpc, "removed_tasks", req.removed_tasks)
    if req.tasks_delta:
        if req.current_tasks:
            raise errors.InvalidRequestError(f"{rpc}: a delta (tasks_delta) carries no current_tasks, got "
                                             f"{len(req.current_tasks):,}")
        if not 1 <= req.base_seq < req.heartbeat_seq:
            raise errors.InvalidRequestError(f"{rpc}: a delta needs 1 <= base_seq < heartbeat_seq, got base_seq "
                                             f"{req.base_seq} and heartbeat_seq {req.heartbeat_seq}")
        both = set(req.added_tasks).intersection(req.removed_tasks)
        if both:
            raise errors.InvalidRequestError(f"{rpc}: task {min(both)} is both in added_tasks and removed_tasks")
    elif req.added_tasks or req.removed_tasks:
        raise errors.InvalidRequestError(f"{rpc}: added_tasks and removed_tasks come only with tasks_delta "
                                         f"(a full list is current_tasks)")
    elif req.base_seq and req.base_seq >= req.heartbeat_seq:
        raise errors.InvalidRequestError(f"{rpc}: base_seq {req.base_seq} is not below heartbeat_seq "
                                         f"{req.heartbeat_seq}")


def _get_split(req: dispatcher_pb2.GetSplitRequest, config: DispatcherConfig) -> None:
    rpc = "GetSplit"
    _positive_id(rpc, "iteration_id", req.iteration_id)
    _positive_id(rpc, "task_id", req.task_id)
    _at_least(rpc, "request_id", req.request_id, 0)


def _get_status(req: dispatcher_pb2.GetStatusRequest, config: DispatcherConfig) -> None:
    _at_least("GetStatus", "max_items", req.max_items, 0, "(0: the default)")


#: DistributedSave.path and GetSaveStatus.path: an absolute path (PATH_MAX on Linux).
MAX_SAVE_PATH_CHARS = 4096
#: DistributedSave.element_spec and ReportSaveChunk.element_spec: an encoded ElementSpecDef.
MAX_ELEMENT_SPEC_BYTES = 1 << 20
#: ReportSaveChunk.error: the reason a save failed, written to its ERROR file (workers cut it to 16 KiB).
MAX_SAVE_ERROR_CHARS = 64 * 1024
_SAVE_CODECS = ("", "LZ4", "GZIP", "ZLIB", "ZSTD")


def _save_path(rpc: str, path: str) -> None:
    if not path:
        raise errors.InvalidRequestError(f"{rpc}: path is empty")
    if len(path) > MAX_SAVE_PATH_CHARS:
        raise errors.InvalidRequestError(f"{rpc}: path has {len(path):,} characters, more than {MAX_SAVE_PATH_CHARS}")
    if "\0" in path or not path.startswith("/"):
        raise errors.InvalidRequestError(f"{rpc}: path {shown_name(path)} must be an absolute path without NUL "
                                         f"characters")


def _distributed_save(req: dispatcher_pb2.DistributedSaveRequest, config: DispatcherConfig) -> None:
    rpc = "DistributedSave"
    _positive_id(rpc, "dataset_id", req.dataset_id)
    _save_path(rpc, req.path)
    if req.compression not in _SAVE_CODECS:
        raise errors.InvalidRequestError(f"{rpc}: compression {shown_name(req.compression)} is not one of "
                                         f"{', '.join(repr(c) for c in _SAVE_CODECS)}")
    _max_bytes(rpc, "element_spec", req.element_spec, MAX_ELEMENT_SPEC_BYTES)
    _max_bytes(rpc, "request_token", req.request_token, MAX_KEY_BYTES)


def _save_worker(rpc: str, req) -> None:
    _positive_id(rpc, "save_id", req.save_id)
    if not req.worker_address or len(req.worker_address) > 260:
        raise errors.InvalidRequestError(f"{rpc}: worker_address has {len(req.worker_address)} characters: it "
                                         f"must have 1 to 260")


def _lease_save_group(req: dispatcher_pb2.LeaseSaveGroupRequest, config: DispatcherConfig) -> None:
    _save_worker("LeaseSaveGroup", req)


def _report_save_chunk(req: dispatcher_pb2.ReportSaveChunkRequest, config: DispatcherConfig) -> None:
    rpc = "ReportSaveChunk"
    _save_worker(rpc, req)
    _at_least(rpc, "group", req.group, 0)
    _positive_id(rpc, "attempt", req.attempt)
    _at_least(rpc, "num_elements", req.num_elements, 0)
    _at_least(rpc, "bytes", req.bytes, 0)
    _max_bytes(rpc, "element_spec", req.element_spec, MAX_ELEMENT_SPEC_BYTES)
    if len(req.error) > MAX_SAVE_ERROR_CHARS:
        raise errors.InvalidRequestError(f"{rpc}: error has {len(req.error):,} characters, more than "
                                         f"{MAX_SAVE_ERROR_CHARS:,}")


def _get_save_status(req: dispatcher_pb2.GetSaveStatusRequest, config: DispatcherConfig) -> None:
    _save_path("GetSaveStatus", req.path)


_CHECKS: dict[str, Callable] = {
    "DistributedSave": _distributed_save,
    "LeaseSaveGroup": _lease_save_group,
    "ReportSaveChunk": _report_save_chunk,
    "GetSaveStatus": _get_save_status,
    "RegisterDataset": _register_dataset,
    "GetDatasetDef": _get_dataset_def,
    "GetDatasetId": _get_dataset_id,
    "GetOrCreateJob": _get_or_create_job,
    "GetOrCreateIteration": _get_or_create_iteration,
    "ClientHeartbeat": _client_heartbeat,
    "ReleaseIterationClient": _release_iteration_client,
    "WorkerHeartbeat": _worker_heartbeat,
    "GetSplit": _get_split,
    "GetStatus": _get_status,
}


# --- fields -----------------------------------------------------------------------------------
def _check_progress(rpc: str, progress) -> None:
    """Delivered offsets: per split, flat [start, end) pairs with 0 <= start < end.

    Runs on every heartbeat over up to millions of integers, so in numpy: 800,000 ranges take
    about 40 ms, where a Python loop over them would take most of a second.
    """
    if len(progress) > MAX_PROGRESS_SPLITS:
        raise errors.InvalidRequestError(f"{rpc}: progress has {len(progress):,} entries, more than "
                                         f"{MAX_PROGRESS_SPLITS:,}")
    total_ranges = 0
    for i, p in enumerate(progress):
        where = f"progress[{i}]"
        _at_least(rpc, f"{where}.stream_id", p.stream_id, 0)
        _at_least(rpc, f"{where}.split_index", p.split_index, 0)
        _at_least(rpc, f"{where}.total", p.total, -1, "(-1: the split's end not seen yet)")
        count = len(p.ranges)
        if not count:
            continue
        if count % 2:
            raise errors.InvalidRequestError(
                f"{rpc}: {where}.ranges has {count:,} numbers, an odd count: it must hold [start, end) pairs")
        total_ranges += count // 2
        if total_ranges > MAX_PROGRESS_RANGES:
            raise errors.InvalidRequestError(
                f"{rpc}: progress holds more than {MAX_PROGRESS_RANGES:,} ranges (counted up to {where})")
        if count <= _SMALL_RANGES:  # a usual heartbeat's few ranges: a numpy array would cost more than it saves
            flat = list(p.ranges)
            starts, ends = flat[0::2], flat[1::2]
            j = next((j for j, (a, b) in enumerate(zip(starts, ends)) if a < 0 or a >= b), None)
        else:
            flat = np.array(p.ranges, dtype=np.int64)
            starts, ends = flat[0::2], flat[1::2]
            wrong = (starts < 0) | (starts >= ends)
            j = int(np.argmax(wrong)) if wrong.any() else None
        if j is not None:
            raise errors.InvalidRequestError(
                f"{rpc}: {where}.ranges[{2 * j}:{2 * j + 2}] is [{starts[j]}, {ends[j]}): a range must have "
                f"0 <= start < end")


#: Up to this many numbers (16 ranges), a progress entry's ranges are checked in Python.
_SMALL_RANGES = 32


def _dataset_name(rpc: str, name: str) -> None:
    problem = dataset_name_problem(name)
    if problem is not None:
        raise errors.InvalidRequestError(f"{rpc}: dataset_name {shown_name(name)} {problem}: a dataset id is "
                                         f"{DATASET_NAME_RULE}")


def _task_ids(rpc: str, field: str, ids) -> None:
    if len(ids) > MAX_TASK_IDS:
        raise errors.InvalidRequestError(f"{rpc}: {field} has {len(ids):,} task ids, more than {MAX_TASK_IDS:,}")
    if ids and min(ids) <= 0:
        bad = next(itertools.filterfalse(lambda t: t > 0, ids))
        raise errors.InvalidRequestError(f"{rpc}: {field} holds the task id {bad}: ids are positive")


#: Load and stats reports (ClientHeartbeat.stats, WorkerHeartbeat.load): durations in microseconds, at most
#: about 31 years (a reader running for ten years stays far below).
MAX_REPORTED_MICROS = 10 ** 15


def _micros(rpc: str, field: str, value: int) -> None:
    _in_range(rpc, field, value, 0, MAX_REPORTED_MICROS, "(microseconds)")


def _positive_id(rpc: str, field: str, value: int) -> None:
    if value <= 0:
        raise errors.InvalidRequestError(f"{rpc}: {field} is {value}: ids are positive")


def _at_least(rpc: str, field: str, value: int, least: int, note: str = "") -> None:
    if value < least:
        raise errors.InvalidRequestError(f"{rpc}: {field} is {value}, less than {least}{' ' + note if note else ''}")


def _in_range(rpc: str, field: str, value: int, least: int, most: int, note: str = "") -> None:
    if not least <= value <= most:
        raise errors.InvalidRequestError(f"{rpc}: {field} is {value}, outside [{least}, {most:,}]"
                                         f"{' ' + note if note else ''}")


def _max_chars(rpc: str, field: str, value: str, most: int) -> None:
    if len(value) > most:
        raise errors.InvalidRequestError(f"{rpc}: {field} has {len(value):,} characters, more than {most}")


def _max_bytes(rpc: str, field: str, value: bytes, most: int) -> None:
    if len(value) > most:
        raise errors.InvalidRequestError(f"{rpc}: {field} is {len(value):,} bytes, more than {most}")
