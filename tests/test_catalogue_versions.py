"""Dataset versions: Version, wildcard patterns and resolve_version (the seed's versioning rules)."""

from __future__ import annotations

import pickle

import pytest

from dataservice.catalogue.versions import Version, resolve_version
from dataservice.errors import UnsupportedVersionError
from dataservice.errors import DataServiceError

#: Pipelines run in this process; no server is talked to (tests/grpc_leak_guard.py checks it).
pytestmark = pytest.mark.no_grpc


def test_a_version_has_three_numbers_and_prints_as_given():
    v = Version("1.2.3")
    assert (v.major, v.minor, v.patch) == (1, 2, 3)
    assert v.tuple == (1, 2, 3)
    assert str(v) == "1.2.3"
    assert repr(v) == "Version('1.2.3')"
    assert str(Version("0.0.0")) == "0.0.0"
    assert Version("10.20.300").tuple == (10, 20, 300)


def test_metadata_in_the_seeds_shape_and_copying():
    # The seed's Imagenet2012 example: a description as the second argument, tfds_version_to_prepare by name.
    canonical = Version("2.0.1", "Encoding fix. No changes from user POV")
    old = Version("0.0.9", tfds_version_to_prepare="v1.0.0")
    assert canonical.description == "Encoding fix. No changes from user POV"
    assert old.tfds_version_to_prepare == "v1.0.0" and old.description is None
    exp = Version("2.0.0", "EXP1: Opt-in for experiment 1", release_notes="notes", experiments={"EXP1": True})
    assert exp.experiments == {"EXP1": True} and exp.release_notes == "notes"

    copy = Version(exp)
    assert copy == exp and copy.description == exp.description and copy.experiments == {"EXP1": True}
    assert copy.release_notes == "notes"
    renamed = Version(exp, description="other")
    assert renamed.description == "other" and renamed.experiments == {"EXP1": True}
    # Metadata plays no part in comparison.
    assert Version("2.0.1") == canonical and hash(Version("2.0.1")) == hash(canonical)


@pytest.mark.parametrize("text", ["1.2", "1.2.3.4", "01.2.3", "1.02.3", "1.2.03", "a.b.c", "1.2.3-rc1", "", "1..3",
                                  " 1.2.3", "1.2.3 ", "-1.2.3", "1.*.*", "v1.2.3"])
def test_invalid_version_strings_say_the_expected_form(text):
    with pytest.raises(ValueError, match="MAJOR.MINOR.PATCH") as info:
        Version(text)
    assert repr(text) in str(info.value)


def test_a_version_is_built_from_a_str_or_a_version_only():
    with pytest.raises(TypeError, match="'1.2.3'"):
        Version(1.2)
    with pytest.raises(TypeError, match="description"):
        Version("1.0.0", description=3)
    with pytest.raises(TypeError, match="experiments"):
        Version("1.0.0", experiments=["EXP1"])


def test_versions_order_by_numbers_not_text():
    texts = ["1.10.0", "0.0.9", "1.2.3", "1.9.0", "2.0.0", "1.2.10", "1.2.9", "0.10.0"]
    ordered = sorted(Version(t) for t in texts)
    assert [str(v) for v in ordered] == ["0.0.9", "0.10.0", "1.2.3", "1.2.9", "1.2.10", "1.9.0", "1.10.0", "2.0.0"]
    a, b = Version("1.9.0"), Version("1.10.0")
    assert a < b and a <= b and b > a and b >= a and a != b
    assert a <= Version("1.9.0") and a >= Version("1.9.0") and not a < Version("1.9.0")
    assert max(Version(t) for t in texts) == "2.0.0"


def test_versions_compare_with_strings_both_ways():
    v = Version("1.2.3")
    assert v == "1.2.3" and "1.2.3" == v and v != "1.2.4"
    assert v < "1.10.0" and "1.10.0" > v and v >= "1.2.3" and "0.9.9" < v and v <= "1.2.3"
    # A Version hashes as its string, so sets and dicts find it by either.
    assert "1.2.3" in {v} and v in {"1.2.3"} and {v: "x"}["1.2.3"] == "x"
    # Equality never raises: anything that is not this version is unequal.
    assert v != "not a version" and v != 123 and v is not None and v != None  # noqa: E711
    with pytest.raises(ValueError, match="MAJOR.MINOR.PATCH"):
        assert v < "1.2"
    with pytest.raises(TypeError):
        assert v < 2


@pytest.mark.parametrize("pattern, matches", [
    ("1.2.3", True), ("1.2.4", False), ("1.2.*", True), ("1.3.*", False), ("1.*.*", True), ("2.*.*", False),
    ("*", True), ("*.*.*", True), ("0.*.*", False),
])
def test_match_takes_exact_versions_and_trailing_wildcards(pattern, matches):
    assert Version("1.2.3").match(pattern) is matches


def test_match_a_version_object_is_exact():
    assert Version("1.2.3").match(Version("1.2.3")) and not Version("1.2.3").match(Version("1.2.4"))


@pytest.mark.parametrize("pattern", ["1.*.3", "*.2.3", "*.*.3", "*.2.*", "1.*", "1", "1.2", "1.2.3.*", "**", "",
                                     "1.2.x", "01.*.*", "1.2.**", "1.2.3 "])
def test_illegal_patterns_are_refused_with_the_accepted_forms(pattern):
    with pytest.raises(ValueError, match=r"wildcards only at the end") as info:
        Version("1.2.3").match(pattern)
    assert repr(pattern) in str(info.value) and '"1.*.*"' in str(info.value)


def test_match_refuses_non_strings():
    with pytest.raises(TypeError, match="pattern"):
        Version("1.2.3").match(1)


# The seed's Imagenet2012 builder: canonical 2.0.1; supported 3.0.0, 1.0.0, 0.0.9.
CANONICAL = Version("2.0.1", "Encoding fix. No changes from user POV")
SUPPORTED = [Version("3.0.0", "S3: tensorflow.org/datasets/splits"), Version("1.0.0"),
             Version("0.0.9", tfds_version_to_prepare="v1.0.0")]


def resolve(requested, supported=SUPPORTED, canonical=CANONICAL):
    return resolve_version(requested, canonical, supported, dataset="imagenet2012")


def test_no_request_gives_the_canonical_version():
    assert resolve(None) is CANONICAL


def test_an_exact_request_gives_that_version_object():
    assert resolve("2.0.1") is CANONICAL
    assert resolve("1.0.0") is SUPPORTED[1]
    assert resolve(Version("0.0.9")) is SUPPORTED[2]
    assert resolve("0.0.9").tfds_version_to_prepare == "v1.0.0"


def test_a_wildcard_gives_the_highest_match():
    assert resolve("3.*.*") == "3.0.0"
    # "Resolves to 3.0.0 for now, but would resolve to 3.1.1 if when added."
    assert resolve("3.*.*", supported=[*SUPPORTED, Version("3.1.1")]) == "3.1.1"
    assert resolve("3.*.*", supported=[Version("3.1.1"), *SUPPORTED, Version("3.1.0")]) == "3.1.1"
    assert resolve("*") == "3.0.0" and resolve("*.*.*") == "3.0.0"
    assert resolve("2.0.*") is CANONICAL and resolve("0.*.*") == "0.0.9"
    # The highest, even above a matching canonical version.
    assert resolve_version("3.*.*", "3.0.0", ["3.1.0", "3.0.5", "4.0.0"], dataset="d") == "3.1.0"


def test_experimental_latest_gives_the_highest_version():
    assert resolve("experimental_latest") == "3.0.0"
    assert resolve_version("experimental_latest", "2.0.0", [], dataset="d") == "2.0.0"


def test_an_unsupported_version_lists_what_is_available():
    # The seed: ImageNet 2.0.0 is no longer supported.
    with pytest.raises(UnsupportedVersionError) as info:
        resolve("2.0.0")
    message = str(info.value)
    assert "'imagenet2012'" in message and "'2.0.0'" in message
    assert "3.0.0, 2.0.1 (canonical), 1.0.0, 0.0.9" in message  # highest first
    assert info.value.dataset == "imagenet2012" and info.value.requested == "2.0.0"
    assert [str(v) for v in info.value.available] == ["3.0.0", "2.0.1", "1.0.0", "0.0.9"]
    assert isinstance(info.value, ValueError) and isinstance(info.value, DataServiceError)

    with pytest.raises(UnsupportedVersionError, match=r"'4\.\*\.\*'.*3\.0\.0, 2\.0\.1 \(canonical\)"):
        resolve("4.*.*")
    with pytest.raises(UnsupportedVersionError, match="'2.0.0'"):
        resolve(Version("2.0.0"))


def test_a_malformed_request_is_a_plain_value_error():
    with pytest.raises(ValueError, match="wildcards only at the end") as info:
        resolve("3.*.0")
    assert not isinstance(info.value, UnsupportedVersionError)
    with pytest.raises(TypeError, match="requested version"):
        resolve(3)


def test_supported_versions_may_be_strings_and_repeat_the_canonical_one():
    assert resolve_version("1.*.*", "1.0.0", ["1.0.0", "1.1.0", "1.1.0"], dataset="d") == "1.1.0"
    with pytest.raises(UnsupportedVersionError) as info:
        resolve_version("5.0.0", "1.0.0", ["1.0.0", "1.1.0"], dataset="d")
    assert [str(v) for v in info.value.available] == ["1.1.0", "1.0.0"]
    with pytest.raises(TypeError, match=r"write \['1.1.0'\]"):
        resolve_version(None, "1.0.0", "1.1.0", dataset="d")
    with pytest.raises(TypeError, match="supported versions"):
        resolve_version(None, "1.0.0", [1.1], dataset="d")


def test_versions_survive_pickling_with_their_metadata():
    v = Version("2.0.0", "desc", release_notes="notes", tfds_version_to_prepare="v1.0.0", experiments={"E": True})
    back = pickle.loads(pickle.dumps(v))
    assert back == v and back.description == "desc" and back.release_notes == "notes"
    assert back.tfds_version_to_prepare == "v1.0.0" and back.experiments == {"E": True}
