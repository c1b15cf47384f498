# The two commands of the README: `make demo` (the local lab demo) and `make test` (every test).
SHELL := /bin/bash
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: demo test bootstrap lint review lab-down

bootstrap:
	@scripts/bootstrap.sh

demo: bootstrap
	$(BIN)/autoheal lab demo

test: bootstrap
	$(BIN)/ruff check .
	$(BIN)/mypy .
	$(BIN)/pytest

lint: bootstrap
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy .

review: bootstrap
	scripts/review.sh

lab-down:
	-$(BIN)/autoheal lab down
