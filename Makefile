# npumem: `make run` builds and runs the demo on the simulated device; `make test` builds and
# runs every check. Both create and use the local virtual environment .venv.

PYTHON ?= python3
VENV := .venv
BIN := $(abspath $(VENV))/bin
STAMP := $(VENV)/.deps-stamp
export VIRTUAL_ENV := $(abspath $(VENV))
export PATH := $(BIN):$(PATH)

.PHONY: run test build wheel lint test-rust test-loom test-python browser fuzz miri bench check-gpu clean

# After the demo: a tiny PyTorch model on the npu device (host mode, 1 GiB), then whether a
# 2-layer Llama-style training step fits 16 GiB (shape mode: shapes only, seconds).
run: build
	npumem demo
	@echo; echo "== Your PyTorch program on a simulated NPU (npumem.torch) =="
	NPUMEM_CAPACITY=1GiB python -m npumem.torch examples/tiny_npu.py
	npumem fit --mode shape --capacity 16GiB examples/llama_train_step.py --layers 2 --seq 256

test: build lint test-rust test-loom test-python

# torch (requirements-torch.txt, a few minutes the first time) is installed with the rest: the
# tests of npumem.torch need it, and under CI=true they fail without it rather than skip.
$(STAMP): requirements-dev.txt requirements-torch.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -r requirements-dev.txt
	$(BIN)/python -m pip install -q -r requirements-torch.txt
	touch $(STAMP)

# Release build of the extension, installed into .venv (editable for the Python sources); its
# build script (crates/npumem-py/build.rs) builds libnpumem (the C ABI, crates/npumem-capi) and
# puts it with its header into the package, as it does for every wheel. The stand-in runtimes
# the tests load in place of AscendCL and the CUDA driver (crates/npumem-fake-*) go to
# target/stand-ins (libascendcl.so, libcuda.so and the libcuda.so.1 the loader looks for);
# `install` replaces a file rather than rewriting it under a process that has it loaded.
STAND_INS := target/stand-ins
build: $(STAMP)
	cargo build -p npumem-fake-acl -p npumem-fake-cuda --release -q
	install -D -m 755 target/release/libascendcl.so $(STAND_INS)/libascendcl.so
	install -D -m 755 target/release/libcuda.so $(STAND_INS)/libcuda.so
	ln -sf libcuda.so $(STAND_INS)/libcuda.so.1
	maturin develop --release -q

# A wheel (in target/wheels) that carries libnpumem.so and npumem.h beside the extension (for
# .venv's interpreter, so the artifacts of `build` are reused).
wheel: build
	maturin build --release -i $(BIN)/python

lint: $(STAMP)
	cargo fmt --all --check
	cargo clippy --workspace --all-targets -q -- -D warnings
	ruff check python tests benches fuzz examples
	ruff format --check python tests benches fuzz examples

# npumem-fuzz replays the kept fuzz inputs (fuzz/regressions) through the fuzz harnesses. The
# backends' tests load the stand-in runtimes from target/debug, built first.
test-rust:
	cargo build -p npumem-fake-acl -p npumem-fake-cuda -q
	cargo test -p npumem-base -p npumem-plan -p npumem-hostpool -p npumem-tlb -p npumem-core -p npumem-sync \
		-p npumem-fuzz -p npumem-capi -p npumem-fake -p npumem-ffi -q

# Model checks of the lock-free structures (a separate build with --cfg loom).
test-loom:
	RUSTFLAGS="--cfg loom" cargo test -p npumem-sync --release -q --test loom --target-dir target/loom

# The report's browser test needs Debian's chromium: under CI=true it is installed here (as root)
# or the run fails; elsewhere the test skips and says how to install it.
browser:
	@if [ "$$CI" = "true" ] && ! command -v chromium >/dev/null 2>&1; then \
		if [ "$$(id -u)" = 0 ]; then \
			apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
		else echo "CI=true: the browser test needs chromium (apt-get install chromium, as root)" >&2; exit 1; fi; \
	fi

# pytest exits 5 when it collects no test: that must fail, never pass vacuously.
test-python: build browser
	python -m pytest; rc=$$?; if [ $$rc -eq 5 ]; then echo "pytest collected no tests" >&2; exit 1; fi; exit $$rc

# Fuzzing (nightly + cargo-fuzz, and atheris for the Python readers; not part of `make test`):
# every target for FUZZ_SECONDS seconds, one job. See docs/fuzzing.md.
FUZZ_SECONDS ?= 60
FUZZ_TARGETS ?=
fuzz: build
	python -m pip install -q -r fuzz/requirements.txt
	@cargo +nightly fuzz --version >/dev/null 2>&1 || { echo "installing cargo-fuzz (once)"; cargo install -q --locked cargo-fuzz; }
	cargo +nightly fuzz build
	fuzz/run.sh $(FUZZ_SECONDS) $(FUZZ_TARGETS)

# Miri (nightly) over the unsafe and lock-free code: npumem-sync's tests under several thread
# schedules; the host pool's link tables (a test sized for the interpreter) and the device's
# host heap, whose addresses are integers (hence permissive provenance). See docs/fuzzing.md.
MIRI_SEEDS ?= 0..4
miri:
	rustup +nightly component add miri rust-src
	MIRIFLAGS="-Zmiri-many-seeds=$(MIRI_SEEDS)" cargo +nightly miri test -p npumem-sync --lib
	MIRIFLAGS="-Zmiri-permissive-provenance" cargo +nightly miri test -p npumem-hostpool --lib -- \
		tests::link_tables_hand_blocks_over_once
	MIRIFLAGS="-Zmiri-permissive-provenance" cargo +nightly miri test -p npumem-core --lib -- host::tests::

# Benchmarks and checks: `make bench B=name` runs one (B defaults to malloc); benches/README.md
# says what each measures, the peers it runs beside, and where its figures are in
# docs/benchmarks.md. `make bench B=list` (or an unknown name) prints the names.
B ?= malloc
BENCHES := malloc replay replay-speed flat-latency buffer streams fastpath pools plan schedule tlb \
	validate-tlb host pagesize sweep workloads stress pyacl python memory-viz gpu torch-device \
	snapshot-pickle torch-shape
.PHONY: $(addprefix bench/,$(BENCHES) list unknown)

bench: $(if $(filter $(B),$(BENCHES) list),bench/$(B),bench/unknown)

bench/list:
	@echo "make bench B=name, with name one of:"; for b in $(BENCHES); do echo "  $$b"; done

bench/unknown: bench/list
	@echo "make bench: no benchmark named '$(B)'" >&2; exit 1

# The Python allocation benchmark: Device.malloc/free against the other families.
bench/malloc: build
	python benches/bench_malloc.py

bench/replay: build
	python benches/bench_replay.py

# The native replay's rate on 10^7-event traces with about 2,000 live blocks (training steps with
# fixed shapes, and a random churn over 8 sizes), per family: M events/s of wall and CPU time, and
# the same events made one by one (malloc / free) for the ratio.
REPLAY_EVENTS ?= 10000000
bench/replay-speed:
	cargo build -p npumem-core --release --example replay_loop -q
	for fam in npumem pytorch torch_npu; do for shape in training 8; do \
		echo "$$fam $$shape: `BASELINE=1 target/release/examples/replay_loop $(REPLAY_EVENTS) 2000 $$shape $$fam`"; done; done

# Per-allocation latency at 10^3, 10^5 and 10^6 live blocks, every family.
bench/flat-latency:
	cargo build -p npumem-core --release --example flat_latency -q
	target/release/examples/flat_latency

# Device.buffer create+drop against np.empty(4096)+del in the same run.
bench/buffer: build
	python benches/bench_buffer.py

bench/streams: build
	python benches/bench_streams.py

bench/fastpath: build
	cargo bench -p npumem-core --bench device
	python benches/bench_fastpath.py

bench/pools:
	cargo bench -p npumem-hostpool --bench pools

bench/schedule: build
	python benches/bench_schedule.py

bench/plan: build
	python benches/bench_plan.py
	python benches/bench_graphs.py

# The TLB model against this machine's pointer chase (4 KiB pages and 2 MiB THP, 64 KiB-64 MiB at
# 4 points an octave, best of 7 interleaved rounds, costs fitted on 4 KiB only): table, JSON, plot.
bench/validate-tlb: build
	python -m npumem tlb validate --rounds 7 --json target/tlb-validate.json --plot target/tlb-validate.png

# The TLB model's speed from Python: streaming, strided, uniform random and Zipf over 1 GiB of
# 2 MiB and of 4 KiB pages, beside the reference model; then the criterion benches.
bench/tlb: build
	python benches/bench_tlb.py
	cargo bench -p npumem-core --bench vm -- tlb

# Real memory: pooled allocation on the host backend against a mapping per call, glibc malloc and
# numpy.
bench/host: build
	python benches/bench_host.py

# 4 KiB against 2 MiB pages under a pointer chase and GEMMs. It reserves 2 MiB pages through
# /proc/sys/vm/nr_hugepages when it can (as root) and gives them back; otherwise it uses
# transparent huge pages, and says which.
bench/pagesize: build
	python benches/bench_pagesize.py --json target/bench-pagesize.json

# A sweep of 504 cells (TLB presets x page sizes x patterns x footprints, and allocator families x
# alloc_conf x workloads x capacities) on a two-worker Dask LocalCluster, then its self-contained
# HTML report (with the host page-size measurements of `make bench B=pagesize` when
# target/bench-pagesize.json exists). Several minutes on two cores; a rerun reads the cache.
SWEEP_DEMO := target/sweeps/demo
bench/sweep: build
	npumem sweep examples/sweeps/demo.toml --out $(SWEEP_DEMO) --workers 2
	npumem report $(SWEEP_DEMO) --out $(SWEEP_DEMO)/report.html \
		$(if $(wildcard target/bench-pagesize.json),--host-pagesize target/bench-pagesize.json)

# Every generated workload on every family, and per-allocation latency as the pool of a
# long-running service grows; the fragmentation search against every family.
bench/workloads: build
	python benches/bench_workloads.py

STRESS_EVALUATIONS ?= 1500
bench/stress: build
	python benches/bench_stress.py --evaluations $(STRESS_EVALUATIONS)

# Every Python allocation entry point against its floor and peers in one table (numpy, pyarrow's
# pools, the Device calls pyACL wraps, one thread against four), with callgrind instruction counts.
bench/python: build
	python benches/bench_python.py --instructions

# The pyACL layer (npumem.acl): its cost per call beside Device's, and a P2P copy's time.
bench/pyacl: build
	python benches/bench_pyacl.py

# The PyTorch npu device (npumem.torch, host mode) against plain CPU: per-op cost and a
# ResNet-style training step.
bench/torch-device: build
	python benches/bench_torch_device.py

# The snapshot-pickle admission scan (Rust) beside pickle.loads and the scan's Python model.
bench/snapshot-pickle: build
	python benches/bench_snapshot_pickle.py

# The npu device in shape mode: the Llama-style 7B training step (npumem fit at 80 and 192 GiB,
# then in-process: ops/s, peaks, host memory) and per-op cost beside the meta device and the CPU.
bench/torch-shape: build
	python benches/bench_torch_shape.py

# PyTorch's own memory_viz (stats, trace, segments, memory, trace_plot, segment_plot, compare) on
# snapshots written by every allocator family and by `npumem replay --snapshot`. memory_viz comes
# from NPUMEM_MEMORY_VIZ, an installed torch, or the torch wheel on PyPI (downloaded once into
# target/memory-viz, ~0.5 GiB); the flamegraph commands use inferno's inferno-flamegraph
# (crates.io, built once) in place of the flamegraph.pl memory_viz downloads.
MEMORY_VIZ_DIR := target/memory-viz
bench/memory-viz: build
	@test -x $(MEMORY_VIZ_DIR)/bin/inferno-flamegraph || cargo install -q --locked inferno --root $(MEMORY_VIZ_DIR)
	mv=$$(python tests/fetch_memory_viz.py $(MEMORY_VIZ_DIR)) && \
	NPUMEM_MEMORY_VIZ=$$mv NPUMEM_FLAMEGRAPH=$(abspath $(MEMORY_VIZ_DIR))/bin/inferno-flamegraph \
		python -m pytest -q -rs tests/test_memory_viz.py

# Real accelerators: the CUDA backend's tests and a short benchmark against the real driver
# (libcuda.so.1 from the loader path; NPUMEM_CUDA_LIB is not used). Without a GPU and driver it
# prints one line saying why and succeeds. On Ascend hardware: NPUMEM_BACKEND=acl.
bench/gpu: build
	@reason=$$(env -u NPUMEM_CUDA_LIB -u NPUMEM_ACL_LIB python benches/bench_gpu.py --probe); \
	if [ -n "$$reason" ]; then echo "bench gpu: skipped: $$reason"; exit 0; fi; \
	env -u NPUMEM_CUDA_LIB -u NPUMEM_ACL_LIB NPUMEM_CHECK_GPU=1 python -m pytest -q tests/test_gpu.py && \
	env -u NPUMEM_CUDA_LIB -u NPUMEM_ACL_LIB python benches/bench_gpu.py

# One prepared command for a machine with an NVIDIA GPU (about 3 minutes, within 8): the CUDA
# backend's tests against the real driver (tests/test_gpu.py: the runtime rules, libnpumem from
# several threads) and the benchmark (pooled malloc + free against cuMemAlloc / cuMemFree, the
# map cost by page size), their output in target/check-gpu/, then one summary line. Without a
# GPU and driver the line says so and the target succeeds.
GPU_ENV := env -u NPUMEM_CUDA_LIB -u NPUMEM_ACL_LIB
check-gpu: build
	@mkdir -p target/check-gpu; \
	reason=$$($(GPU_ENV) python benches/bench_gpu.py --probe); \
	if [ -n "$$reason" ]; then echo "check-gpu: no GPU here ($$reason); nothing to check"; exit 0; fi; \
	$(GPU_ENV) NPUMEM_CHECK_GPU=1 timeout 360 python -m pytest -q -p no:cacheprovider tests/test_gpu.py \
		> target/check-gpu/tests.txt 2>&1; t=$$?; \
	$(GPU_ENV) timeout 120 python benches/bench_gpu.py --quick > target/check-gpu/bench.txt 2>&1; b=$$?; \
	tests=$$(tail -n 1 target/check-gpu/tests.txt); bench=$$(grep -m1 '^summary:' target/check-gpu/bench.txt); \
	echo "check-gpu: tests: $$tests (exit $$t); bench (exit $$b): $${bench#summary: }; see target/check-gpu/"; \
	[ $$t -eq 0 ] && [ $$b -eq 0 ]

clean:
	rm -rf $(VENV) target python/npumem/*.so python/npumem/npumem.h fuzz/target
