#include "model/mixer.h"

#include "core/error.h"
#include "model/attention.h"
#include "model/comba.h"
#include "model/gdn.h"
#include "model/kda.h"
#include "model/mamba2.h"
#include "model/mamba3.h"
#include "model/mdn.h"

namespace llmt {

std::unique_ptr<Mixer> make_mixer(const std::string& type, const ModelConfig& config, ParamStore& store,
                                  const std::string& prefix) {
  if (type == "transformer" || type == "attn") return std::make_unique<AttentionMixer>(config, store, prefix);
  if (type == "gdn") return std::make_unique<GdnMixer>(config, store, prefix);
  if (type == "comba") return std::make_unique<CombaMixer>(config, store, prefix);
  if (type == "kda") return std::make_unique<KdaMixer>(config, store, prefix);
  if (type == "mamba2") return std::make_unique<Mamba2Mixer>(config, store, prefix);
  if (type == "mamba3") return std::make_unique<Mamba3Mixer>(config, store, prefix);
  if (type == "mdn") return std::make_unique<MdnMixer>(config, store, prefix);
  throw Error(
      fmt::format("unknown mixer type \"{}\"; available: transformer, gdn, comba, kda, mdn, mamba2, mamba3", type));
}

}  // namespace llmt
