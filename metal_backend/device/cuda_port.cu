// The Metal kernels of metal_backend/kernels/gated_delta_rule.metal, compiled
// unchanged by nvcc (include/metal_stdlib here is the Metal-to-CUDA prelude)
// and launched on an NVIDIA GPU with the host dispatch's own plan
// (runtime/launch.h): one block per threadgroup, all in flight at once, one
// warp per SIMD group. The C API is the emulation's (emulation/harness_api.h),
// plus gdn_time_gated_delta_rule for relative timings.
//
// Build (metal_backend/device/cuda_port.py does it):
//   nvcc -std=c++17 -O3 -arch=sm_90 -shared -Xcompiler -fPIC -I metal_backend/device/include \
//        metal_backend/device/cuda_port.cu -o libgdn_metal_cuda_port.so
// GDN_KERNEL_SOURCE names another .metal file to build instead (an earlier
// revision of the kernels, to time against).

#include <cuda_runtime.h>

#include <string>

#include "../runtime/launch.h"

#ifndef GDN_KERNEL_SOURCE
#define GDN_KERNEL_SOURCE "../kernels/gated_delta_rule.metal"
#endif
#include GDN_KERNEL_SOURCE

// The Metal keywords stop being keywords past the shader source.
#undef kernel
#undef inline
#undef host_name
#undef device
#undef thread
#undef constant
#undef threadgroup
#pragma pop_macro("__device__")

#include "../emulation/harness_api.h"

namespace {

constexpr int kMaxBuffers = 8;

// What a kernel invocation reads from Metal's thread-position attributes.
struct ThreadPosition {
  uint3 threadgroup_position_in_grid;
  uint simdgroup_index_in_threadgroup;
  uint simdgroups_per_threadgroup;
  uint thread_index_in_simdgroup;
};

// Metal and CUDA both cut a threadgroup into SIMD groups (warps) of 32 along
// the x-fastest linear thread index.
__device__ ThreadPosition thread_position() {
  const uint linear = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  const uint threads = blockDim.x * blockDim.y * blockDim.z;
  return {blockIdx, linear / 32, threads / 32, linear % 32};
}

struct Buffers {
  void* data[kMaxBuffers];
};

template <typename T, int KeyDim>
__global__ void gdn_cuda_plain(GatedDeltaRuleParams params, Buffers buffers) {
  const ThreadPosition at = thread_position();
  void* const* data = buffers.data;
  gated_delta_rule<T, KeyDim>(
      static_cast<const T*>(data[0]), static_cast<const T*>(data[1]),
      static_cast<const T*>(data[2]), static_cast<const T*>(data[3]),
      static_cast<const T*>(data[4]), static_cast<const float*>(data[5]),
      static_cast<T*>(data[6]), static_cast<float*>(data[7]), params,
      at.threadgroup_position_in_grid, at.simdgroup_index_in_threadgroup,
      at.simdgroups_per_threadgroup, at.thread_index_in_simdgroup);
}

template <typename T, typename ParamT, int KeyDim>
__global__ void gdn_cuda_fused(FusedGatedDeltaRuleParams params, Buffers buffers) {
  const ThreadPosition at = thread_position();
  void* const* data = buffers.data;
  fused_gated_delta_rule<T, ParamT, KeyDim>(
      static_cast<const T*>(data[0]), static_cast<const T*>(data[1]),
      static_cast<const T*>(data[2]), static_cast<const ParamT*>(data[3]),
      static_cast<const ParamT*>(data[4]), static_cast<float*>(data[5]),
      static_cast<T*>(data[6]), params, at.threadgroup_position_in_grid,
      at.simdgroup_index_in_threadgroup, at.simdgroups_per_threadgroup,
      at.thread_index_in_simdgroup);
}

using PlainLauncher = void (*)(const GatedDeltaRuleParams&, const Buffers&, dim3, dim3);
using FusedLauncher = void (*)(const FusedGatedDeltaRuleParams&, const Buffers&, dim3, dim3);

// The __global__ instantiation of every kernel, under its host name.
struct KernelTable : gdn_harness::KernelMaps<PlainLauncher, FusedLauncher> {
  template <typename T, int KeyDim>
  void plain(const std::string& name) {
    plain_kernels[name] = [](const GatedDeltaRuleParams& params, const Buffers& buffers, dim3 grid,
                             dim3 block) { gdn_cuda_plain<T, KeyDim><<<grid, block>>>(params, buffers); };
  }

  template <typename T, typename ParamT, int KeyDim>
  void fused(const std::string& name) {
    fused_kernels[name] = [](const FusedGatedDeltaRuleParams& params, const Buffers& buffers,
                             dim3 grid, dim3 block) {
      gdn_cuda_fused<T, ParamT, KeyDim><<<grid, block>>>(params, buffers);
    };
  }
};

const KernelTable& kernels() { return gdn_harness::filled_table<KernelTable>(); }

void check_cuda(cudaError_t status, const std::string& what) {
  if (status != cudaSuccess) {
    throw std::runtime_error("gdn cuda port: " + what + ": " + cudaGetErrorString(status));
  }
}

dim3 to_dim3(gdn_metal::Dim3 d) { return dim3(d.x, d.y, d.z); }

// Launches without waiting (timing launches back to back).
template <typename Launch, typename Launcher>
void launch_async(const Launch& launch, Launcher launcher, void* const* data, int count) {
  Buffers buffers{};
  for (int i = 0; i < count; ++i) buffers.data[i] = data[i];
  launcher(launch.params, buffers, to_dim3(launch.plan.threadgroups),
           to_dim3(launch.plan.threads_per_threadgroup));
  check_cuda(cudaGetLastError(), "launching " + launch.plan.kernel_name);
}

}  // namespace

namespace gdn_harness {

// Each call waits for its kernel, so an error is reported by the call that caused it.
void run(const gdn_metal::GatedDeltaRuleLaunch& launch, void* const* data) {
  launch_async(launch, kernels().find_plain(launch.plan.kernel_name), data, 8);
  check_cuda(cudaDeviceSynchronize(), "running " + launch.plan.kernel_name);
}

void run(const gdn_metal::FusedGatedDeltaRuleLaunch& launch, void* const* data) {
  launch_async(launch, kernels().find_fused(launch.plan.kernel_name), data, 7);
  check_cuda(cudaDeviceSynchronize(), "running " + launch.plan.kernel_name);
}

std::string kernel_names() { return kernels().names(); }

}  // namespace gdn_harness

extern "C" {

// Microseconds per call of gdn_gated_delta_rule's launch (same arguments),
// from CUDA events around `iterations` back-to-back launches after a warm-up.
int gdn_time_gated_delta_rule(const gdn_metal::TensorView* views, void* const* data, int has_scale,
                              double scale, int use_qk_l2norm, int iterations,
                              double* microseconds, char* error, size_t error_size) {
  return gdn_harness::guarded(error, error_size, [&] {
    const auto launch =
        gdn_harness::plan_gated_delta_rule(views, data, has_scale, scale, use_qk_l2norm);
    const PlainLauncher launcher = kernels().find_plain(launch.plan.kernel_name);
    for (int i = 0; i < 3; ++i) launch_async(launch, launcher, data, 8);
    cudaEvent_t start, stop;
    check_cuda(cudaEventCreate(&start), "creating an event");
    check_cuda(cudaEventCreate(&stop), "creating an event");
    check_cuda(cudaEventRecord(start), "recording an event");
    for (int i = 0; i < iterations; ++i) launch_async(launch, launcher, data, 8);
    check_cuda(cudaEventRecord(stop), "recording an event");
    check_cuda(cudaEventSynchronize(stop), "timing " + launch.plan.kernel_name);
    float milliseconds = 0.0f;
    check_cuda(cudaEventElapsedTime(&milliseconds, start, stop), "reading the events");
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
    *microseconds = 1000.0 * milliseconds / iterations;
  });
}

}  // extern "C"
