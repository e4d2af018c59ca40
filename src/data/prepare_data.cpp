#include "data/prepare_data.h"

#include <fcntl.h>
#include <glob.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <mutex>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>
#ifdef LLMT_HAVE_ZSTD
#include <zstd.h>
#endif

#include "core/error.h"
#include "data/tokenizer.h"
#include "data/shard.h"

namespace llmt {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

enum class Kind { jsonl, jsonl_zst, parquet, txt, unknown };

Kind kind_of(const std::string& path) {
  if (ends_with(path, ".jsonl.zst")) return Kind::jsonl_zst;
  if (ends_with(path, ".jsonl")) return Kind::jsonl;
  if (ends_with(path, ".parquet")) return Kind::parquet;
  if (ends_with(path, ".txt")) return Kind::txt;
  return Kind::unknown;
}

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

uint64_t fnv1a64(const void* data, size_t n, uint64_t h = 0xcbf29ce484222325ull) {
  const auto* p = static_cast<const uint8_t*>(data);
  for (size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 0x100000001b3ull;
  }
  return h;
}

// ---- byte sources: a file, a zstd-compressed file, the stdout of a converter process ----

class Source {
 public:
  virtual ~Source() = default;
  /// Up to n bytes into buf; 0 at the end. Throws llmt::Error naming the file.
  virtual size_t read(char* buf, size_t n) = 0;
  /// Bytes of the input file consumed so far (for progress), when known.
  virtual uint64_t consumed() const { return 0; }
  /// Called once after read returned 0: reports a failure only detectable at the end.
  virtual void finish() {}
};

class FileSource : public Source {
 public:
  explicit FileSource(std::string path) : path_(std::move(path)) {
    fd_ = ::open(path_.c_str(), O_RDONLY);
    check(fd_ >= 0, "prepare-data: cannot open {}: {}", path_, std::strerror(errno));
  }
  ~FileSource() override { ::close(fd_); }
  size_t read(char* buf, size_t n) override {
    for (;;) {
      const ssize_t got = ::read(fd_, buf, n);
      if (got < 0 && errno == EINTR) continue;
      check(got >= 0, "prepare-data: cannot read {} at byte offset {}: {}", path_, consumed_, std::strerror(errno));
      consumed_ += static_cast<uint64_t>(got);
      return static_cast<size_t>(got);
    }
  }
  uint64_t consumed() const override { return consumed_; }

 private:
  std::string path_;
  int fd_ = -1;
  uint64_t consumed_ = 0;
};

#ifdef LLMT_HAVE_ZSTD
class ZstdSource : public Source {
 public:
  explicit ZstdSource(const std::string& path) : path_(path), file_(path), in_buf_(ZSTD_DStreamInSize()) {
    stream_ = ZSTD_createDStream();
    check(stream_ != nullptr, "prepare-data: {}: out of memory for a zstd stream", path_);
    ZSTD_initDStream(stream_);
  }
  ~ZstdSource() override { ZSTD_freeDStream(stream_); }
  size_t read(char* buf, size_t n) override {
    ZSTD_outBuffer out{buf, n, 0};
    while (out.pos == 0) {
      if (in_.pos == in_.size) {
        const size_t got = file_.read(in_buf_.data(), in_buf_.size());
        if (got == 0) return 0;
        in_ = ZSTD_inBuffer{in_buf_.data(), got, 0};
        in_start_ = file_.consumed() - got;
      }
      const size_t rc = ZSTD_decompressStream(stream_, &out, &in_);
      check(!ZSTD_isError(rc), "prepare-data: {}: corrupt zstd data near compressed byte offset {}: {}", path_,
            in_start_ + in_.pos, ZSTD_getErrorName(rc));
      last_rc_ = rc;
    }
    return out.pos;
  }
  uint64_t consumed() const override { return file_.consumed(); }
  void finish() override {
    check(last_rc_ == 0, "prepare-data: {}: truncated zstd data (the last frame ends early at compressed byte {})",
          path_, file_.consumed());
  }

 private:
  std::string path_;
  FileSource file_;
  std::vector<char> in_buf_;
  ZSTD_inBuffer in_{nullptr, 0, 0};
  uint64_t in_start_ = 0;
  ZSTD_DStream* stream_ = nullptr;
  size_t last_rc_ = 0;
};
#endif

std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

// The parquet converter script: ./tools/parquet2jsonl.mjs, else the source tree's.
std::string converter_script() {
  std::vector<std::string> candidates = {"tools/parquet2jsonl.mjs"};
#ifdef LLMT_SOURCE_DIR
  candidates.push_back(std::string(LLMT_SOURCE_DIR) + "/tools/parquet2jsonl.mjs");
#endif
  for (const auto& c : candidates) {
    if (fs::exists(c)) return c;
  }
  throw Error("prepare-data: tools/parquet2jsonl.mjs not found (run from the repository root)");
}

// Fails with an install hint unless `node` runs and the converter's npm packages are present.
void check_node(const std::string& node, const std::string& script, const std::string& for_file) {
  const std::string probe = shell_quote(node) + " --version >/dev/null 2>&1";
  const int rc = std::system(probe.c_str());
  check(rc == 0,
        "prepare-data: reading {} needs Node.js (>= 18) to run tools/parquet2jsonl.mjs, but `{} --version` failed. "
        "Install it (Debian: apt-get install nodejs npm), then install the converter's packages with "
        "`npm ci --prefix tools` (scripts/quickstart.sh does both)",
        for_file, node);
  const std::string modules = fs::path(script).parent_path().string() + "/node_modules/hyparquet";
  check(fs::exists(modules),
        "prepare-data: reading {} needs the npm packages of tools/package.json ({} is missing): run "
        "`npm ci --prefix {}`",
        for_file, modules, fs::path(script).parent_path().string());
}

class PipeSource : public Source {
 public:
  PipeSource(const std::string& node, const std::string& path) : path_(path) {
    const std::string script = converter_script();
    check_node(node, script, path);
    const std::string cmd = shell_quote(node) + " " + shell_quote(script) + " " + shell_quote(path);
    pipe_ = ::popen(cmd.c_str(), "r");
    check(pipe_ != nullptr, "prepare-data: cannot start `{}`: {}", cmd, std::strerror(errno));
  }
  ~PipeSource() override {
    if (pipe_ != nullptr) ::pclose(pipe_);
  }
  size_t read(char* buf, size_t n) override {
    const size_t got = std::fread(buf, 1, n, pipe_);
    check(got > 0 || !std::ferror(pipe_), "prepare-data: reading the converter output of {} failed", path_);
    return got;
  }
  void finish() override {
    const int status = ::pclose(pipe_);
    pipe_ = nullptr;
    check(status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0,
          "prepare-data: tools/parquet2jsonl.mjs failed on {} (exit status {}; its message is above)", path_,
          WIFEXITED(status) ? WEXITSTATUS(status) : -1);
  }

 private:
  std::string path_;
  FILE* pipe_ = nullptr;
};

// Splits a source into '\n'-terminated lines (no length limit).
class LineReader {
 public:
  explicit LineReader(std::unique_ptr<Source> src) : src_(std::move(src)), buf_(1 << 20) {}
  bool next(std::string* line) {
    line->clear();
    for (;;) {
      if (pos_ == end_) {
        if (eof_) return !line->empty() && (++line_no_, true);
        end_ = src_->read(buf_.data(), buf_.size());
        pos_ = 0;
        if (end_ == 0) {
          eof_ = true;
          src_->finish();
          continue;
        }
      }
      const char* start = buf_.data() + pos_;
      const void* nl = std::memchr(start, '\n', end_ - pos_);
      if (nl == nullptr) {
        line->append(start, end_ - pos_);
        pos_ = end_;
        continue;
      }
      const size_t len = static_cast<const char*>(nl) - start;
      line->append(start, len);
      pos_ += len + 1;
      ++line_no_;
      return true;
    }
  }
  int64_t line_no() const { return line_no_; }
  Source& source() { return *src_; }

 private:
  std::unique_ptr<Source> src_;
  std::vector<char> buf_;
  size_t pos_ = 0, end_ = 0;
  bool eof_ = false;
  int64_t line_no_ = 0;
};

struct Doc {
  std::string text;
  int stream = 0;        // 0 train, 1 val
  int64_t g = 0;         // global index among kept documents
  int64_t skip = 0;      // leading tokens already in finished shards
  const std::string* file = nullptr;
  int64_t line = 0;      // 0 for a .txt document
  std::vector<int32_t> tokens;
};

// A fixed pool of tokenizer threads working on one batch at a time (work is claimed through an
// atomic index; results land in the batch's own slots, so the order never depends on timing).
class Pool {
 public:
  explicit Pool(int n) {
    for (int i = 0; i < n; ++i) threads_.emplace_back([this] { loop(); });
  }
  ~Pool() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
  }
  /// Runs fn(i) for i in [0, n) on the pool; rethrows the first exception.
  void run(size_t n, const std::function<void(size_t)>& fn) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      fn_ = &fn;
      n_ = n;
      next_ = 0;
      active_ = threads_.size();
      error_ = nullptr;
      ++generation_;
    }
    cv_.notify_all();
    std::unique_lock<std::mutex> lock(mu_);
    done_cv_.wait(lock, [&] { return active_ == 0; });
    if (error_) std::rethrow_exception(error_);
  }

 private:
  void loop() {
    uint64_t seen = 0;
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
        if (stop_) return;
        seen = generation_;
      }
      for (;;) {
        const size_t i = next_.fetch_add(1);
        if (i >= n_) break;
        try {
          (*fn_)(i);
        } catch (...) {
          std::lock_guard<std::mutex> lock(mu_);
          if (!error_) error_ = std::current_exception();
        }
      }
      std::lock_guard<std::mutex> lock(mu_);
      if (--active_ == 0) done_cv_.notify_all();
    }
  }
  std::vector<std::thread> threads_;
  std::mutex mu_;
  std::condition_variable cv_, done_cv_;
  const std::function<void(size_t)>* fn_ = nullptr;
  size_t n_ = 0;
  std::atomic<size_t> next_{0};
  size_t active_ = 0;
  uint64_t generation_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
};

void write_json_atomic(const std::string& path, const json& j) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << j.dump(1) << '\n';
    check(static_cast<bool>(out.flush()), "prepare-data: cannot write {}", tmp);
  }
  const int fd = ::open(tmp.c_str(), O_RDONLY);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
  check(std::rename(tmp.c_str(), path.c_str()) == 0, "prepare-data: cannot rename {} to {}: {}", tmp, path,
        std::strerror(errno));
}

void fsync_dir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

struct StopRequested {};

const char* const kStreamName[2] = {"train", "val"};

int hex_value(const std::string& s, size_t at) {  // the 4 hex digits at s[at..at+4), or -1
  if (at + 4 > s.size()) return -1;
  int v = 0;
  for (size_t k = at; k < at + 4; ++k) {
    const char c = s[k];
    const int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
    if (d < 0) return -1;
    v = v * 16 + d;
  }
  return v;
}

// JSON text with every unpaired UTF-16 surrogate escape (\uD800-\uDFFF without its partner)
// replaced by \uFFFD (data.md 2.1: such text cannot be UTF-8; Python's json accepts it, we
// replace and count). Paired surrogates and all other escapes are kept.
std::string replace_lone_surrogates(const std::string& line, int64_t* replaced) {
  std::string out;
  out.reserve(line.size());
  for (size_t i = 0; i < line.size();) {
    if (line[i] != '\\' || i + 1 >= line.size()) {
      out += line[i++];
      continue;
    }
    if (line[i + 1] != 'u') {  // any other escape: two characters
      out.append(line, i, 2);
      i += 2;
      continue;
    }
    const int v = hex_value(line, i + 2);
    if (v >= 0xD800 && v <= 0xDBFF && i + 12 <= line.size() && line[i + 6] == '\\' && line[i + 7] == 'u' &&
        hex_value(line, i + 8) >= 0xDC00 && hex_value(line, i + 8) <= 0xDFFF) {
      out.append(line, i, 12);  // a proper pair
      i += 12;
    } else if (v >= 0xD800 && v <= 0xDFFF) {
      out += "\\ufffd";
      ++*replaced;
      i += 6;
    } else {
      out.append(line, i, 2);
      i += 2;
    }
  }
  return out;
}

struct Stream {
  std::vector<int32_t> buffer;  // tokens not yet in a finished shard
  struct Segment {
    int64_t g, doc_offset, buf_pos, len;
  };
  std::deque<Segment> segments;
  int64_t cursor_g = 0, cursor_offset = 0;  // where the buffer starts
  json shards = json::array();
  int64_t tokens = 0;                       // in finished shards
  int64_t documents = 0;
};

std::string fmt_duration(double seconds) {
  if (!(seconds >= 0) || seconds > 1e7) return "?";
  const auto s = static_cast<int64_t>(seconds);
  return fmt::format("{}:{:02d}:{:02d}", s / 3600, (s / 60) % 60, s % 60);
}

}  // namespace

bool is_val_document(int64_t g, double val_fraction) {
  if (val_fraction <= 0) return false;
  const double u = static_cast<double>(splitmix64(static_cast<uint64_t>(g)) >> 11) * 0x1.0p-53;
  return u < val_fraction;
}

std::vector<std::string> expand_inputs(const std::vector<std::string>& inputs) {
  std::vector<std::string> files;
  for (const std::string& in : inputs) {
    std::error_code ec;
    if (fs::is_directory(in, ec)) {
      std::vector<std::string> found;
      for (const auto& e : fs::recursive_directory_iterator(in)) {
        if (e.is_regular_file() && kind_of(e.path().string()) != Kind::unknown) found.push_back(e.path().string());
      }
      check(!found.empty(), "prepare-data: directory {} holds no .jsonl, .jsonl.zst, .parquet or .txt file", in);
      std::sort(found.begin(), found.end());
      files.insert(files.end(), found.begin(), found.end());
    } else if (fs::exists(in, ec)) {
      files.push_back(in);
    } else {
      glob_t g{};
      const int rc = ::glob(in.c_str(), 0, nullptr, &g);
      std::vector<std::string> found;
      if (rc == 0) {
        for (size_t i = 0; i < g.gl_pathc; ++i) found.push_back(g.gl_pathv[i]);
      }
      ::globfree(&g);
      check(!found.empty(), "prepare-data: input {} is no file or directory and matches nothing as a glob", in);
      std::sort(found.begin(), found.end());
      files.insert(files.end(), found.begin(), found.end());
    }
  }
  for (const auto& f : files) {
    check(kind_of(f) != Kind::unknown,
          "prepare-data: {}: unknown input type (expected .jsonl, .jsonl.zst, .parquet or .txt)", f);
  }
  return files;
}

PrepareResult prepare_data(const PrepareOptions& o) {
  check(!o.out_dir.empty(), "prepare-data: --out is required");
  check(o.val_fraction >= 0 && o.val_fraction < 1, "prepare-data: --val-fraction must be in [0, 1), got {}",
        o.val_fraction);
  check(o.shard_tokens > 0 && o.shard_tokens <= INT32_MAX, "prepare-data: --shard-tokens must be in [1, 2^31), got {}",
        o.shard_tokens);
  check(o.doc_separator == "none" || o.doc_separator == "eos" || o.doc_separator == "bos",
        "prepare-data: --doc-separator must be none, eos or bos, got \"{}\"", o.doc_separator);
  const std::vector<std::string> files = expand_inputs(o.inputs);
  const std::unique_ptr<Tokenizer> tok_ptr = load_tokenizer(o.tokenizer);
  const Tokenizer& tok = *tok_ptr;
  int32_t separator = -1;
  if (o.doc_separator != "none") {
    separator = o.doc_separator == "eos" ? tok.eos_id() : tok.bos_id();
    check(separator >= 0, "prepare-data: tokenizer {} has no {} token for --doc-separator {}", tok.name(),
          o.doc_separator, o.doc_separator);
  }
  const bool u32 = tok.vocab_size() > 65536;

  // What decides the output: a rerun must match it to reuse finished shards.
  json sources = json::array();
  uint64_t total_input_bytes = 0;
  for (const auto& f : files) {
    const auto bytes = fs::file_size(f);
    total_input_bytes += bytes;
    sources.push_back({{"path", f}, {"bytes", bytes}});
  }
  const json fingerprint = {
      {"tokenizer", tok.name()},
      {"tokenizer_hash", tok.hash()},
      {"sources", sources},
      {"val_fraction", o.val_fraction},
      {"shard_tokens", o.shard_tokens},
      {"doc_separator", o.doc_separator},
      {"include_sets", o.include_sets},
      {"exclude_sets", o.exclude_sets},
      {"min_int_score", o.min_int_score ? json(*o.min_int_score) : json(nullptr)},
  };

  std::error_code ec;
  fs::create_directories(o.out_dir, ec);
  check(!ec, "prepare-data: cannot create {}: {}", o.out_dir, ec.message());
  const std::string state_path = o.out_dir + "/prepare_state.json";
  const std::string dataset_path = o.out_dir + "/dataset.json";

  PrepareResult result;
  Stream streams[2];
  bool was_complete = false;
  if (fs::exists(state_path)) {
    std::ifstream in(state_path);
    const json saved = json::parse(in, nullptr, false);
    check(!saved.is_discarded() && saved.contains("fingerprint") && saved.contains("streams"),
          "prepare-data: {} is not a prepare-data state file; delete it to start over", state_path);
    for (const auto& [key, value] : fingerprint.items()) {
      check(saved["fingerprint"].contains(key) && saved["fingerprint"][key] == value,
            "prepare-data: {} holds a run with a different {} (saved {}, now {}); use another --out directory or "
            "delete {} to start over",
            o.out_dir, key, saved["fingerprint"].value(key, json()).dump().substr(0, 200), value.dump().substr(0, 200),
            state_path);
    }
    for (int s = 0; s < 2; ++s) {
      const json& st = saved["streams"][kStreamName[s]];
      streams[s].shards = st["shards"];
      streams[s].cursor_g = st["next_document"];
      streams[s].cursor_offset = st["next_offset"];
      for (const auto& sh : streams[s].shards) {
        const std::string path = o.out_dir + "/" + sh["file"].get<std::string>();
        const int64_t tokens = sh["tokens"];
        const uint64_t expected = 1024 + static_cast<uint64_t>(tokens) * (u32 ? 4 : 2);
        check(fs::exists(path) && fs::file_size(path) == expected,
              "prepare-data: finished shard {} recorded in {} is missing or not {} bytes; delete {} to start over",
              path, state_path, expected, state_path);
        streams[s].tokens += tokens;
        ++result.shards_reused;
      }
    }
    was_complete = saved.value("complete", false) && fs::exists(dataset_path);
  }
  if (was_complete) {
    const json ds = json::parse(std::ifstream(dataset_path), nullptr, false);
    check(!ds.is_discarded(), "prepare-data: {} is not valid JSON; delete it and {} to start over", dataset_path,
          state_path);
    result.documents = ds["documents"]["total"];
    result.filtered_out = ds["documents"]["filtered_out"];
    result.train_tokens = ds["train"]["tokens"];
    result.val_tokens = ds["val"]["tokens"];
    result.complete = true;
    if (o.progress) fmt::print(stderr, "prepare-data: {} is already complete ({} tokens)\n", o.out_dir,
                               result.train_tokens + result.val_tokens);
    return result;
  }

  const auto save_state = [&](bool complete) {
    json st = json::object();
    for (int s = 0; s < 2; ++s) {
      st[kStreamName[s]] = {{"shards", streams[s].shards},
                            {"next_document", streams[s].cursor_g},
                            {"next_offset", streams[s].cursor_offset}};
    }
    write_json_atomic(state_path, {{"fingerprint", fingerprint}, {"streams", st}, {"complete", complete}});
  };

  // Writes the first `count` buffered tokens of stream s as its next shard.
  const auto emit_shard = [&](int s, int64_t count) {
    Stream& st = streams[s];
    const std::string name = fmt::format("{}_{:06d}.bin", kStreamName[s], st.shards.size());
    const std::vector<int32_t> tokens(st.buffer.begin(), st.buffer.begin() + count);
    write_shard(o.out_dir + "/" + name, tokens, u32);
    fsync_dir(o.out_dir);
    uint64_t h = 0xcbf29ce484222325ull;
    if (u32) {
      h = fnv1a64(tokens.data(), tokens.size() * 4, h);
    } else {
      const std::vector<uint16_t> narrow(tokens.begin(), tokens.end());
      h = fnv1a64(narrow.data(), narrow.size() * 2, h);
    }
    st.shards.push_back({{"file", name}, {"tokens", count}, {"checksum", fmt::format("fnv1a64:{:016x}", h)}});
    st.tokens += count;
    // The new buffer start: inside the segment that holds position `count`.
    while (!st.segments.empty() && st.segments.front().buf_pos + st.segments.front().len < count) {
      st.segments.pop_front();
    }
    if (!st.segments.empty()) {
      const auto& seg = st.segments.front();
      st.cursor_g = seg.g;
      st.cursor_offset = seg.doc_offset + (count - seg.buf_pos);
    }
    st.buffer.erase(st.buffer.begin(), st.buffer.begin() + count);
    for (auto& seg : st.segments) {
      const int64_t cut = std::min<int64_t>(std::max<int64_t>(count - seg.buf_pos, 0), seg.len);
      seg.doc_offset += cut;
      seg.len -= cut;
      seg.buf_pos = std::max<int64_t>(seg.buf_pos - count, 0);
    }
    save_state(false);
    ++result.shards_written;
    if (o.stop_after_shards >= 0 && result.shards_written >= o.stop_after_shards) throw StopRequested{};
  };

  const int threads = o.threads > 0 ? o.threads : std::max(1u, std::thread::hardware_concurrency());
  Pool pool(threads);
  std::vector<Doc> batch;
  size_t batch_bytes = 0;
  const auto flush_batch = [&] {
    pool.run(batch.size(), [&](size_t i) {
      Doc& d = batch[i];
      d.tokens.clear();
      if (separator >= 0) d.tokens.push_back(separator);
      try {
        tok.encode_append(d.text, &d.tokens);
      } catch (const Error& e) {
        throw Error(d.line > 0 ? fmt::format("prepare-data: {} line {}, field text: {}", *d.file, d.line, e.what())
                               : fmt::format("prepare-data: {}: {}", *d.file, e.what()));
      }
    });
    for (Doc& d : batch) {
      Stream& st = streams[d.stream];
      const auto skip = std::min<int64_t>(d.skip, static_cast<int64_t>(d.tokens.size()));
      const auto len = static_cast<int64_t>(d.tokens.size()) - skip;
      st.segments.push_back({d.g, skip, static_cast<int64_t>(st.buffer.size()), len});
      st.buffer.insert(st.buffer.end(), d.tokens.begin() + skip, d.tokens.end());
      while (static_cast<int64_t>(st.buffer.size()) >= o.shard_tokens) emit_shard(d.stream, o.shard_tokens);
    }
    batch.clear();
    batch_bytes = 0;
  };

  // Progress on stderr: documents/s, MB/s of input, ETA from the input bytes consumed.
  const auto t0 = std::chrono::steady_clock::now();
  auto last_print = t0;
  uint64_t input_done = 0, text_bytes = 0;
  const bool tty = ::isatty(2) != 0;
  const auto print_progress = [&](uint64_t consumed_now, bool final) {
    const auto now = std::chrono::steady_clock::now();
    if (!o.progress || (!final && now - last_print < std::chrono::seconds(tty ? 1 : 10))) return;
    last_print = now;
    const double secs = std::max(1e-9, std::chrono::duration<double>(now - t0).count());
    const double done = static_cast<double>(input_done + consumed_now);
    const double eta = done > 0 ? secs * (static_cast<double>(total_input_bytes) - done) / done : -1;
    fmt::print(stderr,
               "{}prepare-data: {} docs ({:.0f} docs/s), {:.1f} MB/s of text ({:.1f} MB/s of input files), {:.1f} MB "
               "text, {} tokens, ETA {}{}",
               tty ? "\r" : "", result.documents, static_cast<double>(result.documents) / secs,
               static_cast<double>(text_bytes) / secs / 1e6, done / secs / 1e6, static_cast<double>(text_bytes) / 1e6,
               streams[0].tokens + streams[1].tokens + static_cast<int64_t>(streams[0].buffer.size()) +
                   static_cast<int64_t>(streams[1].buffer.size()),
               final ? "0:00:00" : fmt_duration(eta), tty && !final ? "" : "\n");
  };

  json source_stats = json::array();
  int64_t next_g = 0;
  try {
    for (const std::string& file : files) {
      const Kind kind = kind_of(file);
      int64_t kept_here = 0;
      const auto add_doc = [&](std::string&& text, const std::string* set_name, const json* int_score,
                               int64_t line) {
        const bool keep_set =
            (o.include_sets.empty() ||
             (set_name && std::find(o.include_sets.begin(), o.include_sets.end(), *set_name) != o.include_sets.end())) &&
            !(set_name && std::find(o.exclude_sets.begin(), o.exclude_sets.end(), *set_name) != o.exclude_sets.end());
        bool keep = keep_set;
        if (keep && o.min_int_score) {
          check(int_score != nullptr && int_score->is_number(),
                "prepare-data: {} line {}: no numeric int_score, needed by --min-int-score", file, line);
          keep = int_score->get<double>() >= static_cast<double>(*o.min_int_score);
        }
        if (!keep) {
          ++result.filtered_out;
          return;
        }
        const int64_t g = next_g++;
        const int s = is_val_document(g, o.val_fraction) ? 1 : 0;
        ++streams[s].documents;
        ++result.documents;
        ++kept_here;
        text_bytes += text.size();
        const Stream& st = streams[s];
        if (g < st.cursor_g) return;  // already in finished shards
        Doc d;
        d.text = std::move(text);
        d.stream = s;
        d.g = g;
        d.skip = g == st.cursor_g ? st.cursor_offset : 0;
        d.file = &file;
        d.line = line;
        batch_bytes += d.text.size();
        batch.push_back(std::move(d));
        if (batch.size() >= 4096 || batch_bytes >= (8u << 20)) flush_batch();
      };

      if (kind == Kind::txt) {
        std::ifstream in(file, std::ios::binary);
        check(static_cast<bool>(in), "prepare-data: cannot open {}", file);
        std::ostringstream ss;
        ss << in.rdbuf();
        check(!in.bad(), "prepare-data: cannot read {}", file);
        add_doc(ss.str(), nullptr, nullptr, 0);
      } else {
        std::unique_ptr<Source> src;
        if (kind == Kind::jsonl) {
          src = std::make_unique<FileSource>(file);
        } else if (kind == Kind::jsonl_zst) {
#ifdef LLMT_HAVE_ZSTD
          src = std::make_unique<ZstdSource>(file);
#else
          throw Error(fmt::format("prepare-data: {}: this build has no zstd support; install libzstd-dev and rebuild",
                                  file));
#endif
        } else {
          src = std::make_unique<PipeSource>(o.node, file);
        }
        LineReader lines(std::move(src));
        std::string line;
        while (lines.next(&line)) {
          if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
          const int64_t line_no = lines.line_no();
          json j;
          try {
            j = json::parse(line);
          } catch (const json::exception& e) {
            int64_t replaced = 0;
            const std::string fixed = std::string(e.what()).find("surrogate") != std::string::npos
                                          ? replace_lone_surrogates(line, &replaced)
                                          : std::string();
            if (replaced == 0) {
              throw Error(fmt::format("prepare-data: {} line {}: invalid JSON: {}", file, line_no, e.what()));
            }
            try {
              j = json::parse(fixed);
            } catch (const json::exception& e2) {
              throw Error(fmt::format("prepare-data: {} line {}: invalid JSON: {}", file, line_no, e2.what()));
            }
            result.lone_surrogates += replaced;
          }
          check(j.is_object() && j.contains("text") && j["text"].is_string(),
                "prepare-data: {} line {}: no string field \"text\"", file, line_no);
          std::string set_name;
          bool has_set = false;
          if (j.contains("meta")) {
            json meta = j["meta"];
            if (meta.is_string()) meta = json::parse(meta.get<std::string>(), nullptr, false);  // SlimPajama-6B
            if (meta.is_object() && meta.contains("redpajama_set_name") && meta["redpajama_set_name"].is_string()) {
              set_name = meta["redpajama_set_name"];
              has_set = true;
            }
          }
          const json* score = j.contains("int_score") ? &j["int_score"] : nullptr;
          add_doc(std::move(j["text"].get_ref<std::string&>()), has_set ? &set_name : nullptr, score, line_no);
          print_progress(lines.source().consumed(), false);
        }
      }
      input_done += fs::file_size(file);
      source_stats.push_back({{"path", file}, {"bytes", fs::file_size(file)}, {"documents", kept_here}});
    }
    flush_batch();
    for (int s = 0; s < 2; ++s) {
      if (!streams[s].buffer.empty()) emit_shard(s, static_cast<int64_t>(streams[s].buffer.size()));
    }
  } catch (const StopRequested&) {
    result.train_tokens = streams[0].tokens;
    result.val_tokens = streams[1].tokens;
    return result;  // as if killed after the last finished shard
  }
  print_progress(0, true);

  result.train_tokens = streams[0].tokens;
  result.val_tokens = streams[1].tokens;
  result.complete = true;
  json dataset = {
      {"format", "llmt-dataset"},
      {"version", 1},
      {"tokenizer",
       {{"name", tok.name()},
        {"hash", tok.hash()},
        {"vocab_size", tok.vocab_size()},
        {"bos_id", tok.bos_id()},
        {"eos_id", tok.eos_id()}}},
      {"token_dtype", u32 ? "uint32" : "uint16"},
      {"shard_format", "llm.c: 256 x int32 header (magic 20240520, version 1 = uint16 / 7 = uint32, count), tokens"},
      {"doc_separator", o.doc_separator},
      {"separator_id", separator},
      {"val_fraction", o.val_fraction},
      {"shard_tokens", o.shard_tokens},
      {"filters",
       {{"include_sets", o.include_sets},
        {"exclude_sets", o.exclude_sets},
        {"min_int_score", o.min_int_score ? json(*o.min_int_score) : json(nullptr)}}},
      {"total_tokens", result.train_tokens + result.val_tokens},
      {"documents",
       {{"total", result.documents},
        {"train", streams[0].documents},
        {"val", streams[1].documents},
        {"filtered_out", result.filtered_out}}},
      {"lone_surrogates_replaced", result.lone_surrogates},
      {"train", {{"tokens", result.train_tokens}, {"shards", streams[0].shards}}},
      {"val", {{"tokens", result.val_tokens}, {"shards", streams[1].shards}}},
      {"sources", source_stats},
      {"checksum", "fnv1a64 of the token bytes after the 1024-byte header, as stored"},
  };
  write_json_atomic(dataset_path, dataset);
  save_state(true);
  fsync_dir(o.out_dir);
  return result;
}

}  // namespace llmt
