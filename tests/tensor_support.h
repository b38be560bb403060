// Tensor helpers the tests share: whole safetensors files, comparisons, the parity fixtures'
// tolerance. Includes LibTorch: only for tests that use tensors anyway.
#pragma once
#include <algorithm>
#include <filesystem>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <catch2/catch.hpp>
#include <torch/torch.h>

#include "loratrain/io/safetensors.h"

namespace lt::test {

// Named tensors in file order, as io::save_safetensors takes them.
using Tensors = std::vector<std::pair<std::string, at::Tensor>>;

// Every tensor of a safetensors file, in its stored dtype.
inline std::map<std::string, at::Tensor> read_tensors(const std::filesystem::path& path) {
  auto file = io::SafetensorsFile::open(path);
  std::map<std::string, at::Tensor> out;
  for (const auto& t : file->tensors()) out[t.name] = file->load(t.name);
  return out;
}

inline bool same_tensors(const std::map<std::string, at::Tensor>& a, const std::map<std::string, at::Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (const auto& [name, t] : a) {
    auto it = b.find(name);
    if (it == b.end() || !torch::equal(t, it->second)) return false;
  }
  return true;
}

// Largest elementwise |a - b|, computed in double.
inline double max_abs_diff(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>();
}

// The parity fixtures' tolerance (their meta.json): max|got - want| <= 1e-4 * max(1, max|want|).
inline void check_close(const std::string& name, const at::Tensor& got, const at::Tensor& want) {
  CATCH_INFO(name);
  CATCH_REQUIRE(got.sizes() == want.sizes());
  const double tol = 1e-4 * std::max(1.0, want.abs().max().item<double>());
  CATCH_CHECK(max_abs_diff(got, want) <= tol);
}

}  // namespace lt::test
