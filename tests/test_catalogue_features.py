"""The catalogue's feature connectors: tf.train.Example bytes, decoding, features.json (no TensorFlow).

What TFDS itself writes and reads for the same features was checked with
tests/fixtures/check_features_with_tfds.py (run in a venv with TensorFlow Datasets); the
features.json text and the Example layouts below are TFDS's, taken from that run.
"""

import io
import json
import os
import pickle
import struct
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from PIL import Image as PILImage

from dataservice.catalogue import example_codec
from dataservice.catalogue.features import (ClassLabel, Documentation, FeaturesDict, Image, Scalar, Tensor, Text,
                                            features_from_json, load_features, save_features, to_feature)
from dataservice.data import specs
from dataservice.data.specs import TensorSpec
from dataservice.errors import DataLossError
from dataservice.proto import example_pb2

#: Pipelines run in this process; no server is talked to (tests/grpc_leak_guard.py checks it).
pytestmark = pytest.mark.no_grpc

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def roundtrip(features, example):
    return features.deserialize_example(features.serialize_example(example))


# --- the wire format, byte by byte ---------------------------------------------------------------

def varint(n: int) -> bytes:
    n &= (1 << 64) - 1  # negative int64s are ten-byte varints
    out = bytearray()
    while True:
        low, n = n & 0x7F, n >> 7
        out.append(low | (0x80 if n else 0))
        if not n:
            return bytes(out)


def field(number: int, payload: bytes) -> bytes:
    """A length-delimited field (wire type 2)."""
    return varint(number << 3 | 2) + varint(len(payload)) + payload


def example(*entries: bytes) -> bytes:
    # Example.features = 1 -> Features.feature (a map) = 1, one entry per key.
    return field(1, b"".join(field(1, e) for e in entries))


def entry(key: str, feature: bytes) -> bytes:
    return field(1, key.encode()) + field(2, feature)  # map entry: key = 1, value = 2


def packed(payload: bytes) -> bytes:
    return field(1, payload) if payload else b""  # an empty repeated field is not written at all


def int64_list(*values: int) -> bytes:
    return field(3, packed(b"".join(varint(v) for v in values)))  # Feature.int64_list = 3, packed


def float_list(*values: float) -> bytes:
    return field(2, packed(struct.pack(f"<{len(values)}f", *values)))  # Feature.float_list = 2, packed


def bytes_list(*values: bytes) -> bytes:
    return field(1, b"".join(field(1, v) for v in values))  # Feature.bytes_list = 1, not packed


def test_an_int64_scalar_is_an_int64_list_of_one_value():
    data = FeaturesDict({"n": np.int64}).serialize_example({"n": 5})
    assert data == example(entry("n", int64_list(5)))
    assert data == b"\n\x0c\n\n\n\x01n\x12\x05\x1a\x03\n\x01\x05"


def test_each_kind_of_value_has_tensorflows_field_number_and_encoding():
    features = FeaturesDict({
        "flag": np.bool_, "small": np.int32, "neg": np.int64, "big": np.uint64, "x": np.float32,
        "wide": np.float64, "name": Text(), "label": ClassLabel(names=["no", "yes"]),
        "grid": Tensor(shape=(2, 2), dtype=np.int16), "tags": Tensor(shape=(None,), dtype=str),
    })
    data = features.serialize_example({
        "flag": True, "small": -3, "neg": -1, "big": 2 ** 64 - 1, "x": 1.5, "wide": 0.1, "name": "hé",
        "label": "yes", "grid": np.array([[1, 2], [3, 4]], np.int16), "tags": ["a", b"bc"],
    })
    # Keys sorted (deterministic serialization); bools and ints as int64 (uint64 bit-cast),
    # floats as float32 (float64 rounded), strings as UTF-8 bytes, tensors flattened in C order.
    assert data == example(
        entry("big", int64_list(-1)),
        entry("flag", int64_list(1)),
        entry("grid", int64_list(1, 2, 3, 4)),
        entry("label", int64_list(1)),
        entry("name", bytes_list("hé".encode())),
        entry("neg", int64_list(-1)),
        entry("small", int64_list(-3)),
        entry("tags", bytes_list(b"a", b"bc")),
        entry("wide", float_list(float(np.float32(0.1)))),
        entry("x", float_list(1.5)),
    )


def test_nested_keys_are_joined_with_slashes_and_an_empty_tensor_is_an_empty_list():
    features = FeaturesDict({"a": {"b": {"c": np.int64}}, "v": Tensor(shape=(None, 2), dtype=np.float32)})
    data = features.serialize_example({"a": {"b": {"c": 7}}, "v": np.zeros((0, 2), np.float32)})
    assert data == example(entry("a/b/c", int64_list(7)), entry("v", float_list()))
    assert example_pb2.Example.FromString(data).features.feature["v"].WhichOneof("kind") == "float_list"


def test_a_dynamic_zlib_tensor_stores_its_shape_and_compressed_bytes():
    import zlib
    features = FeaturesDict({"m": Tensor(shape=(None, None), dtype=np.int32, encoding="zlib")})
    value = np.arange(6, dtype=np.int32).reshape(2, 3)
    data = features.serialize_example({"m": value})
    assert data == example(entry("m/shape", int64_list(2, 3)),
                           entry("m/value", bytes_list(zlib.compress(value.tobytes()))))
    np.testing.assert_array_equal(features.deserialize_example(data)["m"], value)


# --- round trips -----------------------------------------------------------------------------------

def test_scalars_decode_to_numpy_scalars_of_the_features_dtype():
    features = FeaturesDict({"i8": np.int8, "u64": "uint64", "b": bool, "f": float, "f32": np.float32,
                             "i": int, "s": "string", "label": ClassLabel(num_classes=3), "t": Text()})
    out = roundtrip(features, {"i8": -128, "u64": 2 ** 64 - 1, "b": 1, "f": 0.1, "f32": 2.5, "i": 2 ** 40,
                               "s": "str", "label": 2, "t": b"raw \xff"})
    expected = {"b": np.True_, "f": np.float64(np.float32(0.1)), "f32": np.float32(2.5), "i": np.int64(2 ** 40),
                "i8": np.int8(-128), "label": np.int64(2), "s": b"str", "t": b"raw \xff",
                "u64": np.uint64(2 ** 64 - 1)}
    assert list(out) == sorted(expected)
    for key, value in expected.items():
        assert type(out[key]) is type(value), key
        assert out[key] == value, key


def test_tensors_keep_shape_and_dtype_and_one_unknown_dimension_is_resolved():
    features = FeaturesDict({
        "fixed": Tensor(shape=(2, 3), dtype=np.uint8),
        "rows": Tensor(shape=(None, 3), dtype=np.float32),
        "middle": Tensor(shape=(2, None), dtype=np.int64),
        "strings": Tensor(shape=(None,), dtype=np.bytes_),
        "bools": Tensor(shape=(4,), dtype=np.bool_),
    })
    value = {"fixed": np.arange(6, dtype=np.uint8).reshape(2, 3), "rows": np.ones((5, 3), np.float32),
             "middle": [[1, 2, 3], [4, 5, 6]], "strings": ["x", b"y"], "bools": [True, False, True, True]}
    out = roundtrip(features, value)
    np.testing.assert_array_equal(out["fixed"], value["fixed"])
    assert out["rows"].shape == (5, 3) and out["rows"].dtype == np.float32
    np.testing.assert_array_equal(out["middle"], np.array([[1, 2, 3], [4, 5, 6]]))
    assert out["strings"].dtype == object and out["strings"].tolist() == [b"x", b"y"]
    assert out["bools"].dtype == np.bool_ and out["bools"].tolist() == [True, False, True, True]
    empty = roundtrip(features, {**value, "rows": np.zeros((0, 3), np.float32), "strings": []})
    assert empty["rows"].shape == (0, 3) and empty["strings"].shape == (0,)


def test_float64_is_stored_as_float32_as_tfds_does():
    out = roundtrip(FeaturesDict({"x": Tensor(shape=(2,), dtype=np.float64)}), {"x": np.array([0.1, 1e-50])})
    assert out["x"].dtype == np.float64
    assert out["x"].tolist() == [float(np.float32(0.1)), 0.0]


def test_raw_byte_encodings_round_trip_any_shape():
    features = FeaturesDict({"b": Tensor(shape=(3,), dtype=np.float32, encoding="bytes"),
                             "z": Tensor(shape=(None, 2, None), dtype=np.uint16, encoding="zlib"),
                             "s": Tensor(shape=(), dtype=np.int16, encoding="bytes")})
    value = {"b": np.array([1, 2, 3], np.float32), "z": np.arange(12, dtype=np.uint16).reshape(3, 2, 2),
             "s": np.int16(-4)}
    out = roundtrip(features, value)
    np.testing.assert_array_equal(out["b"], value["b"])
    np.testing.assert_array_equal(out["z"], value["z"])
    assert out["s"] == np.int16(-4) and type(out["s"]) is np.int16


def test_nested_plain_dicts_become_features_dicts_and_decode_with_sorted_keys():
    features = FeaturesDict({"z": np.int64, "outer": {"y": Text(), "inner": {"b": np.float32, "a": np.int64}}})
    assert isinstance(features["outer"], FeaturesDict) and isinstance(features["outer"]["inner"], FeaturesDict)
    out = roundtrip(features, {"z": 1, "outer": {"y": "why", "inner": {"b": 0.5, "a": 3}}})
    assert out == {"outer": {"inner": {"a": 3, "b": 0.5}, "y": b"why"}, "z": 1}
    assert list(out) == ["outer", "z"] and list(out["outer"]["inner"]) == ["a", "b"]


def test_class_labels_by_name_number_bytes_and_minus_one():
    label = ClassLabel(names=["cat", "dog", "bird"])
    features = FeaturesDict({"label": label})
    decoded = [roundtrip(features, {"label": v})["label"] for v in ("bird", b"dog", 0, np.int32(2), -1)]
    assert decoded == [2, 1, 0, 2, -1]
    assert label.names == ["cat", "dog", "bird"] and label.num_classes == 3
    assert label.str2int("dog") == 1 and label.int2str(2) == "bird"
    numbered = ClassLabel(num_classes=4)
    assert numbered.names == ["0", "1", "2", "3"] and numbered.str2int("3") == 3 and numbered.int2str(1) == "1"


def test_class_label_names_file(tmp_path):
    path = tmp_path / "names.txt"
    path.write_text("alpha\n  beta \n\ngamma\n")
    assert ClassLabel(names_file=path).names == ["alpha", "beta", "gamma"]


def test_text_is_stored_as_utf8_and_decodes_to_bytes():
    features = FeaturesDict({"t": Text()})
    assert roundtrip(features, {"t": "日本語 é"})["t"] == "日本語 é".encode()
    assert roundtrip(features, {"t": ""})["t"] == b""


def test_an_optional_value_may_be_none_and_reads_back_as_tfds_default():
    features = FeaturesDict({"maybe": Tensor(shape=(), dtype=np.int32, optional=True),
                             "text": Text(optional=True)})
    data = features.serialize_example({"maybe": None, "text": None})
    assert data == example()  # absent values are left out
    out = features.deserialize_example(data)
    assert out == {"maybe": np.iinfo(np.int32).min, "text": b""} and type(out["maybe"]) is np.int32
    assert roundtrip(features, {"maybe": 5, "text": "x"}) == {"maybe": 5, "text": b"x"}


def test_a_features_dict_pickles_and_decodes_after_unpickling():
    features = FeaturesDict({"x": Tensor(shape=(None,), dtype=np.int64), "t": Text()})
    data = features.serialize_example({"x": [1, 2, 3], "t": "a"})
    features.deserialize_example(data)  # builds the parse plan, which is not pickled
    clone = pickle.loads(pickle.dumps(features))
    out = clone.deserialize_example(data)
    assert out["t"] == b"a" and out["x"].tolist() == [1, 2, 3]


# --- images ----------------------------------------------------------------------------------------

def encoded_png(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    PILImage.fromarray(array).save(buffer, format="PNG")
    return buffer.getvalue()


def test_png_images_round_trip_exactly_for_every_channel_count():
    rng = np.random.default_rng(0)
    for channels in (1, 2, 3, 4):
        feature = Image(shape=(None, None, channels))
        image = rng.integers(0, 256, (7, 5, channels), dtype=np.uint8)
        data = feature.encode_example(image)
        assert data[:8] == b"\x89PNG\r\n\x1a\n"
        out = roundtrip(FeaturesDict({"image": feature}), {"image": image})["image"]
        assert out.dtype == np.uint8 and out.shape == (7, 5, channels)
        np.testing.assert_array_equal(out, image)


def test_jpeg_images_are_lossy_but_close():
    features = FeaturesDict({"image": Image(shape=(16, 16, 3), encoding_format="jpeg")})
    image = np.zeros((16, 16, 3), np.uint8)
    image[:, :8] = (200, 40, 90)
    image[:, 8:] = (10, 220, 30)
    data = features.serialize_example({"image": image})
    feature = example_pb2.Example.FromString(data).features.feature["image"]
    assert feature.bytes_list.value[0][:2] == b"\xff\xd8"
    out = features.deserialize_example(data)["image"]
    assert out.shape == (16, 16, 3) and out.dtype == np.uint8
    assert np.abs(out.astype(int) - image).mean() < 6


def test_uint16_and_float32_single_channel_images():
    depth = np.arange(20, dtype=np.uint16).reshape(4, 5, 1) * 3000
    heat = np.linspace(-1e3, 1e3, 6, dtype=np.float32).reshape(3, 2, 1)
    features = FeaturesDict({"depth": Image(shape=(4, 5, 1), dtype=np.uint16),
                             "heat": Image(shape=(None, None, 1), dtype="float32")})
    out = roundtrip(features, {"depth": depth, "heat": heat})
    assert out["depth"].dtype == np.uint16 and out["heat"].dtype == np.float32
    np.testing.assert_array_equal(out["depth"], depth)
    np.testing.assert_array_equal(out["heat"], heat)


def test_images_from_paths_bytes_file_objects_and_pil_images(tmp_path):
    image = np.random.default_rng(1).integers(0, 256, (4, 6, 3), dtype=np.uint8)
    path = tmp_path / "pic.png"
    PILImage.fromarray(image).save(path)
    feature = Image()
    features = FeaturesDict({"image": feature})
    for source in (str(path), path, path.read_bytes(), io.BytesIO(path.read_bytes()), PILImage.fromarray(image)):
        np.testing.assert_array_equal(roundtrip(features, {"image": source})["image"], image)
    # A file's bytes are stored as they are, not re-encoded.
    assert feature.encode_example(str(path)) == path.read_bytes()


def test_a_grey_file_decodes_to_the_features_channels():
    grey = np.arange(12, dtype=np.uint8).reshape(3, 4) * 20
    out = roundtrip(FeaturesDict({"image": Image()}), {"image": encoded_png(grey)})["image"]
    assert out.shape == (3, 4, 3)
    for channel in range(3):
        np.testing.assert_array_equal(out[..., channel], grey)
    as_is = roundtrip(FeaturesDict({"image": Image(shape=(None, None, None))}), {"image": encoded_png(grey)})
    assert as_is["image"].shape == (3, 4, 1)


def test_image_without_pillow_says_what_to_install():
    code = textwrap.dedent("""
        import sys
        sys.modules["PIL"] = None  # makes `import PIL` fail, as when Pillow is not installed
        import numpy as np
        from dataservice.catalogue.features import FeaturesDict, Image
        features = FeaturesDict({"image": Image(shape=(2, 2, 3))})
        features.to_json(), features.element_spec  # describing an Image needs no Pillow
        for action in (lambda: features.serialize_example({"image": np.zeros((2, 2, 3), np.uint8)}),
                       lambda: features["image"].decode_example(b"\\x89PNG")):
            try:
                action()
            except ImportError as exc:
                print(exc)
            else:
                print("no ImportError")
        """)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    assert len(lines) == 2
    for line in lines:
        assert "pip install 'dataservice[images]'" in line and "Pillow" in line


# --- features.json -------------------------------------------------------------------------------

# What TFDS 4.9.10 writes (FeatureConnector.save_config) for SMALL_FEATURES, byte for byte.
TFDS_FEATURES_JSON = """{
    "featuresDict": {
        "features": {
            "digit": {
                "classLabel": {
                    "numClasses": "10"
                },
                "description": "a digit",
                "pythonClassName": "tensorflow_datasets.core.features.class_label_feature.ClassLabel"
            },
            "image": {
                "image": {
                    "dtype": "uint8",
                    "shape": {
                        "dimensions": [
                            "-1",
                            "-1",
                            "3"
                        ]
                    }
                },
                "pythonClassName": "tensorflow_datasets.core.features.image_feature.Image"
            },
            "label": {
                "classLabel": {
                    "numClasses": "2"
                },
                "pythonClassName": "tensorflow_datasets.core.features.class_label_feature.ClassLabel"
            },
            "meta": {
                "featuresDict": {
                    "features": {
                        "caption": {
                            "pythonClassName": "tensorflow_datasets.core.features.text_feature.Text",
                            "text": {}
                        },
                        "id": {
                            "pythonClassName": "tensorflow_datasets.core.features.tensor_feature.Tensor",
                            "tensor": {
                                "dtype": "int64",
                                "encoding": "none",
                                "shape": {}
                            }
                        },
                        "kind": {
                            "classLabel": {
                                "numClasses": "3"
                            },
                            "pythonClassName": "tensorflow_datasets.core.features.class_label_feature.ClassLabel"
                        }
                    }
                },
                "pythonClassName": "tensorflow_datasets.core.features.features_dict.FeaturesDict"
            },
            "points": {
                "pythonClassName": "tensorflow_datasets.core.features.tensor_feature.Tensor",
                "tensor": {
                    "dtype": "float32",
                    "encoding": "none",
                    "shape": {
                        "dimensions": [
                            "-1",
                            "3"
                        ]
                    }
                }
            }
        }
    },
    "pythonClassName": "tensorflow_datasets.core.features.features_dict.FeaturesDict"
}"""


def small_features() -> FeaturesDict:
    return FeaturesDict({
        "image": Image(shape=(None, None, 3)),
        "label": ClassLabel(names=["cat", "dog"]),
        "meta": {"id": np.int64, "caption": Text(), "kind": ClassLabel(names=["a", "b", "c"])},
        "points": Tensor(shape=(None, 3), dtype=np.float32),
        "digit": ClassLabel(num_classes=10, doc="a digit"),
    })


def test_features_json_and_labels_files_are_tfds_own(tmp_path):
    save_features(small_features(), tmp_path)
    assert sorted(os.listdir(tmp_path)) == ["features.json", "label.labels.txt", "meta-kind.labels.txt"]
    assert (tmp_path / "features.json").read_text() == TFDS_FEATURES_JSON
    assert (tmp_path / "label.labels.txt").read_text() == "cat\ndog\n"
    assert (tmp_path / "meta-kind.labels.txt").read_text() == "a\nb\nc\n"


def test_load_features_reads_tfds_json_with_label_names(tmp_path):
    (tmp_path / "features.json").write_text(TFDS_FEATURES_JSON)
    (tmp_path / "label.labels.txt").write_text("cat\ndog\n")
    (tmp_path / "meta-kind.labels.txt").write_text("a\nb\nc\n")
    features = load_features(tmp_path)
    assert features.to_json() == json.loads(TFDS_FEATURES_JSON)
    assert features["label"].names == ["cat", "dog"] and features["meta"]["kind"].names == ["a", "b", "c"]
    assert features["digit"].num_classes == 10 and features["digit"].doc.desc == "a digit"
    assert isinstance(features["meta"]["caption"], Text) and features["image"].shape == (None, None, 3)
    out = roundtrip(features, {"image": np.zeros((2, 2, 3), np.uint8), "label": "dog", "digit": 3,
                               "meta": {"id": 1, "caption": "c", "kind": "c"}, "points": [[1, 2, 3]]})
    assert out["label"] == 1 and out["meta"]["kind"] == 2


def test_every_kind_round_trips_through_json(tmp_path):
    features = FeaturesDict({
        "t": Tensor(shape=(None, 2), dtype=np.uint64, minimum=0, maximum=9),
        "z": Tensor(shape=(None, None), dtype=np.float16, encoding="zlib"),
        "o": Tensor(shape=(), dtype="string", optional=True),
        "s": Scalar(np.float32, doc=Documentation(desc="d", value_range="[0, 1]")),
        "c": ClassLabel(num_classes=5), "n": ClassLabel(),
        "x": Text(),
        "i": Image(shape=(8, 8, 1), encoding_format="png", use_colormap=True),
        "j": Image(shape=(None, None, 3), encoding_format="jpeg"),
        "e": FeaturesDict({}),
    }, doc="everything")
    save_features(features, tmp_path)
    back = load_features(tmp_path)
    assert back.to_json() == features.to_json()
    assert json.loads(json.dumps(features.to_json())) == features.to_json()
    assert type(back["s"]) is Scalar and back["s"].doc == Documentation("d", "[0, 1]")
    assert back["z"].encoding.value == "zlib" and back["o"].optional and back["n"].num_classes is None
    assert back["i"].use_colormap and back["j"].encoding_format == "jpeg"
    assert features.to_json()["featuresDict"]["features"]["t"]["tensor"] == {
        "shape": {"dimensions": ["-1", "2"]}, "dtype": "uint64", "encoding": "none", "minimum": "0", "maximum": "9"}


def test_nested_labels_file_names_follow_tfds(tmp_path):
    features = FeaturesDict({"a/b": ClassLabel(names=["x"]), "o": {"p": {"q": ClassLabel(names=["y"])}}})
    save_features(features, tmp_path)
    assert sorted(os.listdir(tmp_path)) == ["a.b.labels.txt", "features.json", "o-p-q.labels.txt"]
    back = load_features(tmp_path)
    assert back["a/b"].names == ["x"] and back["o"]["p"]["q"].names == ["y"]


def test_the_legacy_type_content_form_is_read():
    legacy = {"type": "tensorflow_datasets.core.features.features_dict.FeaturesDict", "content": {
        "x": {"type": "tensorflow_datasets.core.features.feature.Tensor",
              "content": {"shape": [None, 2], "dtype": "float32"}},
        "img": {"type": "tensorflow_datasets.core.features.image_feature.Image",
                "content": {"shape": [None, None, 3], "dtype": "uint8", "encoding_format": "png"}},
        "y": {"type": "tensorflow_datasets.core.features.class_label_feature.ClassLabel",
              "content": {"num_classes": 4}},
        "p": {"type": "tensorflow_datasets.core.features.tensor_feature.Tensor", "proto_cls":
              "tensorflow_datasets.TensorFeature", "content": {"shape": {"dimensions": ["3"]}, "dtype": "int32"}},
    }}
    features = features_from_json(legacy)
    assert features["x"].shape == (None, 2) and features["x"].dtype == np.float32
    assert features["img"].encoding_format == "png" and features["y"].num_classes == 4
    assert features["p"].shape == (3,) and features["p"].dtype == np.int32


def test_unreadable_features_json_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="Sequence.*does not support"):
        features_from_json({"pythonClassName": "tensorflow_datasets.core.features.sequence_feature.Sequence",
                            "sequence": {}})
    with pytest.raises(ValueError, match="unknown dtype 'complex64'"):
        features_from_json({"pythonClassName": "tensorflow_datasets.core.features.tensor_feature.Tensor",
                            "tensor": {"dtype": "complex64", "shape": {}}})
    with pytest.raises(FileNotFoundError, match="no features.json"):
        load_features(tmp_path)
    (tmp_path / "features.json").write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        load_features(tmp_path)
    (tmp_path / "features.json").write_text(json.dumps(ClassLabel(num_classes=2).to_json()))
    (tmp_path / "None.labels.txt").write_text("a\nb\nc\n")  # TFDS's name for a root ClassLabel's file
    with pytest.raises(ValueError, match="3 class names for num_classes=2"):
        load_features(tmp_path)


# --- element spec ----------------------------------------------------------------------------------

def test_element_spec_is_sorted_tensor_specs():
    assert small_features().element_spec == {
        "digit": TensorSpec((), np.int64),
        "image": TensorSpec((None, None, 3), np.uint8),
        "label": TensorSpec((), np.int64),
        "meta": {"caption": TensorSpec((), specs.string), "id": TensorSpec((), np.int64),
                 "kind": TensorSpec((), np.int64)},
        "points": TensorSpec((None, 3), np.float32),
    }
    assert list(small_features().element_spec) == ["digit", "image", "label", "meta", "points"]


def test_decoded_examples_match_the_element_spec():
    features = small_features()
    out = roundtrip(features, {"image": np.zeros((3, 2, 3), np.uint8), "label": 0, "digit": 9,
                               "meta": {"id": 4, "caption": "c", "kind": "a"}, "points": np.ones((4, 3), np.float32)})
    flat_specs = [features.element_spec["image"], features.element_spec["points"], features.element_spec["meta"]["id"]]
    for spec, value in zip(flat_specs, [out["image"], out["points"], out["meta"]["id"]]):
        assert spec.is_compatible_with(value)


# --- bad values ------------------------------------------------------------------------------------

def bad(features, value, error, match):
    with pytest.raises(error, match=match):
        features.serialize_example(value)


def test_bad_values_name_the_feature_and_the_problem():
    features = FeaturesDict({
        "label": ClassLabel(names=["cat", "dog"]),
        "meta": {"id": np.int64, "vec": Tensor(shape=(None, 3), dtype=np.float32)},
        "text": Text(),
        "image": Image(shape=(4, 4, 3)),
    })
    good = {"label": "cat", "meta": {"id": 1, "vec": np.zeros((2, 3), np.float32)}, "text": "t",
            "image": np.zeros((4, 4, 3), np.uint8)}
    features.serialize_example(good)

    def with_(path, value):
        changed = {**good, "meta": dict(good["meta"])}
        if "/" in path:
            changed["meta"][path.split("/")[1]] = value
        else:
            changed[path] = value
        return changed

    bad(features, with_("label", "zebra"), ValueError,
        r"feature 'label': unknown class name 'zebra'; .*\['cat', 'dog'\]")
    bad(features, with_("label", 2), ValueError, r"feature 'label': label 2 is not in \[-1, 2\)")
    bad(features, with_("label", 1.0), TypeError, "feature 'label' is a class label")
    bad(features, with_("meta/id", 1.5), TypeError, "feature 'meta/id' has dtype int64, got floating-point")
    bad(features, with_("meta/id", "7"), TypeError, "feature 'meta/id' has dtype int64, got a string")
    bad(features, with_("meta/id", [1, 2]), ValueError,
        r"feature 'meta/id' has shape \(\), got a value of shape \(2,\)")
    bad(features, with_("meta/vec", np.zeros((2, 3))), TypeError,
        "feature 'meta/vec' has dtype float32, got an array of float64")
    bad(features, with_("meta/vec", np.zeros((2, 4), np.float32)), ValueError,
        r"feature 'meta/vec' has shape \(None, 3\), got a value of shape \(2, 4\)")
    bad(features, with_("meta/id", None), TypeError, "feature 'meta/id' got None, but it is not optional")
    bad(features, with_("text", 5), TypeError, "feature 'text' is text")
    bad(features, with_("image", np.zeros((4, 4, 3), np.float32)), TypeError, "feature 'image' is an image of uint8")
    bad(features, with_("image", np.zeros((4, 5, 3), np.uint8)), ValueError,
        r"feature 'image' is an image of shape \(4, 4, 3\), got an array of shape \(4, 5, 3\)")
    bad(features, with_("image", "/no/such/file.png"), FileNotFoundError, "feature 'image': cannot read the image file")
    bad(features, {k: v for k, v in good.items() if k != "text"}, ValueError, r"missing \['text'\]")
    bad(features, {**good, "meta": {**good["meta"], "extra": 1}}, ValueError, r"in feature 'meta': unknown \['extra'\]")
    bad(features, with_("meta", 3), TypeError, "feature 'meta' is a dict of features")
    bad(FeaturesDict({"u": np.uint8}), {"u": 300}, ValueError, "feature 'u' has dtype uint8: cannot hold 300")
    bad(FeaturesDict({"m": Tensor(shape=(None, None), dtype=np.int64)}), {"m": [[1]]}, ValueError,
        "needs Tensor.*encoding='zlib'")


def test_bad_feature_definitions_are_refused():
    with pytest.raises(ValueError, match="one of num_classes, names and names_file"):
        ClassLabel(num_classes=2, names=["a", "b"])
    with pytest.raises(ValueError, match="duplicated: \\['a'\\]"):
        ClassLabel(names=["a", "b", "a"])
    with pytest.raises(ValueError, match="encoding_format must be 'png', 'jpeg' or None"):
        Image(encoding_format="gif")
    with pytest.raises(ValueError, match="jpeg images have \\(0, 1, 3\\) channels"):
        Image(shape=(None, None, 4), encoding_format="jpeg")
    with pytest.raises(ValueError, match="must have one channel"):
        Image(dtype=np.uint16)
    with pytest.raises(TypeError, match="cannot be stored in a tf.train.Example"):
        Tensor(shape=(), dtype=np.complex64)
    with pytest.raises(TypeError, match="feature 'x': not a feature: 3"):
        FeaturesDict({"x": 3})
    with pytest.raises(ValueError, match="encoding must be one of"):
        Tensor(shape=(), dtype=np.int64, encoding="gzip")
    with pytest.raises(ValueError, match="two features flatten to the same Example key .a/b."):
        FeaturesDict({"a/b": np.int64, "a": {"b": np.int64}}).serialize_example({"a/b": 1, "a": {"b": 2}})
    with pytest.raises(ValueError, match="neither num_classes nor names"):
        FeaturesDict({"c": ClassLabel()}).serialize_example({"c": 0})


def test_dtypes_given_every_way():
    assert [to_feature(d).dtype for d in ("int64", int, float, bool, np.float32, np.dtype("uint8"))] == [
        np.int64, np.int64, np.float64, np.bool_, np.float32, np.uint8]
    assert {to_feature(d).dtype for d in (str, bytes, "string", np.str_, np.bytes_, object, specs.string)} == {
        np.dtype(object)}


# --- records that do not match the features --------------------------------------------------------

def test_records_that_do_not_match_raise_data_loss_naming_the_key():
    features = FeaturesDict({"n": np.int64, "v": Tensor(shape=(None, 2), dtype=np.float32),
                             "m": Tensor(shape=(2,), dtype=np.int64)})
    good = features.serialize_example({"n": 1, "v": np.zeros((1, 2), np.float32), "m": [1, 2]})

    def variant(change):
        message = example_pb2.Example.FromString(good)
        change(message.features.feature)
        return message.SerializeToString()

    cases = [
        (variant(lambda f: f.pop("n")), "key 'n' .*required but the Example does not have it"),
        (variant(lambda f: f["n"].Clear()), "key 'n' .*required"),
        (variant(lambda f: (f["n"].Clear(), f["n"].float_list.value.append(1.0))), "key 'n' .*holds a float list"),
        (variant(lambda f: f["n"].int64_list.value.append(2)), "key 'n' .*expected 1 value, got 2"),
        (variant(lambda f: f["m"].int64_list.value.append(3)), "key 'm' .*expected 2 values, got 3"),
        (variant(lambda f: f["v"].float_list.value.append(3.0)), "key 'v' .*got 3 values, not a multiple of 2"),
        (b"\xff\xff\xff", "not a serialized tf.train.Example"),
    ]
    for data, match in cases:
        with pytest.raises(DataLossError, match=match):
            features.deserialize_example(data)
    # As TensorFlow parses TFDS's specs: a shape with a None dimension reads an absent key as
    # empty, and keys that are not features are ignored.
    out = features.deserialize_example(variant(lambda f: (f.pop("v"), f["other"].int64_list.value.append(1))))
    assert out["v"].shape == (0, 2)


def test_codec_parses_by_wire_specs():
    specs_ = {"a": example_codec.WireSpec((2,), np.dtype(np.int8)),
              "b": example_codec.WireSpec((), np.dtype(object))}
    data = example_codec.serialize({"a": np.array([1, -1], np.int8), "b": "x"}, specs_)
    parsed = example_codec.Parser(specs_).parse(data)
    assert parsed["a"].dtype == np.int8 and parsed["a"].tolist() == [1, -1] and parsed["b"] == b"x"
