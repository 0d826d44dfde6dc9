// The gated delta rule on CPU (see gated_delta_rule.h).
//
// Work is split by (batch, value head): every head owns its Dk x Dv state and
// runs independently on one thread.
//
// * Short sequences (decode) step token by token straight on the state
//   memory: one pass reads the state once to get S^T k and S^T q, a second
//   pass writes the updated rows while they are still in cache, so decode
//   costs one read and one write of the state.
// * Long sequences run the chunked (WY) form of gdn_export/ops/reference.py:
//   within a chunk the delta-rule updates become a unit-lower-triangular solve
//   plus matrix products, done by small register-blocked GEMM tiles on a
//   cached copy of the state.
#include "gated_delta_rule.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

namespace gdn {
namespace {

// GCC/Clang vector extensions: one AVX-512 register where available, lowered
// to narrower registers elsewhere. Working buffers are padded to kPad columns.
#if defined(__AVX512F__)
constexpr int kLanes = 16;
#else
constexpr int kLanes = 8;
#endif
constexpr int64_t kPad = 16;
typedef float Vec __attribute__((vector_size(kLanes * sizeof(float))));
typedef float UnalignedVec __attribute__((vector_size(kLanes * sizeof(float)), aligned(4)));
typedef int32_t IntVec __attribute__((vector_size(kLanes * sizeof(int32_t))));

inline Vec load(const float* p) { return *reinterpret_cast<const UnalignedVec*>(p); }
inline void store(float* p, Vec v) { *reinterpret_cast<UnalignedVec*>(p) = v; }
inline Vec broadcast(float x) { return Vec{} + x; }

inline int64_t round_up(int64_t x, int64_t multiple) { return (x + multiple - 1) / multiple * multiple; }

// exp on a vector (Cephes-style range reduction, ~2 ulp); arguments are
// clamped to [-87, 88] so the result stays a normal float.
inline Vec exp_vec(Vec x) {
  const Vec low = broadcast(-87.0f), high = broadcast(88.0f);
  x = x < low ? low : x;
  x = x > high ? high : x;
  // floor(x / ln2 + 0.5), kept positive before the truncating conversion.
  IntVec n_int = __builtin_convertvector(x * 1.44269504088896341f + 128.5f, IntVec) - 128;
  Vec n = __builtin_convertvector(n_int, Vec);
  Vec r = x - n * 0.693359375f + n * 2.12194440e-4f;
  Vec p = broadcast(1.9875691500e-4f);
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  IntVec exponent = (n_int + 127) << 23;
  return p * reinterpret_cast<Vec&>(exponent);
}

// ---- element conversions (bit exact, round to nearest even) ----

inline float bfloat16_to_float(uint16_t bits) {
  uint32_t word = uint32_t(bits) << 16;
  float value;
  std::memcpy(&value, &word, 4);
  return value;
}

inline uint16_t float_to_bfloat16(float value) {
  uint32_t word;
  std::memcpy(&word, &value, 4);
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
    float value = float(mantissa) * 5.9604644775390625e-8f;
    std::memcpy(&word, &value, 4);
    word |= sign;
  }
  float value;
  std::memcpy(&value, &word, 4);
  return value;
}

inline uint16_t float_to_float16(float value) {
  uint32_t word;
  std::memcpy(&word, &value, 4);
  uint32_t sign = (word >> 16) & 0x8000u;
  uint32_t magnitude = word & 0x7fffffffu;
  if (magnitude > 0x7f800000u) return uint16_t(sign | 0x7e00u);  // NaN
  if (magnitude >= 0x47800000u) return uint16_t(sign | 0x7c00u);  // >= 65536: inf
  if (magnitude < 0x38800000u) {
    // Below 2^-14 the half is subnormal: adding 0.5 puts its mantissa in the
    // float's low bits, rounded to nearest even by the float addition.
    float shifted;
    std::memcpy(&shifted, &magnitude, 4);
    shifted += 0.5f;
    uint32_t bits;
    std::memcpy(&bits, &shifted, 4);
    return uint16_t(sign | (bits - 0x3f000000u));
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

// ---- GEMM: C[m x n] (+)= A[m x k] B[k x n], row major, n a multiple of kLanes ----

template <int kRows, int kVectors>
inline void gemm_tile(int64_t k, const float* a, int64_t lda, const float* b, int64_t ldb, float* c, int64_t ldc,
                      bool accumulate) {
  Vec acc[kRows][kVectors];
  for (int r = 0; r < kRows; ++r)
    for (int v = 0; v < kVectors; ++v) acc[r][v] = accumulate ? load(c + r * ldc + v * kLanes) : Vec{};
  for (int64_t p = 0; p < k; ++p) {
    Vec row[kVectors];
    for (int v = 0; v < kVectors; ++v) row[v] = load(b + p * ldb + v * kLanes);
    for (int r = 0; r < kRows; ++r) {
      Vec scalar = broadcast(a[r * lda + p]);
      for (int v = 0; v < kVectors; ++v) acc[r][v] += scalar * row[v];
    }
  }
  for (int r = 0; r < kRows; ++r)
    for (int v = 0; v < kVectors; ++v) store(c + r * ldc + v * kLanes, acc[r][v]);
}

template <int kVectors>
void gemm_columns(int64_t m, int64_t k, const float* a, int64_t lda, const float* b, int64_t ldb, float* c,
                  int64_t ldc, bool accumulate) {
  constexpr int kRows = 4;
  int64_t i = 0;
  for (; i + kRows <= m; i += kRows)
    gemm_tile<kRows, kVectors>(k, a + i * lda, lda, b, ldb, c + i * ldc, ldc, accumulate);
  for (; i < m; ++i) gemm_tile<1, kVectors>(k, a + i * lda, lda, b, ldb, c + i * ldc, ldc, accumulate);
}

void gemm(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b, int64_t ldb, float* c,
          int64_t ldc, bool accumulate) {
  constexpr int kWide = 64 / kLanes;  // 64 columns per tile: 4 AVX-512 registers per row
  int64_t j = 0;
  for (; j + kWide * kLanes <= n; j += kWide * kLanes)
    gemm_columns<kWide>(m, k, a, lda, b + j, ldb, c + j, ldc, accumulate);
  for (; j < n; j += kLanes) gemm_columns<1>(m, k, a, lda, b + j, ldb, c + j, ldc, accumulate);
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
    float query_sq = 0.0f, key_sq = 0.0f;
    for (int64_t c = 0; c < dk; ++c) {
      query_sq += query[c] * query[c];
      key_sq += key[c] * key[c];
    }
    query_scale /= std::sqrt(query_sq + kEps);
    const float key_scale = 1.0f / std::sqrt(key_sq + kEps);
    for (int64_t c = 0; c < dk; ++c) key[c] *= key_scale;
  }
  for (int64_t c = 0; c < dk; ++c) query[c] *= query_scale;
}

void load_value(const GatedDeltaRuleProblem& p, const HeadIndex& head, int64_t t, float* value) {
  load_row(p.value, head.batch * p.value.strides[0] + t * p.value.strides[1] + head.value_head * p.value.strides[2],
           p.value.strides[3], p.value_dim, value);
}

// Log gate of token t: Dk channels (KDA) or the head's scalar broadcast.
void load_gate(const GatedDeltaRuleProblem& p, const HeadIndex& head, int64_t t, float* gate) {
  const int64_t offset = head.batch * p.g.strides[0] + t * p.g.strides[1] + head.value_head * p.g.strides[2];
  if (p.per_channel_gate) {
    load_row(p.g, offset, p.g.strides[3], p.key_dim, gate);
  } else {
    std::fill(gate, gate + p.key_dim, load_scalar(p.g, offset));
  }
}

float load_beta(const GatedDeltaRuleProblem& p, const HeadIndex& head, int64_t t) {
  return load_scalar(p.beta, head.batch * p.beta.strides[0] + t * p.beta.strides[1] + head.value_head * p.beta.strides[2]);
}

void store_output(const GatedDeltaRuleProblem& p, const HeadIndex& head, int64_t t, const float* row) {
  store_row(p.value.type, p.output,
            head.batch * p.output_strides[0] + t * p.output_strides[1] + head.value_head * p.output_strides[2],
            p.output_strides[3], p.value_dim, row);
}

const float* initial_state_of(const GatedDeltaRuleProblem& p, const HeadIndex& head) {
  return p.initial_state + head.batch * p.initial_state_strides[0] + head.value_head * p.initial_state_strides[1];
}

float* final_state_of(const GatedDeltaRuleProblem& p, const HeadIndex& head) {
  return p.final_state + head.batch * p.final_state_strides[0] + head.value_head * p.final_state_strides[1];
}

// ---- token by token, on the state memory ----

void recurrent_head(const GatedDeltaRuleProblem& p, const HeadIndex& head, std::vector<float>& scratch) {
  const int64_t dk = p.key_dim, dv = p.value_dim;
  scratch.resize(3 * dk + 5 * dv);
  float* query = scratch.data();
  float* key = query + dk;
  float* decay = key + dk;
  float* value = decay + dk;
  float* state_key = value + dv;    // S^T (decay * k)
  float* state_query = state_key + dv;  // S^T (decay * q)
  float* update = state_query + dv;
  float* output = update + dv;

  const float* source = initial_state_of(p, head);
  int64_t source_row_stride = p.initial_state_strides[2];
  float* target = final_state_of(p, head);
  const int64_t target_row_stride = p.final_state_strides[2];
  for (int64_t t = 0; t < p.length; ++t) {
    load_query_key(p, head, t, query, key);
    load_value(p, head, t, value);
    load_gate(p, head, t, decay);
    for (int64_t c = 0; c < dk; ++c) decay[c] = std::exp(decay[c]);
    const float beta = load_beta(p, head, t);

    // Pass 1 reads the state: with S' = diag(decay) S, get S'^T k and S'^T q.
    std::fill(state_key, state_key + dv, 0.0f);
    std::fill(state_query, state_query + dv, 0.0f);
    float query_key = 0.0f;
    for (int64_t c = 0; c < dk; ++c) {
      const float* __restrict row = source + c * source_row_stride;
      const float key_weight = key[c] * decay[c], query_weight = query[c] * decay[c];
      float* __restrict sk = state_key;
      float* __restrict sq = state_query;
      for (int64_t j = 0; j < dv; ++j) {
        sk[j] += key_weight * row[j];
        sq[j] += query_weight * row[j];
      }
      query_key += query[c] * key[c];
    }
    // u = beta (v - S'^T k); o = (S' + k u^T)^T q = S'^T q + (q.k) u.
    for (int64_t j = 0; j < dv; ++j) {
      update[j] = beta * (value[j] - state_key[j]);
      output[j] = state_query[j] + query_key * update[j];
    }
    // Pass 2 writes S = S' + k u^T, reading rows pass 1 left in cache.
    for (int64_t c = 0; c < dk; ++c) {
      const float* row = source + c * source_row_stride;
      float* out_row = target + c * target_row_stride;
      const float row_decay = decay[c], row_key = key[c];
      for (int64_t j = 0; j < dv; ++j) out_row[j] = row_decay * row[j] + row_key * update[j];
    }
    store_output(p, head, t, output);
    source = target;
    source_row_stride = target_row_stride;
  }
  if (p.length == 0 && target != source) {
    for (int64_t c = 0; c < dk; ++c)
      std::memcpy(target + c * target_row_stride, source + c * source_row_stride, dv * sizeof(float));
  }
}

// ---- chunked (WY) form ----

// Per-thread working buffers of the chunked form, padded for the GEMM tiles.
struct ChunkBuffers {
  int64_t chunk, key_pad, value_pad;
  std::vector<float> storage;
  float *state, *keys, *queries, *decayed, *keys_t, *values, *gates, *betas, *projected, *scores, *system, *updates,
      *row;

  ChunkBuffers(int64_t chunk_size, int64_t key_dim, int64_t value_dim)
      : chunk(chunk_size), key_pad(round_up(key_dim, kPad)), value_pad(round_up(value_dim, kPad)) {
    const int64_t sizes[] = {
        key_dim * value_pad,      // state [Dk, Dv']
        chunk * key_pad,          // keys [C, Dk']
        chunk * key_pad,          // queries [C, Dk']
        2 * chunk * key_pad,      // decayed keys; queries [2C, Dk']
        key_pad * chunk,          // keys transposed [Dk', C]
        chunk * value_pad,        // values [C, Dv']
        chunk * key_pad,          // cumulative gates [C, Dk']
        chunk,                    // betas
        2 * chunk * value_pad,    // decayed keys/queries times the state [2C, Dv']
        2 * chunk * chunk,        // key-key and query-key scores [2C, C]
        chunk * chunk,            // strictly lower system matrix [C, C]
        chunk * value_pad,        // updates U [C, Dv']
        std::max(key_pad, value_pad),
    };
    int64_t total = 0;
    for (int64_t size : sizes) total += size;
    storage.assign(total, 0.0f);
    float** slots[] = {&state, &keys, &queries, &decayed, &keys_t, &values, &gates,
                       &betas, &projected, &scores, &system, &updates, &row};
    float* cursor = storage.data();
    for (int i = 0; i < 13; ++i) {
      *slots[i] = cursor;
      cursor += sizes[i];
    }
  }
};

void chunked_head(const GatedDeltaRuleProblem& p, const HeadIndex& head, ChunkBuffers& buf) {
  const int64_t dk = p.key_dim, dv = p.value_dim, kp = buf.key_pad, vp = buf.value_pad, chunk = buf.chunk;
  const float* initial = initial_state_of(p, head);
  for (int64_t c = 0; c < dk; ++c)
    std::memcpy(buf.state + c * vp, initial + c * p.initial_state_strides[2], dv * sizeof(float));

  for (int64_t start = 0; start < p.length; start += chunk) {
    const int64_t length = std::min(chunk, p.length - start);
    const int64_t length_pad = round_up(length, kPad);

    // Pack the chunk: rows of zero-padded fp32 keys, queries, values, cumulative gates.
    for (int64_t t = 0; t < length; ++t) {
      float* key = buf.keys + t * kp;
      load_query_key(p, head, start + t, buf.queries + t * kp, key);
      load_value(p, head, start + t, buf.values + t * vp);
      float* gate = buf.gates + t * kp;
      load_gate(p, head, start + t, gate);
      if (t > 0)
        for (int64_t c = 0; c < dk; ++c) gate[c] += gate[c - kp];
      buf.betas[t] = load_beta(p, head, start + t);
    }
    // Decayed keys and queries k_t exp(G_t), q_t exp(G_t): stacked so one GEMM
    // gives both against the chunk's initial state.
    for (int64_t t = 0; t < length; ++t) {
      const float* gate = buf.gates + t * kp;
      for (int64_t c = 0; c < kp; c += kLanes) {
        Vec decay = exp_vec(load(gate + c));
        store(buf.decayed + t * kp + c, load(buf.keys + t * kp + c) * decay);
        store(buf.decayed + (length + t) * kp + c, load(buf.queries + t * kp + c) * decay);
      }
    }
    gemm(2 * length, vp, dk, buf.decayed, kp, buf.state, vp, buf.projected, vp, false);
    float* key_state = buf.projected;                 // rows t: (K~ S_0)_t
    float* query_state = buf.projected + length * vp;  // rows t: (Q~ S_0)_t

    // Scores within the chunk: M[t, s] = sum_c k_t,c k_s,c exp(G_t,c - G_s,c)
    // (s < t) and A[t, s] likewise with q_t (s <= t).
    float* key_scores = buf.scores;                   // [C, C], row stride chunk
    float* query_scores = buf.scores + chunk * chunk;
    if (p.per_channel_gate) {
      for (int64_t t = 0; t < length; ++t) {
        const float* gate_t = buf.gates + t * kp;
        for (int64_t s = 0; s <= t; ++s) {
          const float* gate_s = buf.gates + s * kp;
          Vec key_dot{}, query_dot{};
          for (int64_t c = 0; c < kp; c += kLanes) {
            Vec weighted = load(buf.keys + s * kp + c) * exp_vec(load(gate_t + c) - load(gate_s + c));
            key_dot += load(buf.keys + t * kp + c) * weighted;
            query_dot += load(buf.queries + t * kp + c) * weighted;
          }
          float key_sum = 0.0f, query_sum = 0.0f;
          for (int l = 0; l < kLanes; ++l) {
            key_sum += key_dot[l];
            query_sum += query_dot[l];
          }
          key_scores[t * chunk + s] = key_sum;
          query_scores[t * chunk + s] = query_sum;
        }
      }
    } else {
      // One decay per token: plain products K K^T and Q K^T, then exp(gamma_t - gamma_s).
      std::fill(buf.keys_t, buf.keys_t + kp * chunk, 0.0f);
      for (int64_t t = 0; t < length; ++t)
        for (int64_t c = 0; c < dk; ++c) buf.keys_t[c * chunk + t] = buf.keys[t * kp + c];
      gemm(length, length_pad, dk, buf.keys, kp, buf.keys_t, chunk, key_scores, chunk, false);
      gemm(length, length_pad, dk, buf.queries, kp, buf.keys_t, chunk, query_scores, chunk, false);
      for (int64_t t = 0; t < length; ++t) {
        const float gamma_t = buf.gates[t * kp];
        for (int64_t s = 0; s <= t; ++s) {
          const float decay = std::exp(gamma_t - buf.gates[s * kp]);
          key_scores[t * chunk + s] *= decay;
          query_scores[t * chunk + s] *= decay;
        }
      }
    }
    // Zero A above the diagonal so O = Q~ S_0 + A U is one GEMM.
    for (int64_t t = 0; t < length; ++t)
      std::fill(query_scores + t * chunk + t + 1, query_scores + t * chunk + length_pad, 0.0f);

    // Solve (I + diag(beta) M) U = diag(beta) (V - K~ S_0) by forward substitution,
    // four independent vector accumulators at a time so the FMA chains overlap.
    for (int64_t t = 0; t < length; ++t) {
      const float beta = buf.betas[t];
      float* update = buf.updates + t * vp;
      const float* value = buf.values + t * vp;
      const float* predicted = key_state + t * vp;
      for (int64_t j = 0; j < vp; j += kLanes) store(update + j, broadcast(beta) * (load(value + j) - load(predicted + j)));
      int64_t j = 0;
      for (; j + 4 * kLanes <= vp; j += 4 * kLanes) {
        Vec acc[4];
        for (int v = 0; v < 4; ++v) acc[v] = load(update + j + v * kLanes);
        for (int64_t s = 0; s < t; ++s) {
          const Vec weight = broadcast(beta * key_scores[t * chunk + s]);
          const float* row = buf.updates + s * vp + j;
          for (int v = 0; v < 4; ++v) acc[v] -= weight * load(row + v * kLanes);
        }
        for (int v = 0; v < 4; ++v) store(update + j + v * kLanes, acc[v]);
      }
      for (; j < vp; j += kLanes) {
        Vec acc = load(update + j);
        for (int64_t s = 0; s < t; ++s)
          acc -= broadcast(beta * key_scores[t * chunk + s]) * load(buf.updates + s * vp + j);
        store(update + j, acc);
      }
    }
    // O = Q~ S_0 + A U.
    gemm(length, vp, length, query_scores, chunk, buf.updates, vp, query_state, vp, true);
    for (int64_t t = 0; t < length; ++t) store_output(p, head, start + t, query_state + t * vp);

    // S_C = exp(G_C) S_0 + sum_s (k_s exp(G_C - G_s)) u_s^T.
    const float* last_gate = buf.gates + (length - 1) * kp;
    std::fill(buf.keys_t, buf.keys_t + kp * chunk, 0.0f);
    for (int64_t s = 0; s < length; ++s) {
      for (int64_t c = 0; c < kp; c += kLanes)
        store(buf.row + c, load(buf.keys + s * kp + c) * exp_vec(load(last_gate + c) - load(buf.gates + s * kp + c)));
      for (int64_t c = 0; c < dk; ++c) buf.keys_t[c * chunk + s] = buf.row[c];
    }
    for (int64_t c = 0; c < dk; ++c) {
      const float decay = std::exp(last_gate[c]);
      float* state_row = buf.state + c * vp;
      for (int64_t j = 0; j < vp; ++j) state_row[j] *= decay;
    }
    gemm(dk, vp, length, buf.keys_t, chunk, buf.updates, vp, buf.state, vp, true);
  }

  float* final_state = final_state_of(p, head);
  for (int64_t c = 0; c < dk; ++c)
    std::memcpy(final_state + c * p.final_state_strides[2], buf.state + c * vp, dv * sizeof(float));
}

}  // namespace

void gated_delta_rule(const GatedDeltaRuleProblem& p, const ParallelFor& parallel_for) {
  const int64_t num_heads = p.batch * p.num_v_heads;
  const int64_t group = p.num_v_heads / p.num_k_heads;
  const bool chunked = p.length >= kChunkedMinLength;
  // Per-channel gates cost an exp per key channel and token pair, so their chunks are shorter.
  const int64_t chunk_size = p.per_channel_gate ? 32 : 64;
  parallel_for(0, num_heads, [&](int64_t begin, int64_t end) {
    std::vector<float> scratch;
    std::unique_ptr<ChunkBuffers> buffers;
    if (chunked) buffers = std::make_unique<ChunkBuffers>(chunk_size, p.key_dim, p.value_dim);
    for (int64_t index = begin; index < end; ++index) {
      const int64_t value_head = index % p.num_v_heads;
      const HeadIndex head{index / p.num_v_heads, value_head, value_head / group};
      if (chunked) {
        chunked_head(p, head, *buffers);
      } else {
        recurrent_head(p, head, scratch);
      }
    }
  });
}

}  // namespace gdn
