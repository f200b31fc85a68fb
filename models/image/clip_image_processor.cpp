#include "models/image/clip_image_processor.h"

#include <fstream>
#include <utility>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "backends/error.h"
#include "models/weights/component_folder.h"

namespace xfuser::models::image {

ClipImageProcessorConfig ClipImageProcessorConfig::from_json(const nlohmann::json& j,
                                                             const std::string& path) {
  XF_CHECK(j.is_object(), "image processor config ", path, " is not a JSON object");
  const std::string type = cfg<std::string>(j, "image_processor_type", "CLIPImageProcessor", path);
  const std::string fe_type = cfg<std::string>(j, "feature_extractor_type", "", path);
  const bool siglip = type == "SiglipImageProcessor";
  XF_CHECK(type == "CLIPImageProcessor" || type == "CLIPFeatureExtractor" || siglip,
           "image processor config ", path, ": image_processor_type \"", type,
           "\" is not CLIPImageProcessor or SiglipImageProcessor");
  XF_CHECK(fe_type.empty() || fe_type == "CLIPFeatureExtractor", "image processor config ", path,
           ": feature_extractor_type \"", fe_type, "\" is not CLIPFeatureExtractor");
  ClipImageProcessorConfig c;
  if (siglip) {
    // SiglipImageProcessor: resize to size {height, width} (default 224 x 224), no center crop
    // (it has none: a crop_size key is ignored), IMAGENET_STANDARD mean and std (0.5).
    c.shortest_edge = 0;
    c.size_height = c.size_width = 224;
    c.do_center_crop = false;
    c.image_mean = {0.5, 0.5, 0.5};
    c.image_std = {0.5, 0.5, 0.5};
  }
  c.do_resize = cfg<bool>(j, "do_resize", c.do_resize, path);
  if (j.contains("size") && !j["size"].is_null()) {
    const auto& s = j["size"];
    if (s.is_number()) {
      c.shortest_edge = cfg<int64_t>(j, "size", 0, path);
    } else {
      XF_CHECK(s.is_object(), "image processor config ", path,
               ": \"size\" must be an int or an object, got ", s.dump());
      if (s.contains("shortest_edge")) {
        c.shortest_edge = cfg_required<int64_t>(s, "shortest_edge", path + " \"size\"");
      } else if (s.contains("height") && s.contains("width")) {
        c.shortest_edge = 0;
        c.size_height = cfg_required<int64_t>(s, "height", path + " \"size\"");
        c.size_width = cfg_required<int64_t>(s, "width", path + " \"size\"");
        XF_CHECK(c.size_height > 0 && c.size_width > 0, "image processor config ", path,
                 ": \"size\" must be positive, got ", s.dump());
      } else {
        XF_THROW("image processor config ", path,
                 ": \"size\" must contain either 'shortest_edge' or 'height' and 'width', got ",
                 s.dump());
      }
    }
    XF_CHECK(c.shortest_edge > 0 || c.size_height > 0, "image processor config ", path,
             ": \"size\" must be positive, got ", s.dump());
  }
  c.resample = pil_filter_from_int(cfg<int64_t>(j, "resample", 3, path), path + " \"resample\"");
  if (!siglip) c.do_center_crop = cfg<bool>(j, "do_center_crop", c.do_center_crop, path);
  if (!siglip && j.contains("crop_size") && !j["crop_size"].is_null()) {
    const auto& s = j["crop_size"];
    if (s.is_number()) {
      c.crop_height = c.crop_width = cfg<int64_t>(j, "crop_size", 0, path);
    } else {
      XF_CHECK(s.is_object() && s.contains("height") && s.contains("width"),
               "image processor config ", path,
               ": \"crop_size\" must be an int or {\"height\", \"width\"}, got ", s.dump());
      c.crop_height = cfg_required<int64_t>(s, "height", path + " \"crop_size\"");
      c.crop_width = cfg_required<int64_t>(s, "width", path + " \"crop_size\"");
    }
    XF_CHECK(c.crop_height > 0 && c.crop_width > 0, "image processor config ", path,
             ": \"crop_size\" must be positive, got ", s.dump());
  }
  c.do_rescale = cfg<bool>(j, "do_rescale", c.do_rescale, path);
  c.rescale_factor = cfg<double>(j, "rescale_factor", c.rescale_factor, path);
  c.do_normalize = cfg<bool>(j, "do_normalize", c.do_normalize, path);
  // A single number means the same value for every channel (transformers' normalize).
  auto per_channel = [&](const char* key, std::vector<double> def) {
    if (j.contains(key) && j[key].is_number()) return std::vector<double>(3, j[key].get<double>());
    return cfg<std::vector<double>>(j, key, std::move(def), path);
  };
  c.image_mean = per_channel("image_mean", c.image_mean);
  c.image_std = per_channel("image_std", c.image_std);
  XF_CHECK(c.image_mean.size() == 3 && c.image_std.size() == 3, "image processor config ", path,
           ": image_mean and image_std must have 3 elements, got ", c.image_mean.size(), " and ",
           c.image_std.size());
  for (double s : c.image_std) {
    XF_CHECK(s != 0.0, "image processor config ", path, ": image_std has a zero");
  }
  c.do_convert_rgb = cfg<bool>(j, "do_convert_rgb", c.do_convert_rgb, path);
  return c;
}

ClipImageProcessorConfig ClipImageProcessorConfig::from_file(const std::string& path) {
  std::ifstream in(path);
  XF_CHECK(in.good(), "cannot open image processor config ", path);
  nlohmann::json j;
  try {
    in >> j;
  } catch (const nlohmann::json::exception& e) {
    XF_THROW("image processor config ", path, " is not valid JSON: ", e.what());
  }
  return from_json(j, path);
}

std::pair<int64_t, int64_t> clip_resize_output_size(const ClipImageProcessorConfig& config,
                                                    int64_t height, int64_t width) {
  if (config.shortest_edge <= 0) return {config.size_height, config.size_width};
  const bool portrait = width <= height;
  const int64_t short_side = portrait ? width : height, long_side = portrait ? height : width;
  const int64_t new_short = config.shortest_edge;
  // int(requested_new_short * long / short): Python true division in double, truncated.
  const auto new_long = static_cast<int64_t>(static_cast<double>(new_short * long_side) /
                                             static_cast<double>(short_side));
  return portrait ? std::make_pair(new_long, new_short) : std::make_pair(new_short, new_long);
}

at::Tensor preprocess(const ClipImageProcessorConfig& config,
                      const std::vector<at::Tensor>& images) {
  XF_CHECK(!images.empty(), "CLIPImageProcessor: no images");
  std::vector<at::Tensor> out;
  out.reserve(images.size());
  for (size_t i = 0; i < images.size(); ++i) {
    const at::Tensor& im = images[i];
    XF_CHECK(im.defined() && im.dim() == 3 && im.size(2) == 3 && im.scalar_type() == at::kByte,
             "CLIPImageProcessor: images[", i, "] must be uint8 [H, W, 3] (RGB), got ",
             im.defined() ? c10::toString(im.scalar_type()) : "undefined", " ",
             im.defined() ? im.sizes() : at::IntArrayRef{});
    XF_CHECK(im.size(0) >= 1 && im.size(1) >= 1, "CLIPImageProcessor: images[", i, "] is empty ",
             im.sizes());
    at::Tensor x = im.to(at::kCPU);
    if (config.do_resize) {
      auto [h, w] = clip_resize_output_size(config, x.size(0), x.size(1));
      XF_CHECK(h >= 1 && w >= 1, "CLIPImageProcessor: images[", i, "] of ", x.sizes(),
               " resizes to an empty ", h, "x", w);
      x = pil_resize(x, w, h, config.resample);  // [h, w, 3] uint8
    }
    if (config.do_center_crop) x = center_crop(x, config.crop_height, config.crop_width);
    at::Tensor f;
    if (config.do_rescale) {
      f = (x.to(at::kDouble) * config.rescale_factor).to(at::kFloat);
    } else {
      f = x.to(at::kFloat);
    }
    if (config.do_normalize) {
      auto opts = f.options();
      auto mean = at::tensor(std::vector<double>(config.image_mean), opts.dtype(at::kDouble))
                      .to(at::kFloat);
      auto std =
          at::tensor(std::vector<double>(config.image_std), opts.dtype(at::kDouble)).to(at::kFloat);
      f = (f - mean) / std;  // [h, w, 3], float32
    }
    out.push_back(f.permute({2, 0, 1}).contiguous());  // [3, h, w]
    if (i > 0) {
      XF_CHECK(out[i].sizes() == out[0].sizes(), "CLIPImageProcessor: images[", i,
               "] preprocesses to ", out[i].sizes(), " but images[0] to ", out[0].sizes(),
               " (without a center crop every image must resize to the same size)");
    }
  }
  return at::stack(out).to(images[0].device());  // [B, 3, h, w]
}

}  // namespace xfuser::models::image
