# Entry points for a fresh machine with Python 3.11+ (see README.md):
#   make run    install into .venv and run the quickstart study on the embedded digits data
#   make test   install into .venv (with test extras) and run the test suite
#   make bench  the reduced scale benchmark (below)
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
# The original MNIST / Fashion-MNIST files (tests read them from here; never copied into the repo).
export FEDNET_DATA ?= $(abspath ../shared/data)
# The same floating-point kernels on every x86-64 host (AVX2; fednet/runtime.py: PORTABLE_KERNELS, which
# fednet.configure_host() sets where unset: the fednet command, run_study, the Dask workers, conftest.py), set here too
# so that they hold from the first import of NumPy in any process the tests start.
export OPENBLAS_CORETYPE ?= Haswell
export NPY_DISABLE_CPU_FEATURES ?= X86_V4 AVX512_ICL AVX512_SPR
export MKL_CBWR ?= AVX2
export ATEN_CPU_CAPABILITY ?= avx2
# One BLAS/OpenMP thread, as every study run has (fednet.study.threads): the pinned traces do not depend on the cores.
export OMP_NUM_THREADS ?= 1

.PHONY: run test bench clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $@

run: $(VENV)/.installed
	$(VENV)/bin/fednet run studies/quickstart.toml

test: $(VENV)/.installed
	$(PY) -m pytest -q

# The reduced scale benchmark (benchmarks/bench_scale.py --quick: every protocol at D = 1,000 and the exact kernels'
# ratios to float64, a few minutes); every benchmark's own reduced command: tests/test_benchmarks_smoke.py.
bench: $(VENV)/.installed
	$(PY) benchmarks/bench_scale.py --quick

clean:
	rm -rf $(VENV) results .pytest_cache
