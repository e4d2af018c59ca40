// Token shard files (data.md section 5.1, the llm.c format): a header of 256 little-endian
// int32 ([0] magic 20240520, [1] version: 1 = uint16 tokens, 7 = uint32 tokens, [2] token
// count N, rest zero), then N tokens. File size must be exactly 1024 + N * token size.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace llmt {

/// Writes `tokens` to `path` atomically (a temporary name in the same directory, fsync,
/// rename). Uses uint16 storage when every id < 65536 and `force_u32` is false, else uint32.
/// Throws llmt::Error naming the path on I/O failure or a negative id.
void write_shard(const std::string& path, const std::vector<int32_t>& tokens, bool force_u32 = false);

/// A read-only memory map of one shard. Validates the header and the file size on open and
/// throws llmt::Error naming the file and the byte offset of the problem (bad magic at 0,
/// unknown version at 4, truncated body: expected vs actual size).
class ShardReader {
 public:
  explicit ShardReader(const std::string& path);
  ~ShardReader();
  ShardReader(const ShardReader&) = delete;
  ShardReader& operator=(const ShardReader&) = delete;
  ShardReader(ShardReader&& other) noexcept;
  ShardReader& operator=(ShardReader&& other) noexcept;

  int64_t size() const { return num_tokens_; }             ///< number of tokens N
  bool is_u32() const { return token_bytes_ == 4; }
  int32_t at(int64_t i) const;                              ///< token i (no bounds check)
  /// Copies tokens [begin, begin + count) to out as int32; throws when out of range.
  void read(int64_t begin, int64_t count, int32_t* out) const;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  const uint8_t* map_ = nullptr;
  size_t map_bytes_ = 0;
  int64_t num_tokens_ = 0;
  int token_bytes_ = 2;
};

}  // namespace llmt
