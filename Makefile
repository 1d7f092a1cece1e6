# doppelchip — two commands: `make run` and `make test`. Everything else is a helper for them.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
PROTOS := $(wildcard proto/doppelchip/v1/*.proto)

.PHONY: run test install install-dev proto lint bench clean prometheus chromium gateway

$(BIN)/python:
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "doppelchip needs Python >= 3.11")'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# Stamps re-run the install whenever pyproject.toml changes.
# Byte-code is compiled at install, as pip does for wheels: an editable install's own modules
# are otherwise compiled at every start where PYTHONDONTWRITEBYTECODE is set (~0.1 s a command).
COMPILE := $(BIN)/python -m compileall -q -j 0 doppelchip server devices clients sim > /dev/null

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e .
	$(COMPILE)
	@touch $@

$(VENV)/.installed-dev: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[dev,ray]'
	$(COMPILE)
	@touch $@ $(VENV)/.installed

install: $(VENV)/.installed
install-dev: $(VENV)/.installed-dev

run: install ## serve the default fleet on 127.0.0.1:50051 (metrics on :8000)
	$(BIN)/doppelchip serve $(ARGS)

gateway: install-dev ## 2 replicas of vllm-h100 behind the smg gateway: OpenAI HTTP on 127.0.0.1:30000
	$(BIN)/doppelchip gateway $(ARGS)

# the suite on pytest-xdist's workers, one per core, a test file at a time (its module's server
# starts once; tests/conftest.py keeps tests/docs/ on one worker): 7 minutes instead of 10 on
# the 2-core CI machine. `make test XDIST=` runs it in one process.
XDIST ?= -n auto --dist loadfile
test: install-dev prometheus chromium ## the whole suite; pytest's "no tests collected" (5) is not a failure
	$(BIN)/python -m pytest $(XDIST) $(PYTEST_ARGS); rc=$$?; [ $$rc -eq 5 ] && rc=0; exit $$rc

prometheus: ## Debian's prometheus + promtool into .cache/ for the observability tests
	scripts/fetch_prometheus.sh

chromium: ## Debian's chromium for the HTML report tests (they skip, saying why, without it)
	-scripts/install_chromium.sh

proto: install-dev ## regenerate doppelchip/v1 from proto/ (byte-stable: grpcio-tools is pinned)
	$(BIN)/python -m doppelchip.protogen

lint: install-dev
	$(BIN)/ruff check .

bench: install-dev
	$(BIN)/python -m benchmarks

clean:
	rm -rf $(VENV) .cache build *.egg-info .pytest_cache .ruff_cache
