# Targets named in the README. `scripts/bootstrap` installs what they need.
PY ?= .venv/bin/python
MODDEB ?= .venv/bin/moddeb
DEMO_KERNELS ?= --kernel 6.1.0-57-amd64 --kernel 6.12.117+deb12-amd64
OUT ?= out/kbench

.PHONY: demo bootstrap test test-unit test-integration lint bench clean

bootstrap:
	scripts/bootstrap

demo: bootstrap
	$(MODDEB) build examples/kbench $(DEMO_KERNELS) --out $(OUT)
	@echo; echo "packages are in $(CURDIR)/$(OUT)"; ls -1 $(OUT)

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

clean:
	rm -rf out .pytest_cache .ruff_cache .mypy_cache
