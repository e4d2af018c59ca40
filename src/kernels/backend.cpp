// Default implementations of the Backend ops that a backend may not provide yet: each throws
// llmt::Error naming the op and the backend, so a missing kernel is a clear error, never a
// silent wrong result.
#include "kernels/backend.h"

#include "core/error.h"

namespace llmt {
namespace {
[[noreturn]] void missing(const Backend& b, const char* op) {
  throw Error(fmt::format("{}: not implemented by the {} backend yet", op, b.name()));
}
}  // namespace

void Backend::short_conv_silu_fwd(const Tensor&, const Tensor&, const Tensor&, const Tensor&) {
  missing(*this, "short_conv_silu_fwd");
}
void Backend::short_conv_silu_bwd(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                  const Tensor&) {
  missing(*this, "short_conv_silu_bwd");
}
void Backend::l2norm_fwd(const Tensor&, int64_t, double, double, const Tensor&, const Tensor&) {
  missing(*this, "l2norm_fwd");
}
void Backend::l2norm_bwd(const Tensor&, const Tensor&, const Tensor&, int64_t, double, const Tensor&) {
  missing(*this, "l2norm_bwd");
}
void Backend::gated_rmsnorm_fwd(const Tensor&, const Tensor&, const Tensor&, double, bool, const Tensor&,
                                const Tensor&) {
  missing(*this, "gated_rmsnorm_fwd");
}
void Backend::gated_rmsnorm_bwd(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, bool,
                                const Tensor&, const Tensor&, const Tensor&) {
  missing(*this, "gated_rmsnorm_bwd");
}
void Backend::gdn_gates_fwd(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                            const Tensor&) {
  missing(*this, "gdn_gates_fwd");
}
void Backend::gdn_gates_bwd(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                            const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&) {
  missing(*this, "gdn_gates_bwd");
}
void Backend::gdn_chunk_fwd(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, int64_t, DType,
                            const Tensor&, const Tensor&) {
  missing(*this, "gdn_chunk_fwd");
}
void Backend::gdn_chunk_bwd(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                            const Tensor&, const Tensor&, int64_t, DType, const Tensor&, const Tensor&, const Tensor&,
                            const Tensor&, const Tensor&) {
  missing(*this, "gdn_chunk_bwd");
}
int64_t Backend::gdn_saved_numel(int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, DType, bool) const {
  return 0;
}
void Backend::kda_gates_fwd(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                            const Tensor&) {
  missing(*this, "kda_gates_fwd");
}
void Backend::kda_gates_bwd(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                            const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&) {
  missing(*this, "kda_gates_bwd");
}
void Backend::kda_chunk_fwd(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, int64_t,
                            DType, const Tensor&, const Tensor&) {
  missing(*this, "kda_chunk_fwd");
}
void Backend::kda_chunk_bwd(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                            const Tensor&, const Tensor&, int64_t, DType, const Tensor&, const Tensor&, const Tensor&,
                            const Tensor&, const Tensor&) {
  missing(*this, "kda_chunk_bwd");
}
int64_t Backend::kda_saved_numel(int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, DType, bool) const {
  return 0;
}
void Backend::comba_gates_fwd(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                              const Tensor&) {
  missing(*this, "comba_gates_fwd");
}
void Backend::comba_gates_bwd(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                              const Tensor&, const Tensor&, const Tensor&) {
  missing(*this, "comba_gates_bwd");
}
void Backend::comba_chunk_fwd(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                              const Tensor&, int64_t, DType, const Tensor&, const Tensor&) {
  missing(*this, "comba_chunk_fwd");
}
void Backend::comba_chunk_bwd(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                              const Tensor&, const Tensor&, const Tensor&, int64_t, DType, const Tensor&,
                              const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&) {
  missing(*this, "comba_chunk_bwd");
}

void Backend::conv_bias_silu_fwd(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&) {
  missing(*this, "conv_bias_silu_fwd");
}
void Backend::conv_bias_silu_bwd(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                 const Tensor&, const Tensor&) {
  missing(*this, "conv_bias_silu_bwd");
}
void Backend::gate_rmsnorm_fwd(const Tensor&, const Tensor&, const Tensor&, double, const Tensor&, const Tensor&) {
  missing(*this, "gate_rmsnorm_fwd");
}
void Backend::gate_rmsnorm_bwd(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                               const Tensor&, const Tensor&, const Tensor&) {
  missing(*this, "gate_rmsnorm_bwd");
}
void Backend::mamba2_ssd_fwd(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, int64_t,
                             int64_t, int64_t, DType, const Tensor&, const Tensor&) {
  missing(*this, "mamba2_ssd_fwd");
}
void Backend::mamba2_ssd_bwd(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                             const Tensor&, const Tensor&, int64_t, int64_t, int64_t, DType, const Tensor&,
                             const Tensor&, const Tensor&, const Tensor&, const Tensor&) {
  missing(*this, "mamba2_ssd_bwd");
}
int64_t Backend::mamba2_saved_numel(int64_t, int64_t, int64_t, int64_t, int64_t, DType) const { return 0; }
void Backend::mamba3_fwd(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Mamba3Params&,
                         const Mamba3Options&, const Tensor&, const Tensor&) {
  missing(*this, "mamba3_fwd");
}
void Backend::mamba3_bwd(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                         const Mamba3Params&, const Mamba3Options&, const Tensor&, const Tensor&, const Tensor&,
                         const Tensor&, const Mamba3Params&) {
  missing(*this, "mamba3_bwd");
}
int64_t Backend::mamba3_saved_numel(int64_t, int64_t, int64_t, int64_t, int64_t, const Mamba3Options&) const {
  return 0;
}
void Backend::mdn_gates_fwd(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const MdnGateParams&,
                            const MdnGateOptions&, const Tensor&, const Tensor&, const Tensor&, const Tensor&) {
  missing(*this, "mdn_gates_fwd");
}
void Backend::mdn_gates_bwd(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                            const Tensor&, const Tensor&, const Tensor&, const MdnGateParams&, const MdnGateOptions&,
                            const Tensor&, const Tensor&, const Tensor&, const Tensor&, const MdnGateParams&) {
  missing(*this, "mdn_gates_bwd");
}
void Backend::mdn_correction_fwd(const Tensor&, const Tensor&, const Tensor&, const Tensor&) {
  missing(*this, "mdn_correction_fwd");
}
void Backend::mdn_correction_bwd(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&) {
  missing(*this, "mdn_correction_bwd");
}
void Backend::mdn_chunk_fwd(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                            const Tensor&, const Tensor&, int64_t, DType, const Tensor&, const Tensor&) {
  missing(*this, "mdn_chunk_fwd");
}
void Backend::mdn_chunk_bwd(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                            const Tensor&, const Tensor&, const Tensor&, const Tensor&, int64_t, DType, const Tensor&,
                            const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&) {
  missing(*this, "mdn_chunk_bwd");
}

void Backend::rope_fwd_at(const Tensor&, double, int64_t) { missing(*this, "rope_fwd_at"); }
void Backend::attention_decode(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, int64_t,
                               double, const Tensor&) {
  missing(*this, "attention_decode");
}
void Backend::short_conv_silu_decode(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&) {
  missing(*this, "short_conv_silu_decode");
}
void Backend::gdn_decode(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, int64_t,
                         const Tensor&, const Tensor&) {
  missing(*this, "gdn_decode");
}
void Backend::kda_decode(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, int64_t,
                         const Tensor&, const Tensor&) {
  missing(*this, "kda_decode");
}
void Backend::comba_decode(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                           int64_t, const Tensor&, const Tensor&) {
  missing(*this, "comba_decode");
}
void Backend::mdn_decode(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                         const Tensor&, int64_t, const Tensor&, const Tensor&, const Tensor&) {
  missing(*this, "mdn_decode");
}
void Backend::mamba2_ssd_decode(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, int64_t,
                                int64_t, int64_t, const Tensor&, const Tensor&) {
  missing(*this, "mamba2_ssd_decode");
}
void Backend::mamba3_decode(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Mamba3Params&,
                            const Mamba3Options&, const Mamba3Carry&, const Tensor&) {
  missing(*this, "mamba3_decode");
}

}  // namespace llmt
