# The two commands of the README: `make train` and `make test`.
# Each creates the virtualenv, installs the pinned requirements and Debian's
# FashionMNIST when they are missing, then runs. ARGS passes flags to the trainer.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
ARGS   ?=
DATA   := /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz
SUDO   := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: install data hosts horovod train test check bench pages clean

install: $(VENV)/.installed

$(VENV)/.installed: requirements.txt requirements-test.txt pyproject.toml
	@$(PYTHON) -c 'import sys; assert sys.version_info < (3, 12), "gluon_gpu needs Python <= 3.11 (numpy 1.23.5 for mxnet 1.9.1)"'
	@echo "make: installing into $(VENV): the pinned requirements (requirements-test.txt) and gluon_gpu itself"
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements-test.txt
	$(PY) -m pip install --quiet --no-deps -e .
	touch $@

# Debian's copy of FashionMNIST; without it (not Debian, not root) the trainer
# falls back to MXNet's download, or says how to get the data.
data:
	@[ -f $(DATA) ] || { echo "make: installing Debian's dataset-fashion-mnist (apt-get): the real FashionMNIST that training and the tests use"; \
	  $(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq dataset-fashion-mnist; } \
	  || echo "warning: could not install dataset-fashion-mnist; pass --data-dir or let MXNet download" >&2

# Debian's openssh-server, for the tests that run jobs across network-namespace hosts, and
# Debian's slurm-wlm and munge, for the tests that run jobs in a Slurm cluster they start
# on this machine (root only; elsewhere those tests are skipped and say why).
hosts:
	@[ -x /usr/sbin/sshd ] || [ "$$(id -u)" != 0 ] || { echo "make: installing Debian's openssh-server (apt-get, as root): the multi-host tests start jobs over ssh between network namespaces on this machine"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
	  apt-get install -y -qq --no-install-recommends openssh-server openssh-client >/dev/null; } \
	  || echo "warning: could not install openssh-server; the multi-host tests will be skipped" >&2
	@[ -x /usr/sbin/slurmd ] || [ "$$(id -u)" != 0 ] || { echo "make: installing Debian's slurm-wlm and munge (apt-get, as root): the Slurm tests start slurmctld, slurmd and munged on this machine and submit jobs with sbatch"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
	  apt-get install -y -qq --no-install-recommends slurm-wlm munge >/dev/null; } \
	  || echo "warning: could not install slurm-wlm and munge; the Slurm tests will be skipped" >&2

# Horovod 0.28.1 with MXNet and Gloo (no MPI), for --kvstore horovod and launch --engine
# horovod: built once per machine from its source against this MXNet (a C++ compiler and
# cmake < 4, which pip brings; 2.5 to 3.5 minutes on 2 cores of an AMD EPYC, 2026-12-07),
# the wheel kept in HOROVOD_WHEELS and installed from there by every later venv. A cached
# wheel that does not install (cut short, damaged) is built again; a build lands in the
# cache whole (built beside it, then renamed). Under CI=true a build that fails fails the
# run (its tests would be skipped); elsewhere it is a warning and the tests say they skip.
HOROVOD_WHEELS ?= $(HOME)/.cache/gluon_gpu/wheels
HOROVOD_WHEEL  := $(HOROVOD_WHEELS)/horovod-0.28.1-*.whl
HOROVOD_BUILD  := HOROVOD_WITH_MXNET=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 \
                  HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_PYTORCH=1 PATH="$(abspath $(VENV))/bin:$$PATH"
horovod: install
	@$(PY) -c 'import horovod.mxnet' 2>/dev/null || $(PY) -m pip install --quiet $(HOROVOD_WHEEL) 2>/dev/null || { \
	  rm -f $(HOROVOD_WHEEL); mkdir -p $(HOROVOD_WHEELS) && build=$$(mktemp -d $(HOROVOD_WHEELS)/.build-XXXXXX) && \
	  echo "make: building Horovod 0.28.1 with MXNet and Gloo into $(HOROVOD_WHEELS), once (about 3 minutes on 2 cores)" && \
	  $(PY) -m pip install --quiet wheel "cmake<4" && \
	  $(HOROVOD_BUILD) $(PY) -m pip wheel --quiet --no-build-isolation --no-deps horovod==0.28.1 -w $$build && \
	  mv $$build/horovod-0.28.1-*.whl $(HOROVOD_WHEELS)/ && rm -rf $$build && \
	  $(PY) -m pip install --quiet $(HOROVOD_WHEEL); } || { rm -rf $(HOROVOD_WHEELS)/.build-*; \
	  if [ -n "$$CI" ]; then echo "make: error: the Horovod build failed; CI=true runs its tests, so this run fails" >&2; exit 1; fi; \
	  echo "warning: could not build Horovod; the Horovod tests will be skipped" >&2; }

train: install data
	$(PY) -m gluon_gpu.train $(ARGS)

# Two pytest workers, a test file each at a time (module fixtures stay in one process):
# most tests wait on process start-up, so the suite takes about 60% of its serial time.
test: install data hosts horovod
	$(PY) -m pytest -n 2 --dist loadfile --durations 15

# A quick subset (tests marked quick in tests/conftest.py), under 2 minutes: for local work.
check: install data
	$(PY) -m pytest -m quick -q

bench: install data
	$(PY) -m gluon_gpu.bench $(ARGS)

# Every measured page regenerated at the current version (scripts/pages.py; about 45 minutes).
pages: install data
	$(PY) scripts/pages.py $(ARGS)

clean:
	rm -rf $(VENV) runs .pytest_cache
