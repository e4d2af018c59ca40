// Mamba-3 per-token scalars and vectors (layers-ssm-attn.md §4.3.1) and their backward (§4.5 steps 3–6),
// CPU reference: from the B/C and scalar slices of in_proj to the core inputs of kernels/cpu/mamba3.h.
//   Δ = softplus(dd_dt + dt_bias);  A = min(-softplus(dd_A), -A_floor) (or -f(dd_A), heavy tail);  a = A Δ
//   λ = σ(trap);  γ = λ Δ;  ε = (1 - λ) Δ;  θ_i = π tanh(angles_i)
//   φ_t[h,i] = (φ_{t-1}[h,i] + Δ_t[h] θ_t[i]) mod 2π
//   B̄_r = RMSNorm_N(B_{r,g}) ∘ w_B + B_bias[h,r];  k_r = Rot(φ) B̄_r   (same for C̄, q with w_C, C_bias)
// Layouts: bc [B, T, 2 R G N], each row [B (r G N + g N + n) | C (same)]; raw [B, T, 3 H + S], each row
// [dd_dt (H) | dd_A (H) | trap (H) | angles (S)]. Arithmetic in double.
#pragma once
#include <cstdint>
#include <vector>

#include "kernels/mamba3_options.h"

namespace llmt::cpu {

/// Sizes of one Mamba-3 layer call: B, T, H, P, N, G, R and S (rotation angles, 2 S <= N).
struct Mamba3LayerDims {
  int64_t batch, seq_len, heads, head_dim, state_dim, groups, rank, angles;
};

/// The per-token parameters: dt_bias [H]; B_bias, C_bias [H, R, N]; B_norm, C_norm [N].
template <typename T>
struct Mamba3PrepParams {
  const T* dt_bias;
  const T* B_bias;
  const T* C_bias;
  const T* B_norm;
  const T* C_norm;
};

/// Gradients of Mamba3PrepParams, same shapes, ACCUMULATED.
template <typename T>
struct Mamba3PrepGrads {
  T* dt_bias;
  T* B_bias;
  T* C_bias;
  T* B_norm;
  T* C_norm;
};

/// The core inputs (q, k [B, T, H, R, N]; a, gamma, eps [B, T, H]) and what their backward reuses:
/// Δ, λ, A, the A_floor clamp mask [B, T, H]; θ [B, T, S]; the phases φ [B, T, H, S]; the normalised pre-weight B and C
/// nb, nc [B, T, R, G, N] and their reciprocal RMS rb, rc [B, T, R, G].
struct Mamba3Prep {
  std::vector<double> q, k, a, gamma, eps;
  std::vector<double> dt, lam, A, clamped, theta, phi, nb, nc, rb, rc;
};

/// Forward of §4.3.1 (rotation pairs per Mamba3Options::rank). phase0: [B, H, S], the phases φ carried
/// from the tokens before this call (decode, §4.6 angle_state), or nullptr for φ_{-1} = 0. Throws
/// llmt::Error when 2 S > N or G does not divide H.
template <typename T>
Mamba3Prep mamba3_prep_fwd(const T* bc, const T* raw, const Mamba3PrepParams<T>& params,
                           const Mamba3LayerDims& dims, const Mamba3Options& opt, const T* phase0 = nullptr);

/// Backward of mamba3_prep_fwd (§4.5 steps 3–6) given the core's gradients dq, dk [B, T, H, R, N] and da,
/// dgamma, deps [B, T, H] (double): dbc [B, T, 2 R G N] and draw [B, T, 3 H + S] OVERWRITTEN, the parameter
/// gradients ACCUMULATED.
template <typename T>
void mamba3_prep_bwd(const Mamba3Prep& prep, const std::vector<double>& dq, const std::vector<double>& dk,
                     const std::vector<double>& da, const std::vector<double>& dgamma, const std::vector<double>& deps,
                     const T* raw, const Mamba3PrepParams<T>& params, const Mamba3LayerDims& dims,
                     const Mamba3Options& opt, T* dbc, T* draw, const Mamba3PrepGrads<T>& grads);

}  // namespace llmt::cpu
