#include "core/safetensors.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstring>
#include <fstream>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace llmt {
namespace {

const char* st_name(DType t) {
  switch (t) {
    case DType::f32: return "F32";
    case DType::f64: return "F64";
    case DType::i32: return "I32";
    case DType::bf16: return "BF16";
  }
  return "?";
}

DType st_dtype(const std::string& s, const std::string& path, const std::string& tensor) {
  if (s == "F32") return DType::f32;
  if (s == "F64") return DType::f64;
  if (s == "I32") return DType::i32;
  if (s == "BF16") return DType::bf16;
  throw Error(fmt::format("{}: tensor {} has dtype {}; supported: F32, F64, I32, BF16", path, tensor, s));
}

int64_t numel_of(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? "," : "") + std::to_string(shape[i]);
  return s + "]";
}

}  // namespace

void write_file_synced(const std::string& path, const std::string& bytes) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  check(fd >= 0, "cannot create {}: {}", path, std::strerror(errno));
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0) {
      const int err = errno;
      ::close(fd);
      throw Error(fmt::format("write to {} failed at offset {}: {}", path, done, std::strerror(err)));
    }
    done += static_cast<size_t>(n);
  }
  const bool synced = ::fsync(fd) == 0;
  ::close(fd);
  check(synced, "fsync of {} failed: {}", path, std::strerror(errno));
}

void fsync_directory(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY);
  check(fd >= 0, "cannot open directory {}: {}", path, std::strerror(errno));
  ::fsync(fd);
  ::close(fd);
}

void write_safetensors(const std::string& path, const std::vector<SafetensorsEntry>& entries,
                       const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  size_t offset = 0;
  for (const auto& e : entries) {
    const size_t bytes = static_cast<size_t>(numel_of(e.shape)) * dtype_size(e.dtype);
    header[e.name] = {{"dtype", st_name(e.dtype)}, {"shape", e.shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string head = header.dump();
  head.append((8 - head.size() % 8) % 8, ' ');  // align the data section to 8 bytes
  std::string out(8, '\0');
  const uint64_t n = head.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  out += head;
  out.reserve(out.size() + offset);
  for (const auto& e : entries)
    out.append(static_cast<const char*>(e.data), static_cast<size_t>(numel_of(e.shape)) * dtype_size(e.dtype));
  write_file_synced(path, out);
}

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
  std::ifstream in(path, std::ios::binary);
  check(in.good(), "cannot open {}", path);
  bytes_.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  check(bytes_.size() >= 8, "{}: truncated: {} bytes, the 8-byte header length at offset 0 is incomplete", path,
        bytes_.size());
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= uint64_t{bytes_[i]} << (8 * i);
  check(n <= bytes_.size() - 8, "{}: truncated: header of {} bytes at offset 8 but the file has {} bytes", path, n,
        bytes_.size());
  data_start_ = 8 + n;
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(bytes_.begin() + 8, bytes_.begin() + static_cast<std::ptrdiff_t>(data_start_));
  } catch (const nlohmann::json::exception& e) {
    throw Error(fmt::format("{}: bad JSON header at offset 8: {}", path, e.what()));
  }
  const size_t data_bytes = bytes_.size() - data_start_;
  for (const auto& [name, v] : header.items()) {
    if (name == "__metadata__") {
      for (const auto& [k, s] : v.items()) metadata_[k] = s.get<std::string>();
      continue;
    }
    Info info;
    try {
      info.dtype = st_dtype(v.at("dtype").get<std::string>(), path, name);
      info.shape = v.at("shape").get<std::vector<int64_t>>();
      info.begin = v.at("data_offsets").at(0).get<size_t>();
      info.end = v.at("data_offsets").at(1).get<size_t>();
    } catch (const nlohmann::json::exception& e) {
      throw Error(fmt::format("{}: bad header entry for {}: {}", path, name, e.what()));
    }
    check(info.end >= info.begin && info.end - info.begin == numel_of(info.shape) * dtype_size(info.dtype),
          "{}: tensor {} byte range [{}, {}) does not match {} {}", path, name, info.begin, info.end,
          st_name(info.dtype), shape_str(info.shape));
    check(info.end <= data_bytes,
          "{}: truncated: tensor {} ends at byte offset {} but the file has {} bytes (expected at least {})", path,
          name, data_start_ + info.end, bytes_.size(), data_start_ + info.end);
    infos_[name] = info;
  }
}

const SafetensorsFile::Info& SafetensorsFile::info(const std::string& name) const {
  auto it = infos_.find(name);
  check(it != infos_.end(), "{}: no tensor named {}", path_, name);
  return it->second;
}

void SafetensorsFile::read(const std::string& name, DType dtype, const std::vector<int64_t>& shape, void* out) const {
  const Info& i = info(name);
  check(i.dtype == dtype && i.shape == shape, "{}: tensor {} is {} {}, expected {} {}", path_, name, st_name(i.dtype),
        shape_str(i.shape), st_name(dtype), shape_str(shape));
  std::memcpy(out, bytes_.data() + data_start_ + i.begin, i.end - i.begin);
}

std::vector<double> SafetensorsFile::read_f64(const std::string& name) const {
  const Info& i = info(name);
  const uint8_t* p = bytes_.data() + data_start_ + i.begin;
  const int64_t n = numel_of(i.shape);
  std::vector<double> out(static_cast<size_t>(n));
  check(i.dtype != DType::i32, "{}: tensor {} is I32, expected a float tensor", path_, name);
  for (int64_t k = 0; k < n; ++k) {
    if (i.dtype == DType::f64) {
      std::memcpy(&out[k], p + 8 * k, 8);
    } else if (i.dtype == DType::bf16) {  // the upper 16 bits of an f32
      uint16_t b;
      std::memcpy(&b, p + 2 * k, 2);
      const uint32_t u = static_cast<uint32_t>(b) << 16;
      float f;
      std::memcpy(&f, &u, 4);
      out[k] = f;
    } else {
      float f;
      std::memcpy(&f, p + 4 * k, 4);
      out[k] = f;
    }
  }
  return out;
}

}  // namespace llmt
