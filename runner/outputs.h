// Output files: PNG images with generation parameters as text chunks, JSON files, xDiT's
// output naming. Every file is written to a temporary name in the same folder and renamed when
// complete, so an interrupted run never leaves a partial file under the final name.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

namespace at {
class Tensor;
}

namespace xfuser::runner {

// Writes `bytes` to `path` atomically (temp file in the same folder, fsync, rename).
void write_file_atomic(const std::filesystem::path& path, const std::string& bytes);

// Encodes an image as PNG. `image` is uint8 [H, W, 3] (RGB) or [H, W, 1] (gray), contiguous.
// `text` becomes text chunks (keyword -> UTF-8 value; keywords 1-79 Latin-1 characters): tEXt
// when the value is ASCII, iTXt (UTF-8) otherwise, so readers never show a UTF-8 prompt as
// Latin-1 mojibake.
std::string encode_png(const at::Tensor& image, const std::map<std::string, std::string>& text);

// encode_png + write_file_atomic.
void write_png(const std::filesystem::path& path, const at::Tensor& image,
               const std::map<std::string, std::string>& text = {});

// Decodes a PNG file to uint8 [H, W, C] (C = 1, 3 or 4) and its text chunks (tests, img2img),
// as UTF-8 (tEXt / zTXt values are Latin-1 and converted; iTXt values are UTF-8 already).
// A picture declaring more than `max_pixels` (width x height; < 0: image_input.h's
// max_image_pixels()) is refused before any pixel is allocated.
at::Tensor read_png(const std::filesystem::path& path,
                    std::map<std::string, std::string>* text = nullptr, int64_t max_pixels = -1);

// True when `path` holds a complete PNG: it decodes to its end (every chunk's CRC checked, IEND
// reached) and, when `height`/`width` are > 0, has that size. Text chunks go to *text. Never
// throws for a missing, partial or corrupt file (those are simply incomplete).
bool is_complete_png(const std::filesystem::path& path, int height = 0, int width = 0,
                     std::map<std::string, std::string>* text = nullptr);

// A digest of a file's bytes (64-bit FNV-1a, 16 hex digits, then ":" and the size): what an output
// records of an input file (a picture, a latents file) so that --resume notices a changed input.
// It detects changes; it is not a cryptographic hash.
std::string file_digest(const std::filesystem::path& path);

// The degrees beyond xDiT's u/r that join an output name when they differ from 1.
struct NameDegrees {
  int tensor = 1;    // _tp{N}
  int pipeline = 1;  // _pp{N}
  int cfg = 1;       // _cfg{N}
  int data = 1;      // _dp{N}
};

// xDiT's output name, {name}_u{U}r{R}[_tp{T}][_pp{P}][_cfg{C}][_dp{D}]_tc_{True|False}_{H}x{W}
// [_{task}]_{index}.{ext}: u and r always (as xDiT), the other degrees only when they are not 1, so
// runs of several layouts can share one folder without replacing each other's images; --task, when
// given, after the size as xDiT's runner adds it.
std::string output_file_name(const std::string& name, int ulysses, int ring, bool compiled,
                             int height, int width, int64_t index, const std::string& ext,
                             const NameDegrees& degrees = {}, const std::string& task = "");

// An exclusive lock on an output folder (flock on the folder itself, so no file is left behind),
// held while it lives. Two runs writing one folder would replace each other's images: the
// second is refused at once, naming the folder. Released when destroyed or when the process ends.
class OutputDirectoryLock {
 public:
  explicit OutputDirectoryLock(const std::filesystem::path& dir);
  ~OutputDirectoryLock();
  OutputDirectoryLock(const OutputDirectoryLock&) = delete;
  OutputDirectoryLock& operator=(const OutputDirectoryLock&) = delete;

 private:
  int fd_ = -1;
};

// Checks that `dir` exists (creating it if needed) and is writable; error names the folder.
void ensure_writable_directory(const std::filesystem::path& dir);

// A byte count in the largest binary unit that keeps the value >= 1, one decimal, rounded down
// (200 KiB is "200.0 KiB", not "1 MiB"; under 1 KiB: "512 bytes").
std::string byte_size_text(uint64_t bytes);

// Checks that the file system of `dir` has at least `bytes` available to this user; the error
// names the folder, both sizes and `what` is to be written.
void check_free_space(const std::filesystem::path& dir, uint64_t bytes, const std::string& what);

}  // namespace xfuser::runner
