# Targets named in the README. `scripts/bootstrap` installs what they need.
PY ?= .venv/bin/python
MODDEB ?= .venv/bin/moddeb

.PHONY: demo bootstrap test test-unit test-integration lint bench clean

bootstrap:
	scripts/bootstrap

demo:
	scripts/quickstart

test: bootstrap
	$(PY) -m pytest tests

test-unit:
	$(PY) -m pytest tests/unit

test-integration:
	$(PY) -m pytest tests/integration

lint:
	$(PY) -m ruff check builder web tests bench
	$(PY) -m ruff format --check builder web tests bench
	$(PY) -m mypy

bench:
	$(PY) bench/bench_kernel_path.py
	$(PY) bench/bench_publish.py
	$(PY) bench/bench_boottest.py
	$(PY) bench/bench_webhook.py

clean:
	rm -rf out .pytest_cache .ruff_cache .mypy_cache
