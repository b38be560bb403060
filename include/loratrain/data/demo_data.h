// The embedded demo's dataset: procedurally drawn coloured shapes (circle, square, triangle) on
// plain backgrounds, one PNG and one caption sidecar each ("a red circle on a blue background").
// Deterministic for given options; every fourth image is 2:1 landscape or portrait so the demo
// exercises more than one bucket.
#pragma once
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace lt::data {

struct DemoDataOptions {
  int count = 24;
  int size = 64;  // base size; square images are size..1.5*size, the others size x 2*size
  uint64_t seed = 1234;
};

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

}  // namespace lt::data
