# Two commands on a fresh machine with only Python 3: `make demo` and `make test`.
# Both install the exact versions of requirements/lock.txt, so every machine runs what was tested.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
LOCK := requirements/lock.txt
# The lock as constraints: it pins what a target installs and adds nothing. No build isolation: the
# editable install is built by the venv's own setuptools, pinned too, not by whatever release is newest.
PIP_LOCKED = $(PY) -m pip install --quiet --disable-pip-version-check --no-build-isolation -c $(LOCK)
# `make test-latest` and `make lock`: the newest releases pyproject.toml allows, in a venv of their own.
LATEST ?= .venv-latest

.PHONY: demo test test-fast test-containers docs test-latest lock bench protos clean

$(VENV)/.tools: $(LOCK)
	@echo "Setting up $(VENV) with the versions of $(LOCK)"
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -c $(LOCK) pip setuptools
	touch $@

$(VENV)/.installed-demo: pyproject.toml $(LOCK) $(VENV)/.tools
	@echo "Installing what the demo needs: dataservice with numpy, cloudpickle, grpcio, protobuf, crc32c, lz4,"
	@echo "prometheus_client and Pillow (no PyTorch or JAX). The first time this takes about a minute."
	$(PIP_LOCKED) -e '.[images]'
	touch $@

$(VENV)/.installed-test: pyproject.toml $(LOCK) $(VENV)/.tools
	@echo "Installing dataservice and its test dependencies: pytest, Pillow, zstandard, grpcio-tools, and the CPU"
	@echo "builds of PyTorch and JAX (about 1.5 GB). The first time this takes a minute or two."
	$(PIP_LOCKED) -e '.[test]'
	touch $@

## demo: set up, start a local cluster, run the example training client against it
demo: $(VENV)/.installed-demo
	$(PY) -m client.demo

## test: set up, build the documentation site (make docs), and run the whole test suite
test: $(VENV)/.installed-test docs
	$(PY) -m pytest -q

## docs: build the documentation site (docs/, mkdocs.yml) into build/site with `mkdocs build --strict`: a broken
## link, a missing page or a docstring the API reference cannot read fails it
docs: $(VENV)/.installed-test
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict
	@echo "docs: built build/site (open build/site/index.html)"

## test-fast: skip the tests that start real subprocesses
test-fast: $(VENV)/.installed-test
	$(PY) -m pytest -q -m "not slow"

## test-containers: build the image, run docker-compose.yml on a real Docker engine, break it (a worker killed,
## the dispatcher restarted, the token rotated) and tear it down. Skips, saying why, where no engine can be
## started (`sudo deploy/install-docker.sh` installs one on Debian 12). CI runs it after `make test`.
test-containers: $(VENV)/.installed-test
	DATASERVICE_CONTAINER_TESTS=1 $(PY) -m pytest -q -x -rs -s tests/containers

# The newest releases, installed afresh each time: no lock, no build isolation pinned.
$(LATEST)/.installed:
	rm -rf $(LATEST)
	$(PYTHON) -m venv $(LATEST)
	$(LATEST)/bin/python -m pip install --quiet --disable-pip-version-check --upgrade pip setuptools
	$(LATEST)/bin/python -m pip install --quiet --disable-pip-version-check --upgrade --upgrade-strategy eager -e '.[test]'
	touch $@

## test-latest: the suite against the newest releases of every dependency (in .venv-latest; not run in CI)
test-latest:
	rm -rf $(LATEST)
	$(MAKE) $(LATEST)/.installed
	@echo "Releases that differ from $(LOCK) (< locked, > newest):"
	@$(LATEST)/bin/python -m pip freeze --all --exclude-editable | diff $(LOCK) - | grep '^[<>] [^#]' || echo "  none"
	$(LATEST)/bin/python -m pytest -q

## lock: write requirements/lock.txt from .venv-latest (`make test-latest && make lock` locks what passed)
lock: $(LATEST)/.installed
	{ sed -n '/^#/p' $(LOCK); $(LATEST)/bin/python -m pip freeze --all --exclude-editable; } > $(LOCK).new
	mv $(LOCK).new $(LOCK)
	@git diff --stat -- $(LOCK) 2>/dev/null || true

## bench: the performance benchmarks (not run in CI)
bench: $(VENV)/.installed-test
	$(PY) -m benchmarks.run

clean:
	rm -rf $(VENV) $(LATEST) build *.egg-info

## protos: regenerate dataservice/proto/ from protos/ (a test fails when it is stale)
protos: $(VENV)/.installed-test
	$(PY) protos/compile.py
