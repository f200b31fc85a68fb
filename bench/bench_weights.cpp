// bench_weights: seconds per GB to load a multi-GB safetensors file through our memory-mapped
// reader, against reading the whole file with read().
//
//   bench_weights [--size-gb G] [--dir DIR] [--reps R] [--no-cold] [--out FILE]
//
// The file: `--size-gb` (2) decimal GB of 64 MiB tensors, alternately fp32 [4096, 4096] and
// bf16 [4096, 8192], written with models/weights/safetensors.h save_safetensors to a temporary
// file under --dir (default the system temp folder) and removed at the end. The size is scaled
// down (and the JSON says so) when the file system or the available memory is short: the file
// must leave 4 GB free on the disk, and MemAvailable must hold twice the file (the tensors while
// writing, the read() buffer) plus 2 GB.
//
// Methods (each one pass over the whole file; the time includes opening it):
//   mmap_sum        SafetensorsFile (mmap) + sum of every tensor (reads every byte once);
//   mmap_copy_bf16  SafetensorsFile + a fresh bf16 copy of every tensor (a load that
//                   materialises its weights in bf16: fp32 converted, bf16 copied);
//   read            open + a fresh buffer of the file size + read() in 256 MiB calls.
// Every tensor's sum is checked against the sum of the tensor written.
//
// Warm: the file in the page cache (it was just written and read once); `--reps` (3) passes per
// method, median. Cold: before one pass per method the file's pages are dropped from the page
// cache with fdatasync + posix_fadvise(POSIX_FADV_DONTNEED) (per file: no root needed, other
// processes' caches untouched, same effect for this file as `echo 1 > /proc/sys/vm/drop_caches`);
// mincore() reports the fraction still resident before the pass. A virtual disk may still be
// served from the host's cache: cold numbers are an upper bound on a real cold disk's speed.
#include <fcntl.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <iostream>

#include <sys/mman.h>
#include <sys/statvfs.h>

#include "bench/bench_common.h"
#include "bench/bench_flux_configs.h"
#include "models/weights/safetensors.h"

namespace xb = xfuser::bench;
namespace fs = std::filesystem;

namespace {

constexpr double kGB = 1e9;
constexpr int64_t kTensorBytes = int64_t{64} << 20;  // 64 MiB per tensor
constexpr int64_t kReadChunk = int64_t{256} << 20;

int64_t mem_available_bytes() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  int64_t kb = 0;
  std::string unit;
  while (in >> key >> kb >> unit) {
    if (key == "MemAvailable:") return kb * 1024;
  }
  return -1;
}

// Fraction of the file's pages in the page cache.
double resident_fraction(const std::string& path, int64_t size) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  XF_CHECK(fd >= 0, "cannot open ", path, ": ", std::strerror(errno));
  void* p = ::mmap(nullptr, static_cast<size_t>(size), PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);
  XF_CHECK(p != MAP_FAILED, "cannot map ", path, ": ", std::strerror(errno));
  const int64_t page = ::sysconf(_SC_PAGESIZE);
  std::vector<unsigned char> vec(static_cast<size_t>((size + page - 1) / page));
  const int rc = ::mincore(p, static_cast<size_t>(size), vec.data());
  ::munmap(p, static_cast<size_t>(size));
  XF_CHECK(rc == 0, "mincore on ", path, ": ", std::strerror(errno));
  int64_t resident = 0;
  for (unsigned char v : vec) resident += v & 1;
  return static_cast<double>(resident) / static_cast<double>(vec.size());
}

// Writes the file's dirty pages and drops its pages from the page cache.
void drop_file_cache(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  XF_CHECK(fd >= 0, "cannot open ", path, ": ", std::strerror(errno));
  ::fdatasync(fd);
  const int rc = ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
  XF_CHECK(rc == 0, "posix_fadvise(DONTNEED) on ", path, ": ", std::strerror(rc));
}

using Sums = std::map<std::string, double>;

void check_sum(const Sums& expected, const std::string& name, double got) {
  const double want = expected.at(name);
  XF_CHECK(std::abs(got - want) <= 1e-5 * std::abs(want), "tensor ", name, " read back with sum ",
           got, ", written with sum ", want);
}

// One pass of `method` over the file; returns seconds.
double run_method(const std::string& method, const std::string& path, int64_t file_size,
                  const Sums& sums) {
  const double t0 = xb::now_seconds();
  if (method == "read") {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    XF_CHECK(fd >= 0, "cannot open ", path, ": ", std::strerror(errno));
    at::Tensor buf = at::empty({file_size}, at::kByte);
    auto* data = static_cast<char*>(buf.data_ptr());
    int64_t done = 0;
    while (done < file_size) {
      const ssize_t n =
          ::read(fd, data + done, static_cast<size_t>(std::min(kReadChunk, file_size - done)));
      if (n < 0 && errno == EINTR) continue;
      XF_CHECK(n > 0, "read of ", path, " failed at byte ", done, ": ",
               n == 0 ? "unexpected end of file" : std::strerror(errno));
      done += n;
    }
    ::close(fd);
  } else {
    xfuser::models::SafetensorsFile file(path);
    for (const auto& name : file.names()) {
      at::Tensor t = file.get(name);
      if (method == "mmap_sum") {
        check_sum(sums, name, t.sum(at::kFloat).item<double>());
      } else {
        at::Tensor c = at::empty(t.sizes(), t.options().dtype(at::kBFloat16));
        c.copy_(t);
      }
    }
  }
  return xb::now_seconds() - t0;
}

nlohmann::json method_json(const std::string& name, int64_t bytes, const std::vector<double>& s) {
  const double med = xb::median(s);
  return {{"method", name},
          {"bytes", bytes},
          {"seconds", s},
          {"median_seconds", med},
          {"seconds_per_gb", med / (static_cast<double>(bytes) / kGB)},
          {"gb_per_s", static_cast<double>(bytes) / kGB / med}};
}

}  // namespace

int main(int argc, char** argv) {
  try {
    xb::Args args(argc, argv, {"no-cold"});
    args.check_known({"size-gb", "dir", "reps", "no-cold", "out"});
    double want_gb = 0;
    try {
      size_t used = 0;
      want_gb = std::stod(args.get("size-gb", "2"), &used);
      XF_CHECK(used == args.get("size-gb", "2").size(), "trailing characters");
    } catch (const std::exception&) {
      XF_THROW("--size-gb expects a number of GB, got '", args.get("size-gb", ""), "'");
    }
    XF_CHECK(want_gb > 0 && want_gb <= 64, "--size-gb must be in (0, 64], got ", want_gb);
    const int reps = static_cast<int>(args.get_int("reps", 3));
    XF_CHECK(reps >= 1, "--reps must be >= 1");
    const bool cold = !args.has("no-cold");
    const bool openblas = xb::set_threads(1);
    c10::InferenceMode guard;

    const fs::path dir =
        args.has("dir") ? fs::path(args.get("dir", "")) : fs::temp_directory_path();
    XF_CHECK(fs::is_directory(dir), "--dir ", dir.string(), " is not a folder");

    // ---- size: what the disk and the memory allow ---------------------------------------------
    struct statvfs vfs {};
    XF_CHECK(::statvfs(dir.c_str(), &vfs) == 0, "statvfs ", dir.string(), ": ",
             std::strerror(errno));
    const double disk_free = static_cast<double>(vfs.f_bavail) * static_cast<double>(vfs.f_frsize);
    const double mem_avail = static_cast<double>(mem_available_bytes());
    double gb = want_gb;
    std::string scale_note;
    const double disk_limit = (disk_free - 4 * kGB) / kGB;
    const double mem_limit = (mem_avail - 2 * kGB) / 2 / kGB;
    if (gb > disk_limit || gb > mem_limit) {
      gb = std::min(disk_limit, mem_limit);
      XF_CHECK(gb >= 0.1, "not enough room for a weight file: ", disk_free / kGB, " GB free on ",
               dir.string(), ", ", mem_avail / kGB, " GB memory available");
      scale_note = "scaled down from " + std::to_string(want_gb) +
                   " GB: " + std::to_string(disk_free / kGB) + " GB free on disk, " +
                   std::to_string(mem_avail / kGB) + " GB memory available";
      std::cerr << "bench_weights: " << scale_note << "\n";
    }
    const int64_t count = std::max<int64_t>(1, std::llround(gb * kGB / kTensorBytes));

    // ---- the file ------------------------------------------------------------------------------
    const std::string path =
        (dir / ("xfuser-bench-weights-" + std::to_string(::getpid()) + ".safetensors")).string();
    struct Cleanup {
      std::string p;
      ~Cleanup() {
        std::error_code ec;
        fs::remove(p, ec);
      }
    } cleanup{path};
    Sums sums;
    double write_seconds = 0, sync_seconds = 0;
    int64_t tensor_bytes = 0;
    {
      auto gen = at::make_generator<at::CPUGeneratorImpl>(11);
      const at::Tensor base = at::empty({4096, 4096}).normal_(0.0, 1.0, gen);  // [4096, 4096]
      std::map<std::string, at::Tensor> tensors;
      for (int64_t i = 0; i < count; ++i) {
        char name[64];
        std::snprintf(name, sizeof(name), "blocks.%03lld.weight", static_cast<long long>(i));
        // Distinct contents per tensor (and sums ~ (i + 1) * numel: a tensor read from the wrong
        // place fails the check): the base block scaled and shifted.
        at::Tensor t = base * (1.0 + 0.01 * static_cast<double>(i)) + static_cast<double>(i + 1);
        if (i % 2 == 1) t = at::cat({t, t * 0.5}, 1).to(at::kBFloat16);  // [4096, 8192] bf16
        sums[name] = t.sum(at::kFloat).item<double>();
        tensor_bytes += t.numel() * static_cast<int64_t>(t.element_size());
        tensors[name] = std::move(t);
      }
      const double t0 = xb::now_seconds();
      xfuser::models::save_safetensors(path, tensors, {{"format", "pt"}});
      write_seconds = xb::now_seconds() - t0;
      const double t1 = xb::now_seconds();
      const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
      XF_CHECK(fd >= 0, "cannot open ", path);
      ::fdatasync(fd);
      ::close(fd);
      sync_seconds = xb::now_seconds() - t1;
    }
    const int64_t file_size = static_cast<int64_t>(fs::file_size(path));
    std::cerr << "bench_weights: wrote " << count << " tensors, " << file_size / kGB << " GB in "
              << write_seconds << " s (+" << sync_seconds << " s fdatasync)\n";

    const std::vector<std::string> methods = {"mmap_sum", "mmap_copy_bf16", "read"};
    // ---- warm ----------------------------------------------------------------------------------
    run_method("read", path, file_size, sums);  // into the page cache
    const double warm_resident = resident_fraction(path, file_size);
    nlohmann::json warm = nlohmann::json::array();
    for (const auto& m : methods) {
      std::vector<double> s;
      for (int i = 0; i < reps; ++i) s.push_back(run_method(m, path, file_size, sums));
      warm.push_back(method_json(m, file_size, s));
      std::cerr << "bench_weights warm " << m << ": " << warm.back()["seconds_per_gb"].get<double>()
                << " s/GB\n";
    }
    // ---- cold ----------------------------------------------------------------------------------
    nlohmann::json cold_runs = nlohmann::json::array();
    if (cold) {
      for (const auto& m : methods) {
        drop_file_cache(path);
        const double resident = resident_fraction(path, file_size);
        const double s = run_method(m, path, file_size, sums);
        auto j = method_json(m, file_size, {s});
        j["resident_fraction_before"] = resident;
        cold_runs.push_back(j);
        std::cerr << "bench_weights cold " << m << ": " << j["seconds_per_gb"].get<double>()
                  << " s/GB (" << 100 * resident << "% resident before)\n";
      }
    }

    nlohmann::json out = {
        {"benchmark", "weight_loading"},
        {"environment", xb::environment_json(1, openblas)},
        {"file",
         {{"dir", dir.string()},
          {"bytes", file_size},
          {"tensor_bytes", tensor_bytes},
          {"tensors", count},
          {"layout", "alternating fp32 [4096, 4096] and bf16 [4096, 8192], 64 MiB each"},
          {"requested_gb", want_gb},
          {"scale_note", scale_note}}},
        {"write_seconds", write_seconds},
        {"fdatasync_seconds", sync_seconds},
        {"write_gb_per_s", file_size / kGB / (write_seconds + sync_seconds)},
        {"warm_resident_fraction", warm_resident},
        {"warm", warm},
        {"cold_method",
         cold ? "fdatasync + posix_fadvise(POSIX_FADV_DONTNEED) on the file before each pass; "
                "resident fraction from mincore()"
              : "skipped (--no-cold)"},
        {"cold", cold_runs}};
    xb::emit_json(args, out);
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "bench_weights: " << e.what() << "\n";
    return 1;
  }
}
