// Safetensors files: a memory-mapped reader that hands out zero-copy tensor views, and a writer
// whose output is byte-identical to the Python `safetensors` library's for the same tensors.
//
// Layout: 8-byte little-endian header length N, N bytes of JSON header
//   {"__metadata__": {str: str}, "<name>": {"dtype": "F32", "shape": [..], "data_offsets": [b, e]}}
// then the data section; offsets are relative to its start (byte 8 + N).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>

#include "models/weights/tensor_source.h"

namespace xfuser::models {

namespace detail {
struct MappedFile;
}  // namespace detail

// The safetensors dtype names this reader and writer understand, in the format's alignment order.
std::vector<std::string> safetensors_dtype_names();

// One .safetensors file, mapped privately (copy-on-write) for the lifetime of this object and of
// every tensor it handed out. F8_E4M3 / F8_E5M2 load as the libtorch fp8 types where libtorch
// has them (>= 2.1) and are decoded to float32 otherwise (info().dtype says which).
class SafetensorsFile : public TensorSource {
 public:
  // Maps and validates the whole header; throws xfuser::Error naming the file (and the tensor)
  // for any malformed or inconsistent entry.
  explicit SafetensorsFile(const std::string& path);
  ~SafetensorsFile() override;
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  std::vector<std::string> names() const override;
  bool contains(const std::string& name) const override;
  TensorInfo info(const std::string& name) const override;
  // A zero-copy view of the mapping; a copy when the data is not aligned to the element size,
  // for empty tensors, and for fp8 decoded to float32.
  at::Tensor get(const std::string& name) const override;
  // dim 0: a zero-copy view of rows [start, start + length); other dims: a contiguous copy, after
  // which the tensor's pages of the mapping are released (they are re-read from the file if
  // touched again, so in-place writes made earlier through views of that tensor are dropped).
  at::Tensor get_slice(const std::string& name, int64_t dim, int64_t start,
                       int64_t length) const override;
  std::string describe() const override { return path_; }
  // Drops the tensor's whole pages of the mapping (MADV_DONTNEED on clean private pages).
  void release(const std::string& name) const override;

  const std::string& path() const { return path_; }
  // The header's "__metadata__" (empty when absent).
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  struct Entry {
    int dtype_index = 0;  // index into the dtype table of safetensors.cpp
    std::vector<int64_t> shape;
    uint64_t begin = 0;  // byte offsets in the data section
    uint64_t end = 0;
  };
  const Entry& entry(const std::string& name) const;
  at::Tensor make_tensor(const Entry& e, const uint8_t* data, std::vector<int64_t> shape) const;

  std::string path_;
  std::shared_ptr<detail::MappedFile> mapping_;
  uint64_t data_start_ = 0;  // 8 + header length
  std::map<std::string, Entry> entries_;
  std::map<std::string, std::string> metadata_;
};

// Writes `tensors` (any device, any layout; stored contiguous, little-endian) as one safetensors
// file. The bytes match the Python library's save_file(): data ordered by descending dtype
// alignment then by name, the header listing tensors in data order after "__metadata__" (omitted
// when `metadata` is empty), compact JSON padded with spaces to a multiple of 8 bytes. Written
// to a temporary file in the same folder and renamed when complete.
void save_safetensors(const std::string& path, const std::map<std::string, at::Tensor>& tensors,
                      const std::map<std::string, std::string>& metadata = {});

}  // namespace xfuser::models
