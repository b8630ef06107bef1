PYTHON ?= python3

.PHONY: install demo test test-fast fixtures bench-node-cases

install:
	$(PYTHON) -m pip install -e ".[test,export]"

demo:
	rlx-amp fixtures/models/demo_transformer.onnx --policy auto-mixed -o demo_auto_mixed.onnx --verify --report-md demo_report.md

test:
	$(PYTHON) -m pytest -q

test-fast:
	$(PYTHON) -m pytest -q -m "not slow"

fixtures:
	$(PYTHON) fixtures/make_fixtures.py

bench-node-cases:
	$(PYTHON) bench/onnx_node_cases.py
