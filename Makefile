# One virtual environment for everything: `make demo` and `make test` share it, so
# MindSpore is installed once. The stamp is rebuilt only when pyproject.toml changes.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.msgen-installed

.PHONY: all demo test test-slow tables generate fuzz bootstrap clean distclean

all: test

bootstrap: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -e '.[test]'
	touch $@

demo: $(STAMP)
	$(BIN)/msgen compile specs/gpt7b.msl -o generated/
	$(BIN)/msgen estimate specs/gpt7b.msl

# The parser's prebuilt LALR tables (msgen/syntax/msl_tables.py), after an edit to
# grammar/msl.lark; left alone while they fit the grammar.
tables: $(STAMP)
	$(BIN)/python -m msgen.commands.tables

# Regenerate the committed trees of every spec directly in specs/ (validation specs
# are estimate-only); tests fail when generated/ is stale.
generate: tables
	for spec in specs/*.msl; do $(BIN)/msgen compile $$spec -o generated/ || exit 1; done

test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/black --check .
	$(BIN)/pytest -q -m "not slow"

# The longer MindSpore runs (.ci/run runs them after `make test`).
test-slow: $(STAMP)
	$(BIN)/pytest -q -m slow

# The fuzz campaigns: 10,000 mutated and hostile specs, then 5,000 mutated files the
# tools read (config.json, safetensors, index.json, source.json, strategy.json,
# run.json, log.csv, calibration) and damaged run folders; each prints cases/s and
# any crash, hang or memory growth with how to run it again. Fails if either found one.
fuzz: $(STAMP)
	$(BIN)/python bench/bench_fuzz.py -n 10000; specs=$$?; \
	$(BIN)/python bench/bench_fuzz.py --files -n 5000 && exit $$specs

clean:
	rm -rf dist build .pytest_cache .ruff_cache .hypothesis

distclean: clean
	rm -rf $(VENV)
