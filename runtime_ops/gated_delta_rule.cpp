// The gated delta rule on CPU (see gated_delta_rule.h).
//
// Every value head owns its Dk x Dv state and runs on one thread.
//
// * Short sequences (decode) step token by token straight on the state
//   memory, each (batch, value head) a unit of work: one pass reads the state
//   once to get S^T k and S^T q with both in registers, a second pass writes
//   the updated rows while they are still in cache, so decode costs one read
//   and one write of the state.
// * Long sequences run the chunked (WY) form of gdn_export/ops/reference.py,
//   each (batch, key head) a unit of work: within a chunk the delta-rule
//   updates become a unit-lower-triangular solve plus matrix products, done
//   by small register-blocked GEMM tiles on a cached copy of the state; the
//   value heads of a key head share the chunk's queries and keys (and, with a
//   scalar gate, the products K K^T and Q K^T).
#include "gated_delta_rule.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <memory>
#include <type_traits>
#include <utility>
#include <vector>

#include "vector_math.h"

namespace gdn {
namespace {

constexpr int64_t kPad = 16;  // working buffers are padded to kPad columns

inline float sum(Vec v) {
  float total = 0.0f;
  for (int l = 0; l < kLanes; ++l) total += v[l];
  return total;
}

// sum_i x_i y_i, kLanes partial sums at a time.
inline float dot(const float* x, const float* y, int64_t n) {
  Vec partial{};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) partial += load(x + i) * load(y + i);
  float total = sum(partial);
  for (; i < n; ++i) total += x[i] * y[i];
  return total;
}

inline IntVec lane_indices() {
  IntVec indices;
  for (int l = 0; l < kLanes; ++l) indices[l] = l;
  return indices;
}

inline int64_t round_up(int64_t x, int64_t multiple) { return (x + multiple - 1) / multiple * multiple; }

// ---- element conversions (bit exact, round to nearest even) ----

// A float's bits and back (std::bit_cast, which C++17 lacks).
inline uint32_t bits_of(float value) {
  uint32_t word;
  std::memcpy(&word, &value, 4);
  return word;
}

inline float float_of_bits(uint32_t word) {
  float value;
  std::memcpy(&value, &word, 4);
  return value;
}

inline float bfloat16_to_float(uint16_t bits) { return float_of_bits(uint32_t(bits) << 16); }

inline uint16_t float_to_bfloat16(float value) {
  uint32_t word = bits_of(value);
  if ((word & 0x7fffffffu) > 0x7f800000u) return uint16_t((word >> 16) | 0x40);  // quiet NaN
  word += 0x7fffu + ((word >> 16) & 1u);
  return uint16_t(word >> 16);
}

inline float float16_to_float(uint16_t half) {
  uint32_t sign = uint32_t(half & 0x8000u) << 16;
  uint32_t exponent = (half >> 10) & 0x1fu;
  uint32_t mantissa = half & 0x3ffu;
  uint32_t word;
  if (exponent == 0x1f) {
    word = sign | 0x7f800000u | (mantissa << 13);
  } else if (exponent != 0) {
    word = sign | ((exponent + 112) << 23) | (mantissa << 13);
  } else if (mantissa == 0) {
    word = sign;
  } else {  // subnormal half: value = mantissa * 2^-24, exact in float
    word = sign | bits_of(float(mantissa) * 5.9604644775390625e-8f);
  }
  return float_of_bits(word);
}

inline uint16_t float_to_float16(float value) {
  uint32_t word = bits_of(value);
  uint32_t sign = (word >> 16) & 0x8000u;
  uint32_t magnitude = word & 0x7fffffffu;
  if (magnitude > 0x7f800000u) return uint16_t(sign | 0x7e00u);  // NaN
  if (magnitude >= 0x47800000u) return uint16_t(sign | 0x7c00u);  // >= 65536: inf
  if (magnitude < 0x38800000u) {
    // Below 2^-14 the half is subnormal: adding 0.5 puts its mantissa in the
    // float's low bits, rounded to nearest even by the float addition.
    return uint16_t(sign | (bits_of(float_of_bits(magnitude) + 0.5f) - 0x3f000000u));
  }
  uint32_t odd = (magnitude >> 13) & 1u;
  magnitude += 0xc8000fffu + odd;  // rebias the exponent (127 -> 15) and round
  return uint16_t(sign | (magnitude >> 13));
}

// Reads n elements at stride into fp32 dst.
void load_row(const InputView& view, int64_t offset, int64_t stride, int64_t n, float* dst) {
  switch (view.type) {
    case ElementType::Float32: {
      const float* src = static_cast<const float*>(view.data) + offset;
      if (stride == 1) {
        std::memcpy(dst, src, n * sizeof(float));
        break;
      }
      for (int64_t i = 0; i < n; ++i) dst[i] = src[i * stride];
      break;
    }
    case ElementType::BFloat16: {
      const uint16_t* src = static_cast<const uint16_t*>(view.data) + offset;
      for (int64_t i = 0; i < n; ++i) dst[i] = bfloat16_to_float(src[i * stride]);
      break;
    }
    case ElementType::Float16: {
      const uint16_t* src = static_cast<const uint16_t*>(view.data) + offset;
      for (int64_t i = 0; i < n; ++i) dst[i] = float16_to_float(src[i * stride]);
      break;
    }
  }
}

float load_scalar(const InputView& view, int64_t offset) {
  float value;
  load_row(view, offset, 1, 1, &value);
  return value;
}

void store_row(ElementType type, void* data, int64_t offset, int64_t stride, int64_t n, const float* src) {
  switch (type) {
    case ElementType::Float32: {
      float* dst = static_cast<float*>(data) + offset;
      if (stride == 1) {
        std::memcpy(dst, src, n * sizeof(float));
        break;
      }
      for (int64_t i = 0; i < n; ++i) dst[i * stride] = src[i];
      break;
    }
    case ElementType::BFloat16: {
      uint16_t* dst = static_cast<uint16_t*>(data) + offset;
      for (int64_t i = 0; i < n; ++i) dst[i * stride] = float_to_bfloat16(src[i]);
      break;
    }
    case ElementType::Float16: {
      uint16_t* dst = static_cast<uint16_t*>(data) + offset;
      for (int64_t i = 0; i < n; ++i) dst[i * stride] = float_to_float16(src[i]);
      break;
    }
  }
}

// ---- GEMM: C (+)= A B, row major ----
//
// A tile of up to kTileRows x kTileVectors vectors of C stays in registers
// (AVX-512: 24 accumulators of 32 registers, AVX2: 12 of 16). Each step along
// k loads one row of the B panel into registers and broadcasts one element of
// A per row, so a step costs kTileVectors + kTileRows loads for
// kTileRows * kTileVectors FMAs and the loop runs at the FMA units' rate.
// Column counts are multiples of kLanes: the working buffers are padded.
constexpr int kTileRows = 6;
constexpr int kTileVectors = kLanes == 16 ? 4 : 2;

// Pins v to a register. GCC otherwise folds the load of a B row into every
// x86 FMA that uses it: kTileRows loads per vector instead of one, and the
// tile becomes bound by loads. Only where a Vec fits one register (AVX's 256
// bits or wider): without AVX (a --portable build) there is none to pin it to.
inline void keep_in_register(Vec& v) {
#if (defined(__x86_64__) || defined(__i386__)) && defined(__AVX__)
  asm("" : "+v"(v));
#else
  (void)v;
#endif
}

// What a GEMM adds to: zero, or C itself with row r first scaled by
// row_scale[r] when row_scale is given (the state's decay, folded into the
// product that updates the state).
struct GemmStart {
  bool accumulate = false;
  const float* row_scale = nullptr;
};

template <int kRows, int kVectors>
inline void gemm_tile(int64_t depth, const float* a, int64_t lda, const float* b, int64_t ldb, float* c, int64_t ldc,
                      GemmStart start) {
  Vec acc[kRows][kVectors];
  for (int r = 0; r < kRows; ++r) {
    const Vec scale = broadcast(start.row_scale ? start.row_scale[r] : 1.0f);
    for (int v = 0; v < kVectors; ++v) acc[r][v] = start.accumulate ? load(c + r * ldc + v * kLanes) * scale : Vec{};
  }
  for (int64_t p = 0; p < depth; ++p) {
    Vec row[kVectors];
    for (int v = 0; v < kVectors; ++v) {
      row[v] = load(b + p * ldb + v * kLanes);
      keep_in_register(row[v]);
    }
    for (int r = 0; r < kRows; ++r) {
      const Vec scalar = broadcast(a[r * lda + p]);
      for (int v = 0; v < kVectors; ++v) acc[r][v] += scalar * row[v];
    }
  }
  for (int r = 0; r < kRows; ++r)
    for (int v = 0; v < kVectors; ++v) store(c + r * ldc + v * kLanes, acc[r][v]);
}

// A tile of rows x vectors (at most kRows x kVectors), with the sizes fixed at
// compile time so the accumulators can live in registers.
template <int kRows, int kVectors>
void gemm_block(int rows, int vectors, int64_t depth, const float* a, int64_t lda, const float* b, int64_t ldb,
                float* c, int64_t ldc, GemmStart start) {
  if constexpr (kRows > 1) {
    if (rows < kRows) return gemm_block<kRows - 1, kVectors>(rows, vectors, depth, a, lda, b, ldb, c, ldc, start);
  }
  if constexpr (kVectors > 1) {
    if (vectors < kVectors) return gemm_block<kRows, kVectors - 1>(rows, vectors, depth, a, lda, b, ldb, c, ldc, start);
  }
  gemm_tile<kRows, kVectors>(depth, a, lda, b, ldb, c, ldc, start);
}

// Which part of a GEMM is skipped for triangular operands.
enum class Triangle {
  None,
  Output,  // only C[i][j], j <= i, is wanted: tiles wholly above the diagonal are skipped
  Left,    // A[i][p] = 0 for p > i: a tile stops at the depth of its last row
};

// C[m x n] (+)= A[m x k] B[k x n]. Column panels outside, row tiles inside:
// a k x (kTileVectors * kLanes) panel of B serves every row tile from cache.
void gemm(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b, int64_t ldb, float* c,
          int64_t ldc, GemmStart start, Triangle triangle = Triangle::None) {
  constexpr int64_t kPanel = kTileVectors * kLanes;
  for (int64_t j = 0; j < n; j += kPanel) {
    for (int64_t i = 0; i < m; i += kTileRows) {
      const int64_t rows = std::min<int64_t>(kTileRows, m - i);
      int64_t columns = std::min(kPanel, n - j);
      if (triangle == Triangle::Output) columns = std::min(columns, round_up(i + rows, kLanes) - j);
      if (columns <= 0) continue;
      const int64_t depth = triangle == Triangle::Left ? std::min(k, i + rows) : k;
      GemmStart tile_start = start;
      if (start.row_scale) tile_start.row_scale += i;
      gemm_block<kTileRows, kTileVectors>(int(rows), int(columns / kLanes), depth, a + i * lda, lda, b + j, ldb,
                                          c + i * ldc + j, ldc, tile_start);
    }
  }
}

// dst[c][r] = src[r][c] for r < rows, c < columns.
void transpose(int64_t rows, int64_t columns, const float* src, int64_t src_stride, float* dst, int64_t dst_stride) {
  for (int64_t c = 0; c < columns; ++c)
    for (int64_t r = 0; r < rows; ++r) dst[c * dst_stride + r] = src[r * src_stride + c];
}

// ---- per-token inputs of one head ----

struct HeadIndex {
  int64_t batch, value_head, key_head;
};

// Loads q_t (normalized, scaled) and k_t (normalized) of head into fp32 rows.
void load_query_key(const GatedDeltaRuleProblem& p, const HeadIndex& head, int64_t t, float* query, float* key) {
  const int64_t dk = p.key_dim;
  load_row(p.query,
           head.batch * p.query.strides[0] + t * p.query.strides[1] + head.key_head * p.query.strides[2],
           p.query.strides[3], dk, query);
  load_row(p.key, head.batch * p.key.strides[0] + t * p.key.strides[1] + head.key_head * p.key.strides[2],
           p.key.strides[3], dk, key);
  float query_scale = p.scale;
  if (p.use_qk_l2norm) {
    // x / sqrt(sum(x^2) + eps), as the reference's l2_normalize.
    constexpr float kEps = 1e-6f;
    query_scale /= std::sqrt(dot(query, query, dk) + kEps);
    const float key_scale = 1.0f / std::sqrt(dot(key, key, dk) + kEps);
    for (int64_t c = 0; c < dk; ++c) key[c] *= key_scale;
  }
  for (int64_t c = 0; c < dk; ++c) query[c] *= query_scale;
}

void load_value(const GatedDeltaRuleProblem& p, const HeadIndex& head, int64_t t, float* value) {
  load_row(p.value, head.batch * p.value.strides[0] + t * p.value.strides[1] + head.value_head * p.value.strides[2],
           p.value.strides[3], p.value_dim, value);
}

int64_t gate_offset(const GatedDeltaRuleProblem& p, const HeadIndex& head, int64_t t) {
  return head.batch * p.g.strides[0] + t * p.g.strides[1] + head.value_head * p.g.strides[2];
}

// The log gate of token t: the head's scalar (GDA) ...
float load_scalar_gate(const GatedDeltaRuleProblem& p, const HeadIndex& head, int64_t t) {
  return load_scalar(p.g, gate_offset(p, head, t));
}

// ... or its Dk channels (KDA).
void load_channel_gates(const GatedDeltaRuleProblem& p, const HeadIndex& head, int64_t t, float* gate) {
  load_row(p.g, gate_offset(p, head, t), p.g.strides[3], p.key_dim, gate);
}

float load_beta(const GatedDeltaRuleProblem& p, const HeadIndex& head, int64_t t) {
  return load_scalar(p.beta, head.batch * p.beta.strides[0] + t * p.beta.strides[1] + head.value_head * p.beta.strides[2]);
}

void store_output(const GatedDeltaRuleProblem& p, const HeadIndex& head, int64_t t, const float* row) {
  store_row(p.value.type, p.output,
            head.batch * p.output_strides[0] + t * p.output_strides[1] + head.value_head * p.output_strides[2],
            p.output_strides[3], p.value_dim, row);
}

// Asks for the cache lines of a contiguous row ahead of its use. Always
// inlined: GCC drops calls to a local function that only prefetches.
__attribute__((always_inline)) inline void prefetch_row(const InputView& view, int64_t offset, int64_t stride,
                                                        int64_t n) {
  if (stride != 1) return;
  const int64_t bytes = n * (view.type == ElementType::Float32 ? 4 : 2);
  const char* begin = static_cast<const char*>(view.data) + offset * (view.type == ElementType::Float32 ? 4 : 2);
  for (int64_t byte = 0; byte < bytes; byte += 64) __builtin_prefetch(begin + byte);
}

// The query and key rows of token t, and separately its value row (a key
// head's value heads read theirs in turn). A head's rows are far apart in
// memory, a cache miss each: asking a few tokens ahead overlaps the misses.
__attribute__((always_inline)) inline void prefetch_query_key(const GatedDeltaRuleProblem& p, const HeadIndex& head,
                                                              int64_t t) {
  prefetch_row(p.query, head.batch * p.query.strides[0] + t * p.query.strides[1] + head.key_head * p.query.strides[2],
               p.query.strides[3], p.key_dim);
  prefetch_row(p.key, head.batch * p.key.strides[0] + t * p.key.strides[1] + head.key_head * p.key.strides[2],
               p.key.strides[3], p.key_dim);
}

__attribute__((always_inline)) inline void prefetch_value(const GatedDeltaRuleProblem& p, const HeadIndex& head,
                                                          int64_t t) {
  prefetch_row(p.value, head.batch * p.value.strides[0] + t * p.value.strides[1] + head.value_head * p.value.strides[2],
               p.value.strides[3], p.value_dim);
}

const float* initial_state_of(const GatedDeltaRuleProblem& p, const HeadIndex& head) {
  return p.initial_state + head.batch * p.initial_state_strides[0] + head.value_head * p.initial_state_strides[1];
}

float* final_state_of(const GatedDeltaRuleProblem& p, const HeadIndex& head) {
  return p.final_state + head.batch * p.final_state_strides[0] + head.value_head * p.final_state_strides[1];
}

// ---- token by token, on the state memory ----

// A vector of state values as fp32 from a row of the state's element type (float, or _Float16 when the problem's
// half_state is set), and back: a half state is widened in registers, so each pass reads it as it lies.
inline Vec load_state(const float* p) { return load(p); }
inline void store_state(float* p, Vec v) { store(p, v); }
inline Vec load_state(const _Float16* p) { return load_halves(p); }
inline void store_state(_Float16* p, Vec v) { store_halves(p, v); }

// Head `head`'s state in the half state's memory.
_Float16* half_state_of(const GatedDeltaRuleProblem& p, const HeadIndex& head) {
  return static_cast<_Float16*>(p.half_state) + head.batch * p.half_state_strides[0] +
         head.value_head * p.half_state_strides[1];
}

// Vectors of columns a pass over the state keeps in registers (pass 1 holds
// two accumulators per vector: S'^T k and S'^T q).
constexpr int kStateVectors = kLanes == 16 ? 8 : 4;

// Pass 1 on columns [0, kVectors * kLanes) of the rows at source (vectors <=
// kVectors of them, fixed at compile time): S'^T k and S'^T q with
// S' = diag(decay) S, accumulated in registers so that each row is read once
// and nothing else goes to memory.
template <int kVectors, class State>
void read_state(int vectors, int64_t dk, const State* source, int64_t stride, const float* key_weight,
                const float* query_weight, float* state_key, float* state_query) {
  if constexpr (kVectors > 1) {
    if (vectors < kVectors)
      return read_state<kVectors - 1>(vectors, dk, source, stride, key_weight, query_weight, state_key, state_query);
  }
  Vec sk[kVectors], sq[kVectors];
  for (int v = 0; v < kVectors; ++v) sk[v] = sq[v] = Vec{};
  for (int64_t c = 0; c < dk; ++c) {
    const Vec kw = broadcast(key_weight[c]), qw = broadcast(query_weight[c]);
    for (int v = 0; v < kVectors; ++v) {
      const Vec row = load_state(source + c * stride + v * kLanes);
      sk[v] += kw * row;
      sq[v] += qw * row;
    }
  }
  for (int v = 0; v < kVectors; ++v) {
    store(state_key + v * kLanes, sk[v]);
    store(state_query + v * kLanes, sq[v]);
  }
}

// Pass 2 on the same columns: target row c = decay[c] source row c + key[c] u,
// with u in registers. source may be target.
template <int kVectors, class State>
void write_state(int vectors, int64_t dk, const State* source, int64_t source_stride, State* target,
                 int64_t target_stride, const float* decay, const float* key, const float* update) {
  if constexpr (kVectors > 1) {
    if (vectors < kVectors)
      return write_state<kVectors - 1>(vectors, dk, source, source_stride, target, target_stride, decay, key, update);
  }
  Vec u[kVectors];
  for (int v = 0; v < kVectors; ++v) u[v] = load(update + v * kLanes);
  for (int64_t c = 0; c < dk; ++c) {
    const Vec d = broadcast(decay[c]), k = broadcast(key[c]);
    for (int v = 0; v < kVectors; ++v)
      store_state(target + c * target_stride + v * kLanes,
                  d * load_state(source + c * source_stride + v * kLanes) + k * u[v]);
  }
}

// One value head, token by token, on its state where it lies: State is float, or _Float16 for a half state,
// widened and rounded in registers, each token's state rounded once (only one-token calls take this path with
// a half state: the reference rounds once a call).
template <class State>
void recurrent_head(const GatedDeltaRuleProblem& p, const HeadIndex& head, std::vector<float>& scratch) {
  const int64_t dk = p.key_dim, dv = p.value_dim;
  scratch.resize(5 * dk + 5 * dv);
  float* query = scratch.data();
  float* key = query + dk;
  float* decay = key + dk;
  float* key_weight = decay + dk;  // decay * k
  float* query_weight = key_weight + dk;  // decay * q
  float* value = query_weight + dk;
  float* state_key = value + dv;  // S'^T k
  float* state_query = state_key + dv;  // S'^T q
  float* update = state_query + dv;
  float* output = update + dv;

  const State* source;
  State* target;
  int64_t source_row_stride, target_row_stride;
  if constexpr (std::is_same_v<State, float>) {
    source = initial_state_of(p, head);
    source_row_stride = p.initial_state_strides[2];
    target = final_state_of(p, head);
    target_row_stride = p.final_state_strides[2];
  } else {
    source = target = half_state_of(p, head);
    source_row_stride = target_row_stride = p.half_state_strides[2];
  }
  // Columns the register passes cover; the few left over (Dv not a multiple
  // of the vector width) are done element by element.
  const int64_t vector_columns = dv / kLanes * kLanes;
  constexpr int64_t kBlockColumns = kStateVectors * kLanes;
  for (int64_t t = 0; t < p.length; ++t) {
    load_query_key(p, head, t, query, key);
    load_value(p, head, t, value);
    if (p.per_channel_gate) {
      load_channel_gates(p, head, t, decay);
      for (int64_t c = 0; c < dk; ++c) decay[c] = std::exp(decay[c]);
    } else {
      std::fill(decay, decay + dk, std::exp(load_scalar_gate(p, head, t)));
    }
    for (int64_t c = 0; c < dk; ++c) {
      key_weight[c] = key[c] * decay[c];
      query_weight[c] = query[c] * decay[c];
    }
    const float beta = load_beta(p, head, t);

    // Pass 1 reads the state for S'^T k and S'^T q.
    for (int64_t j = 0; j < vector_columns; j += kBlockColumns) {
      const int vectors = int(std::min(kBlockColumns, vector_columns - j) / kLanes);
      read_state<kStateVectors>(vectors, dk, source + j, source_row_stride, key_weight, query_weight, state_key + j,
                                state_query + j);
    }
    for (int64_t j = vector_columns; j < dv; ++j) {
      float sk = 0.0f, sq = 0.0f;
      for (int64_t c = 0; c < dk; ++c) {
        sk += key_weight[c] * float(source[c * source_row_stride + j]);
        sq += query_weight[c] * float(source[c * source_row_stride + j]);
      }
      state_key[j] = sk;
      state_query[j] = sq;
    }
    // u = beta (v - S'^T k); o = (S' + k u^T)^T q = S'^T q + (q.k) u.
    const float query_key = dot(query, key, dk);
    for (int64_t j = 0; j < dv; ++j) {
      update[j] = beta * (value[j] - state_key[j]);
      output[j] = state_query[j] + query_key * update[j];
    }
    // Pass 2 writes S = S' + k u^T, reading rows pass 1 left in cache.
    for (int64_t j = 0; j < vector_columns; j += kBlockColumns) {
      const int vectors = int(std::min(kBlockColumns, vector_columns - j) / kLanes);
      write_state<kStateVectors>(vectors, dk, source + j, source_row_stride, target + j, target_row_stride, decay, key,
                                 update + j);
    }
    for (int64_t c = 0; c < dk; ++c)
      for (int64_t j = vector_columns; j < dv; ++j)
        target[c * target_row_stride + j] =
            State(decay[c] * float(source[c * source_row_stride + j]) + key[c] * update[j]);
    store_output(p, head, t, output);
    source = target;
    source_row_stride = target_row_stride;
  }
  if (p.length == 0 && target != source) {
    for (int64_t c = 0; c < dk; ++c)
      std::memcpy(target + c * target_row_stride, source + c * source_row_stride, dv * sizeof(State));
  }
}

// ---- chunked (WY) form ----
//
// With G_t the log gate summed from the chunk start up to t (per key channel),
// S_0 the state at the chunk start, K~_t = k_t exp(G_t), Q~_t = q_t exp(G_t):
//   M[t, s] = K~_t . (k_s exp(-G_s)) for s < t,  A[t, s] = Q~_t . (k_s exp(-G_s)) for s <= t,
//   (I + diag(beta) M) U = diag(beta) (V - K~ S_0),   O = Q~ S_0 + A U,
//   S_C = exp(G_C) S_0 + sum_s (k_s exp(G_C - G_s)) u_s^T.
// The products are GEMMs on the tiles above; the exponents are taken as
// differences G_t - G_s <= 0, so nothing overflows however strong the decay.

// Tokens ahead whose input rows the packing loop prefetches.
constexpr int64_t kPrefetchDistance = 4;

// Tokens per chunk. The state products cost ~6 Dk Dv flops per token whatever
// the chunk; the scores, the solve and A U grow with the chunk (~4 C Dk per
// token), while the GEMM tiles want a depth of a few dozen to run at speed.
// 32 measured fastest for Dk = Dv = 128 (64 is ~10% slower), and keeps the
// per-channel gates' exp per key channel and token pair cheap.
constexpr int64_t kChunk = 32;

// Rows of the triangular solve done at a time: the rows above a block enter
// through one GEMM, only the block's own triangle is substituted row by row.
constexpr int64_t kSolveBlock = 16;

// Per-thread working buffers of the chunked form, padded for the GEMM tiles.
// A key head's value heads share the query and key buffers (and, for GDA, the
// raw scores); the rest serves one value head at a time.
struct ChunkBuffers {
  int64_t chunk, key_pad, value_pad;
  std::vector<float> storage;
  float *states, *queries, *keys, *decayed, *keys_t, *raw_scores, *values, *gates, *betas, *last_decay, *projected,
      *scores, *updates;

  ChunkBuffers(int64_t chunk_size, int64_t key_dim, int64_t value_dim, int64_t group)
      : chunk(chunk_size), key_pad(round_up(key_dim, kPad)), value_pad(round_up(value_dim, kPad)) {
    const int64_t sizes[] = {
        // states [G, Dk, Dv'], when final_state's rows cannot hold them
        value_dim == value_pad ? 0 : group * key_dim * value_pad,
        chunk * key_pad,        // queries [C, Dk'], normalized and scaled
        chunk * key_pad,        // keys [C, Dk'], normalized
        2 * chunk * key_pad,    // decayed keys K~, then queries Q~ [2C, Dk']
        key_pad * chunk,        // keys transposed [Dk', C] (KDA: decayed to the chunk end)
        2 * chunk * chunk,      // GDA: K K^T, then Q K^T [2C, C], lower triangles
        chunk * value_pad,      // values [C, Dv']
        chunk * key_pad,        // cumulative log gates G: [C, Dk'] (KDA) or [C] (GDA)
        chunk,                  // betas
        key_pad,                // exp(G_C): the state's decay over the chunk
        2 * chunk * value_pad,  // K~ S_0, then Q~ S_0 [2C, Dv']
        2 * chunk * chunk,      // system matrix -diag(beta) M, then A [2C, C]
        chunk * value_pad,      // updates U [C, Dv']
    };
    int64_t total = 0;
    for (int64_t size : sizes) total += size;
    storage.assign(total, 0.0f);
    float** slots[] = {&states, &queries, &keys, &decayed, &keys_t, &raw_scores, &values,
                       &gates, &betas, &last_decay, &projected, &scores, &updates};
    float* cursor = storage.data();
    for (size_t i = 0; i < sizeof(slots) / sizeof(slots[0]); ++i) {
      *slots[i] = cursor;
      cursor += sizes[i];
    }
  }
};

// GDA has one decay per token, so M and A are the plain products K K^T and
// Q K^T (lower triangles only) times exp(G_t - G_s): the products are made
// once per chunk for all the value heads of a key head ...
void key_head_scores(int64_t length, ChunkBuffers& buf) {
  const int64_t kp = buf.key_pad, chunk = buf.chunk, length_pad = round_up(length, kPad);
  transpose(length, kp, buf.keys, kp, buf.keys_t, chunk);
  for (int64_t c = 0; c < kp; ++c) std::fill(buf.keys_t + c * chunk + length, buf.keys_t + c * chunk + length_pad, 0.0f);
  gemm(length, length_pad, kp, buf.keys, kp, buf.keys_t, chunk, buf.raw_scores, chunk, {}, Triangle::Output);
  gemm(length, length_pad, kp, buf.queries, kp, buf.keys_t, chunk, buf.raw_scores + chunk * chunk, chunk, {},
       Triangle::Output);
}

// ... and weighed by each value head's decays (and betas) here.
void scalar_gate_scores(int64_t length, ChunkBuffers& buf, float* system, float* query_scores) {
  const int64_t chunk = buf.chunk, length_pad = round_up(length, kPad);
  const float* raw_key_scores = buf.raw_scores;
  const float* raw_query_scores = buf.raw_scores + chunk * chunk;
  const IntVec lanes = lane_indices();
  for (int64_t t = 0; t < length; ++t) {
    const Vec gate = broadcast(buf.gates[t]), negative_beta = broadcast(-buf.betas[t]);
    for (int64_t s = 0; s < length_pad; s += kLanes) {
      float* key_row = system + t * chunk + s;
      float* query_row = query_scores + t * chunk + s;
      if (s > t) {  // above the diagonal (this tile was skipped by the GEMMs)
        store(key_row, Vec{});
        store(query_row, Vec{});
        continue;
      }
      const IntVec index = lanes + int32_t(s);
      const Vec decay = vector_exp(gate - load(buf.gates + s));
      store(key_row, index < int32_t(t) ? negative_beta * decay * load(raw_key_scores + t * chunk + s) : Vec{});
      store(query_row, index <= int32_t(t) ? decay * load(raw_query_scores + t * chunk + s) : Vec{});
    }
  }
}

// Scores of one chunk, KDA: the decay differs per channel, so every pair
// (t, s <= t) weighs the channels by exp(G_t - G_s) itself.
void channel_gate_scores(int64_t length, ChunkBuffers& buf, float* system, float* query_scores) {
  const int64_t kp = buf.key_pad, chunk = buf.chunk, length_pad = round_up(length, kPad);
  for (int64_t t = 0; t < length; ++t) {
    const float* gate_t = buf.gates + t * kp;
    for (int64_t s = 0; s <= t; ++s) {
      const float* gate_s = buf.gates + s * kp;
      Vec key_dot{}, query_dot{};
      for (int64_t c = 0; c < kp; c += kLanes) {
        const Vec weighted = load(buf.keys + s * kp + c) * vector_exp(load(gate_t + c) - load(gate_s + c));
        key_dot += load(buf.keys + t * kp + c) * weighted;
        query_dot += load(buf.queries + t * kp + c) * weighted;
      }
      system[t * chunk + s] = s < t ? -buf.betas[t] * sum(key_dot) : 0.0f;
      query_scores[t * chunk + s] = sum(query_dot);
    }
    std::fill(system + t * chunk + t + 1, system + t * chunk + length_pad, 0.0f);
    std::fill(query_scores + t * chunk + t + 1, query_scores + t * chunk + length_pad, 0.0f);
  }
}

// U = R + W U with W = -diag(beta) M strictly lower and R in updates on entry.
void solve_updates(int64_t length, const float* system, ChunkBuffers& buf) {
  const int64_t vp = buf.value_pad, chunk = buf.chunk;
  for (int64_t block = 0; block < length; block += kSolveBlock) {
    const int64_t block_end = std::min(block + kSolveBlock, length);
    if (block > 0)
      gemm(block_end - block, vp, block, system + block * chunk, chunk, buf.updates, vp, buf.updates + block * vp, vp,
           {true});
    for (int64_t t = block + 1; t < block_end; ++t) {
      float* update = buf.updates + t * vp;
      for (int64_t s = block; s < t; ++s) {
        const Vec weight = broadcast(system[t * chunk + s]);
        const float* solved = buf.updates + s * vp;
        for (int64_t j = 0; j < vp; j += kLanes) store(update + j, load(update + j) + weight * load(solved + j));
      }
    }
  }
}

// The value heads [batch, key_head * G, (key_head + 1) * G) of one key head,
// chunk by chunk: each chunk's queries and keys (and GDA's raw scores) are
// made once and used by all G heads in turn.
void chunked_group(const GatedDeltaRuleProblem& p, int64_t batch, int64_t key_head, ChunkBuffers& buf) {
  const int64_t dk = p.key_dim, dv = p.value_dim, kp = buf.key_pad, vp = buf.value_pad, chunk = buf.chunk;
  const int64_t group = p.num_v_heads / p.num_k_heads;
  const bool per_channel = p.per_channel_gate;
  const auto head_of = [&](int64_t g) { return HeadIndex{batch, key_head * group + g, key_head}; };
  // The states are worked on in final_state's memory when their rows need no
  // padding (saving a copy in and out), else in padded buffers.
  const bool in_final = dv == vp;
  const int64_t state_stride = in_final ? p.final_state_strides[2] : vp;
  const auto state_of = [&](int64_t g) { return in_final ? final_state_of(p, head_of(g)) : buf.states + g * dk * vp; };
  for (int64_t g = 0; g < group; ++g) {
    const float* initial = initial_state_of(p, head_of(g));
    float* state = state_of(g);
    if (state != initial) {
      for (int64_t c = 0; c < dk; ++c)
        std::memcpy(state + c * state_stride, initial + c * p.initial_state_strides[2], dv * sizeof(float));
    }
  }

  float* system = buf.scores;                        // -diag(beta) M [C, C], row stride chunk
  float* query_scores = buf.scores + chunk * chunk;  // A
  for (int64_t start = 0; start < p.length; start += chunk) {
    const int64_t length = std::min(chunk, p.length - start);
    // Pack the chunk's zero-padded fp32 query and key rows.
    for (int64_t t = 0; t < length; ++t) {
      if (start + t + kPrefetchDistance < p.length) prefetch_query_key(p, head_of(0), start + t + kPrefetchDistance);
      load_query_key(p, head_of(0), start + t, buf.queries + t * kp, buf.keys + t * kp);
    }
    if (!per_channel) key_head_scores(length, buf);

    for (int64_t g = 0; g < group; ++g) {
      const HeadIndex head = head_of(g);
      float* state = state_of(g);
      // This head's values, betas and cumulative gates.
      for (int64_t t = 0; t < length; ++t) {
        if (t + kPrefetchDistance < length) prefetch_value(p, head, start + t + kPrefetchDistance);
        load_value(p, head, start + t, buf.values + t * vp);
        buf.betas[t] = load_beta(p, head, start + t);
        if (per_channel) {
          float* gate = buf.gates + t * kp;
          load_channel_gates(p, head, start + t, gate);
          if (t > 0)
            for (int64_t c = 0; c < dk; ++c) gate[c] += gate[c - kp];
        } else {
          buf.gates[t] = load_scalar_gate(p, head, start + t) + (t > 0 ? buf.gates[t - 1] : 0.0f);
        }
      }
      // K~ and Q~ stacked, so that one GEMM gives both against S_0.
      for (int64_t t = 0; t < length; ++t) {
        const Vec scalar_decay = broadcast(per_channel ? 0.0f : std::exp(buf.gates[t]));
        for (int64_t c = 0; c < kp; c += kLanes) {
          const Vec decay = per_channel ? vector_exp(load(buf.gates + t * kp + c)) : scalar_decay;
          store(buf.decayed + t * kp + c, load(buf.keys + t * kp + c) * decay);
          store(buf.decayed + (length + t) * kp + c, load(buf.queries + t * kp + c) * decay);
        }
      }
      gemm(2 * length, vp, dk, buf.decayed, kp, state, state_stride, buf.projected, vp, {});
      const float* key_state = buf.projected;           // K~ S_0
      float* query_state = buf.projected + length * vp;  // Q~ S_0

      if (per_channel) {
        channel_gate_scores(length, buf, system, query_scores);
      } else {
        scalar_gate_scores(length, buf, system, query_scores);
      }

      // (I + diag(beta) M) U = diag(beta) (V - K~ S_0).
      for (int64_t t = 0; t < length; ++t) {
        const Vec beta = broadcast(buf.betas[t]);
        for (int64_t j = 0; j < vp; j += kLanes)
          store(buf.updates + t * vp + j, beta * (load(buf.values + t * vp + j) - load(key_state + t * vp + j)));
      }
      solve_updates(length, system, buf);

      // O = Q~ S_0 + A U.
      gemm(length, vp, length, query_scores, chunk, buf.updates, vp, query_state, vp, {true}, Triangle::Left);
      for (int64_t t = 0; t < length; ++t) store_output(p, head, start + t, query_state + t * vp);

      // S_C = exp(G_C) S_0 + K'^T U, K'_s = k_s exp(G_C - G_s). GDA keeps K^T
      // from the scores and puts the per-token factor on U's rows instead.
      if (per_channel) {
        const float* last_gate = buf.gates + (length - 1) * kp;
        for (int64_t s = 0; s < length; ++s)
          for (int64_t c = 0; c < kp; c += kLanes)
            store(buf.decayed + s * kp + c,
                  load(buf.keys + s * kp + c) * vector_exp(load(last_gate + c) - load(buf.gates + s * kp + c)));
        transpose(length, dk, buf.decayed, kp, buf.keys_t, chunk);
        for (int64_t c = 0; c < dk; ++c) buf.last_decay[c] = std::exp(last_gate[c]);
      } else {
        const float last_gate = buf.gates[length - 1];
        for (int64_t s = 0; s < length; ++s) {
          const Vec decay = broadcast(std::exp(last_gate - buf.gates[s]));
          for (int64_t j = 0; j < vp; j += kLanes) store(buf.updates + s * vp + j, load(buf.updates + s * vp + j) * decay);
        }
        std::fill(buf.last_decay, buf.last_decay + dk, std::exp(last_gate));
      }
      gemm(dk, vp, length, buf.keys_t, chunk, buf.updates, vp, state, state_stride, {true, buf.last_decay});
    }
  }

  if (!in_final) {
    for (int64_t g = 0; g < group; ++g) {
      float* final_state = final_state_of(p, head_of(g));
      for (int64_t c = 0; c < dk; ++c)
        std::memcpy(final_state + c * p.final_state_strides[2], state_of(g) + c * vp, dv * sizeof(float));
    }
  }
}

// The heads of `unit` (a key head's group in the chunked form, else one value head) as [first, last).
std::pair<int64_t, int64_t> heads_of_unit(const GatedDeltaRuleProblem& p, bool chunked, int64_t unit) {
  const int64_t group = p.num_v_heads / p.num_k_heads;
  if (chunked) {
    const int64_t first = (unit % p.num_k_heads) * group;
    return {first, first + group};
  }
  return {unit % p.num_v_heads, unit % p.num_v_heads + 1};
}

}  // namespace

void gated_delta_rule(const GatedDeltaRuleProblem& p, const ParallelFor& parallel_for) {
  const int64_t group = p.num_v_heads / p.num_k_heads;
  const bool chunked = p.length >= kChunkedMinLength;
  // The chunked form runs a key head's value heads together (they share its
  // queries and keys); token by token, every value head is a unit of its own.
  const int64_t num_units = chunked ? p.batch * p.num_k_heads : p.batch * p.num_v_heads;
  const int64_t units_per_batch = num_units / p.batch;
  const int64_t head_size = p.key_dim * p.value_dim;
  // Threads take units one at a time from a shared counter instead of fixed
  // ranges: one slowed down (by another process, or on a slower core) then
  // takes fewer units rather than holding up the call. The range each worker
  // is handed only tells it to join in.
  std::atomic<int64_t> next_unit{0};
  parallel_for(0, num_units, [&](int64_t, int64_t) {
    std::vector<float> scratch;
    std::unique_ptr<ChunkBuffers> buffers;
    // A half state's fp32 copy, a slot per value head (only the unit's own are touched), and the problem
    // pointed at it, for the calls of more than one token: the kernels then run unchanged and the state is
    // rounded once a call, as the reference rounds it. The copy lives across calls on each thread. A decode
    // step's token (most calls) reads and writes the half state where it lies instead (recurrent_head).
    thread_local std::vector<float> state_copy;
    const bool on_half_copy = p.half_state && p.length > 1;
    GatedDeltaRuleProblem on_copy;
    if (on_half_copy) {
      if (state_copy.size() < size_t(p.num_v_heads * head_size)) state_copy.resize(p.num_v_heads * head_size);
      on_copy = p;
      on_copy.half_state = nullptr;
      on_copy.initial_state = on_copy.final_state = state_copy.data();
      const int64_t copy_strides[3] = {0, head_size, p.value_dim};
      for (int d = 0; d < 3; ++d) on_copy.initial_state_strides[d] = on_copy.final_state_strides[d] = copy_strides[d];
    }
    const GatedDeltaRuleProblem& q = on_half_copy ? on_copy : p;
    for (int64_t index = next_unit++; index < num_units; index = next_unit++) {
      const int64_t batch = index / units_per_batch;
      const auto [first, last] = heads_of_unit(p, chunked, index);
      // Row c of value head h's half state, and of its copy.
      const auto half_row = [&](int64_t h, int64_t c) {
        return half_state_of(p, HeadIndex{batch, h, h / group}) + c * p.half_state_strides[2];
      };
      const auto copy_row = [&](int64_t h, int64_t c) { return state_copy.data() + h * head_size + c * p.value_dim; };
      if (on_half_copy)
        for (int64_t h = first; h < last; ++h)
          for (int64_t c = 0; c < p.key_dim; ++c) halves_to_floats(half_row(h, c), copy_row(h, c), p.value_dim);
      if (chunked) {
        if (!buffers) buffers = std::make_unique<ChunkBuffers>(kChunk, p.key_dim, p.value_dim, group);
        chunked_group(q, batch, index % p.num_k_heads, *buffers);
      } else if (q.half_state) {
        recurrent_head<_Float16>(q, HeadIndex{batch, first, first / group}, scratch);
      } else {
        recurrent_head<float>(q, HeadIndex{batch, first, first / group}, scratch);
      }
      if (on_half_copy)
        for (int64_t h = first; h < last; ++h)
          for (int64_t c = 0; c < p.key_dim; ++c) floats_to_halves(copy_row(h, c), half_row(h, c), p.value_dim);
    }
  });
}

}  // namespace gdn
