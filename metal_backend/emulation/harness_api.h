// What the two off-Apple harnesses of kernels/gated_delta_rule.metal share:
// the CPU lockstep emulation (emulated_kernels.cpp) and the CUDA port
// (metal_backend/device/cuda_port.cu). Each compiles the .metal source
// unchanged, plans every call with the host dispatch's own runtime/launch.h,
// and exposes the same small C API to ctypes (metal_backend/emulation.py's
// KernelLibrary): only how a planned launch runs differs.
//
// Include it after the .metal source (it names the kernels' bfloat and half),
// in exactly one translation unit of a harness library: it defines the C API,
// over the two `run` functions and `kernel_names` that the harness defines.
#pragma once

#include <cstdint>
#include <cstring>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>

#include "../runtime/launch.h"

namespace gdn_harness {

enum Status : int { kOk = 0, kInvalidArgument = 1, kUnsupported = 2, kFailed = 3 };

// Copies `text` into a caller buffer of `size` bytes, truncated and terminated.
inline void copy_string(char* buffer, size_t size, const std::string& text) {
  if (size == 0) return;
  std::strncpy(buffer, text.c_str(), size - 1);
  buffer[size - 1] = '\0';
}

// Runs `body`, turning launch.h's exceptions into a status and a message, as the C shims do.
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

inline std::optional<double> optional_scale(int has_scale, double scale) {
  return has_scale ? std::optional<double>(scale) : std::nullopt;
}

// views/data: query, key, value, g, beta, initial_state, output, final_state.
// The same tensor as initial and final state is an in-place call, planned as
// the in-place C shim plans it (a non-packed state is refused).
inline gdn_metal::GatedDeltaRuleLaunch plan_gated_delta_rule(const gdn_metal::TensorView* views,
                                                             void* const* data, int has_scale,
                                                             double scale, int use_qk_l2norm) {
  if (data != nullptr && data[5] == data[7]) {
    return gdn_metal::plan_gated_delta_rule_inplace(views[0], views[1], views[2], views[3],
                                                    views[4], views[5], views[6],
                                                    optional_scale(has_scale, scale),
                                                    use_qk_l2norm != 0);
  }
  return gdn_metal::plan_gated_delta_rule(views[0], views[1], views[2], views[3], views[4],
                                          views[5], views[6], views[7],
                                          optional_scale(has_scale, scale), use_qk_l2norm != 0);
}

// views/data: mixed_qkv, a, b, A_log, dt_bias, state (updated in place), output.
inline gdn_metal::FusedGatedDeltaRuleLaunch plan_fused_gated_delta_rule(
    const gdn_metal::TensorView* views, int has_scale, double scale) {
  return gdn_metal::plan_fused_gated_delta_rule(views[0], views[1], views[2], views[3], views[4],
                                                views[5], views[6],
                                                optional_scale(has_scale, scale));
}

// The launch's kernel name, grid (threadgroups xyz, threads per threadgroup
// xyz) and parameter bytes, for tests that compare other planners with it.
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

// Calls visitor.template plain<T, KeyDim>(host name) and
// visitor.template fused<T, ParamT, KeyDim>(host name) for every kernel the
// .metal file instantiates (a test checks this list against its host_name
// attributes). Type names are the Metal ones, as in the host names.
template <typename T, typename Visitor>
void visit_dtype(const std::string& type, Visitor& visitor) {
  visitor.template plain<T, 64>("gated_delta_rule_" + type + "_dk64");
  visitor.template plain<T, 128>("gated_delta_rule_" + type + "_dk128");
  visitor.template plain<T, 256>("gated_delta_rule_" + type + "_dk256");
  const std::string prefix = "fused_gated_delta_rule_" + type + "_";
  visitor.template fused<T, float, 64>(prefix + "float_dk64");
  visitor.template fused<T, float, 128>(prefix + "float_dk128");
  visitor.template fused<T, float, 256>(prefix + "float_dk256");
  visitor.template fused<T, bfloat, 64>(prefix + "bfloat_dk64");
  visitor.template fused<T, bfloat, 128>(prefix + "bfloat_dk128");
  visitor.template fused<T, bfloat, 256>(prefix + "bfloat_dk256");
  visitor.template fused<T, half, 64>(prefix + "half_dk64");
  visitor.template fused<T, half, 128>(prefix + "half_dk128");
  visitor.template fused<T, half, 256>(prefix + "half_dk256");
}

template <typename Visitor>
void visit_kernels(Visitor& visitor) {
  visit_dtype<float>("float", visitor);
  visit_dtype<bfloat>("bfloat", visitor);
  visit_dtype<half>("half", visitor);
}

// A harness's kernels by host name: Plain and Fused run (or launch) one
// instantiation. The harness derives from it and adds the plain<T, KeyDim> and
// fused<T, ParamT, KeyDim> members that visit_kernels calls to fill it.
template <typename Plain, typename Fused>
struct KernelMaps {
  std::map<std::string, Plain> plain_kernels;
  std::map<std::string, Fused> fused_kernels;

  const Plain& find_plain(const std::string& name) const { return find(plain_kernels, name); }
  const Fused& find_fused(const std::string& name) const { return find(fused_kernels, name); }

  std::string names() const {
    std::string listed;
    for (const auto& entry : plain_kernels) listed += entry.first + "\n";
    for (const auto& entry : fused_kernels) listed += entry.first + "\n";
    return listed;
  }

 private:
  template <typename Map>
  static const typename Map::mapped_type& find(const Map& map, const std::string& name) {
    auto found = map.find(name);
    if (found == map.end()) throw std::runtime_error("no kernel named " + name + " in the library");
    return found->second;
  }
};

// The harness's table (a KernelMaps with plain/fused members), filled once.
template <typename Table>
const Table& filled_table() {
  static const Table table = [] {
    Table built;
    visit_kernels(built);
    return built;
  }();
  return table;
}

// Defined by each harness: run a planned launch on `data` (the views' order),
// and list the host names of the kernels it holds, one per line.
void run(const gdn_metal::GatedDeltaRuleLaunch& launch, void* const* data);
void run(const gdn_metal::FusedGatedDeltaRuleLaunch& launch, void* const* data);
std::string kernel_names();

}  // namespace gdn_harness

extern "C" {

// views/data: query, key, value, g, beta, initial_state, output, final_state.
int gdn_gated_delta_rule(const gdn_metal::TensorView* views, void* const* data, int has_scale,
                         double scale, int use_qk_l2norm, char* error, size_t error_size) {
  return gdn_harness::guarded(error, error_size, [&] {
    gdn_harness::run(gdn_harness::plan_gated_delta_rule(views, data, has_scale, scale, use_qk_l2norm),
                     data);
  });
}

// views/data: mixed_qkv, a, b, A_log, dt_bias, state (updated in place), output.
int gdn_fused_gated_delta_rule(const gdn_metal::TensorView* views, void* const* data, int has_scale,
                               double scale, char* error, size_t error_size) {
  return gdn_harness::guarded(error, error_size, [&] {
    gdn_harness::run(gdn_harness::plan_fused_gated_delta_rule(views, has_scale, scale), data);
  });
}

// The launch runtime/launch.h plans for a call (what the host dispatch binds);
// `data` may be null (then no aliasing is seen: a call with two state tensors).
int gdn_plan_gated_delta_rule(const gdn_metal::TensorView* views, void* const* data, int has_scale,
                              double scale, int use_qk_l2norm, char* kernel_name, size_t name_size,
                              uint32_t* grid, void* params, size_t params_size, char* error,
                              size_t error_size) {
  return gdn_harness::guarded(error, error_size, [&] {
    gdn_harness::export_launch(
        gdn_harness::plan_gated_delta_rule(views, data, has_scale, scale, use_qk_l2norm),
        kernel_name, name_size, grid, params, params_size);
  });
}

int gdn_plan_fused_gated_delta_rule(const gdn_metal::TensorView* views, int has_scale,
                                    double scale, char* kernel_name, size_t name_size,
                                    uint32_t* grid, void* params, size_t params_size, char* error,
                                    size_t error_size) {
  return gdn_harness::guarded(error, error_size, [&] {
    gdn_harness::export_launch(gdn_harness::plan_fused_gated_delta_rule(views, has_scale, scale),
                               kernel_name, name_size, grid, params, params_size);
  });
}

// Newline-separated host names of every kernel the harness holds.
int gdn_kernel_names(char* buffer, size_t size) {
  const std::string names = gdn_harness::kernel_names();
  gdn_harness::copy_string(buffer, size, names);
  return names.size() < size ? gdn_harness::kOk : gdn_harness::kFailed;
}

}  // extern "C"
