# One entry point for set-up, the demo/benchmark and the tests.
#
# `make bench` and `make test` install everything they need into project-local
# virtual environments that they create, never into the active interpreter:
#   .venv              torch 2.13.0, the package (editable, _C built in place),
#                      the test and lint tools; ExecuTorch for its tier
#   .venv-torch-X      torch X (2.14.1, 2.15.0) and the package installed from a
#                      copy of the tree whose csrc/ is the sdist's, in .venv-torch-X/src
#                      (make test-torch)
# Each environment's torch is pinned in requirements/torch-X.txt, one file per
# release CI tests (version.py's TESTED_TORCH).
# With torch already installed, make is not needed: see "Install" in README.md.

BOOTSTRAP_PYTHON ?= python3
VENV ?= .venv
PYTHON := $(VENV)/bin/python
PIP := $(PYTHON) -m pip
# torch is pinned exactly: an open range would pull a multi-GB CUDA build.
MAIN_TORCH := 2.13.0
# What `pip install --no-build-isolation` needs besides torch (pyproject.toml's [build-system]).
BUILD_TOOLS := "setuptools>=64" wheel
# Written once the package is installed; rebuilt when a build input changes.
INSTALLED := $(VENV)/.installed
# Written once the benchmarks' extra (setup.py's extras_require["bench"]: matplotlib, for
# the charts) is installed too; only the bench targets need it.
BENCH_INSTALLED := $(VENV)/.bench-installed

# `make test-torch TORCH=X SUITE=core|full`: the tests on torch X in .venv-torch-X. The core tests are those of
# the package's own logic against torch's internals; full adds the rest but packaging and the ExecuTorch tier.
TORCH ?= 2.15.0
SUITE ?= core
TIER_VENV = .venv-torch-$(TORCH)
CORE_TESTS := test/test_mode.py test/test_policy.py test/test_keyset.py test/test_kernel_zoo.py test/test_compat.py \
	test/test_keybuilder.py test/test_synth.py test/test_keyparts.py test/test_export.py test/test_adopt.py \
	test/test_upstream_patch.py test/test_fidelity.py test/test_symbols.py test/test_native.py
FULL_TESTS := test --ignore=test/integration --ignore=test/test_packaging.py

.PHONY: disk install bench-install bench bench-full lint test test-fallback test-main test-wheel test-executorch \
	test-torch test-sanitizers bench-executorch bench-executorch-large bench-executorch-split bench-census clean clean-venvs

$(PYTHON):
	$(BOOTSTRAP_PYTHON) -m venv $(VENV)

$(INSTALLED): $(PYTHON) setup.py pyproject.toml torch_cachepolicy/version.py requirements/torch-$(MAIN_TORCH).txt $(wildcard csrc/*)
	$(PIP) install --quiet -r requirements/torch-$(MAIN_TORCH).txt $(BUILD_TOOLS)
	# --no-build-isolation: _C is built against the torch above; an isolated
	# build would download torch again. USE_CPP=1: a failed build of _C stops
	# here (without it the package would install on its Python paths).
	USE_CPP=1 $(PIP) install --quiet --no-build-isolation -e ".[test,lint]"
	touch $@

install: $(INSTALLED)

# setup.py's "bench" extra (the package itself never needs it), read from setup.py by
# benchmarks/extras.py: `pip install -e ".[bench]"` would build the C++ helper again.
$(BENCH_INSTALLED): $(INSTALLED) setup.py
	$(PIP) install --quiet $$($(PYTHON) -m benchmarks.extras bench)
	touch $@

bench-install: $(BENCH_INSTALLED)

# Tables (results.md, results.json) and charts (hitcost.png, replay.png) in bench-results/.
bench: bench-install
	$(PYTHON) -m benchmarks.replay --quick --out bench-results

bench-full: bench-install
	$(PYTHON) -m benchmarks.replay --out bench-results

lint: install
	$(PYTHON) -m ruff check torch_cachepolicy benchmarks test setup.py
	$(PYTHON) -m mypy

# Without the C++ helper (torch's key and synthesis, the Python kernel watch), exercised for real.
test-fallback: install
	TORCH_CACHEPOLICY_FORCE_PYTHON=1 $(PYTHON) -m pytest -q test/test_keyset.py test/test_mode.py test/test_policy.py test/test_synth.py test/test_keyparts.py test/test_kernel_zoo.py

# Includes test/test_packaging.py, whose wheel is built with USE_CPP=0 (seconds).
test-main: install
	$(PYTHON) -m pytest -q test --ignore=test/integration

# The wheel as shipped, with the C++ helper (~40 s more); not part of `make test`.
test-wheel: install
	TORCH_CACHEPOLICY_TEST_WHEEL_CPP=1 $(PYTHON) -m pytest -q test/test_packaging.py

# ExecuTorch 1.5.1 (Ethos-U55, Cortex-M and XNNPACK flows) as a real client. --no-deps: its own
# requirements would replace the pinned torch. The bench extra too, so that the charts are drawn
# in the tests rather than skipped.
test-executorch: bench-install
	$(PIP) install --quiet --no-deps -r requirements-executorch.txt
	$(PYTHON) -m pytest -q test/integration

# ExecuTorch lowering, stock vs global patch vs policy: the four flows on the tiny
# model (a few minutes), and Ethos-U55 on the large model (about 1 minute per round).
# Each writes NAME.json, NAME.md (the tables) and the charts NAME-lowering.png (and
# NAME-split.png with --split) in bench-results/.
bench-executorch: bench-install
	$(PIP) install --quiet --no-deps -r requirements-executorch.txt
	mkdir -p bench-results
	$(PYTHON) -m benchmarks.executorch --flow all --census --json bench-results/executorch-tiny.json

bench-executorch-large: bench-install
	$(PIP) install --quiet --no-deps -r requirements-executorch.txt
	mkdir -p bench-results
	$(PYTHON) -m benchmarks.executorch --flow ethos-u55 --model large --census \
		--json bench-results/executorch-large.json

# The split of the large Ethos-U55 lowering into fake dispatch (by outcome and mode) and the
# rest, and the distance to free fake dispatch (docs/executorch.md; about 6 minutes).
# The census of entry kinds (docs/design.md, "Kinds of entry"; about 15 minutes): entries and hits per kind on the
# ExecuTorch flows and torch.export workloads, and what each kind saves, switched off against all on.
bench-census: bench-install
	$(PIP) install --quiet --no-deps -r requirements-executorch.txt
	mkdir -p bench-results
	$(PYTHON) -m benchmarks.executorch.entry_kinds --json bench-results/entry-kinds.json

bench-executorch-split: bench-install
	$(PIP) install --quiet --no-deps -r requirements-executorch.txt
	mkdir -p bench-results
	$(PYTHON) -m benchmarks.executorch --flow ethos-u55 --model large --repeats 0 --split \
		--json bench-results/executorch-large-limit.json

# The C++ helper under AddressSanitizer and UndefinedBehaviorSanitizer (docs/reliability.md, "Sanitizers"):
# _C built with -fsanitize=address,undefined into $(SAN_DIR)/lib beside a copy of the package's Python
# files, and the tests that drive every native path run with that copy first on the path (it
# shadows the editable install; test_keyset checks that it is the one loaded), the runtimes
# preloaded and PYTHONMALLOC=malloc, so that CPython's objects are ASan's allocations too. Any report aborts the run (halt_on_error; UB is not recovered from);
# --capture=sys leaves file descriptor 2 alone, so the report reaches the terminal.
SAN_DIR := build-sanitizers
SAN_CFLAGS := -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer -g
SAN_TESTS := test_keyset.py test_keyparts.py test_keybuilder.py test_synth.py test_mode.py test_kernel_zoo.py \
	test_symbols.py
SAN_ENV := LD_PRELOAD="$$(gcc -print-file-name=libasan.so):$$(gcc -print-file-name=libubsan.so)" \
	ASAN_OPTIONS=detect_leaks=0:halt_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
	PYTHONMALLOC=malloc TORCH_CACHEPOLICY_SANITIZED=$$root/$(SAN_DIR)/lib

$(SAN_DIR)/.built: $(INSTALLED) $(wildcard csrc/*)
	USE_CPP=1 CFLAGS="$(SAN_CFLAGS)" LDFLAGS="-fsanitize=address,undefined" \
		$(PYTHON) setup.py -q build_ext --build-lib $(SAN_DIR)/lib --build-temp $(SAN_DIR)/temp
	touch $@

test-sanitizers: $(SAN_DIR)/.built
	@set -e; start=$$(date +%s); root=$$(pwd); \
	git ls-files -co --exclude-standard torch_cachepolicy | grep -E '\.py$$|py\.typed$$' | tar -cf - -T - | tar -xf - -C $(SAN_DIR)/lib; \
	cd $(SAN_DIR)/lib; \
	$(SAN_ENV) $$root/$(PYTHON) -m pytest -q --capture=sys -o pythonpath="$$root/$(SAN_DIR)/lib $$root" \
		$(addprefix $$root/test/,$(SAN_TESTS)); \
	echo "[test-sanitizers] took $$(( $$(date +%s) - start )) s (build not included)"

# torch $(TORCH) (2.14.1 and 2.15.0 are CUDA builds of several GB; they run on CPU) in its own venv.
# --no-cache-dir: a venv installs its torch once, and pip's cache would keep a second copy of the
# 3 GB download on disk.
# The package is installed editable from a copy of the tree, so its _C is built
# against that torch's headers without touching the 2.13 build in this tree. The copy
# holds the tracked and untracked-but-not-ignored files as they are on disk
# (uncommitted work included, deleted files left out).
test-torch:
	@set -e; start=$$(date +%s); git rev-parse --git-dir > /dev/null; \
	test -f requirements/torch-$(TORCH).txt || { echo "make test-torch: no requirements/torch-$(TORCH).txt; TORCH is one of $(patsubst requirements/torch-%.txt,%,$(wildcard requirements/torch-*.txt))"; exit 2; }; \
	test -x $(TIER_VENV)/bin/python || $(BOOTSTRAP_PYTHON) -m venv $(TIER_VENV); \
	echo "[test-torch] $(TIER_VENV): torch $(TORCH), $(SUITE) suite"; \
	$(TIER_VENV)/bin/python -m pip install --quiet --no-cache-dir -r requirements/torch-$(TORCH).txt $(BUILD_TOOLS); \
	torch_done=$$(date +%s); \
	echo "[test-torch] $(TIER_VENV)/src: the tree but csrc/, then the unpacked sdist (so _C builds from what the sdist ships), installed editable (_C built against torch $(TORCH))"; \
	rm -rf $(TIER_VENV)/src $(TIER_VENV)/dist && mkdir -p $(TIER_VENV)/src; \
	(git ls-files -co --exclude-standard; git ls-files -d) | sort | uniq -u | grep -v '^csrc/' | tar -cf - -T - | tar -xf - -C $(TIER_VENV)/src; \
	$(TIER_VENV)/bin/python setup.py -q sdist -d $(TIER_VENV)/dist > /dev/null; \
	tar -xzf $(TIER_VENV)/dist/torch_cachepolicy-*.tar.gz -C $(TIER_VENV)/src --strip-components=1; \
	cd $(TIER_VENV)/src && USE_CPP=1 ../bin/python -m pip install --quiet --no-build-isolation -e ".[test]"; \
	../bin/python -c "import torch_cachepolicy._native as n; assert n.backend() == 'cpp', n.fallback_reason()"; \
	echo "[test-torch] set-up took $$(( $$(date +%s) - start )) s (torch $$(( torch_done - start )) s)"
	cd $(TIER_VENV)/src && ../bin/python -m pytest -q $(if $(filter full,$(SUITE)),$(FULL_TESTS),$(CORE_TESTS))

# Free space first, in the log: pip fails part-way with "No space left on device" when it runs out.
disk:
	@df -Pk . | awk 'NR == 2 { printf "[make test] %.1f GB free on %s\n", $$4 / 1048576, $$6 }'

# Lint first so that a pytest summary is the last thing printed; then the tiers on
# torch 2.13.0 (.venv), the full suite on the current release, the core tests on 2.14.1.
test: disk install lint test-fallback test-main test-sanitizers test-executorch
	$(MAKE) test-torch TORCH=2.15.0 SUITE=full
	$(MAKE) test-torch TORCH=2.14.1 SUITE=core

clean:
	rm -rf build $(SAN_DIR) *.egg-info torch_cachepolicy/_C*.so bench-results $(INSTALLED) $(BENCH_INSTALLED)

clean-venvs:
	rm -rf $(VENV) .venv-torch-*
