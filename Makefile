# The README's commands. Each target does its own setup on a fresh machine.
PYTHON ?= python3
VENV ?= .venv
BIN := $(abspath $(VENV))/bin
# spark-submit finds SPARK_HOME (pyspark) only with the venv's bin on PATH.
RUN := PATH="$(BIN):$$PATH" PYSPARK_PYTHON="$(BIN)/python"
PYTEST_ARGS ?=

.PHONY: venv test demo proto bench clean

venv: $(VENV)/.installed

$(VENV)/.installed: setup.cfg pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --upgrade "pip>=24" >/dev/null
	$(BIN)/pip install -e '.[spark,dev]'
	touch $@

## make test: the whole suite (real nats-server, spark-submit and Airflow)
test: venv
	$(RUN) $(BIN)/python -m pytest -q -rs $(PYTEST_ARGS)

## make demo: simulate plgd traffic into a local nats-server and run the ETL DAG through Airflow
demo: venv
	$(RUN) $(BIN)/python -m airflow_provider_plgd.demo

## make proto: regenerate airflow_provider_plgd/plgd/pb from our .proto files
proto: venv
	cd airflow_provider_plgd/plgd && $(BIN)/python -m grpc_tools.protoc -Iproto \
		--python_out=pb --pyi_out=pb proto/eventbus.proto proto/resourceaggregate.proto proto/identitystore.proto

## make bench: the benchmarks; they print figures
bench: venv
	$(RUN) $(BIN)/python -m bench.run_all

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
