PYTHON ?= python3
# Exported benchmark models (ignored by git); any directory with room for a 3.4 GB model.
BENCH_DATA ?= bench/data

.PHONY: install check demo lint docs test test-fast fixtures bench-node-cases bench-scale bench-nodes bench-repair

install:
	$(PYTHON) -m pip install -q -c .ci/constraints.txt -e ".[test,export,ir,olive,docs]"

# One command on a fresh clone: install what the tests need, then run them all (what .ci/run runs).
check: install
	$(MAKE) test

demo:
	rlx-amp fixtures/models/demo_transformer.onnx --policy auto-mixed -o demo_auto_mixed.onnx --verify --report-md demo_report.md

# Lint and types first (seconds), then the tests.
lint:
	$(PYTHON) -m ruff check rlx_onnx_amp tests tools fixtures bench examples
	$(PYTHON) -m mypy

# The documentation site (mkdocs.yml): a page left out of the navigation or a broken link fails it.
# Strict for real: --quiet would hide the warnings that --strict counts, so the build's log is kept
# and shown only when the build fails.
docs:
	@log=$$($(PYTHON) -m mkdocs build --strict 2>&1) || { printf '%s\n' "$$log" >&2; exit 1; }

test: lint docs
	$(PYTHON) -m pytest -q -n auto --dist worksteal

test-fast: lint docs
	$(PYTHON) -m pytest -q -n auto --dist worksteal -m "not slow and not sweep"

fixtures:
	$(PYTHON) fixtures/make_fixtures.py

# The HTML report's screenshot (docs/reports.md): the browser test's own pages, saved under docs/img.
.PHONY: report-screenshots
report-screenshots:
	RLX_AMP_ARTIFACTS=docs/img $(PYTHON) -m pytest -q tests/test_report_html.py -k "person and repaired"
	rm -f docs/img/report-repaired-dark.png

# Benchmarks (figures in docs/benchmarks.md); they need `pip install onnxconverter-common` for the peers.
bench-node-cases:
	$(PYTHON) bench/onnx_node_cases.py

bench-scale:
	$(PYTHON) bench/export_llama.py $(BENCH_DATA)/llama
	$(PYTHON) bench/scale.py --model $(BENCH_DATA)/llama/llama.onnx

bench-nodes:
	$(PYTHON) bench/scale.py --nodes 10000,50000,200000

bench-repair:
	$(PYTHON) bench/repair_bench.py --external

# On a GPU machine (install steps in the script's docstring): CUDA tests, load, timing and real vs emulated drift.
.PHONY: gpu-check
gpu-check:
	$(PYTHON) bench/gpu_check.py

# Mutation fuzzing of the CLI (figures in docs/benchmarks.md): thousands of seeded mutants of the fixture
# models, a summary table per exit code and mutation kind, and the mutants that break the contract.
FUZZ_SEED ?= 1
FUZZ_COUNT ?= 3000
FUZZ_DIR ?= /tmp/rlx-amp-fuzz
.PHONY: fuzz
fuzz:
	rm -rf $(FUZZ_DIR)
	$(PYTHON) -m tools.fuzz_mutants --seed $(FUZZ_SEED) --count $(FUZZ_COUNT) --workdir $(FUZZ_DIR) --check-inputs --summary --strict 2>$(FUZZ_DIR).log

# rlx-amp --repair over torchvision classifiers and detectors (random weights). The export needs
# a separate venv: python3 -m venv .venv-torchvision && .venv-torchvision/bin/pip install torch==2.14.1 torchvision==0.29.1 onnx onnxscript
TV_PYTHON ?= .venv-torchvision/bin/python
.PHONY: bench-repair-zoo
bench-repair-zoo:
	$(TV_PYTHON) bench/export_torchvision.py $(BENCH_DATA)/torchvision
	$(PYTHON) bench/repair_zoo.py --data-dir $(BENCH_DATA)/torchvision
