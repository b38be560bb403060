// Precompiled for every LibTorch-using target (see LtTorch.cmake). Project headers never include
// <torch/torch.h> themselves; they include the narrow LibTorch headers they need.
#pragma once
#include <torch/torch.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>
