// `xfuser compare A B`: how far apart two pictures are (a parallel layout's output against one
// rank's, bf16 against fp32): PSNR in dB (10 log10(255^2 / MSE), inf when equal) and the largest
// difference of one channel in levels of 255, as text or one JSON object.
#include <cmath>
#include <iostream>

#include <ATen/ATen.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "backends/error.h"
#include "models/dit/dit_pipefusion.h"
#include "runner/image_input.h"
#include "runner/tool/commands.h"

namespace xfuser::runner::tool {

void register_compare(CLI::App& app) {
  struct Options {
    std::string a;
    std::string b;
    bool json = false;
    int64_t max_pixels = kDefaultMaxImagePixels;
  };
  auto opts = std::make_shared<Options>();
  auto* cmd = app.add_subcommand(
      "compare", "PSNR and largest difference of two pictures (PNG or JPEG) of one size");
  cmd->add_option("a", opts->a, "First picture")->required();
  cmd->add_option("b", opts->b, "Second picture (the reference)")->required();
  cmd->add_flag("--json", opts->json, "One JSON object: a, b, psnr_db (null when equal), max_diff");
  cmd->add_option("--max_input_pixels", opts->max_pixels,
                  "Largest picture (width x height) decoded; a file declaring more is refused")
      ->capture_default_str();
  cmd->callback([opts] {
    set_max_image_pixels(opts->max_pixels);
    const at::Tensor a = read_image(opts->a);
    const at::Tensor b = read_image(opts->b);
    XF_CHECK(a.sizes() == b.sizes(), "compare: ", opts->a, " is ", a.size(1), "x", a.size(0),
             " and ", opts->b, " is ", b.size(1), "x", b.size(0), ": the sizes differ");
    const double psnr = models::dit::image_psnr(a, b);
    const int max_diff = (a.to(at::kInt) - b.to(at::kInt)).abs().max().item<int>();
    if (opts->json) {
      nlohmann::json j = {{"a", opts->a}, {"b", opts->b}, {"max_diff", max_diff}};
      j["psnr_db"] = std::isinf(psnr) ? nlohmann::json(nullptr) : nlohmann::json(psnr);
      std::cout << j.dump() << std::endl;
    } else {
      std::cout << "PSNR " << (std::isinf(psnr) ? std::string("inf") : std::to_string(psnr))
                << " dB, max diff " << max_diff << " levels" << std::endl;
    }
  });
}

}  // namespace xfuser::runner::tool
