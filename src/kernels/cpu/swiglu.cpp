// SwiGLU activation (layers-ssm-attn.md §1.3), arithmetic in double.
#include "kernels/cpu/swiglu.h"

#include <cmath>

namespace llmt::cpu {

// h = SiLU(a) ∘ b, SiLU(a) = a σ(a)   (layers-ssm-attn.md §1.3)
template <typename T>
void swiglu_fwd(const T* gate, const T* up, int64_t n, T* h) {
  for (int64_t i = 0; i < n; ++i) {
    const double a = gate[i];
    const double sig = 1.0 / (1.0 + std::exp(-a));
    h[i] = static_cast<T>(a * sig * up[i]);
  }
}

// da = dh ∘ b ∘ SiLU'(a), SiLU'(a) = σ(a)(1 + a(1 - σ(a)));  db = dh ∘ SiLU(a)
// (layers-ssm-attn.md §1.3 and §1.2)
template <typename T>
void swiglu_bwd(const T* gate, const T* up, const T* dh, int64_t n, T* dgate, T* dup) {
  for (int64_t i = 0; i < n; ++i) {
    const double a = gate[i];
    const double sig = 1.0 / (1.0 + std::exp(-a));
    dgate[i] = static_cast<T>(static_cast<double>(dh[i]) * up[i] * sig * (1.0 + a * (1.0 - sig)));
    dup[i] = static_cast<T>(static_cast<double>(dh[i]) * a * sig);
  }
}

template void swiglu_fwd<float>(const float*, const float*, int64_t, float*);
template void swiglu_fwd<double>(const double*, const double*, int64_t, double*);
template void swiglu_bwd<float>(const float*, const float*, const float*, int64_t, float*, float*);
template void swiglu_bwd<double>(const double*, const double*, const double*, int64_t, double*, double*);

}  // namespace llmt::cpu
