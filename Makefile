# fxforge developer commands. `make demo` and `make test` set up .venv themselves (idempotent).
PYTHON ?= python3
VENV   := .venv
VPY    := $(VENV)/bin/python
STAMP  := $(VENV)/.fxforge-installed
# Extra pytest arguments, e.g. `make test PYTEST_ARGS="-m slow"`.
PYTEST_ARGS ?=

.PHONY: demo test venv browser bench bench-gpu clean

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

test: $(STAMP) browser
	FXFORGE_DEBUG=1 $(VPY) -m pytest -q -n 2 --durations=15 $(PYTEST_ARGS)

bench: $(STAMP)
	$(VENV)/bin/fxforge bench

# GPU machines bring their own torch/triton: use the interpreter found there, no venv.
bench-gpu:
	$(PYTHON) -m fxforge.cli bench --gpu

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache .hypothesis
