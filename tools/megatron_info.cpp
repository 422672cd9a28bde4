// megatron_info: what this build is, which platforms exist and why some are unavailable, which
// platform is selected, which plugins are loaded, and the op table with the implementation each
// slot resolved to: the provider that runs, what it falls back to for calls it does not support,
// and what it shadows, for this run's choices (--deterministic-mode, --op-provider and
// MG_OP_PROVIDERS).
//
//   build/bin/megatron_info [--platform NAME] [--plugin PATH ...] [--all-platforms]
//                           [--deterministic-mode] [--op-provider SLOT=PROVIDER ...]
#include <CLI/CLI.hpp>

#include <cstdio>
#include <iomanip>
#include <iostream>
#include <string>
#include <vector>

#include "megatron/core/common/error.h"
#include "megatron/runtime.h"

namespace {

void print_op_table(mg::plugin::Registry& reg, std::string_view platform,
                    const mg::plugin::ResolveOptions& options) {
  std::cout << "\nOp table for platform '" << platform << "'"
            << (options.str().empty() ? "" : " (" + options.str() + ")") << ":\n";
  std::cout << "  " << std::left << std::setw(22) << "slot" << std::setw(10) << "kind"
            << std::setw(22) << "backward"
            << "implementation\n";
  int missing = 0;
  for (const auto& r : reg.resolutions(platform, options)) {
    std::cout << "  " << std::left << std::setw(22) << r.slot << std::setw(10)
              << mg::ops::slot_kind_name(r.kind) << std::setw(22)
              << (r.backward.empty() ? "-" : r.backward) << mg::plugin::describe(r);
    if (r.provider.empty()) ++missing;
    if (r.preferred) std::cout << "  [preferred]";
    if (!r.shadowed.empty()) {
      std::cout << "  (overrides";
      for (const auto& s : r.shadowed) std::cout << " " << s;
      std::cout << ")";
    }
    if (!r.excluded.empty()) {
      std::cout << "  (not deterministic:";
      for (const auto& s : r.excluded) std::cout << " " << s;
      std::cout << ")";
    }
    std::cout << "\n";
  }
  std::cout << "  " << mg::ops::kNumOps - missing << "/" << mg::ops::kNumOps
            << " slots implemented\n";
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"megatron_info: build, platforms, plugins and the resolved op table"};
  mg::RuntimeOptions opts;
  bool all_platforms = false;
  std::vector<std::string> op_providers;
  app.add_option("--platform", opts.platform,
                 "cuda|musa|txda|cpu (default: MG_PLATFORM, else auto)");
  app.add_option("--plugin", opts.plugins, "plugin shared library to load (after MG_PLUGINS)");
  app.add_flag("--all-platforms", all_platforms, "print the op table of every registered platform");
  app.add_flag("--deterministic-mode", opts.deterministic,
               "resolve the table of a deterministic run (no non-deterministic provider)");
  app.add_option("--op-provider", op_providers,
                 "SLOT=PROVIDER: prefer a provider for a slot (over MG_OP_PROVIDERS)");
  CLI11_PARSE(app, argc, argv);

  const auto b = mg::build_info();
  std::cout << "Megatron-CPP " << b.version << " (commit " << b.git_commit << ", " << b.build_type
            << ", " << b.compiler << ")\n"
            << "  BLAS: " << b.blas << "\n"
            << "  MPI:  " << b.mpi << "\n"
            << "  CUDA: " << b.cuda << (b.with_cuda ? " (archs " + b.cuda_archs + ")" : "") << "\n"
            << "  op table: " << mg::ops::kNumOps << " slots, ABI hash 0x" << std::hex
            << mg::ops::kOpTableAbiHash << std::dec << "\n";

  try {
    // Registration and plugin loading first, so the platform list is complete even when the
    // selection below fails.
    auto& reg = mg::plugin::global_registry();
    std::string selection_error;
    mg::Runtime* rt = nullptr;
    try {
      for (const auto& entry : op_providers)
        for (const auto& [slot, provider] : mg::plugin::parse_op_providers(entry, "--op-provider"))
          opts.op_providers[slot] = provider;
      rt = &mg::init(opts);
    } catch (const mg::Error& e) {
      selection_error = e.message();
    }

    std::cout << "\nPlatforms (auto-selection order cuda > musa > txda > cpu):\n";
    for (const auto& st : reg.platform_statuses()) {
      std::cout << "  " << std::left << std::setw(6) << st.name << std::setw(13)
                << (st.availability.available ? "available" : "unavailable")
                << st.availability.reason << "\n";
      if (st.availability.available) {
        auto* p = reg.find_platform(st.name);
        for (int d = 0; d < p->device_count(); ++d) {
          auto c = p->capabilities(d);
          std::cout << "         device " << d << ": " << c.device_name << ", "
                    << c.total_memory_bytes / (1024 * 1024) << " MiB";
          if (c.compute_major) std::cout << ", sm_" << c.compute_major << c.compute_minor;
          std::cout << ", bf16 " << (c.bf16 ? "yes" : "no") << ", fp8 " << (c.fp8 ? "yes" : "no")
                    << "\n";
        }
      }
    }
    std::cout << "\nPlugins:";
    const auto plugins = reg.plugins();
    if (plugins.empty()) std::cout << " none (MG_PLUGINS is empty)";
    std::cout << "\n";
    for (const auto& p : plugins)
      std::cout << "  " << p.name << " " << p.version << " (" << p.path << ")\n";

    if (!rt) {
      std::cerr << "megatron_info: error: " << selection_error << "\n";
      return 2;
    }
    std::cout << "\nSelected platform: " << rt->platform->name() << "\n";
    if (all_platforms) {
      // Preferences name one platform's providers: the other tables show the defaults.
      for (const auto& st : reg.platform_statuses())
        if (st.registered)
          print_op_table(reg, st.name,
                         st.name == rt->platform->name()
                             ? rt->resolve
                             : mg::plugin::ResolveOptions{rt->resolve.deterministic, {}});
    } else {
      print_op_table(reg, rt->platform->name(), rt->resolve);
    }
  } catch (const mg::Error& e) {
    std::cerr << "megatron_info: error: " << e.message() << "\n";
    return 1;
  }
  return 0;
}
