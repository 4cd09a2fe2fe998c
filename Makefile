# fxforge developer commands. `make demo` and `make test` set up .venv themselves (idempotent).
PYTHON ?= python3
VENV   := .venv
VPY    := $(VENV)/bin/python
STAMP  := $(VENV)/.fxforge-installed
# Extra pytest arguments, e.g. `make test PYTEST_ARGS="-m slow"`.
PYTEST_ARGS ?=
# The property tests' draws are fixed by this seed, so `make test` (CI's gate) runs the same
# examples every time; `make test HYPOTHESIS_SEED=$$RANDOM` explores others (a failure is saved
# in .hypothesis/ and replayed first by every later run on that machine).
HYPOTHESIS_SEED ?= 0

.PHONY: demo test test-sanitize lint venv browser bench bench-gpu clean

venv: $(STAMP)

# torch first, pinned to the local CPU wheel: an open range would make pip fetch a CUDA build.
$(STAMP): pyproject.toml
	test -x $(VPY) || $(PYTHON) -m venv $(VENV)
	$(VPY) -m pip install -q torch==2.13.0
	$(VPY) -m pip install -q -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/fxforge demo

# The report's browser test (tests/test_report.py) renders a report in headless Chromium: install
# the Debian package once if it is missing and we are root with apt-get; otherwise say so and go
# on (that test then skips with the reason).
browser:
	@command -v chromium >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
	  { DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null 2>&1 || \
	    { apt-get update -qq >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null 2>&1; }; }; } || \
	  echo "chromium not installed (needs root, apt-get and network): the report's browser test will be skipped"

# The linter first (pyproject's [tool.ruff]: unused names and imports, undefined names, pycodestyle,
# the line length): a few seconds.
lint: $(STAMP)
	$(VENV)/bin/ruff check .

test: $(STAMP) browser lint
	FXFORGE_DEBUG=1 $(VPY) -m pytest -q -n 2 --durations=15 --hypothesis-seed=$(HYPOTHESIS_SEED) $(PYTEST_ARGS)

# The C codegen tests and the full C OpInfo sweep with every C build (kernels and the launcher)
# under AddressSanitizer + UBSan (FXFORGE_C_SANITIZE=1; docs/c.md, "Sanitizers"). Not part of
# `make test`. Python is not instrumented, so gcc's sanitizer runtimes are preloaded (ASan first),
# and the builds use that gcc (SAN_CC, e.g. `make test-sanitize SAN_CC=gcc-13`). The sanitized
# shared objects are cached in a directory of their own, kept between runs (`make clean` empties it).
SAN_CC    ?= gcc
SAN_CACHE := $(CURDIR)/.cache-sanitize
SAN_ASAN   = $(shell $(SAN_CC) -print-file-name=libasan.so 2>/dev/null)
SAN_UBSAN  = $(shell $(SAN_CC) -print-file-name=libubsan.so 2>/dev/null)

test-sanitize: $(STAMP)
	@for lib in "$(SAN_ASAN)" "$(SAN_UBSAN)"; do case "$$lib" in /*) [ -f "$$lib" ] && continue;; esac; \
	  echo "test-sanitize: no sanitizer runtime ($${lib:-$(SAN_CC) not found}) for $(SAN_CC): install gcc with its" \
	    "ASan/UBSan runtimes (Debian/Ubuntu: gcc, which brings libgcc-<version>-dev, libasan and libubsan;" \
	    "Fedora: gcc libasan libubsan), or name another gcc with SAN_CC=..." >&2; exit 1; done
	CC=$(SAN_CC) FXFORGE_C_SANITIZE=1 FXFORGE_CACHE_DIR=$(SAN_CACHE) FXFORGE_TEST_CACHE=$(SAN_CACHE) FXFORGE_DEBUG=1 \
	LD_PRELOAD="$(SAN_ASAN) $(SAN_UBSAN)" ASAN_OPTIONS=detect_leaks=0 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	  $(VPY) -m pytest -q -n 2 -m 'slow or not slow' --durations=15 tests/test_c_*.py $(PYTEST_ARGS)

bench: $(STAMP)
	$(VENV)/bin/fxforge bench

# GPU machines bring their own torch/triton: use the interpreter found there, no venv.
bench-gpu:
	$(PYTHON) -m fxforge.entry.cli bench --gpu

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache .hypothesis .cache-sanitize
