// Softmax cross-entropy, forward and backward in one pass, statistics in double.
#include "kernels/cpu/cross_entropy.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace llmt::cpu {

// loss_r = logsumexp(z_r) - z_r[t_r];  dz_r = grad_scale (softmax(z_r) - onehot(t_r))
// (cross_entropy.h; the mean-CE loss of runs.md §1 is the caller's grad_scale = 1/#targets).
template <typename T>
double cross_entropy_fwd_bwd(T* logits, const int32_t* targets, int64_t rows, int64_t vocab, double grad_scale,
                             T* losses, T* correct, int64_t ld) {
  ld = ld == 0 ? vocab : ld;
  check(ld >= vocab, "cross_entropy: row stride {} is shorter than the vocabulary of {}", ld, vocab);
  for (int64_t r = 0; r < rows; ++r)
    check(targets[r] < vocab, "cross_entropy: row {} has target id {}, outside the vocabulary of {}", r,
          targets[r], vocab);
  double total = 0.0;
  for (int64_t r = 0; r < rows; ++r) {
    T* z = logits + r * ld;
    const int32_t target = targets[r];
    if (target < 0) {
      losses[r] = T(0);
      if (correct) correct[r] = T(0);
      std::fill(z, z + vocab, T(0));
      continue;
    }
    // One exponential per logit, in T precision (expf for float), summed in double;
    // z is overwritten by the exponentials, then scaled into the gradient.
    const double z_target = static_cast<double>(z[target]);
    T mx = z[0];
    for (int64_t j = 1; j < vocab; ++j) mx = std::max(mx, z[j]);
    if (correct) {
      bool unique = true;  // no other logit reaches the target's
      for (int64_t j = 0; j < vocab; ++j) unique = unique && (j == target || z[j] < z[target]);
      correct[r] = unique ? T(1) : T(0);
    }
    double sum = 0.0;
    for (int64_t j = 0; j < vocab; ++j) {
      z[j] = std::exp(z[j] - mx);
      sum += static_cast<double>(z[j]);
    }
    const double lse = static_cast<double>(mx) + std::log(sum);
    const double loss = lse - z_target;
    losses[r] = static_cast<T>(loss);
    total += loss;
    const T scale = static_cast<T>(grad_scale / sum);
    for (int64_t j = 0; j < vocab; ++j) z[j] *= scale;
    z[target] -= static_cast<T>(grad_scale);
  }
  return total;
}

template double cross_entropy_fwd_bwd<float>(float*, const int32_t*, int64_t, int64_t, double, float*, float*,
                                             int64_t);
template double cross_entropy_fwd_bwd<double>(double*, const int32_t*, int64_t, int64_t, double, double*, double*,
                                              int64_t);

}  // namespace llmt::cpu
