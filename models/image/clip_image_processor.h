// transformers (v4.44.2) CLIPImageProcessor: the image preprocessing in front of a CLIP vision
// tower (Wan2.1 image-to-video's image_processor/ folder, the IP-adapter feature_extractor/), and
// SiglipImageProcessor (HunyuanVideo-1.5 image-to-video's feature_extractor/), which is the same
// steps with size {height, width}, no center crop and mean / std 0.5.
//
// preprocess() follows CLIPImageProcessor.preprocess on uint8 RGB arrays, step for step:
//   resize       size {"shortest_edge": s}: get_resize_output_image_size(default_to_square=False):
//                the short side becomes s, the long side int(s * long / short) (Python float
//                arithmetic, truncated); size {"height", "width"}: exactly that. Through PIL
//                (to_pil_image -> Image.resize with `resample`): pil_resize, byte for byte.
//   center crop  image_transforms.center_crop to crop_size (pil_resize.h: center_crop).
//   rescale      float32(float64(uint8 value) * rescale_factor) (numpy: uint8 * Python float is
//                float64, then .astype(float32)).
//   normalize    (x - mean) / std in float32 per channel (mean and std cast to float32).
// Out: pixel_values float32 [B, 3, crop_h, crop_w] (without a crop every image must resize to
// the same size), on the device of the first image.
// Only numpy-style inputs are taken (uint8 [H, W, 3]); do_convert_rgb is a no-op for them in
// transformers too (convert_to_rgb only touches PIL images), so callers convert RGBA or grey
// images to RGB first.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <nlohmann/json_fwd.hpp>

#include "models/image/pil_resize.h"

namespace xfuser::models::image {

struct ClipImageProcessorConfig {
  bool do_resize = true;
  // size: either shortest_edge (> 0) or height and width (shortest_edge = 0).
  int64_t shortest_edge = 224;
  int64_t size_height = 0;
  int64_t size_width = 0;
  PilFilter resample = PilFilter::kBicubic;
  bool do_center_crop = true;
  int64_t crop_height = 224;
  int64_t crop_width = 224;
  bool do_rescale = true;
  double rescale_factor = 1.0 / 255.0;
  bool do_normalize = true;
  std::vector<double> image_mean = {0.48145466, 0.4578275, 0.40821073};  // OPENAI_CLIP_MEAN
  std::vector<double> image_std = {0.26862954, 0.26130258, 0.27577711};  // OPENAI_CLIP_STD
  bool do_convert_rgb = true;

  // Reads a preprocessor_config.json (image_processor_type CLIPImageProcessor or
  // CLIPFeatureExtractor when given); absent keys take CLIPImageProcessor's defaults. `size` and
  // `crop_size` may be an int (transformers' get_size_dict: size -> shortest_edge, crop_size ->
  // square) or a dict.
  static ClipImageProcessorConfig from_json(const nlohmann::json& config, const std::string& path);
  static ClipImageProcessorConfig from_file(const std::string& path);
};

// The (height, width) CLIPImageProcessor.resize gives an image of height x width.
std::pair<int64_t, int64_t> clip_resize_output_size(const ClipImageProcessorConfig& config,
                                                    int64_t height, int64_t width);

// images: uint8 [H, W, 3] each (sizes may differ). Returns pixel_values float32 [B, 3, h, w].
at::Tensor preprocess(const ClipImageProcessorConfig& config,
                      const std::vector<at::Tensor>& images);

// The processor as a value: ClipImageProcessor::from_file(".../image_processor/
// preprocessor_config.json").preprocess({image}) -> pixel_values.
class ClipImageProcessor {
 public:
  explicit ClipImageProcessor(ClipImageProcessorConfig config) : config_(std::move(config)) {}
  static ClipImageProcessor from_file(const std::string& path) {
    return ClipImageProcessor(ClipImageProcessorConfig::from_file(path));
  }
  const ClipImageProcessorConfig& config() const { return config_; }
  at::Tensor preprocess(const std::vector<at::Tensor>& images) const {
    return image::preprocess(config_, images);
  }

 private:
  ClipImageProcessorConfig config_;
};

}  // namespace xfuser::models::image
