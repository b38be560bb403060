// Video clips: decoding through FFmpeg's libraries (libavformat demuxes mp4/webm/mov/mkv/avi/gif,
// libavcodec decodes, libswscale converts to RGB), animated WebP through libwebp (FFmpeg 5's WebP
// decoder reads still images only), and writing: animated WebP previews (libwebp's
// WebPAnimEncoder) and real video files through whichever FFmpeg encoder the system has (the demo
// data and the tests). Frames are io::Image (8-bit RGB, HWC), as cv2 hands AI Toolkit its frames
// after BGR->RGB.
#pragma once
#include <ATen/core/Tensor.h>

#include <filesystem>
#include <string>
#include <vector>

#include "loratrain/io/image.h"

namespace lt::io {

struct VideoInfo {
  int width = 0;  // as shown: a display rotation of 90 or 270 degrees swaps the stored size
  int height = 0;
  int frame_count = 0;  // frames the stream decodes to
  double fps = 0.0;     // average frame rate (0 when the file does not say)
  std::string codec;    // "h264", "vp9", "gif", "webp", ...
};

// True when `bytes` are a WebP file with an animation (ANIM) chunk.
bool is_animated_webp(const std::string& bytes);

// Opens the clip and reads its size, frame rate and frame count. `decode_all`: every frame is
// decoded, so the count is exact and a corrupt stream is found now; otherwise packets are only
// counted (one packet is one frame for every codec the dataset reads). Throws lt::InputError
// "<path>: ..." for a missing, empty, corrupt, truncated or undecodable clip, or one without
// frames.
VideoInfo probe_video(const std::filesystem::path& path, bool decode_all = true);

// Decodes the frames at the given 0-based indices in one sequential pass and returns them in the
// order asked (indices may repeat, as when a short clip is stretched). An index past the last
// frame the stream really holds gets that last frame (container frame counts can overshoot;
// AI Toolkit does the same). lt::InputError naming the file when it cannot be decoded.
std::vector<Image> read_video_frames(const std::filesystem::path& path, const std::vector<int>& indices);
// Every frame.
std::vector<Image> read_video(const std::filesystem::path& path);

// Animated WebP of same-sized frames at `fps` (each frame shown round(1000 / fps) ms), looping.
// quality 0-100 is lossy (libwebp's default 75 is visibly soft on previews, so 90); 101 = lossless.
std::string encode_animated_webp(const std::vector<Image>& frames, double fps, int quality = 90);
// Written atomically (temp file + rename): a failed write leaves no partial file.
void write_animated_webp(const std::filesystem::path& path, const std::vector<Image>& frames,
                         double fps, int quality = 90);

// Video file through FFmpeg, the container from the extension (.webm, .mp4, .mkv, .avi, .mov,
// .gif) and the first encoder of that container's list the system's libavcodec has (e.g. .webm:
// libvpx-vp9, libvpx; .mp4: libx264, mpeg4). Same-sized frames, even width and height for the
// YUV 4:2:0 codecs. Written atomically. lt::InputError when no encoder is available for it.
// `display_rotation` (clockwise degrees, a multiple of 90; mp4/mov) is stored as a display matrix,
// as phones store portrait clips; readers here (and FFmpeg, OpenCV) show the frames turned by it.
void write_video(const std::filesystem::path& path, const std::vector<Image>& frames, int fps,
                 int display_rotation = 0);
// The encoder write_video would use for a file with this extension; "" when none is available.
std::string video_encoder_for(const std::string& extension);

// [3, F, H, W] (or [1, 3, F, H, W]) tensor in [-1, 1], any float dtype or device -> F frames
// (clamped and rounded like tensor_to_image). A [3, H, W] image tensor gives one frame.
std::vector<Image> video_tensor_to_frames(const at::Tensor& video);
// F frames -> [3, F, H, W] float32 in [-1, 1].
at::Tensor frames_to_video_tensor(const std::vector<Image>& frames);

}  // namespace lt::io
