// Whole-model checks on the CPU backend in float64: finite-difference gradients of every
// parameter, gradient accumulation, ignored targets, and the parameter registry.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <memory>
#include <set>
#include <vector>

#include "core/rng.h"
#include "kernels/backend.h"
#include "model/gradcheck.h"
#include "model/mixer.h"
#include "model/model.h"

using namespace llmt;

namespace {

ModelConfig tiny(bool tie) {
  ModelConfig m;
  m.d_model = 8;
  m.n_layers = 2;
  m.vocab_size = 11;
  m.tie_embeddings = tie;
  m.mlp.intermediate_size = 12;
  m.attn.num_heads = 2;
  m.attn.head_dim = 4;
  m.init_std = 0.3;  // large enough that attention and every residual branch matter
  return m;
}

std::vector<int32_t> random_ids(int64_t n, int32_t vocab, uint64_t stream) {
  Philox rng(99, stream);
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (auto& id : ids) id = static_cast<int32_t>(rng.below(vocab));
  return ids;
}

std::vector<double> grad_values(const ParamStore& store, int i) {
  const Tensor g = store.grad(i);
  return std::vector<double>(g.as<double>(), g.as<double>() + g.numel());
}

/// Float64 finite-difference check of every parameter of a model of config `m` at B = 2, T = 6,
/// with a position without label; step h (see gradcheck.h for the tolerances).
std::vector<GradCheckReport> model_gradient_check(const ModelConfig& m, double h = 1e-5) {
  auto be = make_cpu_backend();
  Model model(m);
  model.allocate(*be, DType::f64);
  model.params().initialize(4);
  const int64_t B = 2, T = 6;
  model.plan(B, T);
  const auto inputs = random_ids(B * T, static_cast<int32_t>(m.vocab_size), 7);
  auto targets = random_ids(B * T, static_cast<int32_t>(m.vocab_size), 8);
  targets[3] = -1;
  const auto loss = [&]() { return model.forward(inputs.data(), targets.data(), false, 0.0); };
  be->fill_zero(model.params().flat_grads());
  model.forward(inputs.data(), targets.data(), true, 1.0);
  model.backward();
  std::vector<GradCheckInput> checks;
  for (size_t i = 0; i < model.params().infos().size(); ++i)
    checks.push_back({model.params().infos()[i].name, model.params().param(static_cast<int>(i)),
                      grad_values(model.params(), static_cast<int>(i))});
  return finite_difference_check(loss, checks, h, 1e-6, 1e-8, 48);
}

}  // namespace

TEST_CASE("ParamStore::initialize: the threaded fill gives the values of one sequential draw", "[model][init]") {
  // 3 x 2^18 elements: split over several threads whenever the machine has more than one core.
  const int64_t n = int64_t{3} << 18;
  Init normal;
  normal.std = 0.5;
  Init uniform;
  uniform.kind = Init::uniform;
  uniform.lo = -2;
  uniform.hi = 3;
  auto backend = make_backend("cpu");  // outlives the store's buffers
  ParamStore store;
  store.add("a", {n}, ParamKind::weight, normal);
  store.add("b", {n}, ParamKind::weight, uniform);
  store.allocate(*backend, DType::f64);
  store.initialize(11);
  std::vector<double> a(n), b(n);
  backend->download(store.master(0), a.data());
  backend->download(store.master(1), b.data());
  Philox ra(11, 0), rb(11, 1);
  int64_t mismatches = 0;
  for (int64_t j = 0; j < n; ++j) {
    mismatches += a[j] != 0.5 * ra.normal();
    mismatches += b[j] != -2 + 5 * rb.uniform();
  }
  CHECK(mismatches == 0);
}

TEST_CASE("model: float64 finite-difference gradients of every parameter", "[model]") {
  for (bool tie : {false, true}) {
    DYNAMIC_SECTION("tie_embeddings = " << tie) {
      auto be = make_cpu_backend();
      Model model(tiny(tie));
      model.allocate(*be, DType::f64);
      model.params().initialize(3);
      const int64_t B = 2, T = 5;
      model.plan(B, T);
      const auto inputs = random_ids(B * T, 11, 1);
      auto targets = random_ids(B * T, 11, 2);
      targets[3] = -1;  // a position without label
      const auto loss = [&]() { return model.forward(inputs.data(), targets.data(), false, 0.0); };

      be->fill_zero(model.params().flat_grads());
      model.forward(inputs.data(), targets.data(), true, 1.0);
      model.backward();
      std::vector<GradCheckInput> checks;
      for (size_t i = 0; i < model.params().infos().size(); ++i)
        checks.push_back({model.params().infos()[i].name, model.params().param(static_cast<int>(i)),
                          grad_values(model.params(), static_cast<int>(i))});
      const auto reports = finite_difference_check(loss, checks, 1e-5, 1e-6, 1e-8, 48);
      REQUIRE(reports.size() == (tie ? 20u : 21u));
      for (const auto& r : reports) {
        INFO(describe(r));
        CHECK(r.ok);
        CHECK(r.checked > 0);
      }
    }
  }
}

TEST_CASE("model: float64 finite-difference gradients of a Gated DeltaNet model", "[model][gdn]") {
  ModelConfig m = tiny(false);
  m.type = "gdn";
  m.gdn.num_heads = 2;
  m.gdn.head_dim = 4;
  m.gdn.chunk_size = 4;  // T = 6: a full and a partial chunk
  const auto reports = model_gradient_check(m);
  REQUIRE(reports.size() == 3 + 2 * (2 + 13 + 3));  // embedding, head, final norm; per layer 2 norms, 13 mixer, 3 MLP
  for (const auto& r : reports) {
    INFO(describe(r));
    CHECK(r.ok);
  }
}

TEST_CASE("model: float64 finite-difference gradients of a GDN / attention hybrid", "[model][gdn][hybrid]") {
  ModelConfig m = tiny(false);
  m.type = "gdn";
  m.gdn.num_heads = 2;
  m.gdn.head_dim = 4;
  m.gdn.chunk_size = 4;
  m.attn_layers = {1};  // layer 0 GDN, layer 1 softmax attention (model.attn of tiny())
  const auto reports = model_gradient_check(m);
  // embedding, head, final norm; layer 0: 2 norms + 13 GDN + 3 MLP; layer 1: 2 norms + 4 attention + 3 MLP
  REQUIRE(reports.size() == 3 + (2 + 13 + 3) + (2 + 4 + 3));
  bool attention_seen = false;
  for (const auto& r : reports) {
    INFO(describe(r));
    CHECK(r.ok);
    attention_seen = attention_seen || r.name == "model.layers.1.attn.q_proj.weight";
  }
  CHECK(attention_seen);
}

TEST_CASE("model: float64 finite-difference gradients of a Comba model", "[model][comba]") {
  ModelConfig m = tiny(false);
  m.type = "comba";
  m.comba.num_heads = 2;
  m.comba.head_dim = 4;
  m.comba.chunk_size = 4;           // T = 6: a full and a partial chunk
  m.comba.decay_init = 0.3;         // not the default 1.0, and decay != D, so a swapped term would show
  m.comba.correction_factor = 0.7;
  // h = 3e-6, not 1e-5: q' = q - D sigma(decay) k can be short, and the L2 norm of a short vector is strongly
  // curved, so the O(h^2) truncation error at h = 1e-5 reaches 3e-6 relative on q_conv1d (it scales exactly
  // with h^2: 3e-4 at h = 1e-4, i.e. truncation, not a wrong gradient). The rounding noise eps |L| / h stays
  // ~1e-9, below abs_tol.
  const auto reports = model_gradient_check(m, 3e-6);
  // embedding, head, final norm; per layer 2 norms, 15 mixer (GDN's 13 + decay, D), 3 MLP
  REQUIRE(reports.size() == 3 + 2 * (2 + 15 + 3));
  int seen_comba = 0;
  for (const auto& r : reports) {
    INFO(describe(r));
    CHECK(r.ok);
    const auto ends_with = [&](const std::string& s) {
      return r.name.size() >= s.size() && r.name.compare(r.name.size() - s.size(), s.size(), s) == 0;
    };
    if (ends_with(".attn.decay") || ends_with(".attn.D")) {
      ++seen_comba;
      CHECK(r.checked > 0);
    }
  }
  CHECK(seen_comba == 4);
}

TEST_CASE("model: gradients accumulate over micro-batches; grad_scale scales them", "[model]") {
  auto be = make_cpu_backend();
  Model model(tiny(false));
  model.allocate(*be, DType::f64);
  model.params().initialize(5);
  model.plan(1, 4);
  const auto inputs = random_ids(4, 11, 3), targets = random_ids(4, 11, 4);
  const Tensor g = model.params().flat_grads();

  be->fill_zero(g);
  const double l1 = model.forward(inputs.data(), targets.data(), true, 1.0);
  model.backward();
  const std::vector<double> once(g.as<double>(), g.as<double>() + g.numel());

  be->fill_zero(g);
  const double l2 = model.forward(inputs.data(), targets.data(), true, 0.5);
  model.backward();
  model.forward(inputs.data(), targets.data(), true, 0.5);
  model.backward();
  CHECK(l1 == l2);  // the loss sum does not depend on grad_scale
  double max_diff = 0;
  for (int64_t i = 0; i < g.numel(); ++i) max_diff = std::max(max_diff, std::fabs(g.as<double>()[i] - once[i]));
  CHECK(max_diff < 1e-13);
}

TEST_CASE("model: initial loss of a N(0, 0.02^2) model is close to log(vocab)", "[model]") {
  auto be = make_cpu_backend();
  ModelConfig m = tiny(false);
  m.vocab_size = 1000;
  m.init_std = 0.02;
  Model model(m);
  model.allocate(*be, DType::f64);
  model.params().initialize(1);
  model.plan(2, 8);
  const auto inputs = random_ids(16, 1000, 5), targets = random_ids(16, 1000, 6);
  const double mean = model.forward(inputs.data(), targets.data(), false, 0.0) / 16;
  CHECK(std::fabs(mean - std::log(1000.0)) < 0.01);
}

TEST_CASE("model: parameter names follow the flash-linear-attention layout", "[model]") {
  Model model(tiny(false));
  const auto& infos = model.params().infos();
  REQUIRE(infos.size() == 21);
  CHECK(infos.front().name == "model.embeddings.weight");
  CHECK(infos[1].name == "model.layers.0.attn_norm.weight");
  CHECK(infos[2].name == "model.layers.0.attn.q_proj.weight");
  CHECK(infos[5].name == "model.layers.0.attn.o_proj.weight");
  CHECK(infos[6].name == "model.layers.0.mlp_norm.weight");
  CHECK(infos[7].name == "model.layers.0.mlp.gate_proj.weight");
  CHECK(infos[9].name == "model.layers.0.mlp.down_proj.weight");
  CHECK(infos[19].name == "model.norm.weight");
  CHECK(infos[20].name == "lm_head.weight");
  // 11*8 embedding + 2 * (2*8 + 4*8*8 + 3*8*12) + 8 + 11*8 head
  CHECK(model.counts().total == 88 + 2 * (16 + 256 + 288) + 8 + 88);
  CHECK(model.counts().non_embedding == 2 * (16 + 256 + 288) + 8);
}

TEST_CASE("model: float64 finite-difference gradients of a KDA model and a KDA / attention hybrid", "[model][kda]") {
  ModelConfig m = tiny(false);
  m.type = "kda";
  m.kda.num_heads = 2;
  m.kda.head_dim = 4;
  m.kda.expand_v = 2;   // d_v = 8: the low-rank width (d_v) differs from d_k, so a swapped shape would show
  m.kda.chunk_size = 4;  // T = 6: a full and a partial chunk
  for (bool hybrid : {false, true}) {
    DYNAMIC_SECTION("hybrid = " << hybrid) {
      if (hybrid) m.attn_layers = {1};
      // h = 3e-6, not 1e-5 (as for Comba): the L2 norm of a short q is strongly curved, and in the hybrid the
      // O(h^2) truncation error on q_conv1d reaches 5e-8 absolute at h = 1e-5. Measured there: 5.1e-6, 4.6e-7,
      // 5.0e-8, 3.1e-9 at h = 1e-4, 3e-5, 1e-5, 3e-6 (the h^2 law down to a rounding floor of ~4e-9).
      const auto reports = model_gradient_check(m, 3e-6);
      // embedding, head, final norm; per KDA layer 2 norms, 16 mixer (q, k, v, f_proj.0, f_proj.1, b, A_log,
      // dt_bias, 3 convs, g_proj.0, g_proj.1, g_proj.1.bias, o_norm, o), 3 MLP; attention layer 2 + 4 + 3.
      REQUIRE(reports.size() == 3 + (2 + 16 + 3) + (hybrid ? 2 + 4 + 3 : 2 + 16 + 3));
      int seen_kda = 0;
      for (const auto& r : reports) {
        INFO(describe(r));
        CHECK(r.ok);
        CHECK(r.checked > 0);
        for (const char* name : {"model.layers.0.attn.f_proj.0.weight", "model.layers.0.attn.f_proj.1.weight",
                                 "model.layers.0.attn.g_proj.1.bias", "model.layers.0.attn.dt_bias"})
          if (r.name == name) ++seen_kda;
      }
      CHECK(seen_kda == 4);
    }
  }
}

namespace {

// The float64 loss and every gradient of model m (B = 2, T = 7) with the mixer's chunk size set to 1 (the
// token-by-token recurrence), 3 (a partial last chunk) and 64 (one chunk) by set_chunk: equal up to rounding.
template <typename SetChunk>
void check_chunk_invariance(ModelConfig m, SetChunk set_chunk) {
  auto be = make_cpu_backend();
  const int64_t B = 2, T = 7;
  const auto inputs = random_ids(B * T, static_cast<int32_t>(m.vocab_size), 11);
  const auto targets = random_ids(B * T, static_cast<int32_t>(m.vocab_size), 12);
  std::vector<double> losses;
  std::vector<std::vector<double>> grads;
  for (const int64_t chunk : {1, 3, 64}) {
    set_chunk(m, chunk);
    Model model(m);
    model.allocate(*be, DType::f64);
    model.params().initialize(5);
    model.plan(B, T);
    be->fill_zero(model.params().flat_grads());
    losses.push_back(model.forward(inputs.data(), targets.data(), true, 1.0));
    model.backward();
    const Tensor g = model.params().flat_grads();
    grads.emplace_back(g.as<double>(), g.as<double>() + g.numel());
  }
  for (size_t i = 1; i < losses.size(); ++i) {
    CHECK(std::abs(losses[i] - losses[0]) < 1e-12 * std::abs(losses[0]));
    double err = 0, scale = 0;
    for (size_t j = 0; j < grads[0].size(); ++j) {
      err = std::max(err, std::abs(grads[i][j] - grads[0][j]));
      scale = std::max(scale, std::abs(grads[0][j]));
    }
    INFO("chunk variant " << i << ": max |dgrad| " << err << " of max |grad| " << scale);
    CHECK(scale > 0);
    CHECK(err < 1e-10 * scale);
  }
}

}  // namespace

TEST_CASE("model: a KDA model's loss and gradients do not depend on the chunk size (chunked = recurrent)",
          "[model][kda]") {
  // chunk_size 1 is the token-by-token recurrence (each chunk: 𝒯 = I, Δ = β (v - S̄^T k)); 3 leaves a partial
  // last chunk at T = 7; 64 puts the whole sequence in one chunk. Float64: equal up to rounding.
  ModelConfig m = tiny(false);
  m.type = "kda";
  m.kda.num_heads = 2;
  m.kda.head_dim = 4;
  m.kda.expand_v = 2;
  check_chunk_invariance(m, [](ModelConfig& c, int64_t chunk) { c.kda.chunk_size = chunk; });
}

TEST_CASE("model: float64 finite-difference gradients of a Mamba2 model with mixer-only blocks", "[model][mamba2]") {
  ModelConfig m = tiny(false);
  m.type = "mamba2";
  m.has_mlp = false;
  m.mamba2.expand = 2;  // Di = 16, H = 4 heads of P = 4, G = 2 groups of N = 3
  m.mamba2.head_dim = 4;
  m.mamba2.d_state = 3;
  m.mamba2.n_groups = 2;
  m.mamba2.chunk_size = 4;  // T = 6: a full and a partial chunk
  const auto reports = model_gradient_check(m);
  // embedding, head, final norm; per layer attn_norm + 8 mixer parameters (no mlp_norm, no MLP)
  REQUIRE(reports.size() == 3 + 2 * (1 + 8));
  for (const auto& r : reports) {
    INFO(describe(r));
    CHECK(r.ok);
  }
}

TEST_CASE("model: Mamba2 parameter names, shapes and the fla_mdn init (layers-ssm-attn.md 2.3.1)", "[model][mamba2]") {
  ModelConfig m = tiny(false);
  m.type = "mamba2";
  m.has_mlp = false;
  m.n_layers = 3;
  m.mamba2.expand = 2;
  m.mamba2.head_dim = 4;
  m.mamba2.d_state = 3;
  m.residual_rescale = "kaiming_div_sqrt";
  m.residual_rescale_n = 3;
  auto be = make_cpu_backend();
  Model model(m);
  model.allocate(*be, DType::f64);
  model.params().initialize(5);
  const ParamStore& p = model.params();
  const auto& infos = p.infos();
  // embedding; per layer attn_norm, in_proj, conv1d.weight, conv1d.bias, dt_bias, A_log, D, norm, out_proj; norm; head
  REQUIRE(infos.size() == 1 + 3 * 9 + 2);
  const auto find = [&](const std::string& name) {
    for (size_t i = 0; i < infos.size(); ++i)
      if (infos[i].name == name) return static_cast<int>(i);
    FAIL("no parameter " << name);
    return -1;
  };
  const std::string l = "model.layers.1.attn.";
  // Di = 16, H = 4, G N = 3: in_proj [2*16 + 2*3 + 4, 8], conv channels 16 + 6 = 22.
  CHECK(infos[find(l + "in_proj.weight")].shape == std::vector<int64_t>{42, 8});
  CHECK(infos[find(l + "conv1d.weight")].shape == std::vector<int64_t>{22, 1, 4});
  CHECK(infos[find(l + "out_proj.weight")].shape == std::vector<int64_t>{8, 16});
  const Tensor A_log = p.master(find(l + "A_log")), D = p.master(find(l + "D")), bias = p.master(find(l + "conv1d.bias"));
  for (int64_t h = 0; h < 4; ++h) {
    CHECK(A_log.as<double>()[h] == std::log(static_cast<double>(h + 1)));  // A = -1, -2, -3, -4
    CHECK(D.as<double>()[h] == 1.0);
  }
  for (int64_t c = 0; c < 22; ++c) CHECK(bias.as<double>()[c] == 0.0);
  // out_proj ~ U(±1/sqrt(16)) / sqrt(3): every value inside the bound, and the largest near it.
  const Tensor w = p.master(find(l + "out_proj.weight"));
  const double bound = 1.0 / std::sqrt(16.0 * 3.0);
  double largest = 0;
  for (int64_t i = 0; i < w.numel(); ++i) largest = std::max(largest, std::abs(w.as<double>()[i]));
  CHECK(largest <= bound);
  CHECK(largest > 0.9 * bound);
  for (const auto& info : infos) CHECK(info.name.find("mlp") == std::string::npos);
}

TEST_CASE("model: a Mamba2 layer saves z, y, xBC, its conv pre-activation and output, dt_raw, the gated norm's rstd "
          "and output (not u = y silu(z))",
          "[model][mamba2]") {
  // The fused gated norm (Backend::gate_rmsnorm_*) recomputes u in its backward. Di = 16, H = 4, G N = 2 * 3: conv
  // channels 16 + 2 * 6 = 28; rows = 2 * 37 = 74, each tensor 256-byte aligned; the CPU backend keeps no SSD set.
  ModelConfig m = tiny(false);
  m.type = "mamba2";
  m.mamba2.expand = 2;
  m.mamba2.head_dim = 4;
  m.mamba2.d_state = 3;
  m.mamba2.n_groups = 2;
  auto be = make_cpu_backend();
  ParamStore store;
  const std::unique_ptr<Mixer> mixer = make_mixer("mamba2", m, store, "mixer.");
  store.allocate(*be, DType::f64, DType::f64);
  ScratchCarver saved(nullptr);
  const int64_t rows = 2 * 37;
  mixer->plan(2, 37, saved);
  const auto carved = [](int64_t n) { return (static_cast<size_t>(n) * 8 + 255) / 256 * 256; };
  CHECK(saved.used() == 3 * carved(rows * 16) + 3 * carved(rows * 28) + carved(rows * 4) + carved(rows));
}

TEST_CASE("model: Mamba2 init styles mamba_ssm and zeros_like_skipped (layers-ssm-attn.md 2.3.2-2.3.3)", "[model][mamba2]") {
  ModelConfig m = tiny(false);
  m.type = "mamba2";
  m.has_mlp = false;
  m.n_layers = 1;
  m.mamba2.expand = 2;
  m.mamba2.head_dim = 2;  // H = 8
  m.mamba2.d_state = 3;
  auto be = make_cpu_backend();
  const auto values = [](const Tensor& t) { return std::vector<double>(t.as<double>(), t.as<double>() + t.numel()); };
  // Parameter indices: 0 embedding, 1 attn_norm, 2 in_proj, 3 conv1d.weight, 4 conv1d.bias, 5 dt_bias, 6 A_log.
  SECTION("mamba_ssm: A = exp(A_log) in [1, 16), PyTorch-default conv bias U(±1/sqrt(4)), in_proj U(±1/sqrt(8))") {
    m.mamba2.init_style = "mamba_ssm";
    Model model(m);
    model.allocate(*be, DType::f64);
    model.params().initialize(6);
    REQUIRE(model.params().infos()[6].name == "model.layers.0.attn.A_log");
    const auto A_log = values(model.params().master(6)), bias = values(model.params().master(4)),
               w_in = values(model.params().master(2));
    for (double a : A_log) {
      CHECK(std::exp(a) >= 1.0);
      CHECK(std::exp(a) < 16.0);
    }
    CHECK(std::set<double>(A_log.begin(), A_log.end()).size() == A_log.size());  // random, not log(1..H)
    double largest_bias = 0, largest_w = 0;
    for (double b : bias) largest_bias = std::max(largest_bias, std::abs(b));
    for (double w : w_in) largest_w = std::max(largest_w, std::abs(w));
    CHECK(largest_bias <= 0.5);
    CHECK(largest_bias > 0.3);
    CHECK(largest_w <= 1.0 / std::sqrt(8.0));
    CHECK(largest_w > 0.9 / std::sqrt(8.0));
  }
  SECTION("zeros_like_skipped: A_log = dt_bias = 0") {
    m.mamba2.init_style = "zeros_like_skipped";
    Model model(m);
    model.allocate(*be, DType::f64);
    model.params().initialize(6);
    REQUIRE(model.params().infos()[5].name == "model.layers.0.attn.dt_bias");
    for (double v : values(model.params().master(5))) CHECK(v == 0.0);
    for (double v : values(model.params().master(6))) CHECK(v == 0.0);
  }
}

namespace {

/// The tiny MDN model of the tests: 2 heads of d_k 4, d_v 8, chunk 4 (T = 6: a full and a partial chunk),
/// floor -1 (clamps some tokens, so the clamp's zero gradient is checked as well).
ModelConfig tiny_mdn() {
  ModelConfig m = tiny(false);
  m.type = "mdn";
  m.mdn.num_heads = 2;
  m.mdn.head_dim = 4;
  m.mdn.chunk_size = 4;
  m.mdn.min_log_mu = -1.0;
  return m;
}

}  // namespace

TEST_CASE("model: float64 finite-difference gradients of MDN models (with the ablations and a hybrid)",
          "[model][mdn]") {
  struct Variant {
    const char* name;
    void (*apply)(ModelConfig&);
    int64_t mixer_params;  // per MDN layer
  };
  // Per MDN layer: q, k, v, a, b, A_log, dt_bias, 3 convs, g, o_norm, o (13, as GDN) + m, e, Mu_log, mu_bias,
  // log_factor, D_log.
  const Variant variants[] = {
      {"mdn", [](ModelConfig&) {}, 19},
      {"no output correction", [](ModelConfig& m) { m.mdn.output_correction = false; }, 18},
      {"no alpha_max", [](ModelConfig& m) { m.mdn.alpha_max = false; }, 19},
      {"no beta_max", [](ModelConfig& m) { m.mdn.beta_max = false; }, 19},
      {"eta = 2 sigmoid", [](ModelConfig& m) { m.mdn.eta = "two_sigmoid"; }, 19},
      {"no momentum", [](ModelConfig& m) { m.mdn.momentum = false; }, 15},
      {"hybrid (layer 1 attention)", [](ModelConfig& m) { m.attn_layers = {1}; }, 19},
  };
  for (const Variant& v : variants) {
    DYNAMIC_SECTION(v.name) {
      ModelConfig m = tiny_mdn();
      v.apply(m);
      // h = 3e-6 as for Comba / KDA: q' = q - δ k can be short and its L2 norm strongly curved.
      const auto reports = model_gradient_check(m, 3e-6);
      const bool hybrid = !m.attn_layers.empty();
      REQUIRE(reports.size() ==
              static_cast<size_t>(3 + (2 + v.mixer_params + 3) + (hybrid ? 2 + 4 + 3 : 2 + v.mixer_params + 3)));
      for (const auto& r : reports) {
        INFO(describe(r));
        CHECK(r.ok);
        CHECK(r.checked > 0);
      }
    }
  }
}

TEST_CASE("model: an MDN model's loss and gradients do not depend on the chunk size (chunked = recurrent)",
          "[model][mdn]") {
  // chunk_size 1 is the token-by-token recurrence; 3 leaves a partial last chunk at T = 7; 64 puts the whole
  // sequence in one chunk. Float64: equal up to rounding. Also without momentum (μ = 0: log μ = -inf in the core).
  for (const bool momentum : {true, false}) {
    DYNAMIC_SECTION("momentum = " << momentum) {
      ModelConfig m = tiny_mdn();
      m.mdn.momentum = momentum;
      check_chunk_invariance(m, [](ModelConfig& c, int64_t chunk) { c.mdn.chunk_size = chunk; });
    }
  }
}

TEST_CASE("model: MDN parameter names and initialisation (mdn.md section 3)", "[model][mdn]") {
  ModelConfig m = tiny_mdn();
  m.mdn.num_heads = 64;  // enough draws per head vector to see the distributions
  m.mdn.head_dim = 2;
  const auto values = [](Model& model, const std::string& name) {
    for (size_t i = 0; i < model.params().infos().size(); ++i)
      if (model.params().infos()[i].name == name) {
        const Tensor t = model.params().master(static_cast<int>(i));
        return std::vector<double>(t.as<double>(), t.as<double>() + t.numel());
      }
    FAIL("no parameter " << name);
    return std::vector<double>{};
  };
  auto be = make_cpu_backend();
  for (const bool zero : {false, true}) {
    DYNAMIC_SECTION("log_factor / D_log init " << (zero ? "zero" : "log-uniform")) {
      if (zero) {
        m.mdn.log_factor_init = "zero";
        m.mdn.D_log_init = "zero";
      }
      Model model(m);
      model.allocate(*be, DType::f64);
      model.params().initialize(3);
      const std::string p = "model.layers.1.attn.";
      const auto dt = values(model, p + "dt_bias"), mu_bias = values(model, p + "mu_bias");
      CHECK(mu_bias == dt);  // copy_dt_bias
      const auto A = values(model, p + "A_log"), Mu = values(model, p + "Mu_log");
      CHECK(A != Mu);  // independent draws
      for (double a : Mu) CHECK(a < std::log(16.0));
      for (double d : dt) {  // softplus(dt_bias) in [1e-3, 0.1]
        const double sp = std::log1p(std::exp(d));
        CHECK(sp >= 1e-3 * (1 - 1e-12));
        CHECK(sp <= 0.1 * (1 + 1e-12));
      }
      const auto lf = values(model, p + "log_factor"), dl = values(model, p + "D_log");
      for (size_t h = 0; h < lf.size(); ++h) {
        if (zero) {
          CHECK(lf[h] == 0.0);
          CHECK(dl[h] == 0.0);
        } else {
          CHECK(std::exp(lf[h]) > 0.0);
          CHECK(std::exp(lf[h]) <= 4.0);
          CHECK(std::exp(dl[h]) <= 1.0);
        }
      }
      if (!zero) {  // s ~ U(0, 4), δ ~ U(0, 1): their means, 64 draws each (standard errors 0.14 and 0.036)
        double ms = 0, md = 0;
        for (size_t h = 0; h < lf.size(); ++h) ms += std::exp(lf[h]) / 64, md += std::exp(dl[h]) / 64;
        CHECK(std::abs(ms - 2.0) < 0.6);
        CHECK(std::abs(md - 0.5) < 0.15);
      }
    }
  }
}
