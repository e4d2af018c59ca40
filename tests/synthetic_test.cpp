// The synthetic tasks (docs/SYNTHETIC.md): generators deterministic per seed and correct by construction,
// checked by independent solvers written here from the task definitions; the window encoding; the source's
// rank slices and resume; config validation.
#include <catch2/catch.hpp>

#include <map>
#include <set>

#include "core/error.h"
#include "core/rng.h"
#include "data/synthetic_source.h"
#include "kernels/backend.h"
#include "model/model.h"
#include "train/synthetic_eval.h"
#include "data/synthetic_tasks.h"
#include "model/config.h"
#include "train/step.h"

using namespace llmt;

namespace {

// ---- independent solvers

/// MQAR: the key-value pairs are the first 2 K tokens; every answer is the value of the key just before it.
/// Checks the layout and returns the number of answers whose token is that value.
int64_t solve_mqar(const SyntheticExample& ex, int64_t pairs, int64_t vocab) {
  std::map<int32_t, int32_t> value_of;
  std::set<int32_t> values;
  for (int64_t i = 0; i < pairs; ++i) {
    const int32_t k = ex.tokens[2 * i], v = ex.tokens[2 * i + 1];
    REQUIRE(k >= 1);
    REQUIRE(k < vocab / 2);
    REQUIRE(v >= vocab / 2);
    REQUIRE(v < vocab);
    value_of[k] = v;
    values.insert(v);
  }
  REQUIRE(value_of.size() == static_cast<size_t>(pairs));  // distinct keys
  REQUIRE(values.size() == static_cast<size_t>(pairs));    // distinct values
  REQUIRE(ex.answers.size() == static_cast<size_t>(pairs));
  std::set<int32_t> queried;
  int64_t right = 0;
  for (int64_t a : ex.answers) {
    REQUIRE(a >= 2 * pairs + 1);
    REQUIRE((a - 2 * pairs) % 2 == 1);  // queries sit at even offsets of the query region
    const int32_t key = ex.tokens[a - 1];
    REQUIRE(value_of.count(key) == 1);
    queried.insert(key);
    right += ex.tokens[a] == value_of[key];
  }
  REQUIRE(queried.size() == static_cast<size_t>(pairs));  // every key queried once
  for (int32_t t : ex.tokens) {
    REQUIRE(t >= 0);
    REQUIRE(t < vocab);
  }
  return right;
}

/// Recursive-descent evaluation mod 5 of tokens [pos, end): expr = term (('+'|'-') term)*,
/// term = factor ('*' factor)*, factor = digit | '-' factor | '(' expr ')'.
struct Parser {
  const std::vector<int32_t>& t;
  size_t pos = 0;
  int64_t expr() {
    int64_t v = term();
    while (pos < t.size() && (t[pos] == synth::kPlus || t[pos] == synth::kMinus)) {
      const bool plus = t[pos++] == synth::kPlus;
      const int64_t r = term();
      v = plus ? v + r : v - r;
    }
    return v;
  }
  int64_t term() {
    int64_t v = factor();
    while (pos < t.size() && t[pos] == synth::kTimes) {
      ++pos;
      v *= factor();
    }
    return v;
  }
  int64_t factor() {
    REQUIRE(pos < t.size());
    const int32_t c = t[pos++];
    if (c == synth::kMinus) return -factor();
    if (c == synth::kOpen) {
      const int64_t v = expr();
      REQUIRE(pos < t.size());
      REQUIRE(t[pos++] == synth::kClose);
      return v;
    }
    REQUIRE(c >= 0);
    REQUIRE(c < synth::kModulus);
    return c;
  }
};

/// The value of the expression before '=' (checks that the parse consumes it all).
int32_t solve_modarith(const SyntheticExample& ex) {
  const std::vector<int32_t> expr(ex.tokens.begin(), ex.tokens.end() - 2);
  Parser p{expr};
  const int64_t v = p.expr();
  REQUIRE(p.pos == expr.size());
  return static_cast<int32_t>(((v % 5) + 5) % 5);
}

}  // namespace

TEST_CASE("synthetic: generators are deterministic per (seed, stream) and differ across seeds", "[synthetic]") {
  CHECK(make_mqar(7, 3, 256, 16, 8192, 0.01).tokens == make_mqar(7, 3, 256, 16, 8192, 0.01).tokens);
  CHECK(make_mqar(7, 3, 256, 16, 8192, 0.01).tokens != make_mqar(8, 3, 256, 16, 8192, 0.01).tokens);
  CHECK(make_mqar(7, 3, 256, 16, 8192, 0.01).tokens != make_mqar(7, 4, 256, 16, 8192, 0.01).tokens);
  CHECK(make_parity(7, 3, 100).tokens == make_parity(7, 3, 100).tokens);
  CHECK(make_parity(7, 3, 100).tokens != make_parity(9, 3, 100).tokens);
  for (bool brackets : {false, true}) {
    CHECK(make_modarith(7, 3, 99, brackets).tokens == make_modarith(7, 3, 99, brackets).tokens);
    CHECK(make_modarith(7, 3, 99, brackets).tokens != make_modarith(9, 3, 99, brackets).tokens);
  }
}

TEST_CASE("synthetic: MQAR examples answer every query with its key's value", "[synthetic]") {
  struct Point {
    int64_t length, pairs, vocab;
  };
  for (Point p : {Point{64, 4, 8192}, Point{256, 16, 8192}, Point{256, 64, 8192}, Point{512, 128, 8192},
                  Point{32, 8, 20}}) {
    INFO("length " << p.length << " pairs " << p.pairs << " vocab " << p.vocab);
    int64_t near = 0, queries = 0;
    for (uint64_t i = 0; i < 40; ++i) {
      const SyntheticExample ex = make_mqar(11, i, p.length, p.pairs, p.vocab, 0.01);
      REQUIRE(ex.tokens.size() == static_cast<size_t>(p.length));
      REQUIRE(solve_mqar(ex, p.pairs, p.vocab) == p.pairs);
      for (int64_t a : ex.answers) near += a - 2 * p.pairs - 1 < (p.length - 2 * p.pairs) / 2;
      queries += p.pairs;
    }
    // The power law (a = 0.01) favours short gaps: with room to choose (4 pairs <= gaps), most queries land in
    // the first half of the query region (a uniform draw would put half there).
    if (4 * p.pairs <= (p.length - 2 * p.pairs) / 2) CHECK(near > 3 * queries / 4);
  }
  CHECK_THROWS_WITH(make_mqar(1, 0, 64, 17, 8192, 0.01), Catch::Contains("17 key-value pairs"));
  CHECK_THROWS_WITH(make_mqar(1, 0, 64, 8, 16, 0.01), Catch::Contains("vocabulary"));
}

TEST_CASE("synthetic: parity and modular arithmetic answers match independent solvers", "[synthetic]") {
  for (int64_t length : {1, 2, 3, 7, 40, 160, 256}) {
    INFO("length " << length);
    for (uint64_t i = 0; i < 50; ++i) {
      const SyntheticExample par = make_parity(5, i, length);
      REQUIRE(par.tokens.size() == static_cast<size_t>(length + 2));
      REQUIRE(par.answers == std::vector<int64_t>{length + 1});
      REQUIRE(par.tokens[length] == synth::kParityEquals);
      int ones = 0;
      for (int64_t k = 0; k < length; ++k) ones += par.tokens[k];
      REQUIRE(par.tokens.back() == ones % 2);

      for (bool brackets : {false, true}) {
        const SyntheticExample ma = make_modarith(5, i, length, brackets);
        const int64_t expr = brackets || length % 2 == 1 ? length : length - 1;
        REQUIRE(ma.tokens.size() == static_cast<size_t>(expr + 2));
        REQUIRE(ma.tokens[expr] == synth::kEquals);
        REQUIRE(ma.answers == std::vector<int64_t>{expr + 1});
        REQUIRE(ma.tokens.back() == solve_modarith(ma));
        bool has_bracket = false;
        for (int64_t k = 0; k < expr; ++k) has_bracket |= ma.tokens[k] == synth::kOpen;
        if (!brackets) REQUIRE_FALSE(has_bracket);
        if (brackets && length >= 3) REQUIRE(has_bracket);
      }
    }
  }
}

TEST_CASE("synthetic: windows label only the answers; ranks read slices of one order; resume", "[synthetic]") {
  SyntheticConfig c;
  c.min_length = 3;
  c.max_length = 20;
  c.eval_lengths = {30};
  c.eval_examples = 4;
  const int64_t T = 24;
  SyntheticSource a("parity", c, 42, T);
  std::vector<int32_t> w(4 * (T + 1)), inputs(4 * T), targets(4 * T);
  a.next(4, 0, 1, w.data());
  split_windows(w.data(), 4, T, inputs, targets);
  for (int64_t b = 0; b < 4; ++b) {
    const SyntheticExample ex = a.train_example(static_cast<uint64_t>(b));
    for (int64_t t = 0; t < T; ++t) {
      const auto p = static_cast<size_t>(t + 1);
      const int32_t expect_in = t < static_cast<int64_t>(ex.tokens.size()) ? ex.tokens[static_cast<size_t>(t)] : 0;
      REQUIRE(inputs[b * T + t] == expect_in);
      const bool answer = p < ex.tokens.size() && static_cast<int64_t>(p) == ex.answers[0];
      REQUIRE(targets[b * T + t] == (answer ? ex.tokens[p] : -1));
    }
  }
  CHECK(a.state().index == 4);

  // Two ranks of 2 read the same windows as one rank of 4, and the position advances alike.
  SyntheticSource r0("parity", c, 42, T), r1("parity", c, 42, T);
  std::vector<int32_t> w0(2 * (T + 1)), w1(2 * (T + 1));
  r0.next(2, 0, 2, w0.data());
  r1.next(2, 1, 2, w1.data());
  w0.insert(w0.end(), w1.begin(), w1.end());
  CHECK(w0 == w);
  CHECK(r0.state().index == 4);

  // A source restored at position 4 continues with the same windows as the original.
  SyntheticSource resumed("parity", c, 42, T);
  resumed.set_state(a.state());
  std::vector<int32_t> next_a(4 * (T + 1)), next_b(4 * (T + 1));
  a.next(4, 0, 1, next_a.data());
  resumed.next(4, 0, 1, next_b.data());
  CHECK(next_a == next_b);

  // Evaluation examples are another stream, fixed per (seed, set, index).
  REQUIRE(a.eval_sets().size() == 1);
  CHECK(a.eval_sets()[0].tokens == 32);
  CHECK(a.eval_example(0, 1).tokens == resumed.eval_example(0, 1).tokens);
  CHECK(a.eval_example(0, 1).tokens != a.eval_example(0, 2).tokens);
  CHECK_THROWS_WITH(SyntheticSource("parity", c, 42, 20), Catch::Contains("max_length"));
}

TEST_CASE("synthetic: the length curriculum bounds example i's length by a line from the start length to max_length",
          "[synthetic]") {
  SyntheticConfig c;
  c.min_length = 3;
  c.max_length = 103;
  const int64_t T = 110;
  c.curriculum_tokens = 100 * T;  // the bound reaches max_length at example 100
  c.curriculum_start_length = 13;
  const SyntheticSource s("parity", c, 7, T);
  CHECK(s.longest_train_length(0) == 13);
  CHECK(s.longest_train_length(50) == 58);   // 13 + 90 * 50 / 100
  CHECK(s.longest_train_length(99) == 102);  // 13 + 89.1, rounded down
  CHECK(s.longest_train_length(100) == 103);
  CHECK(s.longest_train_length(1000000) == 103);
  // Every drawn length lies in [min_length, bound]; the bound is reached (uniform draw) and early examples
  // stay short. A parity example is its bits, '=' and the answer: tokens = length + 2.
  int64_t longest_early = 0, longest_late = 0;
  for (uint64_t i = 0; i < 400; ++i) {
    const auto len = static_cast<int64_t>(s.train_example(i).tokens.size()) - 2;
    REQUIRE(len >= c.min_length);
    REQUIRE(len <= s.longest_train_length(i));
    (i < 10 ? longest_early : longest_late) = std::max(i < 10 ? longest_early : longest_late, len);
  }
  CHECK(longest_early <= 13 + 9);
  CHECK(longest_late == 103);
  // A hold of 30 examples' tokens shifts the ramp by 30 examples.
  c.curriculum_hold_tokens = 30 * T;
  const SyntheticSource held("parity", c, 7, T);
  CHECK(held.longest_train_length(29) == 13);
  CHECK(held.longest_train_length(30) == 13);
  CHECK(held.longest_train_length(80) == 58);
  CHECK(held.longest_train_length(130) == 103);
  // Without the curriculum the bound is max_length from the first example.
  c.curriculum_tokens = 0;
  c.curriculum_hold_tokens = 0;
  CHECK(SyntheticSource("parity", c, 7, T).longest_train_length(0) == 103);
}

TEST_CASE("synthetic: config keys, the vocabulary and sequence-length checks", "[synthetic][config]") {
  nlohmann::json j = {
      {"model", {{"type", "transformer"}, {"d_model", 16}, {"n_layers", 1}, {"vocab_size", 16},
                 {"mlp", {{"intermediate_size", 32}}}, {"attn", {{"num_heads", 2}, {"head_dim", 8}}}}},
      {"train", {{"tokens", 2048}, {"batch_tokens", 1024}, {"seq_len", 256}, {"micro_batch", 4}, {"lr", 1e-3}}},
      {"data", {{"source", "mqar"}, {"synthetic", {{"vocab", 16}, {"train_points", {{64, 4}}},
                                                   {"eval_points", {{64, 4}, {128, 7}}}}}}}};
  const Config ok = parse_config(j);
  CHECK(ok.data.source == "mqar");
  CHECK(ok.data.synthetic.eval_points.size() == 2);
  CHECK(ok.resolved["data"]["synthetic"]["eval_points"][1][1] == 7);

  nlohmann::json small = j;
  small["model"]["vocab_size"] = 15;
  CHECK_THROWS_WITH(parse_config(small), Catch::Contains("model.vocab_size (15)") && Catch::Contains("16"));
  nlohmann::json too_many = j;
  too_many["data"]["synthetic"]["eval_points"] = {{64, 8}};
  CHECK_THROWS_WITH(parse_config(too_many), Catch::Contains("[64, 8]"));
  nlohmann::json short_seq = j;
  short_seq["data"]["synthetic"]["train_points"] = {{512, 4}};
  CHECK_THROWS_WITH(parse_config(short_seq), Catch::Contains("train.seq_len >= 511"));

  nlohmann::json parity = j;
  parity["data"] = {{"source", "parity"}, {"synthetic", {{"max_length", 300}}}};
  CHECK_THROWS_WITH(parse_config(parity), Catch::Contains("train.seq_len >= 301"));
  parity["data"]["synthetic"] = {{"brackets", true}};
  CHECK_THROWS_WITH(parse_config(parity), Catch::Contains("unknown key data.synthetic.brackets"));
  parity["data"]["synthetic"] = {{"max_length", 100}, {"curriculum_tokens", 4096}};
  CHECK(parse_config(parity).data.synthetic.curriculum_start_length == 3);  // min_length
  parity["data"]["synthetic"]["curriculum_start_length"] = 101;
  CHECK_THROWS_WITH(parse_config(parity), Catch::Contains("curriculum_start_length (101)"));
  parity["data"]["synthetic"] = {{"curriculum_tokens", -1}};
  CHECK_THROWS_WITH(parse_config(parity), Catch::Contains("curriculum_tokens"));
  nlohmann::json mqar_curriculum = j;
  mqar_curriculum["data"]["synthetic"]["curriculum_tokens"] = 4096;
  CHECK_THROWS_WITH(parse_config(mqar_curriculum), Catch::Contains("data.synthetic.curriculum_tokens"));
  parity["data"]["synthetic"] = nlohmann::json::object();
  parity["model"]["vocab_size"] = 2;
  CHECK_THROWS_WITH(parse_config(parity), Catch::Contains("model.vocab_size (2)"));
  nlohmann::json tokens = j;
  tokens["data"] = {{"text", "x.txt"}, {"synthetic", nlohmann::json::object()}};
  CHECK_THROWS_WITH(parse_config(tokens), Catch::Contains("data.synthetic"));
}

namespace {

ModelConfig tiny_model(int64_t vocab) {
  ModelConfig m;
  m.d_model = 8;
  m.n_layers = 1;
  m.vocab_size = vocab;
  m.mlp.intermediate_size = 12;
  m.attn.num_heads = 2;
  m.attn.head_dim = 4;
  m.init_std = 0.5;  // large weights: the argmax varies from position to position
  return m;
}

}  // namespace

TEST_CASE("synthetic: Model::forward's correct flags mark where the target minimises the loss", "[synthetic][model]") {
  // Independent of the kernel's argmax: with one labelled position at a time, the loss of target v at position
  // p is lse_p - z_p[v], smallest exactly for the argmax; so the flag must be 1 iff the target's loss is
  // smaller than every other candidate's (of the V).
  const int64_t B = 2, T = 5, V = 7;
  auto be = make_cpu_backend();
  Model model(tiny_model(V));
  model.allocate(*be, DType::f64);
  model.params().initialize(3);
  model.plan(B, T);
  std::vector<int32_t> inputs(B * T), targets(B * T);
  Philox rng(9, 0);
  for (auto& x : inputs) x = static_cast<int32_t>(rng.below(V));
  for (auto& x : targets) x = static_cast<int32_t>(rng.below(V));
  targets[3] = -1;
  std::vector<uint8_t> correct(B * T, 9);
  const double total = model.forward(inputs.data(), targets.data(), false, 0.0, correct.data());
  double sum = 0;
  int right = 0;
  for (int64_t p = 0; p < B * T; ++p) {
    std::vector<int32_t> one(B * T, -1);
    double best_other = 1e300, of_target = 0;  // the smallest loss of the other candidates
    for (int32_t v = 0; v < V; ++v) {
      one[p] = v;
      const double loss = model.forward(inputs.data(), one.data(), false, 0.0);
      if (v == targets[p]) of_target = loss;
      else best_other = std::min(best_other, loss);
    }
    if (targets[p] < 0) {
      REQUIRE(correct[p] == 0);
      continue;
    }
    sum += of_target;
    const bool expect = of_target < best_other;
    REQUIRE(correct[p] == (expect ? 1 : 0));
    right += expect;
  }
  CHECK(total == Approx(sum).epsilon(1e-12));
  CHECK(right > 0);  // the case is not degenerate: both outcomes occur
  CHECK(right < B * T - 1);
}

TEST_CASE("synthetic: evaluate_synthetic pools the per-point results and re-plans the model", "[synthetic][model]") {
  SyntheticConfig c;
  c.min_length = 2;
  c.max_length = 6;
  c.eval_lengths = {5, 9};
  c.eval_examples = 7;
  const SyntheticSource source("parity", c, 4, 8);
  auto be = make_cpu_backend();
  Model model(tiny_model(4));
  model.allocate(*be, DType::f64);
  model.params().initialize(1);
  model.plan(3, 8);
  const nlohmann::json r = evaluate_synthetic(model, source, 3, 8, false, single_process_communicator());

  // The same numbers from one forward per example, with the flags of its single answer.
  double loss = 0, right = 0;
  for (size_t s = 0; s < 2; ++s) {
    const int64_t T = source.eval_sets()[s].tokens - 1;
    double set_loss = 0, set_right = 0;
    model.plan(1, T);
    for (int64_t j = 0; j < c.eval_examples; ++j) {
      std::vector<int32_t> w(T + 1), inputs(T), targets(T);
      SyntheticSource::to_window(source.eval_example(s, j), T + 1, w.data());
      split_windows(w.data(), 1, T, inputs, targets);
      std::vector<uint8_t> correct(T);
      set_loss += model.forward(inputs.data(), targets.data(), false, 0.0, correct.data());
      set_right += correct[T - 1];
    }
    const nlohmann::json& p = r["eval_points"][s];
    CHECK(p["loss"].get<double>() == Approx(set_loss / c.eval_examples).epsilon(1e-12));
    CHECK(p["acc"].get<double>() == Approx(set_right / c.eval_examples).epsilon(1e-15));
    CHECK(p["scaled_acc"].get<double>() == Approx(2 * set_right / c.eval_examples - 1).margin(1e-15));
    loss += set_loss;
    right += set_right;
  }
  CHECK(r["eval_points"][0]["name"] == "L5");
  CHECK(r["val_loss"].get<double>() == Approx(loss / 14).epsilon(1e-12));
  CHECK(r["val_acc"].get<double>() == Approx(right / 14).epsilon(1e-15));
  CHECK(r["val_example_acc"] == r["val_acc"]);
}
