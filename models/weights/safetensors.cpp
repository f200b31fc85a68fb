#include "models/weights/safetensors.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <set>
#include <sstream>
#include <string_view>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>
#include <sys/mman.h>
#include <sys/stat.h>

#include "backends/error.h"
#include "backends/fp8.h"
#include "backends/tensor_util.h"

// libtorch >= 2.1 has fp8 dtypes; older versions decode fp8 to float32 on load.
#if XFUSER_TORCH_MAJOR > 2 || (XFUSER_TORCH_MAJOR == 2 && XFUSER_TORCH_MINOR >= 1)
#define XFUSER_NATIVE_FP8 1
#else
#define XFUSER_NATIVE_FP8 0
#endif

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "safetensors data is little-endian; big-endian hosts would need byte swapping");

namespace xfuser::models {

namespace detail {
// A private (copy-on-write) mapping of a whole file; unmapped when the last owner goes away.
struct MappedFile {
  void* addr = nullptr;
  size_t size = 0;
  ~MappedFile() {
    if (addr != nullptr) ::munmap(addr, size);
  }
  const uint8_t* bytes() const { return static_cast<const uint8_t*>(addr); }
};
}  // namespace detail

namespace {

using nlohmann::json;

enum class Fp8 { kNone, kE4M3, kE5M2 };

struct DtypeSpec {
  const char* name;
  int64_t size;          // bytes per element
  c10::ScalarType type;  // the libtorch type the tensor has once loaded
  bool writable;         // a libtorch tensor of `type` is stored as this dtype
  Fp8 fp8;
};

// In the format's alignment order (the Rust library's Dtype enum order): the writer sorts data
// by descending position in this table, then by name.
const DtypeSpec kDtypes[] = {
    {"BOOL", 1, at::kBool, true, Fp8::kNone},
    {"U8", 1, at::kByte, true, Fp8::kNone},
    {"I8", 1, at::kChar, true, Fp8::kNone},
#if XFUSER_NATIVE_FP8
    {"F8_E5M2", 1, c10::ScalarType::Float8_e5m2, true, Fp8::kE5M2},
    {"F8_E4M3", 1, c10::ScalarType::Float8_e4m3fn, true, Fp8::kE4M3},
#else
    {"F8_E5M2", 1, at::kFloat, false, Fp8::kE5M2}, {"F8_E4M3", 1, at::kFloat, false, Fp8::kE4M3},
#endif
    {"I16", 2, at::kShort, true, Fp8::kNone},
    {"F16", 2, at::kHalf, true, Fp8::kNone},
    {"BF16", 2, at::kBFloat16, true, Fp8::kNone},
    {"I32", 4, at::kInt, true, Fp8::kNone},
    {"F32", 4, at::kFloat, true, Fp8::kNone},
    {"F64", 8, at::kDouble, true, Fp8::kNone},
    {"I64", 8, at::kLong, true, Fp8::kNone},
};
constexpr int kNumDtypes = static_cast<int>(sizeof(kDtypes) / sizeof(kDtypes[0]));
constexpr bool kDecodeFp8 = !XFUSER_NATIVE_FP8;

std::string known_dtypes_str() {
  std::string out;
  for (int i = 0; i < kNumDtypes; ++i) out += (i ? ", " : "") + std::string(kDtypes[i].name);
  return out;
}

int dtype_index_by_name(const std::string& name) {
  for (int i = 0; i < kNumDtypes; ++i)
    if (name == kDtypes[i].name) return i;
  return -1;
}

int dtype_index_by_type(c10::ScalarType type) {
  for (int i = 0; i < kNumDtypes; ++i)
    if (kDtypes[i].writable && kDtypes[i].type == type) return i;
  return -1;
}

int64_t numel_of(const std::vector<int64_t>& shape, size_t from = 0) {
  int64_t n = 1;
  for (size_t i = from; i < shape.size(); ++i) n *= shape[i];
  return n;
}

// Closes a file descriptor on scope exit.
struct FdGuard {
  int fd = -1;
  ~FdGuard() {
    if (fd >= 0) ::close(fd);
  }
};

// Parses the header, recording the first top-level key that occurs twice (nlohmann::json keeps
// only the last value of a duplicated key, so it has to be caught while parsing).
json parse_header(const std::string& path, std::string_view text) {
  std::set<std::string> seen;
  std::string duplicate;
  json::parser_callback_t callback = [&](int depth, json::parse_event_t event, json& parsed) {
    if (event == json::parse_event_t::key && depth == 1 && parsed.is_string()) {
      const auto& key = parsed.get_ref<const std::string&>();
      if (!seen.insert(key).second && duplicate.empty()) duplicate = key;
    }
    return true;
  };
  json header;
  try {
    header = json::parse(text.begin(), text.end(), callback);
  } catch (const json::exception& e) {
    XF_THROW(path, ": safetensors header is not valid JSON: ", e.what());
  }
  XF_CHECK(header.is_object(), path, ": safetensors header must be a JSON object, got ",
           header.type_name());
  XF_CHECK(duplicate.empty(), path, ": tensor '", duplicate,
           "' appears more than once in the safetensors header");
  return header;
}

bool is_nonnegative_integer(const json& v) {
  return v.is_number_unsigned() || (v.is_number_integer() && v.get<int64_t>() >= 0);
}

std::string json_string(const std::string& s, const std::string& what) {
  try {
    return json(s).dump();
  } catch (const json::exception& e) {
    XF_THROW(what, " is not valid UTF-8: ", e.what());
  }
}

}  // namespace

std::vector<std::string> safetensors_dtype_names() {
  std::vector<std::string> out;
  for (const auto& d : kDtypes) out.emplace_back(d.name);
  return out;
}

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
  FdGuard fd{::open(path.c_str(), O_RDONLY | O_CLOEXEC)};
  XF_CHECK(fd.fd >= 0, "cannot open safetensors file ", path, ": ", std::strerror(errno));
  struct stat st {};
  XF_CHECK(::fstat(fd.fd, &st) == 0, "cannot stat ", path, ": ", std::strerror(errno));
  XF_CHECK(!S_ISDIR(st.st_mode), path, " is a folder, not a safetensors file");
  const uint64_t file_size = static_cast<uint64_t>(st.st_size);
  XF_CHECK(file_size >= 8, path, ": not a safetensors file: ", file_size,
           " bytes, shorter than the 8-byte header length");

  // Private and writable: a stray write to a tensor view copies the page instead of faulting
  // or reaching the file. MAP_NORESERVE: no swap is reserved for pages that are never written.
  void* addr =
      ::mmap(nullptr, file_size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_NORESERVE, fd.fd, 0);
  XF_CHECK(addr != MAP_FAILED, "cannot map ", path, " (", file_size,
           " bytes): ", std::strerror(errno));
  mapping_ = std::make_shared<detail::MappedFile>();
  mapping_->addr = addr;
  mapping_->size = file_size;
  const uint8_t* bytes = mapping_->bytes();

  uint64_t header_len = 0;
  std::memcpy(&header_len, bytes, 8);  // little-endian
  XF_CHECK(header_len <= file_size - 8, path, ": safetensors header length ", header_len,
           " goes beyond the end of the file (", file_size, " bytes)");
  data_start_ = 8 + header_len;
  const uint64_t data_size = file_size - data_start_;

  json header =
      parse_header(path, std::string_view(reinterpret_cast<const char*>(bytes + 8), header_len));

  for (auto& [name, value] : header.items()) {
    if (name == "__metadata__") {
      XF_CHECK(value.is_object(), path, ": __metadata__ must be an object of strings, got ",
               value.type_name());
      for (auto& [key, v] : value.items()) {
        XF_CHECK(v.is_string(), path, ": __metadata__ entry '", key, "' must be a string, got ",
                 v.type_name());
        metadata_[key] = v.get<std::string>();
      }
      continue;
    }
    const std::string where = path + ": tensor '" + name + "'";
    XF_CHECK(value.is_object(), where, ": header entry must be an object, got ", value.type_name());

    Entry e;
    auto dtype = value.find("dtype");
    XF_CHECK(dtype != value.end() && dtype->is_string(), where,
             ": \"dtype\" is missing or not a string");
    e.dtype_index = dtype_index_by_name(dtype->get<std::string>());
    XF_CHECK(e.dtype_index >= 0, where, ": unknown dtype '", dtype->get<std::string>(),
             "' (known: ", known_dtypes_str(), ")");
    const DtypeSpec& spec = kDtypes[e.dtype_index];

    auto shape = value.find("shape");
    XF_CHECK(shape != value.end() && shape->is_array(), where,
             ": \"shape\" is missing or not an array");
    for (const auto& d : *shape) {
      XF_CHECK(d.is_number_integer(), where, ": shape ", shape->dump(), " must hold integers");
      XF_CHECK(is_nonnegative_integer(d), where, ": negative dimension ", d.dump(), " in shape ",
               shape->dump());
      XF_CHECK(d.get<uint64_t>() <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()),
               where, ": dimension ", d.dump(), " is too large");
      e.shape.push_back(d.get<int64_t>());
    }

    auto offsets = value.find("data_offsets");
    XF_CHECK(offsets != value.end() && offsets->is_array() && offsets->size() == 2 &&
                 is_nonnegative_integer((*offsets)[0]) && is_nonnegative_integer((*offsets)[1]) &&
                 (*offsets)[0].get<uint64_t>() <= (*offsets)[1].get<uint64_t>(),
             where, ": data_offsets must be [begin, end] with 0 <= begin <= end, got ",
             offsets == value.end() ? std::string("nothing") : offsets->dump());
    e.begin = (*offsets)[0].get<uint64_t>();
    e.end = (*offsets)[1].get<uint64_t>();
    XF_CHECK(e.end <= data_size, where, ": data_offsets [", e.begin, ", ", e.end,
             "] lie outside the data section (", data_size, " bytes)");

    // Expected byte count, with overflow checks (dimensions come from an untrusted file).
    uint64_t expected = static_cast<uint64_t>(spec.size);
    bool overflow = false;
    for (int64_t d : e.shape)
      overflow = overflow || __builtin_mul_overflow(expected, static_cast<uint64_t>(d), &expected);
    XF_CHECK(!overflow && expected == e.end - e.begin, where, ": shape ", shape_string(e.shape),
             " x ", spec.name, " (", spec.size, " bytes) needs ",
             overflow ? std::string("more than 2^64") : std::to_string(expected),
             " bytes but data_offsets [", e.begin, ", ", e.end, "] span ", e.end - e.begin,
             " bytes");
    entries_.emplace(name, std::move(e));
  }

  // No two tensors may share bytes (empty ranges hold nothing).
  std::vector<std::pair<const std::string*, const Entry*>> by_offset;
  for (const auto& [name, e] : entries_)
    if (e.end > e.begin) by_offset.emplace_back(&name, &e);
  std::sort(by_offset.begin(), by_offset.end(),
            [](const auto& a, const auto& b) { return a.second->begin < b.second->begin; });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    const auto& [prev_name, prev] = by_offset[i - 1];
    const auto& [name, e] = by_offset[i];
    XF_CHECK(e->begin >= prev->end, path, ": tensors '", *prev_name, "' (data_offsets [",
             prev->begin, ", ", prev->end, "]) and '", *name, "' (data_offsets [", e->begin, ", ",
             e->end, "]) overlap");
  }
}

SafetensorsFile::~SafetensorsFile() = default;

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> out;
  out.reserve(entries_.size());
  for (const auto& [name, e] : entries_) out.push_back(name);
  return out;
}

bool SafetensorsFile::contains(const std::string& name) const { return entries_.count(name) > 0; }

const SafetensorsFile::Entry& SafetensorsFile::entry(const std::string& name) const {
  auto it = entries_.find(name);
  XF_CHECK(it != entries_.end(), "tensor '", name, "' not found in ", path_);
  return it->second;
}

TensorInfo SafetensorsFile::info(const std::string& name) const {
  const Entry& e = entry(name);
  const DtypeSpec& spec = kDtypes[e.dtype_index];
  return {spec.type, spec.name, e.shape, path_};
}

at::Tensor SafetensorsFile::make_tensor(const Entry& e, const uint8_t* data,
                                        std::vector<int64_t> shape) const {
  const DtypeSpec& spec = kDtypes[e.dtype_index];
  const int64_t numel = numel_of(shape);
  const auto options = at::TensorOptions().dtype(spec.type).device(at::kCPU);
  if (kDecodeFp8 && spec.fp8 != Fp8::kNone) {
    const auto format =
        spec.fp8 == Fp8::kE4M3 ? backends::Fp8Format::kE4M3FN : backends::Fp8Format::kE5M2;
    // Decoded into a new tensor: the bits are only read.
    const at::Tensor bits = at::from_blob(const_cast<uint8_t*>(data), shape, at::kByte);
    return backends::from_fp8(bits, format, at::kFloat);
  }
  // Empty tensors own no bytes; unaligned data (legal: offsets are arbitrary) is copied.
  if (numel == 0 || reinterpret_cast<uintptr_t>(data) % static_cast<uintptr_t>(spec.size) != 0) {
    at::Tensor out = at::empty(shape, options);
    if (numel > 0) std::memcpy(out.data_ptr(), data, static_cast<size_t>(numel * spec.size));
    return out;
  }
  // The deleter owns a reference to the mapping: it stays mapped while any view lives.
  std::shared_ptr<detail::MappedFile> keep = mapping_;
  return at::from_blob(
      const_cast<uint8_t*>(data), shape, [keep](void*) {}, options);
}

at::Tensor SafetensorsFile::get(const std::string& name) const {
  const Entry& e = entry(name);
  return make_tensor(e, mapping_->bytes() + data_start_ + e.begin, e.shape);
}

void SafetensorsFile::release(const std::string& name) const {
  const Entry& e = entry(name);
  // Only pages wholly inside the tensor: its neighbours' views stay untouched.
  const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  const uint64_t first = (data_start_ + e.begin + page - 1) / page * page;
  const uint64_t last = (data_start_ + e.end) / page * page;
  if (last > first) {
    ::madvise(const_cast<uint8_t*>(mapping_->bytes()) + first, last - first, MADV_DONTNEED);
  }
}

at::Tensor SafetensorsFile::get_slice(const std::string& name, int64_t dim, int64_t start,
                                      int64_t length) const {
  const Entry& e = entry(name);
  const int64_t ndim = static_cast<int64_t>(e.shape.size());
  const int64_t d = dim < 0 ? dim + ndim : dim;
  XF_CHECK(d >= 0 && d < ndim, path_, ": tensor '", name, "' of shape ", shape_string(e.shape),
           " has no dim ", dim);
  XF_CHECK(start >= 0 && length >= 0 && start <= e.shape[d] - length, path_, ": slice [", start,
           ", ", start + length, ") of dim ", d, " is out of range for tensor '", name,
           "' of shape ", shape_string(e.shape));
  if (d != 0) {
    // A copy of the strided slice; then the tensor's whole pages of the mapping are released
    // (clean private pages: re-read from the file if touched again), so a rank that keeps only a
    // column slice (tensor parallelism) does not keep the whole tensor resident.
    at::Tensor out = get(name).narrow(d, start, length).clone(at::MemoryFormat::Contiguous);
    release(name);
    return out;
  }
  const int64_t row_bytes = numel_of(e.shape, 1) * kDtypes[e.dtype_index].size;
  std::vector<int64_t> shape = e.shape;
  shape[0] = length;
  return make_tensor(e, mapping_->bytes() + data_start_ + e.begin + start * row_bytes,
                     std::move(shape));
}

// ---- writer ------------------------------------------------------------------------------------

namespace {

void write_all(int fd, const void* data, size_t size, const std::string& path) {
  const auto* p = static_cast<const uint8_t*>(data);
  while (size > 0) {
    ssize_t n = ::write(fd, p, size);
    if (n < 0 && errno == EINTR) continue;
    XF_CHECK(n > 0, "cannot write ", path, ": ", std::strerror(errno));
    p += n;
    size -= static_cast<size_t>(n);
  }
}

// A temporary file beside the destination, removed unless committed by rename.
class TempFile {
 public:
  explicit TempFile(const std::string& dest) : dest_(dest) {
    static std::atomic<uint64_t> counter{0};
    for (int attempt = 0; attempt < 100; ++attempt) {
      path_ = dest + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter++);
      fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
      if (fd_ >= 0 || errno != EEXIST) break;
    }
    XF_CHECK(fd_ >= 0, "cannot create ", path_, ": ", std::strerror(errno));
  }
  ~TempFile() {
    if (fd_ >= 0) ::close(fd_);
    if (!committed_) ::unlink(path_.c_str());
  }
  int fd() const { return fd_; }
  const std::string& path() const { return path_; }
  void commit() {
    XF_CHECK(::fsync(fd_) == 0, "cannot flush ", path_, ": ", std::strerror(errno));
    const int rc = ::close(fd_);
    fd_ = -1;
    XF_CHECK(rc == 0, "cannot close ", path_, ": ", std::strerror(errno));
    XF_CHECK(::rename(path_.c_str(), dest_.c_str()) == 0, "cannot rename ", path_, " to ", dest_,
             ": ", std::strerror(errno));
    committed_ = true;
  }

 private:
  std::string dest_;
  std::string path_;
  int fd_ = -1;
  bool committed_ = false;
};

}  // namespace

void save_safetensors(const std::string& path, const std::map<std::string, at::Tensor>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  XF_CONTEXT("writing safetensors file ", path);
  struct Item {
    const std::string* name;
    int dtype_index;
    at::Tensor data;  // contiguous, CPU
  };
  std::vector<Item> items;
  items.reserve(tensors.size());
  for (const auto& [name, t] : tensors) {
    XF_CHECK(name != "__metadata__", "a tensor cannot be named __metadata__");
    XF_CHECK(t.defined(), "tensor '", name, "' is undefined");
    XF_CHECK(t.layout() == at::kStrided, "tensor '", name, "' is not dense (layout ", t.layout(),
             ")");
    const int index = dtype_index_by_type(t.scalar_type());
    XF_CHECK(index >= 0, "tensor '", name, "' has dtype ", t.scalar_type(),
             ", which safetensors files here cannot hold (known: ", known_dtypes_str(), ")");
    items.push_back({&name, index, t.to(at::kCPU).contiguous()});
  }
  // The Python library's order: descending dtype alignment, then name. Every tensor then starts
  // at a multiple of its element size (the header length is a multiple of 8).
  std::sort(items.begin(), items.end(), [](const Item& a, const Item& b) {
    if (a.dtype_index != b.dtype_index) return a.dtype_index > b.dtype_index;
    return *a.name < *b.name;
  });

  std::string header = "{";
  if (!metadata.empty()) {
    header += "\"__metadata__\":{";
    bool first = true;
    for (const auto& [key, value] : metadata) {
      if (!first) header += ",";
      first = false;
      header += json_string(key, "metadata key '" + key + "'") + ":" +
                json_string(value, "metadata value of '" + key + "'");
    }
    header += "}";
  }
  uint64_t offset = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    const Item& item = items[i];
    if (i > 0 || !metadata.empty()) header += ",";
    const uint64_t nbytes = static_cast<uint64_t>(item.data.numel()) *
                            static_cast<uint64_t>(kDtypes[item.dtype_index].size);
    header += json_string(*item.name, "tensor name '" + *item.name + "'");
    header += ":{\"dtype\":\"";
    header += kDtypes[item.dtype_index].name;
    header += "\",\"shape\":[";
    for (int64_t d = 0; d < item.data.dim(); ++d) {
      if (d > 0) header += ",";
      header += std::to_string(item.data.size(d));
    }
    header += "],\"data_offsets\":[" + std::to_string(offset) + "," +
              std::to_string(offset + nbytes) + "]}";
    offset += nbytes;
  }
  header += "}";
  header.resize((header.size() + 7) / 8 * 8, ' ');

  TempFile file(path);
  const uint64_t header_len = header.size();
  uint8_t len_bytes[8];
  std::memcpy(len_bytes, &header_len, 8);  // little-endian
  write_all(file.fd(), len_bytes, 8, file.path());
  write_all(file.fd(), header.data(), header.size(), file.path());
  for (const Item& item : items) {
    const size_t nbytes = static_cast<size_t>(item.data.numel() * kDtypes[item.dtype_index].size);
    if (nbytes > 0) write_all(file.fd(), item.data.data_ptr(), nbytes, file.path());
  }
  file.commit();
}

}  // namespace xfuser::models
