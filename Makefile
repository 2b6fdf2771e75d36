# `make serve` and `make test` bootstrap their own .venv from a fresh clone.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
PROFILE ?= cpu

.PHONY: serve test check lint bench docs clean uvicorn-floor

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e .
	touch $@

# The suite covers the Ray Serve mode too, so the dev install carries the ray extra; `make serve`
# stays on the light base install.
$(BIN)/.installed-dev: $(BIN)/.installed
	$(BIN)/pip install --quiet -e '.[dev,ray]'
	touch $@

serve: $(BIN)/.installed
	$(BIN)/voxmux serve --profile $(PROFILE)

# One process by default (what .ci/run runs). TEST_WORKERS=2 runs pytest-xdist workers, a test
# module to a worker at a time (tests/conftest.py says how): faster here, but some listening
# and timing tests fail under the contention (docs/development.md).
TEST_WORKERS ?= 1
test: $(BIN)/.installed-dev
	$(BIN)/ruff check app engines tests bench
	$(BIN)/mypy
	$(BIN)/pytest -q $(if $(filter-out 1,$(TEST_WORKERS)),-n $(TEST_WORKERS))

# The edit-test loop: lint, types and the tests that run no engine, server or process (about
# half a minute here; tests/conftest.py's ENGINE_SIGNS says which). `make test` runs them all.
check: $(BIN)/.installed-dev
	$(BIN)/ruff check app engines tests bench
	$(BIN)/mypy
	$(BIN)/pytest -q --no-engines

lint: $(BIN)/.installed-dev
	$(BIN)/ruff check app engines tests bench
	$(BIN)/mypy

# app/http/connections.py subclasses uvicorn's private protocols: run its tests on the lowest
# uvicorn pyproject.toml allows. Only uvicorn is swapped (installed into var/uvicorn-floor, first
# on the path); everything else is the dev install's.
UVICORN_FLOOR = $(shell sed -n 's/.*"uvicorn\[standard\]>=\([0-9.]*\)".*/\1/p' pyproject.toml)
uvicorn-floor: $(BIN)/.installed-dev
	rm -rf var/uvicorn-floor
	$(BIN)/pip install --quiet --no-deps --target var/uvicorn-floor 'uvicorn==$(UVICORN_FLOOR)'
	PYTHONPATH=var/uvicorn-floor $(BIN)/python -c 'import uvicorn; print("uvicorn", uvicorn.__version__, uvicorn.__file__)'
	PYTHONPATH=var/uvicorn-floor $(BIN)/pytest -q -p no:cacheprovider \
		tests/app/http/test_uvicorn_range.py tests/app/http/test_connections.py

bench: $(BIN)/.installed-dev
	$(BIN)/python -m bench.run

# The docs/ pages as a site (MkDocs Material) in site/; strict: a broken link between pages, a
# missing anchor or a page left out of mkdocs.yml's nav fails the build.
docs: $(BIN)/.installed-dev
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

clean:
	rm -rf $(VENV) var .pytest_cache .mypy_cache .ruff_cache
