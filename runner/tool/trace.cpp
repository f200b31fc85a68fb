// `xfuser trace merge DIR [-o FILE]`: the per-rank traces of `xfuser-run --profile`
// (DIR/profile_trace_rank_{r}.json) as one Chrome trace, every rank on the common clock of the
// run's synchronised start: each rank's events move by its own clock_sync_us (docs/profiling.md).
#include <fstream>
#include <iostream>
#include <map>
#include <regex>
#include <sstream>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "backends/error.h"
#include "runner/outputs.h"
#include "runner/tool/commands.h"

namespace xfuser::runner::tool {
namespace fs = std::filesystem;

namespace {

struct RankTrace {
  fs::path file;
  nlohmann::json trace;
  int world_size = 0;
  int64_t clock_sync_us = 0;
};

RankTrace read_rank_trace(const fs::path& file, int rank) {
  RankTrace out;
  out.file = file;
  std::ifstream in(file, std::ios::binary);
  XF_CHECK(in, file.string(), ": cannot open");
  std::stringstream text;
  text << in.rdbuf();
  try {
    out.trace = nlohmann::json::parse(text.str());
  } catch (const nlohmann::json::exception& e) {
    XF_THROW(file.string(), ": not valid JSON (", e.what(), ")");
  }
  const auto& t = out.trace;
  XF_CHECK(t.is_object() && t.contains("traceEvents") && t["traceEvents"].is_array(), file.string(),
           ": not a Chrome trace (expected an object with a \"traceEvents\" array)");
  const nlohmann::json* meta = nullptr;
  if (t.contains("otherData") && t["otherData"].is_object() && t["otherData"].contains("xfuser") &&
      t["otherData"]["xfuser"].is_object()) {
    meta = &t["otherData"]["xfuser"];
  }
  XF_CHECK(meta != nullptr, file.string(),
           ": no otherData.xfuser metadata (not written by xfuser-run --profile?)");
  for (const char* key : {"rank", "world_size", "clock_sync_us"}) {
    XF_CHECK(meta->contains(key) && (*meta)[key].is_number_integer(), file.string(),
             ": otherData.xfuser.", key, " is missing or not an integer");
  }
  XF_CHECK((*meta)["rank"].get<int>() == rank, file.string(), ": its metadata says rank ",
           (*meta)["rank"].get<int>(), " but its name says rank ", rank);
  out.world_size = (*meta)["world_size"].get<int>();
  XF_CHECK(out.world_size >= 1 && rank < out.world_size, file.string(), ": rank ", rank,
           " is outside the world size ", out.world_size);
  out.clock_sync_us = (*meta)["clock_sync_us"].get<int64_t>();
  XF_CHECK(out.clock_sync_us >= 0, file.string(),
           ": otherData.xfuser.clock_sync_us is negative (no synchronised start recorded)");
  const auto& events = t["traceEvents"];
  for (size_t i = 0; i < events.size(); ++i) {
    const auto& e = events[i];
    XF_CHECK(e.is_object() && e.contains("ph") && e["ph"].is_string(), file.string(),
             ": traceEvents[", i, "] is not an event object with a \"ph\" string");
    if (e["ph"] == "X") {
      XF_CHECK(e.contains("ts") && e["ts"].is_number() && e.contains("dur") &&
                   e["dur"].is_number() && e.contains("name") && e["name"].is_string(),
               file.string(), ": traceEvents[", i,
               "] is a complete event without a numeric ts/dur or a name");
    }
  }
  return out;
}

}  // namespace

nlohmann::json merge_traces(const fs::path& dir, std::vector<fs::path>* inputs) {
  XF_CHECK(fs::is_directory(dir), "trace merge: ", dir.string(), " is not a directory");
  const std::regex pattern(R"(profile_trace_rank_(\d+)\.json)");
  std::map<int, fs::path> files;
  for (const auto& entry : fs::directory_iterator(dir)) {
    std::smatch m;
    const std::string name = entry.path().filename().string();
    if (entry.is_regular_file() && std::regex_match(name, m, pattern)) {
      files[std::stoi(m[1].str())] = entry.path();
    }
  }
  XF_CHECK(!files.empty(), "trace merge: no profile_trace_rank_{r}.json in ", dir.string(),
           " (write them with xfuser-run --profile --output_directory ", dir.string(), ")");
  std::vector<RankTrace> ranks;
  for (const auto& [rank, file] : files) ranks.push_back(read_rank_trace(file, rank));
  const int world = ranks.front().world_size;
  for (const auto& r : ranks) {
    XF_CHECK(r.world_size == world, r.file.string(), ": world size ", r.world_size, " but ",
             ranks.front().file.string(), " says ", world);
  }
  std::ostringstream missing;
  for (int r = 0; r < world; ++r) {
    if (!files.count(r)) missing << (missing.tellp() > 0 ? ", " : "") << r;
  }
  XF_CHECK(missing.str().empty(), "trace merge: ", dir.string(), " lacks the trace of rank(s) ",
           missing.str(), " of a ", world, "-rank run");

  nlohmann::json events = nlohmann::json::array();
  nlohmann::json sources = nlohmann::json::array();
  size_t index = 0;
  for (const auto& [rank, file] : files) {
    const RankTrace& r = ranks[index++];  // `ranks` follows the order of `files`
    for (auto e : r.trace["traceEvents"]) {
      e["pid"] = rank;
      if (e.contains("ts") && e["ts"].is_number_integer()) {
        e["ts"] = e["ts"].get<int64_t>() - r.clock_sync_us;
      } else if (e.contains("ts") && e["ts"].is_number()) {
        e["ts"] = e["ts"].get<double>() - static_cast<double>(r.clock_sync_us);
      }
      if (e["ph"] == "M" && e.value("name", "") == "process_name") {
        e["args"] = {{"name", "rank " + std::to_string(rank)}};
      }
      events.push_back(std::move(e));
    }
    sources.push_back(
        {{"rank", rank}, {"file", file.filename().string()}, {"clock_sync_us", r.clock_sync_us}});
    if (inputs) inputs->push_back(file);
  }
  return {{"traceEvents", std::move(events)},
          {"displayTimeUnit", "ms"},
          {"otherData",
           {{"xfuser",
             {{"schema", "xfuser.trace.merged"},
              {"version", 1},
              {"world_size", world},
              {"clock", "microseconds since the run's synchronised start (MPI barrier)"},
              {"ranks", std::move(sources)}}}}}};
}

void register_trace(CLI::App& app) {
  auto* trace = app.add_subcommand("trace", "Work with the Chrome traces of xfuser-run --profile");
  trace->require_subcommand(1);
  auto dir = std::make_shared<std::string>();
  auto output = std::make_shared<std::string>();
  auto* merge = trace->add_subcommand(
      "merge", "Merge DIR/profile_trace_rank_{r}.json into one trace on a common clock");
  merge->add_option("dir", *dir, "Folder holding the per-rank traces")->required();
  merge->add_option("-o,--output", *output,
                    "Merged trace (default: DIR/profile_trace_merged.json)");
  merge->callback([dir, output] {
    const fs::path out =
        output->empty() ? fs::path(*dir) / "profile_trace_merged.json" : fs::path(*output);
    std::vector<fs::path> inputs;
    const nlohmann::json merged = merge_traces(*dir, &inputs);
    write_file_atomic(out, merged.dump() + "\n");
    std::cout << "wrote " << out.string() << " (" << merged["traceEvents"].size() << " events from "
              << inputs.size() << " rank(s))\n";
  });
}

}  // namespace xfuser::runner::tool
