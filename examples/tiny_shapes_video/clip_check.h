// The clip checker of tiny-shapes-video (examples/tiny_shapes_video/world.py's check_clip, in
// C++): tests/test_tiny_shapes_video.cpp scores held-out clips with it.
#pragma once

#include <cmath>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "examples/tiny_shapes/scene_check.h"

namespace xfuser::examples::tiny_shapes_video {

using nlohmann::json;

// world.check_clip's verdict on one clip:
//   background: the most common colour of the frames' border pixels is the caption's background;
//   present: the caption's colour has a 4-connected region of >= min_area pixels in at least
//     `present` of the frames (per frame, the largest region of pixels whose nearest palette
//     colour is the caption's);
//   moves: for right/left/down/up, that region's centroid travels >= distance * size the
//     caption's way, first found frame to last, with at most backward * (frames - 1) steps
//     going back more than step_slack pixels; for grow/shrink, its area grows (shrinks) by
//     area_ratio, first found frame to last;
//   pass: all three.
struct ClipVerdict {
  bool background = false;
  int present = 0;
  bool pass = false;
  double travel = 0.0;  // pixels, the caption's way (moves)
  int back_steps = 0;
  double area_ratio = 0.0;  // grow / shrink
  std::string why;
};

// `frames`: uint8 [F, H, W, 3].
inline ClipVerdict check_clip(const at::Tensor& frames, const std::string& colour,
                              const std::string& background, const std::string& motion,
                              const json& held) {
  const json& chk = held["checker"];
  const double distance = chk["distance"];
  const double backward = chk["backward"];
  const double step_slack = chk["step_slack"];
  const double area_ratio = chk["area_ratio"];
  const int min_area = chk["min_area"];
  const double present_share = chk["present"];
  const int size = held["size"];
  const tiny_shapes::detail::Palette pal(held["palette"]);
  const int f = static_cast<int>(frames.size(0));
  const int h = static_cast<int>(frames.size(1));
  const int w = static_cast<int>(frames.size(2));
  const std::vector<int> cls = pal.classify(frames);
  const auto at = [&](int i, int y, int x) {
    return cls[(static_cast<size_t>(i) * h + y) * w + x];
  };
  ClipVerdict v;
  std::vector<int> counts(pal.names.size(), 0);
  for (int i = 0; i < f; ++i) {
    for (int x = 0; x < w; ++x) ++counts[at(i, 0, x)], ++counts[at(i, h - 1, x)];
    for (int y = 0; y < h; ++y) ++counts[at(i, y, 0)], ++counts[at(i, y, w - 1)];
  }
  const int dominant =
      static_cast<int>(std::max_element(counts.begin(), counts.end()) - counts.begin());
  v.background = pal.names[dominant] == background;

  struct Region {
    double area, x, y;
  };
  std::vector<Region> found;
  const int target = pal.index(colour);
  std::vector<char> mask(static_cast<size_t>(h) * w);
  for (int i = 0; i < f; ++i) {
    for (int p = 0; p < h * w; ++p) mask[p] = cls[static_cast<size_t>(i) * h * w + p] == target;
    const std::vector<int> px = tiny_shapes::detail::largest_component_pixels(mask, h, w);
    if (static_cast<int>(px.size()) < min_area) continue;
    double sx = 0.0, sy = 0.0;
    for (int p : px) sx += p % w, sy += p / w;
    const double n = static_cast<double>(px.size());
    found.push_back({n, sx / n, sy / n});
  }
  v.present = static_cast<int>(found.size());
  if (!v.background) {
    v.why = "background is " + pal.names[dominant];
    return v;
  }
  if (v.present < present_share * f) {
    v.why =
        colour + " found in " + std::to_string(v.present) + " of " + std::to_string(f) + " frames";
    return v;
  }
  if (motion == "grow" || motion == "shrink") {
    const double first = found.front().area, last = found.back().area;
    v.area_ratio = motion == "grow" ? last / first : first / last;
    v.pass = v.area_ratio >= area_ratio;
    if (!v.pass) v.why = "area ratio " + std::to_string(v.area_ratio);
    return v;
  }
  const bool horizontal = motion == "right" || motion == "left";
  const double sign = (motion == "right" || motion == "down") ? 1.0 : -1.0;
  std::vector<double> pos;
  for (const auto& r : found) pos.push_back(sign * (horizontal ? r.x : r.y));
  v.travel = pos.back() - pos.front();
  for (size_t i = 1; i < pos.size(); ++i) v.back_steps += pos[i] - pos[i - 1] < -step_slack;
  v.pass =
      v.travel >= distance * size && v.back_steps <= backward * (held["frames"].get<int>() - 1);
  if (!v.pass) {
    v.why = "travel " + std::to_string(v.travel) + " px, " + std::to_string(v.back_steps) +
            " steps back";
  }
  return v;
}

// The request of held-out clips [start, end) of `set`: their captions, seed i for clip i, and
// the held-out size, frames, steps, guidance and text length (as score.py).
inline models::GenerationRequest clip_request(const json& set, int start, int end,
                                              const json& held) {
  models::GenerationRequest r;
  for (int i = start; i < end; ++i) {
    r.prompts.push_back(set[i]["caption"]);
    r.seeds.push_back(i);
  }
  r.height = held["size"];
  r.width = held["size"];
  r.num_frames = held["frames"];
  r.num_inference_steps = held["num_inference_steps"];
  r.guidance_scale = held["guidance_scale"];
  r.max_sequence_length = held["max_sequence_length"];
  return r;
}

}  // namespace xfuser::examples::tiny_shapes_video
