// The loops that drive the CPU delta-rule cores over heads, tokens and chunks (layers-delta.md §6.3–6.5),
// with the per-kernel math passed in as callables. Internal to src/kernels/cpu.
#pragma once
#include <algorithm>
#include <cstdint>
#include <vector>

#include "core/error.h"
#include "kernels/cpu/delta_common.h"

namespace llmt::cpu::delta {

/// Throws unless chunk_size >= 1; kernel ("gdn", "kda", ...) names the caller in the message.
inline void check_chunk_size(const char* kernel, int64_t chunk_size) {
  check(chunk_size >= 1, "{} chunk: chunk_size must be >= 1, got {}", kernel, chunk_size);
}

/// Calls f(b, h) for every (batch, head) of d, batch-major.
template <class F>
void for_each_head(const DeltaDims& d, F f) {
  for (int64_t b = 0; b < d.batch; ++b)
    for (int64_t h = 0; h < d.heads; ++h) f(b, h);
}

/// Token-by-token forward of one head (§4): S [K, V] enters as S_0 and leaves as S_T; for t = 0..T-1,
/// step(t, S.data()) maps S_{t-1} to S_t in place and row t of out [T, V] receives o_t = S_t^T q_t
/// (q [T, K]).
template <class Step>
void recurrent_scan(const Vec& q, int64_t T, int64_t K, int64_t V, Step step, Vec& S, Vec& out) {
  for (int64_t t = 0; t < T; ++t) {
    step(t, S.data());
    read_out(S, &q[t * K], K, V, &out[t * V]);
  }
}

/// The token-by-token forward of every head: hd = load_head(b, h) (a head with members q [T, K] and s0 [K, V]),
/// then recurrent_scan with step(hd, t, S); o [B, T, H, V] and, unless null, final_state [B, H, K, V] written.
template <class T, class LoadHead, class Step>
void recurrent_forward(const DeltaDims& d, LoadHead load_head, Step step, T* o, T* final_state) {
  const int64_t K = d.key_dim, V = d.value_dim;
  for_each_head(d, [&](int64_t b, int64_t h) {
    const auto hd = load_head(b, h);
    Vec S = hd.s0, out(d.seq_len * V);
    recurrent_scan(hd.q, d.seq_len, K, V, [&](int64_t t, double* St) { step(hd, t, St); }, S, out);
    scatter(out, d, b, h, V, o);
    store_state(S, d, b, h, final_state);
  });
}

/// Reverse-time sweep of one head for the exact recurrent backward (§6.4): the states S_{t-1}, S_t
/// (each [K, V], KV = K V doubles) are recomputed with step(t, S) from checkpoints of s0 taken every 64
/// tokens (memory ~ (T/64 + 65) K V doubles), and token_bwd(t, S_{t-1}, S_t) is called for t = T-1..0.
template <class Step, class TokenBwd>
void recurrent_reverse(const Vec& s0, int64_t T, int64_t KV, Step step, TokenBwd token_bwd) {
  constexpr int64_t kSegment = 64;  // checkpoint spacing of the recomputed states
  const int64_t segments = (T + kSegment - 1) / kSegment;
  Vec S = s0, states((kSegment + 1) * KV), checkpoints(segments * KV);
  for (int64_t t = 0; t < T; ++t) {
    if (t % kSegment == 0) std::copy(S.begin(), S.end(), checkpoints.begin() + (t / kSegment) * KV);
    step(t, S.data());
  }
  for (int64_t seg = segments - 1; seg >= 0; --seg) {
    const int64_t t0 = seg * kSegment, t1 = std::min(T, t0 + kSegment);
    // states[i] = S_{t0+i} (the state after token t0+i-1), i = 0..t1-t0.
    std::copy(checkpoints.begin() + seg * KV, checkpoints.begin() + (seg + 1) * KV, states.begin());
    for (int64_t t = t0; t < t1; ++t) {
      double* next = &states[(t - t0 + 1) * KV];
      std::copy(next - KV, next, next);
      step(t, next);
    }
    for (int64_t t = t1 - 1; t >= t0; --t) token_bwd(t, &states[(t - t0) * KV], &states[(t - t0 + 1) * KV]);
  }
}

/// Chunked backward sweep of one head (§6.5): the chunks [c0, c0 + n) of chunk_size tokens (the last one may
/// be shorter) are built by make(c0, n); the chunk-start states (State: the [K, V] Vec, or MDN's pair of
/// states) are recomputed from s0 by a forward scan advance(chunk, state) (FLA fwd_h), then
/// chunk_bwd(chunk, state entering the chunk) is called from the last chunk to the first (it carries dS_C).
template <class State, class Make, class Advance, class ChunkBwd>
void chunk_reverse(const State& s0, int64_t T, int64_t chunk_size, Make make, Advance advance, ChunkBwd chunk_bwd) {
  const int64_t chunks = (T + chunk_size - 1) / chunk_size;
  std::vector<State> starts;
  starts.reserve(static_cast<size_t>(chunks));
  State S = s0;
  for (int64_t n = 0; n < chunks; ++n) {
    starts.push_back(S);
    advance(make(n * chunk_size, std::min(chunk_size, T - n * chunk_size)), S);
  }
  for (int64_t n = chunks - 1; n >= 0; --n)
    chunk_bwd(make(n * chunk_size, std::min(chunk_size, T - n * chunk_size)), starts[static_cast<size_t>(n)]);
}

}  // namespace llmt::cpu::delta
