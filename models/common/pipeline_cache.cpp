#include "models/common/pipeline_cache.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>

#include <sys/file.h>

#include "backends/error.h"

namespace xfuser::models {
namespace fs = std::filesystem;

fs::path xfuser_cache_dir() {
  if (const char* v = std::getenv("XFUSER_CACHE"); v && *v) return v;
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) return fs::path(x) / "xfuser";
  if (const char* h = std::getenv("HOME"); h && *h) return fs::path(h) / ".cache" / "xfuser";
  return fs::temp_directory_path() / "xfuser-cache";
}

fs::path ensure_cached_pipeline(const std::string& name,
                                const std::function<void(const fs::path&)>& write) {
  const fs::path cache = xfuser_cache_dir();
  const fs::path target = cache / name;
  std::error_code ec;
  if (fs::exists(target / "model_index.json", ec)) return target;
  fs::create_directories(cache, ec);
  XF_CHECK(!ec, "cannot create the xfuser cache folder ", cache.string(), ": ", ec.message(),
           " (set XFUSER_CACHE to a writable folder)");
  // One builder at a time; others wait on the lock, then find the finished folder.
  const fs::path lock_path = cache / ("." + name + ".lock");
  int fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  XF_CHECK(fd >= 0, "cannot open ", lock_path.string());
  ::flock(fd, LOCK_EX);
  try {
    if (!fs::exists(target / "model_index.json", ec)) {
      const fs::path tmp = cache / (".tmp-" + name + "-" + std::to_string(::getpid()));
      fs::remove_all(tmp, ec);
      write(tmp);
      fs::remove_all(target, ec);
      fs::rename(tmp, target, ec);
      XF_CHECK(!ec, "cannot move ", tmp.string(), " to ", target.string(), ": ", ec.message());
    }
  } catch (...) {
    ::flock(fd, LOCK_UN);
    ::close(fd);
    throw;
  }
  ::flock(fd, LOCK_UN);
  ::close(fd);
  return target;
}

}  // namespace xfuser::models
