// train.recompute (Model::plan): with per-block recomputation the loss and every gradient are
// bit-identical to the run that keeps all activations, for every mixer type, mixer-only blocks
// and hybrids; and the planned activation memory shrinks to one block's saved set. Also
// model.mdn.save_residuals: its saved bytes, and the same loss and gradients on the CPU; model.mamba3.save_states:
// nothing kept by the CPU backend, the same loss and gradients.
#include <catch2/catch.hpp>

#include <functional>
#include <initializer_list>
#include <vector>

#include "core/rng.h"
#include "kernels/backend.h"
#include "model/model.h"

using namespace llmt;

namespace {

/// Three layers (so two blocks are rebuilt in the backward), every mixer at tiny dims with
/// T = 6 over chunks of 4 (a full and a partial chunk).
ModelConfig tiny() {
  ModelConfig m;
  m.d_model = 8;
  m.n_layers = 3;
  m.vocab_size = 11;
  m.mlp.intermediate_size = 12;
  m.attn.num_heads = 2;
  m.attn.head_dim = 4;
  m.init_std = 0.3;
  for (GdnConfig* c : std::initializer_list<GdnConfig*>{&m.gdn, &m.comba, &m.kda, &m.mdn}) {
    c->num_heads = 2;
    c->head_dim = 4;
    c->chunk_size = 4;
  }
  m.kda.expand_v = 2;  // low-rank projections with a bias (model/projection.h)
  m.mamba2.expand = 2;
  m.mamba2.head_dim = 4;
  m.mamba2.d_state = 3;
  m.mamba2.n_groups = 2;
  m.mamba2.chunk_size = 4;
  m.mamba3.head_dim = 4;
  m.mamba3.d_state = 4;
  m.mamba3.chunk_size = 4;
  return m;
}

struct Run {
  double loss = 0;
  std::vector<float> grads;
  ActivationBytes bytes;
};

/// Two micro-batches of forward + backward (gradients accumulate) in f32 at B = 2, T = 6.
Run train_step(const ModelConfig& m, bool recompute) {
  auto be = make_cpu_backend();
  Model model(m);
  model.allocate(*be, DType::f32);
  model.params().initialize(5);
  const int64_t B = 2, T = 6;
  model.plan(B, T, recompute);
  Run run;
  be->fill_zero(model.params().flat_grads());
  for (uint64_t micro = 0; micro < 2; ++micro) {
    Philox rng(17, micro);
    std::vector<int32_t> inputs(B * T), targets(B * T);
    for (auto* ids : {&inputs, &targets})
      for (auto& id : *ids) id = static_cast<int32_t>(rng.below(static_cast<uint64_t>(m.vocab_size)));
    targets[3] = -1;
    run.loss += model.forward(inputs.data(), targets.data(), true, 1.0 / (B * T));
    model.backward();
  }
  const Tensor g = model.params().flat_grads();
  run.grads.assign(g.as<float>(), g.as<float>() + g.numel());
  run.bytes = model.activation_bytes();
  return run;
}

}  // namespace

TEST_CASE("recompute: loss and gradients are bit-identical to keeping every block's activations",
          "[model][recompute]") {
  const std::vector<std::pair<const char*, std::function<void(ModelConfig&)>>> cases = {
      {"transformer", [](ModelConfig&) {}},
      {"gdn", [](ModelConfig& m) { m.type = "gdn"; }},
      {"comba", [](ModelConfig& m) { m.type = "comba"; }},
      {"kda", [](ModelConfig& m) { m.type = "kda"; }},
      {"mdn", [](ModelConfig& m) { m.type = "mdn"; }},
      {"mdn without saved residuals", [](ModelConfig& m) {
         m.type = "mdn";
         m.mdn.save_residuals = false;
       }},
      {"mamba3", [](ModelConfig& m) { m.type = "mamba3"; }},
      {"mamba3 without saved states", [](ModelConfig& m) {
         m.type = "mamba3";
         m.mamba3.save_states = false;
       }},
      {"mamba2 (mixer-only blocks)",
       [](ModelConfig& m) {
         m.type = "mamba2";
         m.has_mlp = false;
       }},
      {"gdn without MLP", [](ModelConfig& m) {
         m.type = "gdn";
         m.has_mlp = false;
       }},
      {"hybrid kda + attention", [](ModelConfig& m) {
         m.type = "kda";
         m.attn_layers = {1};
       }},
      {"hybrid mamba2 + attention", [](ModelConfig& m) {
         m.type = "mamba2";
         m.has_mlp = false;
         m.attn_layers = {0};
       }},
  };
  for (const auto& [name, set] : cases) {
    DYNAMIC_SECTION(name) {
      ModelConfig m = tiny();
      set(m);
      const Run kept = train_step(m, false), recomputed = train_step(m, true);
      CHECK(recomputed.loss == kept.loss);
      REQUIRE(recomputed.grads.size() == kept.grads.size());
      size_t differing = 0;
      for (size_t i = 0; i < kept.grads.size(); ++i) differing += recomputed.grads[i] != kept.grads[i];
      CHECK(differing == 0);

      // One block's saved set instead of three; the block inputs and the scratch are unchanged.
      INFO("saved bytes: " << kept.bytes.saved << " kept, " << recomputed.bytes.saved << " with recompute");
      CHECK(recomputed.bytes.saved < kept.bytes.saved);
      if (m.attn_layers.empty()) CHECK(kept.bytes.saved == 3 * recomputed.bytes.saved);
      CHECK(recomputed.bytes.residual == kept.bytes.residual);
      CHECK(recomputed.bytes.scratch == kept.bytes.scratch);
      CHECK(recomputed.bytes.total() < kept.bytes.total());
    }
  }
}

TEST_CASE("model.mdn.save_residuals: B T H d_v more saved floats per MDN layer, the same loss and gradients",
          "[model][mdn]") {
  // The CPU backend's MDN backward recomputes Ṽ in double either way (backend.h), so the run is bit-identical; what
  // the switch changes is the planned activation memory. Hybrid: layer 1 is attention, so two MDN layers.
  ModelConfig m = tiny();
  m.type = "mdn";
  m.attn_layers = {1};
  const Run saved = train_step(m, false);
  m.mdn.save_residuals = false;
  const Run recomputed = train_step(m, false);
  CHECK(saved.loss == recomputed.loss);
  CHECK(saved.grads == recomputed.grads);
  // B T H d_v floats, carved 256-byte aligned (model/scratch.h)
  const size_t vt_bytes = (sizeof(float) * 2 * 6 * m.mdn.num_heads * m.mdn.value_dim() + 255) / 256 * 256;
  CHECK(saved.bytes.saved == recomputed.bytes.saved + 2 * vt_bytes);
  CHECK(saved.bytes.residual == recomputed.bytes.residual);
  CHECK(saved.bytes.scratch == recomputed.bytes.scratch);
}

TEST_CASE("model.mamba3.save_states: the CPU backend keeps nothing, the same loss and gradients", "[model][mamba3]") {
  // The CPU reference's backward recomputes the forward in double (Backend::mamba3_saved_numel is 0 there), so the
  // switch changes neither the gradients nor the planned memory on the CPU (the CUDA backend's saved set and its
  // bit-identical gradients: tests/cuda_mamba3_test.cpp).
  ModelConfig m = tiny();
  m.type = "mamba3";
  m.attn_layers = {1};
  auto be = make_cpu_backend();
  CHECK(be->mamba3_saved_numel(2, 6, 4, m.mamba3.d_state, m.mamba3.num_angles(), Mamba3Options{}) == 0);
  const Run saved = train_step(m, false);
  m.mamba3.save_states = false;
  const Run recomputed = train_step(m, false);
  CHECK(saved.loss == recomputed.loss);
  CHECK(saved.grads == recomputed.grads);
  CHECK(saved.bytes.saved == recomputed.bytes.saved);
  CHECK(saved.bytes.scratch == recomputed.bytes.scratch);
}
