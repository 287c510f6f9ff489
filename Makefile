# One entry point for set-up, the demo/benchmark and the tests.
# `make bench` and `make test` each install everything they need first.

PYTHON ?= python
PIP ?= $(PYTHON) -m pip
# torch is pinned exactly: an open range would pull a multi-GB CUDA build.
TORCH_PIN ?= torch==2.13.0

.PHONY: install bench bench-full lint test test-fallback test-main test-executorch clean

install:
	$(PIP) install --quiet "$(TORCH_PIN)" "typing-extensions" "expecttest" "pytest" "numpy" "ruff" "mypy"
	# --no-build-isolation: an isolated build env would download torch again.
	$(PIP) install --quiet --no-build-isolation -e .

bench: install
	$(PYTHON) -m torch_cachepolicy.bench --quick --out bench-results

bench-full: install
	$(PYTHON) -m torch_cachepolicy.bench --out bench-results

lint:
	ruff check torch_cachepolicy test setup.py
	mypy

# The pure-Python dispatcher fallback, exercised for real (not only in theory).
test-fallback:
	TORCH_CACHEPOLICY_FORCE_PYTHON=1 $(PYTHON) -m pytest -q test/test_keyset.py test/test_mode.py test/test_policy.py

test-main:
	$(PYTHON) -m pytest -q test --ignore=test/integration

# Lint first so that a pytest summary is the last thing printed; the ExecuTorch
# tier runs after the main tests.
test: install lint test-fallback test-main test-executorch

# ExecuTorch 1.5.1 (Arm Ethos-U55 flow) as a real client. --no-deps: its own
# requirements would replace the pinned torch.
test-executorch: install
	$(PIP) install --quiet --no-deps -r requirements-executorch.txt
	$(PYTHON) -m pytest -q test/integration

clean:
	rm -rf build *.egg-info torch_cachepolicy/_C*.so bench-results
