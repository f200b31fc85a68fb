// The heavy third-party headers every xfuser translation unit uses, precompiled once.
// Only ATen and c10 (never <torch/torch.h>): xfuser does not use torch::nn or autograd.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>
