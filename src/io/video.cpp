#include "loratrain/io/video.h"

extern "C" {
#include <libavcodec/avcodec.h>
#include <libavformat/avformat.h>
#include <libavutil/cpu.h>
#include <libavutil/display.h>
#include <libavutil/error.h>
#include <libavutil/imgutils.h>
#include <libavutil/log.h>
#include <libavutil/opt.h>
#include <libswscale/swscale.h>
}
#include <torch/torch.h>
#include <webp/demux.h>
#include <webp/encode.h>
#include <webp/mux.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>

#include "loratrain/util/atomic_file.h"
#include "loratrain/util/error.h"
#include "loratrain/util/strings.h"

namespace lt::io {

namespace fs = std::filesystem;

namespace {

[[noreturn]] void clip_error(const std::string& name, const std::string& why) {
  throw InputError(name + ": " + why);
}

std::string av_error(int code) {
  char buf[AV_ERROR_MAX_STRING_SIZE] = {0};
  av_strerror(code, buf, sizeof(buf));
  return buf;
}

// FFmpeg logs every damaged packet to stderr; the dataset reports a bad clip in one warning of its
// own, so the library stays quiet.
void quiet_ffmpeg() {
  static std::once_flag once;
  std::call_once(once, [] { av_log_set_level(AV_LOG_FATAL); });
}

struct FormatCloser {
  void operator()(AVFormatContext* c) const { avformat_close_input(&c); }
};
struct CodecFreer {
  void operator()(AVCodecContext* c) const { avcodec_free_context(&c); }
};
struct FrameFreer {
  void operator()(AVFrame* f) const { av_frame_free(&f); }
};
struct PacketFreer {
  void operator()(AVPacket* p) const { av_packet_free(&p); }
};
struct SwsFreer {
  void operator()(SwsContext* s) const { sws_freeContext(s); }
};
using FormatPtr = std::unique_ptr<AVFormatContext, FormatCloser>;
using CodecPtr = std::unique_ptr<AVCodecContext, CodecFreer>;
using FramePtr = std::unique_ptr<AVFrame, FrameFreer>;
using PacketPtr = std::unique_ptr<AVPacket, PacketFreer>;
using SwsPtr = std::unique_ptr<SwsContext, SwsFreer>;

bool has_webp_extension(const fs::path& path) { return to_lower(path.extension().string()) == ".webp"; }

// ---- FFmpeg decoding ----------------------------------------------------------------------------

// The stream's display matrix (phones store portrait clips as landscape frames plus a rotation).
// FFmpeg 6.1 moved stream side data into codecpar; 7 (libavformat 61) removed the old call.
const int32_t* display_matrix(const AVStream* stream) {
#if LIBAVFORMAT_VERSION_MAJOR >= 61
  const AVPacketSideData* sd = av_packet_side_data_get(stream->codecpar->coded_side_data,
                                                       stream->codecpar->nb_coded_side_data, AV_PKT_DATA_DISPLAYMATRIX);
  return sd && sd->size >= 9 * sizeof(int32_t) ? reinterpret_cast<const int32_t*>(sd->data) : nullptr;
#else
  size_t size = 0;
  const uint8_t* data = av_stream_get_side_data(stream, AV_PKT_DATA_DISPLAYMATRIX, &size);
  return data && size >= 9 * sizeof(int32_t) ? reinterpret_cast<const int32_t*>(data) : nullptr;
#endif
}

// Clockwise degrees (0, 90, 180, 270) a player turns the frames by, as FFmpeg's autorotate and
// OpenCV's CAP_PROP_ORIENTATION_AUTO (which AI Toolkit's cv2 reader has on) do.
int display_rotation(const AVStream* stream) {
  const int32_t* matrix = display_matrix(stream);
  if (!matrix) return 0;
  const double ccw = av_display_rotation_get(matrix);  // counter-clockwise, (-180, 180]
  if (std::isnan(ccw)) return 0;
  int cw = static_cast<int>(std::lround(-ccw / 90.0)) * 90;
  cw = ((cw % 360) + 360) % 360;
  return cw;
}

Image rotate_clockwise(const Image& in, int degrees) {
  if (degrees == 0) return in;
  const bool quarter = degrees == 90 || degrees == 270;
  Image out(quarter ? in.height : in.width, quarter ? in.width : in.height);
  for (int y = 0; y < in.height; ++y)
    for (int x = 0; x < in.width; ++x) {
      int ox = x, oy = y;
      if (degrees == 90) {
        ox = in.height - 1 - y;
        oy = x;
      } else if (degrees == 180) {
        ox = in.width - 1 - x;
        oy = in.height - 1 - y;
      } else if (degrees == 270) {
        ox = y;
        oy = in.width - 1 - x;
      }
      std::memcpy(out.at(ox, oy), in.at(x, y), 3);
    }
  return out;
}

// One clip opened for sequential decoding of its best video stream.
class FfmpegClip {
 public:
  explicit FfmpegClip(const fs::path& path) : name_(path.string()) {
    quiet_ffmpeg();
    std::error_code ec;
    const auto size = fs::file_size(path, ec);
    if (ec) clip_error(name_, "cannot read: " + ec.message());
    if (size == 0) clip_error(name_, "empty file (0 bytes)");
    AVFormatContext* raw = nullptr;
    int rc = avformat_open_input(&raw, path.c_str(), nullptr, nullptr);
    if (rc < 0) clip_error(name_, "not a readable video (" + av_error(rc) + ")");
    format_.reset(raw);
    rc = avformat_find_stream_info(format_.get(), nullptr);
    if (rc < 0) clip_error(name_, "corrupt video: no stream information (" + av_error(rc) + ")");
    rc = av_find_best_stream(format_.get(), AVMEDIA_TYPE_VIDEO, -1, -1, nullptr, 0);
    if (rc < 0) clip_error(name_, "holds no video stream");
    stream_ = format_->streams[rc];
    const AVCodec* codec = avcodec_find_decoder(stream_->codecpar->codec_id);
    if (!codec) clip_error(name_, std::string("no decoder for codec '") + avcodec_get_name(stream_->codecpar->codec_id) + "'");
    codec_.reset(avcodec_alloc_context3(codec));
    if (!codec_) clip_error(name_, "out of memory opening the decoder");
    avcodec_parameters_to_context(codec_.get(), stream_->codecpar);
    // A damaged packet is an error, not a silently concealed frame: the clip is then skipped.
    codec_->err_recognition |= AV_EF_EXPLODE | AV_EF_CRCCHECK;
    codec_->thread_count = 1;  // clips are small; the dataset decodes several at once
    rc = avcodec_open2(codec_.get(), codec, nullptr);
    if (rc < 0) clip_error(name_, "cannot open the " + std::string(codec->name) + " decoder (" + av_error(rc) + ")");
    if (stream_->codecpar->width <= 0 || stream_->codecpar->height <= 0) clip_error(name_, "video stream has no frame size");
    rotation_ = display_rotation(stream_);
  }

  const std::string& name() const { return name_; }
  std::string codec_name() const { return avcodec_get_name(stream_->codecpar->codec_id); }
  // The size frames are shown at (after the display rotation); coded_* as stored.
  int width() const { return rotation_ % 180 ? coded_height() : coded_width(); }
  int height() const { return rotation_ % 180 ? coded_width() : coded_height(); }
  int coded_width() const { return stream_->codecpar->width; }
  int coded_height() const { return stream_->codecpar->height; }
  // FFmpeg's best guess from the container's base and average rates (millisecond timestamps, as
  // in Matroska, make the average alone drift: 12 fps reads as 12.08).
  double fps() const {
    const AVRational r = av_guess_frame_rate(format_.get(), stream_, nullptr);
    return (r.num > 0 && r.den > 0) ? av_q2d(r) : 0.0;
  }

  // The frame count the container declares (mp4's sample table), or its duration times the frame
  // rate; 0 when it says neither. Matroska/WebM demuxers end a cut or garbled file with a plain
  // end-of-file, so a clip far shorter than this is taken as truncated.
  int declared_frames() const {
    if (stream_->nb_frames > 0) return static_cast<int>(stream_->nb_frames);
    double seconds = 0.0;
    if (stream_->duration != AV_NOPTS_VALUE && stream_->duration > 0)
      seconds = stream_->duration * av_q2d(stream_->time_base);
    else if (format_->duration != AV_NOPTS_VALUE && format_->duration > 0)
      seconds = format_->duration / static_cast<double>(AV_TIME_BASE);
    return static_cast<int>(std::floor(seconds * fps()));
  }
  void check_complete(int frames) const {
    const int declared = declared_frames();
    // Generous: audio tracks and timestamp rounding make durations a little longer than the video.
    if (declared > 0 && frames < 0.75 * declared - 1)
      clip_error(name_, "truncated or damaged video: " + std::to_string(frames) + " of the " + std::to_string(declared) +
                      " frames its header declares are readable");
  }

  // Packets of the video stream, without decoding (one packet is one frame).
  int count_packets() {
    PacketPtr pkt(av_packet_alloc());
    int count = 0;
    for (;;) {
      const int rc = av_read_frame(format_.get(), pkt.get());
      if (rc == AVERROR_EOF) break;
      if (rc < 0) clip_error(name_, "corrupt or truncated video (" + av_error(rc) + ")");
      if (pkt->stream_index == stream_->index) {
        if (pkt->flags & AV_PKT_FLAG_CORRUPT) clip_error(name_, "truncated or corrupt video (damaged packet)");
        ++count;
      }
      av_packet_unref(pkt.get());
    }
    return count;
  }

  // Decodes frames in order, calling `on_frame(index, frame)`; it returns false to stop early.
  // Throws lt::InputError on a read or decode error.
  void decode(const std::function<bool(int, const AVFrame*)>& on_frame) {
    PacketPtr pkt(av_packet_alloc());
    FramePtr frame(av_frame_alloc());
    int index = 0;
    bool stop = false;
    auto drain = [&]() {
      for (;;) {
        const int rc = avcodec_receive_frame(codec_.get(), frame.get());
        if (rc == AVERROR(EAGAIN) || rc == AVERROR_EOF) return;
        if (rc < 0) clip_error(name_, "undecodable video frame " + std::to_string(index) + " (" + av_error(rc) + ")");
        if ((frame->flags & AV_FRAME_FLAG_CORRUPT) || frame->decode_error_flags)
          clip_error(name_, "corrupt video frame " + std::to_string(index));
        const bool more = on_frame(index++, frame.get());
        av_frame_unref(frame.get());
        if (!more) {
          stop = true;
          return;
        }
      }
    };
    while (!stop) {
      const int rc = av_read_frame(format_.get(), pkt.get());
      if (rc == AVERROR_EOF) break;
      if (rc < 0) clip_error(name_, "corrupt or truncated video (" + av_error(rc) + ")");
      if (pkt->stream_index == stream_->index) {
        if (pkt->flags & AV_PKT_FLAG_CORRUPT) clip_error(name_, "truncated or corrupt video (damaged packet)");
        const int sent = avcodec_send_packet(codec_.get(), pkt.get());
        av_packet_unref(pkt.get());
        if (sent < 0 && sent != AVERROR(EAGAIN))
          clip_error(name_, "undecodable video data at frame " + std::to_string(index) + " (" + av_error(sent) + ")");
        drain();
      } else {
        av_packet_unref(pkt.get());
      }
    }
    if (stop) return;
    avcodec_send_packet(codec_.get(), nullptr);  // flush the frames the decoder holds back
    drain();
  }

  // RGB24 copy of a decoded frame, with the frame's colour matrix and range.
  Image to_rgb(const AVFrame* f) {
    const auto fmt = static_cast<AVPixelFormat>(f->format);
    sws_.reset(sws_getCachedContext(sws_.release(), f->width, f->height, fmt, f->width, f->height,
                                    AV_PIX_FMT_RGB24, SWS_BICUBIC | SWS_ACCURATE_RND | SWS_FULL_CHR_H_INT,
                                    nullptr, nullptr, nullptr));
    if (!sws_) clip_error(name_, std::string("cannot convert pixel format ") + (av_get_pix_fmt_name(fmt) ? av_get_pix_fmt_name(fmt) : "?"));
    int matrix = SWS_CS_ITU601;
    if (f->colorspace == AVCOL_SPC_BT709) matrix = SWS_CS_ITU709;
    if (f->colorspace == AVCOL_SPC_BT2020_NCL || f->colorspace == AVCOL_SPC_BT2020_CL) matrix = SWS_CS_BT2020;
    const int full_range = f->color_range == AVCOL_RANGE_JPEG ? 1 : 0;
    int* inv_table = nullptr;
    int* table = nullptr;
    int src_range = 0, dst_range = 0, brightness = 0, contrast = 0, saturation = 0;
    if (sws_getColorspaceDetails(sws_.get(), &inv_table, &src_range, &table, &dst_range, &brightness, &contrast,
                                 &saturation) >= 0) {
      // Only YUV sources: for RGB/palette input libswscale ignores the matrix but reports -1.
      sws_setColorspaceDetails(sws_.get(), sws_getCoefficients(matrix), full_range || src_range, table, 1, brightness,
                               contrast, saturation);
    }
    // libswscale's SIMD paths write past the end of a row, so it converts into an aligned, padded
    // buffer and the rows are copied out.
    uint8_t* dst[4] = {nullptr, nullptr, nullptr, nullptr};
    int dst_stride[4] = {0, 0, 0, 0};
    if (av_image_alloc(dst, dst_stride, f->width, f->height + 1, AV_PIX_FMT_RGB24, 64) < 0)
      clip_error(name_, "out of memory converting a frame");
    std::unique_ptr<uint8_t, void (*)(void*)> buffer(dst[0], av_free);
    sws_scale(sws_.get(), f->data, f->linesize, 0, f->height, dst, dst_stride);
    Image out(f->width, f->height);
    for (int y = 0; y < f->height; ++y)
      std::memcpy(out.at(0, y), dst[0] + static_cast<size_t>(y) * dst_stride[0], static_cast<size_t>(f->width) * 3);
    return rotate_clockwise(out, rotation_);
  }

 private:
  std::string name_;
  FormatPtr format_;
  AVStream* stream_ = nullptr;
  CodecPtr codec_;
  SwsPtr sws_;
  int rotation_ = 0;  // clockwise degrees
};

// ---- animated WebP (libwebp demux) --------------------------------------------------------------

struct AnimDecoderDeleter {
  void operator()(WebPAnimDecoder* d) const { WebPAnimDecoderDelete(d); }
};
using AnimDecoderPtr = std::unique_ptr<WebPAnimDecoder, AnimDecoderDeleter>;

AnimDecoderPtr open_webp_anim(const std::string& bytes, const std::string& name, WebPAnimInfo* info) {
  if (bytes.empty()) clip_error(name, "empty file (0 bytes)");
  WebPData data = {reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()};
  WebPAnimDecoderOptions options;
  if (!WebPAnimDecoderOptionsInit(&options)) clip_error(name, "libwebp version mismatch");
  options.color_mode = MODE_RGBA;
  options.use_threads = 0;
  AnimDecoderPtr dec(WebPAnimDecoderNew(&data, &options));
  if (!dec) clip_error(name, "truncated or corrupt animated WebP");
  if (!WebPAnimDecoderGetInfo(dec.get(), info)) clip_error(name, "corrupt animated WebP");
  if (info->frame_count == 0 || info->canvas_width == 0 || info->canvas_height == 0)
    clip_error(name, "animated WebP without frames");
  return dec;
}

// Decodes every frame (composited on the canvas, alpha dropped as for images), calling
// on_frame(index, rgba, timestamp_ms_end); false stops.
void decode_webp_anim(const std::string& bytes, const std::string& name,
                      const std::function<bool(int, const uint8_t*, int)>& on_frame, WebPAnimInfo* info_out) {
  WebPAnimInfo info;
  AnimDecoderPtr dec = open_webp_anim(bytes, name, &info);
  if (info_out) *info_out = info;
  int index = 0;
  while (WebPAnimDecoderHasMoreFrames(dec.get())) {
    uint8_t* rgba = nullptr;
    int timestamp = 0;
    if (!WebPAnimDecoderGetNext(dec.get(), &rgba, &timestamp))
      clip_error(name, "undecodable animated WebP frame " + std::to_string(index));
    if (!on_frame(index++, rgba, timestamp)) return;
  }
}

Image rgba_to_image(const uint8_t* rgba, int width, int height) {
  Image out(width, height);
  const size_t n = static_cast<size_t>(width) * height;
  for (size_t i = 0; i < n; ++i) {
    out.pixels[i * 3 + 0] = rgba[i * 4 + 0];
    out.pixels[i * 3 + 1] = rgba[i * 4 + 1];
    out.pixels[i * 3 + 2] = rgba[i * 4 + 2];
  }
  return out;
}

std::string read_all(const fs::path& path) { return read_file_bytes(path); }

bool is_webp_clip(const fs::path& path, std::string* bytes) {
  if (!has_webp_extension(path)) return false;
  *bytes = read_all(path);
  return true;
}

void check_frames(const std::vector<Image>& frames, const char* what) {
  if (frames.empty()) throw InputError(std::string(what) + ": no frames");
  for (const Image& f : frames)
    if (f.width != frames[0].width || f.height != frames[0].height || f.empty())
      throw InputError(std::string(what) + ": frames differ in size (" + std::to_string(f.width) + "x" +
                       std::to_string(f.height) + " vs " + std::to_string(frames[0].width) + "x" +
                       std::to_string(frames[0].height) + ")");
}

}  // namespace

bool is_animated_webp(const std::string& bytes) {
  WebPBitstreamFeatures features;
  if (WebPGetFeatures(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), &features) != VP8_STATUS_OK)
    return false;
  return features.has_animation != 0;
}

VideoInfo probe_video(const fs::path& path, bool decode_all) {
  std::string bytes;
  if (is_webp_clip(path, &bytes)) {
    VideoInfo info;
    WebPAnimInfo anim;
    int frames = 0;
    int last_ms = 0;
    if (decode_all) {
      decode_webp_anim(bytes, path.string(), [&](int, const uint8_t*, int ts) {
        ++frames;
        last_ms = ts;
        return true;
      }, &anim);
    } else {
      open_webp_anim(bytes, path.string(), &anim);
      frames = static_cast<int>(anim.frame_count);
    }
    info.width = static_cast<int>(anim.canvas_width);
    info.height = static_cast<int>(anim.canvas_height);
    info.frame_count = frames;
    info.fps = (decode_all && last_ms > 0) ? frames * 1000.0 / last_ms : 0.0;
    info.codec = "webp";
    return info;
  }
  FfmpegClip clip(path);
  VideoInfo info;
  info.width = clip.width();
  info.height = clip.height();
  info.fps = clip.fps();
  info.codec = clip.codec_name();
  if (decode_all) {
    clip.decode([&](int index, const AVFrame* f) {
      if (f->width != clip.coded_width() || f->height != clip.coded_height())
        clip_error(path.string(), "frame " + std::to_string(index) + " changes size (" + std::to_string(f->width) + "x" +
                                std::to_string(f->height) + ")");
      ++info.frame_count;
      return true;
    });
  } else {
    info.frame_count = clip.count_packets();
  }
  if (info.frame_count == 0) clip_error(path.string(), "video without frames");
  clip.check_complete(info.frame_count);
  return info;
}

std::vector<Image> read_video_frames(const fs::path& path, const std::vector<int>& indices) {
  if (indices.empty()) return {};
  for (int i : indices)
    if (i < 0) throw Error(ExitCode::kRuntime, "read_video_frames: negative frame index " + std::to_string(i));
  const int last_wanted = *std::max_element(indices.begin(), indices.end());
  auto wanted = [&](int index) { return std::find(indices.begin(), indices.end(), index) != indices.end(); };
  std::map<int, Image> decoded;  // wanted index -> frame
  Image tail;                    // the stream's last frame, for indices past its real end
  int tail_index = -1;
  std::string bytes;
  if (is_webp_clip(path, &bytes)) {
    WebPAnimInfo info{};
    decode_webp_anim(bytes, path.string(), [&](int index, const uint8_t* rgba, int) {
      // Frames are composited onto the canvas, so every one up to the last wanted is decoded.
      Image frame = rgba_to_image(rgba, static_cast<int>(info.canvas_width), static_cast<int>(info.canvas_height));
      if (wanted(index)) decoded[index] = frame;
      tail = std::move(frame);
      tail_index = index;
      return index < last_wanted;
    }, &info);
  } else {
    FfmpegClip clip(path);
    FramePtr last(av_frame_alloc());
    clip.decode([&](int index, const AVFrame* f) {
      if (wanted(index)) decoded[index] = clip.to_rgb(f);
      av_frame_unref(last.get());
      av_frame_ref(last.get(), f);  // a reference, converted only if the stream ends early
      tail_index = index;
      return index < last_wanted;
    });
    if (tail_index >= 0 && tail_index < last_wanted) tail = clip.to_rgb(last.get());
  }
  if (tail_index < 0) clip_error(path.string(), "video without frames");
  std::vector<Image> out;
  out.reserve(indices.size());
  for (int i : indices) {
    auto it = decoded.find(i);
    out.push_back(it != decoded.end() ? it->second : tail);
  }
  return out;
}

std::vector<Image> read_video(const fs::path& path) {
  const VideoInfo info = probe_video(path, true);
  std::vector<int> all(info.frame_count);
  for (int i = 0; i < info.frame_count; ++i) all[i] = i;
  return read_video_frames(path, all);
}

// ---- animated WebP writing ----------------------------------------------------------------------

std::string encode_animated_webp(const std::vector<Image>& frames, double fps, int quality) {
  check_frames(frames, "animated WebP");
  if (!(fps > 0)) throw InputError("animated WebP: fps must be positive");
  if (quality < 0 || quality > 101) throw InputError("animated WebP: quality must be 0-100, or 101 for lossless");
  const int width = frames[0].width, height = frames[0].height;
  WebPAnimEncoderOptions options;
  if (!WebPAnimEncoderOptionsInit(&options)) throw Error(ExitCode::kRuntime, "libwebp version mismatch");
  options.anim_params.loop_count = 0;  // loop forever
  struct EncDeleter {
    void operator()(WebPAnimEncoder* e) const { WebPAnimEncoderDelete(e); }
  };
  std::unique_ptr<WebPAnimEncoder, EncDeleter> enc(WebPAnimEncoderNew(width, height, &options));
  if (!enc) throw Error(ExitCode::kRuntime, "animated WebP: cannot create the encoder");
  WebPConfig config;
  if (!WebPConfigInit(&config)) throw Error(ExitCode::kRuntime, "libwebp version mismatch");
  config.lossless = quality > 100 ? 1 : 0;
  config.quality = quality > 100 ? 75.0f : static_cast<float>(quality);
  const int duration_ms = std::max(1, static_cast<int>(std::lround(1000.0 / fps)));
  int timestamp = 0;
  for (const Image& frame : frames) {
    WebPPicture picture;
    if (!WebPPictureInit(&picture)) throw Error(ExitCode::kRuntime, "libwebp version mismatch");
    picture.width = width;
    picture.height = height;
    picture.use_argb = 1;
    if (!WebPPictureImportRGB(&picture, frame.pixels.data(), width * 3)) {
      WebPPictureFree(&picture);
      throw Error(ExitCode::kRuntime, "animated WebP: out of memory");
    }
    const int ok = WebPAnimEncoderAdd(enc.get(), &picture, timestamp, &config);
    WebPPictureFree(&picture);
    if (!ok) throw Error(ExitCode::kRuntime, std::string("animated WebP: ") + WebPAnimEncoderGetError(enc.get()));
    timestamp += duration_ms;
  }
  if (!WebPAnimEncoderAdd(enc.get(), nullptr, timestamp, nullptr))
    throw Error(ExitCode::kRuntime, std::string("animated WebP: ") + WebPAnimEncoderGetError(enc.get()));
  WebPData data;
  WebPDataInit(&data);
  if (!WebPAnimEncoderAssemble(enc.get(), &data))
    throw Error(ExitCode::kRuntime, std::string("animated WebP: ") + WebPAnimEncoderGetError(enc.get()));
  std::string out(reinterpret_cast<const char*>(data.bytes), data.size);
  WebPDataClear(&data);
  return out;
}

void write_animated_webp(const fs::path& path, const std::vector<Image>& frames, double fps, int quality) {
  write_file_atomic(path, encode_animated_webp(frames, fps, quality));
}

// ---- video writing (FFmpeg encoders) ------------------------------------------------------------

namespace {

// Encoders per container, preferred first (Debian's libavcodec has all of them; others may not).
std::vector<std::string> encoder_candidates(const std::string& ext) {
  if (ext == ".webm") return {"libvpx-vp9", "libvpx"};
  if (ext == ".mp4" || ext == ".mov" || ext == ".m4v") return {"libx264", "mpeg4"};
  if (ext == ".mkv") return {"libx264", "libvpx-vp9", "mpeg4"};
  if (ext == ".avi") return {"mpeg4", "mjpeg"};
  if (ext == ".gif") return {"gif"};
  return {};
}

// An in-memory, seekable output for the muxer (mp4 writes its index at the end and seeks back),
// so the file itself is written atomically in one go.
// FFmpeg 7 (libavformat 61) made the write callback's buffer const.
#if LIBAVFORMAT_VERSION_MAJOR >= 61
using AvioWriteBuffer = const uint8_t*;
#else
using AvioWriteBuffer = uint8_t*;
#endif

struct MemoryOutput {
  std::string data;
  int64_t pos = 0;
  static int write(void* opaque, AvioWriteBuffer buf, int size) {
    auto* m = static_cast<MemoryOutput*>(opaque);
    if (m->pos + size > static_cast<int64_t>(m->data.size())) m->data.resize(m->pos + size);
    std::memcpy(&m->data[m->pos], buf, size);
    m->pos += size;
    return size;
  }
  static int64_t seek(void* opaque, int64_t offset, int whence) {
    auto* m = static_cast<MemoryOutput*>(opaque);
    whence &= ~AVSEEK_FORCE;
    if (whence == AVSEEK_SIZE) return static_cast<int64_t>(m->data.size());
    int64_t base = whence == SEEK_CUR ? m->pos : whence == SEEK_END ? static_cast<int64_t>(m->data.size()) : 0;
    if (base + offset < 0) return AVERROR(EINVAL);
    m->pos = base + offset;
    return m->pos;
  }
};

}  // namespace

std::string video_encoder_for(const std::string& extension) {
  for (const std::string& name : encoder_candidates(to_lower(extension)))
    if (avcodec_find_encoder_by_name(name.c_str())) return name;
  return "";
}

void write_video(const fs::path& path, const std::vector<Image>& frames, int fps, int display_rotation) {
  quiet_ffmpeg();
  const std::string name = path.string();
  check_frames(frames, name.c_str());
  if (fps <= 0) throw InputError(name + ": fps must be positive");
  const std::string ext = to_lower(path.extension().string());
  const std::string encoder_name = video_encoder_for(ext);
  if (encoder_name.empty())
    throw InputError(name + ": no FFmpeg encoder for '" + ext + "' files in this libavcodec");
  const AVCodec* codec = avcodec_find_encoder_by_name(encoder_name.c_str());
  const int width = frames[0].width, height = frames[0].height;

  AVFormatContext* raw = nullptr;
  const std::string format_name = ext == ".mkv" ? "matroska" : ext == ".m4v" ? "mp4" : ext.substr(1);
  if (avformat_alloc_output_context2(&raw, nullptr, format_name.c_str(), nullptr) < 0 || !raw)
    throw InputError(name + ": no FFmpeg muxer for '" + ext + "'");
  struct OutputCloser {
    void operator()(AVFormatContext* c) const {
      if (c->pb) {
        av_freep(&c->pb->buffer);
        avio_context_free(&c->pb);
      }
      avformat_free_context(c);
    }
  };
  std::unique_ptr<AVFormatContext, OutputCloser> out(raw);
  MemoryOutput memory;
  constexpr int kBufferSize = 1 << 16;
  auto* buffer = static_cast<uint8_t*>(av_malloc(kBufferSize));
  out->pb = avio_alloc_context(buffer, kBufferSize, 1, &memory, nullptr, &MemoryOutput::write, &MemoryOutput::seek);
  if (!out->pb) throw Error(ExitCode::kRuntime, name + ": out of memory");
  out->flags |= AVFMT_FLAG_BITEXACT;  // no library version strings: the same frames give the same bytes

  AVStream* stream = avformat_new_stream(out.get(), nullptr);
  CodecPtr enc(avcodec_alloc_context3(codec));
  enc->width = width;
  enc->height = height;
  enc->time_base = AVRational{1, fps};
  enc->framerate = AVRational{fps, 1};
  enc->gop_size = 12;
  enc->thread_count = 1;  // deterministic output
  enc->flags |= AV_CODEC_FLAG_BITEXACT;
  const bool gif = encoder_name == "gif";
  enc->pix_fmt = gif ? AV_PIX_FMT_RGB8 : encoder_name == "mjpeg" ? AV_PIX_FMT_YUVJ420P : AV_PIX_FMT_YUV420P;
  if (!gif && (width % 2 || height % 2))
    throw InputError(name + ": " + encoder_name + " needs an even width and height, got " + std::to_string(width) +
                     "x" + std::to_string(height));
  if (encoder_name == "libx264") {
    av_opt_set(enc->priv_data, "preset", "veryfast", 0);
    av_opt_set(enc->priv_data, "crf", "18", 0);
    // x264's AVX-512 routines read memory it never wrote: the same frames then encode to different
    // bytes from one call to the next (measured: a second write of the same clip differed in most
    // runs). Its AVX2 level encodes them identically, here and on processors without AVX-512.
    if (av_get_cpu_flags() & AV_CPU_FLAG_AVX512) av_opt_set(enc->priv_data, "x264-params", "asm=AVX2", 0);
  } else if (encoder_name == "libvpx-vp9" || encoder_name == "libvpx") {
    av_opt_set(enc->priv_data, "deadline", "realtime", 0);
    av_opt_set(enc->priv_data, "cpu-used", "8", 0);
    av_opt_set(enc->priv_data, "crf", "10", 0);
    enc->bit_rate = 2000000;
  } else if (!gif) {
    enc->bit_rate = 4000000;
    enc->qmax = 4;
  }
  if (out->oformat->flags & AVFMT_GLOBALHEADER) enc->flags |= AV_CODEC_FLAG_GLOBAL_HEADER;
  int rc = avcodec_open2(enc.get(), codec, nullptr);
  if (rc < 0) throw Error(ExitCode::kRuntime, name + ": cannot open encoder " + encoder_name + " (" + av_error(rc) + ")");
  avcodec_parameters_from_context(stream->codecpar, enc.get());
  stream->time_base = enc->time_base;
  if (display_rotation % 360 != 0) {
    if (display_rotation % 90 != 0) throw InputError(name + ": display rotation must be a multiple of 90 degrees");
    int32_t matrix[9];
    // av_display_rotation_set takes the clockwise angle; av_display_rotation_get gives it back
    // counter-clockwise (display_rotation() above negates it, as FFmpeg's autorotate does).
    av_display_rotation_set(matrix, static_cast<double>(display_rotation));
#if LIBAVFORMAT_VERSION_MAJOR >= 61
    AVPacketSideData* sd = av_packet_side_data_new(&stream->codecpar->coded_side_data, &stream->codecpar->nb_coded_side_data,
                                                   AV_PKT_DATA_DISPLAYMATRIX, sizeof(matrix), 0);
    uint8_t* data = sd ? sd->data : nullptr;
#else
    uint8_t* data = av_stream_new_side_data(stream, AV_PKT_DATA_DISPLAYMATRIX, sizeof(matrix));
#endif
    if (!data) throw Error(ExitCode::kRuntime, name + ": out of memory");
    std::memcpy(data, matrix, sizeof(matrix));
  }
  rc = avformat_write_header(out.get(), nullptr);
  if (rc < 0) throw Error(ExitCode::kRuntime, name + ": cannot write the header (" + av_error(rc) + ")");

  PacketPtr pkt(av_packet_alloc());
  auto drain = [&]() {
    for (;;) {
      int r = avcodec_receive_packet(enc.get(), pkt.get());
      if (r == AVERROR(EAGAIN) || r == AVERROR_EOF) return;
      if (r < 0) throw Error(ExitCode::kRuntime, name + ": encoding failed (" + av_error(r) + ")");
      // Every frame lasts one tick. Without a duration the mp4 muxer ends its edit list at the last
      // frame's start, and readers then drop that frame.
      if (pkt->duration <= 0) pkt->duration = 1;
      av_packet_rescale_ts(pkt.get(), enc->time_base, stream->time_base);
      pkt->stream_index = stream->index;
      r = av_interleaved_write_frame(out.get(), pkt.get());
      if (r < 0) throw Error(ExitCode::kRuntime, name + ": writing failed (" + av_error(r) + ")");
    }
  };
  SwsPtr sws(sws_getContext(width, height, AV_PIX_FMT_RGB24, width, height, enc->pix_fmt,
                            SWS_BICUBIC | SWS_ACCURATE_RND | SWS_FULL_CHR_H_INT, nullptr, nullptr, nullptr));
  if (!sws) throw Error(ExitCode::kRuntime, name + ": cannot convert RGB for " + encoder_name);
  FramePtr frame(av_frame_alloc());
  frame->format = enc->pix_fmt;
  frame->width = width;
  frame->height = height;
  if (av_frame_get_buffer(frame.get(), 0) < 0) throw Error(ExitCode::kRuntime, name + ": out of memory");
  // The RGB input goes through an aligned, padded buffer too (libswscale reads past row ends).
  uint8_t* rgb[4] = {nullptr, nullptr, nullptr, nullptr};
  int rgb_stride[4] = {0, 0, 0, 0};
  if (av_image_alloc(rgb, rgb_stride, width, height + 1, AV_PIX_FMT_RGB24, 64) < 0)
    throw Error(ExitCode::kRuntime, name + ": out of memory");
  std::unique_ptr<uint8_t, void (*)(void*)> rgb_buffer(rgb[0], av_free);
  for (size_t i = 0; i < frames.size(); ++i) {
    av_frame_make_writable(frame.get());
    for (int y = 0; y < height; ++y)
      std::memcpy(rgb[0] + static_cast<size_t>(y) * rgb_stride[0], frames[i].at(0, y), static_cast<size_t>(width) * 3);
    sws_scale(sws.get(), rgb, rgb_stride, 0, height, frame->data, frame->linesize);
    frame->pts = static_cast<int64_t>(i);
    rc = avcodec_send_frame(enc.get(), frame.get());
    if (rc < 0) throw Error(ExitCode::kRuntime, name + ": encoding failed (" + av_error(rc) + ")");
    drain();
  }
  avcodec_send_frame(enc.get(), nullptr);
  drain();
  rc = av_write_trailer(out.get());
  if (rc < 0) throw Error(ExitCode::kRuntime, name + ": cannot finish the file (" + av_error(rc) + ")");
  avio_flush(out->pb);
  write_file_atomic(path, memory.data);
}

// ---- tensors ------------------------------------------------------------------------------------

std::vector<Image> video_tensor_to_frames(const at::Tensor& video) {
  at::Tensor t = video.detach();
  if (t.dim() == 5 && t.size(0) == 1) t = t.squeeze(0);
  if (t.dim() == 3) return {tensor_to_image(t)};
  if (t.dim() != 4 || t.size(0) != 3)
    throw Error(ExitCode::kRuntime, "video_tensor_to_frames: expected [3, F, H, W], got " + std::string(c10::str(t.sizes())));
  std::vector<Image> out;
  out.reserve(t.size(1));
  for (int64_t f = 0; f < t.size(1); ++f) out.push_back(tensor_to_image(t.select(1, f)));
  return out;
}

at::Tensor frames_to_video_tensor(const std::vector<Image>& frames) {
  check_frames(frames, "frames_to_video_tensor");
  std::vector<at::Tensor> planes;
  planes.reserve(frames.size());
  for (const Image& f : frames) planes.push_back(image_to_tensor(f));
  return torch::stack(planes, 1);  // [3, F, H, W]
}

}  // namespace lt::io
