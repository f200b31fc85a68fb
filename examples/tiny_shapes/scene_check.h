// The measured criterion of a tiny-shapes picture (examples/tiny_shapes/score.py's, in C++):
// tests/test_tiny_shapes.cpp and bench/bench_cache_quality.cpp score held-out scenes with it.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "models/xfuser_model.h"

namespace xfuser::examples::tiny_shapes {

using nlohmann::json;

// examples/tiny_shapes/score.py's criterion, on one uint8 [H, W, 3] picture: each pixel is named
// by its nearest palette colour; each shape's central box of its cell holds >= 20% pixels not of
// the background colour, the named colour the most common of them; every cell the caption leaves
// empty is >= 90% background colour.
struct Verdict {
  bool pass = true;
  std::string why;
};

inline Verdict check_picture(const at::Tensor& picture, const json& scene, const json& held) {
  const int size = held["size"];
  const int grid = held["grid"];
  const int box = held["box"];
  std::vector<std::string> names;
  std::vector<std::array<float, 3>> palette;
  for (const auto& [name, rgb] : held["palette"].items()) {
    names.push_back(name);
    palette.push_back({rgb[0].get<float>(), rgb[1].get<float>(), rgb[2].get<float>()});
  }
  auto index_of = [&](const std::string& name) {
    return static_cast<int>(std::find(names.begin(), names.end(), name) - names.begin());
  };
  const auto px = picture.contiguous();
  const uint8_t* p = px.data_ptr<uint8_t>();
  std::vector<int> cls(static_cast<size_t>(size) * size);
  for (int i = 0; i < size * size; ++i) {
    float best = 1e30f;
    for (size_t c = 0; c < palette.size(); ++c) {
      float d = 0.f;
      for (int k = 0; k < 3; ++k) {
        const float v = static_cast<float>(p[i * 3 + k]) - palette[c][k];
        d += v * v;
      }
      if (d < best) {
        best = d;
        cls[i] = static_cast<int>(c);
      }
    }
  }
  const int bg = index_of(scene["background"]);
  const double cell = static_cast<double>(size) / grid;
  Verdict v;
  std::vector<bool> used(static_cast<size_t>(grid) * grid, false);
  for (const auto& shape : scene["shapes"]) {
    const int row = shape["row"];
    const int col = shape["col"];
    used[row * grid + col] = true;
    const int x0 = static_cast<int>(std::lround((col + 0.5) * cell - box / 2.0));
    const int y0 = static_cast<int>(std::lround((row + 0.5) * cell - box / 2.0));
    std::vector<int> counts(names.size(), 0);
    int fg = 0;
    for (int y = y0; y < y0 + box; ++y) {
      for (int x = x0; x < x0 + box; ++x) {
        const int c = cls[y * size + x];
        if (c != bg) {
          ++counts[c];
          ++fg;
        }
      }
    }
    const int dominant =
        static_cast<int>(std::max_element(counts.begin(), counts.end()) - counts.begin());
    const double frac = static_cast<double>(fg) / (box * box);
    if (frac < 0.2 || names[dominant] != shape["colour"].get<std::string>()) {
      v.pass = false;
      v.why += "cell (" + std::to_string(row) + "," + std::to_string(col) +
               "): " + std::to_string(frac) + " foreground, mostly " + names[dominant] + "; ";
    }
  }
  for (int row = 0; row < grid; ++row) {
    for (int col = 0; col < grid; ++col) {
      if (used[row * grid + col]) continue;
      const int y0 = static_cast<int>(std::lround(row * cell));
      const int y1 = static_cast<int>(std::lround((row + 1) * cell));
      const int x0 = static_cast<int>(std::lround(col * cell));
      const int x1 = static_cast<int>(std::lround((col + 1) * cell));
      int n = 0;
      int bgn = 0;
      for (int y = y0; y < y1; ++y) {
        for (int x = x0; x < x1; ++x) {
          ++n;
          bgn += cls[y * size + x] == bg;
        }
      }
      if (bgn < 0.9 * n) {
        v.pass = false;
        v.why += "empty cell (" + std::to_string(row) + "," + std::to_string(col) +
                 "): background " + std::to_string(static_cast<double>(bgn) / n) + "; ";
      }
    }
  }
  return v;
}

// `count` held-out scenes spread evenly over held["scenes"] (which is sorted by background).
inline json spread_scenes(const json& held, int count) {
  const auto& all = held["scenes"];
  json scenes = json::array();
  for (int i = 0; i < count; ++i) {
    scenes.push_back(all[static_cast<size_t>(i) * all.size() / static_cast<size_t>(count)]);
  }
  return scenes;
}

// The request of scenes [start, end): their captions, seed i for scene i, the held-out size,
// `steps` steps, guidance 3.5 and 32 text tokens (as examples/tiny_shapes/score.py).
inline models::GenerationRequest scene_request(const json& scenes, int start, int end,
                                               const json& held, int steps) {
  models::GenerationRequest r;
  for (int i = start; i < end; ++i) {
    r.prompts.push_back(scenes[i]["caption"]);
    r.seeds.push_back(i);
  }
  r.height = held["size"];
  r.width = held["size"];
  r.num_inference_steps = steps;
  r.guidance_scale = 3.5;
  r.max_sequence_length = 32;
  return r;
}

}  // namespace xfuser::examples::tiny_shapes
