# shardcache: the two commands of the README.
#   make demo   generate a small dataset, start a hub, read it through the CLI
#   make test   formatting, lints and every test, exactly what CI runs
.PHONY: demo test deps build lint

CARGO ?= cargo

deps:
	@scripts/ensure-deps.sh

demo: deps
	$(CARGO) build --release --bins
	@scripts/demo.sh

lint: deps
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

# The end-to-end tests start the built binaries, so build them first.
test: lint
	$(CARGO) build --workspace --bins
	$(CARGO) test --workspace
