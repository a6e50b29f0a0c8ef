# The two commands a newcomer needs: `make run` and `make test`. Everything installs from this
# repository's own files into .venv; nothing is assumed to be on the machine but python3 (and, for
# the ali-ons compatibility tests, node and npm, which `make test` checks for).

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
RUN_STAMP := $(VENV)/.run-installed
TEST_STAMP := $(VENV)/.test-installed
JS_DIR := tests/compat/js
JS_STAMP := $(JS_DIR)/node_modules/.installed

.PHONY: run spark test check lint typecheck unit bench bench-queues bench-deps bench-failover clean java etcd chromium chaos bench-security bench-metrics fuzz

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

$(RUN_STAMP): pyproject.toml | $(VENV)/bin/python
	$(PY) -m pip install -q -e .
	touch $@

$(TEST_STAMP): pyproject.toml | $(VENV)/bin/python
	$(PY) -m pip install -q -e '.[test]'
	touch $@ $(RUN_STAMP)

$(JS_STAMP): $(JS_DIR)/package.json $(JS_DIR)/package-lock.json
	@command -v npm >/dev/null || { echo "npm is needed for the ali-ons tests: apt-get install -y nodejs npm"; exit 1; }
	cd $(JS_DIR) && npm ci --no-audit --no-fund --loglevel=error
	touch $@

## run: create .venv, install TideMQ, start the name server and a broker in one process (./data);
## NAMESRV_PORT (9876), BROKER_PORT (10911; port - 2 and, with a slave, port + 1 are taken too),
## DATA_DIR (./data) and DEV_ARGS (more `tidemq dev` flags, e.g. --slave) change it
NAMESRV_PORT ?= 9876
BROKER_PORT ?= 10911
DATA_DIR ?= ./data
DEV_ARGS ?=
run: $(RUN_STAMP)
	$(VENV)/bin/tidemq dev --namesrv-port $(NAMESRV_PORT) --broker-port $(BROKER_PORT) \
		--data-dir $(DATA_DIR) $(DEV_ARGS)

## spark: install the Spark connector's extra (pyspark, pyarrow) into .venv, and Java 17 if missing
spark: $(RUN_STAMP) java
	$(PY) -m pip install -q -e '.[spark]'

# The Spark connector's tests (tests/spark) need a Java 17 runtime; install it when missing.
java:
	@command -v java >/dev/null || { \
		command -v apt-get >/dev/null || { echo "Java 17 is needed for tests/spark"; exit 1; }; \
		SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
		$$SUDO apt-get update -q && $$SUDO apt-get install -y -q openjdk-17-jre-headless; }

# Controller mode's tests (tests/controller, tests/integration/test_failover*, tests/chaos) run a
# real etcd: Debian's etcd-server, installed when missing.
etcd:
	@command -v etcd >/dev/null || { \
		command -v apt-get >/dev/null || { echo "etcd (Debian etcd-server) is needed for the failover tests"; exit 1; }; \
		SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
		$$SUDO apt-get update -q && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -q etcd-server; }

# The web console's browser tests (tests/console) drive Debian's headless Chromium through its
# chromedriver (Selenium is told both paths, so it downloads nothing); installed when missing.
chromium:
	@[ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ] || { \
		command -v apt-get >/dev/null || { echo "chromium and chromedriver are needed for tests/console"; exit 1; }; \
		SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
		$$SUDO apt-get update -q && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -q chromium chromium-driver; }

## test: install what the tests need, then lint, type-check, check import rules and run every test
test: $(TEST_STAMP) $(JS_STAMP) java etcd chromium check
	$(PY) -m pytest -q -p no:cacheprovider

check: lint typecheck
	$(VENV)/bin/lint-imports --no-cache

lint: $(TEST_STAMP)
	$(VENV)/bin/ruff check src tests benchmarks examples scripts
	$(VENV)/bin/ruff format --check src tests benchmarks examples scripts

typecheck: $(TEST_STAMP)
	$(VENV)/bin/mypy

unit: $(TEST_STAMP)
	$(PY) -m pytest -q -p no:cacheprovider -m "not compat and not integration and not spark and not chaos and not etcd"

## chaos: the chaos suite's long run (~17 min, as root: network namespaces): 100 seeded fault steps
## on a controller-mode group with etcd; prints one table, exits non-zero on any loss
chaos: $(TEST_STAMP) etcd
	$(PY) -m tidemq.testing.chaos --seed $(or $(SEED),1) --faults $(or $(FAULTS),100) \
		--run-dir $(or $(CHAOS_DIR),/tmp/tidemq-chaos/$(shell date -u +%Y%m%dT%H%M%S))

## fuzz: the decoders' fuzz targets (tidemq.testing.fuzz) for FUZZ_SECONDS (default 600); prints
## examples and distinct failures per target, saves failing inputs in FUZZ_DIR (fuzz-failures/);
## then the network fuzz test for FUZZ_NET_ROUNDS (default 5) random seeds, each printed (a
## failing one is also appended to FUZZ_DIR/network-failed-seeds.txt; replay it with
## TIDEMQ_FUZZ_SEED=N). Exits non-zero on any failure. Meant to run daily (docs/security.md)
FUZZ_DIR_USED = $(or $(FUZZ_DIR),fuzz-failures)
fuzz: $(TEST_STAMP)
	@status=0; \
	$(PY) -m tidemq.testing.fuzz --budget-seconds $(or $(FUZZ_SECONDS),600) \
		--failures-dir $(FUZZ_DIR_USED) || status=1; \
	for round in $$(seq $(or $(FUZZ_NET_ROUNDS),5)); do \
		seed=$$(od -An -N4 -tu4 /dev/urandom | tr -d ' '); \
		echo "network fuzz round $$round: TIDEMQ_FUZZ_SEED=$$seed"; \
		TIDEMQ_FUZZ_SEED=$$seed $(PY) -m pytest -q -s -p no:cacheprovider \
			tests/fuzz/test_network_fuzz.py || { status=1; mkdir -p $(FUZZ_DIR_USED); \
			echo $$seed >> $(FUZZ_DIR_USED)/network-failed-seeds.txt; }; \
	done; \
	exit $$status

BENCH_STAMP := $(VENV)/.bench-installed

$(BENCH_STAMP): pyproject.toml | $(VENV)/bin/python
	$(PY) -m pip install -q -e '.[bench]'
	touch $@ $(RUN_STAMP)

## bench-failover: failover time over 20 kill -9s of the master, and controller mode's produce
## cost against one SYNC_FLUSH broker (~3 min, needs etcd)
bench-failover: $(BENCH_STAMP) etcd
	$(PY) benchmarks/bench_failover.py all --failovers $(or $(FAILOVERS),20) --runs $(or $(RUNS),3)

## bench-security: the cost of ACL and TLS on pipelined produce, as ratios to plain measured in
## the same run (targets: ACL >= 0.9x, TLS >= 0.8x; ~1 min; certificates made for the run)
bench-security: $(TEST_STAMP)
	$(PY) benchmarks/bench_security.py --runs $(or $(RUNS),3)

## bench-metrics: pipelined produce with metrics off vs on (scraped every second), A/B in turns,
## and the loop time of one scrape of a broker with 10,000 queues
bench-metrics: $(TEST_STAMP)
	$(PY) benchmarks/bench_metrics.py --runs $(or $(RUNS),3)

## bench-queues: cost per queue: 10,000 auto-created topics with one 100-byte message each
## (disk, descriptors, RSS, create and restart time against issue 18's targets; ~2 min)
bench-queues: $(TEST_STAMP)
	$(PY) benchmarks/bench_queues.py --topics $(or $(QUEUES),10000)

## bench-deps: the peer brokers (Debian packages) and their Python clients, for `make bench`
bench-deps: $(BENCH_STAMP)
	@command -v redis-server >/dev/null && command -v nats-server >/dev/null \
		&& command -v rabbitmq-server >/dev/null || { \
		command -v apt-get >/dev/null || { echo "install redis-server nats-server rabbitmq-server"; exit 1; }; \
		SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
		$$SUDO apt-get update -q && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -q \
			redis-server redis-tools nats-server rabbitmq-server; }

## bench: TideMQ side by side with Redis, NATS and RabbitMQ (~15 min); appends benchmarks/RESULTS.md;
## then restart time and memory with 1 GiB segments, empty and 10 GiB stores (~3 min, 10 GiB of disk);
## then replication: SYNC_MASTER against one node and NATS R3, lag, a slave's catch-up (~6 min);
## then cost per queue (bench-queues, ~2 min)
bench: bench-deps
	$(PY) benchmarks/run_suite.py --runs $(or $(RUNS),3)
	$(PY) benchmarks/bench_restart.py --store-gib $(or $(RESTART_GIB),10)
	$(PY) benchmarks/bench_replication.py all --runs $(or $(RUNS),3)
	$(PY) benchmarks/bench_queues.py --topics $(or $(QUEUES),10000)

clean:
	rm -rf $(VENV) $(JS_DIR)/node_modules .mypy_cache .ruff_cache
