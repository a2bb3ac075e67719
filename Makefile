PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
# One stamp per set of extras: `make demo` installs only what the demo needs; the test, bench,
# proto and docs extras come with the targets that use them.
BASE := $(VENV)/.base
DEMO_DEPS := $(VENV)/.demo
TEST_DEPS := $(VENV)/.test
BENCH_DEPS := $(VENV)/.bench
PROTO_DEPS := $(VENV)/.proto
DOCS_DEPS := $(VENV)/.docs

.PHONY: test demo bench proto docs lint clean onnx-node-tests gpu-check

$(BASE):
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	touch $(BASE)

$(DEMO_DEPS): pyproject.toml $(BASE)
	$(BIN)/pip install -q -e '.[examples]'
	touch $(DEMO_DEPS)

$(TEST_DEPS): pyproject.toml $(BASE)
	$(BIN)/pip install -q -e '.[test,examples,bench,proto,onnx,distributed,tensorboard]'
	touch $(TEST_DEPS)

$(BENCH_DEPS): pyproject.toml $(BASE)
	$(BIN)/pip install -q -e '.[examples,bench,onnx]'
	touch $(BENCH_DEPS)

$(PROTO_DEPS): pyproject.toml $(BASE)
	$(BIN)/pip install -q -e '.[proto]'
	touch $(PROTO_DEPS)

$(DOCS_DEPS): pyproject.toml $(BASE)
	$(BIN)/pip install -q -e '.[docs]'
	touch $(DOCS_DEPS)

test: $(TEST_DEPS)
	$(BIN)/ruff check nestflow tests bench examples
	$(BIN)/python -m pytest

demo: $(DEMO_DEPS)
	$(BIN)/python -m nestflow demo

bench: $(BENCH_DEPS)
	$(BIN)/python bench/run_all.py

# On a GPU machine (CuPy and PyTorch CUDA already there; nothing is installed): every op on
# CUDAPlace against CPUPlace, the demos trained on the GPU, a GPU-saved model loaded on the CPU,
# W1/W3/W8/W10 against PyTorch CUDA; one report file, gpu_check.md (or $OUT/gpu_check.md).
GPU_PY ?= python3
gpu-check:
	PYTHONPATH=.:bench$${PYTHONPATH:+:$$PYTHONPATH} $(GPU_PY) bench/gpu_check.py --report $${OUT:-.}/gpu_check.md

# ONNX's node test cases through onnx.backend.test.BackendTest; prints run/passed/excluded.
onnx-node-tests: $(TEST_DEPS)
	$(BIN)/python -m pytest -q -s tests/onnx/test_backend_node.py

# framework.proto is the source; framework_pb2.py is generated and committed.
proto: $(PROTO_DEPS)
	$(BIN)/python -m grpc_tools.protoc -Inestflow/framework --python_out=nestflow/framework --pyi_out=nestflow/framework nestflow/framework/framework.proto

# The site goes to site/; --strict turns every warning (a broken link, a missing docstring
# target) into an error.
docs: $(DOCS_DEPS)
	$(BIN)/mkdocs build --strict

lint: $(TEST_DEPS)
	$(BIN)/ruff check nestflow tests bench examples
	$(BIN)/ruff format --check nestflow tests bench examples

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache site
