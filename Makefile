# cute-kernels developer commands. Every target installs what it needs into $(VENV) first.
# `make help` lists them.
# TORCH_SPEC: the pip arguments that install torch (CI pins a version). Not given, it is `torch`
# where `nvidia-smi` finds an NVIDIA GPU and PyTorch's CPU wheel index otherwise (a CUDA build of
# torch is several GB), and a torch the venv already has is kept. Given, and other than the spec
# the venv's torch was installed with, it reinstalls torch.
PY ?= python3
VENV ?= .venv
PYTHON := $(VENV)/bin/python
TORCH_CPU_INDEX := https://download.pytorch.org/whl/cpu
ifeq ($(origin TORCH_SPEC),undefined)
TORCH_SPEC_GIVEN :=
TORCH_SPEC := $(shell nvidia-smi -L >/dev/null 2>&1 && echo torch || echo 'torch --index-url $(TORCH_CPU_INDEX)')
else
TORCH_SPEC_GIVEN := 1
endif
STAMP := $(VENV)/.installed
# The TORCH_SPEC the venv's torch came from; rewritten only when that changes ($(STAMP) reruns).
TORCH_STAMP := $(VENV)/.torch-spec

FUZZ_MINUTES ?= 5
SEED ?=

.PHONY: help install test test-gpu test-gpu-sm100-configs fuzz sanitize demo bench sass lint clean \
	sass-hashes FORCE

help: ## list the targets
	@awk -F ':.*## ' '/^[a-z0-9-]+:.*## / { printf "  %-24s %s\n", $$1, $$2 }' $(MAKEFILE_LIST)
	@printf "  %-24s %s\n" "TORCH_SPEC=..." "pip arguments for torch (now: $(TORCH_SPEC))"

# A venv with torch: installed from TORCH_SPEC when the venv has none; reinstalled when TORCH_SPEC
# is given and the venv records another spec; a torch with no record (an empty one: a venv made by
# hand or by an older Makefile) is kept, and recorded as a given TORCH_SPEC's.
$(TORCH_STAMP): FORCE
	@test -x $(PYTHON) || { $(PY) -m venv $(VENV) && $(PYTHON) -m pip install -q --upgrade pip; }
	@if [ -f $@ ] && [ "$$(cat $@)" = '$(TORCH_SPEC)' ]; then :; \
	elif ! $(PYTHON) -c "import torch" 2>/dev/null; then \
	  echo "installing torch: $(TORCH_SPEC)"; \
	  $(PYTHON) -m pip install -q $(TORCH_SPEC) && echo '$(TORCH_SPEC)' > $@; \
	elif [ -z "$(TORCH_SPEC_GIVEN)" ]; then [ -f $@ ] || : > $@; \
	elif [ -s $@ ]; then \
	  echo "TORCH_SPEC changed ($$(cat $@) -> $(TORCH_SPEC)): reinstalling torch"; \
	  $(PYTHON) -m pip uninstall -q -y torch && $(PYTHON) -m pip install -q $(TORCH_SPEC) \
	    && echo '$(TORCH_SPEC)' > $@; \
	else echo '$(TORCH_SPEC)' > $@; fi

$(STAMP): pyproject.toml $(TORCH_STAMP)
	$(PYTHON) -m pip install -q -e ".[test,sass,bench,dev]"
	touch $(STAMP)

install: $(STAMP) ## create .venv and install torch (TORCH_SPEC) and the project with its extras

test: $(STAMP) ## the test suite (CPU: reference, errors, compile + SASS; GPU tests too on a GPU)
	$(PYTHON) -m pytest -q -rs

test-gpu: $(STAMP) ## GPU: the GPU tests only
	$(PYTHON) -m pytest -q -m gpu

# GPU (Hopper): the GPU tests of the ops whose sm_100a configs differ from sm_90a's, run with the
# sm_100a configs (tests/conftest.py; cute_kernels/configs/sm100.py).
test-gpu-sm100-configs: $(STAMP) ## GPU (Hopper): GPU tests of the ops with other sm_100a configs
	CUTE_KERNELS_TEST_CONFIG_ARCH=sm_100a $(PYTHON) -m pytest -q -m gpu \
	  tests/torch_bindings/test_swizzle_gpu.py tests/torch_bindings/test_quantize_fp8_gpu.py \
	  tests/torch_bindings/test_bounded_rows_gpu.py

# GPU: the fuzz harness for FUZZ_MINUTES minutes (every op, new seeds each round; SEED= picks the first).
fuzz: $(STAMP) ## GPU: fuzz every op against the reference (FUZZ_MINUTES=5, SEED=)
	$(PYTHON) tests/support/fuzz.py --minutes $(FUZZ_MINUTES) $(if $(SEED),--seed $(SEED))

# GPU: compute-sanitizer memcheck (+ garbage offsets) and racecheck over a small-shape fuzz run.
sanitize: $(STAMP) ## GPU: compute-sanitizer memcheck and racecheck over a small fuzz run
	PYTHON=$(PYTHON) $(if $(SEED),SEED=$(SEED)) bash tests/support/sanitize.sh

demo: $(STAMP) ## the main job on a MoE batch (GPU), or the reference + SASS summary (CPU)
	$(PYTHON) -m bench.demo

# A script that cannot run here (no GPU, or bench_ep outside torchrun) exits 2 with one line and is
# skipped; any other failure fails the target after the rest have run.
bench: $(STAMP) ## GPU: every bench/bench_*.py (each skips with one line without a GPU)
	@failed=; for b in bench/bench_*.py; do name=$$(basename $$b .py); \
	  $(PYTHON) -m bench.$$name; rc=$$?; \
	  if [ $$rc = 2 ]; then echo "$$name: skipped"; elif [ $$rc != 0 ]; then failed="$$failed $$name"; fi; \
	done; test -z "$$failed" || { echo "failed:$$failed"; exit 1; }

sass: $(STAMP) ## SASS summary of every kernel, sm_90a and sm_100a (no GPU needed)
	$(PYTHON) -m cute_utils.sass all --arch all

# The instruction hashes CI compares every build with (tests/support/sass_hashes.txt); run when a
# change of SASS is intended.
sass-hashes: $(STAMP) ## rewrite tests/support/sass_hashes.txt (when a change of SASS is intended)
	{ echo "# nvidia-cutlass-dsl $$($(PYTHON) -c 'import cutlass; print(cutlass.__version__)')"; \
	  CUTE_KERNELS_DISK_CACHE=0 $(PYTHON) -m cute_utils.sass all --hash; } > tests/support/sass_hashes.txt

lint: $(STAMP) ## ruff check
	$(VENV)/bin/ruff check .

clean: ## remove .venv, build files, caches and bench/results
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache bench/results

FORCE:
