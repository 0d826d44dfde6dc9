// The Metal kernels of metal_backend/kernels/gated_delta_rule.metal, compiled
// unchanged as C++ and run on the CPU under the lockstep SIMD-group emulator,
// behind a small C API for ctypes (metal_backend/emulation.py).
//
// A call plans its launch with the host dispatch's own code (runtime/launch.h:
// validation, kernel name, parameters, grid), then runs the named kernel over
// that grid, so the tests check the planning as well as the shader. The C API
// is harness_api.h's, shared with the CUDA port (metal_backend/device/).
//
// Build: g++ -std=c++17 -O2 -shared -fPIC -Wno-attributes
//            -I metal_backend/emulation/include emulated_kernels.cpp simd_lockstep.cpp

#include <functional>
#include <string>

#include "../runtime/launch.h"
#include "simd_lockstep.h"

#include "../kernels/gated_delta_rule.metal"

// The Metal address-space words stop being keywords past the shader source.
#undef kernel
#undef device
#undef thread
#undef constant
#undef threadgroup

#include "harness_api.h"

namespace {

using metal_emulation::ThreadPosition;

uint3 to_uint3(metal_emulation::Dim3 d) { return uint3{d.x, d.y, d.z}; }

metal_emulation::Dim3 to_dim3(gdn_metal::Dim3 d) { return {d.x, d.y, d.z}; }

using PlainKernel = std::function<void(const GatedDeltaRuleParams&, void* const*, const ThreadPosition&)>;
using FusedKernel =
    std::function<void(const FusedGatedDeltaRuleParams&, void* const*, const ThreadPosition&)>;

// One thread of a kernel instantiation, under its host name.
struct KernelTable : gdn_harness::KernelMaps<PlainKernel, FusedKernel> {
  template <typename T, int KeyDim>
  void plain(const std::string& name) {
    plain_kernels[name] = [](const GatedDeltaRuleParams& params, void* const* data,
                             const ThreadPosition& at) {
      gated_delta_rule<T, KeyDim>(
          static_cast<const T*>(data[0]), static_cast<const T*>(data[1]),
          static_cast<const T*>(data[2]), static_cast<const T*>(data[3]),
          static_cast<const T*>(data[4]), static_cast<const float*>(data[5]),
          static_cast<T*>(data[6]), static_cast<float*>(data[7]), params,
          to_uint3(at.threadgroup_position_in_grid), at.simdgroup_index_in_threadgroup,
          at.simdgroups_per_threadgroup, at.thread_index_in_simdgroup);
    };
  }

  template <typename T, typename ParamT, int KeyDim>
  void fused(const std::string& name) {
    fused_kernels[name] = [](const FusedGatedDeltaRuleParams& params, void* const* data,
                             const ThreadPosition& at) {
      fused_gated_delta_rule<T, ParamT, KeyDim>(
          static_cast<const T*>(data[0]), static_cast<const T*>(data[1]),
          static_cast<const T*>(data[2]), static_cast<const ParamT*>(data[3]),
          static_cast<const ParamT*>(data[4]), static_cast<float*>(data[5]),
          static_cast<T*>(data[6]), params, to_uint3(at.threadgroup_position_in_grid),
          at.simdgroup_index_in_threadgroup, at.simdgroups_per_threadgroup,
          at.thread_index_in_simdgroup);
    };
  }
};

const KernelTable& kernels() { return gdn_harness::filled_table<KernelTable>(); }

template <typename Launch, typename Kernel>
void dispatch(const Launch& launch, const Kernel& kernel, void* const* data) {
  metal_emulation::dispatch_threadgroups(
      to_dim3(launch.plan.threadgroups), to_dim3(launch.plan.threads_per_threadgroup),
      [&](const ThreadPosition& at) { kernel(launch.params, data, at); });
}

}  // namespace

namespace gdn_harness {

void run(const gdn_metal::GatedDeltaRuleLaunch& launch, void* const* data) {
  dispatch(launch, kernels().find_plain(launch.plan.kernel_name), data);
}

void run(const gdn_metal::FusedGatedDeltaRuleLaunch& launch, void* const* data) {
  dispatch(launch, kernels().find_fused(launch.plan.kernel_name), data);
}

std::string kernel_names() { return kernels().names(); }

}  // namespace gdn_harness

extern "C" {

// How the emulator orders threadgroups and, each scheduling round, the threads
// of a threadgroup (metal_emulation::ExecutionOrder; the seed drives kShuffled).
void gdn_set_execution_order(int order, uint64_t seed) {
  metal_emulation::set_execution_order(static_cast<metal_emulation::ExecutionOrder>(order), seed);
}

}  // extern "C"
