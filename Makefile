# `make serve` and `make test` bootstrap their own .venv from a fresh clone.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
PROFILE ?= cpu

.PHONY: serve test lint bench clean

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

test: $(BIN)/.installed-dev
	$(BIN)/ruff check app engines tests bench
	$(BIN)/mypy
	$(BIN)/pytest -q

lint: $(BIN)/.installed-dev
	$(BIN)/ruff check app engines tests bench
	$(BIN)/mypy

bench: $(BIN)/.installed-dev
	$(BIN)/python -m bench.run

clean:
	rm -rf $(VENV) var .pytest_cache .mypy_cache .ruff_cache
