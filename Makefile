# keydispenser: `make up` runs the whole stack, `make test` runs the whole suite.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
TEST_STAMP := $(VENV)/.installed-test

.PHONY: up test model mutants lint typecheck check clean distclean image constraints dist

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# The Python client is its own distribution (clients/python): `bench client` runs it. So
# is the operator tooling (ops/: up, fill, bench, drill), plugged into the command line.
CLIENT := clients/python
OPS := ops

$(STAMP): pyproject.toml $(CLIENT)/pyproject.toml $(OPS)/pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e . -e $(CLIENT) -e $(OPS)
	touch $@

$(TEST_STAMP): pyproject.toml $(CLIENT)/pyproject.toml $(OPS)/pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e '.[test]' -e $(CLIENT) -e $(OPS)
	touch $@ $(STAMP)

# make up CONFIG=my-types.yaml ARGS="--port 8081": a configuration file, and options of
# `keydispenser up`.
up: $(STAMP)
	$(BIN)/keydispenser $(if $(CONFIG),--config $(CONFIG)) up $(ARGS)

# Two workers, a test file each at a time (each worker has its own databases and Redis
# database): most tests wait on servers and processes, so the suite takes about half as long.
# Then the failover drills, alone: they measure pauses and what each fault destroyed.
test: $(TEST_STAMP)
	$(BIN)/pytest -n 2 --dist loadfile -m "not drill"
	$(BIN)/pytest -m drill

# The ledger's protocol, model-checked with SPIN (part of `make test` too).
model: $(TEST_STAMP)
	$(BIN)/pytest -n 2 tests/model

# Break each guarantee's line in a scratch copy; fails when the tests miss one.
mutants: $(TEST_STAMP)
	$(BIN)/python -m tests.mutants

lint: $(TEST_STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports

typecheck: $(TEST_STAMP)
	$(BIN)/mypy

check: lint typecheck test

# The container image of every process (deploy/Dockerfile), tagged with the version,
# with docker or podman (ENGINE=podman to choose), whichever answers.
VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
ENGINE ?= $(shell for e in docker podman; do $$e info >/dev/null 2>&1 && { echo $$e; break; }; done)
image:
	@if [ -z "$(ENGINE)" ]; then \
	  echo "make image: no container engine answers (tried docker and podman)." >&2; \
	  echo "  Install Docker or Podman and start it (docker info must succeed), or build" >&2; \
	  echo "  elsewhere from this checkout: docker build -f deploy/Dockerfile ." >&2; \
	  exit 2; \
	fi
	$(ENGINE) build -f deploy/Dockerfile -t keydispenser:$(VERSION) \
	  --build-arg BUILD_TIME="$$(date -u +%FT%TZ)" \
	  --build-arg GIT_COMMIT="$$(git rev-parse --short HEAD 2>/dev/null || echo unknown)" .

# deploy/constraints.txt: the runtime's dependencies resolved now, pinned for the image.
constraints: | $(BIN)/python
	$(BIN)/pip install --quiet --dry-run --ignore-installed --report .constraints.json .
	$(BIN)/python -c "import json; pins = sorted(f\"{i['metadata']['name'].lower()}=={i['metadata']['version']}\" for i in json.load(open('.constraints.json'))['install'] if i['metadata']['name'] != 'keydispenser'); head = [l for l in open('deploy/constraints.txt') if l.startswith('#')]; open('deploy/constraints.txt', 'w').write(''.join(head) + '\\n'.join(pins) + '\\n')"
	rm -f .constraints.json

# The server's, the tooling's and the clients' wheels and sdists, checked as PyPI would
# (twine check).
dist: | $(BIN)/python
	$(BIN)/pip install --quiet build twine
	rm -rf dist
	$(BIN)/python -m build --outdir dist .
	$(BIN)/python -m build --outdir dist $(CLIENT)
	$(BIN)/python -m build --outdir dist $(OPS)
	$(BIN)/python -m build --outdir dist clients/leases
	$(BIN)/twine check --strict dist/*
	$(BIN)/python deploy/check_wheel.py dist/keydispenser-*.whl

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache *.egg-info dist

# Everything `make up` made: the stack's data (embedded servers, permutation key; refused
# while it runs), then the venv and caches.
distclean:
	if [ -x $(BIN)/keydispenser ]; then $(BIN)/keydispenser up --purge; fi
	$(MAKE) clean
