# Everything runs in a local virtual environment created on first use.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
DATA ?= ./data
PORT ?= 9092

.PHONY: run test check bench pipeline clean

$(VENV)/.installed: pyproject.toml $(wildcard setup.py) $(wildcard protocol/*.c)
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test,dev]'
	touch $@

run: $(VENV)/.installed
	$(PY) -m broker --override listeners=PLAINTEXT://127.0.0.1:$(PORT) --override log.dirs=$(DATA)

pipeline: $(VENV)/.installed
	$(PY) examples/spark_pipeline.py --bootstrap 127.0.0.1:$(PORT)

test: $(VENV)/.installed
	$(PY) -m pytest -q -p no:cacheprovider

check: $(VENV)/.installed
	$(VENV)/bin/ruff check protocol broker pyspark_kafka tests bench examples
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports
	$(PY) tools/check_cycles.py
	$(PY) tools/check_handler_types.py

bench: $(VENV)/.installed
	$(PY) -m pip install --quiet -e '.[test,dev,bench]'
	$(PY) bench/run_all.py

clean:
	rm -rf $(VENV) build *.egg-info protocol/*.so
