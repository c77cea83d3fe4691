# bn-rotation: every target sets up .venv from requirements/lock.txt first if it is missing.
# `make help` lists the targets.
SHELL := /bin/bash
space := $(subst ,, )
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
SCALE ?= full
FORCE ?= 0
SKIP_BAD ?= 0
ROW ?= adam
SEED ?= 0
ARGS ?=
RESULTS ?=
STEP ?=
RUN ?= $(or $(RESULTS),results)/runs/$(ROW)/seed=$(SEED)
OUT ?=
# Runs at once: one per core by default, one thread each (`make bench` on 2 cores: 1.09x one run of 2 threads,
# quiet, section (g); a run of 2 threads slows 3.3x beside a busy core, section (b)).
# The quick look (SCALE=quick) runs all its runs at once instead (rows x seeds), one thread each: on 2 cores its three
# runs then end together, about 1.5x one run's time, where two at a time leave the third to train alone after them.
comma := ,
ifeq ($(SCALE),quick)
JOBS ?= $(shell echo $$(( $(words $(subst $(comma),$(space),$(ROWS))) * $(words $(subst $(comma),$(space),$(SEEDS))) )))
endif
JOBS ?= $(shell nproc)
BENCH_ARGS ?=
SCALES := $(sort $(basename $(notdir $(wildcard conf/scale/*.yaml))))

# Rows and seeds of a sweep, per scale, from src/bnrotation/study/rows.py (SWEEPS), read only when a target uses them
# (torch-free, so the system python does it before .venv exists).
# SET=<name> picks a named set instead (rows.SETS: resnet, ten_seeds), with its own extra overrides.
SET ?=
# Asked once per make, at its first use (the variable then holds the answer).
sweep_of = $(eval sweep_of := $$(shell PYTHONPATH=src $$(PYTHON) -m bnrotation.study.rows $$(SCALE) $$(SET)))$(sweep_of)
ROWS ?= $(word 1,$(sweep_of))
SEEDS ?= $(word 2,$(sweep_of))
set_overrides = $(wordlist 3,99,$(sweep_of))
# BATCH=1: the seeds of each row train together in one process as one batched model (runner.run_seeds)
BATCH ?= 0
seed_args = $(if $(filter 1 true yes,$(BATCH)),batch_seeds=[$(SEEDS)],seed=$(SEEDS))
force_flag := $(if $(filter 1 true yes,$(FORCE)),true,false)
# Recursive (=), so that the results root `reproduce` sets for its prerequisites reaches them.
results_flag = $(if $(RESULTS),--results $(RESULTS),)
results_override = $(if $(RESULTS),results_root=$(RESULTS),)
out_flag = $(if $(OUT),--out $(OUT),)
skip_flag := $(if $(filter 1 true yes,$(SKIP_BAD)),--skip-bad,)
launcher := $(if $(filter-out 1,$(JOBS)),hydra/launcher=joblib hydra.launcher.n_jobs=$(JOBS) threads=$$(( $$(nproc) / $(JOBS) > 0 ? $$(nproc) / $(JOBS) : 1 )),)
# The folder the analysis writes into: OUT, else the results root it reads (outputs go inside the root).
# bnrotation.study.analysis.results prints it, or stops with one line (exit 2) when it cannot be written there.
out_dir = out=$$($(PY) -m bnrotation.study.analysis.results $(results_flag) $(out_flag)) &&

# Make variables that would otherwise fail deep inside Python: checked before anything runs.
ifneq ($(filter sweep reproduce row,$(MAKECMDGOALS)),)
ifneq ($(words $(SCALE))$(filter $(SCALE),$(SCALES)),1$(SCALE))
$(error SCALE=$(SCALE): expected one of $(SCALES) (conf/scale/))
endif
endif
ifneq ($(filter sweep reproduce zoo zoo2 frozen map why,$(MAKECMDGOALS)),)
ifneq ($(shell [[ '$(JOBS)' =~ ^[1-9][0-9]*$$ ]] && echo ok),ok)
$(error JOBS=$(JOBS): expected a whole number >= 1 (runs at once))
endif
endif

.PHONY: map why
.PHONY: help install data test test-fast test-kernels test-compat mutants sweep reproduce places row table diagnose check figures claims report notebooks bench frozen calibrate zoo zoo2 clean
.PHONY: minimal
.DEFAULT_GOAL := help

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*## "} {printf "  make %-12s %s\n", $$1, $$2}'
	@echo "  variables (default in brackets):"
	@echo "    SCALE=$(subst $(space),|,$(SCALES)) [full]   ROW=<row> [adam]   SEED=<s> [0]   ARGS='<hydra overrides>'   FORCE=1"
	@echo "    ROWS=<row,row,...> SEEDS=<s,s,...> the sweep's rows and seeds [by SCALE and SET, from rows.py:"
	@for s in $(SCALES); do echo "      SCALE=$$s: $$(PYTHONPATH=src $(PYTHON) -m bnrotation.study.rows $$s)"; done
	@for s in resnet ten_seeds fashion_mnist; do echo "      SET=$$s: $$(PYTHONPATH=src $(PYTHON) -m bnrotation.study.rows full $$s)"; done
	@echo "      SET=fashion_mnist_quick (SCALE=quick): $$(PYTHONPATH=src $(PYTHON) -m bnrotation.study.rows quick fashion_mnist_quick)"
	@echo "      ]   SET=resnet|ten_seeds|fashion_mnist|fashion_mnist_quick [none: the article's network]"
	@echo "    JOBS=<n> runs at once (sweep), one thread each when n >= cores [nproc: $(shell nproc)]"
	@echo "    RESULTS=<root> [sweep, row: results; table, figures, claims: results if it holds runs, else"
	@echo "      results/reference; reproduce: results, or results/<scale> below full scale]"
	@echo "    OUT=<folder> where table, figures and claims write [the results root they read]   SKIP_BAD=1"
	@echo "    RUN=<run folder> [<results>/runs/ROW/seed=SEED]   STEP=<n>|last|worst (diagnose)"
	@echo "    BENCH_ARGS='--steps 300 --rounds 3' (bench, which writes $(or $(OUT),results)/bench.md)"

# The replication's exact versions (requirements/lock.txt), installed by uv (its version pinned in the lock: 12 s
# against pip's 62 s on 2 cores, cold caches), then the suite itself without resolving anything more. uv reads no
# pip configuration, so pip's find-links (where a machine keeps wheels such as a CPU build of torch) are passed on.
# Bytecode is compiled once for the whole venv on every core, leaving out the packages' own test folders and
# transformers' model folders but `auto`, which nothing imports (46 -> 30 s on 2 cores); compileall skips the few
# files that are not valid Python, as pip does, so its status is not the install's.
# Then what was installed must import: `python -m bnrotation.study.thirdparty` imports torchvision, timm, Lightning and
# transformers in a fresh interpreter; where the lock's torchvision is a build for another torch (the CUDA wheel
# beside a CPU torch: `operator torchvision::nms does not exist`) it installs the suite's shim into .venv, saying so
# in one line, and any other failure stops the install in one line.
find_links = $(or $(PIP_FIND_LINKS),$(shell $(PYTHON) -m pip config get global.find-links 2>/dev/null))
$(VENV)/.installed: pyproject.toml requirements/lock.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --no-compile "$$(grep -m1 '^uv==' requirements/lock.txt)"
	$(VENV)/bin/uv pip install --quiet --python $(PY) $(foreach f,$(find_links),--find-links $(f)) -r requirements/lock.txt
	$(VENV)/bin/uv pip install --quiet --python $(PY) --no-deps -e .
	$(PY) -m pip check
	$(PY) -m bnrotation.study.thirdparty
	$(PY) -m compileall -q -j 0 -x '/tests?/|/transformers/models/(?!auto/)' $(VENV)/lib > /dev/null || true
	touch $@

install: $(VENV)/.installed data ## create .venv with the exact versions of requirements/lock.txt (torch 2.13.0, ...), and the data

# Fashion-MNIST (task=fashion_mnist, the fmnist_* rows): Debian's dataset-fashion-mnist, installed with apt-get where
# this user is root and apt-get exists; elsewhere one line says what to run. FASHION_MNIST_DIR: files kept elsewhere.
# The tests never need it (they read tests/data/fashion_mnist_sample).
FASHION_MNIST_DIR ?= /usr/share/datasets/fashion-mnist
data: ## Fashion-MNIST's idx files for the real-image rows (apt-get install dataset-fashion-mnist, as root)
	@if [ -f "$(FASHION_MNIST_DIR)/train-images-idx3-ubyte.gz" ] || [ -f "$(FASHION_MNIST_DIR)/train-images-idx3-ubyte" ]; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get > /dev/null && [ "$(FASHION_MNIST_DIR)" = /usr/share/datasets/fashion-mnist ]; then \
		echo "make data: installing Debian's dataset-fashion-mnist (Fashion-MNIST, 30 MB)"; \
		{ apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q dataset-fashion-mnist; } > /tmp/make-data-apt.log 2>&1 \
			|| { echo "make data: apt-get could not install dataset-fashion-mnist (see /tmp/make-data-apt.log)" >&2; exit 2; }; \
	else echo "make data: Fashion-MNIST is not in $(FASHION_MNIST_DIR): run \`sudo apt-get install dataset-fashion-mnist\`, or set FASHION_MNIST_DIR to where its idx files are" >&2; fi

# Tests: TEST_JOBS pytest-xdist workers, each test to whichever is free; the tests of a file that share a module's
# fixture go to one worker together, so that it is built once (tests/conftest.py); 1, or pytest-xdist not
# installed, runs them in this process.
TEST_JOBS ?= $(shell nproc)
# Run in a pytest of its own beside the others, from the start: the SLURM test mostly waits on the scheduler, and it
# signals its job mid-run, which it must see from outside the xdist workers' schedule. Its output follows theirs.
SERIAL_TESTS := tests/test_slurm.py
xdist = $$($(PY) -c 'import xdist' 2>/dev/null && [ "$(TEST_JOBS)" != 1 ] && printf -- '-n %s --dist loadgroup' $(TEST_JOBS))
# make test-fast: pure functions, probes, configs, analysis of committed or synthetic results; not the tests of these
# files marked slow (a training run, a Python process)
FAST_TESTS := tests/test_analysis.py tests/test_probes.py tests/test_configs.py tests/test_config_fuzz.py \
	tests/test_stats.py tests/test_depth.py tests/test_lag.py tests/test_dense.py tests/test_records.py \
	tests/test_optim.py tests/test_carryover.py tests/test_ten_seeds.py tests/test_why.py tests/test_sensitivity.py
# make test-kernels: the tests marked `kernels` (code-path equality, determinism, resume bit-identity) again under
# each lower CPU kernel path: no vector kernels, then AVX2 (ATen's dispatch and oneDNN's, capped to match). Each path
# compiles into a cache of its own: torch.compile's on-disk cache does not tell kernel paths apart and hands code
# generated for AVX-512 to a no-vector process, whose compiler rejects it (torch 2.13).
KERNEL_PATHS := "ATEN_CPU_CAPABILITY=default ONEDNN_MAX_CPU_ISA=SSE41" \
	"ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2"

test: $(VENV)/.installed ## run the whole test suite under this machine's CPU kernels (TEST_JOBS=n workers [nproc])
	@beside=$$(mktemp -d); trap 'rm -rf "$$beside"' EXIT; \
	{ $(PY) -m pytest -q $(SERIAL_TESTS) > "$$beside/log" 2>&1; echo $$? > "$$beside/rc"; } & \
	$(PY) -m pytest -q $(xdist) --ignore=$(SERIAL_TESTS); rc=$$?; wait; \
	echo "make test: $(SERIAL_TESTS), run beside the rest:"; cat "$$beside/log"; \
	[ $$rc = 0 ] && [ "$$(cat "$$beside/rc")" = 0 ]

test-fast: $(VENV)/.installed ## the tests that train nothing: pure functions, probes, configs, analysis (under a minute)
	$(PY) -m pytest -q $(xdist) -m "not slow" $(FAST_TESTS)

test-kernels: $(VENV)/.installed ## rerun the tests marked kernels under the no-vector and the AVX2 kernel paths
	@cache=$$(mktemp -d) && trap 'rm -rf "$$cache"' EXIT && i=0 && for env in $(KERNEL_PATHS); do \
		i=$$((i + 1)) && echo "make test-kernels: $$env" && \
		env $$env TORCHINDUCTOR_CACHE_DIR="$$cache/$$i" $(PY) -m pytest -q $(xdist) -m kernels || exit 1; done

# make test-compat: the library's tests in scratch venvs beside the oldest torch pyproject.toml admits, the newest on
# the registry and the release below the bound (tests/test_compat.py). Not in make test or CI: GBs of downloads each.
test-compat: $(VENV)/.installed ## the library's tests beside the oldest and the newest torch, in scratch venvs: results/compat/report.md
	nice -n 5 $(PY) tests/test_compat.py --out results/compat/report.md

# make mutants: mutmut over the pure-logic functions tests/mutants_report.py names, with the tests pyproject.toml's
# [tool.mutmut] selects (each mutant runs only those that reach its function); a fresh mutants/ each time. Not in
# make test. SINCE=<commit> mutates only the functions changed since that commit (working tree included) and prints
# the survivors, exit 1 if there is one; results/mutants/report.md is left as it is.
mutants: $(VENV)/.installed ## mutation score of the verdict path and the judges (mutmut): results/mutants/report.md; SINCE=<commit>: only the functions changed since, survivors printed
	rm -rf mutants
ifeq ($(SINCE),)
	set -f; nice -n 5 $(VENV)/bin/mutmut run --max-children $(TEST_JOBS) $$($(PY) tests/mutants_report.py --names)
	$(PY) tests/mutants_report.py --out results/mutants/report.md
else
	@set -f; names="$$($(PY) tests/mutants_report.py --names --since '$(SINCE)')" || exit 2; \
	if [ -z "$$names" ]; then echo "make mutants: no function changed since $(SINCE)"; exit 0; fi; \
	echo "make mutants: $$(echo $$names | wc -w) functions changed since $(SINCE)"; \
	nice -n 5 $(VENV)/bin/mutmut run --max-children $(TEST_JOBS) $$names && \
	$(PY) tests/mutants_report.py --survivors --since '$(SINCE)'
endif

sweep: $(VENV)/.installed data ## every row x seed at SCALE, or of SET=resnet|ten_seeds|fashion_mnist (resumable; FORCE=1 reruns; JOBS=n in parallel)
	@[ -n "$(ROWS)" ] || { echo "make sweep: no rows for SCALE=$(SCALE) SET=$(SET) (see the line above)" >&2; exit 2; }
	$(PY) experiments/train.py -m $(seed_args) experiment=$(ROWS) scale=$(SCALE) force=$(force_flag) \
		$(results_override) $(launcher) $(set_overrides) $(ARGS)

minimal: $(VENV)/.installed ## the article's loop in one file of plain PyTorch, the collapse in minutes on one core (experiments/minimal.py; MINIMAL_ARGS='--help')
	$(PY) experiments/minimal.py $(MINIMAL_ARGS)

reproduce: $(VENV)/.installed places sweep table figures claims ## the whole study at SCALE, then the table, figures and claims, in RESULTS (results/, or results/<scale> below full scale)
reproduce: RESULTS = $(if $(filter full,$(SCALE)),results,results/$(SCALE))

places: $(VENV)/.installed
	@$(PY) -m bnrotation.study.analysis.results $(results_flag) $(out_flag) > /dev/null

row: $(VENV)/.installed data ## one row at one seed, SCALE=full unless given (a run: 12-25 min on 2 cores): make row ROW=adam SEED=1 [SCALE=smoke] [ARGS='optimizer.lr=0.001 row=adam_lr1e-3']
	$(PY) experiments/train.py experiment=$(ROW) seed=$(SEED) scale=$(SCALE) force=$(force_flag) \
		$(results_override) $(ARGS)

table: $(VENV)/.installed ## <root>/table.md, table.csv, lag.md, averaging.md from the parquet results (RESULTS=<root>; OUT=<folder>; SKIP_BAD=1 leaves bad runs out)
	$(out_dir) $(PY) -m bnrotation.study.analysis.tables.table $(results_flag) --out "$$out" $(skip_flag)

diagnose: $(VENV)/.installed ## stale statistics and fixes of one run: make diagnose RUN=<run folder> [STEP=<n>|last|worst]
	$(PY) experiments/diagnose.py run=$(RUN) $(if $(STEP),step=$(STEP),)

check: $(VENV)/.installed ## are a saved model's BatchNorm statistics stale? make check MODEL=<module:function> WEIGHTS=<file.pt> BATCHES=<file.pt|module:function> [CHECK_ARGS='--input-key image'] (fails when stale)
	$(if $(and $(MODEL),$(WEIGHTS),$(BATCHES)),,$(error make check needs MODEL=<module:function> WEIGHTS=<file.pt> BATCHES=<file.pt|module:function>; not given: $(strip $(if $(MODEL),,MODEL) $(if $(WEIGHTS),,WEIGHTS) $(if $(BATCHES),,BATCHES))))
	$(PY) -m bnrotation.check --model '$(MODEL)' --weights '$(WEIGHTS)' --batches '$(BATCHES)' $(CHECK_ARGS)

bench: $(VENV)/.installed ## results/bench.md: runner vs the article's bare loop, probe costs, memory, sweep throughput
	$(PY) bench/bench.py --venv $(VENV) --out $(or $(OUT),results)/bench.md $(BENCH_ARGS)

figures: $(VENV)/.installed ## <root>/figures/*.png, *.pdf and README.md from the parquet results (RESULTS=<root>; OUT=<folder>)
	$(out_dir) $(PY) -m bnrotation.study.analysis.tables.figures $(results_flag) --out "$$out/figures" $(skip_flag)

claims: $(VENV)/.installed ## <root>/claims.md: every claim of the article, PASS/FAIL/NOT RUN (RESULTS=<root>; OUT=<folder>)
	$(out_dir) $(PY) -m bnrotation.study.analysis.claims $(results_flag) --out "$$out" $(skip_flag)

.PHONY: calibrate
calibrate: $(VENV)/.installed ## results/reference/calibration.md and docs/monitor.md's figures: the monitor's thresholds, chosen on the synthetic runs, scored in and out of sample (OOS='<roots>': where the other-task runs are; default results/reference and its zoo/)
	$(PY) -m bnrotation.study.analysis.tables.calibration --results results/reference --doc docs/monitor.md $(if $(OOS),--out-of-sample $(OOS))

report: $(VENV)/.installed ## <root>/report.html: headline, table, claims and figures on one page that opens offline (RESULTS=<root>; OUT=<folder>)
	$(out_dir) $(PY) -m bnrotation.study.analysis.webpage $(results_flag) --out "$$out" $(skip_flag)

frozen: $(VENV)/.installed ## the frozen-backbone experiment: a Hydra multirun of 3 BatchNorm modes x 3 seeds (conf/frozen.yaml), resumable, then <root>/frozen.md (RESULTS=<root> [results/frozen]; JOBS=n; FORCE=1; ARGS)
	sweep=$$($(PY) -m bnrotation.study.frozen) && $(PY) experiments/frozen.py -m $$sweep results_root=$(or $(RESULTS),results/frozen) \
		force=$(force_flag) threads=1 hydra/launcher=joblib hydra.launcher.n_jobs=$(JOBS) $(ARGS)
	$(PY) -m bnrotation.study.analysis.claims.frozen_report --results $(or $(RESULTS),results/frozen)

# The staleness zoo (src/bnrotation/study/zoo.py, conf/zoo.yaml): every architecture x optimizer x seed of bnrotation.study.zoo
# (`python -m bnrotation.study.zoo` prints the sweep) as one Hydra multirun, JOBS joblib workers of one thread each. A
# finished run is skipped (FORCE=1 reruns), one without DONE rerun; a sweep that lost a run exits 1.
zoo: $(VENV)/.installed data ## the staleness zoo: timm architectures x sgd,adam x 3 seeds on Fashion-MNIST and the GroupNorm control (resumable; RESULTS=<root> [results/zoo]; JOBS=n; FORCE=1; ARGS), then <root>/zoo.md and zoo.png
	sweep=$$($(PY) -m bnrotation.study.zoo) && $(PY) experiments/zoo.py -m $$sweep results_root=$(or $(RESULTS),results/zoo) \
		force=$(force_flag) threads=1 hydra/launcher=joblib hydra.launcher.n_jobs=$(JOBS) $(ARGS)
	$(PY) -m bnrotation.study.analysis.tables.zoo_report --results $(or $(RESULTS),results/zoo)

# The second zoo (issue 48): eight other timm architectures, new seeds, runs four times as long
# (bnrotation.study.zoo.SECOND_ZOO; `python -m bnrotation.study.zoo --second` prints the sweep). Its claims and the
# forecasters were committed before its first run; run it in the background from a pinned worktree (docs/running.md).
zoo2: $(VENV)/.installed data ## the second zoo: 8 other timm architectures x sgd,adam x 3 new seeds, 4,800 steps (resumable; RESULTS=<root> [results/zoo2]; JOBS=n; FORCE=1; ARGS), then <root>/zoo.md and zoo.png
	sweep=$$($(PY) -m bnrotation.study.zoo --second) && $(PY) experiments/zoo.py -m $$sweep results_root=$(or $(RESULTS),results/zoo2) \
		force=$(force_flag) threads=1 hydra/launcher=joblib hydra.launcher.n_jobs=$(JOBS) $(ARGS)
	$(PY) -m bnrotation.study.analysis.tables.zoo_report --results $(or $(RESULTS),results/zoo2)

# The condition map (src/bnrotation/study/condition_map.py, issue 49): one Hydra multirun of experiments/train.py per line
# of `python -m bnrotation.study.condition_map` (each task's reference point, then each knob: rows x settings x seeds),
# JOBS joblib workers of one thread each. A finished run is skipped (FORCE=1 reruns), one without DONE rerun; a line
# that lost a run makes the target exit 1 after the others ran; a stop signal stops it at once. Then <root>/map.md.
map: $(VENV)/.installed data ## the condition map: sgd,adam x (each task's reference + every knob's settings) x 3 seeds (resumable; RESULTS=<root> [results/map]; JOBS=n; FORCE=1; ARGS), then <root>/map.md and map.png
	@status=0; while read -r line; do \
		echo "$(PY) experiments/train.py -m $$line results_root=$(or $(RESULTS),results/map) ..."; \
		$(PY) experiments/train.py -m $$line results_root=$(or $(RESULTS),results/map) force=$(force_flag) threads=1 \
			hydra/launcher=joblib hydra.launcher.n_jobs=$(JOBS) $(ARGS); rc=$$?; \
		if [ $$rc -ge 128 ]; then exit $$rc; elif [ $$rc != 0 ]; then status=1; fi; \
	done < <($(PY) -m bnrotation.study.condition_map); \
	$(PY) -m bnrotation.study.analysis.tables.map_report --results $(or $(RESULTS),results/map) && exit $$status

# The data swap (src/bnrotation/study/why.py, issue 64): one Hydra multirun of experiments/train.py per line of
# `python -m bnrotation.study.why` (Adam's arms, then SGD's; each line an arm's three seeds), as `make map` runs its
# lines: resumable, a lost run makes it exit 1 after the others, a stop signal stops it. JOBS=3 runs a line's three
# seeds at once (on 2 cores they end together). Then <root>/why.md.
why: $(VENV)/.installed ## the data swap: fresh, finite and swapped training data, and Adam at beta2 0.99 and 0.9999, x 3 seeds (resumable; RESULTS=<root> [results/why]; JOBS=n; FORCE=1; ARGS), then <root>/why.md
	@status=0; while read -r line; do \
		echo "$(PY) experiments/train.py -m $$line results_root=$(or $(RESULTS),results/why) ..."; \
		$(PY) experiments/train.py -m $$line results_root=$(or $(RESULTS),results/why) force=$(force_flag) threads=1 \
			hydra/launcher=joblib hydra.launcher.n_jobs=$(JOBS) $(ARGS); rc=$$?; \
		if [ $$rc -ge 128 ]; then exit $$rc; elif [ $$rc != 0 ]; then status=1; fi; \
	done < <($(PY) -m bnrotation.study.why); \
	$(PY) -m bnrotation.study.analysis.claims.why --results $(or $(RESULTS),results/why) && exit $$status

notebooks: $(VENV)/.installed ## run every notebooks/*.py as a script against the results (RESULTS=<root>)
	@for nb in notebooks/*.py; do echo "$$nb"; \
		BNROTATION_RESULTS=$(RESULTS) MPLBACKEND=Agg $(PY) $$nb > /dev/null || exit 1; done

clean: ## remove .venv and your own (uncommitted) results; keeps results/reference
	rm -rf $(VENV) results/runs results/hydra
