"""The folders show the architecture: the pipeline library (``dataservice/data``) stands on its own.

A local pipeline imports nothing of the service's client: a distributed read's iterator carries its own
stats (``data/read_stats.py``), the client records into them.
"""

import ast
import pathlib

import pytest

import dataservice

pytestmark = pytest.mark.no_grpc

DATA = pathlib.Path(dataservice.__file__).parent / "data"


def _imports(path: pathlib.Path) -> list[str]:
    names = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.append(node.module)
            names += [f"{node.module}.{alias.name}" for alias in node.names]
    return names


def test_the_pipeline_library_imports_nothing_from_the_client():
    offenders = {str(path.relative_to(DATA)): [n for n in _imports(path) if n.startswith("dataservice.client")
                                               or n == "dataservice.client"]
                 for path in DATA.rglob("*.py")}
    assert {path: names for path, names in offenders.items() if names} == {}


def test_transformations_are_split_by_family():
    family = DATA / "transformations"
    assert {p.stem for p in family.glob("*.py")} >= {"per_element", "batching", "slicing", "reordering",
                                                       "combining", "windowing"}
    assert not (DATA / "transformations.py").exists()
