# Two commands on a fresh machine: `make demo` and `make test`. Both create .venv with pip if absent.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint bench clean image

# `make image`: the Containerfile's images, IMAGE:TAG and IMAGE:TAG-exporter, with podman, buildah or
# docker (the first that works; ENGINE=... picks one; PYTHON_IMAGE=... replaces the base). The defaults
# are helm/gpuwarden's image values.
IMAGE ?= ghcr.io/gpuwarden/gpuwarden
TAG ?= $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)

$(STAMP): pyproject.toml
	@echo "gpuwarden: first run - creating $(VENV) and installing gpuwarden with its dependencies"
	@echo "  (pandas, pyarrow, scikit-learn, streamlit, kubernetes, prometheus-client, ...: about 400 MB;"
	@echo "   typically 2-5 minutes on a fresh machine, seconds afterwards)"
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/gpuwarden demo $(ARGS)

# `make lint`: ruff and mypy with their settings in pyproject.toml ([tool.ruff], [tool.mypy]; mypy keeps
# its cache in .mypy_cache), then the import-layering contracts. `make test` runs it before the tests.
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/lint-imports

test: lint
	$(BIN)/pytest -q $(PYTEST_ARGS)

bench: $(STAMP)
	$(BIN)/python bench/bench_sim.py
	$(BIN)/python bench/bench_store.py

image:
	IMAGE=$(IMAGE) TAG=$(TAG) ENGINE=$(ENGINE) PYTHON_IMAGE=$(PYTHON_IMAGE) scripts/image/build_image.sh

clean:
	rm -rf $(VENV) .gpuwarden .pytest_cache .mypy_cache .ruff_cache
