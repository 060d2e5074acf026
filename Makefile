# Everything a fresh Debian machine with Python 3.11 needs: `make demo`, `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp

.PHONY: demo test lint typecheck unit real system-deps clean

# The virtual environment, rebuilt when the project's dependencies change.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --disable-pip-version-check -U pip
	$(BIN)/python -m pip install -q --disable-pip-version-check -e '.[dev,train,report]'
	touch $(STAMP)

# Real parts of the test suite from Debian, each installed when missing (needs root), with one
# apt-get update for all: OpenSSH's sshd, FUSE 3 (libfuse3-3 and fusermount3) for the
# forgetting filesystem of the power-loss tests (tests/powerloss/), rsync, a baseline of
# benchmarks/pull.py (run at a smoke size by tests/benchmarks/), and tmux, the real terminal
# the TUI lends to a shell on a node in tests/console/test_shell.py, and Chromium with its
# driver, the headless browser that loads a `fleetdeck report` page (tests/report/).
system-deps:
	@missing=""; \
	[ -x /usr/sbin/sshd ] || missing="$$missing openssh-server openssh-client"; \
	command -v rsync >/dev/null || missing="$$missing rsync"; \
	command -v tmux >/dev/null || missing="$$missing tmux"; \
	{ command -v chromium && command -v chromedriver; } >/dev/null || \
		missing="$$missing chromium chromium-driver"; \
	{ [ -x /usr/bin/fusermount3 ] && /sbin/ldconfig -p | grep -q 'libfuse3\.so\.3 '; } || \
		missing="$$missing fuse3 libfuse3-3"; \
	if [ -n "$$missing" ]; then \
		if [ "$$(id -u)" = 0 ]; then \
			export DEBIAN_FRONTEND=noninteractive; \
			apt-get update -qq && apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
		else \
			echo "make: missing$$missing: run 'sudo apt-get install$$missing'" >&2; exit 2; \
		fi; \
	fi

demo: $(STAMP)
	$(BIN)/fleetdeck demo

lint: $(STAMP)
	$(BIN)/ruff check .

typecheck: $(STAMP)
	$(BIN)/mypy

# Four workers on two cores: most of a test's time is a real process it waits on (servers,
# sshd, S3, torchrun), so four files at once finish in 10 min where two took 13-14.
unit: $(STAMP) system-deps
	$(BIN)/python -m pytest -q -n 4 --dist loadfile --ignore=tests/real

real: $(STAMP)
	FLEETDECK_REAL_TIER=required $(BIN)/python -m pytest -q -p no:xdist tests/real

# The real-server tier (tests/real/: SGLang itself on the CPU) runs last, alone: a server
# on two cores would starve the other workers' timing tests. Its environment is built into a
# cache outside the clone (tests/real/env.py), starting in the background while the main
# suite runs; the tier's own build waits for that one under the same file lock.
REAL_LOG := $(VENV)/real-env.log
test: system-deps $(STAMP)
	$(BIN)/python -m tests.real.env build > $(REAL_LOG) 2>&1 &
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/python -m pytest -q -n 4 --dist loadfile --ignore=tests/real
	FLEETDECK_REAL_TIER=required $(BIN)/python -m pytest -q -p no:xdist tests/real

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
