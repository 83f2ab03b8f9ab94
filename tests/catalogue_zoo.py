"""The ``zoo`` fixture dataset as a dataservice builder: the same examples and features as the TFDS
builder in ``tests/fixtures/make_catalogue_fixtures.py`` (``tests/fixtures/catalogue_examples.py``)."""

from __future__ import annotations

import os
import sys

import numpy as np

from dataservice.catalogue import ClassLabel, DatasetInfo, FeaturesDict, GeneratorBasedBuilder, Image, Tensor, Text
from dataservice.catalogue import Version

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures"))
import catalogue_examples as zoo_examples  # noqa: E402

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "catalogue")


class Zoo(GeneratorBasedBuilder):
    """Every feature kind; prepared by TFDS into fixtures/catalogue/tfds, by us into fixtures/catalogue/ours."""

    VERSION = Version("1.0.0")

    def _info(self) -> DatasetInfo:
        return DatasetInfo(
            builder=self,
            description="Every feature kind, for dataservice's TFDS-compatibility tests.",
            features=FeaturesDict({
                "id": Tensor(shape=(), dtype="string"),
                "image": Image(shape=(8, 8, 3)),
                "mask": Image(shape=(None, None, 1)),
                "photo": Image(shape=(16, 16, 3), encoding_format="jpeg"),
                "label": ClassLabel(names=zoo_examples.LABELS),
                "text": Text(),
                "score": Tensor(shape=(), dtype=np.float32),
                "flag": Tensor(shape=(), dtype=np.bool_),
                "vec": Tensor(shape=(3,), dtype=np.float32),
                "matrix": Tensor(shape=(2, 2), dtype=np.int32),
                "ragged": Tensor(shape=(None,), dtype=np.int64),
                "meta": {"a": np.int64, "b": {"c": np.float32}},
            }),
            supervised_keys=("image", "label"),
        )

    def _split_generators(self, dl_manager):
        return {split: self._generate_examples(split, n) for split, n in zoo_examples.SPLITS.items()}

    def _generate_examples(self, split, n):
        for i in range(n):
            yield zoo_examples.key(split, i), zoo_examples.example(split, i)
