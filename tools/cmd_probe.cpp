// llmtrain probe: one mixer layer, forward and backward, on the CPU backend; its
// parameters are named as in docs/spec (flash-linear-attention names without the
// model.layers.N.attn. prefix).
#include <fmt/format.h>

#include <set>
#include <vector>

#include "core/error.h"
#include "core/rng.h"
#include "core/safetensors.h"
#include "kernels/backend.h"
#include "model/config.h"
#include "model/gradcheck.h"
#include "model/mixer.h"
#include "tools/commands.h"

namespace llmt::cli {
namespace {

/// The dimensions of a probe when no config is given (also those of --selftest).
ModelConfig tiny_model() {
  ModelConfig m;
  m.d_model = 8;
  m.attn.num_heads = 2;
  m.attn.head_dim = 4;
  m.gdn.num_heads = 2;
  m.gdn.head_dim = 4;
  m.gdn.chunk_size = 4;  // T = 5 below: one full and one partial chunk
  m.comba.num_heads = 2;
  m.comba.head_dim = 4;
  m.comba.chunk_size = 4;
  m.kda.num_heads = 2;
  m.kda.head_dim = 4;
  m.kda.expand_v = 2;  // d_v = 8 != d_k: the low-rank width d_v and the key channels are told apart
  m.kda.chunk_size = 4;
  m.mamba2.expand = 2;  // Di = 16: H = 4 heads of P = 4 in G = 2 groups, N = 3 (told apart from P)
  m.mamba2.head_dim = 4;
  m.mamba2.d_state = 3;
  m.mamba2.n_groups = 2;
  m.mamba2.chunk_size = 4;
  m.mamba3.expand = 2;  // Di = 16: H = 4 heads of P = 4 in G = 2 groups, N = 6 (S = 1 angle; 2..5 unrotated)
  m.mamba3.head_dim = 4;
  m.mamba3.d_state = 6;
  m.mamba3.n_groups = 2;
  m.mamba3.chunk_size = 4;
  m.mdn.num_heads = 2;
  m.mdn.head_dim = 4;
  m.mdn.chunk_size = 4;
  m.mdn.min_log_mu = -1.0;  // the floor clamps some tokens of the self-test (its zero gradient is checked too)
  m.init_std = 0.5;  // large enough that every path of the layer matters in the check
  return m;
}

std::vector<double> random_values(int64_t n, uint64_t stream) {
  Philox rng(2024, stream);
  std::vector<double> v(static_cast<size_t>(n));
  for (double& x : v) x = rng.normal();
  return v;
}

/// Host f64 values -> a tensor of the store's dtype (CPU backend memory is host memory).
void store_values(const std::vector<double>& v, const Tensor& t) {
  for (int64_t i = 0; i < t.numel(); ++i) {
    if (t.dtype == DType::f64)
      t.as<double>()[i] = v[i];
    else
      t.as<float>()[i] = static_cast<float>(v[i]);
  }
}

std::vector<double> values_of(const Tensor& t) {
  std::vector<double> v(static_cast<size_t>(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) v[i] = t.dtype == DType::f64 ? t.as<double>()[i] : t.as<float>()[i];
  return v;
}

/// The mixer's saved activations for [B * T, D] inputs (returned) and its temporaries (`scratch`),
/// bound as Model::plan binds a block's (model/scratch.h).
Buffer plan_mixer(Backend& be, Mixer& mixer, int64_t B, int64_t T, Buffer& scratch) {
  Buffer saved = bind_scratch(be, [&](void* base) {
    ScratchCarver carver(base);
    mixer.plan(B, T, carver);
    return carver.used();
  });
  scratch = bind_scratch(be, [&](void* base) {
    ScratchCarver carver(base);
    mixer.bind_scratch(carver);
    return carver.used();
  });
  return saved;
}

int selftest(const std::string& type) {
  auto be = make_cpu_backend();
  ModelConfig mc = tiny_model();
  mc.comba.decay_init = 0.3;         // away from the defaults (1.0): sigma(decay) and D enter distinguishably
  mc.comba.correction_factor = 0.7;
  const int64_t B = 2, T = 5, D = mc.d_model, rows = B * T;
  ParamStore store;
  auto mixer = make_mixer(type, mc, store, "");
  store.allocate(*be, DType::f64);
  store.initialize(7);
  Buffer scratch;
  const Buffer saved = plan_mixer(*be, *mixer, B, T, scratch);
  OwnedTensor x(*be, DType::f64, {rows, D}), y(*be, DType::f64, {rows, D}), dx(*be, DType::f64, {rows, D}),
      r(*be, DType::f64, {rows, D});
  store_values(random_values(rows * D, 1), *x);
  store_values(random_values(rows * D, 2), *r);

  const auto loss = [&]() {
    mixer->forward(*x, *y);
    double s = 0;
    for (int64_t i = 0; i < rows * D; ++i) s += y->as<double>()[i] * r->as<double>()[i];
    return s;
  };
  loss();
  be->fill_zero(store.flat_grads());
  mixer->backward(*x, *r, *dx);
  std::vector<GradCheckInput> inputs{{"x", *x, values_of(*dx)}};
  for (size_t i = 0; i < store.infos().size(); ++i)
    inputs.push_back({store.infos()[i].name, store.param(static_cast<int>(i)), values_of(store.grad(static_cast<int>(i)))});
  const auto reports = finite_difference_check(loss, inputs, 1e-5, 1e-6, 1e-8, 1 << 20);
  bool ok = true;
  for (const auto& rep : reports) {
    fmt::print("{:<24} {:>5} elements  max abs err {:.3e}  max rel err {:.3e}  {}\n", rep.name, rep.checked,
               rep.max_abs_error, rep.max_rel_error, rep.ok ? "ok" : "FAIL");
    if (!rep.ok) fmt::print("  {}\n", describe(rep));
    ok = ok && rep.ok;
  }
  fmt::print("probe --mixer {} --selftest: {}\n", type, ok ? "passed" : "FAILED");
  return ok ? 0 : 1;
}

}  // namespace

int probe(const ProbeArgs& a) {
  if (a.selftest) return selftest(a.mixer);
  auto be = make_cpu_backend();
  const ModelConfig mc = a.config.empty() ? tiny_model() : load_config(a.config).model;
  if (!a.config.empty()) {
    bool used = false;
    for (int64_t l = 0; l < mc.n_layers; ++l) used = used || mc.mixer_of(l) == a.mixer;
    check(used, "probe --mixer {}: {} has no {} layer (model.type {}); give a config whose model uses that mixer, "
          "or no --config for the built-in tiny dimensions", a.mixer, a.config, a.mixer, mc.type);
  }
  const DType dt = a.dtype == "f64" ? DType::f64 : DType::f32;
  ParamStore store;
  auto mixer = make_mixer(a.mixer, mc, store, "");
  store.allocate(*be, dt);
  store.initialize(0);

  int64_t B = a.batch, T = a.seq_len;
  const int64_t D = mc.d_model;
  std::vector<double> x = random_values(B * T * D, 1), dy;
  if (!a.inputs.empty()) {
    const SafetensorsFile in(a.inputs);
    // Inputs are x, dy and parameters; the outputs of an earlier --out (y, dx, grad.*) are
    // ignored, so such a file can be fed back to reproduce it.
    std::set<std::string> known{"x", "dy", "y", "dx"};
    for (const auto& info : store.infos()) known.insert(info.name);
    for (const auto& [name, info] : in.tensors())
      check(known.count(name) != 0 || name.rfind("grad.", 0) == 0,
            "{}: unexpected tensor {}; expected x, dy or a parameter of {}", a.inputs, name, a.mixer);
    if (in.contains("x")) {
      const auto& shape = in.info("x").shape;
      check(shape.size() == 3 && shape[2] == D, "{}: x must be [B, T, {}]", a.inputs, D);
      B = shape[0];
      T = shape[1];
      x = in.read_f64("x");
    }
    if (in.contains("dy")) {
      check(in.info("dy").shape == std::vector<int64_t>{B, T, D}, "{}: dy must have the shape of x", a.inputs);
      dy = in.read_f64("dy");
    }
    for (size_t i = 0; i < store.infos().size(); ++i) {
      const ParamInfo& p = store.infos()[i];
      if (!in.contains(p.name)) continue;
      check(in.info(p.name).shape == p.shape, "{}: parameter {} has the wrong shape", a.inputs, p.name);
      store_values(in.read_f64(p.name), store.param(static_cast<int>(i)));
    }
  }
  if (dy.empty()) dy = random_values(B * T * D, 2);

  const int64_t rows = B * T;
  Buffer scratch;
  const Buffer saved = plan_mixer(*be, *mixer, B, T, scratch);
  OwnedTensor tx(*be, dt, {rows, D}), ty(*be, dt, {rows, D}), tdx(*be, dt, {rows, D}), tdy(*be, dt, {rows, D});
  store_values(x, *tx);
  store_values(dy, *tdy);
  mixer->forward(*tx, *ty);
  mixer->backward(*tx, *tdy, *tdx);

  fmt::print("probe --mixer {}: x [{}, {}, {}] {}, {} parameters\n", a.mixer, B, T, D, a.dtype, store.total());
  if (!a.out.empty()) {
    // The outputs, then the inputs that produced them (so the file can be fed back with --inputs).
    std::vector<SafetensorsEntry> out{{"y", dt, {B, T, D}, ty->data}, {"dx", dt, {B, T, D}, tdx->data}};
    for (size_t i = 0; i < store.infos().size(); ++i)
      out.push_back({"grad." + store.infos()[i].name, dt, store.infos()[i].shape, store.grad(static_cast<int>(i)).data});
    out.push_back({"x", dt, {B, T, D}, tx->data});
    out.push_back({"dy", dt, {B, T, D}, tdy->data});
    for (size_t i = 0; i < store.infos().size(); ++i)
      out.push_back({store.infos()[i].name, dt, store.infos()[i].shape, store.param(static_cast<int>(i)).data});
    write_safetensors(a.out, out);
    fmt::print("wrote y, dx, {} parameter gradients and the inputs (x, dy, parameters) to {}\n",
               store.infos().size(), a.out);
  }
  return 0;
}

}  // namespace llmt::cli
