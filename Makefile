# sparkops.appliance - the two commands a newcomer runs:
#   make lab    run the main job (playbooks/site.yml) on the built-in lab of simulated Sparks
#   make test   run the whole test suite (unit, lint, sanity, every Molecule scenario)
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
PYTHON ?= python3
LAB_INVENTORY ?= inventories/lab
export ANSIBLE_CONFIG := $(CURDIR)/ansible.cfg
export ANSIBLE_FORCE_COLOR ?= 0
export PY_COLORS ?= 0

DEPS_STAMP := build/.deps-$(shell cat requirements.txt requirements-test.txt | sha256sum | cut -c1-12)
LAB_IMAGE = $(shell lab/image/tag.sh)
LAB_RUNTIME_IMAGE = $(shell lab/runtime/tag.sh)
LAB_MODEL_DIR := /var/cache/sparkops/models/tiny-llama
# The Molecule scenarios in two lanes side by side (tests/run_scenarios.py): a lane's scenarios one
# after the other. Scenarios that build into the same runtime image repository share a lane.
# Balanced by a quiet run's times in seconds (stop 47, ci-i): rollout 1278, serve 1055 (+ about 150 for
# stop 48's rollout and verify of two models) | production 997, cluster 1007, drivers 111, memwatch 144,
# checkpoint 86, ple 205 (about 2480 | 2550; with ple in the first lane it was 2538 + 150 | 2345).
MOLECULE_LANES ?= rollout,serve production,cluster,drivers,memwatch,checkpoint,ple
TIMED := tests/timed.sh

.PHONY: lab lab-down lab-image runtime-image lab-model lab-model-timed engine deps test checks unit lint sanity molecule clean

## make lab: engine + lab images + tiny model + lab Sparks, then the site playbook on them
lab: deps lab-model
	ansible-playbook -i $(LAB_INVENTORY) lab/lab.yml -e lab_image=$(LAB_IMAGE)
	SPARKOPS_LAB_RUNTIME_IMAGE=$(LAB_RUNTIME_IMAGE) ansible-playbook -i $(LAB_INVENTORY) playbooks/site.yml
	ansible-playbook -i $(LAB_INVENTORY) playbooks/plan.yml

## make lab-down: remove the lab Sparks, their serving containers and the lab network
lab-down: deps
	ansible-playbook -i $(LAB_INVENTORY) lab/lab.yml -e lab_state=absent

## make test: everything CI runs. The unit tests, then lint and sanity, run one after the other
## while the lab images build (on a fresh machine mostly downloads and disk, minutes CI's budget
## counts); each side's output is printed whole when it ends. The Molecule scenarios (which need those
## images) run after, in two lanes. At the end: the wall time of every suite and scenario.
test: deps
	@mkdir -p build && rm -f build/times.tsv
	$(MAKE) --no-print-directory -j2 --output-sync=target checks lab-model-timed
	$(MAKE) --no-print-directory molecule
	@$(PYTHON) tests/run_scenarios.py --report build/times.tsv
	@echo "make test: all suites passed"

## make checks: the suites that need no lab image, one after the other (never beside each other)
checks: deps
	$(MAKE) --no-print-directory unit
	$(MAKE) --no-print-directory lint
	$(MAKE) --no-print-directory sanity

## pytest-xdist: one worker more than cores (a test that waits on a job or a stand-in leaves its core to
## another), and each file's tests on one worker (a file's batch fixture, one ansible-playbook run for
## many cases, runs once, not once per worker)
UNIT_WORKERS ?= $(shell echo $$(( $$(nproc) + 1 )))
unit: deps
	$(TIMED) unit $(PYTHON) -m pytest -q -n $(UNIT_WORKERS) --dist loadfile tests/unit

lint: deps
	$(TIMED) lint ansible-lint --offline

sanity: deps
	$(TIMED) sanity tests/sanity/run.sh

molecule: deps lab-model
	SPARKOPS_LAB_IMAGE=$(LAB_IMAGE) SPARKOPS_LAB_RUNTIME_IMAGE=$(LAB_RUNTIME_IMAGE) \
	  $(PYTHON) tests/run_scenarios.py --lanes "$(MOLECULE_LANES)"

## the lab images and model, timed (make test's image side)
lab-model-timed: deps
	$(TIMED) "lab images and model" $(MAKE) --no-print-directory lab-model

engine:
	lab/engine.sh

lab-image: engine
	lab/image/build.sh $(LAB_IMAGE)

## the lab's CPU vLLM image (offline, from a wheelhouse made here; cached by recipe hash)
runtime-image: lab-image
	lab/runtime/build.sh

## the tiny Llama the lab serves (made here, never downloaded)
lab-model: runtime-image
	test -f $(LAB_MODEL_DIR)/model.safetensors || lab/runtime/make_model.sh $(LAB_MODEL_DIR)

## rsync: the checkpoint role's peer source pulls with it, and its unit test runs a real one;
## haproxy: the gateway role's unit test runs Debian's (its configuration, its runtime API);
## promtool (Debian's prometheus): the monitoring role's rule tests run the real one
deps: $(DEPS_STAMP)
	@command -v rsync >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq rsync >/dev/null; }
	@test -x /usr/sbin/haproxy || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq haproxy >/dev/null; }
	@command -v promtool >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null; }
$(DEPS_STAMP): requirements.txt requirements-test.txt
	$(PYTHON) -m pip install -q -r requirements-test.txt
	@mkdir -p build && rm -f build/.deps-* && touch $@

clean:
	rm -rf build tests/output .pytest_cache
