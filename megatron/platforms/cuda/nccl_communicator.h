// The NCCL communication backend: ProcessGroups over device tensors (DESIGN.md, "Communication").
// init_communicator("nccl") creates it once the CUDA platform is registered (mg::init()).
#pragma once

namespace mg::platforms::cuda {

// Registers the "nccl" backend with comm::register_communicator_backend; called by register_cuda.
// A no-op in a build without NCCL (init_communicator("nccl") then lists what is available).
void register_nccl_backend();

}  // namespace mg::platforms::cuda
