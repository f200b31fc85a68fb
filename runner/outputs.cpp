#include "runner/outputs.h"

#include <fcntl.h>
#include <png.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <vector>

#include <ATen/ATen.h>
#include <sys/file.h>
#include <sys/statvfs.h>

#include "backends/error.h"
#include "runner/image_input.h"

namespace xfuser::runner {
namespace fs = std::filesystem;

void write_file_atomic(const fs::path& path, const std::string& bytes) {
  XF_CONTEXT("writing ", path.string());
  const fs::path dir = path.has_parent_path() ? path.parent_path() : fs::path(".");
  std::random_device rd;
  const fs::path tmp = dir / ("." + path.filename().string() + ".tmp" + std::to_string(rd()));
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  XF_CHECK(fd >= 0, "cannot create ", tmp.string(), ": ", std::strerror(errno));
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      int err = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      XF_THROW("write to ", tmp.string(), " failed: ", std::strerror(err));
    }
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    XF_THROW("flushing ", tmp.string(), " failed: ", std::strerror(err));
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    XF_THROW("renaming ", tmp.string(), " to ", path.string(), " failed: ", std::strerror(err));
  }
}

namespace {

void png_write_to_string(png_structp png, png_bytep data, png_size_t length) {
  auto* out = static_cast<std::string*>(png_get_io_ptr(png));
  out->append(reinterpret_cast<const char*>(data), length);
}

void png_error_throw(png_structp, png_const_charp msg) { throw std::runtime_error(msg); }
void png_warning_ignore(png_structp, png_const_charp) {}

bool is_ascii(const std::string& s) {
  for (unsigned char c : s) {
    if (c >= 0x80) return false;
  }
  return true;
}

// Latin-1 bytes (tEXt, zTXt) to UTF-8.
std::string latin1_to_utf8(const char* text, size_t length) {
  std::string out;
  out.reserve(length);
  for (size_t i = 0; i < length; ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c < 0x80) {
      out.push_back(static_cast<char>(c));
    } else {
      out.push_back(static_cast<char>(0xC0 | (c >> 6)));
      out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
    }
  }
  return out;
}

}  // namespace

std::string encode_png(const at::Tensor& image, const std::map<std::string, std::string>& text) {
  XF_CHECK(image.dim() == 3 && (image.size(2) == 3 || image.size(2) == 1) &&
               image.scalar_type() == at::kByte,
           "encode_png expects a uint8 image [H, W, 3] or [H, W, 1], got ", image.sizes(), " ",
           image.scalar_type());
  XF_CHECK(image.size(0) > 0 && image.size(1) > 0, "encode_png: empty image ", image.sizes());
  at::Tensor img = image.to(at::kCPU).contiguous();
  const auto h = static_cast<png_uint_32>(img.size(0));
  const auto w = static_cast<png_uint_32>(img.size(1));
  const int channels = static_cast<int>(img.size(2));
  for (const auto& [key, value] : text) {
    XF_CHECK(!key.empty() && key.size() < 80, "PNG text keyword '", key, "' must be 1-79 chars");
  }

  std::string out;
  png_structp png =
      png_create_write_struct(PNG_LIBPNG_VER_STRING, nullptr, png_error_throw, png_warning_ignore);
  XF_CHECK(png != nullptr, "png_create_write_struct failed");
  png_infop info = png_create_info_struct(png);
  std::vector<png_text> chunks;
  chunks.reserve(text.size());
  try {
    XF_CHECK(info != nullptr, "png_create_info_struct failed");
    png_set_write_fn(png, &out, png_write_to_string, nullptr);
    png_set_IHDR(png, info, w, h, 8, channels == 3 ? PNG_COLOR_TYPE_RGB : PNG_COLOR_TYPE_GRAY,
                 PNG_INTERLACE_NONE, PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
    for (const auto& [key, value] : text) {
      png_text t{};
      t.key = const_cast<char*>(key.c_str());
      t.text = const_cast<char*>(value.c_str());
      if (is_ascii(value)) {
        t.compression = PNG_TEXT_COMPRESSION_NONE;  // tEXt: ASCII is Latin-1
        t.text_length = value.size();
      } else {
        t.compression = PNG_ITXT_COMPRESSION_NONE;  // iTXt: UTF-8
        t.itxt_length = value.size();
        t.lang = const_cast<char*>("");
        t.lang_key = const_cast<char*>("");
      }
      chunks.push_back(t);
    }
    if (!chunks.empty()) png_set_text(png, info, chunks.data(), static_cast<int>(chunks.size()));
    png_write_info(png, info);
    const uint8_t* base = img.data_ptr<uint8_t>();
    for (png_uint_32 y = 0; y < h; ++y) {
      png_write_row(png, const_cast<png_bytep>(base + static_cast<size_t>(y) * w * channels));
    }
    png_write_end(png, nullptr);
  } catch (const std::runtime_error& e) {
    png_destroy_write_struct(&png, &info);
    if (dynamic_cast<const xfuser::Error*>(&e)) throw;
    XF_THROW("PNG encoding failed: ", e.what());
  }
  png_destroy_write_struct(&png, &info);
  return out;
}

void write_png(const fs::path& path, const at::Tensor& image,
               const std::map<std::string, std::string>& text) {
  write_file_atomic(path, encode_png(image, text));
}

at::Tensor read_png(const fs::path& path, std::map<std::string, std::string>* text,
                    int64_t max_pixels) {
  XF_CONTEXT("reading PNG ", path.string());
  FILE* fp = std::fopen(path.c_str(), "rb");
  XF_CHECK(fp != nullptr, "cannot open ", path.string(), ": ", std::strerror(errno));
  png_structp png =
      png_create_read_struct(PNG_LIBPNG_VER_STRING, nullptr, png_error_throw, png_warning_ignore);
  png_infop info = png ? png_create_info_struct(png) : nullptr;
  at::Tensor result;
  try {
    XF_CHECK(png && info, "libpng initialisation failed");
    png_init_io(png, fp);
    png_read_info(png, info);
    check_image_pixels(path, png_get_image_width(png, info), png_get_image_height(png, info),
                       max_pixels < 0 ? max_image_pixels() : max_pixels);
    png_set_strip_16(png);
    png_set_packing(png);
    if (png_get_color_type(png, info) == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(png);
    if (png_get_valid(png, info, PNG_INFO_tRNS)) png_set_tRNS_to_alpha(png);
    png_read_update_info(png, info);
    const int64_t h = png_get_image_height(png, info);
    const int64_t w = png_get_image_width(png, info);
    const int64_t c = png_get_channels(png, info);
    result = at::empty({h, w, c}, at::kByte);
    std::vector<png_bytep> rows(h);
    for (int64_t y = 0; y < h; ++y) rows[y] = result.data_ptr<uint8_t>() + y * w * c;
    png_read_image(png, rows.data());
    png_read_end(png, info);
    if (text) {
      png_textp chunks = nullptr;
      int n = png_get_text(png, info, &chunks, nullptr);
      for (int i = 0; i < n; ++i) {
        const png_text& t = chunks[i];
        const bool itxt = t.compression == PNG_ITXT_COMPRESSION_NONE ||
                          t.compression == PNG_ITXT_COMPRESSION_zTXt;
        (*text)[t.key] =
            itxt ? std::string(t.text, t.itxt_length) : latin1_to_utf8(t.text, t.text_length);
      }
    }
  } catch (const std::runtime_error& e) {
    png_destroy_read_struct(&png, &info, nullptr);
    std::fclose(fp);
    if (dynamic_cast<const xfuser::Error*>(&e)) throw;
    XF_THROW("not a valid PNG file ", path.string(), ": ", e.what());
  }
  png_destroy_read_struct(&png, &info, nullptr);
  std::fclose(fp);
  return result;
}

bool is_complete_png(const fs::path& path, int height, int width,
                     std::map<std::string, std::string>* text) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) return false;
  try {
    // An output of this run's size is read whatever the input-picture limit.
    const int64_t limit = height > 0 && width > 0 ? int64_t{height} * width : -1;
    const at::Tensor image = read_png(path, text, limit);
    if (height > 0 && image.size(0) != height) return false;
    if (width > 0 && image.size(1) != width) return false;
  } catch (const xfuser::Error&) {
    return false;
  }
  return true;
}

std::string file_digest(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  XF_CHECK(in.good(), "cannot read ", path.string());
  uint64_t h = 14695981039346656037ULL;  // FNV-1a 64
  uint64_t size = 0;
  std::vector<char> buffer(1 << 16);
  while (in) {
    in.read(buffer.data(), static_cast<std::streamsize>(buffer.size()));
    const auto n = static_cast<size_t>(in.gcount());
    for (size_t i = 0; i < n; ++i) {
      h ^= static_cast<unsigned char>(buffer[i]);
      h *= 1099511628211ULL;
    }
    size += n;
  }
  XF_CHECK(in.eof(), "reading ", path.string(), " failed");
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(h));
  return std::string(hex) + ":" + std::to_string(size);
}

std::string output_file_name(const std::string& name, int ulysses, int ring, bool compiled,
                             int height, int width, int64_t index, const std::string& ext,
                             const NameDegrees& degrees, const std::string& task) {
  std::string layout = "_u" + std::to_string(ulysses) + "r" + std::to_string(ring);
  for (const auto& [tag, degree] : {std::pair{"_tp", degrees.tensor},
                                    {"_pp", degrees.pipeline},
                                    {"_cfg", degrees.cfg},
                                    {"_dp", degrees.data}}) {
    if (degree != 1) layout += tag + std::to_string(degree);
  }
  return name + layout + "_tc_" + (compiled ? "True" : "False") + "_" + std::to_string(height) +
         "x" + std::to_string(width) + (task.empty() ? "" : "_" + task) + "_" +
         std::to_string(index) + "." + ext;
}

OutputDirectoryLock::OutputDirectoryLock(const fs::path& dir) {
  fd_ = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  XF_CHECK(fd_ >= 0, "--output_directory ", dir.string(),
           ": cannot open it to lock it: ", std::strerror(errno));
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    ::close(fd_);
    fd_ = -1;
    XF_CHECK(err != EWOULDBLOCK, "--output_directory ", dir.string(),
             " is in use by another xfuser-run (it holds the folder's lock): two runs writing "
             "one folder would replace each other's images. Wait for it to finish, or give this "
             "run another --output_directory");
    XF_THROW("--output_directory ", dir.string(), ": cannot lock it: ", std::strerror(err));
  }
}

OutputDirectoryLock::~OutputDirectoryLock() {
  if (fd_ >= 0) ::close(fd_);  // closing the last descriptor releases the lock
}

void ensure_writable_directory(const fs::path& dir) {
  std::error_code ec;
  if (!fs::exists(dir, ec)) {
    fs::create_directories(dir, ec);
    XF_CHECK(!ec, "--output_directory ", dir.string(),
             " does not exist and cannot be created: ", ec.message());
  }
  XF_CHECK(fs::is_directory(dir, ec), "--output_directory ", dir.string(), " is not a folder");
  XF_CHECK(::access(dir.c_str(), W_OK | X_OK) == 0, "--output_directory ", dir.string(),
           " is not writable: ", std::strerror(errno));
}

std::string byte_size_text(uint64_t bytes) {
  static const char* const kUnits[] = {"bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  int unit = 0;
  while (unit < 6 && bytes >= (uint64_t{1} << (10 * (unit + 1)))) ++unit;
  if (unit == 0) return std::to_string(bytes) + " bytes";
  const double tenths =
      std::floor(static_cast<double>(bytes) / static_cast<double>(uint64_t{1} << (10 * unit)) * 10);
  char text[48];
  std::snprintf(text, sizeof(text), "%.1f %s", tenths / 10, kUnits[unit]);
  return text;
}

void check_free_space(const fs::path& dir, uint64_t bytes, const std::string& what) {
  struct statvfs st {};
  XF_CHECK(::statvfs(dir.c_str(), &st) == 0, "--output_directory ", dir.string(),
           ": cannot read the free space: ", std::strerror(errno));
  const uint64_t available = static_cast<uint64_t>(st.f_bavail) * st.f_frsize;
  XF_CHECK(available >= bytes, "--output_directory ", dir.string(), " has ",
           byte_size_text(available), " free, but ", what, " need about ", byte_size_text(bytes),
           " (", bytes, " bytes)");
}

}  // namespace xfuser::runner
