# Two commands for a fresh machine: `make demo` and `make test`.
# The install is CPU-only: constraints.txt pins the CPU torch wheel, and sam2 is built
# without build isolation (and without its CUDA extension) so pip never pulls a CUDA torch.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
DEMO := build/demo

.PHONY: install demo test bench clean lint

$(VENV)/.installed: pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -c constraints.txt torch setuptools wheel
	SAM2_BUILD_CUDA=0 $(PY) -m pip install -q --disable-pip-version-check -c constraints.txt \
		--no-build-isolation -e '.[test,dask]'
	# the torchvision wheel sam2 pulls is built for CUDA torch: importing it fails beside the
	# CPU torch, and transformers imports it wherever it is installed. segpipe uses none of it.
	$(PY) -m pip uninstall -q -y torchvision
	touch $@

install: $(VENV)/.installed

demo: install
	$(PY) data/demo.py --out $(DEMO)

# Test files run in parallel, one per worker process (a file's fixtures are built once),
# each worker's torch on one thread: two-thread workers on shared cores spin against each
# other. Every bit-for-bit comparison is between runs under the same thread count.
WORKERS ?= auto

test: install
	@$(PY) -c "import torch, sam2, zarr, av; print(f'tested with torch {torch.__version__}, sam2 1.1.0, zarr {zarr.__version__}, PyAV {av.__version__}')"
	$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check .
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -n $(WORKERS) --dist loadfile --no-loadscope-reorder $(PYTEST_ARGS)

bench: install
	for b in startup decode encode track export overhead 4k dask; do $(PY) benchmarks/bench_$$b.py || exit 1; done

# the one style: imports sorted, code formatted (make test checks it)
lint: install
	$(VENV)/bin/ruff check --fix . && $(VENV)/bin/ruff format .

clean:
	rm -rf build

# The docs site (mkdocs.yml, docs/): the `docs` extra, installed once, then a strict build into
# build/docs, so a broken link or anchor, or an API name that griffe cannot find, fails it.
# griffe reads the source, not the installed package: build/docs_src/segpipe mirrors
# pyproject's package-dir (pipeline/ is `segpipe`, stages/ is `segpipe.stages`) with links.
.PHONY: docs

$(VENV)/.docs-installed: $(VENV)/.installed
	SAM2_BUILD_CUDA=0 $(PY) -m pip install -q --disable-pip-version-check -c constraints.txt \
		--no-build-isolation -e '.[test,dask,docs]'
	touch $@

docs: $(VENV)/.docs-installed
	rm -rf build/docs_src && mkdir -p build/docs_src/segpipe
	for f in pipeline/*; do ln -s ../../../$$f build/docs_src/segpipe/; done
	ln -s ../../../stages build/docs_src/segpipe/stages
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict
