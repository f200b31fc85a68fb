// Video output: H.264 in MP4 through FFmpeg's libraries (libavformat, libavcodec, libswscale),
// written atomically like every other output file; and the readers the tests use to check it.
// FFmpeg is optional at build time (XFUSER_WITH_FFMPEG): without it every function here throws an
// xfuser::Error naming the file and the missing libraries, and video_supported() is false.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>

namespace at {
class Tensor;
}

namespace xfuser::runner {

struct VideoInfo {
  int64_t frames = 0;  // decoded frame count
  int width = 0, height = 0;
  double fps = 0.0;                             // the stream's average frame rate
  std::string codec;                            // e.g. "h264"
  std::string pixel_format;                     // e.g. "yuv420p"
  std::map<std::string, std::string> metadata;  // the container's metadata (format-level tags)
};

// Encodes frames uint8 [F, H, W, 3] (RGB, any strides, any device; F >= 1; H and W even: yuv420p
// needs even sizes) as H.264 (libx264 at crf 17 when present, else any H.264 encoder the library
// has), yuv420p with BT.709 limited-range colour (tagged in the stream), at `fps` (> 0; fractional
// rates such as 23.976 become the nearest rational, 2997/125), in an MP4 (+faststart) whose
// container tags are `metadata` (any keys, e.g. "comment" holding the generation parameters; UTF-8
// values; written as MP4 metadata keys so arbitrary names survive). Written atomically: encoded
// into a temp file in the same folder, fsynced, renamed onto `path`; on any failure the temp file
// is removed and `path` is left as it was. Errors are xfuser::Error naming the file.
void write_mp4(const std::filesystem::path& path, const at::Tensor& frames, double fps,
               const std::map<std::string, std::string>& metadata = {});

// Reads a video's stream info (the best video stream), counting frames by decoding them. Errors
// (missing file, not a video, decoding failure) name the file.
VideoInfo read_video_info(const std::filesystem::path& path);

// Decodes every frame of the best video stream to uint8 [F, H, W, 3] RGB on the CPU (swscale,
// using the stream's colour matrix and range), for tests.
at::Tensor read_video_frames(const std::filesystem::path& path);

// True when this build has FFmpeg (XFUSER_WITH_FFMPEG), so video models can write their MP4s.
bool video_supported();

}  // namespace xfuser::runner
