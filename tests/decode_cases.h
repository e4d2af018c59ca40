// The models the decode tests run (tests/decode_test.cpp on the CPU, tests/cuda_decode_test.cpp on the GPU):
// every mixer type, the MDN and Mamba-3 variants whose decode state differs, and an MDN / attention hybrid.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "model/config.h"

namespace llmt::test {

/// Token ids of the decode tests' tiny models.
constexpr int64_t kDecodeVocab = 64;

struct DecodeCase {
  std::string name, type;        ///< section name; configs/tiny/<type>.json
  std::vector<std::string> sets;  ///< load_config overrides
};

inline const std::vector<DecodeCase>& decode_cases() {
  static const std::vector<DecodeCase> cases = {
      {"transformer", "transformer", {}},
      {"gdn", "gdn", {}},
      {"comba", "comba", {}},
      {"kda", "kda", {}},
      {"mdn", "mdn", {}},
      {"mdn without momentum or output correction", "mdn",
       {"model.mdn.momentum=false", "model.mdn.output_correction=false"}},
      {"mamba2", "mamba2", {}},
      {"mamba3 SISO", "mamba3", {}},
      {"mamba3 MIMO rank 2, output norm, heavy-tail A", "mamba3",
       {"model.mamba3.mimo_rank=2", "model.mamba3.outproj_norm=true", "model.mamba3.A_act=heavy_tail"}},
      {"mdn 3:1 hybrid with attention", "mdn",
       {"model.n_layers=4", "model.attn_layers=[3]", R"(model.attn={"num_heads":2,"head_dim":32})"}},
  };
  return cases;
}

/// The model of configs/tiny/<type>.json with `sets`, chunks of 8, init std 0.1 and a vocabulary of
/// kDecodeVocab (set on the parsed model: the config's tokenizer would refuse it).
inline ModelConfig decode_tiny(const std::string& type, std::vector<std::string> sets) {
  sets.push_back("model.init.std=0.1");
  if (type != "transformer") sets.push_back("model." + type + ".chunk_size=8");
  ModelConfig m = load_config("configs/tiny/" + type + ".json", sets).model;
  m.vocab_size = kDecodeVocab;
  return m;
}

}  // namespace llmt::test
