# One-command set-up: every target that runs code makes .venv first when needed.
PY := .venv/bin/python
VENV_STAMP := .venv/.installed

.PHONY: setup demo demo-live test test-fast bench bench-quality bench-round bench-sampling lint format clean-demo

setup: $(VENV_STAMP)

$(VENV_STAMP): requirements.txt
	python3 -m venv .venv
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements.txt
	touch $(VENV_STAMP)

demo: $(VENV_STAMP)
	bash scripts/demo.sh

# The live loop for a few minutes (experiments/live.py): a recording A2C, a following oracle, a
# following trainer, then the reloading A2C; prints versions, labels and the true score over time.
demo-live: $(VENV_STAMP)
	$(PY) -m experiments.live --minutes 5

# The browser tests need Debian's chromium + chromium-driver: installed as root, else one line and exit 2.
# Stage 1's loop runs again with each precision forced (its default, auto, follows the CPU), so that
# a CPU without native bf16 runs what a bf16 one would, and the other way round.
A2C_LOOP_TESTS := tests/test_a2c_loop.py

test: $(VENV_STAMP)
	bash scripts/browser_deps.sh
	$(PY) -m pytest
	RLHF_TEST_PRECISION=bf16 $(PY) -m pytest -q $(A2C_LOOP_TESTS)
	RLHF_TEST_PRECISION=fp32 $(PY) -m pytest -q $(A2C_LOOP_TESTS)

test-fast: $(VENV_STAMP)
	$(PY) -m pytest -m "not slow and not browser"
	RLHF_TEST_PRECISION=bf16 $(PY) -m pytest -q $(A2C_LOOP_TESTS)

bench: $(VENV_STAMP)
	@for f in bench/bench_*.py; do $(PY) -m bench.$$(basename $$f .py) || exit 1; done

# Reward-model quality against the true score: records a DB, oracle-labels it, trains (~10-20 min).
bench-quality: $(VENV_STAMP)
	$(PY) -m experiments.quality

# Three rounds of 100 labels with synthetic teachers (v0, then per round: labels of the newest DB,
# reward model on every label so far, rlhf and control fine-tunes, evaluation): v0 500k agent steps,
# then 500k per fine-tune (the control arm's shared by both teachers), about 3 hours on 2 cores.
# Outputs in runs/round/seed0/.
bench-round: $(VENV_STAMP)
	$(PY) -m experiments.round --teacher surface --rounds 3 --labels 100 --v0-steps 500000 --seeds 0,1
	$(PY) -m experiments.round --teacher score --rounds 3 --labels 100 --v0-steps 500000 --seeds 1

# Reward-model learning curves per --sampling mode (random, uncertain, disagree) with synthetic
# teachers, on the round's DB (make bench-round first): 7 ensemble trainings per teacher and seed.
bench-sampling: $(VENV_STAMP)
	$(PY) -m experiments.sampling

lint: $(VENV_STAMP)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

format: $(VENV_STAMP)
	$(PY) -m ruff format .
	$(PY) -m ruff check --fix .

clean-demo:
	rm -rf db/demo db/demo-* saves/demo saves/demo-* runs/*demo* videos/demo
