# Two commands set everything up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1

.PHONY: install chromium acl-tools demo test figures test-fast test-quality bench bench-smoke bench-serve bench-gpu soak clean

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	# The CPU build of torch first: an unpinned torch would pull a multi-GB CUDA build.
	$(BIN)/python -m pip install --quiet torch==2.13.0
	# The distribution was once named ragwarden, a name the package index gives another project.
	$(BIN)/python -m pip uninstall --quiet --yes ragwarden 2>/dev/null || true
	$(BIN)/python -m pip install --quiet -e '.[test,ray]'
	touch $@

install: $(BIN)/.installed

# The console's tests drive Debian's Chromium (never a browser Playwright downloads): installed
# here where it is missing, unless RAGWARDEN_CHROMIUM names another build.
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
chromium:
	@if [ -z "$$RAGWARDEN_CHROMIUM" ] && ! command -v chromium >/dev/null 2>&1; then \
		echo "installing Chromium (Debian package chromium) for the console tests"; \
		$(SUDO) apt-get update -q && $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium; \
	fi

# The POSIX ACL tests (tests/ingest/test_posix_access.py) build real trees with setfacl and getfacl
# (Debian package acl): installed here where they are missing.
acl-tools:
	@if ! command -v setfacl >/dev/null 2>&1; then \
		echo "installing setfacl (Debian package acl) for the POSIX ACL tests"; \
		$(SUDO) apt-get update -q && $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -q acl; \
	fi

$(BIN)/.bench-installed: $(BIN)/.installed
	$(BIN)/python -m pip install --quiet -e '.[test,ray,bench]'
	touch $@

demo: install
	$(BIN)/ragwarden demo

# pytest exits 5 when it collected no tests: that is a failure here, never a pass.
# The SciFact quality test (marked `quality`) is left to `make bench`, which measures the same nDCG@10.
# RAGWARDEN_REQUIRE_BROWSER: here a missing browser fails the console tests instead of skipping them;
# RAGWARDEN_REQUIRE_ACL: likewise a missing setfacl fails the POSIX ACL tests.
# RAGWARDEN_RECORD_SUITE: the run is recorded in build/suite.json; `make figures` quotes it in the README.
# TEST_WORKERS processes (pytest-xdist), each module's tests on one of them and the crash, load and
# soak tests (tests/reliability) one after another on one (tests/support/parallel.py).
TEST_WORKERS ?= 2
PARALLEL := -n $(TEST_WORKERS)
test: install chromium acl-tools
	@RAGWARDEN_REQUIRE_BROWSER=1 RAGWARDEN_REQUIRE_ACL=1 RAGWARDEN_RECORD_SUITE=build/suite.json $(BIN)/pytest -m "not quality" $(PARALLEL); status=$$?; \
	if [ $$status -eq 5 ]; then echo "error: pytest collected no tests" >&2; exit 1; fi; \
	exit $$status

# Render every figure the README and docs quote from the recorded runs (bench/results/), the
# last `make test` included.
figures: install
	@if [ -f build/suite.json ]; then cp build/suite.json bench/results/suite.json; fi
	$(BIN)/python -m ragwarden.bench.figures

test-fast: install chromium acl-tools
	RAGWARDEN_REQUIRE_BROWSER=1 RAGWARDEN_REQUIRE_ACL=1 $(BIN)/pytest -m "not slow and not quality" $(PARALLEL)

test-quality: install
	$(BIN)/pytest -m quality

# The benchmark (minutes at 100k rows, about an hour at 1M on two cores): results in bench/results/.
BENCH_ARGS ?= --sizes 100000,1000000,scifact --queries 20
# Shared use while the table changes: 1,000 callers, a writer committing every second (bench/churn.py).
CHURN_ROWS ?= 100000 1000000
# Records that bring their own vectors, through ingest_records against a bare LanceDB add, and a
# collection imported (`ragwarden import lancedb`), at 100k and, the import alone, at 1M (bench/brought.py).
BROUGHT_ROWS ?= 100000
bench: $(BIN)/.bench-installed
	$(BIN)/python -m ragwarden.bench $(BENCH_ARGS)
	for rows in $(CHURN_ROWS); do $(BIN)/python -m ragwarden.bench.churn --rows $$rows || exit 1; done
	for rows in $(BROUGHT_ROWS); do $(BIN)/python -m ragwarden.bench.brought --rows $$rows || exit 1; done
	$(BIN)/python -m ragwarden.bench.brought --rows 1000000 --callers 40 --queries 2 --import-only
	$(BIN)/python -m ragwarden.bench.power_loss --rows 1000000 --trials 10

# The soak: the load test of the suite (8 clients, one ingesting, every answer checked against the
# oracle) for SOAK_SECONDS instead of half a minute, figures in bench/results/soak.json; then the
# serializable-lifecycle stress (three processes of random ingest, sync, derive, forget and policy
# install, every version checked) for SOAK_ROUNDS rounds instead of 6. Not run in CI.
SOAK_SECONDS ?= 1800
SOAK_ROUNDS ?= 200
SOAK_CRASHES ?= 100
soak: install
	RAGWARDEN_LOAD_SECONDS=$(SOAK_SECONDS) RAGWARDEN_LOAD_REPORT=bench/results/soak.json \
		$(BIN)/pytest -m slow -p no:cacheprovider -q -s tests/reliability/test_load.py
	RAGWARDEN_LIFECYCLE_ROUNDS=$(SOAK_ROUNDS) \
		$(BIN)/pytest -m slow -p no:cacheprovider -q tests/reliability/test_serializable_lifecycle.py
	RAGWARDEN_CRASH_RUNS=$(SOAK_CRASHES) \
		$(BIN)/pytest -m slow -p no:cacheprovider -q tests/reliability/test_ingest_crash.py

# The service end to end: `ragwarden serve` replicas on 127.0.0.1 driven by 1 to 64 client threads,
# a broad and a selective caller, every hit checked against an oracle; bench/results/serve-*.json.
SERVE_ARGS ?= --corpus demo --clients 1,4,16,64 --seconds 10
bench-serve: install
	$(BIN)/python -m ragwarden.bench.serve $(SERVE_ARGS)
	$(BIN)/python -m ragwarden.bench.serve $(SERVE_ARGS) --replicas 2

# On a machine with a CUDA GPU: SciFact ingest documents/s on the GPU against the CPU.
bench-gpu: install
	$(BIN)/python -m ragwarden.bench.gpu_ingest --out bench/results/gpu_ingest.json

bench-smoke: $(BIN)/.bench-installed
	$(BIN)/python -m ragwarden.bench --sizes 5000 --queries 3 --no-ingest --out bench/results-smoke

clean:
	rm -rf $(VENV) .ragwarden .pytest_cache .hypothesis build *.egg-info
