PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: test demo bench proto lint clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test,examples,bench,proto]'
	touch $(STAMP)

test: $(STAMP)
	$(BIN)/ruff check nestflow tests bench examples
	$(BIN)/python -m pytest

demo: $(STAMP)
	$(BIN)/python -m nestflow demo

bench: $(STAMP)
	$(BIN)/python bench/run_all.py

# framework.proto is the source; framework_pb2.py is generated and committed.
proto: $(STAMP)
	$(BIN)/python -m grpc_tools.protoc -Inestflow/framework --python_out=nestflow/framework --pyi_out=nestflow/framework nestflow/framework/framework.proto

lint: $(STAMP)
	$(BIN)/ruff check nestflow tests bench examples
	$(BIN)/ruff format --check nestflow tests bench examples

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
