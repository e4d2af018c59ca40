// A sequence mixer: the layer of a block that mixes information across positions
// (attention, mamba2, mamba3, gdn, comba, kda, mdn). Each type implements this
// interface in its own file pair; the block and the model never branch on the type.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "kernels/backend.h"
#include "model/config.h"
#include "model/params.h"
#include "model/scratch.h"

namespace llmt {

/// What one mixer carries from token to token while decoding (attention's KV cache, the short convolutions'
/// windows, a recurrent state, ...): backend tensors, zero at the start of a sequence, whose layout only the
/// mixer that made them knows (Mixer::decode_state).
struct MixerState {
  std::vector<OwnedTensor> tensors;
  /// Appends a zeroed tensor of `dims` in `dtype` on `backend`.
  void add(Backend& backend, DType dtype, std::initializer_list<int64_t> dims) {
    tensors.emplace_back(backend, dtype, dims);
    if (tensors.back()->numel() > 0) backend.fill_zero(*tensors.back());
  }
  const Tensor& operator[](size_t i) const { return *tensors[i]; }
};

class Mixer {
 public:
  virtual ~Mixer() = default;
  /// Takes the views of the activations saved for the backward, for inputs [batch * seq_len,
  /// d_model], from `saved` (a block's arena, model/scratch.h; called once to count with a
  /// null base, then to bind).
  virtual void plan(int64_t batch, int64_t seq_len, ScratchCarver& saved) = 0;
  /// Takes the views of its temporaries (used only within one forward or backward call) from
  /// `scratch`, after plan(); the memory is shared with the other layers (model/scratch.h).
  virtual void bind_scratch(ScratchCarver& scratch) = 0;
  /// y = mixer(x); x, y: [batch * seq_len, d_model], x in the compute dtype, y in the
  /// master dtype (ParamStore::compute_dtype / dtype). Saves what backward needs.
  virtual void forward(const Tensor& x, const Tensor& y) = 0;
  /// Given dL/dy (compute dtype), overwrites dx = dL/dx (master dtype) and accumulates the
  /// parameter gradients. x is the input of the preceding forward.
  virtual void backward(const Tensor& x, const Tensor& dy, const Tensor& dx) = 0;

  /// The zeroed state decode() carries for `batch` sequences of at most `max_len` tokens (only attention's
  /// KV cache grows with max_len).
  virtual MixerState decode_state(int64_t batch, int64_t max_len) const = 0;
  /// Incremental decoding: y = forward(x) for seq_len new tokens per sequence (the planned [batch, seq_len]:
  /// 1 to decode, a prompt's length to prefill it) at absolute positions position .. position + seq_len - 1
  /// of sequences whose earlier tokens went through decode() with this `state`, which is advanced past them.
  /// x, y [batch * seq_len, d_model] as forward's. Nothing is saved for a backward. The ops are the Backend's
  /// *_decode ones (kernels/backend.h): the chunked algorithms with a carried state where the CPU kernels have
  /// one (GDN, Comba, KDA, MDN, Mamba2), the recurrence for Mamba-3, a KV cache for attention.
  virtual void decode(const Tensor& x, MixerState& state, int64_t position, const Tensor& y) = 0;
};

/// Registers the parameters of one mixer of `type` in `store` under `prefix` (e.g.
/// "model.layers.3.attn.") and returns it. Throws llmt::Error for an unknown type.
std::unique_ptr<Mixer> make_mixer(const std::string& type, const ModelConfig& config, ParamStore& store,
                                  const std::string& prefix);

}  // namespace llmt
