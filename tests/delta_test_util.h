// Helpers shared by the delta-rule core tests (gdn_test, comba_test, kda_test, mdn_test): tolerances,
// tensor sizes of a DeltaDims, inputs shaped like the ones the layers feed the cores, and the checks
// every core gets (layers-delta.md §6): chunked vs. recurrent in float64, finite differences, float vs.
// double, and the [B, T, H, *] layout. For the single-state cores (namespace delta_core) the problems, the
// typed calls and these checks are templates over a Core struct that names the core's functions and how its
// inputs differ (Comba's p̂, KDA's per-channel g), so that every core gets the same inputs and checks.
#pragma once
#include <cmath>
#include <cstddef>
#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <utility>
#include <vector>

#include "core/rng.h"
#include "kernels/cpu/gdn.h"
#include "vec_util.h"

namespace llmt::test {

// Chunked and recurrent forms are algebraically equal; in float64 they differ by rounding only.
constexpr double kChunkTol = 1e-10;
// Central differences with h = 1e-6: truncation ~ h^2 |L'''| ~ 1e-12, rounding ~ 1e-16 |L| / h ~ 1e-9
// against O(1) gradients; a wrong term gives an error of order 1.
constexpr double kFdStep = 1e-6;
constexpr double kFdTol = 1e-7;
// float (24-bit mantissa) against double after the cores' few hundred operations per output.
constexpr double kF32Tol = 1e-5;

inline size_t qk_size(const cpu::DeltaDims& d) { return static_cast<size_t>(d.batch * d.seq_len * d.heads * d.key_dim); }
inline size_t v_size(const cpu::DeltaDims& d) { return static_cast<size_t>(d.batch * d.seq_len * d.heads * d.value_dim); }
inline size_t tok_size(const cpu::DeltaDims& d) { return static_cast<size_t>(d.batch * d.seq_len * d.heads); }
inline size_t state_size(const cpu::DeltaDims& d) {
  return static_cast<size_t>(d.batch * d.heads * d.key_dim * d.value_dim);
}

/// Rescales every row of `dim` values of x to Euclidean length `length` (the L2-normalised,
/// possibly scaled q^, k^, p^ the cores receive).
inline void set_row_lengths(Vec& x, int64_t dim, double length) {
  for (size_t row = 0; row < x.size() / static_cast<size_t>(dim); ++row) {
    double ss = 0.0;
    for (int64_t c = 0; c < dim; ++c) ss += x[row * dim + c] * x[row * dim + c];
    for (int64_t c = 0; c < dim; ++c) x[row * dim + c] *= length / std::sqrt(ss);
  }
}

/// n values uniform in [lo, hi) from Philox(seed, stream) (log-decays g).
inline Vec uniform_values(size_t n, double lo, double hi, uint64_t seed, uint64_t stream) {
  Philox rng(seed, stream);
  Vec x(n);
  for (double& e : x) e = lo + (hi - lo) * rng.uniform();
  return x;
}

/// The logistic sigmoid of every element (betas from normal pre-activations).
inline Vec sigmoid_of(Vec x) {
  for (double& e : x) e = 1.0 / (1.0 + std::exp(-e));
  return x;
}

/// Central differences (step kFdStep) of loss() w.r.t. every element of x, an array that loss() reads:
/// x[i] is moved by ±kFdStep in place and restored.
template <class Loss>
Vec fd_in_place(Vec& x, Loss loss) {
  Vec grad(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double xi = x[i];
    x[i] = xi + kFdStep;
    const double up = loss();
    x[i] = xi - kFdStep;
    const double down = loss();
    x[i] = xi;
    grad[i] = (up - down) / (2.0 * kFdStep);
  }
  return grad;
}

/// Head (b, h) of a [B, T, H, width] tensor as [T, width].
inline Vec head_rows(const Vec& x, const cpu::DeltaDims& d, int64_t b, int64_t h, int64_t width) {
  Vec out;
  for (int64_t t = 0; t < d.seq_len; ++t) {
    const int64_t row = (b * d.seq_len + t) * d.heads + h;
    out.insert(out.end(), x.begin() + row * width, x.begin() + (row + 1) * width);
  }
  return out;
}

/// Head (b, h) of a [B, H, K, V] state as [K, V].
inline Vec head_state(const Vec& s, const cpu::DeltaDims& d, int64_t b, int64_t h) {
  const int64_t kv = d.key_dim * d.value_dim, head = b * d.heads + h;
  return Vec(s.begin() + head * kv, s.begin() + (head + 1) * kv);
}

// The harness of the single-state cores (gdn, comba, kda); mdn_test, with its second state, keeps its own
// and uses only the layout helpers above. A test describes its core by a struct Core with
//   static constexpr CoreSpec kSpec: what its inputs are, and
//   template <typename T> static constexpr CoreFns kFns{rec_fwd<T>, chunk_fwd<T>, rec_bwd<T>, chunk_bwd<T>}.
namespace delta_core {

/// How a core's inputs differ: has_p, Comba's p̂ [B, T, H, K] (between v and g in its Inputs and Grads);
/// g_per_channel, g [B, T, H, K] (KDA) rather than [B, T, H] (one log-decay per token: GDN, Comba);
/// g_seed, the Philox seed g is drawn from.
struct CoreSpec {
  bool has_p, g_per_channel;
  uint64_t g_seed;
};

/// The four functions of a core for element type T: In and G are its Inputs and Grads structs of pointers
/// (e.g. GdnInputs<T>, GdnGrads<T>); deduced from the functions (e.g. gdn_recurrent_fwd<T>, gdn_chunk_fwd<T>,
/// gdn_recurrent_bwd<T>, gdn_chunk_bwd<T>).
template <typename T, class In, class G>
struct CoreFns {
  using Inputs = In;
  using GradViews = G;
  void (*recurrent_fwd)(const In&, const cpu::DeltaDims&, T*, T*);
  void (*chunk_fwd)(const In&, const cpu::DeltaDims&, T*, T*, int64_t);
  void (*recurrent_bwd)(const In&, const T*, const T*, const cpu::DeltaDims&, const G&);
  void (*chunk_bwd)(const In&, const T*, const T*, const cpu::DeltaDims&, const G&, int64_t);
};
template <typename T, class In, class G>
CoreFns(void (*)(const In&, const cpu::DeltaDims&, T*, T*), void (*)(const In&, const cpu::DeltaDims&, T*, T*, int64_t),
        void (*)(const In&, const T*, const T*, const cpu::DeltaDims&, const G&),
        void (*)(const In&, const T*, const T*, const cpu::DeltaDims&, const G&, int64_t)) -> CoreFns<T, In, G>;

/// One problem of a core, float64, [B, T, H, *] layout: p empty for a core without p̂, s0 empty for no
/// initial state.
struct Problem {
  cpu::DeltaDims d;
  Vec q, k, v, p, g, beta, s0;
};

/// Values of g per token: K for a per-channel decay, else 1.
template <class Core>
int64_t g_width(const cpu::DeltaDims& d) {
  return Core::kSpec.g_per_channel ? d.key_dim : 1;
}

/// Core inputs as the layer produces them: q̂ = l2norm(q) / sqrt(K), k̂ = l2norm(k), p̂ = l2norm(p) (drawn
/// independently of k̂: in the layer p̂ ≈ k̂, §4.2, and the core must not rely on it), g uniform in
/// [g_min, g_max] (<= 0, independently per channel where g is), beta = sigmoid(normal); s0 normal when
/// with_state. Streams seed + 0 .. 6 for q, k, v, beta, s0, g, p; g from Philox(Core::kSpec.g_seed, seed + 5).
template <class Core>
Problem make_problem(cpu::DeltaDims d, double g_min, double g_max, bool with_state, uint64_t seed) {
  constexpr CoreSpec spec = Core::kSpec;
  Problem p{d,
            randn(qk_size(d), seed),
            randn(qk_size(d), seed + 1),
            randn(v_size(d), seed + 2),
            spec.has_p ? randn(qk_size(d), seed + 6) : Vec(),
            uniform_values(tok_size(d) * g_width<Core>(d), g_min, g_max, spec.g_seed, seed + 5),
            sigmoid_of(randn(tok_size(d), seed + 3)),
            with_state ? randn(state_size(d), seed + 4) : Vec()};
  set_row_lengths(p.q, d.key_dim, 1.0 / std::sqrt(static_cast<double>(d.key_dim)));
  set_row_lengths(p.k, d.key_dim, 1.0);
  if (spec.has_p) set_row_lengths(p.p, d.key_dim, 1.0);
  return p;
}

/// Pointers to the input arrays of p (a Problem or const Problem) in the order of the core's Inputs and
/// Grads: q, k, v, p (only where the core has it), g, beta, s0.
template <class Core, class P>
auto arrays(P& p) {
  std::vector<decltype(&p.q)> a{&p.q, &p.k, &p.v};
  if (Core::kSpec.has_p) a.push_back(&p.p);
  a.insert(a.end(), {&p.g, &p.beta, &p.s0});
  return a;
}

/// View{ptr(0), ..., ptr(N - 1)} for the N input arrays of Core: its Inputs or Grads struct of pointers.
template <class View, class Core, class Ptr>
View pointer_struct(Ptr ptr) {
  const auto make = [&](auto... i) { return View{ptr(i)...}; };
  if constexpr (Core::kSpec.has_p)
    return make(0, 1, 2, 3, 4, 5, 6);
  else
    return make(0, 1, 2, 3, 4, 5);
}

/// Typed copies of a problem's input arrays and the core's Inputs view of them (s0 empty: nullptr).
template <class Core, typename T>
class TypedInputs {
 public:
  explicit TypedInputs(const Problem& p) {
    for (const Vec* x : arrays<Core>(p)) a_.push_back(cast<T>(*x));
  }
  auto inputs() const {
    using Inputs = typename decltype(Core::template kFns<T>)::Inputs;
    return pointer_struct<Inputs, Core>([&](size_t i) { return a_[i].empty() ? nullptr : a_[i].data(); });
  }

 private:
  std::vector<std::vector<T>> a_;
};

/// Outputs of one forward call, widened to double: o [B, T, H, V] and the final state [B, H, K, V].
struct Out {
  Vec o, state;
};

/// The gradients of one backward call, widened to double, in the order of arrays().
using Grads = std::vector<Vec>;

/// One forward call on p in element type T: chunk 0 the recurrent form, any other chunk the chunked one
/// (chunk < 0 must throw llmt::Error).
template <class Core, typename T = double>
Out forward(const Problem& p, int64_t chunk) {
  constexpr auto fns = Core::template kFns<T>;
  const TypedInputs<Core, T> in(p);
  std::vector<T> o(v_size(p.d)), s(state_size(p.d));
  if (chunk == 0)
    fns.recurrent_fwd(in.inputs(), p.d, o.data(), s.data());
  else
    fns.chunk_fwd(in.inputs(), p.d, o.data(), s.data(), chunk);
  return {widen(o), widen(s)};
}

/// One backward call on p in element type T, chunk as in forward(), for dL/do = d_o and dL/dS_T = d_state
/// (empty: nullptr, zero). The gradient buffers start as randn(size, stream), streams dq 91, dk 92, dv 93,
/// dp 97, dg 94, dbeta 95, ds0 96: the core must overwrite every value.
template <class Core, typename T = double>
Grads backward(const Problem& p, const Vec& d_o, const Vec& d_state, int64_t chunk) {
  constexpr auto fns = Core::template kFns<T>;
  using GradViews = typename decltype(fns)::GradViews;
  const cpu::DeltaDims& d = p.d;
  std::vector<std::pair<size_t, uint64_t>> shapes{{qk_size(d), 91}, {qk_size(d), 92}, {v_size(d), 93}};
  if (Core::kSpec.has_p) shapes.push_back({qk_size(d), 97});
  shapes.insert(shapes.end(), {{tok_size(d) * g_width<Core>(d), 94}, {tok_size(d), 95}, {state_size(d), 96}});
  std::vector<std::vector<T>> g;
  for (const auto& [n, stream] : shapes) g.push_back(cast<T>(randn(n, stream)));
  const GradViews out = pointer_struct<GradViews, Core>([&](size_t i) { return g[i].data(); });
  const TypedInputs<Core, T> in(p);
  const auto dout = cast<T>(d_o), dst = cast<T>(d_state);
  const T* dst_ptr = d_state.empty() ? nullptr : dst.data();
  if (chunk == 0)
    fns.recurrent_bwd(in.inputs(), dout.data(), dst_ptr, d, out);
  else
    fns.chunk_bwd(in.inputs(), dout.data(), dst_ptr, d, out, chunk);
  Grads widened;
  for (const auto& x : g) widened.push_back(widen(x));
  return widened;
}

/// CHECKs rel_err(a[i], ref[i]) < tol for every gradient i; returns the largest error (for reporting).
inline double check_grads_close(const Grads& a, const Grads& ref, double tol) {
  REQUIRE(a.size() == ref.size());
  double worst = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    INFO("gradient " << i);
    const double e = rel_err(a[i], ref[i]);
    CHECK(e < tol);
    worst = std::max(worst, e);
  }
  return worst;
}

/// A hand-computed case: o and the final state equal o_ref, s_ref to 1e-15.
inline void check_out_matches(const Out& f, const Vec& o_ref, const Vec& s_ref) {
  REQUIRE(f.o.size() == o_ref.size());
  REQUIRE(f.state.size() == s_ref.size());
  for (size_t i = 0; i < o_ref.size(); ++i) CHECK(f.o[i] == Approx(o_ref[i]).margin(1e-15));
  for (size_t i = 0; i < s_ref.size(); ++i) CHECK(f.state[i] == Approx(s_ref[i]).margin(1e-15));
}

/// Runs f(p, chunk) over the grid of the chunked-vs-recurrent tests: T in {1, 63, 64, 65, 200} (partial,
/// exact and multiple chunks), chunk in {16, 64}, with and without an initial state, g_min in {-0.05, -5.0}
/// (weak and strong decay); p = make_problem<Core>({2, T, 2, 8, 6}, g_min, -0.001, with_state, 100 + T).
template <class Core, class F>
void for_each_chunk_case(F f) {
  for (int64_t T : {1, 63, 64, 65, 200})
    for (int64_t chunk : {16, 64})
      for (bool with_state : {false, true})
        for (double g_min : {-0.05, -5.0}) {
          INFO("T " << T << " chunk " << chunk << " initial state " << with_state << " g_min " << g_min);
          f(make_problem<Core>({2, T, 2, 8, 6}, g_min, -0.001, with_state, 100 + T), chunk);
        }
}

/// Chunked forward (chunk) against the recurrent one (0), o and S_T within kChunkTol; returns the larger error.
template <class Core>
double check_chunk_fwd(const Problem& p, int64_t chunk) {
  const Out ref = forward<Core>(p, 0), chk = forward<Core>(p, chunk);
  const double eo = rel_err(chk.o, ref.o), es = rel_err(chk.state, ref.state);
  CHECK(eo < kChunkTol);
  CHECK(es < kChunkTol);
  return std::max(eo, es);
}

/// Chunked backward against the recurrent one within kChunkTol, for random dL/do (stream 200 + T) with
/// random dL/dS_T (stream 300 + T) and without it; returns the largest error.
template <class Core>
double check_chunk_bwd(const Problem& p, int64_t chunk) {
  const cpu::DeltaDims& d = p.d;
  const Vec d_o = randn(v_size(d), 200 + d.seq_len), d_state = randn(state_size(d), 300 + d.seq_len);
  const double e =
      check_grads_close(backward<Core>(p, d_o, d_state, chunk), backward<Core>(p, d_o, d_state, 0), kChunkTol);
  return std::max(e,
                  check_grads_close(backward<Core>(p, d_o, Vec(), chunk), backward<Core>(p, d_o, Vec(), 0), kChunkTol));
}

/// Central differences (step kFdStep) of L = o·R + S_T·R_S w.r.t. every element of x, an input array of
/// the problem that fwd() (the recurrent forward, -> Out) reads.
template <class Fwd>
Vec fd_loss_grad(Vec& x, Fwd fwd, const Vec& R, const Vec& RS) {
  return fd_in_place(x, [&] {
    const Out out = fwd();
    return dot(out.o, R) + dot(out.state, RS);
  });
}

/// The finite-difference test: for g_min in {-0.1, -3.0}, p = make_problem<Core>({2, 9, 2, 3, 2}, g_min,
/// -0.01, true, 400); the recurrent (chunk 0) and chunked (chunk 4: T = 9 ends on a partial chunk) backward
/// of L = o·R + S_T·R_S (R, R_S random, streams 401, 402) against central differences of the recurrent
/// forward w.r.t. every input array, within kFdTol. Returns the worst errors {recurrent, chunked}.
template <class Core>
std::pair<double, double> check_fd() {
  double worst_rec = 0.0, worst_chk = 0.0;
  for (double g_min : {-0.1, -3.0}) {
    INFO("g_min " << g_min);
    Problem p = make_problem<Core>({2, 9, 2, 3, 2}, g_min, -0.01, true, 400);
    const Vec R = randn(v_size(p.d), 401), RS = randn(state_size(p.d), 402);
    const Grads ga = backward<Core>(p, R, RS, 0), gc = backward<Core>(p, R, RS, 4);
    Grads num;
    for (Vec* x : arrays<Core>(p)) num.push_back(fd_loss_grad(*x, [&] { return forward<Core>(p, 0); }, R, RS));
    worst_rec = std::max(worst_rec, check_grads_close(ga, num, kFdTol));
    worst_chk = std::max(worst_chk, check_grads_close(gc, num, kFdTol));
  }
  return {worst_rec, worst_chk};
}

/// The float-vs-double test: p = make_problem<Core>({2, 70, 2, 8, 6}, -2.0, -0.01, true, 500); float against
/// double within kF32Tol for the recurrent (chunk 0) and chunked (16) forward and backward (dL/do, dL/dS_T
/// random, streams 501, 502). Returns the largest error.
template <class Core>
double check_float_vs_double() {
  const Problem p = make_problem<Core>({2, 70, 2, 8, 6}, -2.0, -0.01, true, 500);
  const Vec d_o = randn(v_size(p.d), 501), d_state = randn(state_size(p.d), 502);
  double worst = 0.0;
  for (int64_t chunk : {0, 16}) {
    INFO("chunk " << chunk);
    const Out fd = forward<Core, double>(p, chunk), ff = forward<Core, float>(p, chunk);
    const double eo = rel_err(ff.o, fd.o), es = rel_err(ff.state, fd.state);
    CHECK(eo < kF32Tol);
    CHECK(es < kF32Tol);
    worst = std::max({worst, eo, es,
                      check_grads_close(backward<Core, float>(p, d_o, d_state, chunk),
                                        backward<Core, double>(p, d_o, d_state, chunk), kF32Tol)});
  }
  return worst;
}

/// The [B, T, H, *] layout test: p = make_problem<Core>({2, 5, 3, 4, 3}, -1.0, -0.1, true, 10); for the
/// recurrent form and chunk 2, every head (b, h) of the batched call must equal, exactly, the call on that
/// head alone (dims {1, T, 1, K, V}).
template <class Core>
void check_layout() {
  const Problem p = make_problem<Core>({2, 5, 3, 4, 3}, -1.0, -0.1, true, 10);
  const cpu::DeltaDims d = p.d, one{1, d.seq_len, 1, d.key_dim, d.value_dim};
  const auto head = [&](const Vec& x, int64_t b, int64_t h, int64_t width) {
    return x.empty() ? Vec() : head_rows(x, d, b, h, width);
  };
  for (int64_t chunk : {0, 2}) {
    const Out all = forward<Core>(p, chunk);
    for (int64_t b = 0; b < d.batch; ++b)
      for (int64_t h = 0; h < d.heads; ++h) {
        const Problem s{one,
                        head(p.q, b, h, d.key_dim),
                        head(p.k, b, h, d.key_dim),
                        head(p.v, b, h, d.value_dim),
                        head(p.p, b, h, d.key_dim),
                        head(p.g, b, h, g_width<Core>(d)),
                        head(p.beta, b, h, 1),
                        head_state(p.s0, d, b, h)};
        const Out single = forward<Core>(s, chunk);
        CHECK(head_rows(all.o, d, b, h, d.value_dim) == single.o);
        CHECK(head_state(all.state, d, b, h) == single.state);
      }
  }
}

}  // namespace delta_core

}  // namespace llmt::test
