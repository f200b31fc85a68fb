#include "runner/video.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstring>
#include <memory>
#include <mutex>
#include <random>
#include <vector>

#include <ATen/ATen.h>

#include "backends/error.h"

#if XFUSER_WITH_FFMPEG
extern "C" {
#include <libavcodec/avcodec.h>
#include <libavformat/avformat.h>
#include <libavutil/dict.h>
#include <libavutil/error.h>
#include <libavutil/frame.h>
#include <libavutil/imgutils.h>
#include <libavutil/log.h>
#include <libavutil/pixdesc.h>
#include <libavutil/rational.h>
#include <libswscale/swscale.h>
}

namespace xfuser::runner {
namespace fs = std::filesystem;

namespace {

// av_err2str is a C compound literal; this is its C++ form.
std::string av_error(int code) {
  char buf[AV_ERROR_MAX_STRING_SIZE] = {0};
  if (av_strerror(code, buf, sizeof(buf)) < 0) {
    return "FFmpeg error " + std::to_string(code);
  }
  return buf;
}

// Throws naming the file and the step when an FFmpeg call returned an error code.
void av_check(int ret, const std::string& file, const char* what) {
  XF_CHECK(ret >= 0, file, ": ", what, " failed: ", av_error(ret));
}

// FFmpeg logs at INFO by default (libx264 prints a dozen statistics lines per video): lowered
// to errors, once, unless the program chose a level itself. Failures are reported through
// xfuser::Error anyway.
void quiet_ffmpeg_logs() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (av_log_get_level() == AV_LOG_INFO) av_log_set_level(AV_LOG_ERROR);
  });
}

// FFmpeg objects, freed on every path.
struct OutputFormatDeleter {
  void operator()(AVFormatContext* c) const {
    if (c->pb != nullptr && (c->oformat->flags & AVFMT_NOFILE) == 0) avio_closep(&c->pb);
    avformat_free_context(c);
  }
};
struct InputFormatDeleter {
  void operator()(AVFormatContext* c) const { avformat_close_input(&c); }
};
struct CodecContextDeleter {
  void operator()(AVCodecContext* c) const { avcodec_free_context(&c); }
};
struct FrameDeleter {
  void operator()(AVFrame* f) const { av_frame_free(&f); }
};
struct PacketDeleter {
  void operator()(AVPacket* p) const { av_packet_free(&p); }
};
struct SwsDeleter {
  void operator()(SwsContext* s) const { sws_freeContext(s); }
};
using OutputFormatPtr = std::unique_ptr<AVFormatContext, OutputFormatDeleter>;
using InputFormatPtr = std::unique_ptr<AVFormatContext, InputFormatDeleter>;
using CodecContextPtr = std::unique_ptr<AVCodecContext, CodecContextDeleter>;
using FramePtr = std::unique_ptr<AVFrame, FrameDeleter>;
using PacketPtr = std::unique_ptr<AVPacket, PacketDeleter>;
using SwsPtr = std::unique_ptr<SwsContext, SwsDeleter>;

class Dictionary {
 public:
  Dictionary() = default;
  ~Dictionary() { av_dict_free(&dict_); }
  Dictionary(const Dictionary&) = delete;
  Dictionary& operator=(const Dictionary&) = delete;
  AVDictionary** get() { return &dict_; }

 private:
  AVDictionary* dict_ = nullptr;
};

// "file:" so that a path with a colon is never taken for another protocol.
std::string file_url(const fs::path& path) { return "file:" + path.string(); }

// Removes the temp file unless the write completed.
class TempFileGuard {
 public:
  explicit TempFileGuard(fs::path path) : path_(std::move(path)) {}
  ~TempFileGuard() {
    if (!path_.empty()) ::unlink(path_.c_str());
  }
  TempFileGuard(const TempFileGuard&) = delete;
  TempFileGuard& operator=(const TempFileGuard&) = delete;
  void release() { path_.clear(); }

 private:
  fs::path path_;
};

// Encodes `frames` (CPU, contiguous, uint8 [F, H, W, 3]) into the MP4 file `tmp`; `name` is the
// final path, for messages.
void encode_mp4(const fs::path& tmp, const std::string& name, const at::Tensor& frames,
                AVRational rate, const std::map<std::string, std::string>& metadata) {
  const int num_frames = static_cast<int>(frames.size(0));
  const int height = static_cast<int>(frames.size(1));
  const int width = static_cast<int>(frames.size(2));
  const std::string url = file_url(tmp);

  quiet_ffmpeg_logs();
  const AVCodec* codec = avcodec_find_encoder_by_name("libx264");
  const bool x264 = codec != nullptr;
  if (codec == nullptr) codec = avcodec_find_encoder(AV_CODEC_ID_H264);
  XF_CHECK(codec != nullptr, name,
           ": this FFmpeg (libavcodec) has no H.264 encoder, neither libx264 nor another; install "
           "a libavcodec built with libx264");

  AVFormatContext* raw_format = nullptr;
  av_check(avformat_alloc_output_context2(&raw_format, nullptr, "mp4", url.c_str()), name,
           "allocating the MP4 muxer");
  OutputFormatPtr format(raw_format);
  AVStream* stream = avformat_new_stream(format.get(), nullptr);
  XF_CHECK(stream != nullptr, name, ": avformat_new_stream failed");

  CodecContextPtr encoder(avcodec_alloc_context3(codec));
  XF_CHECK(encoder != nullptr, name, ": avcodec_alloc_context3 failed");
  encoder->width = width;
  encoder->height = height;
  encoder->pix_fmt = AV_PIX_FMT_YUV420P;
  encoder->time_base = av_inv_q(rate);
  encoder->framerate = rate;
  encoder->sample_aspect_ratio = AVRational{1, 1};
  // What the RGB -> YUV conversion below does, tagged in the stream so players invert it.
  encoder->color_range = AVCOL_RANGE_MPEG;
  encoder->colorspace = AVCOL_SPC_BT709;
  encoder->color_primaries = AVCOL_PRI_BT709;
  encoder->color_trc = AVCOL_TRC_BT709;
  if ((format->oformat->flags & AVFMT_GLOBALHEADER) != 0) {
    encoder->flags |= AV_CODEC_FLAG_GLOBAL_HEADER;
  }
  Dictionary codec_options;
  if (x264) {
    av_check(av_dict_set(codec_options.get(), "crf", "17", 0), name, "setting crf");
  } else {
    // Encoders without a constant-quality mode: about 1 bit per pixel, high quality.
    encoder->bit_rate = std::max<int64_t>(
        1000000, static_cast<int64_t>(static_cast<double>(width) * height * av_q2d(rate)));
  }
  av_check(avcodec_open2(encoder.get(), codec, codec_options.get()), name,
           (std::string("opening the H.264 encoder ") + codec->name).c_str());
  av_check(avcodec_parameters_from_context(stream->codecpar, encoder.get()), name,
           "avcodec_parameters_from_context");
  stream->time_base = encoder->time_base;
  stream->avg_frame_rate = rate;

  for (const auto& [key, value] : metadata) {
    av_check(av_dict_set(&format->metadata, key.c_str(), value.c_str(), 0), name,
             ("setting metadata '" + key + "'").c_str());
  }
  av_check(avio_open(&format->pb, url.c_str(), AVIO_FLAG_WRITE), name,
           ("opening the temp file " + tmp.string()).c_str());
  Dictionary muxer_options;
  // faststart: the index before the data, so a browser plays while downloading;
  // use_metadata_tags: every key is written (plain MP4 tags know only a fixed set of names).
  av_check(av_dict_set(muxer_options.get(), "movflags", "+faststart+use_metadata_tags", 0), name,
           "setting movflags");
  av_check(avformat_write_header(format.get(), muxer_options.get()), name,
           "writing the MP4 header");

  FramePtr frame(av_frame_alloc());
  PacketPtr packet(av_packet_alloc());
  XF_CHECK(frame != nullptr && packet != nullptr, name, ": av_frame_alloc/av_packet_alloc failed");
  frame->format = AV_PIX_FMT_YUV420P;
  frame->width = width;
  frame->height = height;
  frame->color_range = encoder->color_range;
  frame->colorspace = encoder->colorspace;
  frame->color_primaries = encoder->color_primaries;
  frame->color_trc = encoder->color_trc;
  av_check(av_frame_get_buffer(frame.get(), 0), name, "allocating a frame");

  SwsPtr sws(sws_getContext(width, height, AV_PIX_FMT_RGB24, width, height, AV_PIX_FMT_YUV420P,
                            SWS_BICUBIC | SWS_ACCURATE_RND | SWS_FULL_CHR_H_INP, nullptr, nullptr,
                            nullptr));
  XF_CHECK(sws != nullptr, name, ": sws_getContext (RGB24 -> YUV420P) failed");
  // RGB (full range) to BT.709 limited-range YUV.
  const int* bt709 = sws_getCoefficients(SWS_CS_ITU709);
  av_check(sws_setColorspaceDetails(sws.get(), bt709, 1, bt709, 0, 0, 1 << 16, 1 << 16), name,
           "sws_setColorspaceDetails");

  auto drain = [&]() {
    while (true) {
      const int ret = avcodec_receive_packet(encoder.get(), packet.get());
      if (ret == AVERROR(EAGAIN) || ret == AVERROR_EOF) return;
      av_check(ret, name, "avcodec_receive_packet");
      if (packet->duration <= 0) packet->duration = 1;  // one frame, in the encoder's time base
      av_packet_rescale_ts(packet.get(), encoder->time_base, stream->time_base);
      packet->stream_index = stream->index;
      av_check(av_interleaved_write_frame(format.get(), packet.get()), name,
               "writing a video packet");
    }
  };

  // swscale's SIMD loads read up to 16 bytes past a row's end: the RGB rows are copied into a
  // padded frame first rather than read out of the tensor's exact-size storage.
  FramePtr rgb(av_frame_alloc());
  XF_CHECK(rgb != nullptr, name, ": av_frame_alloc failed");
  rgb->format = AV_PIX_FMT_RGB24;
  rgb->width = width;
  rgb->height = height;
  av_check(av_frame_get_buffer(rgb.get(), 0), name, "allocating an RGB frame");

  const uint8_t* base = frames.data_ptr<uint8_t>();
  const int rgb_stride = width * 3;
  const size_t frame_bytes = static_cast<size_t>(height) * rgb_stride;
  for (int f = 0; f < num_frames; ++f) {
    av_image_copy_plane(rgb->data[0], rgb->linesize[0], base + f * frame_bytes, rgb_stride,
                        rgb_stride, height);
    av_check(av_frame_make_writable(frame.get()), name, "av_frame_make_writable");
    const int rows =
        sws_scale(sws.get(), rgb->data, rgb->linesize, 0, height, frame->data, frame->linesize);
    XF_CHECK(rows == height, name, ": sws_scale (RGB24 -> YUV420P) of frame ", f, " returned ",
             rows);
    frame->pts = f;
    av_check(avcodec_send_frame(encoder.get(), frame.get()), name, "avcodec_send_frame");
    drain();
  }
  av_check(avcodec_send_frame(encoder.get(), nullptr), name, "flushing the encoder");
  drain();
  av_check(av_write_trailer(format.get()), name, "writing the MP4 trailer");
  av_check(avio_closep(&format->pb), name, ("closing the temp file " + tmp.string()).c_str());
}

// An opened input with its best video stream's decoder.
struct VideoInput {
  InputFormatPtr format;
  CodecContextPtr decoder;
  AVStream* stream = nullptr;
};

VideoInput open_video(const fs::path& path) {
  const std::string name = path.string();
  std::error_code ec;
  XF_CHECK(fs::is_regular_file(path, ec), "video ", name, " does not exist or is not a file");
  quiet_ffmpeg_logs();
  VideoInput in;
  AVFormatContext* raw = nullptr;
  const std::string url = file_url(path);
  const int ret = avformat_open_input(&raw, url.c_str(), nullptr, nullptr);
  XF_CHECK(ret >= 0, "cannot open video ", name, ": ", av_error(ret));
  in.format.reset(raw);
  av_check(avformat_find_stream_info(in.format.get(), nullptr), name, "avformat_find_stream_info");
  const AVCodec* codec = nullptr;
  const int index = av_find_best_stream(in.format.get(), AVMEDIA_TYPE_VIDEO, -1, -1, &codec, 0);
  XF_CHECK(index >= 0, name, " has no decodable video stream: ", av_error(index));
  in.stream = in.format->streams[index];
  in.decoder.reset(avcodec_alloc_context3(codec));
  XF_CHECK(in.decoder != nullptr, name, ": avcodec_alloc_context3 failed");
  av_check(avcodec_parameters_to_context(in.decoder.get(), in.stream->codecpar), name,
           "avcodec_parameters_to_context");
  av_check(avcodec_open2(in.decoder.get(), codec, nullptr), name,
           (std::string("opening the decoder ") + codec->name).c_str());
  return in;
}

// Calls fn(frame) for every decoded frame of the stream, in presentation order.
template <typename Fn>
void decode_all(VideoInput& in, const std::string& name, Fn fn) {
  PacketPtr packet(av_packet_alloc());
  FramePtr frame(av_frame_alloc());
  XF_CHECK(packet != nullptr && frame != nullptr, name, ": av_packet_alloc/av_frame_alloc failed");
  auto receive = [&]() {
    while (true) {
      const int ret = avcodec_receive_frame(in.decoder.get(), frame.get());
      if (ret == AVERROR(EAGAIN) || ret == AVERROR_EOF) return;
      av_check(ret, name, "decoding a frame");
      fn(*frame);
      av_frame_unref(frame.get());
    }
  };
  while (true) {
    const int ret = av_read_frame(in.format.get(), packet.get());
    if (ret == AVERROR_EOF) break;
    av_check(ret, name, "reading a packet");
    if (packet->stream_index == in.stream->index) {
      const int sent = avcodec_send_packet(in.decoder.get(), packet.get());
      av_packet_unref(packet.get());
      av_check(sent, name, "decoding a packet");
      receive();
    } else {
      av_packet_unref(packet.get());
    }
  }
  av_check(avcodec_send_packet(in.decoder.get(), nullptr), name, "flushing the decoder");
  receive();
}

}  // namespace

void write_mp4(const fs::path& path, const at::Tensor& frames, double fps,
               const std::map<std::string, std::string>& metadata) {
  const std::string name = path.string();
  XF_CONTEXT("writing video ", name);
  XF_CHECK(frames.defined(), "write_mp4 ", name, ": the frames tensor is undefined");
  XF_CHECK(frames.dim() == 4 && frames.size(3) == 3, "write_mp4 ", name,
           ": frames must be uint8 [F, H, W, 3] (RGB), got shape ", frames.sizes());
  XF_CHECK(frames.scalar_type() == at::kByte, "write_mp4 ", name,
           ": frames must be uint8 [F, H, W, 3] (RGB), got ", frames.scalar_type(), " of shape ",
           frames.sizes());
  const int64_t num_frames = frames.size(0), height = frames.size(1), width = frames.size(2);
  XF_CHECK(num_frames >= 1 && height >= 1 && width >= 1, "write_mp4 ", name,
           ": frames [F, H, W, 3] must have F, H, W >= 1, got shape ", frames.sizes());
  XF_CHECK(height % 2 == 0 && width % 2 == 0, "write_mp4 ", name, ": frame size ", height, "x",
           width, " (HxW) is odd; yuv420p (H.264) needs an even height and width");
  XF_CHECK(height <= 16384 && width <= 16384 && num_frames <= INT_MAX, "write_mp4 ", name,
           ": frames ", frames.sizes(), " are too large for H.264 (at most 16384 x 16384)");
  XF_CHECK(std::isfinite(fps) && fps > 0, "write_mp4 ", name, ": fps must be > 0, got ", fps);
  const AVRational rate = av_d2q(fps, 100000);
  XF_CHECK(rate.num > 0 && rate.den > 0, "write_mp4 ", name, ": fps ", fps,
           " has no rational form num/den with both <= 100000");
  for (const auto& [key, value] : metadata) {
    XF_CHECK(!key.empty() && key.find('\0') == std::string::npos, "write_mp4 ", name,
             ": metadata keys must be non-empty and contain no NUL, got '", key, "'");
    XF_CHECK(value.find('\0') == std::string::npos, "write_mp4 ", name, ": metadata '", key,
             "' contains a NUL character");
  }
  const at::Tensor cpu = frames.to(at::kCPU).contiguous();

  const fs::path dir = path.has_parent_path() ? path.parent_path() : fs::path(".");
  std::random_device rd;
  const fs::path tmp = dir / ("." + path.filename().string() + ".tmp" + std::to_string(rd()));
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  XF_CHECK(fd >= 0, "write_mp4 ", name, ": cannot create the temp file ", tmp.string(), ": ",
           std::strerror(errno));
  ::close(fd);
  TempFileGuard guard(tmp);

  encode_mp4(tmp, name, cpu, rate, metadata);

  fd = ::open(tmp.c_str(), O_WRONLY | O_CLOEXEC);
  XF_CHECK(fd >= 0, "write_mp4 ", name, ": cannot reopen ", tmp.string(),
           " to flush it: ", std::strerror(errno));
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    const int err = errno;
    XF_THROW("write_mp4 ", name, ": flushing ", tmp.string(), " failed: ", std::strerror(err));
  }
  XF_CHECK(::rename(tmp.c_str(), path.c_str()) == 0, "write_mp4: renaming ", tmp.string(), " to ",
           name, " failed: ", std::strerror(errno));
  guard.release();
}

VideoInfo read_video_info(const fs::path& path) {
  const std::string name = path.string();
  XF_CONTEXT("reading video ", name);
  VideoInput in = open_video(path);
  VideoInfo info;
  const AVCodecParameters* par = in.stream->codecpar;
  info.width = par->width;
  info.height = par->height;
  info.fps = in.stream->avg_frame_rate.den != 0 ? av_q2d(in.stream->avg_frame_rate) : 0.0;
  info.codec = avcodec_get_name(par->codec_id);
  const char* pix = av_get_pix_fmt_name(static_cast<AVPixelFormat>(par->format));
  info.pixel_format = pix != nullptr ? pix : "";
  const AVDictionaryEntry* tag = nullptr;
  while ((tag = av_dict_get(in.format->metadata, "", tag, AV_DICT_IGNORE_SUFFIX)) != nullptr) {
    info.metadata[tag->key] = tag->value;
  }
  decode_all(in, name, [&](const AVFrame&) { ++info.frames; });
  return info;
}

at::Tensor read_video_frames(const fs::path& path) {
  const std::string name = path.string();
  XF_CONTEXT("reading video ", name);
  VideoInput in = open_video(path);
  std::vector<at::Tensor> frames;
  SwsContext* sws = nullptr;  // sws_getCachedContext reuses or replaces it
  SwsPtr sws_owner;
  FramePtr rgb_frame;
  decode_all(in, name, [&](const AVFrame& frame) {
    XF_CHECK(
        frames.empty() || (frames[0].size(0) == frame.height && frames[0].size(1) == frame.width),
        name, ": the frame size changes from ", frames[0].size(0), "x", frames[0].size(1), " to ",
        frame.height, "x", frame.width, " at frame ", frames.size());
    sws = sws_getCachedContext(
        sws, frame.width, frame.height, static_cast<AVPixelFormat>(frame.format), frame.width,
        frame.height, AV_PIX_FMT_RGB24, SWS_BICUBIC | SWS_ACCURATE_RND | SWS_FULL_CHR_H_INT,
        nullptr, nullptr, nullptr);
    sws_owner.release();
    sws_owner.reset(sws);
    XF_CHECK(sws != nullptr, name, ": sws_getContext (",
             av_get_pix_fmt_name(static_cast<AVPixelFormat>(frame.format)), " -> RGB24) failed");
    // The stream's matrix and range (BT.601 when unspecified, as players assume).
    const int* matrix = sws_getCoefficients(frame.colorspace);
    av_check(sws_setColorspaceDetails(sws, matrix, frame.color_range == AVCOL_RANGE_JPEG ? 1 : 0,
                                      matrix, 1, 0, 1 << 16, 1 << 16),
             name, "sws_setColorspaceDetails");
    // Into a padded, aligned frame (swscale may store whole vectors past a row's end), then
    // row by row into the tensor.
    if (rgb_frame == nullptr || rgb_frame->width != frame.width ||
        rgb_frame->height != frame.height) {
      rgb_frame.reset(av_frame_alloc());
      XF_CHECK(rgb_frame != nullptr, name, ": av_frame_alloc failed");
      rgb_frame->format = AV_PIX_FMT_RGB24;
      rgb_frame->width = frame.width;
      rgb_frame->height = frame.height;
      av_check(av_frame_get_buffer(rgb_frame.get(), 0), name, "allocating an RGB frame");
    }
    const int rows = sws_scale(sws, frame.data, frame.linesize, 0, frame.height, rgb_frame->data,
                               rgb_frame->linesize);
    XF_CHECK(rows == frame.height, name, ": sws_scale (-> RGB24) of frame ", frames.size(),
             " returned ", rows);
    at::Tensor rgb = at::empty({frame.height, frame.width, 3},
                               at::TensorOptions().dtype(at::kByte).device(at::kCPU));
    av_image_copy_plane(rgb.data_ptr<uint8_t>(), frame.width * 3, rgb_frame->data[0],
                        rgb_frame->linesize[0], frame.width * 3, frame.height);
    frames.push_back(std::move(rgb));
  });
  XF_CHECK(!frames.empty(), "video ", name, " has no frames");
  return at::stack(frames);
}

bool video_supported() { return true; }

}  // namespace xfuser::runner

#else  // built without FFmpeg (XFUSER_WITH_FFMPEG=OFF)

namespace xfuser::runner {
namespace {
[[noreturn]] void no_ffmpeg(const std::filesystem::path& path) {
  XF_THROW(path.string(), ": this xfuser was built without FFmpeg (XFUSER_WITH_FFMPEG=OFF), ",
           "which MP4 video needs; rebuild with FFmpeg's development libraries (libavcodec, ",
           "libavformat, libavutil, libswscale) installed");
}
}  // namespace

void write_mp4(const std::filesystem::path& path, const at::Tensor&, double,
               const std::map<std::string, std::string>&) {
  no_ffmpeg(path);
}
VideoInfo read_video_info(const std::filesystem::path& path) { no_ffmpeg(path); }
at::Tensor read_video_frames(const std::filesystem::path& path) { no_ffmpeg(path); }
bool video_supported() { return false; }

}  // namespace xfuser::runner

#endif
