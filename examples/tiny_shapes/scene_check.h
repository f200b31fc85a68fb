// The scene and shape checker of tiny-shapes (examples/tiny_shapes/score.py's, in C++):
// tests/test_tiny_shapes.cpp and bench/bench_cache_quality.cpp score held-out scenes with it.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "models/xfuser_model.h"

namespace xfuser::examples::tiny_shapes {

using nlohmann::json;

// score.py's verdict on one picture of one held-out scene:
//   colour_place: each shape's colour is the most common non-background colour of the central
//     box of its cell (>= `foreground` of the box not background), every other cell is >= `empty`
//     background; when the caption leaves the places out, the occupied cells are found and their
//     colours, as a multiset, are the shapes' colours;
//   kind: each shape's largest component of its colour in its cell (widened by `margin`) is
//     nearest the prototype of its kind in (fill of its bounding box, share in the box's upper
//     half); implies colour_place;
//   pass: both.
struct Verdict {
  bool colour_place = true;
  bool kind = true;
  bool pass = true;
  std::string why;
};

namespace detail {

struct Shape {
  double fill = 0.0;
  double top = 0.0;
};

// The held-out palette (name -> RGB, in the JSON object's order) and each pixel's nearest
// colour (squared RGB distance; ties: the first).
struct Palette {
  std::vector<std::string> names;
  std::vector<std::array<float, 3>> rgb;

  explicit Palette(const json& palette) {
    for (const auto& [name, c] : palette.items()) {
      names.push_back(name);
      rgb.push_back({c[0].get<float>(), c[1].get<float>(), c[2].get<float>()});
    }
  }
  int index(const std::string& name) const {
    return static_cast<int>(std::find(names.begin(), names.end(), name) - names.begin());
  }
  // `pixels`: uint8 [..., 3]; the nearest colour's index of each pixel, in order.
  std::vector<int> classify(const at::Tensor& pixels) const {
    const auto px = pixels.contiguous();
    const uint8_t* p = px.data_ptr<uint8_t>();
    const int64_t n = px.numel() / 3;
    std::vector<int> cls(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      float best = 1e30f;
      for (size_t c = 0; c < rgb.size(); ++c) {
        float d = 0.f;
        for (int k = 0; k < 3; ++k) {
          const float v = static_cast<float>(p[i * 3 + k]) - rgb[c][k];
          d += v * v;
        }
        if (d < best) {
          best = d;
          cls[i] = static_cast<int>(c);
        }
      }
    }
    return cls;
  }
};

// The pixels (row-major indices) of the largest 4-connected component of `mask` ([h, w],
// row-major); empty when the mask is. Ties: the first component met in scan order, as score.py
// (and examples/tiny_shapes_video/world.py) keep.
inline std::vector<int> largest_component_pixels(const std::vector<char>& mask, int h, int w) {
  std::vector<int> label(mask.size(), 0);
  std::vector<int> best_pixels;
  int n = 0;
  std::vector<int> stack;
  std::vector<int> pixels;
  for (int start = 0; start < h * w; ++start) {
    if (!mask[start] || label[start]) continue;
    ++n;
    pixels.clear();
    stack.assign(1, start);
    label[start] = n;
    while (!stack.empty()) {
      const int p = stack.back();
      stack.pop_back();
      pixels.push_back(p);
      const int y = p / w;
      const int x = p % w;
      const std::array<std::pair<int, int>, 4> next = {
          {{y - 1, x}, {y + 1, x}, {y, x - 1}, {y, x + 1}}};
      for (const auto& [ny, nx] : next) {
        if (ny < 0 || ny >= h || nx < 0 || nx >= w) continue;
        const int q = ny * w + nx;
        if (mask[q] && !label[q]) {
          label[q] = n;
          stack.push_back(q);
        }
      }
    }
    if (pixels.size() > best_pixels.size()) best_pixels = pixels;
  }
  return best_pixels;
}

// The largest 4-connected component of `mask` ([h, w], row-major): its fill and top share;
// nullopt when the mask is empty.
inline std::optional<Shape> largest_component(const std::vector<char>& mask, int h, int w) {
  const std::vector<int> best_pixels = largest_component_pixels(mask, h, w);
  if (best_pixels.empty()) return std::nullopt;
  int y0 = h, y1 = 0, x0 = w, x1 = 0;
  for (const int p : best_pixels) {
    y0 = std::min(y0, p / w);
    y1 = std::max(y1, p / w + 1);
    x0 = std::min(x0, p % w);
    x1 = std::max(x1, p % w + 1);
  }
  const double bh = y1 - y0;
  int upper = 0;
  for (const int p : best_pixels) upper += (p / w) < y0 + bh / 2.0;
  Shape s;
  s.fill = static_cast<double>(best_pixels.size()) / (bh * (x1 - x0));
  s.top = static_cast<double>(upper) / static_cast<double>(best_pixels.size());
  return s;
}

}  // namespace detail

inline Verdict check_picture(const at::Tensor& picture, const json& scene, const json& held) {
  const int size = held["size"];
  const int grid = held["grid"];
  const json& chk = held["checker"];
  const int box = chk["box"];
  const int margin = chk["margin"];
  const double foreground = chk["foreground"];
  const double empty = chk["empty"];
  const detail::Palette pal(held["palette"]);
  auto index_of = [&](const std::string& name) { return pal.index(name); };
  const std::vector<int> cls = pal.classify(picture);
  const int bg = index_of(scene["background"]);
  const double cell = static_cast<double>(size) / grid;
  auto bounds = [&](int row, int col, int widen) {
    return std::array<int, 4>{
        std::max(0, static_cast<int>(std::lround(row * cell)) - widen),
        std::min(size, static_cast<int>(std::lround((row + 1) * cell)) + widen),
        std::max(0, static_cast<int>(std::lround(col * cell)) - widen),
        std::min(size, static_cast<int>(std::lround((col + 1) * cell)) + widen)};
  };
  // The central box of a cell: the share of non-background pixels and their most common colour.
  auto box_colours = [&](int row, int col) {
    const int x0 = static_cast<int>(std::lround((col + 0.5) * cell - box / 2.0));
    const int y0 = static_cast<int>(std::lround((row + 0.5) * cell - box / 2.0));
    std::vector<int> counts(pal.names.size(), 0);
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
    return std::pair<double, std::string>{static_cast<double>(fg) / (box * box),
                                          fg ? pal.names[dominant] : std::string()};
  };
  // The kind drawn in a cell in `colour`: the nearest prototype; "" when there is none.
  auto kind_in = [&](int row, int col, const std::string& colour) {
    const auto [y0, y1, x0, x1] = bounds(row, col, margin);
    const int h = y1 - y0;
    const int w = x1 - x0;
    const int want = index_of(colour);
    std::vector<char> mask(static_cast<size_t>(h) * w);
    for (int y = 0; y < h; ++y) {
      for (int x = 0; x < w; ++x) mask[y * w + x] = cls[(y0 + y) * size + x0 + x] == want;
    }
    const auto shape = detail::largest_component(mask, h, w);
    std::string kind;
    if (!shape) return kind;
    double nearest = 1e30;
    for (const auto& [name, proto] : chk["prototypes"].items()) {
      const double df =
          (shape->fill - proto[0].get<double>()) / chk["spread"]["fill"].get<double>();
      const double dt = (shape->top - proto[1].get<double>()) / chk["spread"]["top"].get<double>();
      if (df * df + dt * dt < nearest) {
        nearest = df * df + dt * dt;
        kind = name;
      }
    }
    return kind;
  };
  auto where = [](int row, int col) {
    return "cell (" + std::to_string(row) + "," + std::to_string(col) + ")";
  };

  Verdict v;
  std::vector<bool> occupied(static_cast<size_t>(grid) * grid, false);
  if (scene.value("places_said", true)) {
    for (const auto& shape : scene["shapes"]) {
      const int row = shape["row"];
      const int col = shape["col"];
      const std::string colour = shape["colour"];
      occupied[row * grid + col] = true;
      const auto [frac, dominant] = box_colours(row, col);
      if (frac < foreground || dominant != colour) {
        v.colour_place = false;
        v.why += where(row, col) + ": " + std::to_string(frac) + " foreground, mostly " +
                 (dominant.empty() ? "nothing" : dominant) + "; ";
        continue;
      }
      const std::string kind = kind_in(row, col, colour);
      if (kind != shape["kind"].get<std::string>()) {
        v.kind = false;
        v.why += where(row, col) + ": a " + shape["kind"].get<std::string>() + " drawn as a " +
                 kind + "; ";
      }
    }
  } else {
    std::vector<std::string> want;
    std::map<std::pair<int, int>, std::string> found;
    for (const auto& shape : scene["shapes"]) want.push_back(shape["colour"]);
    std::vector<std::string> got;
    for (int row = 0; row < grid; ++row) {
      for (int col = 0; col < grid; ++col) {
        const auto [frac, dominant] = box_colours(row, col);
        if (frac >= foreground) {
          found[{row, col}] = dominant;
          got.push_back(dominant);
          occupied[row * grid + col] = true;
        }
      }
    }
    std::sort(want.begin(), want.end());
    std::sort(got.begin(), got.end());
    if (want != got) {
      v.colour_place = false;
      v.why += "colours found in the cells differ from the caption's; ";
    }
    // Per colour, the kinds drawn in its cells, as a multiset, are the kinds asked for.
    std::map<std::string, std::vector<std::string>> asked;
    std::map<std::string, std::vector<std::string>> drawn;
    for (const auto& shape : scene["shapes"]) asked[shape["colour"]].push_back(shape["kind"]);
    for (const auto& [place, colour] : found) {
      if (asked.count(colour)) drawn[colour].push_back(kind_in(place.first, place.second, colour));
    }
    for (auto& [colour, kinds] : asked) {
      auto& d = drawn[colour];
      std::sort(kinds.begin(), kinds.end());
      std::sort(d.begin(), d.end());
      if (kinds != d) {
        v.kind = false;
        v.why += colour + " shapes of the wrong kind; ";
      }
    }
  }
  for (int row = 0; row < grid; ++row) {
    for (int col = 0; col < grid; ++col) {
      if (occupied[row * grid + col]) continue;
      const auto [y0, y1, x0, x1] = bounds(row, col, 0);
      int n = 0;
      int bgn = 0;
      for (int y = y0; y < y1; ++y) {
        for (int x = x0; x < x1; ++x) {
          ++n;
          bgn += cls[y * size + x] == bg;
        }
      }
      if (bgn < empty * n) {
        v.colour_place = false;
        v.why += "empty " + where(row, col) + ": background " +
                 std::to_string(static_cast<double>(bgn) / n) + "; ";
      }
    }
  }
  v.kind = v.kind && v.colour_place;
  v.pass = v.kind;
  return v;
}

// `count` scenes spread evenly over held["sets"][set] (score.py's spread).
inline json spread_scenes(const json& held, int count, const std::string& set = "single") {
  const auto& all = held["sets"][set];
  count = std::min(count, static_cast<int>(all.size()));
  json scenes = json::array();
  for (int i = 0; i < count; ++i) {
    scenes.push_back(all[static_cast<size_t>(i) * all.size() / static_cast<size_t>(count)]);
  }
  return scenes;
}

// The request of scenes [start, end): their captions, seed i for scene i, the held-out size,
// `steps` steps, guidance 3.5 and the held-out text length (as examples/tiny_shapes/score.py).
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
  r.max_sequence_length = held["max_sequence_length"];
  return r;
}

}  // namespace xfuser::examples::tiny_shapes
