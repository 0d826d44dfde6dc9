// The Metal kernels of metal_backend/kernels/gated_delta_rule.metal, compiled
// unchanged as C++ and run on the CPU under the lockstep SIMD-group emulator,
// behind a small C API for ctypes (metal_backend/emulation.py).
//
// A call plans its launch with the host dispatch's own code (runtime/launch.h:
// validation, kernel name, parameters, grid), then runs the named kernel over
// that grid, so the tests check the planning as well as the shader.
//
// Build: g++ -std=c++17 -O2 -shared -fPIC -Wno-attributes
//            -I metal_backend/emulation/include emulated_kernels.cpp simd_lockstep.cpp

#include <cstring>
#include <functional>
#include <map>
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

namespace {

using metal_emulation::ThreadPosition;

enum Status : int { kOk = 0, kInvalidArgument = 1, kUnsupported = 2, kFailed = 3 };

uint3 to_uint3(metal_emulation::Dim3 d) { return uint3{d.x, d.y, d.z}; }

metal_emulation::Dim3 to_dim3(gdn_metal::Dim3 d) { return {d.x, d.y, d.z}; }

using PlainKernel = std::function<void(const GatedDeltaRuleParams&, void* const*, const ThreadPosition&)>;
using FusedKernel =
    std::function<void(const FusedGatedDeltaRuleParams&, void* const*, const ThreadPosition&)>;

template <typename T, int KeyDim>
PlainKernel plain_kernel() {
  return [](const GatedDeltaRuleParams& params, void* const* data, const ThreadPosition& at) {
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
FusedKernel fused_kernel() {
  return [](const FusedGatedDeltaRuleParams& params, void* const* data, const ThreadPosition& at) {
    fused_gated_delta_rule<T, ParamT, KeyDim>(
        static_cast<const T*>(data[0]), static_cast<const T*>(data[1]),
        static_cast<const T*>(data[2]), static_cast<const ParamT*>(data[3]),
        static_cast<const ParamT*>(data[4]), static_cast<float*>(data[5]),
        static_cast<T*>(data[6]), params, to_uint3(at.threadgroup_position_in_grid),
        at.simdgroup_index_in_threadgroup, at.simdgroups_per_threadgroup,
        at.thread_index_in_simdgroup);
  };
}

// The instantiations of the .metal file under their host names (a test checks
// this list against the file's [[host_name]] attributes).
template <typename T>
void add_dtype(const std::string& type, std::map<std::string, PlainKernel>& plain,
               std::map<std::string, FusedKernel>& fused) {
  plain["gated_delta_rule_" + type + "_dk64"] = plain_kernel<T, 64>();
  plain["gated_delta_rule_" + type + "_dk128"] = plain_kernel<T, 128>();
  plain["gated_delta_rule_" + type + "_dk256"] = plain_kernel<T, 256>();
  const std::string prefix = "fused_gated_delta_rule_" + type + "_";
  fused[prefix + "float_dk64"] = fused_kernel<T, float, 64>();
  fused[prefix + "float_dk128"] = fused_kernel<T, float, 128>();
  fused[prefix + "float_dk256"] = fused_kernel<T, float, 256>();
  fused[prefix + "bfloat_dk64"] = fused_kernel<T, bfloat, 64>();
  fused[prefix + "bfloat_dk128"] = fused_kernel<T, bfloat, 128>();
  fused[prefix + "bfloat_dk256"] = fused_kernel<T, bfloat, 256>();
  fused[prefix + "half_dk64"] = fused_kernel<T, half, 64>();
  fused[prefix + "half_dk128"] = fused_kernel<T, half, 128>();
  fused[prefix + "half_dk256"] = fused_kernel<T, half, 256>();
}

struct KernelTable {
  std::map<std::string, PlainKernel> plain;
  std::map<std::string, FusedKernel> fused;
  KernelTable() {
    add_dtype<float>("float", plain, fused);
    add_dtype<bfloat>("bfloat", plain, fused);
    add_dtype<half>("half", plain, fused);
  }
};

const KernelTable& kernels() {
  static const KernelTable table;
  return table;
}

// Copies `text` into a caller buffer of `size` bytes, truncated and terminated.
void copy_string(char* buffer, size_t size, const std::string& text) {
  if (size == 0) return;
  std::strncpy(buffer, text.c_str(), size - 1);
  buffer[size - 1] = '\0';
}

template <typename Body>
int guarded(char* error, size_t error_size, Body body) {
  try {
    body();
    return kOk;
  } catch (const gdn_metal::Unsupported& e) {
    copy_string(error, error_size, e.what());
    return kUnsupported;
  } catch (const std::invalid_argument& e) {
    copy_string(error, error_size, e.what());
    return kInvalidArgument;
  } catch (const std::exception& e) {
    copy_string(error, error_size, e.what());
    return kFailed;
  }
}

template <typename Table>
const typename Table::mapped_type& find_kernel(const Table& table, const std::string& name) {
  auto found = table.find(name);
  if (found == table.end()) throw std::runtime_error("no kernel named " + name + " in the library");
  return found->second;
}

template <typename Launch>
void export_launch(const Launch& launch, char* kernel_name, size_t name_size, uint32_t* grid,
                   void* params, size_t params_size) {
  if (params_size != sizeof(launch.params)) {
    throw std::runtime_error("params buffer of " + std::to_string(params_size) + " bytes, expected " +
                             std::to_string(sizeof(launch.params)));
  }
  copy_string(kernel_name, name_size, launch.plan.kernel_name);
  const gdn_metal::Dim3 dims[2] = {launch.plan.threadgroups, launch.plan.threads_per_threadgroup};
  for (int i = 0; i < 2; ++i) {
    grid[3 * i] = dims[i].x;
    grid[3 * i + 1] = dims[i].y;
    grid[3 * i + 2] = dims[i].z;
  }
  std::memcpy(params, &launch.params, params_size);
}

}  // namespace

extern "C" {

// views/data: query, key, value, g, beta, initial_state, output, final_state.
int gdn_emulate_gated_delta_rule(const gdn_metal::TensorView* views, void* const* data,
                                 int has_scale, double scale, int use_qk_l2norm, char* error,
                                 size_t error_size) {
  return guarded(error, error_size, [&] {
    const auto launch = gdn_metal::plan_gated_delta_rule(
        views[0], views[1], views[2], views[3], views[4], views[5], views[6], views[7],
        has_scale ? std::optional<double>(scale) : std::nullopt, use_qk_l2norm != 0);
    const PlainKernel& kernel = find_kernel(kernels().plain, launch.plan.kernel_name);
    metal_emulation::dispatch_threadgroups(
        to_dim3(launch.plan.threadgroups), to_dim3(launch.plan.threads_per_threadgroup),
        [&](const ThreadPosition& at) { kernel(launch.params, data, at); });
  });
}

// views/data: mixed_qkv, a, b, A_log, dt_bias, state (updated in place), output.
int gdn_emulate_fused_gated_delta_rule(const gdn_metal::TensorView* views, void* const* data,
                                       int has_scale, double scale, char* error,
                                       size_t error_size) {
  return guarded(error, error_size, [&] {
    const auto launch = gdn_metal::plan_fused_gated_delta_rule(
        views[0], views[1], views[2], views[3], views[4], views[5], views[6],
        has_scale ? std::optional<double>(scale) : std::nullopt);
    const FusedKernel& kernel = find_kernel(kernels().fused, launch.plan.kernel_name);
    metal_emulation::dispatch_threadgroups(
        to_dim3(launch.plan.threadgroups), to_dim3(launch.plan.threads_per_threadgroup),
        [&](const ThreadPosition& at) { kernel(launch.params, data, at); });
  });
}

// The launch runtime/launch.h plans for a call (what the host dispatch binds):
// kernel name, grid (threadgroups xyz, threads per threadgroup xyz) and the
// parameter struct's bytes. Lets tests compare other planners with it.
int gdn_plan_gated_delta_rule(const gdn_metal::TensorView* views, int has_scale, double scale,
                              int use_qk_l2norm, char* kernel_name, size_t name_size,
                              uint32_t* grid, void* params, size_t params_size, char* error,
                              size_t error_size) {
  return guarded(error, error_size, [&] {
    const auto launch = gdn_metal::plan_gated_delta_rule(
        views[0], views[1], views[2], views[3], views[4], views[5], views[6], views[7],
        has_scale ? std::optional<double>(scale) : std::nullopt, use_qk_l2norm != 0);
    export_launch(launch, kernel_name, name_size, grid, params, params_size);
  });
}

int gdn_plan_fused_gated_delta_rule(const gdn_metal::TensorView* views, int has_scale,
                                    double scale, char* kernel_name, size_t name_size,
                                    uint32_t* grid, void* params, size_t params_size,
                                    char* error, size_t error_size) {
  return guarded(error, error_size, [&] {
    const auto launch = gdn_metal::plan_fused_gated_delta_rule(
        views[0], views[1], views[2], views[3], views[4], views[5], views[6],
        has_scale ? std::optional<double>(scale) : std::nullopt);
    export_launch(launch, kernel_name, name_size, grid, params, params_size);
  });
}

// Newline-separated host names of every kernel the emulation holds.
int gdn_emulated_kernel_names(char* buffer, size_t size) {
  std::string names;
  for (const auto& entry : kernels().plain) names += entry.first + "\n";
  for (const auto& entry : kernels().fused) names += entry.first + "\n";
  copy_string(buffer, size, names);
  return names.size() < size ? kOk : kFailed;
}

}  // extern "C"
