# gpuplatform: `make run` starts the whole platform, `make test` runs the whole suite.
# Every target does its own set-up (venv, pinned install) so a fresh clone needs nothing else.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat requirements.txt requirements-dev.txt | cksum | cut -d' ' -f1)

.PHONY: install run test lint bench clean browser chaos docs images

$(STAMP): requirements.txt requirements-dev.txt
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --disable-pip-version-check -r requirements-dev.txt
	rm -f $(VENV)/.installed-*; touch $(STAMP)

# Browser assets from npm (package.json: xterm.js for the job page's terminal), never committed.
node_modules/.package-lock.json: package.json package-lock.json
	npm ci --no-audit --no-fund --ignore-scripts || echo "no npm or no registry: the in-browser terminal is left out (docs/interactive.md)"

install: $(STAMP) node_modules/.package-lock.json

run: install  # the demo tokens are kept between runs; `make run ROTATE_DEMO_TOKENS=1` replaces them
	$(BIN)/python -m gpuplatform.launch $(if $(ROTATE_DEMO_TOKENS),--rotate-demo-tokens)

# Checks and tests need a secret key; this one exists only for them (never for `make run`).
lint test bench chaos docs: export SECRET_KEY ?= make-check-not-a-secret

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy apps gpuplatform workers  # normal mode; strict on apps/scheduling/core (pyproject.toml)
	$(BIN)/python manage.py check
	$(BIN)/python manage.py makemigrations --check --dry-run
	$(BIN)/python -m scripts.check_core_imports
	$(BIN)/lint-imports --no-cache  # the app layers and no cycles (pyproject.toml, docs/architecture.md)
	$(BIN)/python -m scripts.check_private_names
	$(BIN)/python -m scripts.docs_reference --check
	d=$$(mktemp -d) && NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet --site-dir $$d && rm -rf $$d  # links between pages checked

# The docs site (MkDocs, mkdocs.yml) into site/; the reference pages are regenerated from the code first.
docs: install
	$(BIN)/python -m scripts.docs_reference
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

# The browser tests drive Debian's Chromium through Playwright (never a browser download).
browser:
	test -x /usr/bin/chromium || (apt-get update && apt-get install -y chromium)

# The image tests (docs/images.md) pull with skopeo and unpack with umoci, from images they build
# with busybox-static and serve with docker-registry (htpasswd: apache2-utils), all Debian's.
images:
	test -x /usr/bin/skopeo -a -x /usr/bin/umoci -a -x /usr/bin/docker-registry -a -x /bin/busybox -a -x /usr/bin/htpasswd || \
	  (apt-get update && apt-get install -y --no-install-recommends skopeo umoci docker-registry busybox-static apache2-utils)

test: lint browser images
	$(BIN)/python -m pytest

bench: install
	$(BIN)/python -m bench.run_all

# Break the platform on purpose (docs/reliability.md): two dispatchers place 1,000 jobs, then
# 250 more run while agents, a dispatcher and Redis are killed at random; prints the counts.
chaos: install
	$(BIN)/python -m scripts.chaos

clean:
	rm -rf var .pytest_cache site

# The API fuzzed from its own OpenAPI document, deeper than `make test` does (docs/architecture.md).
fuzz: export SECRET_KEY ?= make-check-not-a-secret
fuzz: install
	GPUPLATFORM_FUZZ_EXAMPLES=$${FUZZ_EXAMPLES:-80} $(BIN)/python -m pytest tests/api/test_schema_fuzz.py -p no:cacheprovider -o timeout=1200
