// `xfuser models [--format table|markdown|json]`: every registered model with its ids, task,
// defaults, supported parallelism and options, and maturity.
#include <iostream>
#include <sstream>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "models/registry.h"
#include "runner/outputs.h"
#include "runner/tool/commands.h"

namespace xfuser::runner::tool {
namespace {

std::vector<std::string> parallelism_names(const models::Parallelism& p) {
  std::vector<std::string> out;
  if (p.ulysses) out.push_back("ulysses");
  if (p.ring) out.push_back("ring");
  if (p.pipefusion) out.push_back("pipefusion");
  if (p.tensor_parallel) out.push_back("tensor");
  if (p.data_parallel) out.push_back("data");
  if (p.cfg_parallel) out.push_back("cfg");
  if (p.parallel_vae) out.push_back("parallel_vae");
  return out;
}

std::string join(const std::vector<std::string>& items, const std::string& sep) {
  std::string out;
  for (const auto& s : items) out += (out.empty() ? "" : sep) + s;
  return out;
}

// ", 81 frames at 16 fps, flow_shift 12" for video models ("" for image models).
std::string video_defaults(const models::ModelSpec& s) {
  if (s.defaults.num_frames <= 0) return "";
  std::ostringstream os;
  os << ", " << s.defaults.num_frames << " frames at " << s.defaults.fps << " fps";
  if (s.defaults.flow_shift > 0) os << ", flow_shift " << s.defaults.flow_shift;
  return os.str();
}

}  // namespace

std::string models_doc() {
  std::ostringstream os;
  os << "# Supported models\n\n"
     << "<!-- Generated from the model registry: do not edit. Regenerate with\n"
     << "     cmake --build build --target docs-models\n"
     << "     (runs: build/bin/xfuser models --format doc --output docs/models.md). -->\n\n"
     << "Every model `xfuser-run --model` accepts (`xfuser models` prints the same list).\n\n"
     << models_listing("markdown");
  for (const auto& s : models::ModelRegistry::all()) {
    os << "\n## " << s.id << "\n\n";
    if (!s.description.empty()) os << s.description << "\n\n";
    os << "- task: " << models::to_string(s.task) << "\n";
    os << "- maturity: " << s.maturity << "\n";
    if (!s.checked_against.empty()) {
      os << "- checked against: " << s.checked_against
         << " (tiny pipeline folders saved by each, final latents from the same initial ones)\n";
    }
    if (!s.aliases.empty()) os << "- aliases: `" << join(s.aliases, "`, `") << "`\n";
    std::string weights = "--model_path only";
    if (s.id == "tiny-shapes") {  // the embedded models whose weights are trained
      weights = "trained, committed (models/flux/tiny_shapes; installed under share/xfuser)";
    } else if (s.id == "tiny-shapes-video") {
      weights = "trained, committed (models/wan/tiny_shapes_video; installed under share/xfuser)";
    } else if (s.maturity == "embedded") {
      weights = "built on first use (under $XFUSER_CACHE, default ~/.cache/xfuser)";
    } else if (!s.hf_repo.empty()) {
      weights = "Hugging Face repo `" + s.hf_repo + "` in the local cache (or --model_path)";
    }
    os << "- weights: " << weights << "\n";
    os << "- defaults: " << s.defaults.width << "x" << s.defaults.height << ", "
       << s.defaults.num_inference_steps << " steps, guidance " << s.defaults.guidance_scale
       << ", max_sequence_length " << s.defaults.max_sequence_length << video_defaults(s)
       << (s.folder_defaults_note.empty() ? "" : "; " + s.folder_defaults_note) << "\n";
    const auto par = parallelism_names(s.parallelism);
    os << "- parallelism: " << (par.empty() ? std::string("single rank") : join(par, ", ")) << "\n";
    std::vector<std::string> options(s.options.begin(), s.options.end());
    os << "- options: "
       << (options.empty() ? std::string("none") : "`" + join(options, "`, `") + "`") << "\n";
  }
  return os.str();
}

std::string models_listing(const std::string& format) {
  if (format == "doc") return models_doc();
  std::ostringstream os;
  const auto& specs = models::ModelRegistry::all();
  if (format == "json") {
    nlohmann::json arr = nlohmann::json::array();
    for (const auto& s : specs) {
      arr.push_back({{"id", s.id},
                     {"aliases", s.aliases},
                     {"hf_repo", s.hf_repo},
                     {"task", models::to_string(s.task)},
                     {"defaults",
                      {{"height", s.defaults.height},
                       {"width", s.defaults.width},
                       {"num_inference_steps", s.defaults.num_inference_steps},
                       {"guidance_scale", s.defaults.guidance_scale},
                       {"max_sequence_length", s.defaults.max_sequence_length},
                       {"num_frames", s.defaults.num_frames},
                       {"fps", s.defaults.fps},
                       {"flow_shift", s.defaults.flow_shift}}},
                     {"parallelism", parallelism_names(s.parallelism)},
                     {"options", std::vector<std::string>(s.options.begin(), s.options.end())},
                     {"maturity", s.maturity},
                     {"description", s.description}});
    }
    os << arr.dump(2) << "\n";
    return os.str();
  }
  const bool md = format == "markdown";
  const std::vector<std::string> header = {"model",    "aliases",     "task",
                                           "defaults", "parallelism", "maturity"};
  std::vector<std::vector<std::string>> rows;
  for (const auto& s : specs) {
    std::ostringstream d;
    d << s.defaults.width << "x" << s.defaults.height << ", " << s.defaults.num_inference_steps
      << " steps, guidance " << s.defaults.guidance_scale << ", text "
      << s.defaults.max_sequence_length << video_defaults(s)
      << (s.folder_defaults_note.empty() ? "" : "; " + s.folder_defaults_note);
    auto par = parallelism_names(s.parallelism);
    rows.push_back({s.id, join(s.aliases, ", "), models::to_string(s.task), d.str(),
                    par.empty() ? "single rank" : join(par, ", "), s.maturity});
  }
  if (md) {
    os << "| " << join(header, " | ") << " |\n|";
    for (size_t i = 0; i < header.size(); ++i) os << "---|";
    os << "\n";
    for (const auto& r : rows) os << "| " << join(r, " | ") << " |\n";
    return os.str();
  }
  std::vector<size_t> width(header.size());
  for (size_t i = 0; i < header.size(); ++i) width[i] = header[i].size();
  for (const auto& r : rows)
    for (size_t i = 0; i < r.size(); ++i) width[i] = std::max(width[i], r[i].size());
  auto line = [&](const std::vector<std::string>& r) {
    for (size_t i = 0; i < r.size(); ++i) {
      os << r[i];
      if (i + 1 < r.size()) os << std::string(width[i] - r[i].size() + 2, ' ');
    }
    os << "\n";
  };
  line(header);
  for (const auto& r : rows) line(r);
  return os.str();
}

void register_models(CLI::App& app) {
  auto format = std::make_shared<std::string>("table");
  auto output = std::make_shared<std::string>();
  auto* cmd = app.add_subcommand("models", "List the registered models");
  cmd->add_option("--format", *format,
                  "Output format (doc: the docs/models.md page, table and details)")
      ->check(CLI::IsMember({"table", "markdown", "json", "doc"}))
      ->capture_default_str();
  cmd->add_option("--output", *output, "Write to this file (atomically) instead of stdout");
  cmd->callback([format, output] {
    const std::string text = models_listing(*format);
    if (output->empty()) {
      std::cout << text;
    } else {
      write_file_atomic(*output, text);
    }
  });
}

}  // namespace xfuser::runner::tool
