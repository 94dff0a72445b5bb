# keydispenser: `make up` runs the whole stack, `make test` runs the whole suite.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
TEST_STAMP := $(VENV)/.installed-test

.PHONY: up test mutants lint typecheck check clean image

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# The Python client is its own distribution (clients/python): `bench client` runs it.
CLIENT := clients/python

$(STAMP): pyproject.toml $(CLIENT)/pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e '.[ops]' -e $(CLIENT)
	touch $@

$(TEST_STAMP): pyproject.toml $(CLIENT)/pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e '.[ops,test]' -e $(CLIENT)
	touch $@ $(STAMP)

up: $(STAMP)
	$(BIN)/keydispenser up

# Two workers, a test file each at a time (each worker has its own databases and Redis
# database): most tests wait on servers and processes, so the suite takes about half as long.
test: $(TEST_STAMP)
	$(BIN)/pytest -n 2 --dist loadfile

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

# The container image of every process (deploy/Dockerfile), tagged with the version.
VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
image:
	docker build -f deploy/Dockerfile -t keydispenser:$(VERSION) \
	  --build-arg BUILD_TIME="$$(date -u +%FT%TZ)" \
	  --build-arg GIT_COMMIT="$$(git rev-parse --short HEAD 2>/dev/null || echo unknown)" .

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache *.egg-info
