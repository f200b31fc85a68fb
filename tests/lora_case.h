// The LoRA fixtures' cases (tests/fixtures/lora-v0.42.1/<pipeline>/<case>/case.json): the adapters
// a case loads, as xfuser's LoraSpec. Shared by test_lora and test_lora_parallel.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "models/common/lora.h"
#include "tests/test_util.h"

namespace xfuser::testing {

// lora-v0.42.1/<pipeline>: the pipeline's adapters and cases.
inline std::filesystem::path lora_root(const std::string& pipeline) {
  return fixtures_dir() / "lora-v0.42.1" / pipeline;
}

// case.json's lora.adapters: file (relative to `root`), name, scale, target ("transformer", or
// "transformer_2": --lora_2).
inline std::vector<models::LoraSpec> lora_case_adapters(const std::filesystem::path& root,
                                                        const nlohmann::json& c) {
  std::vector<models::LoraSpec> out;
  for (const auto& a : c["lora"]["adapters"]) {
    models::LoraSpec s;
    s.path = (root / a["file"].get<std::string>()).string();
    s.name = a["name"];
    s.scale = a["scale"];
    const std::string target = a.value("target", "transformer");
    if (target != "transformer") s.target = target;
    out.push_back(s);
  }
  return out;
}

}  // namespace xfuser::testing
