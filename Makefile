# shardcache: the two commands of the README.
#   make demo   the seed experiment: hub, 60 ms WAN emulator, spoke, simulated trainer
#   make test   formatting, lints and every test, exactly what CI runs
#   make check  the fast loop: formatting, lints and every crate's unit tests
#   make load   ghz load tests against a hub and a spoke (summary in target/load/)
#   make dist   what users install: portable binaries, the manylinux wheel, container images
.PHONY: demo test check load dist deps build lint

CARGO ?= cargo
# RocksDB's C++ goes through ccache (installed by `make deps`): see scripts/ensure-deps.sh.
export CC := ccache cc
export CXX := ccache c++
export CCACHE_DIR ?= $(HOME)/.cache/ccache
# The S3 tests' server (moto), installed by scripts/ensure-test-deps.sh.
export SHARDCACHE_MOTO_SERVER ?= $(HOME)/.cache/shardcache/venv/bin/moto_server

deps:
	@scripts/ensure-deps.sh

# Release binaries: the demo measures, and a debug build would measure the debug build.
demo: deps
	$(CARGO) build --release --workspace --bins
	@scripts/demo.sh

lint: deps
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

# The fast loop between `cargo check` and `make test`: formatting, lints, every crate's
# unit tests and the structural tests (tests/tests/architecture.rs); no servers, no
# Python, no containers. 35 s after a one-line change in the spoke on a warm 2-core
# machine (BENCHMARKS.md, First hour, "the development loop").
check: lint
	$(CARGO) test --workspace --lib --bins --test architecture

# The end-to-end tests start the built binaries, so build them first.
test: lint
	@scripts/ensure-test-deps.sh
	@if [ "$${SHARDCACHE_SKIP_MOUNT:-}" = 1 ]; then echo "make test: SHARDCACHE_SKIP_MOUNT=1: the mount tests are skipped"; fi
	@scripts/build-otelcol.sh
	$(CARGO) build --workspace --bins
	$(CARGO) test --workspace
	@scripts/test-python.sh
	@deploy/k8s/validate.sh
	@deploy/test-containers.sh

# Release binaries, then ghz (installed with `go install` when missing) at several
# concurrencies and an overload run: scripts/load.sh.
load: deps
	$(CARGO) build --release --workspace --bins
	@scripts/load.sh

# What users install, for any Linux with glibc 2.17 or newer, in target/dist/: release
# binaries (and their archive), the manylinux2014 Python wheel (both linked by zig), the
# three container images in one archive; checked on Ubuntu 20.04 in a chroot:
# scripts/dist.sh.
dist:
	@scripts/dist.sh
