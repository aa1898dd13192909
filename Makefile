# cute-kernels developer commands. Every target installs what it needs into $(VENV) first.
# TORCH_SPEC: the pip arguments that install torch when the venv has none (CI pins a version); on a
# machine without a GPU, TORCH_SPEC='torch --index-url <PyTorch CPU wheel index>' skips the CUDA build.
PY ?= python3
VENV ?= .venv
PYTHON := $(VENV)/bin/python
TORCH_SPEC ?= torch
STAMP := $(VENV)/.installed

FUZZ_MINUTES ?= 5
SEED ?=

.PHONY: install test test-gpu test-gpu-sm100-configs fuzz sanitize demo bench sass lint clean sass-hashes

$(STAMP): pyproject.toml
	test -x $(PYTHON) || $(PY) -m venv $(VENV)
	$(PYTHON) -m pip install -q --upgrade pip
	$(PYTHON) -c "import torch" 2>/dev/null || $(PYTHON) -m pip install -q $(TORCH_SPEC)
	$(PYTHON) -m pip install -q -e ".[test,sass,bench,dev]"
	touch $(STAMP)

install: $(STAMP)

test: $(STAMP)
	$(PYTHON) -m pytest -q -rs

test-gpu: $(STAMP)
	$(PYTHON) -m pytest -q -m gpu

# GPU (Hopper): the GPU tests of the ops whose sm_100a configs differ from sm_90a's, run with the
# sm_100a configs (tests/conftest.py; cute_kernels/configs/sm100.py).
test-gpu-sm100-configs: $(STAMP)
	CUTE_KERNELS_TEST_CONFIG_ARCH=sm_100a $(PYTHON) -m pytest -q -m gpu \
	  tests/torch_bindings/test_swizzle_gpu.py tests/torch_bindings/test_quantize_fp8_gpu.py \
	  tests/torch_bindings/test_bounded_rows_gpu.py

# GPU: the fuzz harness for FUZZ_MINUTES minutes (every op, new seeds each round; SEED= picks the first).
fuzz: $(STAMP)
	$(PYTHON) tests/support/fuzz.py --minutes $(FUZZ_MINUTES) $(if $(SEED),--seed $(SEED))

# GPU: compute-sanitizer memcheck (+ garbage offsets) and racecheck over a small-shape fuzz run.
sanitize: $(STAMP)
	PYTHON=$(PYTHON) $(if $(SEED),SEED=$(SEED)) bash tests/support/sanitize.sh

demo: $(STAMP)
	$(PYTHON) -m bench.demo

bench: $(STAMP)
	for b in bench/bench_*.py; do $(PYTHON) -m bench.$$(basename $$b .py) || exit 1; done

sass: $(STAMP)
	$(PYTHON) -m cute_utils.sass all --arch all

# The instruction hashes CI compares every build with (tests/support/sass_hashes.txt); run when a change of
# SASS is intended.
sass-hashes: $(STAMP)
	{ echo "# nvidia-cutlass-dsl $$($(PYTHON) -c 'import cutlass; print(cutlass.__version__)')"; \
	  CUTE_KERNELS_DISK_CACHE=0 $(PYTHON) -m cute_utils.sass all --hash; } > tests/support/sass_hashes.txt

lint: $(STAMP)
	$(VENV)/bin/ruff check .

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache bench/results
