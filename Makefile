# Two commands for a fresh machine: `make demo` and `make test`.
# The install is CPU-only: constraints.txt pins the CPU torch wheel, and sam2 is built
# without build isolation (and without its CUDA extension) so pip never pulls a CUDA torch.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
DEMO := build/demo

.PHONY: install demo test bench clean

$(VENV)/.installed: pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -c constraints.txt torch setuptools wheel
	SAM2_BUILD_CUDA=0 $(PY) -m pip install -q --disable-pip-version-check -c constraints.txt \
		--no-build-isolation -e '.[test,dask]'
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
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -n $(WORKERS) --dist loadfile $(PYTEST_ARGS)

bench: install
	for b in startup decode encode track export overhead 4k dask; do $(PY) benchmarks/bench_$$b.py || exit 1; done

clean:
	rm -rf build
