// Mamba-3 in a whole model on the CPU backend in float64 (layers-ssm-attn.md section 4): finite-difference
// gradients of every parameter (SISO, MIMO with the output norm), parameter names, shapes and the intended
// initialisation (sections 4.2, 4.8).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "core/rng.h"
#include "kernels/backend.h"
#include "model/gradcheck.h"
#include "model/model.h"

using namespace llmt;

namespace {

// D = 8, Di = 16: H = 4 heads of P = 4 in G = 2 groups, N = 8 (S = 2 angles), chunk 4 with T = 6.
ModelConfig tiny_mamba3(int64_t rank) {
  ModelConfig m;
  m.type = "mamba3";
  m.d_model = 8;
  m.n_layers = 2;
  m.vocab_size = 11;
  m.mlp.intermediate_size = 12;
  m.norm_eps = 1e-5;
  m.init_std = 0.3;
  m.mamba3.expand = 2;
  m.mamba3.head_dim = 4;
  m.mamba3.d_state = 8;
  m.mamba3.n_groups = 2;
  m.mamba3.mimo_rank = rank;
  m.mamba3.chunk_size = 4;
  return m;
}

std::vector<int32_t> random_ids(int64_t n, int32_t vocab, uint64_t stream) {
  Philox rng(99, stream);
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (auto& id : ids) id = static_cast<int32_t>(rng.below(vocab));
  return ids;
}

std::vector<GradCheckReport> model_gradient_check(const ModelConfig& m) {
  auto be = make_cpu_backend();
  Model model(m);
  model.allocate(*be, DType::f64);
  model.params().initialize(4);
  const int64_t B = 2, T = 6;
  model.plan(B, T);
  const auto inputs = random_ids(B * T, static_cast<int32_t>(m.vocab_size), 7);
  const auto targets = random_ids(B * T, static_cast<int32_t>(m.vocab_size), 8);
  const auto loss = [&]() { return model.forward(inputs.data(), targets.data(), false, 0.0); };
  be->fill_zero(model.params().flat_grads());
  model.forward(inputs.data(), targets.data(), true, 1.0);
  model.backward();
  std::vector<GradCheckInput> checks;
  for (size_t i = 0; i < model.params().infos().size(); ++i) {
    const Tensor g = model.params().grad(static_cast<int>(i));
    checks.push_back({model.params().infos()[i].name, model.params().param(static_cast<int>(i)),
                      std::vector<double>(g.as<double>(), g.as<double>() + g.numel())});
  }
  return finite_difference_check(loss, checks, 1e-5, 1e-6, 1e-8, 48);
}

}  // namespace

TEST_CASE("model: float64 finite-difference gradients of Mamba-3 models (SISO; MIMO with output norm)",
          "[model][mamba3]") {
  for (int64_t rank : {1, 2}) {
    ModelConfig m = tiny_mamba3(rank);
    m.mamba3.outproj_norm = rank > 1;
    const auto reports = model_gradient_check(m);
    // embedding, final norm (tied head); per layer 2 norms + 3 MLP + 8 mixer parameters (+ 3 mimo + norm)
    REQUIRE(reports.size() == static_cast<size_t>(2 + 2 * (5 + 8 + (rank > 1 ? 4 : 0))) + (m.tie_embeddings ? 0 : 1));
    for (const auto& r : reports) {
      INFO("rank " << rank << " " << r.name << ": max rel err " << r.max_rel_error << ", max abs err "
                   << r.max_abs_error);
      CHECK(r.ok);
    }
  }
}

TEST_CASE("model: Mamba-3 parameter names, shapes and init (layers-ssm-attn.md 4.2, 4.8)", "[model][mamba3]") {
  ModelConfig m = tiny_mamba3(2);
  m.n_layers = 3;
  m.residual_rescale = "kaiming_div_sqrt";
  m.residual_rescale_n = 6;
  auto be = make_cpu_backend();
  Model model(m);
  model.allocate(*be, DType::f64);
  model.params().initialize(5);
  const ParamStore& p = model.params();
  const auto& infos = p.infos();
  const auto find = [&](const std::string& name) {
    for (size_t i = 0; i < infos.size(); ++i)
      if (infos[i].name == name) return static_cast<int>(i);
    FAIL("no parameter " << name);
    return -1;
  };
  const auto values = [&](const std::string& name) {
    const Tensor t = p.master(find(name));
    return std::vector<double>(t.as<double>(), t.as<double>() + t.numel());
  };
  const std::string l = "model.layers.1.attn.";
  // in_proj rows 2 Di + 2 G N R + 3 H + S = 32 + 64 + 12 + 2 = 110.
  CHECK(infos[find(l + "in_proj.weight")].shape == std::vector<int64_t>{110, 8});
  CHECK(infos[find(l + "B_bias")].shape == std::vector<int64_t>{4, 2, 8});
  CHECK(infos[find(l + "mimo_x")].shape == std::vector<int64_t>{4, 2, 4});
  CHECK(infos[find(l + "out_proj.weight")].shape == std::vector<int64_t>{8, 16});
  for (const char* ones : {"B_bias", "C_bias", "B_norm.weight", "C_norm.weight", "D", "mimo_z"})
    for (double v : values(l + ones)) CHECK(v == 1.0);
  for (const char* half : {"mimo_x", "mimo_o"})
    for (double v : values(l + half)) CHECK(v == 0.5);
  // dt_bias = softplus^-1(dt), dt in [1e-3, 0.1].
  for (double v : values(l + "dt_bias")) {
    const double dt = std::log1p(std::exp(v));
    CHECK(dt >= 1e-3 * (1 - 1e-12));
    CHECK(dt <= 0.1 * (1 + 1e-12));
  }
  // in_proj U(±1/sqrt(8)); out_proj U(±1/sqrt(16)) / sqrt(6): inside the bound, the largest near it.
  const auto check_bound = [&](const std::string& name, double bound) {
    double largest = 0;
    for (double v : values(name)) largest = std::max(largest, std::abs(v));
    CHECK(largest <= bound);
    CHECK(largest > 0.9 * bound);
  };
  check_bound(l + "in_proj.weight", 1.0 / std::sqrt(8.0));
  check_bound(l + "out_proj.weight", 1.0 / std::sqrt(16.0 * 6.0));
  // The MLP's down_proj (fc2) is rescaled too: U(±1/sqrt(F = 12)) / sqrt(6).
  check_bound("model.layers.1.mlp.down_proj.weight", 1.0 / std::sqrt(12.0 * 6.0));
}
