// Learning-rate schedules (src/train/lr_schedule.{h,cpp}) and the AdamW optimizer
// (src/train/optimizer.{h,cpp}). Every expected value is worked out by hand in the comments;
// the cosines are table values (cos(pi/16) = cos 11.25 deg, cos(pi/15) = cos 12 deg, ...).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "model/config.h"
#include "model/params.h"
#include "train/lr_schedule.h"
#include "train/optimizer.h"

using llmt::learning_rate;
using llmt::TrainConfig;

namespace {

constexpr double kCos_pi_16 = 0.98078528040323044913;  // cos(pi/16) = cos(11.25 deg)
constexpr double kCos_pi_15 = 0.97814760073380563793;  // cos(pi/15) = cos(12 deg)
constexpr double kCos_pi_20 = 0.98768834059513772620;  // cos(pi/20) = cos(9 deg)

// lr 3e-4, min_lr 3e-5 (r = 0.1), batch_tokens 1000: tokens 20000 -> N = 20 steps,
// warmup_tokens 4000 -> W = 4 steps.
TrainConfig schedule_config(const std::string& formula, int64_t warmup_tokens) {
  TrainConfig t;
  t.lr = 3e-4;
  t.min_lr = 3e-5;
  t.batch_tokens = 1000;
  t.tokens = 20000;
  t.warmup_tokens = warmup_tokens;
  t.seq_len = 100;
  t.micro_batch = 10;
  t.lr_formula = formula;
  return t;
}

Approx near(double x) { return Approx(x).epsilon(1e-12).margin(0); }

}  // namespace

TEST_CASE("lr schedule: the configuration gives W = 4 and N = 20", "[lr]") {
  const TrainConfig t = schedule_config("flame", 4000);
  REQUIRE(t.steps() == 20);
  REQUIRE(t.warmup_steps() == 4);
}

TEST_CASE("lr schedule: flame (runs.md section 1), W = 4, N = 20", "[lr]") {
  const TrainConfig t = schedule_config("flame", 4000);
  // warmup: lr * (s + 1) / W
  CHECK(learning_rate(t, 0) == near(7.5e-5));   // 3e-4 * 1/4
  CHECK(learning_rate(t, 1) == near(1.5e-4));   // 3e-4 * 2/4
  CHECK(learning_rate(t, 3) == near(3e-4));     // s = W-1: 3e-4 * 4/4
  CHECK(learning_rate(t, 4) == near(3e-4));     // s = W: f(W) = 1
  // s = W+1 = 5: progress (5-4)/(20-4) = 1/16
  //   f = 0.1 + 0.9 * 0.5 * (1 + cos(pi/16)) = 0.1 + 0.45 * 1.98078528040323 = 0.991353376181454
  //   lr = 3e-4 * 0.991353376181454 = 2.97406012854436e-4
  CHECK(learning_rate(t, 5) == near(3e-4 * (0.1 + 0.45 * (1 + kCos_pi_16))));
  CHECK(learning_rate(t, 5) == Approx(2.97406012854436e-4).epsilon(1e-11));
  // s = 12: progress 8/16 = 1/2, cos(pi/2) = 0 -> f = 0.1 + 0.45 = 0.55 -> lr = 1.65e-4
  CHECK(learning_rate(t, 12) == near(1.65e-4));
  // s = N-1 = 19: progress 15/16, cos(15 pi/16) = -cos(pi/16)
  //   f = 0.1 + 0.45 * (1 - 0.98078528040323) = 0.1 + 0.45 * 0.01921471959677 = 0.108646623818547
  //   lr = 3.25939871455640e-5, above min_lr: the minimum is approached, not reached
  CHECK(learning_rate(t, 19) == near(3e-4 * (0.1 + 0.45 * (1 - kCos_pi_16))));
  CHECK(learning_rate(t, 19) == Approx(3.2593987145564e-5).epsilon(1e-11));
  CHECK(learning_rate(t, 19) > 3e-5);
  // strictly decreasing after the peak
  for (int64_t s = 5; s < 20; ++s) CHECK(learning_rate(t, s) < learning_rate(t, s - 1));
}

TEST_CASE("lr schedule: standard cosine reaches exactly min_lr at N-1, W = 4, N = 20", "[lr]") {
  const TrainConfig t = schedule_config("standard", 4000);
  // same warmup as flame
  CHECK(learning_rate(t, 0) == near(7.5e-5));   // 3e-4 * 1/4
  CHECK(learning_rate(t, 3) == near(3e-4));     // 3e-4 * 4/4
  // cosine over N-1-W = 15 steps: min_lr + (lr - min_lr) * 0.5 * (1 + cos(pi (s-W)/15))
  CHECK(learning_rate(t, 4) == near(3e-4));     // progress 0: 3e-5 + 2.7e-4 * 1
  // s = 5: progress 1/15: 3e-5 + 1.35e-4 * (1 + 0.978147600733806) = 2.97049926099064e-4
  CHECK(learning_rate(t, 5) == near(3e-5 + 1.35e-4 * (1 + kCos_pi_15)));
  CHECK(learning_rate(t, 5) == Approx(2.97049926099064e-4).epsilon(1e-11));
  // s = 9: progress 5/15 = 1/3, cos(pi/3) = 0.5: 3e-5 + 1.35e-4 * 1.5 = 2.325e-4
  CHECK(learning_rate(t, 9) == near(2.325e-4));
  // s = 19 = N-1: progress 1, cos(pi) = -1: exactly min_lr
  CHECK(learning_rate(t, 19) == near(3e-5));
  for (int64_t s = 5; s < 20; ++s) CHECK(learning_rate(t, s) < learning_rate(t, s - 1));
}

TEST_CASE("lr schedule: no warmup (W = 0), N = 20", "[lr]") {
  SECTION("flame") {
    const TrainConfig t = schedule_config("flame", 0);
    REQUIRE(t.warmup_steps() == 0);
    CHECK(learning_rate(t, 0) == near(3e-4));  // s = W = 0: f = 1
    // s = 1: progress 1/20: f = 0.1 + 0.45 * (1 + cos(pi/20)) = 0.1 + 0.45 * 1.98768834059514
    //   = 0.994459753267812 -> lr = 2.98337925980344e-4
    CHECK(learning_rate(t, 1) == near(3e-4 * (0.1 + 0.45 * (1 + kCos_pi_20))));
    CHECK(learning_rate(t, 1) == Approx(2.98337925980344e-4).epsilon(1e-11));
    // s = 10: progress 1/2 -> f = 0.55 -> 1.65e-4
    CHECK(learning_rate(t, 10) == near(1.65e-4));
    // s = 19: progress 19/20, cos = -cos(pi/20): f = 0.1 + 0.45 * 0.0123116594048623 = 0.105540246732188
    CHECK(learning_rate(t, 19) == near(3e-4 * (0.1 + 0.45 * (1 - kCos_pi_20))));
    CHECK(learning_rate(t, 19) == Approx(3.16620740196564e-5).epsilon(1e-11));
  }
  SECTION("standard") {
    const TrainConfig t = schedule_config("standard", 0);
    CHECK(learning_rate(t, 0) == near(3e-4));   // progress 0
    // s = 19: progress 19/19 = 1 -> min_lr
    CHECK(learning_rate(t, 19) == near(3e-5));
    // cosine over 19 steps is symmetric about the midpoint 9.5: lr(s) + lr(19-s) = lr + min_lr
    // (1 + cos(x) + 1 + cos(pi - x) = 2), so lr(9) + lr(10) = 3.3e-4
    CHECK(learning_rate(t, 9) + learning_rate(t, 10) == near(3.3e-4));
  }
}

namespace {

// A tiny parameter store, f64 on the CPU backend: four parameters of different kinds,
// laid out weight | norm | embedding | bias in the flat buffer, each slice at a multiple of kParamAlign elements
// (zero gaps between them). Values are given and read "packed": the parameters' elements in order, without the gaps.
struct TinyModel {
  std::unique_ptr<llmt::Backend> backend = llmt::make_cpu_backend();
  llmt::ParamStore store;
  TinyModel() {
    store.add("layers.0.weight", {2}, llmt::ParamKind::weight, {});
    store.add("layers.0.norm.weight", {2}, llmt::ParamKind::norm, {});
    store.add("embed.weight", {1}, llmt::ParamKind::embedding, {});
    store.add("layers.0.bias", {1}, llmt::ParamKind::bias, {});
    store.allocate(*backend, llmt::DType::f64);
    set(store.flat_params(), {1.0, -2.0, /*norm*/ 0.5, 1.5, /*embedding*/ 4.0, /*bias*/ 0.25});
    set(store.flat_grads(), {0.1, -0.2, /*norm*/ 0.3, 0.0, /*embedding*/ 0.0, /*bias*/ -0.5});
  }
  /// Writes the packed values into the parameters' slices of t (a flat buffer over the store's extent).
  void set(const llmt::Tensor& t, std::vector<double> values) {
    REQUIRE(static_cast<int64_t>(values.size()) == store.count());
    std::vector<double> full(static_cast<size_t>(t.numel()), 0.0);
    size_t at = 0;
    for (const llmt::ParamInfo& p : store.infos())
      for (int64_t e = 0; e < p.numel; ++e) full[static_cast<size_t>(p.offset + e)] = values[at++];
    backend->upload(full.data(), t);
  }
  /// t's elements (the whole extent).
  std::vector<double> all(const llmt::Tensor& t) {
    std::vector<double> out(static_cast<size_t>(t.numel()));
    backend->download(t, out.data());
    return out;
  }
  /// The parameters' elements of t, packed; every gap element must be 0.
  std::vector<double> get(const llmt::Tensor& t) {
    const std::vector<double> full = all(t);
    std::vector<double> out;
    std::vector<bool> in_param(full.size(), false);
    for (const llmt::ParamInfo& p : store.infos())
      for (int64_t e = 0; e < p.numel; ++e) {
        out.push_back(full[static_cast<size_t>(p.offset + e)]);
        in_param[static_cast<size_t>(p.offset + e)] = true;
      }
    for (size_t i = 0; i < full.size(); ++i)
      if (!in_param[i]) CHECK(full[i] == 0.0);
    return out;
  }
};

TrainConfig adamw_config() {
  TrainConfig t;
  t.weight_decay = 0.1;
  t.weight_decay_exclude = {"norm"};
  t.beta1 = 0.9;
  t.beta2 = 0.95;
  t.eps = 1e-8;
  return t;
}

}  // namespace

TEST_CASE("AdamW: one step by hand, weight decay excluded for norm parameters", "[adamw]") {
  TinyModel tm;
  for (const llmt::ParamInfo& info : tm.store.infos()) CHECK(info.offset % llmt::kParamAlign == 0);
  CHECK(tm.store.count() == 6);
  CHECK(tm.store.total() == 3 * llmt::kParamAlign + 1);
  llmt::AdamW opt(tm.store, adamw_config());
  CHECK(opt.decays(0));        // weight
  CHECK_FALSE(opt.decays(1));  // norm: excluded
  CHECK(opt.decays(2));        // embedding
  CHECK(opt.decays(3));        // bias
  CHECK(opt.steps_taken() == 0);
  CHECK(tm.get(opt.m()) == std::vector<double>(6, 0.0));
  CHECK(tm.get(opt.v()) == std::vector<double>(6, 0.0));

  opt.step(0.01, 1.0);
  CHECK(opt.steps_taken() == 1);

  // Step t = 1, lr 0.01, wd 0.1, beta1 0.9, beta2 0.95, eps 1e-8, g = grad:
  //   m = 0.1 g, v = 0.05 g^2;  step_size = lr / (1 - 0.9) = 0.1;  sqrt(1 - 0.95) = sqrt(0.05)
  //   sqrt(v) / sqrt(0.05) = |g|  ->  update = 0.1 * 0.1 g / (|g| + eps) = 0.01 g / (|g| + eps)
  //   decayed:     p' = p (1 - 0.01 * 0.1) - update = 0.999 p - update
  //   not decayed: p' = p - update
  const std::vector<double> p = tm.get(tm.store.flat_params());
  // weight: 0.999 * 1 - 0.01 * 0.1 / (0.1 + 1e-8) = 0.999 - 0.00999999900000010 = 0.9890000009999999
  CHECK(p[0] == near(0.999 * 1.0 - 0.01 * 0.1 / (0.1 + 1e-8)));
  CHECK(p[0] == Approx(0.98900000099999990).epsilon(1e-13));
  // weight: 0.999 * -2 + 0.01 * 0.2 / (0.2 + 1e-8) = -1.998 + 0.0099999995 = -1.9880000005
  CHECK(p[1] == near(-1.998 + 0.01 * 0.2 / (0.2 + 1e-8)));
  CHECK(p[1] == Approx(-1.9880000005).epsilon(1e-13));
  // norm (no decay): 0.5 - 0.01 * 0.3 / (0.3 + 1e-8) = 0.5 - 0.009999999666666678
  CHECK(p[2] == near(0.5 - 0.01 * 0.3 / (0.3 + 1e-8)));
  CHECK(p[2] == Approx(0.490000000333333322).epsilon(1e-13));
  // norm with g = 0: no update and no decay, stays exactly 1.5 (decayed it would be 1.4985)
  CHECK(p[3] == 1.5);
  // embedding with g = 0: decay only, 0.999 * 4 = 3.996
  CHECK(p[4] == near(3.996));
  // bias (decayed): 0.999 * 0.25 + 0.01 * 0.5 / (0.5 + 1e-8) = 0.24975 + 0.0099999998 = 0.2597499998
  CHECK(p[5] == near(0.24975 + 0.01 * 0.5 / (0.5 + 1e-8)));
  CHECK(p[5] == Approx(0.2597499998).epsilon(1e-13));

  // moments: m = 0.1 g, v = 0.05 g^2
  const std::vector<double> m = tm.get(opt.m()), v = tm.get(opt.v());
  const std::vector<double> m_expect{0.01, -0.02, 0.03, 0.0, 0.0, -0.05};
  const std::vector<double> v_expect{0.0005, 0.002, 0.0045, 0.0, 0.0, 0.0125};
  for (size_t i = 0; i < 6; ++i) {
    CHECK(m[i] == near(m_expect[i]));
    CHECK(v[i] == near(v_expect[i]));
  }
  // the optimizer does not touch the gradients
  CHECK(tm.get(tm.store.flat_grads()) == std::vector<double>{0.1, -0.2, 0.3, 0.0, 0.0, -0.5});
}

TEST_CASE("AdamW: second step uses bias correction with the new step count", "[adamw]") {
  TinyModel tm;
  llmt::AdamW opt(tm.store, adamw_config());
  opt.step(0.01, 1.0);
  opt.step(0.01, 1.0);  // same gradients again
  CHECK(opt.steps_taken() == 2);
  // Step t = 2 with the same g: m = 0.9 * 0.1 g + 0.1 g = 0.19 g;  v = 0.95 * 0.05 g^2 + 0.05 g^2 = 0.0975 g^2
  //   step_size = lr / (1 - 0.81) = lr / 0.19;  sqrt(v) / sqrt(1 - 0.9025) = |g|
  //   update = (lr / 0.19) * 0.19 g / (|g| + eps) = 0.01 g / (|g| + eps), the same as step 1.
  // weight[0]: p1 = 0.999 - u, p2 = 0.999 p1 - u with u = 0.01 * 0.1 / (0.1 + 1e-8)
  const double u0 = 0.01 * 0.1 / (0.1 + 1e-8);
  const double p1 = 0.999 - u0;
  const std::vector<double> p = tm.get(tm.store.flat_params());
  CHECK(p[0] == near(0.999 * p1 - u0));
  // norm[0] (no decay): 0.5 - 2 u with u = 0.01 * 0.3 / (0.3 + 1e-8)
  CHECK(p[2] == near(0.5 - 2 * (0.01 * 0.3 / (0.3 + 1e-8))));
  // embedding (g = 0): 4 * 0.999^2 = 3.992004
  CHECK(p[4] == near(3.992004));
  const std::vector<double> m = tm.get(opt.m()), v = tm.get(opt.v());
  CHECK(m[0] == near(0.019));    // 0.19 * 0.1
  CHECK(v[0] == near(0.000975)); // 0.0975 * 0.01
}

TEST_CASE("AdamW: grad_scale scales the gradients", "[adamw]") {
  TinyModel tm;
  TrainConfig t = adamw_config();
  t.eps = 1e-3;  // a large eps so that the update itself depends on the gradient scale
  llmt::AdamW opt(tm.store, t);
  opt.step(0.01, 0.5);
  CHECK(opt.steps_taken() == 1);
  // g = 0.5 * grad.  m = 0.1 g, v = 0.05 g^2; update = 0.1 * 0.1 g / (|g| + 1e-3)
  // weight[0]: g = 0.05: update = 0.01 * 0.05 / 0.051 = 0.00980392156862745
  //   p = 0.999 - 0.00980392156862745 = 0.98919607843137255 (unscaled it would be 0.999 - 0.001/0.101)
  const std::vector<double> p = tm.get(tm.store.flat_params());
  CHECK(p[0] == near(0.999 - 0.01 * 0.05 / (0.05 + 1e-3)));
  CHECK(p[0] == Approx(0.98919607843137255).epsilon(1e-13));
  // norm[0]: g = 0.15, no decay: 0.5 - 0.01 * 0.15 / 0.151
  CHECK(p[2] == near(0.5 - 0.01 * 0.15 / (0.15 + 1e-3)));
  const std::vector<double> m = tm.get(opt.m()), v = tm.get(opt.v());
  CHECK(m[0] == near(0.005));       // 0.1 * 0.05
  CHECK(m[1] == near(-0.01));       // 0.1 * 0.5 * -0.2
  CHECK(v[0] == near(0.000125));    // 0.05 * 0.05^2
  CHECK(v[5] == near(0.003125));    // 0.05 * (0.5 * -0.5)^2
}

TEST_CASE("AdamW: weight_decay 0 decays nothing; set_steps_taken", "[adamw]") {
  TinyModel tm;
  TrainConfig t = adamw_config();
  t.weight_decay = 0;
  t.weight_decay_exclude = {};
  llmt::AdamW opt(tm.store, t);
  for (int i = 0; i < 4; ++i) CHECK_FALSE(opt.decays(i));
  opt.set_steps_taken(9);
  opt.step(0.01, 1.0);
  CHECK(opt.steps_taken() == 10);
  // t = 10: m = 0.1 g, v = 0.05 g^2 (zero moments before); step_size = 0.01 / (1 - 0.9^10);
  //   sqrt(v) / sqrt(1 - 0.95^10) = |g| sqrt(0.05 / (1 - 0.95^10))
  //   0.9^10 = 0.3486784401, 0.95^10 = 0.5987369392383789
  //   embedding (g = 0): no decay, stays 4
  const std::vector<double> p = tm.get(tm.store.flat_params());
  CHECK(p[4] == 4.0);
  // weight[0]: g = 0.1: 1 - (0.01 / 0.6513215599) * 0.01 / (0.1 * sqrt(0.05 / 0.4012630607616211) + 1e-8)
  CHECK(p[0] == near(1.0 - (0.01 / 0.6513215599) * 0.01 / (0.1 * std::sqrt(0.05 / 0.4012630607616211) + 1e-8)));
}
