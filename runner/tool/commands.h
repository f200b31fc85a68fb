// The subcommands of the `xfuser` tool. Each registers itself on the CLI11 app with a callback
// that runs it; errors are thrown as xfuser::Error and reported by main.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace CLI {
class App;
}

namespace xfuser::runner::tool {

void register_commands(CLI::App& app);

// Individual commands (one file each under runner/tool/).
void register_forward(CLI::App& app);
void register_make_tiny(CLI::App& app);
void register_models(CLI::App& app);
void register_validate(CLI::App& app);
void register_tokenize(CLI::App& app);
void register_trace(CLI::App& app);

// The `xfuser models` listing in `format` (table, markdown or json).
std::string models_listing(const std::string& format);

// `xfuser trace merge`: DIR/profile_trace_rank_{r}.json (all ranks of one run, validated; errors
// name the file) as one Chrome trace, pid = rank, ts on the run's common clock. `inputs` (if
// given) receives the files read, in rank order.
nlohmann::json merge_traces(const std::filesystem::path& dir,
                            std::vector<std::filesystem::path>* inputs = nullptr);

}  // namespace xfuser::runner::tool
