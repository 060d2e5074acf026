# Everything a fresh Debian machine with Python 3.11 needs: `make demo`, `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp

.PHONY: demo test lint typecheck unit system-deps clean

# The virtual environment, rebuilt when the project's dependencies change.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --disable-pip-version-check -U pip
	$(BIN)/python -m pip install -q --disable-pip-version-check -e '.[dev,train]'
	touch $(STAMP)

# OpenSSH's sshd is a real part of the test suite; install it when missing (needs root).
system-deps:
	@if [ ! -x /usr/sbin/sshd ]; then \
		if [ "$$(id -u)" = 0 ]; then \
			export DEBIAN_FRONTEND=noninteractive; \
			apt-get update -qq && apt-get install -y -qq --no-install-recommends openssh-server openssh-client >/dev/null; \
		else \
			echo "make: /usr/sbin/sshd is missing: run 'sudo apt-get install openssh-server'" >&2; exit 2; \
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
	$(BIN)/python -m pytest -q -n 4 --dist loadfile

test: system-deps $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/python -m pytest -q -n 4 --dist loadfile

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
