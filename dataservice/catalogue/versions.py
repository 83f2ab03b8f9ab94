"""Dataset versions: ``Version("MAJOR.MINOR.PATCH")``, version patterns and picking the version to load.

Every dataset builder has a canonical ``VERSION`` and may list ``SUPPORTED_VERSIONS`` (higher or lower than
the canonical one). Versions follow Semantic Versioning 2.0.0, and the number that changes says what a reader
may rely on:

- **PATCH** (``1.0.0`` -> ``1.0.1``): the way the data is serialized on disk, or its metadata, may differ, but
  readers get the same data: any given slice returns the same records.
- **MINOR** (``1.0.1`` -> ``1.1.0``): the data already there is unchanged, but there is more of it (for
  example a new feature in every example); any given slice still returns the same records.
- **MAJOR** (``1.1.0`` -> ``2.0.0``): existing data changed; a given slice may return other records.

So ``"mnist:3.0.0"`` and ``"mnist:3.2.0"`` give the same records for ``split="train[10:20]"``. These are
best-effort promises: a bug may change data without a version bump. For a publication, fix the MAJOR
component only (``"mnist:3.*.*"``) and say which version your results used.

A request names either one version (``"1.2.3"``) or a pattern whose trailing components are wildcards
(``"1.2.*"``, ``"1.*.*"``, ``"*"``); a pattern resolves to the *highest* canonical or supported version that
matches it, so ``"3.*.*"`` resolves to 3.0.0 today and to 3.1.1 once that version is added.

Example::

    >>> from dataservice.catalogue.versions import Version, resolve_version
    >>> Version("1.2.3") < "1.10.0"
    True
    >>> Version("1.2.3").match("1.*.*")
    True
    >>> str(resolve_version("3.*.*", Version("2.0.1"), [Version("3.0.0"), Version("1.0.0")], dataset="imagenet"))
    '3.0.0'
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from dataservice.errors import UnsupportedVersionError

__all__ = ["Version", "VersionOrStr", "resolve_version"]

# No leading zeros (as in SemVer and TFDS): "01.2.3" is not a version.
_NUMBER = r"(?:0|[1-9][0-9]*)"
_VERSION_RE = re.compile(rf"({_NUMBER})\.({_NUMBER})\.({_NUMBER})")
# Wildcards only trail: "1.*.3" would mean "patch 3 of any minor", which SemVer gives no meaning to.
_PATTERN_RE = re.compile(rf"(?:\*|\*\.\*\.\*|{_NUMBER}\.(?:\*\.\*|{_NUMBER}\.(?:\*|{_NUMBER})))")

_VERSION_FORM = 'a version is "MAJOR.MINOR.PATCH", three numbers without leading zeros, e.g. "1.2.3"'
_PATTERN_FORMS = '"MAJOR.MINOR.PATCH" (e.g. "1.2.3"), "1.2.*", "1.*.*", "*.*.*" or "*" (wildcards only at the end)'

# The name TFDS gives the highest of a builder's versions.
_LATEST = "experimental_latest"


def _parse_version(text: str) -> tuple[int, int, int]:
    match = _VERSION_RE.fullmatch(text)
    if match is None:
        raise ValueError(f"Invalid version {text!r}: {_VERSION_FORM}.")
    return int(match[1]), int(match[2]), int(match[3])


def _parse_pattern(pattern: str) -> tuple[int | None, int | None, int | None]:
    """(major, minor, patch) of a pattern, None standing for a wildcard."""
    if not isinstance(pattern, str):
        raise TypeError(f"A version pattern must be a str, not {type(pattern).__name__}: {pattern!r}.")
    if _PATTERN_RE.fullmatch(pattern) is None:
        raise ValueError(f"Invalid version pattern {pattern!r}: expected {_PATTERN_FORMS}.")
    if pattern == "*":  # short for "*.*.*"
        return None, None, None
    major, minor, patch = (None if part == "*" else int(part) for part in pattern.split("."))
    return major, minor, patch


class Version:
    """A dataset version MAJOR.MINOR.PATCH, with the notes a builder attaches to it.

    Versions compare by (major, minor, patch), also with strings; metadata plays no part in comparison.
    ``Version(other_version)`` copies ``other_version``, keeping its metadata unless given again.

    Example::

        >>> v = Version("2.0.1", "Encoding fix. No changes from user POV")
        >>> (v.major, v.minor, v.patch), str(v), v == "2.0.1", v > Version("2.0.0")
        ((2, 0, 1), '2.0.1', True, True)
    """

    __slots__ = ("_tuple", "description", "release_notes", "tfds_version_to_prepare", "experiments")

    def __init__(self, version: VersionOrStr, description: str | None = None, release_notes: str | None = None,
                 tfds_version_to_prepare: str | None = None, experiments: Mapping[Any, bool] | None = None):
        if isinstance(version, Version):
            self._tuple = version._tuple
            description = version.description if description is None else description
            release_notes = version.release_notes if release_notes is None else release_notes
            if tfds_version_to_prepare is None:
                tfds_version_to_prepare = version.tfds_version_to_prepare
            experiments = version.experiments if experiments is None else experiments
        elif isinstance(version, str):
            self._tuple = _parse_version(version)
        else:
            raise TypeError(f"Version() takes a str such as '1.2.3' or a Version, not {type(version).__name__}: "
                            f"{version!r}.")
        for name, value in (("description", description), ("release_notes", release_notes),
                            ("tfds_version_to_prepare", tfds_version_to_prepare)):
            if value is not None and not isinstance(value, str):
                raise TypeError(f"Version {name} must be a str or None, not {type(value).__name__}: {value!r}.")
        if experiments is not None and not isinstance(experiments, Mapping):
            raise TypeError(f"Version experiments must be a mapping of experiment to bool, not "
                            f"{type(experiments).__name__}: {experiments!r}.")
        self.description = description
        self.release_notes = release_notes
        # The last TFDS version able to prepare this version; our builders cannot prepare it either.
        self.tfds_version_to_prepare = tfds_version_to_prepare
        self.experiments = dict(experiments or {})

    @property
    def major(self) -> int:
        return self._tuple[0]

    @property
    def minor(self) -> int:
        return self._tuple[1]

    @property
    def patch(self) -> int:
        return self._tuple[2]

    @property
    def tuple(self) -> tuple[int, int, int]:
        """(major, minor, patch)."""
        return self._tuple

    def match(self, pattern: VersionOrStr) -> bool:
        """True if this version matches ``pattern``: "1.2.3", "1.2.*", "1.*.*", "*" or a Version.

        Example::

            >>> Version("1.2.3").match("1.2.*"), Version("1.2.3").match("2.*.*")
            (True, False)
        """
        if isinstance(pattern, Version):
            return pattern._tuple == self._tuple
        wanted = _parse_pattern(pattern)
        return all(want is None or want == have for want, have in zip(wanted, self._tuple))

    @classmethod
    def is_valid(cls, version: object) -> bool:
        """True if ``version`` is a Version or a string of the form MAJOR.MINOR.PATCH (e.g. a directory name)."""
        return isinstance(version, Version) or (isinstance(version, str) and _VERSION_RE.fullmatch(version) is not None)

    def _other_tuple(self, other: object) -> tuple[int, int, int] | None:
        if isinstance(other, Version):
            return other._tuple
        if isinstance(other, str):
            return _parse_version(other)
        return None

    def __eq__(self, other: object) -> bool:
        if isinstance(other, str) and not self.is_valid(other):
            return False  # equality never raises; "abc" is simply not this version
        other_tuple = self._other_tuple(other)
        return NotImplemented if other_tuple is None else self._tuple == other_tuple

    def __lt__(self, other: VersionOrStr) -> bool:
        other_tuple = self._other_tuple(other)
        return NotImplemented if other_tuple is None else self._tuple < other_tuple

    def __le__(self, other: VersionOrStr) -> bool:
        other_tuple = self._other_tuple(other)
        return NotImplemented if other_tuple is None else self._tuple <= other_tuple

    def __gt__(self, other: VersionOrStr) -> bool:
        other_tuple = self._other_tuple(other)
        return NotImplemented if other_tuple is None else self._tuple > other_tuple

    def __ge__(self, other: VersionOrStr) -> bool:
        other_tuple = self._other_tuple(other)
        return NotImplemented if other_tuple is None else self._tuple >= other_tuple

    def __hash__(self) -> int:
        # Hash as the string does, since a Version equals its string: {Version("1.2.3")} contains "1.2.3".
        return hash(str(self))

    def __str__(self) -> str:
        return "{}.{}.{}".format(*self._tuple)

    def __repr__(self) -> str:
        return f"Version('{self}')"

    def __reduce__(self):
        return (Version, (str(self), self.description, self.release_notes, self.tfds_version_to_prepare,
                          self.experiments or None))


VersionOrStr = Version | str


def resolve_version(requested: VersionOrStr | None, canonical: VersionOrStr, supported: Sequence[VersionOrStr], *,
                    dataset: str) -> Version:
    """The version of ``dataset`` to load for ``requested``.

    None gives the canonical version; an exact version or a pattern ("1.2.*", "1.*.*", "*") gives the highest
    of the canonical and supported versions that matches; "experimental_latest" gives the highest of them all.
    The Version returned is the builder's own object (with its description and notes).

    Raises:
        UnsupportedVersionError: nothing matches; the message lists the available versions, highest first.
        ValueError: ``requested`` is neither a version nor a pattern.

    Example::

        >>> resolve_version("1.*.*", Version("1.0.0"), ["1.1.0", "2.0.0"], dataset="mnist")
        Version('1.1.0')
        >>> resolve_version(None, Version("1.0.0"), ["1.1.0", "2.0.0"], dataset="mnist")
        Version('1.0.0')
    """
    canonical = Version(canonical) if isinstance(canonical, str) else canonical
    if not isinstance(canonical, Version):
        raise TypeError(f"canonical must be a Version or a str, not {type(canonical).__name__}: {canonical!r}.")
    if isinstance(supported, (str, Version)):
        raise TypeError(f"supported must be a sequence of versions, not a single {type(supported).__name__}: "
                        f"{supported!r}; write [{supported!r}].")
    candidates: list[Version] = [canonical]
    for version in supported:
        version = Version(version) if isinstance(version, str) else version
        if not isinstance(version, Version):
            raise TypeError(f"supported versions must be Versions or strs, not {type(version).__name__}: "
                            f"{version!r}.")
        if version not in candidates:
            candidates.append(version)
    if requested is None:
        return canonical
    if requested == _LATEST:
        return max(candidates)
    if not isinstance(requested, (str, Version)):
        raise TypeError(f"A requested version must be a str such as '1.2.3' or '1.*.*', a Version or None, not "
                        f"{type(requested).__name__}: {requested!r}.")
    matching = [version for version in candidates if version.match(requested)]
    if matching:
        return max(matching)
    available = sorted(candidates, reverse=True)
    listed = ", ".join(f"{v} (canonical)" if v == canonical else str(v) for v in available)
    raise UnsupportedVersionError(
        f"Dataset {dataset!r} has no version matching {str(requested)!r}. Available versions: {listed}. "
        f"Ask for one of them, a pattern such as '{available[0].major}.*.*', or no version for the canonical one.",
        dataset=dataset, requested=str(requested), available=available)
