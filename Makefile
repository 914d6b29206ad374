# The quick start is `make demo` and `make test`; both bootstrap everything they need.
SHELL := /bin/bash
PYTHON_BOOT ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.knittrans-installed
EXTRAS := admission,reorg,train,ray,mooncake,dev
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
SYSTEM_PACKAGES := redis-server libibverbs1 prometheus
PROTO_OUT := clients/python

.PHONY: demo test bench proto lint venv sysdeps clean

venv: $(STAMP)

# torch is installed first and pinned, so nothing afterwards can pull a multi-GB CUDA build.
$(STAMP): pyproject.toml setup.py
	@test -x $(PY) || $(PYTHON_BOOT) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e ".[$(EXTRAS)]"
	@touch $(STAMP)

sysdeps:
	@missing=""; \
	command -v redis-server >/dev/null || missing="$$missing redis-server"; \
	command -v promtool >/dev/null || missing="$$missing prometheus"; \
	ldconfig -p | grep -q libibverbs.so.1 || missing="$$missing libibverbs1"; \
	if [ -n "$$missing" ]; then \
	  echo "installing system packages:$$missing"; \
	  $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq $(SYSTEM_PACKAGES) >/dev/null; \
	fi

demo: sysdeps venv
	$(VENV)/bin/knittrans demo

test: sysdeps venv
	$(PY) -m pytest -q

# Each prints its figures as JSON (progress on stderr); bench-out/ keeps a copy of every result.
BENCHMARKS := admission_engine planner simulate store admission_service admission_client encoder_dedup transfer
bench: sysdeps venv
	@mkdir -p bench-out; set -e; for b in $(BENCHMARKS); do \
	  echo "== benchmarks/$$b.py"; $(PY) benchmarks/$$b.py | tee bench-out/$$b.json; done

proto: venv
	$(PY) -m grpc_tools.protoc -Iproto --python_out=$(PROTO_OUT) --pyi_out=$(PROTO_OUT) \
	  --grpc_python_out=$(PROTO_OUT) proto/knittrans/v1/*.proto

# Checked with mypy --strict (config in pyproject.toml); tests/unit/core/test_types.py reads this list.
TYPED_PACKAGES := knittrans.admission.engine knittrans.admission.planning knittrans.reorg.packing knittrans.plan \
  knittrans.wire knittrans.client knittrans.train knittrans.config knittrans.shm knittrans.errors knittrans.retry \
  knittrans.types knittrans.tensor_names knittrans.store.arrays knittrans.packed

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/buf lint
	$(VENV)/bin/mypy $(addprefix -p ,$(TYPED_PACKAGES))

clean:
	rm -rf $(VENV) demo-out .pytest_cache
