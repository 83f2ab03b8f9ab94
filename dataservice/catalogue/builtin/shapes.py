"""``shapes``: a small image-classification dataset drawn on the spot, identical on every machine.

Each example is a 28x28x1 ``uint8`` image of one filled shape — a circle, a square or a triangle
(the ``label``, a ``ClassLabel``) — at a position, size and brightness derived from the SHA-256 of
``"<split>/<index>"``, on a dark background with a faint speckle. Drawing needs only numpy; the
images are stored as PNG (Pillow, the ``images`` extra). No download: it prepares offline, in a
few seconds, which makes it the catalogue's example and test dataset.

Splits: ``train`` 6,000 examples, ``test`` 1,000 (classes balanced to within a few percent).

Example::

    >>> ds = load("shapes", split="train[:10%]", as_supervised=True)
    >>> image, label = next(iter(ds))
    >>> image.shape, image.dtype
    ((28, 28, 1), dtype('uint8'))
"""

from __future__ import annotations

import hashlib
from typing import Iterator

import numpy as np

from dataservice.catalogue.builders import GeneratorBasedBuilder
from dataservice.catalogue.dataset_info import DatasetInfo
from dataservice.catalogue.downloads import DownloadManager
from dataservice.catalogue.features import ClassLabel, FeaturesDict, Image
from dataservice.catalogue.versions import Version

__all__ = ["Shapes", "draw"]

SIZE = 28
CLASSES = ("circle", "square", "triangle")
_Y, _X = np.mgrid[0:SIZE, 0:SIZE].astype(np.float32) + 0.5


def draw(split: str, index: int) -> tuple[np.ndarray, int]:
    """The image and label of example ``index`` of ``split``: a pure function of the two."""
    digest = hashlib.sha256(f"{split}/{index}".encode()).digest()
    label = digest[0] % 3
    radius = 5.0 + digest[1] % 6                       # 5..10 pixels
    cx = radius + 1 + digest[2] / 255 * (SIZE - 2 * radius - 2)
    cy = radius + 1 + digest[3] / 255 * (SIZE - 2 * radius - 2)
    brightness = 150 + digest[4] % 106                 # 150..255
    if label == 0:
        inside = (_X - cx) ** 2 + (_Y - cy) ** 2 <= radius ** 2
    elif label == 1:
        inside = (np.abs(_X - cx) <= radius * 0.85) & (np.abs(_Y - cy) <= radius * 0.85)
    else:  # an upward triangle: below the two slanted edges, above the base
        top, base = cy - radius, cy + radius * 0.8
        half_width = (_Y - top) / (base - top) * radius
        inside = (_Y >= top) & (_Y <= base) & (np.abs(_X - cx) <= half_width)
    speckle = np.frombuffer(hashlib.shake_128(digest).digest(SIZE * SIZE), dtype=np.uint8).reshape(SIZE, SIZE) % 24
    image = np.where(inside, np.uint8(brightness), speckle).astype(np.uint8)
    return image[:, :, None], label


class Shapes(GeneratorBasedBuilder):
    """Circles, squares and triangles, 28x28 grayscale; see the module docstring."""

    VERSION = Version("1.0.0")
    RELEASE_NOTES = {"1.0.0": "First release."}
    SPLIT_SIZES = {"train": 6000, "test": 1000}

    def _info(self) -> DatasetInfo:
        return DatasetInfo(
            builder=self,
            description="28x28 grayscale images of one filled circle, square or triangle each, drawn "
                        "deterministically from the example's split and index.",
            features=FeaturesDict({"image": Image(shape=(SIZE, SIZE, 1)), "label": ClassLabel(names=list(CLASSES))}),
            supervised_keys=("image", "label"),
        )

    def _split_generators(self, dl_manager: DownloadManager) -> dict:
        return {split: self._generate_examples(split, n) for split, n in self.SPLIT_SIZES.items()}

    def _generate_examples(self, split: str, n: int) -> Iterator[tuple[str, dict]]:
        for index in range(n):
            image, label = draw(split, index)
            yield f"{split}_{index:05d}", {"image": image, "label": label}
