// See conv_gated_delta_rule.h. Each step mirrors the reference's ops in float32: the conv sums its taps in order
// (the window's oldest input first) from zero, SiLU is x / (1 + exp(-x)) with a vector exp, softplus keeps x
// above 20 as torch's does.
#include "conv_gated_delta_rule.h"

#include <algorithm>
#include <cmath>
#include <tuple>
#include <utility>
#include <vector>

#include "vector_math.h"

namespace gdn {
namespace {

// Channels a thread takes at a time: the conv of a few tokens is too little work to split finer.
constexpr int64_t kChannelBlock = 512;
// Below this many multiply-adds (T * C * W) the conv runs on the calling thread: waking the pool costs more.
constexpr int64_t kParallelConvWork = int64_t(1) << 18;
// A decode step's conv is split from this many channels: its weights and state (some 170 KB a Qwen3.5 layer)
// come from memory, and a lone thread reading them left the pool idle for some 18 us a layer.
constexpr int64_t kParallelTokenChannels = 2048;

// Scratch that lives across calls on the calling thread: a decode step's layers reuse it instead of allocating.
struct Scratch {
  std::vector<float> mixed;    // [B, T, C]: SiLU(conv), q | k | v
  std::vector<float> gates;    // [B, T, Hv] g, then [B, T, Hv] beta
  std::vector<float> weights;  // [W, C]: the conv weight tap-major, so a tap's loop runs along channels
  std::vector<float> history;  // [B, W - 1, C]: the conv state as it was read, zeros when starting
};

// x <- x / (1 + exp(-x)) over n floats.
void silu_in_place(float* x, int64_t n) {
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) store(x + i, vector_silu(load(x + i)));
  for (; i < n; ++i) x[i] = silu(x[i]);
}

inline float softplus(float x) { return x > 20.0f ? x : std::log1p(std::exp(x)); }

// One token (a decode step): each channel's window is its conv state and the new input, both read where they lie,
// so nothing is copied or transposed first. Writes the conv's sums for channels [first, last) and shifts their state.
void convolve_one_token(const ConvGatedDeltaRuleProblem& p, int64_t bi, int64_t first, int64_t last, float* out) {
  const int64_t kept = p.taps - 1;
  const float* x = p.qkv + bi * p.qkv_strides[0];
  float* state = p.conv_state + bi * p.conv_state_strides[0];
  const int64_t ws0 = p.conv_weight_strides[0], ws2 = p.conv_weight_strides[2];
  const int64_t cs1 = p.conv_state_strides[1], cs2 = p.conv_state_strides[2];
  for (int64_t c = first; c < last; ++c) {
    const float* w = p.conv_weight + c * ws0;
    float* h = state + c * cs1;
    float sum = 0.0f;
    for (int64_t k = 0; k < kept; ++k) sum += w[k * ws2] * (p.starting ? 0.0f : h[k * cs2]);
    sum += w[kept * ws2] * x[c];
    out[c] = sum;
    if (kept == 0) continue;  // a one-tap conv keeps no state
    for (int64_t j = 0; j + 1 < kept; ++j) h[j * cs2] = p.starting ? 0.0f : h[(j + 1) * cs2];
    h[(kept - 1) * cs2] = x[c];
  }
}

// The same for a conv of kTaps taps whose weight [C, 1, kTaps] and state [C, kTaps - 1] are packed: the taps
// unrolled, no pointer aliasing another: at Qwen3.5's 6144 channels a decode call's conv took some 35 us in the
// loop above and takes some 4 us here (the 2-core machine of docs/benchmarks.md).
template <int kTaps>
void convolve_one_packed_token(const float* __restrict weight, float* __restrict state, const float* __restrict x,
                               float* __restrict out, int64_t channels, bool starting) {
  constexpr int kKept = kTaps - 1;
  for (int64_t c = 0; c < channels; ++c) {
    float window[kTaps];
    for (int k = 0; k < kKept; ++k) window[k] = starting ? 0.0f : state[c * kKept + k];
    window[kKept] = x[c];
    float sum = 0.0f;
    for (int k = 0; k < kTaps; ++k) sum += weight[c * kTaps + k] * window[k];
    out[c] = sum;
    for (int k = 0; k < kKept; ++k) state[c * kKept + k] = window[k + 1];
  }
}

// Several tokens (a prompt): the conv of batch item `bi` over channels [first, last), token by token along
// channels (the weight tap-major and the old state in `s`), then the state's shift.
void convolve_tokens(const ConvGatedDeltaRuleProblem& p, Scratch& s, int64_t bi, int64_t first, int64_t last) {
  const int64_t kept = p.taps - 1, channels = p.channels;
  float* history = s.history.data() + bi * kept * channels;
  const float* qkv = p.qkv + bi * p.qkv_strides[0];
  // Row t' of the window: the history for t' < W - 1, else token t' - (W - 1) of qkv (unit channel stride).
  auto row = [&](int64_t t) -> const float* {
    return t < kept ? history + t * channels : qkv + (t - kept) * p.qkv_strides[1];
  };
  for (int64_t t = 0; t < p.length; ++t) {
    float* out = s.mixed.data() + (bi * p.length + t) * channels;
    std::fill(out + first, out + last, 0.0f);
    for (int64_t k = 0; k < p.taps; ++k) {
      const float* in = row(t + k);
      const float* w = s.weights.data() + k * channels;
      for (int64_t c = first; c < last; ++c) out[c] += w[c] * in[c];
    }
  }
  // The window's last W - 1 rows become the state (read from history or qkv, never from the state itself).
  float* state = p.conv_state + bi * p.conv_state_strides[0];
  for (int64_t j = 0; j < kept; ++j) {
    const float* in = row(p.length + j);
    for (int64_t c = first; c < last; ++c) state[c * p.conv_state_strides[1] + j * p.conv_state_strides[2]] = in[c];
  }
}

// SiLU(conv) of every token and channel into s.mixed, the conv state moved on by T tokens.
void convolve(const ConvGatedDeltaRuleProblem& p, Scratch& s, const ParallelFor& parallel_for) {
  const int64_t channels = p.channels, kept = p.taps - 1;
  const bool packed = p.conv_weight_strides[0] == p.taps && p.conv_weight_strides[2] == 1 &&
                      p.conv_state_strides[1] == kept && p.conv_state_strides[2] == 1;
  if (p.length == 1) {
    // Blocks of channels, each convolved and passed through SiLU by one thread.
    const int64_t block = channels < kParallelTokenChannels ? channels : (channels + 1) / 2;
    const int64_t blocks = (channels + block - 1) / block;
    auto convolve_blocks = [&](int64_t begin, int64_t end) {
      for (int64_t unit = begin; unit < end; ++unit) {
        const int64_t bi = unit / blocks, first = (unit % blocks) * block, last = std::min(channels, first + block);
        float* out = s.mixed.data() + bi * channels;
        if (packed && p.taps == 4) {  // Qwen3.5's conv
          convolve_one_packed_token<4>(p.conv_weight + first * p.taps,
                                       p.conv_state + bi * p.conv_state_strides[0] + first * kept,
                                       p.qkv + bi * p.qkv_strides[0] + first, out + first, last - first, p.starting);
        } else {
          convolve_one_token(p, bi, first, last, out);
        }
        silu_in_place(out + first, last - first);
      }
    };
    if (p.batch * blocks == 1) {
      convolve_blocks(0, 1);
    } else {
      parallel_for(0, p.batch * blocks, convolve_blocks);
    }
    return;
  }
  // Several tokens: blocks of channels over all tokens, then SiLU.
  s.weights.resize(p.taps * channels);
  s.history.resize(p.batch * kept * channels);
  for (int64_t c = 0; c < channels; ++c)
    for (int64_t k = 0; k < p.taps; ++k)
      s.weights[k * channels + c] = p.conv_weight[c * p.conv_weight_strides[0] + k * p.conv_weight_strides[2]];
  for (int64_t bi = 0; bi < p.batch; ++bi)
    for (int64_t j = 0; j < kept; ++j)
      for (int64_t c = 0; c < channels; ++c)
        s.history[(bi * kept + j) * channels + c] =
            p.starting ? 0.0f
                       : p.conv_state[bi * p.conv_state_strides[0] + c * p.conv_state_strides[1] +
                                      j * p.conv_state_strides[2]];
  const int64_t blocks = (channels + kChannelBlock - 1) / kChannelBlock;
  auto convolve_blocks = [&](int64_t begin, int64_t end) {
    for (int64_t unit = begin; unit < end; ++unit) {
      const int64_t first = (unit % blocks) * kChannelBlock;
      convolve_tokens(p, s, unit / blocks, first, std::min(channels, first + kChannelBlock));
    }
  };
  if (p.batch * p.length * channels * p.taps < kParallelConvWork) {
    convolve_blocks(0, p.batch * blocks);
  } else {
    parallel_for(0, p.batch * blocks, convolve_blocks);
  }
  silu_in_place(s.mixed.data(), p.batch * p.length * channels);
}

}  // namespace

void conv_gated_delta_rule(const ConvGatedDeltaRuleProblem& p, const ParallelFor& parallel_for) {
  // The caller's scratch, named here so that the pool's threads use it too (not their own thread_local copies).
  thread_local Scratch callers_scratch;
  Scratch& s = callers_scratch;
  const int64_t channels = p.channels, heads = p.num_v_heads;
  s.mixed.resize(p.batch * p.length * channels);
  s.gates.resize(2 * p.batch * p.length * heads);
  convolve(p, s, parallel_for);

  // g = -exp(A_log) * softplus(a + dt_bias), beta = sigmoid(b); a sequence's first a raised first.
  float* g = s.gates.data();
  float* beta = g + p.batch * p.length * heads;
  for (int64_t bi = 0; bi < p.batch; ++bi)
    for (int64_t t = 0; t < p.length; ++t)
      for (int64_t h = 0; h < heads; ++h) {
        const float a_log = p.A_log[h * p.A_log_stride], bias = p.dt_bias[h * p.dt_bias_stride];
        float a = p.a[bi * p.a_strides[0] + t * p.a_strides[1] + h * p.a_strides[2]];
        if (p.starting && t == 0) a = std::max(a, kForgetLogDecay * std::exp(-a_log) - bias);
        const float b = p.b[bi * p.b_strides[0] + t * p.b_strides[1] + h * p.b_strides[2]];
        const int64_t at = (bi * p.length + t) * heads + h;
        g[at] = -std::exp(a_log) * softplus(a + bias);
        beta[at] = 1.0f / (1.0f + std::exp(-b));
      }

  GatedDeltaRuleProblem r;
  r.batch = p.batch;
  r.length = p.length;
  r.num_k_heads = p.num_k_heads;
  r.num_v_heads = heads;
  r.key_dim = p.key_dim;
  r.value_dim = p.value_dim;
  r.use_qk_l2norm = true;
  r.scale = 1.0f / std::sqrt(float(p.key_dim));
  const int64_t key_channels = p.num_k_heads * p.key_dim;
  const float* mixed = s.mixed.data();
  const int64_t row_strides[4] = {p.length * channels, channels, p.key_dim, 1};
  for (auto [view, offset, head_dim] : {std::tuple<InputView*, int64_t, int64_t>{&r.query, 0, p.key_dim},
                                        {&r.key, key_channels, p.key_dim},
                                        {&r.value, 2 * key_channels, p.value_dim}}) {
    view->data = mixed + offset;
    view->type = ElementType::Float32;
    view->strides[0] = row_strides[0];
    view->strides[1] = row_strides[1];
    view->strides[2] = head_dim;
    view->strides[3] = 1;
  }
  for (auto [view, data] : {std::pair<InputView*, const float*>{&r.g, g}, {&r.beta, beta}}) {
    view->data = data;
    view->type = ElementType::Float32;
    view->strides[0] = p.length * heads;
    view->strides[1] = heads;
    view->strides[2] = 1;
  }
  if (p.half_state) {
    r.half_state = p.state;
    for (int d = 0; d < 3; ++d) r.half_state_strides[d] = p.state_strides[d];
  } else {
    r.initial_state = r.final_state = static_cast<float*>(p.state);
    for (int d = 0; d < 3; ++d) r.initial_state_strides[d] = r.final_state_strides[d] = p.state_strides[d];
  }
  r.output = p.output;
  for (int d = 0; d < 4; ++d) r.output_strides[d] = p.output_strides[d];
  gated_delta_rule(r, parallel_for);
}

}  // namespace gdn
