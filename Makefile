# The two commands of the README: `make demo` and `make test`. Everything else is reachable from them.
BUILD      ?= build
BUILD_TYPE ?= Release
MG_CUDA    ?= AUTO
JOBS       ?= $(shell nproc)
CMAKE_ARGS ?=

.PHONY: all deps configure build test demo bench format clean

all: build

deps:
	@bash scripts/install_deps.sh

$(BUILD)/build.ninja:
	cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) -DMG_CUDA=$(MG_CUDA) $(CMAKE_ARGS)

configure: deps $(BUILD)/build.ninja

build: configure
	cmake --build $(BUILD) -j $(JOBS)

test: build
	ctest --test-dir $(BUILD) --output-on-failure -j $(JOBS) --timeout 900

demo: build
	bash scripts/demo.sh $(BUILD)

bench: build
	cmake --build $(BUILD) -j $(JOBS) --target benchmarks

format:
	git ls-files '*.cpp' '*.h' '*.cu' '*.cuh' | xargs clang-format -i

clean:
	rm -rf $(BUILD)
