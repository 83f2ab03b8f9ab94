"""How a reader reads a job: ``distribute``'s arguments beyond the processing mode, as tf.data service
names them — coordinated reads (``consumer_index``, ``num_consumers``), the cross-trainer cache
(``CrossTrainerCache``), ``target_workers`` and ``compression`` — checked once, when ``distribute`` is
called, with a message that says how to fix a bad value.

The first three are the job's: the dispatcher records them when it creates the job, and refuses a
reader of a named job that asks for others. ``consumer_index``, the trainer id and ``compression``
are the reader's own.

Example::

    >>> options = ReadOptions(job_name="train", consumer_index=0, num_consumers=2)
    >>> options.coordinated
    True
    >>> ReadOptions(target_workers="local").target_workers
    'LOCAL'
"""

from __future__ import annotations

import dataclasses
from typing import Optional

from dataservice.service.frame_compression import check_compression
from dataservice.service.processing_modes import elastic_reader_id

from dataservice.dispatcher.request_checks import MAX_TRAINER_ID_CHARS

__all__ = ["CrossTrainerCache", "ReadOptions", "TARGET_WORKERS"]

#: What ``target_workers`` accepts (any case): AUTO lets the service decide, ANY reads from every worker,
#: LOCAL from the workers running in this process only.
TARGET_WORKERS = ("AUTO", "ANY", "LOCAL")


class CrossTrainerCache:
    """Makes the trainers of one job share its elements through a sliding-window cache on each worker:
    each trainer (``trainer_id``) sees every element the workers produce once, however many trainers
    read, and the pipeline runs once for all of them. Needs a ``job_name`` and an infinite dataset.

    Example::

        >>> ds = ds.repeat().apply(distribute("parallel_epochs", target, job_name="shared",
        ...                                   cross_trainer_cache=CrossTrainerCache(trainer_id="a")))
    """

    def __init__(self, trainer_id: str):
        if not isinstance(trainer_id, str) or not trainer_id:
            raise ValueError(f"CrossTrainerCache(trainer_id=...) must be a non-empty str naming the trainer, got "
                             f"{trainer_id!r}")
        if len(trainer_id) > MAX_TRAINER_ID_CHARS:
            raise ValueError(f"CrossTrainerCache(trainer_id=...) is {len(trainer_id)} characters long; a trainer id "
                             f"has at most {MAX_TRAINER_ID_CHARS} (workers refuse longer ones)")
        self.trainer_id = trainer_id

    def __repr__(self) -> str:
        return f"CrossTrainerCache(trainer_id={self.trainer_id!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CrossTrainerCache) and other.trainer_id == self.trainer_id

    def __hash__(self) -> int:
        return hash(("CrossTrainerCache", self.trainer_id))


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclasses.dataclass(frozen=True)
class ReadOptions:
    """A reader's options (see the module docstring); the constructor checks them.

    ``job_name``: the job's name ("" anonymous); coordinated reads and the cross-trainer cache need one.
    ``consumer_index`` and ``num_consumers``: both or neither; consumer ``i`` of ``n`` reads every n-th
    element of each round. ``cross_trainer_cache``: a ``CrossTrainerCache`` or None. ``target_workers``:
    "AUTO", "ANY" or "LOCAL" (any case; stored upper case). ``compression``: None, "AUTO" or a codec name
    ("LZ4", "ZSTD", "ZLIB", "GZIP"; any case, stored upper case; "" is None).
    """

    job_name: str = ""
    consumer_index: Optional[int] = None
    num_consumers: Optional[int] = None
    cross_trainer_cache: Optional[CrossTrainerCache] = None
    target_workers: str = "AUTO"
    compression: Optional[str] = "AUTO"
    #: distribute(..., deterministic=True): elements in split group order (distributed_epoch only).
    deterministic: bool = False
    #: Elastic readers: reader ``reader_index`` of ``num_readers`` takes every num_readers-th element of the
    #: deterministic sequence (both or neither; need deterministic and a job_name).
    num_readers: Optional[int] = None
    reader_index: Optional[int] = None

    def __post_init__(self) -> None:
        if (self.consumer_index is None) != (self.num_consumers is None):
            raise ValueError(f"consumer_index and num_consumers go together: set both (coordinated reads) or "
                             f"neither, got consumer_index={self.consumer_index!r}, "
                             f"num_consumers={self.num_consumers!r}")
        if self.num_consumers is not None:
            if not _is_int(self.num_consumers) or self.num_consumers <= 0:
                raise ValueError(f"num_consumers must be a positive int (the number of trainers reading the job "
                                 f"in round-robin), got {self.num_consumers!r}")
            if not _is_int(self.consumer_index) or not 0 <= self.consumer_index < self.num_consumers:
                raise ValueError(f"consumer_index must be an int in [0, num_consumers={self.num_consumers}), got "
                                 f"{self.consumer_index!r}")
            if not self.job_name:
                raise ValueError("coordinated reads (consumer_index, num_consumers) need a job_name: the consumers "
                                 "of one job_name read it together")
        if self.cross_trainer_cache is not None:
            if not isinstance(self.cross_trainer_cache, CrossTrainerCache):
                raise ValueError(f"cross_trainer_cache must be a CrossTrainerCache(trainer_id=...) or None, got "
                                 f"{self.cross_trainer_cache!r}")
            if not self.job_name:
                raise ValueError("cross_trainer_cache needs a job_name: the trainers that share a cache read one "
                                 "job, by its name")
            if self.num_consumers is not None:
                raise ValueError("cross_trainer_cache and coordinated reads (num_consumers) do not go together: "
                                 "coordinated consumers split each round between them, cached trainers each see "
                                 "every element")
        target = self.target_workers
        if not isinstance(target, str) or target.upper() not in TARGET_WORKERS:
            raise ValueError(f"target_workers must be one of {', '.join(repr(t) for t in TARGET_WORKERS)} "
                             f"(any case), got {target!r}")
        object.__setattr__(self, "target_workers", target.upper())
        if self.target_workers == "LOCAL" and self.num_consumers is not None:
            raise ValueError("target_workers='LOCAL' does not go with coordinated reads (num_consumers): in each "
                             "round every consumer reads from the same worker, so each reads every worker in turn. "
                             "Use target_workers='AUTO' or 'ANY'")
        if self.target_workers == "LOCAL" and self.cross_trainer_cache is not None:
            raise ValueError("target_workers='LOCAL' does not go with cross_trainer_cache: a local reader gets the "
                             "cached elements themselves, not copies, so one trainer changing an element in place "
                             "would change it for every other trainer. Use target_workers='AUTO' or 'ANY'")
        if not isinstance(self.deterministic, bool):
            raise ValueError(f"deterministic must be True or False, got {self.deterministic!r}")
        if self.deterministic and (self.num_consumers is not None or self.cross_trainer_cache is not None):
            what = "coordinated reads (num_consumers)" if self.num_consumers is not None else "cross_trainer_cache"
            raise ValueError(f"deterministic=True does not go with {what}: those hand each element to whichever "
                             f"consumer's turn it is, where a deterministic read gives one reader the split groups "
                             f"in order")
        if (self.num_readers is None) != (self.reader_index is None):
            raise ValueError(f"num_readers and reader_index go together: set both (elastic readers) or neither, got "
                             f"num_readers={self.num_readers!r}, reader_index={self.reader_index!r}")
        if self.num_readers is not None:
            if not _is_int(self.num_readers) or self.num_readers <= 0:
                raise ValueError(f"num_readers must be a positive int (the trainers reading the job, one reader each), "
                                 f"got {self.num_readers!r}")
            if not _is_int(self.reader_index) or not 0 <= self.reader_index < self.num_readers:
                raise ValueError(f"reader_index must be an int in [0, num_readers={self.num_readers}) (typically the "
                                 f"trainer's rank), got {self.reader_index!r}")
            if not self.deterministic or not self.job_name:
                raise ValueError("num_readers and reader_index (elastic readers) need deterministic=True and a "
                                 "job_name: the readers of one job_name share its deterministic sequence, reader i "
                                 "taking elements i, i + num_readers, ...")
        if self.deterministic and self.target_workers == "LOCAL":
            raise ValueError("deterministic=True does not go with target_workers='LOCAL': the order takes every "
                             "split group, whichever worker made it. Use target_workers='AUTO' or 'ANY'")
        # None, "AUTO" or a codec, upper case (dataservice.service.frame_compression): a bad name, or a codec
        # whose package is missing here, fails now rather than at the first element.
        object.__setattr__(self, "compression", check_compression(self.compression))

    @property
    def coordinated(self) -> bool:
        """Coordinated reads: consumers read in strict round-robin."""
        return self.num_consumers is not None

    @property
    def trainer_id(self) -> str:
        """The cross-trainer cache's trainer id ("" without the cache)."""
        if self.num_readers is not None:
            return elastic_reader_id(self.reader_index)  # the worker keeps its elements for every reader
        return self.cross_trainer_cache.trainer_id if self.cross_trainer_cache is not None else ""

    def job_fields(self) -> dict:
        """The options the dispatcher records with the job (``GetOrCreateJobRequest`` fields)."""
        return {"num_consumers": self.num_consumers or 0,
                "cross_trainer_cache": self.cross_trainer_cache is not None,
                "target_workers": self.target_workers,
                "deterministic": self.deterministic,
                "num_readers": self.num_readers or 0}
