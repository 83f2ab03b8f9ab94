"""Every exception that dataservice raises on purpose.

The tree::

    DataServiceError                      base of everything below
    ├── PipelineError                     a problem with a Dataset pipeline
    │   ├── NotSplittableError (ValueError)   distributed_epoch needs splits this pipeline cannot give
    │   ├── NotCheckpointableError (ValueError)   an iterator's position cannot be saved (from_generator)
    │   ├── PipelineSerializationError (TypeError)   cloudpickle could not serialize a pipeline
    │   ├── ElementSerializationError (TypeError)    an element has no wire form (a worker cannot send it)
    │   ├── DataLossError                 a corrupted or truncated record file
    │   ├── InvalidArgumentError (ValueError)   a value the pipeline met is invalid (TF's InvalidArgumentError)
    │   └── OutOfRangeError (StopIteration)     ``get_next()`` past the end of a dataset
    ├── CatalogueError                    naming a dataset of the catalogue (dataservice.catalogue)
    │   ├── DatasetNotFoundError (ValueError)      no builder, and nothing prepared, by that name
    │   └── UnsupportedVersionError (ValueError)   no supported (or prepared) version matches the request
    └── ServiceError                      talking to the dispatcher or a worker
        ├── ServiceUnavailableError       nobody answered within the configured timeout
        ├── NotFoundError                 unknown dataset id, job or task
        ├── AlreadyExistsError            a job name reused with different parameters
        ├── InvalidRequestError           a server refused a request as malformed
        ├── WrongEndpointError            the address answers, but not as a dataservice dispatcher
        ├── PermissionDeniedError         no cluster token, or another one (or a peer without it)
        ├── RemoteUserError               a user function raised on a worker
        └── WorkerEnvironmentError        a worker cannot load the pipeline
            ├── MissingModuleError        ... it lacks a module the pipeline imports
            └── VersionSkewError          ... its Python, cloudpickle, numpy or dataservice differs

Wrong arguments to a public function raise plain ``ValueError``/``TypeError``
naming the argument — except where tf.data raises ``InvalidArgumentError`` (an
out-of-range size or count of a transformation, ``Dataset.range``'s step 0):
there ``InvalidArgumentError``, which is a ``ValueError`` too.

Transport errors (``grpc.RpcError``) never escape: the client boundary
translates them into one of the classes above with ``raise ... from exc``.

Example::

    >>> from dataservice import errors
    >>> issubclass(errors.DataLossError, errors.DataServiceError)
    True
"""

from __future__ import annotations

from typing import Any, Sequence

__all__ = [
    "AlreadyExistsError",
    "CatalogueError",
    "DataLossError",
    "DataServiceError",
    "DatasetNotFoundError",
    "ElementSerializationError",
    "InvalidArgumentError",
    "InvalidRequestError",
    "MissingModuleError",
    "NotFoundError",
    "NotCheckpointableError",
    "NotSplittableError",
    "OutOfRangeError",
    "PermissionDeniedError",
    "PipelineError",
    "PipelineSerializationError",
    "RemoteUserError",
    "ServiceError",
    "ServiceUnavailableError",
    "UnsupportedVersionError",
    "VersionSkewError",
    "WorkerEnvironmentError",
    "WrongEndpointError",
]


class DataServiceError(Exception):
    """Base class of every error dataservice raises on purpose."""


class PipelineError(DataServiceError):
    """A problem with a Dataset pipeline itself."""


class NotSplittableError(PipelineError, ValueError):
    """The pipeline has no source that can hand out splits (e.g. ``from_generator``)."""


class NotCheckpointableError(PipelineError, ValueError):
    """``state_dict()`` of an iterator whose pipeline holds a transformation that cannot save its position;
    the message names it and says why (a Python generator's position, say, cannot be saved)."""


class PipelineSerializationError(PipelineError, TypeError):
    """A pipeline could not be serialized; the message names the offending object."""


class ElementSerializationError(PipelineError, TypeError):
    """An element cannot be serialized for the wire (nor pickled): a worker cannot send it to its reader.
    ``path`` is the offending component's place in the element (``"['lock']"``, ``"[1]['meta']"``; ``""``: the
    element itself), ``component_type`` its type, ``reason`` what pickle said, and ``where`` the transformation
    that produced the element (``"Dataset.map(make_record)"``; ``""`` where it is not known)."""

    def __init__(self, message: str, path: str = "", component_type: str = "", reason: str = "", where: str = ""):
        super().__init__(message)
        self.path = path
        self.component_type = component_type
        self.reason = reason
        self.where = where


class DataLossError(PipelineError):
    """A record file is corrupted or truncated; the message names the file and offset."""

    def __init__(self, message: str, filename: str | None = None, offset: int | None = None):
        super().__init__(message)
        self.filename = filename
        self.offset = offset


class InvalidArgumentError(PipelineError, ValueError):
    """A value met while running a pipeline is invalid (TensorFlow raises ``tf.errors.InvalidArgumentError``
    there): e.g. a fixed-length record file whose body is not a whole number of records."""


class OutOfRangeError(PipelineError, StopIteration):
    """``iterator.get_next()`` was called past the end of the dataset; as a StopIteration it also ends a
    Python loop."""


class CatalogueError(DataServiceError):
    """A dataset of the catalogue could not be found as named."""


class DatasetNotFoundError(CatalogueError, ValueError):
    """No builder is registered under the name, and nothing is prepared under it in the data directory."""


class UnsupportedVersionError(CatalogueError, ValueError):
    """No version of ``dataset`` matches ``requested``; ``available`` lists those that exist, highest first
    (the builder's canonical and supported versions, or the versions prepared on disk)."""

    def __init__(self, message: str, dataset: str = "", requested: str = "", available: Sequence[Any] = ()):
        super().__init__(message)
        self.dataset = dataset
        self.requested = requested
        self.available = list(available)


class ServiceError(DataServiceError):
    """A failure while talking to the dispatcher or to a worker."""


class ServiceUnavailableError(ServiceError):
    """The dispatcher or a worker did not answer within the configured timeout."""


class NotFoundError(ServiceError):
    """An unknown dataset id, job, iteration or task."""


class AlreadyExistsError(ServiceError):
    """A job name is already used with different parameters."""


class InvalidRequestError(ServiceError):
    """A server refused a request as malformed."""


class WrongEndpointError(ServiceError):
    """The address answers, but it is not a dataservice dispatcher: a worker's port, or
    something that is not dataservice at all. The message says which."""


class PermissionDeniedError(ServiceError):
    """A server refused us for want of the cluster's auth token (none, or another one), or a peer
    could not prove it holds the token; the message says which and how to set it."""


class RemoteUserError(ServiceError):
    """A user function raised on a worker.

    ``remote_type`` is the original exception's qualified type name,
    ``worker_address`` the worker it ran on and ``remote_traceback`` the
    worker-side traceback, as text. When the original type can be imported on
    the client, the client raises that type, with the original arguments,
    chained from this error (whose message shows the worker's traceback).
    """

    def __init__(self, message: str, remote_type: str = "", worker_address: str = "", remote_traceback: str = ""):
        super().__init__(message)
        self.remote_type = remote_type
        self.worker_address = worker_address
        self.remote_traceback = remote_traceback


class WorkerEnvironmentError(ServiceError):
    """A worker cannot load the pipeline; ``worker_address`` says which worker."""

    def __init__(self, message: str, worker_address: str = ""):
        super().__init__(message)
        self.worker_address = worker_address


class MissingModuleError(WorkerEnvironmentError):
    """The pipeline imports ``module``, which the worker cannot import. ``distribution``
    is the installed package that provides it on the client ("" if none: then the module
    is the user's own code and was not shipped)."""

    def __init__(self, message: str, worker_address: str = "", module: str = "", distribution: str = ""):
        super().__init__(message, worker_address)
        self.module = module
        self.distribution = distribution


class VersionSkewError(WorkerEnvironmentError):
    """The client and the worker run versions that cannot exchange pipelines.

    ``client_versions`` and ``worker_versions`` map "python", "cloudpickle",
    "numpy" and "dataservice" to version strings.
    """

    def __init__(self, message: str, worker_address: str = "", client_versions: dict | None = None,
                 worker_versions: dict | None = None):
        super().__init__(message, worker_address)
        self.client_versions = dict(client_versions or {})
        self.worker_versions = dict(worker_versions or {})
