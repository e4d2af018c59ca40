// The Mamba-3 layer op between in_proj and out_proj (layers-ssm-attn.md §4.3, §4.5), CPU reference:
// per-token scalars and vectors (cpu/mamba3_prep.h), MIMO up-projection v_r = x ∘ mimo_x[h,r], the chunked
// core (cpu/mamba3.h), optional per-head RMSNorm_P before the gate, gate SiLU(z ∘ mimo_z[h,r]) and the MIMO
// down-projection o = Σ_r mimo_o[h,r] ∘ (...). SISO (R = 1) has no mimo_* parameters (o = gate(y)).
// Layouts: x, z, out [B, T, H P]; bc, raw as cpu/mamba3_prep.h. Arithmetic in double.
#pragma once
#include "kernels/cpu/mamba3_prep.h"

namespace llmt::cpu {

/// Parameters of the layer op: the per-token ones, D [H], mimo_x, mimo_z, mimo_o [H, R, P] (nullptr for
/// SISO) and norm [H P] (nullptr without the output norm).
template <typename T>
struct Mamba3LayerParams {
  Mamba3PrepParams<T> prep;
  const T* D;
  const T* mimo_x;
  const T* mimo_z;
  const T* mimo_o;
  const T* norm;
};

/// Gradients of Mamba3LayerParams, same shapes and nullptr pattern, ACCUMULATED.
template <typename T>
struct Mamba3LayerGrads {
  Mamba3PrepGrads<T> prep;
  T* D;
  T* mimo_x;
  T* mimo_z;
  T* mimo_o;
  T* norm;
};

/// out = the gated (and for MIMO down-projected) output of §4.3.2–4.3.4 from the in_proj slices x, z
/// [B, T, H P], bc [B, T, 2 R G N], raw [B, T, 3 H + S]. Throws llmt::Error for bad sizes (cpu/mamba3_prep.h,
/// cpu/mamba3.h) or when the mimo_* pointers are null for R > 1 or set for R = 1.
template <typename T>
void mamba3_layer_fwd(const T* x, const T* z, const T* bc, const T* raw, const Mamba3LayerParams<T>& params,
                      const Mamba3LayerDims& dims, const Mamba3Options& opt, T* out);

/// What a Mamba-3 layer carries from one decode step to the next (layers-ssm-attn.md §4.6), all zero at the
/// start of a sequence: state [B, H, P, N], the true H_t; k_prev [B, H, R, N], the rotated, biased B̄ (k) of
/// the last token; v_prev [B, H, R, P], its up-projected x (x ∘ mimo_x; x for SISO); phase [B, H, S], its
/// rotary phase φ.
template <typename T>
struct Mamba3Carry {
  T* state;
  T* k_prev;
  T* v_prev;
  T* phase;
};

/// mamba3_layer_fwd continuing a sequence by its recurrence (§4.3.2–4.3.3, the decode step of §4.6, token by
/// token; decoding: seq_len 1; a prompt: its length): x, z [B, T, H P], bc, raw and params as mamba3_layer_fwd.
/// Starts from `carry` and leaves the carry of the last token in it: per token
/// H = α H + β W_prev + γ W (β = ε α, W_prev = Σ_r v_prev,r k_prev,r^T), y_r = H q_r + D v_r, then the gate,
/// output norm and down-projection of mamba3_layer_fwd into out [B, T, H P]. Over a sequence the outputs equal
/// mamba3_layer_fwd's (up to rounding). Throws llmt::Error as mamba3_layer_fwd.
template <typename T>
void mamba3_layer_step(const T* x, const T* z, const T* bc, const T* raw, const Mamba3LayerParams<T>& params,
                       const Mamba3LayerDims& dims, const Mamba3Options& opt, const Mamba3Carry<T>& carry, T* out);

/// Backward of mamba3_layer_fwd given dout [B, T, H P] (everything is recomputed from the inputs):
/// dx, dz [B, T, H P], dbc, draw OVERWRITTEN; the parameter gradients ACCUMULATED.
template <typename T>
void mamba3_layer_bwd(const T* dout, const T* x, const T* z, const T* bc, const T* raw,
                      const Mamba3LayerParams<T>& params, const Mamba3LayerDims& dims, const Mamba3Options& opt, T* dx,
                      T* dz, T* dbc, T* draw, const Mamba3LayerGrads<T>& grads);

}  // namespace llmt::cpu
