// Finding checkpoints offline: a diffusers pipeline folder given directly, or a Hugging Face
// repo id looked up in the local Hugging Face cache. Nothing is ever downloaded.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace xfuser::models {

// The hub cache folders searched, in order: $HF_HUB_CACHE, $HF_HOME/hub,
// $XDG_CACHE_HOME/huggingface/hub, ~/.cache/huggingface/hub (unset variables skipped).
std::vector<std::filesystem::path> hub_cache_roots();

// The snapshot folder of `repo_id` ("org/name") in the first cache root that has it:
// <root>/models--org--name/snapshots/<rev>, where <rev> is refs/<revision> (default "main") when
// that ref exists (a ref naming a missing snapshot is an error naming both, never a fallback),
// else the only snapshot, else the most recently modified one. Throws
// xfuser::Error listing every folder it looked in and how to fix it (download on a machine with
// network access, or pass --model_path).
std::filesystem::path find_in_hub_cache(const std::string& repo_id,
                                        const std::string& revision = "main");

// Checks a diffusers pipeline folder: it exists and has model_index.json (error names the
// folder and what is missing).
void check_pipeline_folder(const std::filesystem::path& dir);

// Reads and checks dir/model_index.json: a JSON object whose component entries (keys not
// starting with '_') are [library, class] pairs of strings (or [null, null] for an absent
// component). Errors name the file, the entry and what was expected.
nlohmann::json read_model_index(const std::filesystem::path& dir);

// Whether the diffusers release that wrote a config (model_index.json, scheduler_config.json:
// its "_diffusers_version") is older than major.minor, for behaviour that changed between
// releases: "0.41.1" and "0.33.0.dev0" are before 0.42. A config without the key, or with one
// that does not parse, counts as written by today's release (false).
bool saved_before_diffusers(const nlohmann::json& config, int major, int minor);

}  // namespace xfuser::models
