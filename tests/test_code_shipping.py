"""The user's own code reaches the workers by value; installed packages stay by reference.

The real-process tests build a user project in a temporary directory — a training
script, a module beside it and a package (helpers of helpers, a class, module
constants) — and read it through a dispatcher and workers started from ``/``, which
cannot import any of it, as in a container.
"""

from __future__ import annotations

import json
import linecache
import os
import re
import subprocess
import sys
import textwrap
import traceback
import types
from pathlib import Path

import pytest

import dataservice as ds
from dataservice import errors
from dataservice.data import code_shipping, shipped_source
from dataservice.data.environment import distribution_of, skew, versions
from dataservice.data.serialization import deserialize_dataset, serialize_dataset
from dataservice.proto import pipeline_pb2
from dataservice.service.dispatcher_client import DispatcherClient
from dataservice.service.remote_errors import original_exception
from tests.processes import Processes, Server

# --- the rule ----------------------------------------------------------------------------------


@pytest.fixture
def overrides():
    """ship_by_value / ship_by_reference change process-wide sets: leave them as found."""
    saved = set(code_shipping._by_value), set(code_shipping._by_reference)
    yield
    code_shipping._by_value.clear()
    code_shipping._by_value.update(saved[0])
    code_shipping._by_reference.clear()
    code_shipping._by_reference.update(saved[1])


def _module_from(tmp_path: Path, name: str, source: str) -> types.ModuleType:
    path = tmp_path / f"{name}.py"
    path.write_text(source)
    module = types.ModuleType(name)
    module.__file__ = str(path)
    exec(compile(source, str(path), "exec"), module.__dict__)
    return module


def test_installed_and_standard_library_modules_go_by_reference():
    import json as stdlib_json

    import numpy
    import grpc

    for module in (stdlib_json, numpy, grpc, ds, sys):
        assert not code_shipping.is_shipped_by_value(module), module.__name__


def test_a_module_beside_the_script_goes_by_value_unless_told_otherwise(tmp_path, overrides):
    mine = _module_from(tmp_path, "my_augment", "X = 1\n")
    assert code_shipping.is_shipped_by_value(mine)
    ds.ship_by_reference("my_augment")
    assert not code_shipping.is_shipped_by_value(mine)
    ds.ship_by_value(mine)  # a module object works too
    assert code_shipping.is_shipped_by_value(mine)


def test_a_package_name_covers_its_submodules(tmp_path, overrides):
    sub = _module_from(tmp_path, "my_pkg_geometry", "Y = 2\n")
    sub.__name__ = "my_pkg.geometry"
    ds.ship_by_reference("my_pkg")
    assert not code_shipping.is_shipped_by_value(sub)
    ds.ship_by_value("my_pkg.geometry")  # the innermost name wins
    assert code_shipping.is_shipped_by_value(sub)


def test_ship_by_value_rejects_what_is_not_a_module_name(overrides):
    with pytest.raises(TypeError, match="dotted module names"):
        ds.ship_by_value(".relative")
    with pytest.raises(TypeError, match="dotted module names"):
        ds.ship_by_reference(3)


@pytest.mark.skipif(sys.version_info < (3, 11), reason="3.10's packages_distributions also counts non-.py files")
def test_installed_top_level_names_are_those_importlib_finds():
    # The lean reading (without each distribution's METADATA or a path object per file) finds what
    # importlib.metadata.packages_distributions() finds, in this environment with its mix of
    # top_level.txt and RECORD-only distributions.
    import importlib.metadata

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(code_shipping.CACHE_DIR_ENV, "")  # read the distributions, not what a process kept
        assert code_shipping._installed_top_levels.__wrapped__() == frozenset(
            importlib.metadata.packages_distributions())


def test_record_rows_are_read_by_their_path_whether_quoted_or_not(tmp_path):
    # The fast path finds ".py," in an unquoted RECORD; a quoted path (a comma in a file name) goes
    # through the csv module. Both give a package's first part and a module's name.
    import importlib.metadata

    def tops(record: str) -> set:
        info = tmp_path / "lib-0.1.dist-info"
        info.mkdir(exist_ok=True)
        (info / "RECORD").write_text(record)
        return set(code_shipping._top_level_names(importlib.metadata.PathDistribution(info)))

    plain = ("pkg/__init__.py,sha256=abc,6\r\nmod.py,,\npkg/icons/a.svg,sha256=def,9\n"
             "pkg/__pycache__/x.cpython-311.pyc,,\nlib-0.1.dist-info/RECORD,,\n")
    assert tops(plain) == {"pkg", "mod"}
    assert tops('"odd,dir/x.py",sha256=abc,6\nother.py,,\n"a,b.txt",,\n') == {"odd,dir", "other"}
    assert tops("data/only.json,,\n") == set()


@pytest.fixture
def fresh_installed_names():
    """The installed top-level names are cached per process: computed afresh in the test, and after it."""
    code_shipping._installed_top_levels.cache_clear()
    yield
    code_shipping._installed_top_levels.cache_clear()


def test_a_distribution_without_top_level_txt_on_the_path_goes_by_reference(tmp_path, monkeypatch,
                                                                           fresh_installed_names):
    # As `pip install --target DIR` on PYTHONPATH leaves a wheel whose dist-info has no top_level.txt:
    # the package and the module it installs are read from RECORD, so they are not shipped by value.
    import importlib

    site_dir = tmp_path / "target"
    (site_dir / "recordonlylib").mkdir(parents=True)
    (site_dir / "recordonlylib" / "__init__.py").write_text("X = 1\n")
    (site_dir / "recordonly_mod.py").write_text("Y = 2\n")
    info = site_dir / "recordonlylib-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: recordonlylib\nVersion: 0.1\n")
    (info / "RECORD").write_text("recordonlylib/__init__.py,sha256=abc,6\nrecordonly_mod.py,,\n"
                                 "recordonlylib-0.1.dist-info/METADATA,,\nrecordonlylib-0.1.dist-info/RECORD,,\n")
    beside = _module_from(tmp_path, "beside_the_target", "Z = 3\n")
    monkeypatch.syspath_prepend(str(site_dir))
    importlib.invalidate_caches()
    package = types.ModuleType("recordonlylib")
    package.__file__ = str(site_dir / "recordonlylib" / "__init__.py")
    module = types.ModuleType("recordonly_mod")
    module.__file__ = str(site_dir / "recordonly_mod.py")

    assert not code_shipping.is_shipped_by_value(package)
    assert not code_shipping.is_shipped_by_value(module)
    assert code_shipping.is_shipped_by_value(beside)  # the user's own module: no distribution provides it
    assert {"recordonlylib", "recordonly_mod"} <= code_shipping._installed_top_levels()
    assert "recordonlylib-0" not in code_shipping._installed_top_levels()


def _fake_distribution(site_dir: Path, name: str) -> None:
    """A wheel's dist-info (no top_level.txt) for module ``name``, as ``pip install --target`` leaves it."""
    (site_dir / f"{name}.py").write_text("X = 1\n")
    info = site_dir / f"{name}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    (info / "RECORD").write_text(f"{name}.py,,\n{name}-0.1.dist-info/METADATA,,\n{name}-0.1.dist-info/RECORD,,\n")


_PRINT_TOP_LEVELS = ("import importlib.metadata, json, sys\n"
                     "from dataservice.data import code_shipping\n"
                     "if sys.argv[1] == 'no-scan':\n"
                     "    def refuse(*args, **kwargs): raise AssertionError('read the distributions')\n"
                     "    importlib.metadata.distributions = refuse\n"
                     "print(json.dumps(sorted(code_shipping._installed_top_levels())))\n")


def test_the_installed_names_are_kept_for_the_next_process_until_a_distribution_comes(tmp_path):
    # The first distribute() of a process needs them, and reading 69 distributions took 10-16 ms of its
    # 30 ms to the first element: the next process reads them from the cache, while nothing was installed.
    site_dir = tmp_path / "target"
    site_dir.mkdir()
    _fake_distribution(site_dir, "firstlib")
    work_dir = tmp_path / "work"  # the processes' current directory, on their sys.path (python -c): left alone
    work_dir.mkdir()
    env = {**os.environ, code_shipping.CACHE_DIR_ENV: str(tmp_path / "cache"),
           "PYTHONPATH": os.pathsep.join([str(site_dir), str(Path(ds.__file__).parents[1])])}

    def top_levels(mode: str) -> list:
        result = subprocess.run([sys.executable, "-c", _PRINT_TOP_LEVELS, mode], capture_output=True, text=True,
                                env=env, cwd=str(work_dir), timeout=60)
        assert result.returncode == 0, result.stderr
        return json.loads(result.stdout)

    first = top_levels("scan")
    assert "firstlib" in first and "numpy" in first
    [cache_file] = (tmp_path / "cache").iterdir()
    assert json.loads(cache_file.read_text())["names"] == first
    assert top_levels("no-scan") == first  # the next process reads no distribution

    _fake_distribution(site_dir, "secondlib")  # installing one changes its directory: read them again
    second = top_levels("scan")
    assert set(second) == set(first) | {"secondlib"}
    assert top_levels("no-scan") == second
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [cache_file.name]  # one file, rewritten


def test_the_installed_names_are_right_without_a_cache(tmp_path, monkeypatch, fresh_installed_names):
    # Turned off (""), or a cache directory that cannot be made (a read-only home): each process reads the
    # distributions itself, and writes nothing.
    import importlib

    site_dir = tmp_path / "target"
    site_dir.mkdir()
    _fake_distribution(site_dir, "uncachedlib")
    monkeypatch.syspath_prepend(str(site_dir))
    importlib.invalidate_caches()
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    for setting in ("", str(blocker / "cache")):
        monkeypatch.setenv(code_shipping.CACHE_DIR_ENV, setting)
        code_shipping._installed_top_levels.cache_clear()
        assert "uncachedlib" in code_shipping._installed_top_levels()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file", "target"]


def test_a_torn_cache_file_is_read_past_and_written_again(tmp_path, monkeypatch, fresh_installed_names):
    monkeypatch.setenv(code_shipping.CACHE_DIR_ENV, str(tmp_path))
    path = Path(code_shipping._top_levels_cache_file())
    path.write_text('{"stamp": [["/x", 1]], "names": ["a", ')
    names = code_shipping._installed_top_levels()
    assert "numpy" in names
    assert json.loads(path.read_text())["names"] == sorted(names)


def test_versions_skew_rules():
    mine = versions()
    assert skew(mine, mine) == []
    assert skew({**mine, "python": "3.10.14"}, {**mine, "python": "3.11.7"}) == \
        ["python 3.10.14 (client) vs 3.11.7 (worker)"]
    assert skew({**mine, "python": "3.11.1"}, {**mine, "python": "3.11.7"}) == []  # a patch release loads
    assert skew({**mine, "numpy": "1.26.4"}, {**mine, "numpy": "2.4.6"}) == ["numpy 1.26.4 (client) vs 2.4.6 (worker)"]
    assert skew({**mine, "numpy": "2.3.0"}, {**mine, "numpy": "2.4.6"}) == []
    assert distribution_of("numpy.linalg")[0] == "numpy"
    assert distribution_of("no_such_module_anywhere") == ("", "")


def test_version_skew_is_reported_at_the_client_naming_both_versions(cluster):
    # A pipeline as a client with another Python would register it: the worker refuses it before unpickling.
    blob = serialize_dataset(ds.Dataset.range(3))
    definition = pipeline_pb2.PipelineDef.FromString(blob)
    definition.versions["python"] = "3.9.18"
    client = DispatcherClient(cluster.dispatcher_address, timeout_ms=5_000)
    try:
        dataset_id = client.register_dataset(definition.SerializeToString(deterministic=True), 1)
    finally:
        client.close()
    reader = ds.from_dataset_id("parallel_epochs", cluster.target, dataset_id, timeout_ms=10_000)
    with pytest.raises(errors.VersionSkewError) as info:
        list(reader)
    message = str(info.value)
    assert f"python 3.9.18 (client) vs {versions()['python']} (worker)" in message
    assert "python 3.9.18" in message and f"python {versions()['python']}" in message
    assert info.value.worker_address in {w.address for w in cluster.workers}
    assert info.value.client_versions["python"] == "3.9.18"
    assert info.value.worker_versions["python"] == versions()["python"]
    # The worker carries on with pipelines it can load.
    assert sorted(int(x) for x in ds.Dataset.range(3).apply(ds.distribute("distributed_epoch", cluster.target))) \
        == [0, 1, 2]


def test_serializing_a_pipeline_leaves_cloudpickles_registry_as_it_was(tmp_path, monkeypatch):
    import cloudpickle

    before = cloudpickle.list_registry_pickle_by_value()
    mine = _module_from(tmp_path, "registry_probe", "def f(x):\n    return x + 1\n")
    monkeypatch.setitem(sys.modules, "registry_probe", mine)
    blob = serialize_dataset(ds.Dataset.range(3).map(mine.f))
    assert cloudpickle.list_registry_pickle_by_value() == before
    assert "registry_probe" in pipeline_pb2.PipelineDef.FromString(blob).shipped_modules
    # By value: it loads with the module gone.
    monkeypatch.delitem(sys.modules, "registry_probe")
    assert [int(x) for x in deserialize_dataset(blob)] == [1, 2, 3]


def test_loaded_code_keeps_its_file_name_and_brings_its_source(tmp_path, monkeypatch):
    source = "def parse(x):\n    return {0: 'cat'}[int(x)]   # KeyError past 0\n"
    mine = _module_from(tmp_path, "traceback_probe", source)
    monkeypatch.setitem(sys.modules, "traceback_probe", mine)
    filename = mine.__file__
    blob = serialize_dataset(ds.Dataset.range(2).map(mine.parse))
    assert dict(pipeline_pb2.PipelineDef.FromString(blob).sources) == {filename: source}
    # A worker elsewhere: neither the module nor its file, nor anything linecache read of it.
    monkeypatch.delitem(sys.modules, "traceback_probe")
    os.remove(filename)
    linecache.clearcache()
    with pytest.raises(KeyError) as info:
        list(deserialize_dataset(blob))
    raised = original_exception(info.value)  # the user's own KeyError, as a worker reports it
    frames = [f for f in traceback.extract_tb(raised.__traceback__) if f.name == "parse"]
    assert [(f.filename, f.lineno, f.line) for f in frames] == \
        [(filename, 2, "return {0: 'cat'}[int(x)]   # KeyError past 0")]


def test_source_shipped_again_with_changes_replaces_the_old(tmp_path):
    filename = str(tmp_path / "gone.py")  # no such file here
    shipped_source.register_sources({filename: "a = 1\n"})
    assert linecache.getline(filename, 1) == "a = 1\n"
    shipped_source.register_sources({filename: "a = 2\n"})
    assert linecache.getline(filename, 1) == "a = 2\n"
    on_disk = tmp_path / "here.py"
    on_disk.write_text("b = 'from disk'\n")
    shipped_source.register_sources({str(on_disk): "b = 'shipped'\n"})
    assert linecache.getline(str(on_disk), 1) == "b = 'from disk'\n"  # a file of its own wins, as in Python


# --- a user project, in real processes ----------------------------------------------------------

PROJECT = {
    "augment.py": '''
        import numpy as np

        from prep import constants
        from prep.geometry import Scaler, rotate

        OFFSET = 1000  # a module constant of the module beside the script

        def augment(x):
            return int(rotate(x) + Scaler(constants.FACTOR).apply(x) + OFFSET)

        def parse_record(x):
            if x == 5:
                raise KeyError(f"bad record {x}")
            return x

        def make_pipeline():
            return ds_range(8).map(augment)

        def ds_range(n):
            import dataservice
            return dataservice.Dataset.range(n)
    ''',
    "prep/__init__.py": "",
    "prep/constants.py": "FACTOR = 3\nTURNS = 2\n",
    "prep/geometry.py": '''
        from prep.constants import TURNS

        def _turn(x):            # a helper of a helper
            return x * 10

        def rotate(x):
            for _ in range(TURNS):
                x = _turn(x)
            return x

        class Scaler:
            def __init__(self, k):
                self.k = k

            def apply(self, x):
                return x * self.k
    ''',
    "train.py": '''
        import json
        import sys

        import dataservice as ds
        from augment import augment, make_pipeline

        target, mode = sys.argv[1], sys.argv[2]
        expected = [int(x) for x in make_pipeline()]                  # here, locally
        dataset_id = ds.register_dataset(target, make_pipeline(), timeout_ms=30_000)
        read = make_pipeline().apply(ds.distribute(mode, target, timeout_ms=30_000))
        print(json.dumps({"dataset_id": dataset_id, "expected": expected, "read": sorted(int(x) for x in read)}))
    ''',
    "fail.py": '''
        import sys

        import dataservice as ds
        from augment import ds_range, parse_record

        list(ds_range(8).map(parse_record).apply(ds.distribute("parallel_epochs", sys.argv[1], timeout_ms=30_000)))
    ''',
    "needs_fancylib.py": '''
        import sys

        import dataservice as ds
        import fancylib

        try:
            list(ds.Dataset.range(3).map(fancylib.double).apply(
                ds.distribute("parallel_epochs", sys.argv[1], timeout_ms=30_000)))
        except ds.errors.MissingModuleError as exc:
            print(f"{type(exc).__name__}|{exc.module}|{exc.distribution}|{exc.worker_address}|{exc}")
    ''',
}


def _write_project(root: Path) -> Path:
    for name, source in PROJECT.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(source).lstrip())
    return root


def _install_fake_distribution(site_dir: Path) -> None:
    """An installed distribution, as pip leaves one: a package and its dist-info."""
    package = site_dir / "fancylib"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("def double(x):\n    return x * 2\n")
    info = site_dir / "fancylib-1.2.3.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fancylib\nVersion: 1.2.3\n")
    (info / "top_level.txt").write_text("fancylib\n")
    (info / "RECORD").write_text("fancylib/__init__.py,,\nfancylib-1.2.3.dist-info/METADATA,,\n")


def _clean_env() -> dict:
    """A user's shell: dataservice installed, nothing of the checkout or the project on the path."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONUNBUFFERED"] = "1"
    return env


@pytest.fixture(scope="module")
def project_cluster(tmp_path_factory):
    """A dispatcher and two workers started from ``/``, and the user's project elsewhere."""
    tmp = tmp_path_factory.mktemp("shipping")
    project = _write_project(tmp / "project")
    with Processes(tmp) as procs:
        env = _clean_env()
        dispatcher = procs.await_dispatcher(Server(procs.spawn(
            "-m", "dataservice", "dispatcher", "--port", "0", name="dispatcher", cwd=Path("/"), env=env), 0))
        workers = [Server(procs.spawn("-m", "dataservice", "worker", "--dispatcher", f"localhost:{dispatcher.port}",
                                      "--port", "0", "--worker-address", "localhost:%port%", name="worker",
                                      cwd=Path("/"), env=env), 0) for _ in range(2)]
        workers = [procs.await_worker(w) for w in workers]
        yield types.SimpleNamespace(tmp=tmp, project=project, dispatcher=dispatcher, workers=workers, env=env)


def _run(project_cluster, script: str, *args: str, env: dict | None = None, timeout_s: float = 90) \
        -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, script, *args], cwd=project_cluster.project, capture_output=True,
                          text=True, env=env or project_cluster.env, timeout=timeout_s)


def _train(project_cluster, mode: str) -> dict:
    result = _run(project_cluster, "train.py", project_cluster.dispatcher.target, mode)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["parallel_epochs", "distributed_epoch"])
def test_a_pipeline_in_the_users_modules_runs_on_workers_started_elsewhere(project_cluster, mode):
    out = _train(project_cluster, mode)
    # augment(x) = x * 100 (two turns of the helper's helper) + 3x (the class, the package constant) + 1000
    assert out["expected"] == [103 * x + 1000 for x in range(8)]
    copies = 2 if mode == "parallel_epochs" else 1  # two workers
    assert out["read"] == sorted(out["expected"] * copies)


@pytest.mark.slow
def test_the_dataset_id_covers_the_shipped_code(project_cluster):
    first = _train(project_cluster, "distributed_epoch")
    again = _train(project_cluster, "distributed_epoch")
    assert again["dataset_id"] == first["dataset_id"]  # the same code, another process: the same id

    geometry = project_cluster.project / "prep" / "geometry.py"
    original = geometry.read_text()
    geometry.write_text(original.replace("return x * 10", "return x * 20"))  # a helper of a helper changes
    try:
        changed = _train(project_cluster, "distributed_epoch")
    finally:
        geometry.write_text(original)
    assert changed["dataset_id"] != first["dataset_id"]
    # ... and the workers run the new code, not the pipeline they loaded before.
    assert changed["read"] == changed["expected"] == [403 * x + 1000 for x in range(8)]


@pytest.mark.slow
def test_a_package_the_workers_lack_is_named_with_the_fix(project_cluster):
    site_dir = project_cluster.tmp / "client-site-packages"
    if not site_dir.exists():
        _install_fake_distribution(site_dir)
    env = {**project_cluster.env, "PYTHONPATH": str(site_dir)}  # installed on the client only
    result = _run(project_cluster, "needs_fancylib.py", project_cluster.dispatcher.target, env=env)
    assert result.returncode == 0, result.stderr
    kind, module, distribution, worker, message = result.stdout.strip().splitlines()[-1].split("|", 4)
    assert (kind, module, distribution) == ("MissingModuleError", "fancylib", "fancylib")
    assert worker in {w.address for w in project_cluster.workers}
    assert f"worker {worker} does not have it" in message
    assert "install it on the workers (pip install 'fancylib==1.2.3')" in message


def _assert_the_users_frame_is_shown(project: Path, result: subprocess.CompletedProcess, workers: list) -> None:
    """fail.py's KeyError shows augment.py's file, line and source line at the client, and in the log
    of the worker that ran it, which has no copy of augment.py: the source travelled with the code."""
    assert result.returncode == 1, result.stderr
    augment = project / "augment.py"
    line = next(i for i, text in enumerate(augment.read_text().splitlines(), 1) if "raise KeyError" in text)
    frame, source = f'File "{augment}", line {line}, in parse_record', 'raise KeyError(f"bad record {x}")'
    assert frame in result.stderr and source in result.stderr, result.stderr
    assert re.search(r"^KeyError: 'bad record 5'$", result.stderr, re.M), result.stderr
    assert "Traceback on worker localhost:" in result.stderr
    assert "dataservice/" not in result.stderr.split("The above exception")[0]  # only the user's frames
    logs = [w.proc.stderr for w in workers]
    assert any(frame in log and source in log for log in logs), logs


@pytest.mark.slow
def test_a_remote_exception_shows_the_users_file_and_line(project_cluster):
    result = _run(project_cluster, "fail.py", project_cluster.dispatcher.target)
    _assert_the_users_frame_is_shown(project_cluster.project, result, project_cluster.workers)


def _oldest_allowed(distribution: str) -> str:
    """The lower bound pyproject.toml gives ``distribution`` (``"cloudpickle>=2.1"``: ``"2.1"``)."""
    text = (Path(__file__).resolve().parents[1] / "pyproject.toml").read_text()
    match = re.search(rf'"{re.escape(distribution)}>=([\w.]+)', text)
    assert match, f"pyproject.toml gives {distribution} no lower bound"
    return match.group(1)


def _release_on_path(distribution: str, version: str) -> Path:
    """A directory holding ``distribution==version`` alone, to put first on PYTHONPATH; installed once
    per virtualenv (beside its site-packages), from the package index pip is configured with."""
    target = Path(sys.prefix) / "releases" / f"{distribution}-{version}"
    if not target.exists():
        partial = target.with_name(target.name + f".partial-{os.getpid()}")
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-deps",
                        "--target", str(partial), f"{distribution}=={version}"], check=True, timeout=300)
        partial.rename(target)
    return target


@pytest.mark.slow
def test_a_remote_exception_shows_the_users_line_with_the_oldest_cloudpickle_allowed(tmp_path):
    # The newest is the locked one, which the test above runs with (and `make test-latest` with the newest
    # release). cloudpickle 3.1.3 dropped the file names of the code it ships; others may drop more.
    oldest = _oldest_allowed("cloudpickle")
    env = {**_clean_env(), "PYTHONPATH": str(_release_on_path("cloudpickle", oldest))}
    version = subprocess.run([sys.executable, "-c", "import cloudpickle; print(cloudpickle.__version__)"], env=env,
                             capture_output=True, text=True, timeout=60).stdout.strip()
    assert version.startswith(oldest), version
    project = _write_project(tmp_path / "project")
    with Processes(tmp_path) as procs:
        dispatcher = procs.await_dispatcher(Server(procs.spawn(
            "-m", "dataservice", "dispatcher", "--port", "0", name="dispatcher", cwd=Path("/"), env=env), 0))
        worker = procs.await_worker(Server(procs.spawn(
            "-m", "dataservice", "worker", "--dispatcher", f"localhost:{dispatcher.port}", "--port", "0",
            "--worker-address", "localhost:%port%", name="worker", cwd=Path("/"), env=env), 0))
        result = subprocess.run([sys.executable, "fail.py", dispatcher.target], cwd=project, capture_output=True,
                                text=True, env=env, timeout=90)
        _assert_the_users_frame_is_shown(project, result, [worker])
