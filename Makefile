# The README's commands. Each target does its own setup on a fresh machine.
PYTHON ?= python3
VENV ?= .venv
BIN := $(abspath $(VENV))/bin
# spark-submit finds SPARK_HOME (pyspark) only with the venv's bin on PATH.
RUN := PATH="$(BIN):$$PATH" PYSPARK_PYTHON="$(BIN)/python"
PYTEST_ARGS ?=
# pytest-xdist workers of `make test` (docs/testing.md): 2 on a 2-core machine (the tests wait on
# servers, schedulers and JVM starts as much as they compute); TEST_WORKERS=0 runs in one process.
TEST_WORKERS ?= 2
# Each worker may run one Spark job at a time (PLGD_SPARK_SLOTS: plgd_devtools.spark.spark_lock).
XDIST := $(if $(filter 0,$(TEST_WORKERS)),-p no:xdist,-n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder)
SPARK_SLOTS := $(if $(filter 0,$(TEST_WORKERS)),1,$(TEST_WORKERS))

.PHONY: venv venv-airflow2 venv-executor test test-airflow2 lint demo proto bench clean

venv: $(VENV)/.installed

$(VENV)/.installed: setup.cfg pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --upgrade "pip>=24" >/dev/null
	$(BIN)/pip install -e '.[spark,dev,messaging]'
	touch $@

# Airflow 2.11 compatibility: its own venv, the provider without the Airflow-3-only `messaging`
# extra and without Spark (pyspark-client comes with the apache-spark provider). No Airflow
# constraints file: pip resolves apache-airflow 2.11.x together with our current floors
# (protobuf>=7.35, pyarrow>=17); measured cold (no pip cache) on 2 cores: about 3.5 min.
VENV2 ?= .venv-airflow2
BIN2 := $(abspath $(VENV2))/bin
AIRFLOW2_VERSION ?= 2.11.*

venv-airflow2: $(VENV2)/.installed

$(VENV2)/.installed: setup.cfg pyproject.toml
	$(PYTHON) -m venv $(VENV2)
	$(BIN2)/pip install --upgrade "pip>=24" >/dev/null
	$(BIN2)/pip install -e '.[dev]' 'apache-airflow==$(AIRFLOW2_VERSION)'
	touch $@

# The Spark executors' Python for the cluster tests (tests/integration/test_spark_cluster.py): only
# requirements-executor.txt, never this project, so the tests prove that --py-files carries the plgd
# code. Same interpreter (Python minor version) as $(VENV), as Spark requires.
VENVX ?= .venv-executor
BINX := $(abspath $(VENVX))/bin

venv-executor: $(VENVX)/.installed

$(VENVX)/.installed: requirements-executor.txt
	$(PYTHON) -m venv $(VENVX)
	$(BINX)/pip install --upgrade "pip>=24" >/dev/null
	$(BINX)/pip install -r requirements-executor.txt
	@if $(BINX)/python -I -c "import airflow_provider_plgd" 2>/dev/null; then \
		echo "$(VENVX) must not hold airflow_provider_plgd (the executors get it with --py-files)"; exit 1; fi
	touch $@

## make test: the whole suite (real nats-server, spark-submit and Airflow) on $(TEST_WORKERS) xdist workers;
## prints the 15 slowest tests and the total (docs/testing.md)
test: venv venv-executor
	$(RUN) PLGD_EXECUTOR_PYTHON="$(BINX)/python" PLGD_SPARK_SLOTS=$(SPARK_SLOTS) \
		$(BIN)/python -m pytest -q -rs --durations=15 $(XDIST) $(PYTEST_ARGS)

## make test-airflow2: the Airflow 2.11 subset: tests/airflow2 (DAG import, provider registration, a real
## `airflow dags backfill` against nats-server) and the unit tests.
test-airflow2: venv-airflow2
	PATH="$(BIN2):$$PATH" $(BIN2)/python -m pytest -q -rs -p no:cacheprovider -m "not spark" $(XDIST) \
		tests/airflow2 tests/unit $(PYTEST_ARGS)

## make lint: ruff with the rules of pyproject.toml, then mypy with its [tool.mypy] (CI runs it before the tests)
lint: venv
	$(BIN)/ruff check .
	$(BIN)/mypy

## make demo: simulate plgd traffic into a local nats-server and run the ETL DAG through Airflow
demo: venv
	$(RUN) $(BIN)/python -m plgd_devtools.demo

## make proto: regenerate airflow_provider_plgd/plgd/pb from our .proto files
proto: venv
	cd airflow_provider_plgd/plgd && $(BIN)/python -m grpc_tools.protoc -Iproto \
		--python_out=pb --pyi_out=pb proto/eventbus.proto proto/resourceaggregate.proto proto/identitystore.proto

## make bench: the benchmarks; they print figures
bench: venv
	$(RUN) $(BIN)/python -m bench.run_all

clean:
	rm -rf $(VENV) $(VENV2) $(VENVX) build *.egg-info .pytest_cache
