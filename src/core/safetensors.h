// The safetensors file format (a little-endian u64 header length, a JSON header naming each
// tensor's dtype, shape and byte range, then the raw bytes), used for checkpoints and for
// `llmtrain probe` inputs and outputs.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace llmt {

/// One tensor to write: `data` points to numel(shape) elements of `dtype` in host memory.
struct SafetensorsEntry {
  std::string name;
  DType dtype = DType::f32;
  std::vector<int64_t> shape;
  const void* data = nullptr;
};

/// Writes `entries` (in the given order) and string `metadata` to `path`, then fsyncs it.
/// Throws llmt::Error naming the path on I/O failure.
void write_safetensors(const std::string& path, const std::vector<SafetensorsEntry>& entries,
                       const std::map<std::string, std::string>& metadata = {});

/// A safetensors file read fully into memory. F32, F64, I32 and BF16 tensors are supported
/// (BF16: read copies the raw 16-bit values; read_f64 converts them).
class SafetensorsFile {
 public:
  struct Info {
    DType dtype = DType::f32;
    std::vector<int64_t> shape;
    size_t begin = 0, end = 0;  ///< byte range within the data section
  };

  /// Reads and validates `path`: header length within the file, JSON header, every byte
  /// range inside the data section and matching dtype x shape. Errors name the file and the
  /// byte offset (e.g. a truncated file: expected size vs actual).
  explicit SafetensorsFile(const std::string& path);

  bool contains(const std::string& name) const { return infos_.count(name) != 0; }
  const Info& info(const std::string& name) const;
  /// Copies tensor `name` to `out` after checking that its dtype and shape are as given.
  void read(const std::string& name, DType dtype, const std::vector<int64_t>& shape, void* out) const;
  /// The tensor as doubles (converting from F32 or BF16), with its shape.
  std::vector<double> read_f64(const std::string& name) const;
  const std::map<std::string, Info>& tensors() const { return infos_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::vector<uint8_t> bytes_;
  size_t data_start_ = 0;
  std::map<std::string, Info> infos_;
  std::map<std::string, std::string> metadata_;
};

/// Writes `bytes` to `path` and fsyncs the file (POSIX write + fsync). Throws llmt::Error
/// naming the path on failure.
void write_file_synced(const std::string& path, const std::string& bytes);

/// fsyncs a directory so that renames and creations inside it are durable.
void fsync_directory(const std::string& path);

}  // namespace llmt
