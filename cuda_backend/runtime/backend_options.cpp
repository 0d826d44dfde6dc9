// gdn-export's C entry points to CudaBackend's runtime options.
//
// ExecuTorch's Python runtime has no call that sets a backend's options, and
// the C++ one takes a Span of BackendOption structs, which ctypes cannot build.
// These two functions wrap it for cuda_backend.executorch_runtime; they are
// compiled into the same library as ExecuTorch's CUDA backend runtime.

#include <executorch/runtime/backend/interface.h>
#include <executorch/runtime/backend/options.h>

#include <cstring>

namespace {

using executorch::runtime::BackendOption;
using executorch::runtime::Error;
using executorch::runtime::kMaxOptionKeyLength;
using executorch::runtime::kMaxOptionValueLength;
using executorch::runtime::OptionValue;
using executorch::runtime::Span;

constexpr char kBackend[] = "CudaBackend";

int set_one(const char* key, OptionValue value) {
  if (key == nullptr || std::strlen(key) >= kMaxOptionKeyLength) {
    return static_cast<int>(Error::InvalidArgument);
  }
  BackendOption option;
  std::strncpy(option.key, key, kMaxOptionKeyLength - 1);
  option.value = value;
  return static_cast<int>(executorch::runtime::set_option(kBackend, Span<BackendOption>(&option, 1)));
}

} // namespace

// Each returns ExecuTorch's Error code: 0 is Ok.
extern "C" __attribute__((visibility("default"))) int gdn_cuda_set_bool_option(const char* key, int value) {
  return set_one(key, OptionValue(value != 0));
}

extern "C" __attribute__((visibility("default"))) int gdn_cuda_set_string_option(const char* key, const char* value) {
  if (value == nullptr || std::strlen(value) >= kMaxOptionValueLength) {
    return static_cast<int>(Error::InvalidArgument);
  }
  std::array<char, kMaxOptionValueLength> text{};
  std::strncpy(text.data(), value, kMaxOptionValueLength - 1);
  return set_one(key, OptionValue(text));
}
