#include "models/common/trained_pipeline.h"

#include <system_error>
#include <vector>

#include "backends/error.h"

namespace fs = std::filesystem;

namespace xfuser::models {

fs::path trained_pipeline_dir(const std::string& model_id, const std::string& source_relative,
                              const std::string& install_name) {
  std::vector<fs::path> places = {fs::path(XFUSER_SOURCE_DIR) / source_relative,
                                  fs::path(XFUSER_INSTALL_DATADIR) / "xfuser" / install_name};
  // An install moved or made with `cmake --install --prefix P`: P/bin/<tool> ->
  // P/share/xfuser/<install_name>.
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) places.push_back(exe.parent_path().parent_path() / "share/xfuser" / install_name);
  std::string looked;
  for (const auto& dir : places) {
    if (fs::is_regular_file(dir / "model_index.json", ec)) return dir;
    looked += (looked.empty() ? "" : ", ") + dir.string();
  }
  XF_THROW(model_id, ": no pipeline folder (model_index.json) in ", looked,
           ": reinstall xfuser, or pass --model_path");
}

}  // namespace xfuser::models
