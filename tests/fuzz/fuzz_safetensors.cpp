// libFuzzer target: the safetensors reader (header length, JSON header, dtype/shape/offset
// validation, zero-copy views and slices) on arbitrary file contents.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include <ATen/ATen.h>
#include <sys/mman.h>

#include "models/weights/safetensors.h"
#include "tests/fuzz/fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // The reader maps a path: an anonymous in-memory file, reached through /proc/self/fd.
  const int fd = ::memfd_create("fuzz.safetensors", MFD_CLOEXEC);
  if (fd < 0) std::abort();
  size_t done = 0;
  while (done < size) {
    const ssize_t w = ::write(fd, data + done, size - done);
    if (w <= 0) std::abort();
    done += static_cast<size_t>(w);
  }
  const std::string path = "/proc/self/fd/" + std::to_string(fd);
  xfuser::fuzz::expect_named_errors_only([&] {
    xfuser::models::SafetensorsFile file(path);
    for (const auto& name : file.names()) {
      const auto info = file.info(name);
      at::Tensor t = file.get(name);
      // Read every byte of the view (ASan sees reads past the mapping or the data section).
      volatile double sink = t.numel() > 0 ? t.to(at::kDouble).sum().item<double>() : 0.0;
      (void)sink;
      if (!info.shape.empty() && info.shape[0] > 1) {
        at::Tensor s = file.get_slice(name, 0, 1, info.shape[0] - 1);
        volatile double sink2 = s.numel() > 0 ? s.to(at::kDouble).sum().item<double>() : 0.0;
        (void)sink2;
      }
    }
    (void)file.metadata();
  });
  ::close(fd);
  return 0;
}
