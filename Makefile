# The two commands of the README: `make demo` (the local lab demo) and `make test` (every test).
SHELL := /bin/bash
VENV ?= .venv
BIN := $(VENV)/bin
# pytest's workers (tests/workers.py): the suite mostly waits on real parts, so two share 2 cores
TEST_WORKERS ?= 2

.PHONY: demo test bootstrap lint review lab-down

bootstrap:
	@scripts/bootstrap.sh

demo: bootstrap
	$(BIN)/autoheal lab demo

# pytest includes the molecule scenario (tests/runbook/test_molecule.py, with its own lab)
test: bootstrap
	$(BIN)/ruff check .
	$(BIN)/mypy .
	$(BIN)/python collections/sanity.py
	$(BIN)/pytest -n $(TEST_WORKERS)

lint: bootstrap
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy .

# make review [STACK="lab ..."] [BASE=origin/main] [ALLOW_SKIP="dryrun ..."] [APPROVE="slurm-slurmctld ..."]
review: bootstrap
	scripts/review.sh $(foreach s,$(STACK),--stack $(s)) $(if $(BASE),--base $(BASE)) \
		$(foreach c,$(ALLOW_SKIP),--allow-skip $(c)) $(foreach a,$(APPROVE),--approve $(a)) $(REVIEW_ARGS)

lab-down:
	-$(BIN)/autoheal lab down
