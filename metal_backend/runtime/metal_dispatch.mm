#include "metal_dispatch.h"

#include <executorch/backends/apple/metal/runtime/ops/common.h>

#include <mutex>
#include <stdexcept>
#include <unordered_map>

#include "gdn_metal_kernels_source.h"  // generated: kGdnMetalKernelsSource

namespace gdn_metal {
namespace {

using executorch::backends::metal::ETMetalStream;
using executorch::backends::metal::dispatch_sync_with_rethrow;
using executorch::backends::metal::get_mtl_buffer;
using executorch::backends::metal::getCurrentMetalStream;

// An NSError's description for a message; Metal may fail without setting one.
std::string describe(NSError* error) {
  if (error == nil || error.localizedDescription == nil) return "no error description";
  return std::string(error.localizedDescription.UTF8String);
}

class PipelineCache {
 public:
  id<MTLComputePipelineState> pipeline(id<MTLDevice> device, const std::string& name) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto found = pipelines_.find(name);
    if (found != pipelines_.end()) return found->second;
    if (library_ == nil) library_ = compile_library(device);
    id<MTLFunction> function =
        [library_ newFunctionWithName:[NSString stringWithUTF8String:name.c_str()]];
    if (function == nil) throw std::runtime_error("gdn metal: no kernel named " + name);
    NSError* error = nil;
    id<MTLComputePipelineState> pipeline = [device newComputePipelineStateWithFunction:function
                                                                                  error:&error];
    if (pipeline == nil) {
      throw std::runtime_error("gdn metal: pipeline for " + name + " failed: " + describe(error));
    }
    pipelines_.emplace(name, pipeline);
    return pipeline;
  }

 private:
  static id<MTLLibrary> compile_library(id<MTLDevice> device) {
    MTLCompileOptions* options = [[MTLCompileOptions alloc] init];
    options.languageVersion = MTLLanguageVersion3_1;  // bfloat needs Metal 3.1 (macOS 14)
    // Fast math (Metal's default) may reassociate sums and assume no inf or
    // NaN; the conformance tolerances assume IEEE arithmetic, so the library
    // is compiled in safe mode (macOS 15 names it mathMode, macOS 14
    // fastMathEnabled), as ExecuTorch's own shader library is.
#if defined(__MAC_OS_X_VERSION_MAX_ALLOWED) && __MAC_OS_X_VERSION_MAX_ALLOWED >= 150000
    if (@available(macOS 15.0, *)) {
      options.mathMode = MTLMathModeSafe;
      options.mathFloatingPointFunctions = MTLMathFloatingPointFunctionsPrecise;
    } else {
      options.fastMathEnabled = NO;
    }
#else
    options.fastMathEnabled = NO;
#endif
    NSError* error = nil;
    id<MTLLibrary> library =
        [device newLibraryWithSource:[NSString stringWithUTF8String:kGdnMetalKernelsSource]
                             options:options
                               error:&error];
    if (library == nil) {
      throw std::runtime_error("gdn metal: compiling gated_delta_rule.metal failed: " +
                               describe(error));
    }
    return library;
  }

  std::mutex mutex_;
  id<MTLLibrary> library_ = nil;
  std::unordered_map<std::string, id<MTLComputePipelineState>> pipelines_;
};

PipelineCache& pipeline_cache() {
  static PipelineCache cache;
  return cache;
}

}  // namespace

TensorView tensor_view(const char* name, const EtTensor& tensor) {
  TensorView view{name, static_cast<int32_t>(tensor.scalar_type()), tensor.dim(), {}, {}};
  if (view.ndim > 4) {
    throw std::invalid_argument(std::string("gdn metal: ") + name + " has " +
                                std::to_string(view.ndim) + " dims, at most 4 expected");
  }
  for (int64_t d = 0; d < view.ndim; ++d) {
    view.sizes[d] = tensor.sizes()[d];
    view.strides[d] = tensor.strides()[d];
  }
  return view;
}

void encode_dispatch(const DispatchPlan& plan, const EtTensor* const* tensors, int count,
                     const void* params, size_t params_size) {
  ETMetalStream* stream = getCurrentMetalStream();
  if (stream == nullptr) throw std::runtime_error("gdn metal: no current Metal stream");
  id<MTLComputePipelineState> pipeline = pipeline_cache().pipeline(stream->device(), plan.kernel_name);
  check_pipeline_fits(plan, pipeline.maxTotalThreadsPerThreadgroup, pipeline.threadExecutionWidth);
  dispatch_sync_with_rethrow(stream->queue(), ^() {
    @autoreleasepool {
      id<MTLComputeCommandEncoder> encoder = stream->commandEncoder();
      [encoder setComputePipelineState:pipeline];
      for (int index = 0; index < count; ++index) {
        EtTensor* tensor = const_cast<EtTensor*>(tensors[index]);
        id<MTLBuffer> buffer = get_mtl_buffer(tensor, plan.kernel_name.c_str(), "argument");
        // A view may start inside its buffer: bind at the element it starts from.
        const NSUInteger offset = static_cast<NSUInteger>(
            static_cast<const char*>(tensor->const_data_ptr()) -
            static_cast<const char*>([buffer contents]));
        [encoder setBuffer:buffer offset:offset atIndex:index];
      }
      [encoder setBytes:params length:params_size atIndex:count];
      [encoder dispatchThreadgroups:MTLSizeMake(plan.threadgroups.x, plan.threadgroups.y,
                                                plan.threadgroups.z)
              threadsPerThreadgroup:MTLSizeMake(plan.threads_per_threadgroup.x,
                                                plan.threads_per_threadgroup.y,
                                                plan.threads_per_threadgroup.z)];
    }
  });
}

}  // namespace gdn_metal
