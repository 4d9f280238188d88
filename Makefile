# Two commands set everything up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1

.PHONY: install demo test test-fast clean

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	# The CPU build of torch first: an unpinned torch would pull a multi-GB CUDA build.
	$(BIN)/python -m pip install --quiet torch==2.13.0
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $@

install: $(BIN)/.installed

demo: install
	$(BIN)/ragwarden demo

# pytest exits 5 when it collected no tests: that is a failure here, never a pass.
test: install
	@$(BIN)/pytest; status=$$?; \
	if [ $$status -eq 5 ]; then echo "error: pytest collected no tests" >&2; exit 1; fi; \
	exit $$status

test-fast: install
	$(BIN)/pytest -m "not slow"

clean:
	rm -rf $(VENV) .ragwarden .pytest_cache .hypothesis build *.egg-info
