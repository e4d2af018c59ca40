// Pieces shared by the backends' implementations: argument checks with the messages every
// backend gives, and the bookkeeping behind Backend::peak_allocated_bytes().
#pragma once
#include <algorithm>
#include <cstddef>
#include <initializer_list>
#include <string>
#include <unordered_map>

#include "core/error.h"
#include "core/tensor.h"
#include "kernels/cpu/mamba2.h"
#include "kernels/cpu/mamba3_prep.h"
#include "kernels/backend.h"

namespace llmt {

/// Throws llmt::Error naming `op` unless a and b have the same dtype and element count.
inline void check_same(const Tensor& a, const Tensor& b, const char* op) {
  check(a.dtype == b.dtype, "{}: dtype mismatch ({} vs {})", op, dtype_name(a.dtype), dtype_name(b.dtype));
  check(a.numel() == b.numel(), "{}: size mismatch ({} vs {})", op, a.shape_str(), b.shape_str());
}

/// The sizes of c = op(a) op(b): op(a) is [M, K], op(b) is [K, N]. Throws llmt::Error naming
/// the shapes unless a, b, c are 2-D of one dtype with agreeing sizes.
struct GemmDims {
  int64_t M, N, K;
};
inline GemmDims matmul_dims(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& c) {
  check(a.ndim == 2 && b.ndim == 2 && c.ndim == 2, "matmul: needs 2-D tensors, got {} {} {}", a.shape_str(),
        b.shape_str(), c.shape_str());
  const int64_t M = trans_a ? a.shape[1] : a.shape[0], K = trans_a ? a.shape[0] : a.shape[1];
  const int64_t Kb = trans_b ? b.shape[1] : b.shape[0], N = trans_b ? b.shape[0] : b.shape[1];
  check(K == Kb && c.shape[0] == M && c.shape[1] == N, "matmul: shapes {}{} x {}{} -> {} do not agree",
        a.shape_str(), trans_a ? "^T" : "", b.shape_str(), trans_b ? "^T" : "", c.shape_str());
  check(a.dtype == b.dtype && (c.dtype == a.dtype || (a.dtype == DType::bf16 && c.dtype == DType::f32)),
        "matmul: dtypes ({}, {}) -> {} are not supported: a and b share one dtype, c has it too or is f32 "
        "for bf16 a and b",
        dtype_name(a.dtype), dtype_name(b.dtype), dtype_name(c.dtype));
  return {M, N, K};
}

/// The rows of a gate_rmsnorm_* call (Mamba2's gated RMSNorm): y, z [rows, dim] of one dtype, w [dim], rstd [rows].
/// Throws llmt::Error naming `op` and the shapes otherwise.
inline int64_t gate_norm_rows(const Tensor& y, const Tensor& z, const Tensor& w, const Tensor& rstd, const char* op) {
  const int64_t dim = w.numel(), rows = dim > 0 ? y.numel() / dim : 0;
  check(dim > 0 && rows * dim == y.numel() && rstd.numel() == rows, "{}: y {} w {} rstd {}", op, y.shape_str(),
        w.shape_str(), rstd.shape_str());
  check_same(y, z, op);
  return rows;
}

/// The sizes of a decay-gate call (gdn_gates_*, kda_gates_*; cpu/delta_gates.h): a [rows, H * dim],
/// b [rows, H], A_log [H], dt_bias [H * dim], one dtype; g must match a and beta must match b.
/// Throws llmt::Error naming `op` and the shapes otherwise.
struct GateDims {
  int64_t rows, heads, dim;
};
inline GateDims gate_dims(const Tensor& a, const Tensor& b, const Tensor& A_log, const Tensor& dt_bias,
                          const Tensor& g, const Tensor& beta, const char* op) {
  const int64_t heads = A_log.numel(), dim = heads > 0 ? dt_bias.numel() / heads : 0;
  const int64_t rows = heads > 0 ? b.numel() / heads : 0;
  check(heads > 0 && dim > 0 && dt_bias.numel() == heads * dim && b.numel() == rows * heads &&
            a.numel() == rows * heads * dim,
        "{}: a must be [rows, H * dim], b [rows, H], A_log [H], dt_bias [H * dim]; got a {} b {} A_log {} dt_bias {}",
        op, a.shape_str(), b.shape_str(), A_log.shape_str(), dt_bias.shape_str());
  for (const Tensor* t : {&A_log, &dt_bias, &b}) check(t->dtype == a.dtype, "{}: dtype mismatch", op);
  check_same(a, g, op);
  check_same(b, beta, op);
  return {rows, heads, dim};
}

/// gate_dims for a decay-gate backward (dg, dbeta in the places of g, beta), plus: da, db, dA_log, ddt_bias
/// match a, b, A_log, dt_bias. Throws llmt::Error naming `op` otherwise.
inline GateDims gate_bwd_dims(const Tensor& dg, const Tensor& dbeta, const Tensor& a, const Tensor& b,
                              const Tensor& A_log, const Tensor& dt_bias, const Tensor& da, const Tensor& db,
                              const Tensor& dA_log, const Tensor& ddt_bias, const char* op) {
  const GateDims gd = gate_dims(a, b, A_log, dt_bias, dg, dbeta, op);
  check_same(a, da, op);
  check_same(b, db, op);
  check_same(A_log, dA_log, op);
  check_same(dt_bias, ddt_bias, op);
  return gd;
}

/// The sizes of a delta-rule core call (gdn_*, comba_*, kda_chunk_*): q [B, T, H, K], v [B, T, H, V],
/// beta [B, T, H], g [B, T, H] (per_channel false: GDN, Comba) or [B, T, H, K] (per_channel true: KDA).
/// Returns {B, T, H, K, V}; throws llmt::Error naming `op` and the shapes otherwise.
struct DeltaCoreDims {
  int64_t batch, seq_len, heads, key_dim, value_dim;
};
inline DeltaCoreDims delta_core_dims(const Tensor& q, const Tensor& v, const Tensor& g, const Tensor& beta,
                                     bool per_channel, const char* op) {
  check(q.ndim == 4 && v.ndim == 4 && q.shape[0] == v.shape[0] && q.shape[1] == v.shape[1] &&
            q.shape[2] == v.shape[2] && beta.numel() == q.shape[0] * q.shape[1] * q.shape[2] &&
            g.numel() == beta.numel() * (per_channel ? q.shape[3] : 1),
        "{}: q must be [B, T, H, K], v [B, T, H, V], g {}, beta [B, T, H]; got {} {} {} {}", op,
        per_channel ? "[B, T, H, K]" : "[B, T, H]", q.shape_str(), v.shape_str(), g.shape_str(), beta.shape_str());
  for (const Tensor* t : {&v, &g, &beta}) check(t->dtype == q.dtype, "{}: dtype mismatch", op);
  return {q.shape[0], q.shape[1], q.shape[2], q.shape[3], v.shape[3]};
}

/// delta_core_dims plus the checks of a chunk_fwd call: o matches v, and each of q_like (k; p for Comba)
/// matches q (dtype and element count).
inline DeltaCoreDims delta_fwd_dims(const Tensor& q, std::initializer_list<const Tensor*> q_like, const Tensor& v,
                                    const Tensor& g, const Tensor& beta, const Tensor& o, bool per_channel,
                                    const char* op) {
  const DeltaCoreDims d = delta_core_dims(q, v, g, beta, per_channel, op);
  check_same(v, o, op);
  for (const Tensor* t : q_like) check_same(q, *t, op);
  return d;
}

/// delta_core_dims plus the checks of a chunk_bwd call: each of q_like (k, dq, dk; p, dp for Comba) matches q,
/// d_o and dv match v, dg matches g and dbeta matches beta.
inline DeltaCoreDims delta_bwd_dims(const Tensor& q, std::initializer_list<const Tensor*> q_like, const Tensor& v,
                                    const Tensor& g, const Tensor& beta, const Tensor& d_o, const Tensor& dv,
                                    const Tensor& dg, const Tensor& dbeta, bool per_channel, const char* op) {
  const DeltaCoreDims d = delta_core_dims(q, v, g, beta, per_channel, op);
  for (const Tensor* t : q_like) check_same(q, *t, op);
  for (const Tensor* t : {&d_o, &dv}) check_same(v, *t, op);
  check_same(g, dg, op);
  check_same(beta, dbeta, op);
  return d;
}

/// Heads of an mdn_gates call: z_alpha [rows, H]; the parameters [H] of its dtype; z_mu, z_eta, Mu_log,
/// mu_bias present exactly with momentum.
inline int64_t mdn_gate_heads(const Tensor& z_alpha, const Tensor& z_mu, const Tensor& z_eta,
                              const Backend::MdnGateParams& p, const MdnGateOptions& opt, const char* op) {
  check(z_alpha.ndim == 2, "{}: z_alpha must be [rows, H], got {}", op, z_alpha.shape_str());
  const int64_t heads = z_alpha.shape[1];
  for (const Tensor* t : {&p.A_log, &p.dt_bias, &p.log_factor})
    check(t->data != nullptr && t->numel() == heads && t->dtype == z_alpha.dtype,
          "{}: A_log, dt_bias, log_factor must be [{}] of the dtype of z_alpha, got {}", op, heads, t->shape_str());
  check(opt.tau > 0, "{}: tau must be > 0, got {}", op, opt.tau);
  for (const Tensor* t : {&p.Mu_log, &p.mu_bias, &z_mu, &z_eta})
    check((t->data != nullptr) == opt.momentum, "{}: z_mu, z_eta, Mu_log, mu_bias are given exactly with momentum",
          op);
  if (opt.momentum) {
    check_same(z_alpha, z_mu, op);
    check_same(z_alpha, z_eta, op);
    for (const Tensor* t : {&p.Mu_log, &p.mu_bias})
      check(t->numel() == heads && t->dtype == z_alpha.dtype, "{}: Mu_log, mu_bias must be [{}], got {}", op, heads,
            t->shape_str());
  }
  return heads;
}

/// Heads of an mdn_correction call: x [rows, H * K], D_log [H] of the dtype of x.
inline int64_t mdn_correction_heads(const Tensor& x, const Tensor& D_log, const char* op) {
  const int64_t heads = D_log.numel();
  check(x.ndim == 2 && heads > 0 && x.shape[1] % heads == 0 && D_log.dtype == x.dtype,
        "{}: q/k must be [rows, H * K] and D_log [H] of their dtype, got {} and {}", op, x.shape_str(),
        D_log.shape_str());
  return heads;
}

/// Bytes currently held through a backend's allocate(), and the most ever held.
class AllocationLog {
 public:
  void allocated(void* p, size_t bytes) {
    sizes_[p] = bytes;
    held_ += bytes;
    peak_ = std::max(peak_, held_);
  }
  void released(void* p) {
    auto it = sizes_.find(p);
    if (it == sizes_.end()) return;
    held_ -= it->second;
    sizes_.erase(it);
  }
  size_t peak() const { return peak_; }

 private:
  std::unordered_map<void*, size_t> sizes_;
  size_t held_ = 0, peak_ = 0;
};

/// The Mamba2 core sizes of mamba2_ssd_fwd/bwd's tensors (backend.h), after checking their shapes and
/// dtypes; y is the output (or its gradient) [B, T, H P]. Throws llmt::Error naming `op` and the shapes
/// otherwise.
inline cpu::Mamba2Dims mamba2_dims(const Tensor& xbc, const Tensor& dt_raw, const Tensor& dt_bias,
                                   const Tensor& A_log, const Tensor& D, int64_t head_dim, int64_t n_groups,
                                   const Tensor& y, const char* op) {
  check(xbc.ndim == 3 && dt_raw.ndim == 3 && y.ndim == 3 && head_dim > 0 && n_groups > 0, "{}: xbc {} dt_raw {} y {}",
        op, xbc.shape_str(), dt_raw.shape_str(), y.shape_str());
  const int64_t B = xbc.shape[0], T = xbc.shape[1], H = dt_raw.shape[2], XD = H * head_dim;
  const int64_t rest = xbc.shape[2] - XD;
  check(dt_raw.shape[0] == B && dt_raw.shape[1] == T && y.shape[0] == B && y.shape[1] == T && y.shape[2] == XD &&
            rest > 0 && rest % (2 * n_groups) == 0,
        "{}: xbc {} must be [B, T, H P + 2 G N] with dt_raw {} [B, T, H], y {} [B, T, H P], P = {}, G = {}", op,
        xbc.shape_str(), dt_raw.shape_str(), y.shape_str(), head_dim, n_groups);
  for (const Tensor* t : {&dt_bias, &A_log, &D})
    check(t->numel() == H && t->dtype == xbc.dtype, "{}: dt_bias, A_log and D must be [H = {}] in {}", op, H,
          dtype_name(xbc.dtype));
  check(dt_raw.dtype == xbc.dtype && y.dtype == xbc.dtype, "{}: xbc, dt_raw and y must share one dtype", op);
  return {B, T, H, head_dim, rest / (2 * n_groups), n_groups};
}

/// The Mamba-3 layer sizes of mamba3_fwd/bwd's tensors (backend.h), after checking their shapes and dtypes: bc, raw
/// and the parameters in one dtype; x, z and out in one dtype, bc's, or with bf16_activations (a backend taking them:
/// Backend::mamba3_bf16_activations) also bf16 where bc is f32.
inline cpu::Mamba3LayerDims mamba3_dims(const Tensor& x, const Tensor& z, const Tensor& bc, const Tensor& raw,
                                        const Backend::Mamba3Params& p, const Mamba3Options& opt,
                                        const Tensor& out, const char* op, bool bf16_activations = false) {
  check(x.ndim == 3 && bc.ndim == 3 && raw.ndim == 3 && opt.head_dim > 0 && opt.n_groups > 0 && opt.rank > 0 &&
            x.shape[2] % opt.head_dim == 0,
        "{}: x {} bc {} raw {} (head_dim {})", op, x.shape_str(), bc.shape_str(), raw.shape_str(), opt.head_dim);
  const int64_t B = x.shape[0], T = x.shape[1], H = x.shape[2] / opt.head_dim, RG2 = 2 * opt.rank * opt.n_groups;
  const int64_t N = bc.shape[2] / RG2, S = raw.shape[2] - 3 * H, P = opt.head_dim, R = opt.rank;
  check(bc.shape[0] == B && bc.shape[1] == T && raw.shape[0] == B && raw.shape[1] == T && N > 0 &&
            N * RG2 == bc.shape[2] && S >= 0,
        "{}: bc {} must be [B, T, 2 R G N] and raw {} [B, T, 3 H + S] for x {} (H = {}, R = {}, G = {})", op,
        bc.shape_str(), raw.shape_str(), x.shape_str(), H, R, opt.n_groups);
  for (const Tensor* t : {&z, &out}) check_same(x, *t, op);
  check(raw.dtype == bc.dtype &&
            (x.dtype == bc.dtype || (bf16_activations && x.dtype == DType::bf16 && bc.dtype == DType::f32)),
        "{}: bc and raw must share one dtype, and x, z, out have it{} (x {}, bc {}, raw {})", op,
        bf16_activations ? " or be bf16 with f32 bc" : "", dtype_name(x.dtype), dtype_name(bc.dtype),
        dtype_name(raw.dtype));
  const auto param = [&](const Tensor& t, int64_t n, const char* name, bool present) {
    check(present ? t.data != nullptr && t.numel() == n && t.dtype == bc.dtype : t.data == nullptr,
          "{}: {} must be {} of {} elements in {}", op, name, present ? "given" : "absent", n, dtype_name(bc.dtype));
  };
  param(p.dt_bias, H, "dt_bias", true);
  param(p.D, H, "D", true);
  param(p.B_bias, H * R * N, "B_bias", true);
  param(p.C_bias, H * R * N, "C_bias", true);
  param(p.B_norm, N, "B_norm", true);
  param(p.C_norm, N, "C_norm", true);
  param(p.mimo_x, H * R * P, "mimo_x (rank > 1 only)", R > 1);
  param(p.mimo_z, H * R * P, "mimo_z (rank > 1 only)", R > 1);
  param(p.mimo_o, H * R * P, "mimo_o (rank > 1 only)", R > 1);
  param(p.norm, H * P, "norm (outproj_norm only)", opt.outproj_norm);
  return {B, T, H, P, N, opt.n_groups, R, S};
}

// ---- incremental decoding (Backend::*_decode): the shape checks both backends share ----

/// attention_decode: q, k, v, o [B, T, H, Dh] alike; k_cache, v_cache [B, capacity, H, Dh] of q's dtype; positions
/// position .. position + T - 1 inside the cache. Throws llmt::Error naming the op and the shapes otherwise.
inline void check_attention_decode(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& k_cache,
                                   const Tensor& v_cache, int64_t position, const Tensor& o) {
  check(q.ndim == 4, "attention_decode: q must be [B, T, H, Dh], got {}", q.shape_str());
  for (const Tensor* t : {&k, &v, &o}) check_same(q, *t, "attention_decode");
  check_same(k_cache, v_cache, "attention_decode");
  check(k_cache.ndim == 4 && k_cache.shape[0] == q.shape[0] && k_cache.shape[2] == q.shape[2] &&
            k_cache.shape[3] == q.shape[3] && k_cache.dtype == q.dtype,
        "attention_decode: the caches must be [B, capacity, H, Dh] of q's dtype for q {}, got {}", q.shape_str(),
        k_cache.shape_str());
  check(position >= 0 && position + q.shape[1] <= k_cache.shape[1],
        "attention_decode: positions {} .. {} outside the cache of {}", position, position + q.shape[1] - 1,
        k_cache.shape[1]);
}

/// short_conv_silu_decode: x, y [B, T, C]; w [C, 1, W]; bias [C] or absent; window [B, W - 1, C] (x's dtype).
/// Returns W; throws llmt::Error naming the op and the shapes otherwise.
inline int64_t short_conv_decode_width(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& window,
                                       const Tensor& y) {
  check(x.ndim == 3 && w.ndim == 3 && w.shape[0] == x.shape[2] && w.shape[1] == 1,
        "short_conv_silu_decode: x must be [B, T, C] and w [C, 1, W], got {} and {}", x.shape_str(), w.shape_str());
  const int64_t B = x.shape[0], C = x.shape[2], W = w.shape[2];
  check(W >= 1, "short_conv: width must be >= 1, got {}", W);
  check(window.numel() == B * (W - 1) * C && (window.numel() == 0 || window.dtype == x.dtype),
        "short_conv_silu_decode: window must be [B, W - 1, C] = [{}, {}, {}], got {}", B, W - 1, C, window.shape_str());
  check(bias.data == nullptr || (bias.numel() == C && bias.dtype == x.dtype),
        "short_conv_silu_decode: bias must be [C] = [{}] or absent, got {}", C, bias.shape_str());
  check_same(x, y, "short_conv_silu_decode");
  return W;
}

/// A carried decode state of `n` elements shaped `what` in `dtype` (a zero-size one may have any dtype);
/// throws llmt::Error naming the op, what it must be and what it is otherwise.
inline void check_decode_state(const Tensor& state, int64_t n, DType dtype, const char* op, const std::string& what) {
  check(state.numel() == n && (n == 0 || state.dtype == dtype), "{}: {} must be {} of {}, got {} {}", op, what,
        n, dtype_name(dtype), state.shape_str(), dtype_name(state.dtype));
}

/// The sizes of a delta-rule decode call (gdn/kda/comba/mdn_decode): delta_core_dims and the state [B, H, K, V]
/// of q's dtype.
inline DeltaCoreDims delta_decode_dims(const Tensor& q, const Tensor& v, const Tensor& g, const Tensor& beta,
                                       const Tensor& state, bool per_channel, const char* op) {
  const DeltaCoreDims d = delta_core_dims(q, v, g, beta, per_channel, op);
  check_decode_state(state, d.batch * d.heads * d.key_dim * d.value_dim, q.dtype, op,
                     fmt::format("state [B, H, K, V] = [{}, {}, {}, {}]", d.batch, d.heads, d.key_dim, d.value_dim));
  return d;
}

/// mamba3_decode's carry for the layer sizes d, in `dtype` (bc's: the master dtype).
inline void check_mamba3_carry(const Backend::Mamba3Carry& carry, const cpu::Mamba3LayerDims& d, DType dtype) {
  const int64_t BH = d.batch * d.heads;
  const char* op = "mamba3_decode";
  check_decode_state(carry.state, BH * d.head_dim * d.state_dim, dtype, op, "carry.state [B, H, P, N]");
  check_decode_state(carry.k_prev, BH * d.rank * d.state_dim, dtype, op, "carry.k_prev [B, H, R, N]");
  check_decode_state(carry.v_prev, BH * d.rank * d.head_dim, dtype, op, "carry.v_prev [B, H, R, P]");
  check_decode_state(carry.phase, BH * d.angles, dtype, op, "carry.phase [B, H, S]");
}

}  // namespace llmt
