// aoti_torch_cuda_mm_out on cuBLAS, for the matrix products AOTInductor hands to ATen.
//
// CudaBackend lets AOTInductor choose among its Triton GEMM templates only, because
// ExecuTorch's CUDA runtime has no shim for ATen's mm. On the H100 those templates
// reach about 600 TFLOP/s on the 4B prefill's products where cuBLAS reaches about
// 720 (docs/benchmarks.md, "The prefill's matrix products alone"). With this shim in
// the runtime library, cuda_backend.lowering lets AOTInductor's autotuning pick
// cuBLAS per product shape, and the generated code calls the C shim below with the
// same arguments it would pass to libtorch's: (out, self, mat2), out = self @ mat2.
//
// Each operand may be row-major or a transposed view (a weight read as weight.t());
// cuBLAS is column-major, so out^T = mat2^T @ self^T is computed, each operand
// transposed or not by how its strides lay it out.

#include <executorch/backends/aoti/common_shims_slim.h>
#include <executorch/backends/aoti/export.h>
#include <executorch/backends/aoti/slim/cuda/guard.h>
#include <executorch/runtime/platform/log.h>

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <mutex>
#include <unordered_map>

namespace {

using executorch::backends::aoti::AOTITorchError;
using executorch::backends::aoti::Tensor;
using executorch::backends::aoti::slim::c10::ScalarType;
using executorch::runtime::Error;

// cuBLAS's workspace, given explicitly: cublasSetStream drops a user workspace, and a
// workspace cuBLAS allocates itself during CUDA-graph capture breaks the capture (the
// C++ runner captures decode steps). 32 MiB is what PyTorch gives Hopper GPUs.
constexpr size_t kWorkspaceBytes = 32u << 20;

struct DeviceHandle {
  cublasHandle_t handle = nullptr;
  void* workspace = nullptr;
};

// One handle per device, made on first use and kept for the process.
Error device_handle(int device, DeviceHandle** result) {
  static std::mutex mutex;
  static std::unordered_map<int, DeviceHandle> handles;
  std::lock_guard<std::mutex> lock(mutex);
  DeviceHandle& entry = handles[device];
  if (entry.handle == nullptr) {
    if (cublasCreate(&entry.handle) != CUBLAS_STATUS_SUCCESS) {
      entry.handle = nullptr;
      ET_LOG(Error, "aoti_torch_cuda_mm_out: cublasCreate failed on device %d", device);
      return Error::Internal;
    }
    if (cudaMalloc(&entry.workspace, kWorkspaceBytes) != cudaSuccess) {
      cublasDestroy(entry.handle);
      entry = DeviceHandle{};
      ET_LOG(Error, "aoti_torch_cuda_mm_out: no %zu bytes for cuBLAS's workspace", kWorkspaceBytes);
      return Error::MemoryAllocationFailed;
    }
  }
  *result = &entry;
  return Error::Ok;
}

// A (rows x cols) row-major view as cuBLAS reads it: the column-major matrix its memory
// holds is its transpose (op N gives view^T) when its rows are contiguous, or the view
// itself (op T gives view^T) when its columns are. ld: that stored matrix's leading dimension.
struct ColumnMajor {
  const void* data;
  cublasOperation_t op;
  int64_t ld;
};

bool read_as_column_major(const Tensor& view, ColumnMajor* result) {
  const int64_t rows = view.size(0), cols = view.size(1);
  const int64_t row_stride = view.stride(0), col_stride = view.stride(1);
  if (col_stride == 1 || cols == 1) {  // rows contiguous: view^T is column-major (cols x rows)
    const int64_t ld = rows == 1 ? std::max<int64_t>(cols, 1) : row_stride;
    if (ld >= std::max<int64_t>(cols, 1)) {
      *result = {view.data_ptr(), CUBLAS_OP_N, ld};
      return true;
    }
  }
  if (row_stride == 1 || rows == 1) {  // columns contiguous: the view is column-major (rows x cols)
    const int64_t ld = cols == 1 ? std::max<int64_t>(rows, 1) : col_stride;
    if (ld >= std::max<int64_t>(rows, 1)) {
      *result = {view.data_ptr(), CUBLAS_OP_T, ld};
      return true;
    }
  }
  return false;
}

bool cuda_type(ScalarType dtype, cudaDataType_t* result) {
  switch (dtype) {
    case ScalarType::Float: *result = CUDA_R_32F; return true;
    case ScalarType::BFloat16: *result = CUDA_R_16BF; return true;
    case ScalarType::Half: *result = CUDA_R_16F; return true;
    default: return false;
  }
}

} // namespace

extern "C" AOTI_SHIM_EXPORT AOTITorchError aoti_torch_cuda_mm_out(Tensor* out, Tensor* self, Tensor* mat2) {
  if (out == nullptr || self == nullptr || mat2 == nullptr) {
    ET_LOG(Error, "aoti_torch_cuda_mm_out: a null tensor");
    return Error::InvalidArgument;
  }
  if (out->dim() != 2 || self->dim() != 2 || mat2->dim() != 2) {
    ET_LOG(Error, "aoti_torch_cuda_mm_out: expected 2-D tensors, got %zu, %zu, %zu dims", out->dim(), self->dim(),
           mat2->dim());
    return Error::InvalidArgument;
  }
  const int64_t m = self->size(0), k = self->size(1), n = mat2->size(1);
  if (mat2->size(0) != k || out->size(0) != m || out->size(1) != n) {
    ET_LOG(Error, "aoti_torch_cuda_mm_out: shapes (%ld x %ld) @ (%ld x %ld) -> (%ld x %ld) do not agree", (long)m,
           (long)k, (long)mat2->size(0), (long)n, (long)out->size(0), (long)out->size(1));
    return Error::InvalidArgument;
  }
  cudaDataType_t type;
  if (self->dtype() != out->dtype() || mat2->dtype() != out->dtype() || !cuda_type(out->dtype(), &type)) {
    ET_LOG(Error, "aoti_torch_cuda_mm_out: expected float32, bfloat16 or float16 tensors of one dtype");
    return Error::InvalidArgument;
  }
  if (m == 0 || n == 0) {
    return Error::Ok;
  }
  ColumnMajor a, b, c;
  // out must be written as column-major out^T (n x m) without a transpose: rows contiguous.
  if (!read_as_column_major(*self, &a) || !read_as_column_major(*mat2, &b) || !read_as_column_major(*out, &c) ||
      c.op != CUBLAS_OP_N) {
    ET_LOG(Error, "aoti_torch_cuda_mm_out: strides cuBLAS cannot read as a matrix (self %ld,%ld mat2 %ld,%ld out %ld,%ld)",
           (long)self->stride(0), (long)self->stride(1), (long)mat2->stride(0), (long)mat2->stride(1),
           (long)out->stride(0), (long)out->stride(1));
    return Error::NotSupported;
  }
  const int device = out->device_index();
  auto stream = executorch::backends::cuda::getCurrentCUDAStream(device);
  if (!stream.ok()) {
    return stream.error();
  }
  if (k == 0) {  // an empty sum: zeros, row by row (the rows may be strided)
    const size_t row_bytes = static_cast<size_t>(n) * out->itemsize();
    return cudaMemset2DAsync(out->data_ptr(), c.ld * out->itemsize(), 0, row_bytes, m, stream.get()) == cudaSuccess
        ? Error::Ok
        : Error::Internal;
  }
  DeviceHandle* handle = nullptr;
  Error error = device_handle(device, &handle);
  if (error != Error::Ok) {
    return error;
  }
  const float alpha = 1.0f, beta = 0.0f;
  // fp32 stays fp32 (no TF32), as torch.mm does by default; 16-bit inputs accumulate in fp32.
  cublasStatus_t status = cublasSetStream(handle->handle, stream.get());
  if (status == CUBLAS_STATUS_SUCCESS) {
    status = cublasSetWorkspace(handle->handle, handle->workspace, kWorkspaceBytes);
  }
  if (status == CUBLAS_STATUS_SUCCESS) {
    // out^T (n x m) = mat2^T (n x k) @ self^T (k x m), all column-major.
    status = cublasGemmEx(handle->handle, b.op, a.op, static_cast<int>(n), static_cast<int>(m), static_cast<int>(k),
                          &alpha, b.data, type, static_cast<int>(b.ld), a.data, type, static_cast<int>(a.ld), &beta,
                          out->data_ptr(), type, static_cast<int>(c.ld), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  }
  if (status != CUBLAS_STATUS_SUCCESS) {
    ET_LOG(Error, "aoti_torch_cuda_mm_out: cuBLAS failed (%s) on (%ld x %ld) @ (%ld x %ld)", cublasGetStatusString(status),
           (long)m, (long)k, (long)k, (long)n);
    return Error::Internal;
  }
  return Error::Ok;
}
