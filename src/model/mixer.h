// A sequence mixer: the layer of a block that mixes information across positions
// (attention, and later mamba2, mamba3, gdn, comba, kda, mdn). Each type implements this
// interface in its own file pair; the block and the model never branch on the type.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "core/tensor.h"
#include "model/config.h"
#include "model/params.h"
#include "model/scratch.h"

namespace llmt {

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
};

/// Registers the parameters of one mixer of `type` in `store` under `prefix` (e.g.
/// "model.layers.3.attn.") and returns it. Throws llmt::Error for an unknown type.
std::unique_ptr<Mixer> make_mixer(const std::string& type, const ModelConfig& config, ParamStore& store,
                                  const std::string& prefix);

}  // namespace llmt
