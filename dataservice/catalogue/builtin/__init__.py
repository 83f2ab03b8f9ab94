"""Builders that ship with dataservice: each prepares its data on a machine with no internet access.

- ``shapes``: 28x28 grayscale images of circles, squares and triangles, drawn deterministically.
"""

from dataservice.catalogue.builtin.shapes import Shapes

__all__ = ["Shapes"]
