"""What a builder's ``_split_generators(dl_manager)`` gets: downloads, extraction and the manual directory.

Downloads go through ``urllib`` (``http(s)://`` and ``file://``) into ``download_dir``, named by a
hash of the URL, so a second preparation reuses them; a download is written to a temporary file
and renamed when complete. Archives (``.zip``, ``.tar``, ``.tar.gz``/``.tgz``, ``.gz``) extract
beside them. Nested structures of URLs (dicts, lists) come back with the same structure of paths.

Example::

    >>> def _split_generators(self, dl_manager):
    ...     path = dl_manager.download_and_extract("https://example.org/data.tar.gz")
    ...     return {"train": self._generate_examples(os.path.join(path, "train.csv"))}
"""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import os
import shutil
import tarfile
import tempfile
import urllib.parse
import urllib.request
import zipfile
from typing import Any, Callable, Optional

__all__ = ["DownloadConfig", "DownloadManager"]


@dataclasses.dataclass(frozen=True)
class DownloadConfig:
    """Options of ``download_and_prepare``.

    - ``download_dir``: where downloads go (default ``<data_dir>/downloads``).
    - ``manual_dir``: where a dataset that cannot be downloaded expects its files
      (default ``<download_dir>/manual``).
    - ``num_shards``: shards per split (default: TFDS's rule, by size).
    - ``max_examples_per_split``: prepare only the first N examples each split's generator yields
      (a quick trial preparation).

    Example::

        >>> builder.download_and_prepare(download_config=DownloadConfig(num_shards=4))
    """

    download_dir: Optional[str] = None
    manual_dir: Optional[str] = None
    num_shards: Optional[int] = None
    max_examples_per_split: Optional[int] = None

    def __post_init__(self) -> None:
        for name in ("num_shards", "max_examples_per_split"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise ValueError(f"DownloadConfig.{name} must be an int >= 1 or None, got {value!r}")


def _map_nested(fn: Callable[[Any], Any], value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _map_nested(fn, v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_map_nested(fn, v) for v in value)
    return fn(value)


class DownloadManager:
    """Downloads and extracts a builder's source files; see the module docstring."""

    def __init__(self, download_dir: str, manual_dir: Optional[str] = None):
        self.download_dir = download_dir
        self._manual_dir = manual_dir or os.path.join(download_dir, "manual")

    @property
    def manual_dir(self) -> str:
        """The directory of files a user put there by hand; an error saying where, if it is missing."""
        if not os.path.isdir(self._manual_dir):
            raise FileNotFoundError(f"this dataset needs files downloaded by hand into {self._manual_dir} "
                                    "(see the builder's MANUAL_DOWNLOAD_INSTRUCTIONS)")
        return self._manual_dir

    def download(self, url_or_urls: Any) -> Any:
        """Downloads each URL once; returns the local path(s), in the same structure."""
        return _map_nested(self._download_one, url_or_urls)

    def extract(self, path_or_paths: Any) -> Any:
        """Extracts each archive into a directory beside it; returns the directories (a non-archive: itself)."""
        return _map_nested(self._extract_one, path_or_paths)

    def download_and_extract(self, url_or_urls: Any) -> Any:
        return self.extract(self.download(url_or_urls))

    def _download_one(self, url: str) -> str:
        if not isinstance(url, str):
            raise TypeError(f"a URL must be a str, got {url!r}")
        os.makedirs(self.download_dir, exist_ok=True)
        name = os.path.basename(urllib.parse.urlparse(url).path) or "download"
        digest = hashlib.sha256(url.encode()).hexdigest()[:16]
        path = os.path.join(self.download_dir, f"{digest}_{name}")
        if os.path.exists(path):
            return path
        fd, tmp = tempfile.mkstemp(prefix=".incomplete-", dir=self.download_dir)
        try:
            with os.fdopen(fd, "wb") as out, urllib.request.urlopen(url, timeout=60) as response:
                shutil.copyfileobj(response, out, 1 << 20)
            os.rename(tmp, path)
        except OSError as exc:
            raise OSError(f"could not download {url}: {exc}") from exc
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        return path

    def _extract_one(self, path: str) -> str:
        lower = path.lower()
        if lower.endswith(".zip"):
            opener = "zip"
        elif lower.endswith((".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tar.xz")):
            opener = "tar"
        elif lower.endswith(".gz"):
            opener = "gz"
        else:
            return path
        target = path + ".extracted"
        if os.path.exists(target):
            return target
        tmp = tempfile.mkdtemp(prefix=".incomplete-", dir=os.path.dirname(path))
        try:
            if opener == "zip":
                with zipfile.ZipFile(path) as archive:
                    archive.extractall(tmp)
            elif opener == "tar":
                with tarfile.open(path) as archive:
                    archive.extractall(tmp, filter="data")
            else:
                with gzip.open(path, "rb") as src, open(os.path.join(tmp, os.path.basename(path)[:-3]), "wb") as dst:
                    shutil.copyfileobj(src, dst, 1 << 20)
            os.rename(tmp, target)
        finally:
            if os.path.exists(tmp):
                shutil.rmtree(tmp, ignore_errors=True)
        return target
