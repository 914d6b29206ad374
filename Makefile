# The quick start is `make demo` and `make test`; both bootstrap everything they need.
SHELL := /bin/bash
PYTHON_BOOT ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.knittrans-installed
EXTRAS := admission,reorg,train,ray,mooncake,trl,dev
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
SYSTEM_PACKAGES := redis-server libibverbs1 prometheus
PROTO_OUT := clients/python

.PHONY: demo chaos test bench bench-multinode proto lint venv sysdeps clean image image-base image-sysdeps test-container

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

# The chaos test over many seeds (docs/failures.md, "Chaos test"); not part of `make test`. Each seed's JSON summary
# and log go to chaos-out/; a failing seed reruns alone with the same command.
SEEDS ?= $(shell seq 1 20)
CHAOS_TARGETS ?= all
# CHAOS_CONFIG=examples/demo/chaos-dense.yaml: a fault every 0.8 s on average instead of 3 s.
CHAOS_CONFIG ?= examples/demo/chaos.yaml
chaos: sysdeps venv
	@mkdir -p chaos-out; total=$(words $(SEEDS)); n=0; failed=""; for seed in $(SEEDS); do n=$$((n + 1)); \
	  echo "== chaos seed $$seed ($$n/$$total)"; \
	  $(VENV)/bin/knittrans demo --config $(CHAOS_CONFIG) --chaos $$seed --chaos-targets $(CHAOS_TARGETS) \
	    --out chaos-out/seed-$$seed > chaos-out/seed-$$seed.out 2> chaos-out/seed-$$seed.log || failed="$$failed $$seed"; \
	  tail -n 1 chaos-out/seed-$$seed.out; done; \
	if [ -n "$$failed" ]; then echo "chaos: seeds failed:$$failed"; exit 1; fi; echo "chaos: all $$total seeds passed"

# The container tests run in `make test-container` (the image is built first), not here. Two workers (pytest-xdist):
# the suite waits on its servers' processes for a third of its time, so one worker left the CPUs idle that long.
# TEST_WORKERS=0 runs it in this process.
TEST_WORKERS ?= 2
test: sysdeps venv
	$(PY) -m pytest -q -m "not container" -n $(TEST_WORKERS) --dist worksteal

# Each prints its figures as JSON (progress on stderr); bench-out/ keeps a copy of every result, and the transfer
# benchmark's figure (bench-out/transfer.png). The admission service's cluster-scale grid (issue 16: 64 to 4,096
# trajectories, 5 to 320 consumers) runs last.
BENCHMARKS := admission_engine planner simulate store admission_service dispatch_build admission_client rollout_submit encoder_dedup verdict_wait release_report transfer recovery
bench: sysdeps venv
	@mkdir -p bench-out; set -e; for b in $(BENCHMARKS); do \
	  echo "== benchmarks/$$b.py"; figure=""; if [ "$$b" = transfer ]; then figure="--plot bench-out/transfer.png"; fi; \
	  $(PY) benchmarks/$$b.py $$figure | tee bench-out/$$b.json; done; \
	  echo "== benchmarks/admission_service.py --scale"; \
	  $(PY) benchmarks/admission_service.py --scale --rounds 9 | tee bench-out/admission_service_scale.json

# Across network hosts in Linux network namespaces (root only): cross-node batch reads at an unlimited and a 1 Gbit
# link, and exposed transfer per step (iter vs eager) at both. Elsewhere each prints {"skipped": why} (exit 2).
MULTINODE_BENCHMARKS := multinode multinode_transfer
bench-multinode: sysdeps venv
	@mkdir -p bench-out; for b in $(MULTINODE_BENCHMARKS); do \
	  echo "== benchmarks/$$b.py"; status=0; $(PY) benchmarks/$$b.py > bench-out/$$b.json || status=$$?; \
	  cat bench-out/$$b.json; [ $$status = 0 ] || [ $$status = 2 ] || exit $$status; done

proto: venv
	$(PY) -m grpc_tools.protoc -Iproto --python_out=$(PROTO_OUT) --pyi_out=$(PROTO_OUT) \
	  --grpc_python_out=$(PROTO_OUT) proto/knittrans/v1/*.proto

# Checked with mypy --strict (config in pyproject.toml): the pure cores and the whole SDK (clients/python).
# tests/unit/core/test_types.py reads this list and checks that it names every SDK module.
TYPED_PACKAGES := knittrans.admission.engine knittrans.admission.planning knittrans.reorg.packing \
  knittrans.addresses knittrans.aio knittrans.attach knittrans.blocking knittrans.cli knittrans.client knittrans.int_checks \
  knittrans.config knittrans.connect knittrans.connection_file knittrans.stack.local knittrans.stack.progress \
  knittrans.stack.settings knittrans.stack.up \
  knittrans.errors knittrans.integrations knittrans.job knittrans.launch knittrans.packed knittrans.plan \
  knittrans.retry knittrans.rollout knittrans.reservations knittrans.shm knittrans.stack_dump knittrans.steps knittrans.store \
  knittrans.submission knittrans.submitted_values knittrans.tensor_names knittrans.topology knittrans.train \
  knittrans.trainer knittrans.trajectory_schema knittrans.types knittrans.values \
  knittrans.wire

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/buf lint
	$(VENV)/bin/mypy $(addprefix -p ,$(TYPED_PACKAGES))

# The service image, built with podman from a debootstrap base and a wheelhouse resolved on the host: no
# registry, and the build itself runs without network (docs/deploy.md, "Building the image with podman").
IMAGE := knittrans:0.1.0
IMAGE_EXTRAS := admission,reorg,mooncake
IMAGE_PACKAGES := podman runc debootstrap
WHEELHOUSE := deploy/wheelhouse
# The base image's tag follows the script that makes it, so a change to its package list rebuilds it.
BASE_TAG := bookworm-$(shell sha256sum deploy/podman/base-image.sh | cut -c1-12)
BASE_IMAGE := localhost/knittrans-base:$(BASE_TAG)
WHEELS_RESOLVED := $(WHEELHOUSE)/.resolved-$(BASE_TAG)
DEBIAN_MIRROR ?= $(or $(shell sed -n 's/^URIs: *//p' /etc/apt/sources.list.d/debian.sources 2>/dev/null | head -n1),http://deb.debian.org/debian)
# runc, rlimits podman may set, no systemd: see the file.
image image-base image-sysdeps $(WHEELS_RESOLVED) test-container: export CONTAINERS_CONF = $(CURDIR)/deploy/podman/containers.conf

# Root: debootstrap needs it, and the tests reach pods on podman's bridge network, which rootless podman has not.
image-sysdeps:
	@[ "$$(id -u)" = 0 ] || { echo "make image and make test-container run as root (sudo make image)"; exit 1; }
	@missing=""; for tool in $(IMAGE_PACKAGES); do command -v $$tool >/dev/null || missing="$$missing $$tool"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing system packages:$$missing"; \
	  $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq $$missing >/dev/null; \
	fi
	@for limit in "n 20000" "u 32768"; do set -- $$limit; have=$$(ulimit -H$$1); \
	  [ "$$have" = unlimited ] || [ "$$have" -ge $$2 ] || { \
	    echo "ulimit -H$$1 is $$have: lower default_ulimits in deploy/podman/containers.conf to it"; exit 1; }; done

image-base: image-sysdeps
	@podman image exists $(BASE_IMAGE) || { \
	  echo "building $(BASE_IMAGE) with debootstrap from $(DEBIAN_MIRROR)"; \
	  deploy/podman/base-image.sh $(BASE_IMAGE) $(DEBIAN_MIRROR); }

$(WHEELS_RESOLVED): pyproject.toml setup.py deploy/podman/wheelhouse.sh | venv image-base
	rm -f $(WHEELHOUSE)/.resolved-*
	deploy/podman/wheelhouse.sh $(PY) $(BASE_IMAGE) $(WHEELHOUSE) $(IMAGE_EXTRAS)
	@touch $@

image: image-base $(WHEELS_RESOLVED)
	podman build --network=none --ignorefile deploy/Dockerfile.dockerignore -f deploy/Dockerfile \
	  --build-arg PYTHON_IMAGE=$(BASE_IMAGE) --build-arg PIP_INDEX=--no-index -t $(IMAGE) .
	@podman image ls --format '{{.Repository}}:{{.Tag}} {{.Size}}' localhost/$(IMAGE)

# The image run with the pod's security settings, and the dev overlay under `podman kube play`.
test-container: sysdeps image
	$(PY) -m pytest -q -m container tests/container --container-required

clean:
	rm -rf $(VENV) demo-out .pytest_cache
