#include "data/shard.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <utility>

#include "core/error.h"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "shards are little-endian; this host is not");

namespace llmt {
namespace {

constexpr int32_t kMagic = 20240520;
constexpr int32_t kVersionU16 = 1;
constexpr int32_t kVersionU32 = 7;
constexpr size_t kHeaderBytes = 1024;

int32_t header_word(const uint8_t* map, int index) {
  int32_t v;
  std::memcpy(&v, map + 4 * index, 4);
  return v;
}

}  // namespace

void write_shard(const std::string& path, const std::vector<int32_t>& tokens, bool force_u32) {
  check(tokens.size() <= static_cast<size_t>(std::numeric_limits<int32_t>::max()),
        "write_shard {}: {} tokens do not fit the int32 header count", path, tokens.size());
  bool u32 = force_u32;
  for (size_t i = 0; i < tokens.size(); ++i) {
    check(tokens[i] >= 0, "write_shard {}: negative token id {} at position {}", path, tokens[i], i);
    if (tokens[i] > 65535) u32 = true;
  }
  int32_t header[kHeaderBytes / 4] = {};
  header[0] = kMagic;
  header[1] = u32 ? kVersionU32 : kVersionU16;
  header[2] = static_cast<int32_t>(tokens.size());

  const std::string tmp = path + ".tmp";
  FILE* f = std::fopen(tmp.c_str(), "wb");
  check(f != nullptr, "write_shard: cannot create {}: {}", tmp, std::strerror(errno));
  bool ok = std::fwrite(header, 1, sizeof(header), f) == sizeof(header);
  if (u32 && !tokens.empty()) {
    ok = ok && std::fwrite(tokens.data(), 4, tokens.size(), f) == tokens.size();
  } else if (!tokens.empty()) {
    const std::vector<uint16_t> narrow(tokens.begin(), tokens.end());
    ok = ok && std::fwrite(narrow.data(), 2, narrow.size(), f) == narrow.size();
  }
  ok = ok && std::fflush(f) == 0 && ::fsync(fileno(f)) == 0;
  int err = ok ? 0 : (errno != 0 ? errno : EIO);
  if (std::fclose(f) != 0 && err == 0) err = errno;
  if (err == 0 && std::rename(tmp.c_str(), path.c_str()) != 0) err = errno;
  if (err != 0) {
    std::remove(tmp.c_str());
    throw Error(fmt::format("write_shard: cannot write {}: {}", path, std::strerror(err)));
  }
}

ShardReader::ShardReader(const std::string& path) : path_(path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  check(fd >= 0, "shard {}: cannot open: {}", path, std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const std::string reason = std::strerror(errno);
    ::close(fd);
    throw Error(fmt::format("shard {}: cannot stat: {}", path, reason));
  }
  const auto file_bytes = static_cast<size_t>(st.st_size);
  if (file_bytes < kHeaderBytes) {
    ::close(fd);
    throw Error(fmt::format("shard {}: {} bytes, shorter than the {}-byte header", path, file_bytes, kHeaderBytes));
  }
  void* map = ::mmap(nullptr, file_bytes, PROT_READ, MAP_PRIVATE, fd, 0);
  const int map_errno = errno;
  ::close(fd);
  check(map != MAP_FAILED, "shard {}: cannot mmap {} bytes: {}", path, file_bytes, std::strerror(map_errno));
  map_ = static_cast<const uint8_t*>(map);
  map_bytes_ = file_bytes;

  // From here a failed check must unmap: the destructor does not run for a throwing constructor.
  const auto fail = [&](const std::string& message) {
    ::munmap(const_cast<uint8_t*>(map_), map_bytes_);
    map_ = nullptr;
    throw Error(message);
  };
  const int32_t magic = header_word(map_, 0), version = header_word(map_, 1), count = header_word(map_, 2);
  if (magic != kMagic) fail(fmt::format("shard {}: bad magic {} at byte offset 0 (expected {})", path, magic, kMagic));
  if (version != kVersionU16 && version != kVersionU32) {
    fail(fmt::format("shard {}: unknown version {} at byte offset 4 (expected {} = uint16 or {} = uint32)", path,
                     version, kVersionU16, kVersionU32));
  }
  if (count < 0) fail(fmt::format("shard {}: negative token count {} at byte offset 8", path, count));
  token_bytes_ = version == kVersionU32 ? 4 : 2;
  num_tokens_ = count;
  const size_t expected = kHeaderBytes + static_cast<size_t>(count) * static_cast<size_t>(token_bytes_);
  if (file_bytes != expected) {
    fail(fmt::format("shard {}: size {} bytes, expected {} (1024-byte header + {} tokens x {} bytes)", path,
                     file_bytes, expected, count, token_bytes_));
  }
}

ShardReader::~ShardReader() {
  if (map_ != nullptr) ::munmap(const_cast<uint8_t*>(map_), map_bytes_);
}

ShardReader::ShardReader(ShardReader&& other) noexcept
    : path_(std::move(other.path_)),
      map_(std::exchange(other.map_, nullptr)),
      map_bytes_(std::exchange(other.map_bytes_, 0)),
      num_tokens_(std::exchange(other.num_tokens_, 0)),
      token_bytes_(other.token_bytes_) {}

ShardReader& ShardReader::operator=(ShardReader&& other) noexcept {
  std::swap(path_, other.path_);
  std::swap(map_, other.map_);
  std::swap(map_bytes_, other.map_bytes_);
  std::swap(num_tokens_, other.num_tokens_);
  std::swap(token_bytes_, other.token_bytes_);
  return *this;
}

int32_t ShardReader::at(int64_t i) const {
  const uint8_t* p = map_ + kHeaderBytes + static_cast<size_t>(i) * static_cast<size_t>(token_bytes_);
  if (token_bytes_ == 4) {
    uint32_t v;
    std::memcpy(&v, p, 4);
    return static_cast<int32_t>(v);
  }
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

void ShardReader::read(int64_t begin, int64_t count, int32_t* out) const {
  check(begin >= 0 && count >= 0 && begin <= num_tokens_ && count <= num_tokens_ - begin,
        "shard {}: read of tokens [{}, {}) is outside [0, {})", path_, begin, begin + count, num_tokens_);
  for (int64_t i = 0; i < count; ++i) out[i] = at(begin + i);
}

}  // namespace llmt
