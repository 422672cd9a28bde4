# The two commands of the README: `make demo` and `make test`. Everything else is reachable from them.
# Gates (README.md, "Developing"): `make test` checks the format first; CI (.ci/run) builds with
# MG_WERROR=ON; `make test-asan` and `make test-tsan` are separate sanitizer builds, not part of
# `make test` (they take longer than the CI budget allows).
BUILD      ?= build
BUILD_TYPE ?= Release
MG_CUDA    ?= AUTO
MG_WERROR  ?= OFF
JOBS       ?= $(shell nproc)
CMAKE_ARGS ?=

.PHONY: all deps configure build test demo bench format format-check test-asan test-tsan clean

all: build

deps:
	@bash scripts/install_deps.sh

$(BUILD)/build.ninja:
	cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) -DMG_CUDA=$(MG_CUDA) \
	  -DMG_WERROR=$(MG_WERROR) $(CMAKE_ARGS)

configure: deps $(BUILD)/build.ninja

build: configure
	cmake --build $(BUILD) -j $(JOBS)

test: deps format-check build
	ctest --test-dir $(BUILD) --output-on-failure -j $(JOBS) --timeout 900

demo: build
	bash scripts/demo.sh $(BUILD)

bench: build
	cmake --build $(BUILD) -j $(JOBS) --target benchmarks

format:
	git ls-files '*.cpp' '*.h' '*.cu' '*.cuh' | xargs clang-format -i

format-check:
	@bash scripts/check_format.sh

# Sanitizer builds: CPU only, -O1, their own build directories; tests/sanitizers/run.sh says what
# each runs and with which options and suppressions.
test-asan: deps
	bash tests/sanitizers/run.sh asan build-asan $(JOBS)

test-tsan: deps
	bash tests/sanitizers/run.sh tsan build-tsan $(JOBS)

clean:
	rm -rf $(BUILD)
