// Encoding the gdn kernels on ExecuTorch's Metal stream (Objective-C++).
//
// The kernel library is compiled once from the embedded .metal source (see
// CMakeLists.txt: the source and its params header are baked into
// gdn_metal_kernels_source.h), and one compute pipeline per host name is
// cached for the life of the process.
#pragma once

#include <string>

#include "launch.h"

#ifdef __OBJC__
#import <Metal/Metal.h>
#endif

namespace executorch::runtime::etensor {
class Tensor;
}

namespace gdn_metal {

using EtTensor = executorch::runtime::etensor::Tensor;

// The view launch.h validates, for an ExecuTorch tensor.
TensorView tensor_view(const char* name, const EtTensor& tensor);

// Encodes one dispatch of `plan` on the current ExecuTorch Metal stream:
// `tensors` bind to buffer indices 0..count-1, `params` (bytes) to index count.
// Returns without waiting: the stream orders it with the rest of the program.
void encode_dispatch(const DispatchPlan& plan, const EtTensor* const* tensors, int count,
                     const void* params, size_t params_size);

}  // namespace gdn_metal
