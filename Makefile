# shardcache: the two commands of the README.
#   make demo   generate a small dataset, start a hub, read it through the CLI
#   make test   formatting, lints and every test, exactly what CI runs
.PHONY: demo test deps build lint

CARGO ?= cargo
# RocksDB's C++ goes through ccache (installed by `make deps`): see scripts/ensure-deps.sh.
export CC := ccache cc
export CXX := ccache c++
export CCACHE_DIR ?= $(HOME)/.cache/ccache

deps:
	@scripts/ensure-deps.sh

# The demo runs the hub and the CLI only, so it does not wait for RocksDB's C++ build.
demo: deps
	$(CARGO) build --release -p hub-server -p shardcache-client
	@scripts/demo.sh

lint: deps
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

# The end-to-end tests start the built binaries, so build them first.
test: lint
	$(CARGO) build --workspace --bins
	$(CARGO) test --workspace
