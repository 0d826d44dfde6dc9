// ExecuTorch delegate "GdnEmbeddingBackend": an 8-bit token-embedding lookup
// whose table (int8 rows, one float32 scale per row) is read from the
// program's named data, where a tied output head's XNNPACK weight is the same
// blob (why: runtime_ops/embedding_delegate.py, which writes the payload
//   "gdn-embedding-v1 <rows> <width> <table key> <scale key>").
// Every value is checked; a token outside the table fails the call instead of
// reading out of bounds.
#include <executorch/runtime/backend/interface.h>
#include <executorch/runtime/core/exec_aten/util/tensor_util.h>
#include <executorch/runtime/core/named_data_map.h>

#include <cstdint>
#include <cstring>
#include <new>
#include <sstream>
#include <string>

namespace gdn {
namespace {

using executorch::aten::ScalarType;
using executorch::aten::SizesType;
using executorch::aten::Tensor;
using executorch::runtime::ArrayRef;
using executorch::runtime::BackendExecutionContext;
using executorch::runtime::BackendInitContext;
using executorch::runtime::BackendInterface;
using executorch::runtime::CompileSpec;
using executorch::runtime::DelegateHandle;
using executorch::runtime::Error;
using executorch::runtime::EValue;
using executorch::runtime::FreeableBuffer;
using executorch::runtime::NamedDataMap;
using executorch::runtime::Result;
using executorch::runtime::Span;

constexpr const char* kPayloadTag = "gdn-embedding-v1";

struct EmbeddingTable {
  FreeableBuffer table;   // rows x width int8, row-major
  FreeableBuffer scales;  // rows float32
  int64_t rows = 0;
  int64_t width = 0;
};

Result<FreeableBuffer> blob(const NamedDataMap& data, const std::string& key, size_t expected, const char* what) {
  Result<FreeableBuffer> buffer = data.get_data(key);
  if (!buffer.ok()) {
    ET_LOG(Error, "GdnEmbeddingBackend: the program has no named data %s for the %s", key.c_str(), what);
    return buffer.error();
  }
  if (buffer->size() != expected) {
    ET_LOG(Error, "GdnEmbeddingBackend: %s %s holds %zu bytes, expected %zu", what, key.c_str(), buffer->size(),
           expected);
    return Error::InvalidProgram;
  }
  return buffer;
}

class EmbeddingBackend final : public BackendInterface {
 public:
  bool is_available() const override { return true; }

  Result<DelegateHandle*> init(BackendInitContext& context, FreeableBuffer* processed,
                               ArrayRef<CompileSpec>) const override {
    std::istringstream payload(
        std::string(static_cast<const char*>(processed->data()), processed->size()));
    std::string tag, table_key, scale_key;
    int64_t rows = 0, width = 0;
    payload >> tag >> rows >> width >> table_key >> scale_key;
    processed->Free();
    // rows * width must not overflow the table's byte count (the blob sizes are checked against it).
    if (payload.fail() || tag != kPayloadTag || rows <= 0 || width <= 0 || rows > INT64_MAX / width) {
      ET_LOG(Error, "GdnEmbeddingBackend: unreadable payload (expected '%s rows width table_key scale_key')",
             kPayloadTag);
      return Error::InvalidProgram;
    }
    const NamedDataMap* data = context.get_named_data_map();
    if (data == nullptr) {
      ET_LOG(Error, "GdnEmbeddingBackend: the program has no named data");
      return Error::InvalidProgram;
    }
    auto table = blob(*data, table_key, static_cast<size_t>(rows * width), "table");
    if (!table.ok()) return table.error();
    auto scales = blob(*data, scale_key, static_cast<size_t>(rows) * sizeof(float), "scales");
    if (!scales.ok()) return scales.error();
    auto* handle = context.get_runtime_allocator()->allocateInstance<EmbeddingTable>();
    if (handle == nullptr) return Error::MemoryAllocationFailed;
    new (handle) EmbeddingTable{std::move(table.get()), std::move(scales.get()), rows, width};
    return handle;
  }

  // args: tokens [..., T] (int64 or int32), out [..., T, width] float32.
  Error execute(BackendExecutionContext&, DelegateHandle* raw, Span<EValue*> args) const override {
    const auto& embedding = *static_cast<const EmbeddingTable*>(raw);
    if (args.size() != 2 || !args[0]->isTensor() || !args[1]->isTensor()) {
      ET_LOG(Error, "GdnEmbeddingBackend: expected (tokens, out) tensors, got %zu arguments", args.size());
      return Error::InvalidArgument;
    }
    const Tensor& tokens = args[0]->toTensor();
    Tensor& out = args[1]->toTensor();
    if ((tokens.scalar_type() != ScalarType::Long && tokens.scalar_type() != ScalarType::Int) ||
        out.scalar_type() != ScalarType::Float || tokens.dim() + 1 > 16) {
      ET_LOG(Error, "GdnEmbeddingBackend: expected int64/int32 tokens and a float32 out");
      return Error::InvalidArgument;
    }
    SizesType sizes[16];
    for (ssize_t d = 0; d < tokens.dim(); ++d) sizes[d] = tokens.size(d);
    sizes[tokens.dim()] = static_cast<SizesType>(embedding.width);
    Error resized = executorch::runtime::resize_tensor(out, {sizes, static_cast<size_t>(tokens.dim() + 1)});
    if (resized != Error::Ok) {
      ET_LOG(Error, "GdnEmbeddingBackend: cannot resize the output to %zd tokens", tokens.numel());
      return resized;
    }
    const auto* table = static_cast<const int8_t*>(embedding.table.data());
    const auto* scales = static_cast<const float*>(embedding.scales.data());
    float* output = out.mutable_data_ptr<float>();
    // Every token is checked before its row is read: an id outside [0, rows) fails the call.
    for (ssize_t i = 0; i < tokens.numel(); ++i) {
      const int64_t token = tokens.scalar_type() == ScalarType::Long ? tokens.const_data_ptr<int64_t>()[i]
                                                                      : tokens.const_data_ptr<int32_t>()[i];
      if (token < 0 || token >= embedding.rows) {
        ET_LOG(Error, "GdnEmbeddingBackend: token id %lld outside the table's %lld rows",
               static_cast<long long>(token), static_cast<long long>(embedding.rows));
        return Error::InvalidArgument;
      }
      const int8_t* row = table + token * embedding.width;
      const float scale = scales[token];
      float* target = output + i * embedding.width;
      for (int64_t j = 0; j < embedding.width; ++j) target[j] = static_cast<float>(row[j]) * scale;
    }
    return Error::Ok;
  }

  void destroy(DelegateHandle* raw) const override {
    if (raw != nullptr) static_cast<EmbeddingTable*>(raw)->~EmbeddingTable();
  }
};

// Registered when the library is loaded: gdn-run loads it through XnnpackBackend.load_runtime (its
// delegate_ids name this backend), the C++ runner links it (examples/cpp_runner/CMakeLists.txt).
EmbeddingBackend kBackend;
const Error kRegistered = executorch::runtime::register_backend({"GdnEmbeddingBackend", &kBackend});

}  // namespace
}  // namespace gdn
