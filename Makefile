# The README's commands. Each bootstraps .venv/ from the pinned lock files.
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
export TF_CPP_MIN_LOG_LEVEL ?= 3
# Tests run with two workers (this project's machines have 2 cores).
PYTEST_WORKERS ?= 2

.PHONY: venv demo test test-slow bench clean-venv venv-bench-pfl venv-flower test-flower flower-app flower-wheelhouse venv-docs docs docs-check

venv:
	@bash scripts/bootstrap.sh

## Main job on the embedded default data (no downloads): the √L table, then training.
demo: venv
	$(PY) -m training.main_job --output_dir out/demo

## Default (fast) test suite: under 15 minutes on 2 cores, setup included.
test: venv
	$(PY) -m pytest -n $(PYTEST_WORKERS) --timeout=900 -q -rs tests

## Long checks (n >= 2048 factorizations, long training).
test-slow: venv
	$(PY) -m pytest -m slow --timeout=7200 -q -rs tests

## Benchmarks (write their tables into BENCHMARKS.md and PNGs under benchmarks/results/).
bench: venv
	$(PY) benchmarks/run_all.py

## pfl (the peer of benchmarks/peer_pfl.py) in a benchmark-only venv, never a dependency:
## torch's CPU wheel first (TORCH=... names another), then pfl.
TORCH ?= torch==2.13.0+cpu
venv-bench-pfl:
	python3.11 -m venv .venv-bench-pfl
	.venv-bench-pfl/bin/pip install "$(TORCH)"
	.venv-bench-pfl/bin/pip install pfl==0.6.0

## The Flower layer's tests in Flower's simulation engine, in .venv-flower (its own lock:
## flwr needs protobuf >= 5.28, which TensorFlow 2.14 cannot share).
venv-flower:
	@bash scripts/bootstrap_flower.sh

test-flower: venv-flower
	"$$(cd .venv-flower && pwd -P)/bin/python" -m pytest --timeout=900 -q -rs tests/flower

## The documentation site, built into site/ in strict mode (a broken link, a missing reference or a
## docstring that does not render fails the build) with .venv-docs (requirements/docs-lock.txt).
venv-docs:
	@bash scripts/bootstrap_docs.sh

docs: venv-docs
	NO_MKDOCS_2_WARNING=1 .venv-docs/bin/mkdocs build --strict --clean

## The built site in headless Chromium (Debian's chromium package): title, navigation, no console
## errors on the home page and an API page, screenshots under out/docs-check/.
docs-check: docs
	.venv-docs/bin/python scripts/docs_check.py --site site --output_dir out/docs-check

## The Flower App (examples/flower_app): tff-mf's wheel in dist/, and the App's uv.toml pointing
## uv (which `flwr run` installs the App's dependencies with) at it.
flower-app: venv-flower
	@bash scripts/build_flower_app.sh

## The same, plus dist/wheelhouse/ (the Flower lock's wheels) for `flwr run` without a registry.
flower-wheelhouse: venv-flower
	@bash scripts/build_flower_app.sh --wheelhouse

clean-venv:
	rm -rf $(VENV)
