// Strict parsing of the run configuration (docs/CONFIG.md lists every key).
#include "model/config.h"

#include <algorithm>
#include <cctype>
#include <fstream>
#include <set>
#include <sstream>

#include "core/error.h"
#include "data/synthetic_tasks.h"

namespace llmt {
namespace {

using nlohmann::json;

std::string join(const std::vector<std::string>& items) {
  std::string s;
  for (const auto& it : items) s += (s.empty() ? "" : ", ") + it;
  return s;
}

/// A key folded for comparison: lower case, without '_' and '-'.
std::string fold_key(const std::string& s) {
  std::string f;
  for (char ch : s)
    if (ch != '_' && ch != '-') f += static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return f;
}

/// The keys of `candidates` that `key` is most likely a misspelling of, for a "did you mean" hint (empty when none is
/// close). Both are compared after folding case and dropping '_' and '-' ("D_Model" and "dmodel" match "d_model"),
/// by optimal-string-alignment distance (insertions, deletions, substitutions and swaps of adjacent characters
/// count 1); a candidate is close at distance <= 2 (<= 1 for a folded key of up to 3 characters, so "lrr" finds "lr"
/// and "xy" does not). A few names other trainers use for our keys count as those keys: learning_rate (lr),
/// hidden_size (d_model), num_hidden_layers (n_layers), max_grad_norm (grad_clip), each also when misspelt. Returns
/// every candidate at the smallest distance, in the order of `candidates`.
std::vector<std::string> close_keys(const std::string& key, const std::vector<std::string>& candidates) {
  const auto distance = [](const std::string& a, const std::string& b) {
    // d[i][j]: distance between the first i characters of a and the first j of b
    std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
    for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
    for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
    for (size_t i = 1; i <= a.size(); ++i)
      for (size_t j = 1; j <= b.size(); ++j) {
        d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (a[i - 1] != b[j - 1])});
        if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
          d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);  // adjacent swap
      }
    return d[a.size()][b.size()];
  };
  static const std::vector<std::pair<std::string, std::string>> other_names = {
      {"learning_rate", "lr"}, {"hidden_size", "d_model"}, {"num_hidden_layers", "n_layers"},
      {"max_grad_norm", "grad_clip"}};
  const std::string k = fold_key(key);
  const size_t limit = k.size() <= 3 ? 1 : 2;
  size_t best = limit;
  std::vector<std::string> found;
  for (const std::string& c : candidates) {
    size_t d = distance(k, fold_key(c));
    for (const auto& [name, ours] : other_names) {  // either side may be ours, the other the other name
      if (ours == c) d = std::min(d, distance(k, fold_key(name)));
      if (ours == key) d = std::min(d, distance(fold_key(name), fold_key(c)));
    }
    if (d > best) continue;
    if (d < best) best = d, found.clear();
    found.push_back(c);
  }
  return found;
}

std::string type_of(const json& v) {
  if (v.is_number_integer()) return "integer";
  if (v.is_number()) return "number";
  return v.type_name();
}

/// Walks one JSON object: every read records the key (unknown keys are reported by finish())
/// and writes the value, or its default, into `out` (the resolved config).
class ObjectReader {
 public:
  ObjectReader(const json& j, std::string path, json& out) : j_(j), path_(std::move(path)), out_(out) {
    check(j.is_object(), "config: {} must be an object, got {}", display(), type_of(j));
    out_ = json::object();
  }

  int64_t integer(const std::string& key, const int64_t* fallback = nullptr) {
    const json* v = find(key, fallback != nullptr);
    if (!v) return record(key, *fallback);
    check(v->is_number_integer(), "config: {} must be an integer, got {} {}", at(key), type_of(*v), v->dump());
    return record(key, v->get<int64_t>());
  }
  int64_t positive(const std::string& key, const int64_t* fallback = nullptr) {
    const int64_t x = integer(key, fallback);
    check(x > 0, "config: {} must be > 0, got {}", at(key), x);
    return x;
  }
  double number(const std::string& key, const double* fallback = nullptr) {
    const json* v = find(key, fallback != nullptr);
    if (!v) return record(key, *fallback);
    check(v->is_number(), "config: {} must be a number, got {} {}", at(key), type_of(*v), v->dump());
    return record(key, v->get<double>());
  }
  bool boolean(const std::string& key, bool fallback) {
    const json* v = find(key, true);
    if (!v) return record(key, fallback);
    check(v->is_boolean(), "config: {} must be true or false, got {} {}", at(key), type_of(*v), v->dump());
    return record(key, v->get<bool>());
  }
  std::string string(const std::string& key, const std::string* fallback = nullptr) {
    const json* v = find(key, fallback != nullptr);
    if (!v) return record(key, *fallback);
    check(v->is_string(), "config: {} must be a string, got {} {}", at(key), type_of(*v), v->dump());
    return record(key, v->get<std::string>());
  }
  std::string choice(const std::string& key, const std::vector<std::string>& allowed, const std::string* fallback) {
    const std::string s = string(key, fallback);
    check(std::find(allowed.begin(), allowed.end(), s) != allowed.end(), "config: {} = \"{}\" is not allowed; allowed: {}",
          at(key), s, join(allowed));
    return s;
  }
  std::vector<std::string> choices(const std::string& key, const std::vector<std::string>& allowed) {
    const json* v = find(key, true);
    std::vector<std::string> result;
    if (v) {
      check(v->is_array(), "config: {} must be a list, got {}", at(key), type_of(*v));
      for (const json& e : *v) {
        check(e.is_string() && std::find(allowed.begin(), allowed.end(), e.get<std::string>()) != allowed.end(),
              "config: {} contains {}; allowed: {}", at(key), e.dump(), join(allowed));
        result.push_back(e.get<std::string>());
      }
    }
    out_[key] = result;
    return result;
  }
  std::vector<double> numbers(const std::string& key, size_t count, const std::vector<double>& fallback) {
    const json* v = find(key, true);
    std::vector<double> result = fallback;
    if (v) {
      check(v->is_array() && v->size() == count && std::all_of(v->begin(), v->end(), [](const json& e) { return e.is_number(); }),
            "config: {} must be a list of {} numbers, got {}", at(key), count, v->dump());
      result = v->get<std::vector<double>>();
    }
    out_[key] = result;
    return result;
  }
  /// A nested object (an absent one reads as {} so its keys take their defaults).
  ObjectReader object(const std::string& key) {
    seen_.insert(key);
    static const json empty = json::object();
    const json* v = j_.contains(key) ? &j_.at(key) : &empty;
    return ObjectReader(*v, at(key), out_[key]);
  }
  std::vector<int64_t> integers(const std::string& key) {
    const json* v = find(key, true);
    std::vector<int64_t> result;
    if (v) {
      check(v->is_array() && std::all_of(v->begin(), v->end(), [](const json& e) { return e.is_number_integer(); }),
            "config: {} must be a list of integers, got {}", at(key), v->dump());
      result = v->get<std::vector<int64_t>>();
    }
    out_[key] = result;
    return result;
  }
  /// Records `key` as read with the resolved value `value` (for values parsed from raw()).
  void json_value(const std::string& key, const json& value) {
    seen_.insert(key);
    out_[key] = value;
  }
  /// Whether `key` is given as JSON null (then it counts as read and resolves to null).
  bool is_null(const std::string& key) {
    if (!j_.contains(key) || !j_.at(key).is_null()) return false;
    seen_.insert(key);
    out_[key] = nullptr;
    return true;
  }
  /// The raw JSON value of `key` (null when absent), for messages.
  json raw(const std::string& key) const { return j_.contains(key) ? j_.at(key) : json(); }
  /// Whether the object has `key` (without reading it).
  bool has(const std::string& key) const { return j_.contains(key); }
  /// Throws for the first key that was never read, listing the allowed keys and a hint: the keys of the sections
  /// below that it names exactly (up to case, '_' and '-'; `lr` at the top level: "did you mean train.lr?"), else
  /// the close keys here (close_keys), else the close keys of the sections below.
  void finish() const {
    for (const auto& [key, value] : j_.items()) {
      if (seen_.count(key)) continue;
      const std::vector<std::string> allowed(seen_.begin(), seen_.end());
      std::string close = in_sections(key, true);
      if (close.empty()) close = either(close_keys(key, allowed));
      if (close.empty()) close = in_sections(key, false);
      throw Error(fmt::format("config: unknown key {}{}; allowed keys here: {}", at(key),
                              close.empty() ? "" : " (did you mean " + close + "?)", join(allowed)));
    }
  }
  std::string at(const std::string& key) const { return path_.empty() ? key : path_ + "." + key; }

 private:
  std::string display() const { return path_.empty() ? "the top level" : path_; }
  /// The paths of `keys` joined by " or " ("" for none), for the hints of close_keys.
  std::string either(const std::vector<std::string>& keys) const {
    std::string paths;
    for (const std::string& k : keys) paths += (paths.empty() ? "" : " or ") + at(k);
    return paths;
  }
  /// The paths of the keys close to `key` (close_keys; `exact`: equal to it after fold_key) in the sections below
  /// this object that are resolved already (out_: every key read, defaults included), from the nearest level of
  /// sections that has any, joined by " or " ("" for none).
  std::string in_sections(const std::string& key, bool exact) const {
    std::string paths;
    std::vector<std::pair<std::string, const json*>> level = {{path_, &out_}};
    while (!level.empty() && paths.empty()) {
      std::vector<std::pair<std::string, const json*>> next;
      for (const auto& [path, obj] : level)
        for (const auto& [name, value] : obj->items()) {
          if (!value.is_object()) continue;
          const std::string sub = path.empty() ? name : path + "." + name;
          std::vector<std::string> keys;
          for (const auto& [k, v] : value.items()) keys.push_back(k);
          for (const std::string& k : close_keys(key, keys))
            if (!exact || fold_key(k) == fold_key(key)) paths += (paths.empty() ? "" : " or ") + sub + "." + k;
          next.emplace_back(sub, &value);
        }
      level = std::move(next);
    }
    return paths;
  }
  const json* find(const std::string& key, bool optional) {
    seen_.insert(key);
    if (j_.contains(key) && !j_.at(key).is_null()) return &j_.at(key);
    if (!optional) {
      std::vector<std::string> given, unread;  // unread: the given keys that may be a misspelt `key`
      for (const auto& [k, v] : j_.items()) {
        given.push_back(k);
        if (!seen_.count(k)) unread.push_back(k);
      }
      const std::string hint = either(close_keys(key, unread));
      throw Error(fmt::format("config: missing required key {}; keys given in {}: {}{}", at(key), display(),
                              given.empty() ? std::string("none") : join(given),
                              hint.empty() ? "" : " (is " + hint + " a misspelling of it?)"));
    }
    return nullptr;
  }
  template <typename V> V record(const std::string& key, V value) {
    out_[key] = value;
    return value;
  }

  const json& j_;
  std::string path_;
  json& out_;
  std::set<std::string> seen_;
};

template <typename T> const T* dflt(const T& v) { return &v; }  // a default value for the readers above

void parse_model(ObjectReader r, ModelConfig& m) {
  m.type = r.choice("type", {"transformer", "gdn", "comba", "kda", "mdn", "mamba2", "mamba3"}, nullptr);
  m.d_model = r.positive("d_model");
  m.n_layers = r.positive("n_layers");
  m.vocab_size = r.positive("vocab_size");
  m.tie_embeddings = r.boolean("tie_embeddings", false);
  {
    ObjectReader n = r.object("norm");
    n.choice("type", {"rmsnorm"}, dflt(std::string("rmsnorm")));
    m.norm_eps = n.number("eps", dflt(1e-6));
    check(m.norm_eps > 0, "config: model.norm.eps must be > 0");
    n.finish();
  }
  m.has_mlp = !r.is_null("mlp");
  if (m.has_mlp) {
    ObjectReader mlp = r.object("mlp");
    mlp.choice("type", {"swiglu"}, dflt(std::string("swiglu")));
    m.mlp.intermediate_size = mlp.positive("intermediate_size");
    mlp.finish();
  }
  {
    ObjectReader init = r.object("init");
    m.init_std = init.number("std", dflt(0.02));
    check(m.init_std > 0, "config: model.init.std must be > 0");
    m.residual_rescale = init.choice("residual_rescale", {"none", "kaiming_div_sqrt"}, dflt(std::string("none")));
    m.residual_rescale_n = init.positive("residual_rescale_n", dflt(m.n_layers));
    init.finish();
    check(m.residual_rescale == "none" || m.type == "mamba2" || m.type == "mamba3",
          "config: model.init.residual_rescale \"{}\" is implemented for model.type \"mamba2\" and \"mamba3\" only "
          "(their out_proj and MLP down_proj)",
          m.residual_rescale);
  }
  m.attn_layers = r.integers("attn_layers");
  std::vector<int64_t> sorted = m.attn_layers;
  std::sort(sorted.begin(), sorted.end());
  for (size_t i = 0; i < sorted.size(); ++i)
    check(sorted[i] >= 0 && sorted[i] < m.n_layers && (i == 0 || sorted[i] != sorted[i - 1]),
          "config: model.attn_layers must hold distinct layer indices in [0, {}), got {}", m.n_layers,
          r.raw("attn_layers").dump());
  check(m.attn_layers.empty() || m.type != "transformer",
        "config: model.attn_layers is for hybrids; with model.type \"transformer\" every layer is attention already");
  // Each mixer's block is read only when that mixer is used; a block for an unused mixer is
  // an error rather than silently ignored.
  const auto mixer_block = [&](const std::string& key, bool used) {
    check(used || !r.has(key), "config: model.{} is given but no layer uses it (model.type is \"{}\"{})", key,
          m.type, key == "attn" ? ", model.attn_layers is empty" : "");
    return used;
  };
  if (mixer_block("attn", m.has_attention())) {
    ObjectReader a = r.object("attn");
    m.attn.num_heads = a.positive("num_heads");
    m.attn.head_dim = a.positive("head_dim");
    m.attn.rope_theta = a.number("rope_theta", dflt(10000.0));
    check(m.attn.head_dim % 2 == 0, "config: model.attn.head_dim must be even (rotary), got {}", m.attn.head_dim);
    check(m.attn.rope_theta > 0, "config: model.attn.rope_theta must be > 0");
    a.finish();
  }
  // The keys shared by the delta-rule mixers (model.gdn, model.comba, model.kda); `g` is the mixer's block and
  // `c` arrives default-constructed, so its values are the defaults of its type.
  const auto delta_keys = [](ObjectReader& g, const std::string& key, GdnConfig& c, bool comba, bool mdn = false) {
    c.num_heads = g.positive("num_heads");
    c.head_dim = g.positive("head_dim");
    c.expand_v = g.positive("expand_v", dflt(c.expand_v));
    c.conv_size = g.positive("conv_size", dflt(c.conv_size));
    c.chunk_size = g.positive("chunk_size", dflt(c.chunk_size));
    c.output_gate = g.choice("output_gate", {"swish", "sigmoid"}, dflt(c.output_gate));
    if (!mdn) c.save_states = g.boolean("save_states", c.save_states);
    if (comba) {
      auto& cc = static_cast<CombaConfig&>(c);
      cc.output_correction = g.boolean("output_correction", true);
      cc.correction_factor = g.number("correction_factor", dflt(1.0));
      cc.inner_decay = g.boolean("inner_decay", true);
    }
    if (mdn) {
      auto& mc = static_cast<MdnConfig&>(c);
      mc.min_log_mu = g.number("min_log_mu", dflt(mc.min_log_mu));
      mc.tau_factor = g.number("tau_factor", dflt(mc.tau_factor));
      mc.output_correction = g.boolean("output_correction", true);
      mc.alpha_max = g.boolean("alpha_max", true);
      mc.beta_max = g.boolean("beta_max", true);
      mc.eta = g.choice("eta", {"tanh", "two_sigmoid"}, dflt(mc.eta));
      mc.momentum = g.boolean("momentum", true);
      mc.save_residuals = g.boolean("save_residuals", mc.save_residuals);
      check(mc.min_log_mu < 0, "config: model.mdn.min_log_mu must be < 0, got {}", mc.min_log_mu);
      check(mc.tau_factor > 0, "config: model.mdn.tau_factor must be > 0, got {}", mc.tau_factor);
    }
    ObjectReader init = g.object("init");
    const auto range = init.numbers("A_range", 2, {c.A_min, c.A_max});
    c.A_min = range[0];
    c.A_max = range[1];
    c.dt_min = init.number("dt_min", dflt(c.dt_min));
    c.dt_max = init.number("dt_max", dflt(c.dt_max));
    c.dt_floor = init.number("dt_floor", dflt(c.dt_floor));
    if (comba) static_cast<CombaConfig&>(c).decay_init = init.number("decay", dflt(1.0));
    if (mdn) {
      auto& mc = static_cast<MdnConfig&>(c);
      const auto mu_range = init.numbers("mu_A_range", 2, {mc.mu_A_min, mc.mu_A_max});
      mc.mu_A_min = mu_range[0];
      mc.mu_A_max = mu_range[1];
      check(mc.mu_A_min >= 0 && mc.mu_A_max > mc.mu_A_min,
            "config: model.mdn.init.mu_A_range must be [lo, hi] with 0 <= lo < hi");
      mc.mu_bias_init = init.choice("mu_bias", {"copy_dt_bias", "independent"}, dflt(mc.mu_bias_init));
      mc.log_factor_init = init.choice("log_factor", {"log_uniform_0_4", "zero"}, dflt(mc.log_factor_init));
      mc.D_log_init = init.choice("D_log", {"log_uniform_0_1", "zero"}, dflt(mc.D_log_init));
    }
    init.finish();
    check(c.A_min >= 0 && c.A_max > c.A_min, "config: model.{}.init.A_range must be [lo, hi] with 0 <= lo < hi",
          key);
    check(c.dt_min > 0 && c.dt_max > c.dt_min && c.dt_floor > 0,
          "config: model.{}.init needs 0 < dt_min < dt_max and dt_floor > 0", key);
  };
  if (mixer_block("gdn", m.type == "gdn")) {
    ObjectReader g = r.object("gdn");
    delta_keys(g, "gdn", m.gdn, false);
    g.finish();
  }
  if (mixer_block("comba", m.type == "comba")) {
    ObjectReader g = r.object("comba");
    delta_keys(g, "comba", m.comba, true);
    g.finish();
  }
  if (mixer_block("kda", m.type == "kda")) {
    ObjectReader g = r.object("kda");
    delta_keys(g, "kda", m.kda, false);
    g.finish();
  }
  if (mixer_block("mamba2", m.type == "mamba2")) {
    ObjectReader g = r.object("mamba2");
    Mamba2Config& c = m.mamba2;
    c.expand = g.positive("expand", dflt(c.expand));
    c.head_dim = g.positive("head_dim", dflt(c.head_dim));
    c.d_state = g.positive("d_state", dflt(c.d_state));
    c.n_groups = g.positive("n_groups", dflt(c.n_groups));
    c.conv_size = g.positive("conv_size", dflt(c.conv_size));
    c.conv_bias = g.boolean("conv_bias", c.conv_bias);
    c.chunk_size = g.positive("chunk_size", dflt(c.chunk_size));
    c.dt_min = g.number("dt_min", dflt(c.dt_min));
    c.dt_max = g.number("dt_max", dflt(c.dt_max));
    c.dt_floor = g.number("dt_floor", dflt(c.dt_floor));
    c.init_style = g.choice("init_style", {"fla_mdn", "mamba_ssm", "zeros_like_skipped"}, dflt(c.init_style));
    c.save_states = g.boolean("save_states", c.save_states);
    g.finish();
    const int64_t inner = c.inner_dim(m.d_model);
    check(inner % c.head_dim == 0, "config: model.mamba2.head_dim ({}) must divide expand * d_model ({})", c.head_dim,
          inner);
    check(c.num_heads(m.d_model) % c.n_groups == 0,
          "config: model.mamba2.n_groups ({}) must divide the number of heads expand * d_model / head_dim ({})",
          c.n_groups, c.num_heads(m.d_model));
    check(c.dt_min > 0 && c.dt_max > c.dt_min && c.dt_floor > 0,
          "config: model.mamba2 needs 0 < dt_min < dt_max and dt_floor > 0");
  }
  if (mixer_block("mamba3", m.type == "mamba3")) {
    ObjectReader g = r.object("mamba3");
    Mamba3Config& c = m.mamba3;
    c.expand = g.positive("expand", dflt(c.expand));
    c.head_dim = g.positive("head_dim", dflt(c.head_dim));
    c.d_state = g.positive("d_state", dflt(c.d_state));
    c.n_groups = g.positive("n_groups", dflt(c.n_groups));
    c.mimo_rank = g.positive("mimo_rank", dflt(c.mimo_rank));
    c.chunk_size = g.positive("chunk_size", dflt(c.chunk_size));
    c.rope_fraction = g.number("rope_fraction", dflt(c.rope_fraction));
    c.A_floor = g.number("A_floor", dflt(c.A_floor));
    c.A_act = g.choice("A_act", {"softplus", "heavy_tail"}, dflt(c.A_act));
    c.dt_min = g.number("dt_min", dflt(c.dt_min));
    c.dt_max = g.number("dt_max", dflt(c.dt_max));
    c.dt_floor = g.number("dt_floor", dflt(c.dt_floor));
    c.outproj_norm = g.boolean("outproj_norm", c.outproj_norm);
    c.bc_bias_init = g.number("bc_bias_init", dflt(c.bc_bias_init));
    c.init_style = g.choice("init_style", {"mamba_ssm", "fla"}, dflt(c.init_style));
    c.save_states = g.boolean("save_states", c.save_states);
    g.finish();
    const int64_t inner = c.inner_dim(m.d_model);
    check(inner % c.head_dim == 0, "config: model.mamba3.head_dim ({}) must divide expand * d_model ({})", c.head_dim,
          inner);
    check(c.num_heads(m.d_model) % c.n_groups == 0,
          "config: model.mamba3.n_groups ({}) must divide the number of heads expand * d_model / head_dim ({})",
          c.n_groups, c.num_heads(m.d_model));
    check(c.rope_fraction == 0.5 || c.rope_fraction == 1.0,
          "config: model.mamba3.rope_fraction must be 0.5 or 1.0, got {}", c.rope_fraction);
    check(c.mimo_rank == 1 || c.d_state % 2 == 0,
          "config: model.mamba3.d_state ({}) must be even when mimo_rank > 1 (rotation pairs (i, i + N/2))",
          c.d_state);
    check(c.A_floor > 0, "config: model.mamba3.A_floor must be > 0, got {}", c.A_floor);
    check(c.dt_min > 0 && c.dt_max > c.dt_min && c.dt_floor > 0,
          "config: model.mamba3 needs 0 < dt_min < dt_max and dt_floor > 0");
  }
  if (mixer_block("mdn", m.type == "mdn")) {
    ObjectReader g = r.object("mdn");
    delta_keys(g, "mdn", m.mdn, false, true);
    g.finish();
  }
  r.finish();
}

void parse_train(ObjectReader r, TrainConfig& t) {
  t.tokens = r.positive("tokens");
  t.batch_tokens = r.positive("batch_tokens");
  t.seq_len = r.positive("seq_len");
  t.micro_batch = r.positive("micro_batch");
  t.lr = r.number("lr");
  t.min_lr = r.number("min_lr", dflt(0.0));
  t.lr_schedule = r.choice("lr_schedule", {"cosine"}, dflt(std::string("cosine")));
  t.lr_formula = r.choice("lr_formula", {"flame", "standard"}, dflt(std::string("flame")));
  t.warmup_tokens = r.integer("warmup_tokens", dflt(int64_t{0}));
  t.weight_decay = r.number("weight_decay", dflt(0.1));
  t.weight_decay_exclude = r.choices("weight_decay_exclude", {"bias", "norm", "embedding", "ssm_param"});
  const auto betas = r.numbers("betas", 2, {0.9, 0.95});
  t.beta1 = betas[0];
  t.beta2 = betas[1];
  t.eps = r.number("eps", dflt(1e-8));
  t.grad_clip = r.number("grad_clip", dflt(1.0));
  t.skip_nonfinite = r.boolean("skip_nonfinite", true);
  t.seed = static_cast<uint64_t>(r.integer("seed", dflt(int64_t{42})));
  t.backend = r.choice("backend", {"auto", "cpu", "cuda"}, dflt(std::string("auto")));
  t.precision = r.choice("precision", {"auto", "fp32", "bf16"}, dflt(std::string("auto")));
  t.recompute = r.boolean("recompute", false);
  r.finish();

  check(t.lr > 0, "config: train.lr must be > 0, got {}", t.lr);
  check(t.min_lr >= 0 && t.min_lr <= t.lr, "config: train.min_lr must be in [0, train.lr], got {}", t.min_lr);
  check(t.beta1 >= 0 && t.beta1 < 1 && t.beta2 >= 0 && t.beta2 < 1, "config: train.betas must lie in [0, 1)");
  check(t.eps > 0, "config: train.eps must be > 0");
  check(t.weight_decay >= 0, "config: train.weight_decay must be >= 0");
  check(t.grad_clip >= 0, "config: train.grad_clip must be >= 0 (0 disables clipping)");
  check(t.tokens % t.batch_tokens == 0,
        "config: train.tokens ({}) must be a whole number of steps of train.batch_tokens ({})", t.tokens,
        t.batch_tokens);
  check(t.batch_tokens % (t.micro_batch * t.seq_len) == 0,
        "config: inconsistent batch: train.batch_tokens ({}) must be a multiple of train.micro_batch * "
        "train.seq_len ({} * {} = {}); grad_accum = batch_tokens / (micro_batch * seq_len)",
        t.batch_tokens, t.micro_batch, t.seq_len, t.micro_batch * t.seq_len);
  check(t.warmup_tokens >= 0 && t.warmup_tokens % t.batch_tokens == 0,
        "config: train.warmup_tokens ({}) must be a whole number of steps of train.batch_tokens ({})",
        t.warmup_tokens, t.batch_tokens);
  check(t.warmup_steps() < t.steps(),
        "config: train.warmup_tokens ({} steps) must be fewer than the {} steps of train.tokens; lower "
        "train.warmup_tokens (e.g. --set train.warmup_tokens={})",
        t.warmup_steps(), t.steps(), (t.steps() / 10) * t.batch_tokens);
}

/// Reads a list of [length, pairs] integer pairs (data.synthetic.train_points / eval_points).
std::vector<std::array<int64_t, 2>> parse_points(ObjectReader& r, const std::string& key,
                                                 const std::vector<std::array<int64_t, 2>>& fallback) {
  const json raw = r.raw(key);
  std::vector<std::array<int64_t, 2>> points = fallback;
  if (!raw.is_null()) {
    const bool ok = raw.is_array() && !raw.empty() && std::all_of(raw.begin(), raw.end(), [](const json& p) {
      return p.is_array() && p.size() == 2 && p[0].is_number_integer() && p[1].is_number_integer() &&
             p[0].get<int64_t>() > 0 && p[1].get<int64_t>() > 0;
    });
    check(ok, "config: {} must be a non-empty list of [seq_len, kv_pairs] positive integer pairs, got {}", r.at(key),
          raw.dump());
    points = raw.get<std::vector<std::array<int64_t, 2>>>();
  }
  r.json_value(key, json(points));
  return points;
}

void parse_synthetic(ObjectReader r, const std::string& source, SyntheticConfig& s) {
  if (source == "mqar") {
    s.vocab = r.positive("vocab", dflt(s.vocab));
    s.train_points = parse_points(r, "train_points", s.train_points);
    s.eval_points = parse_points(r, "eval_points", s.eval_points);
    s.power_a = r.number("power_a", dflt(s.power_a));
    check(s.power_a > 0, "config: data.synthetic.power_a must be > 0, got {}", s.power_a);
    for (const auto& points : {s.train_points, s.eval_points})
      for (const auto& [len, pairs] : points)
        check(len % 2 == 0 && 4 * pairs <= len && pairs < s.vocab / 2,
              "config: data.synthetic point [{}, {}] is not a valid MQAR setting: the length must be even and at "
              "least 4 * kv_pairs, and kv_pairs < data.synthetic.vocab / 2 ({})", len, pairs, s.vocab / 2);
  } else {
    s.min_length = r.positive("min_length", dflt(s.min_length));
    s.max_length = r.positive("max_length", dflt(s.max_length));
    check(s.min_length <= s.max_length, "config: data.synthetic.min_length ({}) exceeds max_length ({})",
          s.min_length, s.max_length);
    s.curriculum_tokens = r.integer("curriculum_tokens", dflt(s.curriculum_tokens));
    check(s.curriculum_tokens >= 0, "config: data.synthetic.curriculum_tokens must be >= 0 (0: no curriculum), got {}",
          s.curriculum_tokens);
    s.curriculum_hold_tokens = r.integer("curriculum_hold_tokens", dflt(s.curriculum_hold_tokens));
    check(s.curriculum_hold_tokens >= 0, "config: data.synthetic.curriculum_hold_tokens must be >= 0, got {}",
          s.curriculum_hold_tokens);
    s.curriculum_start_length = r.positive("curriculum_start_length", dflt(s.min_length));
    check(s.min_length <= s.curriculum_start_length && s.curriculum_start_length <= s.max_length,
          "config: data.synthetic.curriculum_start_length ({}) must lie in [min_length, max_length] = [{}, {}]",
          s.curriculum_start_length, s.min_length, s.max_length);
    const std::vector<int64_t> lengths = r.integers("eval_lengths");
    if (!lengths.empty()) s.eval_lengths = lengths;
    r.json_value("eval_lengths", json(s.eval_lengths));
    for (int64_t len : s.eval_lengths) check(len > 0, "config: data.synthetic.eval_lengths must be positive, got {}", len);
    if (source == "modarith") s.brackets = r.boolean("brackets", s.brackets);
  }
  s.eval_examples = r.positive("eval_examples", dflt(s.eval_examples));
  r.finish();
}

void parse_data(ObjectReader r, DataConfig& d) {
  d.source = r.choice("source", {"tokens", "mqar", "parity", "modarith"}, dflt(std::string("tokens")));
  if (d.source != "tokens") {
    parse_synthetic(r.object("synthetic"), d.source, d.synthetic);
    d.shuffle_seed = static_cast<uint64_t>(r.integer("shuffle_seed", dflt(int64_t{42})));
    r.finish();
    return;
  }
  check(!r.has("synthetic"), "config: data.synthetic is read only with data.source mqar, parity or modarith");
  d.tokenizer = r.choice("tokenizer", {"gpt2", "llama3", "llama3.1"}, dflt(std::string("gpt2")));
  d.tokenizer_dir = r.string("tokenizer_dir", dflt(std::string("data/tokenizers/gpt2")));
  d.text = r.string("text", dflt(std::string()));
  d.val_fraction = r.number("val_fraction", dflt(0.1));
  d.cache_dir = r.string("cache_dir", dflt(std::string("data/cache")));
  d.train_shard = r.string("train_shard", dflt(std::string()));
  d.val_shard = r.string("val_shard", dflt(std::string()));
  d.dataset = r.string("dataset", dflt(std::string()));
  d.shuffle = r.boolean("shuffle", true);
  d.shuffle_seed = static_cast<uint64_t>(r.integer("shuffle_seed", dflt(int64_t{42})));
  r.finish();
  check(d.val_fraction > 0 && d.val_fraction < 1, "config: data.val_fraction must be in (0, 1), got {}",
        d.val_fraction);
  const int sources = (!d.text.empty()) + (!d.train_shard.empty() || !d.val_shard.empty()) + (!d.dataset.empty());
  check(sources >= 1 && (d.train_shard.empty() == d.val_shard.empty()),
        "config: data needs data.text (a UTF-8 file tokenized once), data.dataset (a prepare-data directory) or "
        "both data.train_shard and data.val_shard");
  check(sources == 1,
        "config: data.text, data.dataset and data.train_shard/data.val_shard are exclusive; give one of them");
  check(d.text.empty() || d.tokenizer == "gpt2", "config: data.text is tokenized with gpt2 only; data.tokenizer is {}",
        d.tokenizer);
}

}  // namespace

Config parse_config(const json& j) {
  Config c;
  json resolved;
  ObjectReader r(j, "", resolved);
  c.run_name = r.string("run_name", dflt(std::string("run")));
  r.string("notes", dflt(std::string()));  // free text: provenance, assumptions
  parse_model(r.object("model"), c.model);
  parse_train(r.object("train"), c.train);
  parse_data(r.object("data"), c.data);
  {
    ObjectReader e = r.object("eval");
    c.eval.interval_steps = e.integer("interval_steps", dflt(int64_t{0}));
    c.eval.tokens = e.integer("tokens", dflt(c.train.batch_tokens));
    c.eval.at_start = e.boolean("at_start", true);
    e.finish();
    check(c.eval.interval_steps >= 0, "config: eval.interval_steps must be >= 0");
    check(c.eval.tokens >= c.train.seq_len, "config: eval.tokens ({}) must be at least train.seq_len ({})",
          c.eval.tokens, c.train.seq_len);
  }
  {
    ObjectReader k = r.object("checkpoint");
    c.checkpoint.interval_steps = k.integer("interval_steps", dflt(int64_t{0}));
    c.checkpoint.keep = k.positive("keep", dflt(int64_t{2}));
    k.finish();
    check(c.checkpoint.interval_steps >= 0, "config: checkpoint.interval_steps must be >= 0");
  }
  {
    ObjectReader l = r.object("log");
    c.log.interval_steps = l.positive("interval_steps", dflt(int64_t{1}));
    l.finish();
  }
  {
    ObjectReader d = r.object("dist");
    c.dist.zero1 = d.boolean("zero1", false);
    c.dist.overlap = d.boolean("overlap", true);
    c.dist.bucket_mb = d.number("bucket_mb", dflt(25.0));
    d.finish();
    check(c.dist.bucket_mb > 0, "config: dist.bucket_mb must be > 0, got {}", c.dist.bucket_mb);
  }
  r.finish();
  if (c.data.source != "tokens") {
    // The longest training example must fit one window of seq_len + 1 tokens.
    int64_t longest = c.data.synthetic.max_length + 2;  // parity / modarith: expression, '=', answer
    if (c.data.source == "mqar") {
      longest = 0;
      for (const auto& p : c.data.synthetic.train_points) longest = std::max(longest, p[0]);
    }
    check(c.train.seq_len + 1 >= longest,
          "config: train.seq_len ({}) is too short for the longest {} training example ({} tokens): it needs "
          "train.seq_len >= {}", c.train.seq_len, c.data.source, longest, longest - 1);
  }
  const int64_t tokenizer_vocab = c.data.source == "mqar"       ? c.data.synthetic.vocab
                                  : c.data.source == "parity"   ? synth::kParityVocab
                                  : c.data.source == "modarith" ? synth::kModArithVocab
                                  : c.data.tokenizer == "gpt2"  ? 50257
                                                                : 128256;
  check(c.data.source == "tokens" || c.model.vocab_size >= tokenizer_vocab,
        "config: model.vocab_size ({}) is smaller than the {} ids that data.source \"{}\" uses", c.model.vocab_size,
        tokenizer_vocab, c.data.source);
  check(c.model.vocab_size >= tokenizer_vocab,
        "config: model.vocab_size ({}) is smaller than the vocabulary of data.tokenizer \"{}\" ({})",
        c.model.vocab_size, c.data.tokenizer, tokenizer_vocab);
  c.resolved = resolved;
  return c;
}

int64_t DistConfig::bucket_elements() const {
  return std::max<int64_t>(1, static_cast<int64_t>(bucket_mb * 1024 * 1024 / 4));
}

Config load_config(const std::string& path, const std::vector<std::string>& overrides) {
  std::ifstream in(path);
  check(in.good(), "config: cannot open {}", path);
  json j;
  try {
    j = json::parse(in);
  } catch (const json::parse_error& e) {
    throw Error(fmt::format("config: {} is not valid JSON: {}", path, e.what()));
  }
  for (const std::string& o : overrides) {
    const auto eq = o.find('=');
    check(eq != std::string::npos && eq > 0, "--set {}: expected key.path=value", o);
    const std::string key = o.substr(0, eq), text = o.substr(eq + 1);
    json value;
    try {
      value = json::parse(text);
    } catch (const json::parse_error&) {
      value = text;  // a bare word is a string
    }
    json* node = &j;
    std::stringstream parts(key);
    std::string part;
    std::vector<std::string> names;
    while (std::getline(parts, part, '.')) names.push_back(part);
    for (size_t i = 0; i + 1 < names.size(); ++i) {
      json& child = (*node)[names[i]];
      if (child.is_null()) child = json::object();
      check(child.is_object(), "--set {}: {} is not an object", o, names[i]);
      node = &child;
    }
    (*node)[names.back()] = value;
  }
  try {
    return parse_config(j);
  } catch (const Error& e) {
    std::string where = path;
    for (size_t i = 0; i < overrides.size(); ++i) where += (i ? " " : " with --set ") + overrides[i];
    throw Error(fmt::format("{} (in {})", e.what(), where));
  }
}

}  // namespace llmt
