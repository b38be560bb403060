// The embedded demo's dataset: procedurally drawn coloured shapes (circle, square, triangle) on
// plain backgrounds, one PNG and one caption sidecar each ("a red circle on a blue background").
// Deterministic for given options; every fourth image is 2:1 landscape or portrait so the demo
// exercises more than one bucket.
//
// The demo's concept: shapes in a colour the demo base never sees in pretraining (cyan, see
// kDemoConceptColour), captioned with the trigger word in the colour's place ("a ltdemo circle on a
// red background"); the demo's LoRA learns it from a dataset that mixes them with ordinary shapes.
#pragma once
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "loratrain/io/image.h"

namespace lt::data {

struct DemoDataOptions {
  int count = 24;
  int size = 64;  // base size; square images are size..1.5*size, the others size x 2*size
  uint64_t seed = 1234;
  // Every concept_every-th image (0: none) is a concept image, captioned with concept_word; half
  // the others then name no shape colour ("a circle on a red background").
  int concept_every = 0;
  std::string concept_word = "ltdemo";
};

// The held-out concept colour (RGB) and its name.
struct DemoColour {
  const char* name;
  uint8_t r, g, b;
};
extern const DemoColour kDemoConceptColour;

// Whether a pixel reads as the concept colour (cyan: green and blue high, red low); what the demo's
// test counts in generated images.
bool is_concept_pixel(const uint8_t* rgb);

struct ShapeImage {
  io::Image image;
  std::string caption;  // "a red circle on a blue background"; a quarter name no shape colour
  bool other_word = false;  // another word in the colour's place (OtherColourWords)
};

// How the shapes of make_shape_images are coloured: the caption palette (never the concept colour),
// or uniformly random RGB (for an autoencoder that must reproduce any colour).
enum class ShapeColours { palette, random };

// Palette captions that now and then put another word in the colour's place: a `share` of the
// captions that name the shape's colour name one of `words` instead, and the shape is painted in a
// random colour away from the palette's and the concept colour's (is_unseen_colour). Meant to teach a
// diffusion model to read the colour's place for any word and to draw colours outside the palette,
// so that a LoRA need only steer a word it already reads into a colour it can already draw
// (docs/benchmarks.md, "Teaching the base to read any word in the colour's place", says how far
// that went).
struct OtherColourWords {
  std::vector<std::string> words;  // none: palette colours only
  double share = 0.0;
};

// `count` square images of `size` pixels with captions, in memory: the demo base's pretraining data.
std::vector<ShapeImage> make_shape_images(int count, int size, uint64_t seed, ShapeColours colours,
                                          const OtherColourWords& others = {});

// Whether an RGB colour is far from every palette colour and from the concept colour, and a shape in
// it drawn on palette colour `background` leaves no concept-coloured edge (the blend of the two stays
// outside a margin around is_concept_pixel's region).
bool is_unseen_colour(const uint8_t* rgb, const DemoColour& background);

struct DemoItem {
  std::string stem;  // "shape_0000"
  int width = 0;
  int height = 0;
  std::string caption;
};

// Writes <stem>.png and <stem>.txt for every item into `out_dir` (created; files written
// atomically) and returns what was written. Throws lt::InputError for out-of-range options.
std::vector<DemoItem> make_demo_dataset(const std::filesystem::path& out_dir,
                                        const DemoDataOptions& options);

// The video demo: a shape gliding across a plain background ("a red circle moving left to right
// on a blue background"), real video files encoded through FFmpeg, in turn .webm (VP9), .mp4
// (H.264, or MPEG-4 part 2 where libx264 is missing) and animated .webp (libwebp), each with a
// caption sidecar. Frame counts are 4k+1 between min_frames and max_frames; every fourth clip is
// 2:1 landscape. Deterministic for given options and library versions.
struct DemoVideoOptions {
  int count = 8;
  int size = 64;  // even; square clips are size..1.5*size, landscape ones 2*size x size
  int min_frames = 17;
  int max_frames = 33;
  int fps = 16;
  uint64_t seed = 1234;
};

struct DemoClip {
  std::string file;  // "clip_0000.webm"
  int width = 0;
  int height = 0;
  int frames = 0;
  std::string caption;
};

std::vector<DemoClip> make_demo_video_dataset(const std::filesystem::path& out_dir,
                                              const DemoVideoOptions& options);

}  // namespace lt::data
