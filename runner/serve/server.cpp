#include "runner/serve/server.h"

#include <httplib.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <regex>
#include <sstream>
#include <thread>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include "backends/base64.h"
#include "backends/error.h"
#include "backends/logging.h"
#include "backends/memory.h"
#include "backends/threads.h"
#include "models/registry.h"
#include "parallel/mpi_env.h"
#include "parallel/process_groups.h"
#include "runner/fault_handler.h"
#include "runner/launch.h"
#include "runner/outputs.h"
#include "runner/runner.h"
#include "runner/serve/api.h"
#include "runner/serve/scheduler.h"

namespace xfuser::runner::serve {
namespace fs = std::filesystem;

namespace {

// What rank 0 broadcasts: [op, JSON bytes, picture bytes], then the bytes.
enum Op : int64_t { kIdle = 0, kGenerate = 1, kExit = 2 };

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string new_id(const std::string& prefix) {
  static std::mutex mutex;
  static std::mt19937_64 rng{std::random_device{}()};
  std::lock_guard<std::mutex> lock(mutex);
  char hex[33];
  std::snprintf(hex, sizeof(hex), "%016llx%016llx", static_cast<unsigned long long>(rng()),
                static_cast<unsigned long long>(rng()));
  return prefix + hex;
}

// Rank 0: sends op and the two byte strings; other ranks: receive them. Every rank calls it.
int64_t exchange(parallel::Communicator* world, int64_t op, std::string* json,
                 std::string* pictures) {
  if (!world) return op;
  at::Tensor header = at::zeros({3}, at::kLong);
  if (world->rank() == 0) {
    header[0] = op;
    header[1] = static_cast<int64_t>(json->size());
    header[2] = static_cast<int64_t>(pictures->size());
  }
  world->broadcast(header, 0);
  const int64_t* h = header.data_ptr<int64_t>();
  for (auto [bytes, n] : {std::pair{json, h[1]}, std::pair{pictures, h[2]}}) {
    if (n == 0) {
      bytes->clear();
      continue;
    }
    at::Tensor t = at::empty({n}, at::kByte);
    if (world->rank() == 0) std::memcpy(t.data_ptr<uint8_t>(), bytes->data(), n);
    world->broadcast(t, 0);
    if (world->rank() != 0) bytes->assign(reinterpret_cast<const char*>(t.data_ptr<uint8_t>()), n);
  }
  return h[0];
}

template <typename T>
nlohmann::json optional_json(const std::optional<T>& v) {
  return v ? nlohmann::json(*v) : nlohmann::json();
}

template <typename T>
std::optional<T> json_optional(const nlohmann::json& j, const char* key) {
  if (!j.contains(key) || j[key].is_null()) return std::nullopt;
  return j[key].get<T>();
}

// The batch as broadcast: every job's prompt, negative prompt, seed and n, the shared shape, and
// the input pictures' sizes (the bytes follow in `pictures`).
nlohmann::json batch_message(const std::vector<std::shared_ptr<Job>>& batch,
                             std::string* pictures) {
  const JobInputs& first = batch.front()->inputs;
  nlohmann::json jobs = nlohmann::json::array();
  for (const auto& job : batch) {
    jobs.push_back({{"prompt", job->inputs.prompt},
                    {"negative_prompt", optional_json(job->inputs.negative_prompt)},
                    {"seed", job->inputs.seed},
                    {"n", job->inputs.n}});
  }
  pictures->clear();
  nlohmann::json sizes = nlohmann::json::array();
  for (size_t k = 0; k < first.pictures.size(); ++k) {
    *pictures += first.pictures[k];
    sizes.push_back({{"bytes", first.pictures[k].size()}, {"ext", first.picture_extensions[k]}});
  }
  return {{"id", batch.front()->id},
          {"jobs", jobs},
          {"height", optional_json(first.height)},
          {"width", optional_json(first.width)},
          {"num_frames", optional_json(first.num_frames)},
          {"fps", optional_json(first.fps)},
          {"num_inference_steps", optional_json(first.num_inference_steps)},
          {"guidance_scale", optional_json(first.guidance_scale)},
          {"true_cfg_scale", optional_json(first.true_cfg_scale)},
          {"guidance_scale_2", optional_json(first.guidance_scale_2)},
          {"max_sequence_length", optional_json(first.max_sequence_length)},
          {"lora_scales", first.lora_scales},
          {"pictures", sizes}};
}

// Seeds of a job's outputs: seed, seed + 1, ... (wrapping as int64, as torch.manual_seed reads it).
int64_t nth_seed(int64_t seed, int k) {
  return static_cast<int64_t>(static_cast<uint64_t>(seed) + static_cast<uint64_t>(k));
}

// The picture files of a request: written under `dir` (this rank's own folder), removed when the
// object goes.
class PictureFiles {
 public:
  PictureFiles(const fs::path& dir, const std::string& id, const std::string& bytes,
               const nlohmann::json& sizes) {
    size_t offset = 0;
    for (size_t k = 0; k < sizes.size(); ++k) {
      const size_t n = sizes[k]["bytes"].get<size_t>();
      XF_CHECK(offset + n <= bytes.size(), "serve: picture ", k, " of ", id, " is cut short");
      if (paths_.empty()) fs::create_directories(dir);
      const fs::path path =
          dir / (id + "_" + std::to_string(k) + "." + sizes[k]["ext"].get<std::string>());
      write_file_atomic(path, bytes.substr(offset, n));
      paths_.push_back(path.string());
      offset += n;
    }
  }
  ~PictureFiles() {
    for (const auto& p : paths_) {
      std::error_code ec;
      fs::remove(p, ec);
    }
  }
  PictureFiles(const PictureFiles&) = delete;
  PictureFiles& operator=(const PictureFiles&) = delete;
  const std::vector<std::string>& paths() const { return paths_; }

 private:
  std::vector<std::string> paths_;
};

RequestInputs request_inputs(const nlohmann::json& msg, const std::vector<std::string>& pictures) {
  RequestInputs in;
  for (const auto& job : msg["jobs"]) {
    for (int k = 0; k < job["n"].get<int>(); ++k) {
      in.prompts.push_back(job["prompt"].get<std::string>());
      in.negative_prompts.push_back(json_optional<std::string>(job, "negative_prompt"));
      in.seeds.push_back(nth_seed(job["seed"].get<int64_t>(), k));
    }
  }
  in.height = json_optional<int>(msg, "height");
  in.width = json_optional<int>(msg, "width");
  in.num_frames = json_optional<int>(msg, "num_frames");
  in.fps = json_optional<int>(msg, "fps");
  in.num_inference_steps = json_optional<int>(msg, "num_inference_steps");
  in.guidance_scale = json_optional<double>(msg, "guidance_scale");
  in.true_cfg_scale = json_optional<double>(msg, "true_cfg_scale");
  in.guidance_scale_2 = json_optional<double>(msg, "guidance_scale_2");
  in.max_sequence_length = json_optional<int>(msg, "max_sequence_length");
  in.input_images = pictures;
  if (msg.contains("lora_scales")) {
    in.lora_scales = msg["lora_scales"].get<std::map<std::string, double>>();
  }
  return in;
}

struct BatchOutput {
  ResolvedArgs args;
  at::Tensor images;  // rank 0: uint8 [B, H, W, 3] or [B, F, H, W, 3]
  double seconds = 0;
};

// Every rank: the batch's generation, as xfuser-run runs it; the pictures reach rank 0.
BatchOutput run_batch(Runner& runner, const ResolvedArgs& plan, std::mutex& resolve_mutex,
                      const nlohmann::json& msg, const std::string& picture_bytes,
                      const fs::path& input_dir, parallel::Communicator* world, int writer) {
  const std::string id = msg["id"].get<std::string>();
  PictureFiles files(input_dir, id, picture_bytes, msg["pictures"]);
  BatchOutput result;
  {
    std::lock_guard<std::mutex> lock(resolve_mutex);
    result.args = runner.resolve_request(plan, request_inputs(msg, files.paths()));
  }
  const auto start = Clock::now();
  models::GenerationOutput out = runner.generate(result.args);
  result.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  const int rank = world ? world->rank() : 0;
  if (rank == writer) result.images = out.images.to(at::kCPU).contiguous();
  if (world && writer != 0) {
    at::Tensor shape = at::zeros({8}, at::kLong);
    if (rank == writer) {
      shape[0] = result.images.dim();
      for (int64_t d = 0; d < result.images.dim(); ++d) shape[d + 1] = result.images.size(d);
      world->send(shape, 0);
      world->send(result.images, 0);
    } else if (rank == 0) {
      world->recv(shape, writer);
      const int64_t* s = shape.data_ptr<int64_t>();
      result.images = at::empty(std::vector<int64_t>(s + 1, s + 1 + s[0]), at::kByte);
      world->recv(result.images, writer);
    }
  }
  return result;
}

// A video's length as OpenAI writes it (a string): (frames - 1) / fps, up to 3 decimals.
std::string seconds_text(int frames, int fps) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.3f", (frames - 1) / static_cast<double>(std::max(1, fps)));
  std::string s = text;
  while (s.back() == '0') s.pop_back();
  if (s.back() == '.') s.pop_back();
  return s;
}

// The route a request's path belongs to, for the metrics' endpoint label.
std::string route_of(const std::string& path) {
  static const std::vector<std::pair<std::regex, std::string>> routes = {
      {std::regex("^/v1/videos/[^/]+/content$"), "/v1/videos/{id}/content"},
      {std::regex("^/v1/videos/[^/]+$"), "/v1/videos/{id}"},
      {std::regex("^/v1/files/[^/]+$"), "/v1/files/{name}"},
      {std::regex("^/v1/models/[^/]+$"), "/v1/models/{id}"}};
  static const std::set<std::string> fixed = {"/health",          "/metrics",
                                              "/v1/models",       "/v1/images/generations",
                                              "/v1/images/edits", "/v1/videos"};
  if (fixed.count(path)) return path;
  for (const auto& [re, name] : routes) {
    if (std::regex_match(path, re)) return name;
  }
  return "other";
}

// The request field a runner error is about: the first flag it names, as the field that sets it.
std::string client_param(const xfuser::Error& e) {
  static const std::regex flag("--([a-z_0-9]+)");
  std::smatch m;
  const std::string& text = e.message();
  if (!std::regex_search(text, m, flag)) return "";
  const std::string name = m[1];
  if (name == "height" || name == "width") return "size";
  if (name == "input_images") return "image";
  return name;
}

// A runner error as the client reads it: the message without file, rank and flag dashes.
std::string client_message(const xfuser::Error& e) {
  std::string m = e.message();
  for (size_t at = m.find("--"); at != std::string::npos; at = m.find("--", at)) m.erase(at, 2);
  return m;
}

thread_local Clock::time_point t_request_start{};

// Whether the client of a connection to `local_port` from `remote_port` has closed it: the kernel
// lists the connection in CLOSE_WAIT (the peer's FIN received). cpp-httplib gives a handler no
// socket to poll, so the table the kernel keeps (/proc/net/tcp, tcp6) is read; where it cannot be
// read, no client is taken for gone.
bool client_closed(int local_port, int remote_port) {
  bool seen = false;
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream in(table);
    std::string line;
    std::getline(in, line);  // header
    while (std::getline(in, line)) {
      std::istringstream fields(line);
      std::string slot, local, remote, state;
      if (!(fields >> slot >> local >> remote >> state)) continue;
      const auto port_of = [](const std::string& address) {
        const size_t colon = address.rfind(':');
        return colon == std::string::npos
                   ? -1
                   : static_cast<int>(std::stoul(address.substr(colon + 1), nullptr, 16));
      };
      if (port_of(local) != local_port || port_of(remote) != remote_port) continue;
      if (state != "08") return false;  // 08: CLOSE_WAIT
      seen = true;
    }
  }
  return seen;
}

// World rank 0: the HTTP side and the loop that hands batches to every rank.
class Service {
 public:
  Service(const RunConfig& run, const ServeConfig& config, Runner& runner, const ResolvedArgs& plan,
          parallel::Communicator* world)
      : run_(run),
        config_(config),
        runner_(runner),
        plan_(plan),
        world_(world),
        scheduler_(static_cast<size_t>(config.max_queue), config.max_batch_size,
                   std::chrono::milliseconds(config.batch_wait_ms)) {
    const auto& spec = *plan.spec;
    video_ = spec.defaults.num_frames > 0;
    edits_ = spec.options.count("--input_images") > 0;
    output_dir_ = fs::path(run.output_directory);
    input_dir_ = output_dir_ / ".serve-inputs" / "rank0";
    setup_routes();
  }

  // An error before the loop (loading the model) still stops the listener.
  ~Service() {
    http_.stop();
    if (listener_.joinable()) listener_.join();
  }
  Service(const Service&) = delete;
  Service& operator=(const Service&) = delete;

  // Starts listening (before the model loads: /health answers "loading").
  void start() {
    const int threads = config_.max_queue + config_.max_batch_size + 8;
    http_.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
    http_.set_payload_max_length(static_cast<size_t>(config_.max_request_bytes));
    int port = config_.port;
    if (port == 0) {
      port = http_.bind_to_any_port(config_.host);
      XF_CHECK(port > 0, "serve: cannot listen on ", config_.host, " (any port)");
    } else {
      XF_CHECK(http_.bind_to_port(config_.host, port), "serve: cannot listen on ", config_.host,
               ":", port, " (in use, or not an address of this host)");
    }
    port_ = port;
    listener_ = std::thread([this] { http_.listen_after_bind(); });
    spdlog::info("serving {} on http://{}:{} (loading; rank 0 is pid {}: SIGTERM to it drains)",
                 plan_.spec->id, config_.host, port, ::getpid());
    if (!config_.port_file.empty()) write_file_atomic(config_.port_file, std::to_string(port));
  }

  void set_ready() {
    state_ = "ok";
    spdlog::info("ready: http://{}:{}/v1 ({})", config_.host, port_, plan_.spec->id);
  }

  // The loop of rank 0's main thread. Returns on a drain; throws when a generation fails.
  void loop(std::mutex& resolve_mutex, int writer) {
    const auto heartbeat = std::chrono::milliseconds(
        static_cast<int64_t>(std::clamp(run_.comm_timeout / 4, 0.05, 1.0) * 1000));
    std::string json, pictures;
    try {
      for (;;) {
        if (stop_signal() != 0 && state_ != "draining") {
          state_ = "draining";
          scheduler_.close();
          spdlog::info("stop signal: finishing {} queued job(s), refusing new requests",
                       scheduler_.queued());
        }
        auto batch = scheduler_.next_batch(heartbeat);
        if (batch.empty()) {
          if (state_ == "draining" && scheduler_.queued() == 0) break;
          json.clear();
          pictures.clear();
          exchange(world_, kIdle, &json, &pictures);
          continue;
        }
        run(batch, resolve_mutex, writer);
      }
      json.clear();
      pictures.clear();
      exchange(world_, kExit, &json, &pictures);
    } catch (const std::exception& e) {
      state_ = "unhealthy";
      ApiError error;
      error.status = 500;
      error.type = "server_error";
      error.message = std::string("the service failed and is ending: ") + e.what();
      for (const auto& job : running_jobs()) job->fail(error);
      error.status = 503;
      scheduler_.fail_all(error);
      stop_http();
      throw;
    }
    stop_http();
  }

 private:
  // One batch on every rank, then its answers.
  void run(const std::vector<std::shared_ptr<Job>>& batch, std::mutex& resolve_mutex, int writer) {
    {
      std::lock_guard<std::mutex> lock(running_mutex_);
      running_ = batch;
    }
    std::string pictures;
    nlohmann::json msg = batch_message(batch, &pictures);
    std::string json = msg.dump();
    exchange(world_, kGenerate, &json, &pictures);
    BatchOutput out =
        run_batch(runner_, plan_, resolve_mutex, msg, pictures, input_dir_, world_, writer);
    int outputs = 0;
    for (const auto& job : batch) outputs += job->inputs.n;
    metrics_.batch(outputs, out.args.request.num_inference_steps, out.seconds);
    last_batch_seconds_ = out.seconds;
    size_t row = 0;
    for (const auto& job : batch) {
      std::vector<std::string> results, names;
      std::vector<int64_t> seeds;
      for (int k = 0; k < job->inputs.n; ++k, ++row) {
        const at::Tensor picture = out.images[static_cast<int64_t>(row)].contiguous();
        const std::string name = job->id + "_" + std::to_string(k);
        seeds.push_back(out.args.request.seeds[row]);
        if (job->kind == JobKind::kVideo) {
          const fs::path path = output_dir_ / (name + ".mp4");
          runner_.write_output(out.args, row, picture, path);
          results.push_back(path.string());
          names.push_back(path.filename().string());
          continue;
        }
        std::string png = encode_png(picture, runner_.output_text(out.args, row));
        if (job->response_format == "url") {
          write_file_atomic(output_dir_ / (name + ".png"), png);
          names.push_back(name + ".png");
        }
        results.push_back(std::move(png));
      }
      {
        std::lock_guard<std::mutex> lock(job->mutex);
        job->outputs = std::move(results);
        job->output_names = std::move(names);
        job->output_seeds = std::move(seeds);
      }
      job->finish(JobState::kCompleted);
    }
    std::lock_guard<std::mutex> lock(running_mutex_);
    running_.clear();
  }

  std::vector<std::shared_ptr<Job>> running_jobs() {
    std::lock_guard<std::mutex> lock(running_mutex_);
    return running_;
  }

 public:
  // Rank 0's step callback: the running jobs' progress.
  void progress(int step, int total) {
    std::lock_guard<std::mutex> lock(running_mutex_);
    for (const auto& job : running_) {
      std::lock_guard<std::mutex> job_lock(job->mutex);
      job->progress = total > 0 ? std::min(99, step * 100 / total) : 0;
    }
  }

 private:
  // Answers still being written (routed requests whose logger has not run) get a moment before
  // the listener stops.
  void stop_http() {
    const auto until = Clock::now() + std::chrono::seconds(5);
    while (active_ > 0 && Clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    http_.stop();
    if (listener_.joinable()) listener_.join();
  }

  static void answer_json(httplib::Response& res, int status, const nlohmann::json& body) {
    res.status = status;
    res.set_content(body.dump(), "application/json");
  }
  static void answer_error(httplib::Response& res, const ApiError& e) {
    answer_json(res, e.status, error_body(e));
  }

  // The model a request names must be this one (its id or an alias); empty names none.
  std::optional<ApiError> check_model(const std::string& name) const {
    if (name.empty()) return std::nullopt;
    const auto& spec = *plan_.spec;
    if (name == spec.id) return std::nullopt;
    try {
      if (&models::ModelRegistry::find(name) == &spec) return std::nullopt;
    } catch (const xfuser::Error&) {
    }
    return make_error(
        404, "model '" + name + "' is not served here; this server serves '" + spec.id + "'",
        "invalid_request_error", "model", "model_not_found");
  }

  // Can the service take a job now? (loading, draining, unhealthy: 503)
  std::optional<ApiError> check_accepting() const {
    // A stop signal refuses new work at once; the loop sees it after the running batch.
    const std::string state = stop_signal() != 0 && std::string(state_) == "ok"
                                  ? std::string("draining")
                                  : std::string(state_);
    if (state == "ok") return std::nullopt;
    return make_error(503,
                      state == "loading" ? "the model is still loading; retry shortly"
                      : state == "draining"
                          ? "the server is shutting down and takes no new requests"
                          : "the server is unhealthy and is ending",
                      "server_error", "", state);
  }

  // Runs Runner::resolve_request on a job's inputs: what the model refuses is a 400.
  std::optional<ApiError> check_inputs(const std::shared_ptr<Job>& job, ResolvedArgs* resolved) {
    try {
      std::string pictures;
      const nlohmann::json msg = batch_message({job}, &pictures);
      PictureFiles files(output_dir_ / ".serve-inputs" / "check", job->id, pictures,
                         msg["pictures"]);
      std::lock_guard<std::mutex> lock(*resolve_mutex_);
      *resolved = runner_.resolve_request(plan_, request_inputs(msg, files.paths()));
    } catch (const xfuser::Error& e) {
      return make_error(400, client_message(e), "invalid_request_error", client_param(e));
    }
    return std::nullopt;
  }

  // Reads a JSON body or a multipart form (its text fields as strings, its files aside).
  std::optional<ApiError> read_body(const httplib::Request& req, nlohmann::json* body, bool* form,
                                    std::vector<httplib::MultipartFormData>* files) {
    *form = req.is_multipart_form_data();
    if (*form) {
      *body = nlohmann::json::object();
      for (const auto& [name, item] : req.files) {
        if (!item.filename.empty()) {
          files->push_back(item);
          continue;
        }
        (*body)[name] = item.content;
      }
      return std::nullopt;
    }
    try {
      *body = nlohmann::json::parse(req.body);
    } catch (const nlohmann::json::parse_error& e) {
      return make_error(400, std::string("the body is not valid JSON: ") + e.what(),
                        "invalid_request_error");
    }
    return std::nullopt;
  }

  // Pictures of an edit or a video's first frame, from the form's files.
  std::optional<ApiError> take_pictures(const std::vector<httplib::MultipartFormData>& files,
                                        const std::set<std::string>& fields, JobInputs* in) {
    for (const auto& file : files) {
      if (!fields.count(file.name)) {
        return make_error(400, "unknown file field '" + file.name + "'", "invalid_request_error",
                          file.name);
      }
      const std::string ext = picture_extension(file.content);
      if (ext.empty()) {
        return make_error(
            400, "'" + file.name + "' (" + file.filename + ") is not a PNG or JPEG picture",
            "invalid_request_error", file.name);
      }
      in->pictures.push_back(file.content);
      in->picture_extensions.push_back(ext);
    }
    return std::nullopt;
  }

  enum class Admit { kQueued, kAnswered };
  // Queues `job`, or answers why not (429 with Retry-After when full, 503 when draining).
  Admit admit(const std::shared_ptr<Job>& job, httplib::Response& res) {
    switch (scheduler_.submit(job)) {
      case SubmitResult::kQueued:
        return Admit::kQueued;
      case SubmitResult::kFull: {
        const double per_batch = std::max(1.0, last_batch_seconds_.load());
        res.set_header("Retry-After", std::to_string(static_cast<int>(std::ceil(per_batch))));
        answer_error(res, make_error(429,
                                     "the queue is full (" + std::to_string(config_.max_queue) +
                                         " jobs); retry after the Retry-After seconds",
                                     "rate_limit_error", "", "queue_full"));
        return Admit::kAnswered;
      }
      case SubmitResult::kClosed:
        answer_error(res, *check_accepting());
        return Admit::kAnswered;
    }
    return Admit::kAnswered;
  }

  void images(const httplib::Request& req, httplib::Response& res, Endpoint endpoint) {
    if (auto e = check_accepting()) return answer_error(res, *e);
    if (endpoint == Endpoint::kImageEdits && !edits_) {
      return answer_error(
          res, make_error(400, plan_.spec->id + " does not take input pictures (no edits)",
                          "invalid_request_error", "image"));
    }
    if (video_) {
      return answer_error(res,
                          make_error(400, plan_.spec->id + " makes videos: use POST /v1/videos",
                                     "invalid_request_error", "model"));
    }
    nlohmann::json body;
    bool form = false;
    std::vector<httplib::MultipartFormData> files;
    if (auto e = read_body(req, &body, &form, &files)) return answer_error(res, *e);
    if (endpoint == Endpoint::kImageEdits && !form) {
      return answer_error(res,
                          make_error(400, "/v1/images/edits takes a multipart form (image, prompt)",
                                     "invalid_request_error"));
    }
    ParsedRequest parsed;
    if (auto e = parse_request(body, endpoint, std::min(config_.max_n, config_.max_batch_size),
                               plan_.config.fps.value_or(16), form, &parsed)) {
      return answer_error(res, *e);
    }
    if (auto e = check_model(parsed.model)) return answer_error(res, *e);
    auto job = std::make_shared<Job>();
    job->id = new_id("img_");
    job->kind = JobKind::kImage;
    job->created_unix = unix_now();
    job->response_format = parsed.response_format;
    job->inputs = std::move(parsed.inputs);
    if (endpoint == Endpoint::kImageEdits) {
      if (auto e = take_pictures(files, {"image", "image[]"}, &job->inputs)) {
        return answer_error(res, *e);
      }
      if (job->inputs.pictures.empty()) {
        return answer_error(
            res, make_error(400, "'image' is required", "invalid_request_error", "image"));
      }
    } else if (!files.empty()) {
      return answer_error(res, make_error(400, "/v1/images/generations takes no files",
                                          "invalid_request_error", files.front().name));
    }
    ResolvedArgs resolved;
    if (auto e = check_inputs(job, &resolved)) return answer_error(res, *e);
    if (admit(job, res) == Admit::kAnswered) return;
    const auto deadline = job->created + std::chrono::milliseconds(
                                             static_cast<int64_t>(config_.request_timeout * 1000));
    // While it waits, a client that goes away takes its queued job with it.
    while (!job->wait_until(std::min(deadline, Clock::now() + std::chrono::milliseconds(200))) &&
           Clock::now() < deadline) {
      if (client_closed(port_, req.remote_port) && scheduler_.cancel(job->id)) {
        spdlog::info("request {}: the client went away; its queued job is cancelled", job->id);
        res.status = 499;  // nobody reads it: for the log and the metrics
        return;
      }
    }
    if (!job->wait_until(deadline)) {
      const bool was_queued = scheduler_.cancel(job->id);
      return answer_error(res, make_error(504,
                                          std::string("the request timed out after ") +
                                              std::to_string(config_.request_timeout) + " s " +
                                              (was_queued ? "in the queue" : "while generating"),
                                          "timeout_error", "", "timeout"));
    }
    std::lock_guard<std::mutex> lock(job->mutex);
    if (job->state != JobState::kCompleted) return answer_error(res, job->error);
    nlohmann::json data = nlohmann::json::array();
    const std::string base = "http://" + req.get_header_value("Host") + "/v1/files/";
    for (size_t k = 0; k < job->outputs.size(); ++k) {
      nlohmann::json item = {{"seed", job->output_seeds[k]}};
      if (job->response_format == "url") {
        item["url"] = base + job->output_names[k];
      } else {
        item["b64_json"] = backends::base64_encode(job->outputs[k]);
      }
      data.push_back(item);
    }
    answer_json(res, 200,
                {{"created", job->created_unix},
                 {"data", data},
                 {"output_format", "png"},
                 {"size", std::to_string(resolved.request.width) + "x" +
                              std::to_string(resolved.request.height)}});
  }

  nlohmann::json video_object(const Job& job) const {
    // Caller holds job.mutex.
    nlohmann::json v = {
        {"id", job.id},
        {"object", "video"},
        {"model", plan_.spec->id},
        {"status", job_state_name(job.state)},
        {"progress", job.progress},
        {"created_at", job.created_unix},
        {"completed_at",
         job.completed_unix ? nlohmann::json(job.completed_unix) : nlohmann::json()},
        {"expires_at", nullptr},
        {"prompt", job.inputs.prompt},
        {"seed", job.inputs.seed},
        {"size", std::to_string(*job.inputs.width) + "x" + std::to_string(*job.inputs.height)},
        {"num_frames", *job.inputs.num_frames},
        {"fps", *job.inputs.fps},
        {"seconds", seconds_text(*job.inputs.num_frames, *job.inputs.fps)}};
    v["error"] =
        job.state == JobState::kFailed
            ? nlohmann::json{{"code", job.error.code.empty() ? job.error.type : job.error.code},
                             {"message", job.error.message}}
            : nlohmann::json();
    return v;
  }

  void create_video(const httplib::Request& req, httplib::Response& res) {
    if (auto e = check_accepting()) return answer_error(res, *e);
    if (!video_) {
      return answer_error(res, make_error(400, plan_.spec->id + " makes images: use /v1/images",
                                          "invalid_request_error", "model"));
    }
    nlohmann::json body;
    bool form = false;
    std::vector<httplib::MultipartFormData> files;
    if (auto e = read_body(req, &body, &form, &files)) return answer_error(res, *e);
    ParsedRequest parsed;
    if (auto e = parse_request(body, Endpoint::kVideos, 1, plan_.config.fps.value_or(16), form,
                               &parsed)) {
      return answer_error(res, *e);
    }
    if (auto e = check_model(parsed.model)) return answer_error(res, *e);
    auto job = std::make_shared<Job>();
    job->id = new_id("video_");
    job->kind = JobKind::kVideo;
    job->created_unix = unix_now();
    job->inputs = std::move(parsed.inputs);
    if (auto e = take_pictures(files, {"input_reference"}, &job->inputs)) {
      return answer_error(res, *e);
    }
    ResolvedArgs resolved;
    if (auto e = check_inputs(job, &resolved)) return answer_error(res, *e);
    // The resolved values, so the video object reports what will be made.
    job->inputs.height = resolved.request.height;
    job->inputs.width = resolved.request.width;
    job->inputs.num_frames = resolved.request.num_frames;
    job->inputs.fps = resolved.config.fps;
    {
      std::lock_guard<std::mutex> lock(videos_mutex_);
      videos_[job->id] = job;
    }
    if (admit(job, res) == Admit::kAnswered) {
      std::lock_guard<std::mutex> lock(videos_mutex_);
      videos_.erase(job->id);
      return;
    }
    std::lock_guard<std::mutex> lock(job->mutex);
    answer_json(res, 200, video_object(*job));
  }

  std::shared_ptr<Job> find_video(const std::string& id) {
    std::lock_guard<std::mutex> lock(videos_mutex_);
    auto it = videos_.find(id);
    return it == videos_.end() ? nullptr : it->second;
  }

  void video_not_found(httplib::Response& res, const std::string& id) {
    answer_error(res, make_error(404, "no video '" + id + "'", "invalid_request_error", "video_id",
                                 "not_found"));
  }

  void setup_routes() {
    http_.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
      t_request_start = Clock::now();
      ++active_;
      if (config_.api_key.empty() || req.path == "/health") {
        return httplib::Server::HandlerResponse::Unhandled;
      }
      if (req.get_header_value("Authorization") != "Bearer " + config_.api_key) {
        res.set_header("WWW-Authenticate", "Bearer");
        answer_error(res, make_error(401, "a valid API key is required (Authorization: Bearer KEY)",
                                     "invalid_request_error", "", "invalid_api_key"));
        return httplib::Server::HandlerResponse::Handled;
      }
      return httplib::Server::HandlerResponse::Unhandled;
    });
    http_.set_logger([this](const httplib::Request& req, const httplib::Response& res) {
      // The logger runs once per answer, after it is written: the end of a routed request
      // (pre-routing set its start); answers httplib gives before routing (413) have none.
      double seconds = 0;
      if (t_request_start != Clock::time_point{}) {
        seconds = std::chrono::duration<double>(Clock::now() - t_request_start).count();
        t_request_start = Clock::time_point{};
        --active_;
      }
      metrics_.request(route_of(req.path), res.status, seconds);
      spdlog::debug("{} {} -> {} ({:.3f} s)", req.method, req.path, res.status, seconds);
    });
    // Errors httplib answers itself (404 route, 413 body, 400 unparsable form): OpenAI's object.
    http_.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
      if (!res.body.empty()) return;
      std::string message = "HTTP " + std::to_string(res.status);
      if (res.status == 400) message = "the request could not be read (malformed body or form)";
      if (res.status == 404) message = "no route " + req.method + " " + req.path;
      if (res.status == 413) message = "the request body is too large";
      answer_json(
          res, res.status,
          error_body(make_error(res.status, message,
                                res.status >= 500 ? "server_error" : "invalid_request_error")));
    });
    http_.set_exception_handler(
        [](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
          std::string what = "unknown error";
          try {
            std::rethrow_exception(ep);
          } catch (const std::exception& e) {
            what = e.what();
          } catch (...) {
          }
          spdlog::error("serve: request failed: {}", what);
          answer_json(res, 500, error_body(make_error(500, what, "server_error")));
        });

    http_.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
      const std::string state = check_accepting() ? check_accepting()->code : "ok";
      answer_json(res, state == "ok" ? 200 : 503,
                  {{"status", state},
                   {"model", plan_.spec->id},
                   {"queued", scheduler_.queued()},
                   {"running", running_jobs().size()}});
    });
    http_.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
      res.set_content(metrics_.text(scheduler_.queued(), state_ == "ok"),
                      "text/plain; version=0.0.4");
    });
    auto model_object = [this] {
      nlohmann::json lora = nlohmann::json::array();
      for (const auto& l : plan_.lora) {
        lora.push_back({{"name", l.name},
                        {"scale", l.scale},
                        {"mode", plan_.lora_fused ? "fused" : "unfused"}});
      }
      return nlohmann::json{{"id", plan_.spec->id},
                            {"object", "model"},
                            {"created", started_unix_},
                            {"owned_by", "xfuser"},
                            {"lora", lora}};
    };
    http_.Get("/v1/models", [model_object](const httplib::Request&, httplib::Response& res) {
      answer_json(res, 200, {{"object", "list"}, {"data", {model_object()}}});
    });
    http_.Get(R"(/v1/models/([^/]+))",
              [this, model_object](const httplib::Request& req, httplib::Response& res) {
                if (auto e = check_model(req.matches[1])) return answer_error(res, *e);
                answer_json(res, 200, model_object());
              });
    http_.Post("/v1/images/generations",
               [this](const httplib::Request& req, httplib::Response& res) {
                 images(req, res, Endpoint::kImageGenerations);
               });
    http_.Post("/v1/images/edits", [this](const httplib::Request& req, httplib::Response& res) {
      images(req, res, Endpoint::kImageEdits);
    });
    http_.Post("/v1/videos", [this](const httplib::Request& req, httplib::Response& res) {
      create_video(req, res);
    });
    http_.Get("/v1/videos", [this](const httplib::Request&, httplib::Response& res) {
      nlohmann::json data = nlohmann::json::array();
      std::lock_guard<std::mutex> lock(videos_mutex_);
      for (const auto& [id, job] : videos_) {
        std::lock_guard<std::mutex> job_lock(job->mutex);
        data.push_back(video_object(*job));
      }
      answer_json(res, 200, {{"object", "list"}, {"data", data}});
    });
    http_.Get(R"(/v1/videos/([^/]+))", [this](const httplib::Request& req, httplib::Response& res) {
      auto job = find_video(req.matches[1]);
      if (!job) return video_not_found(res, req.matches[1]);
      std::lock_guard<std::mutex> lock(job->mutex);
      answer_json(res, 200, video_object(*job));
    });
    http_.Get(R"(/v1/videos/([^/]+)/content)", [this](const httplib::Request& req,
                                                      httplib::Response& res) {
      auto job = find_video(req.matches[1]);
      if (!job) return video_not_found(res, req.matches[1]);
      std::string path;
      {
        std::lock_guard<std::mutex> lock(job->mutex);
        if (job->state != JobState::kCompleted) {
          return answer_error(res, make_error(409,
                                              "video '" + job->id + "' is " +
                                                  job_state_name(job->state) + ", not completed",
                                              "invalid_request_error", "video_id", "not_ready"));
        }
        path = job->outputs.front();
      }
      serve_file(res, path, "video/mp4");
    });
    http_.Delete(R"(/v1/videos/([^/]+))", [this](const httplib::Request& req,
                                                 httplib::Response& res) {
      auto job = find_video(req.matches[1]);
      if (!job) return video_not_found(res, req.matches[1]);
      scheduler_.cancel(job->id);  // queued: cancelled now
      std::lock_guard<std::mutex> lock(job->mutex);
      if (job->state == JobState::kRunning) {
        return answer_error(res, make_error(409,
                                            "video '" + job->id +
                                                "' is being generated on every rank and cannot be "
                                                "stopped midway; delete it once completed",
                                            "invalid_request_error", "video_id", "in_progress"));
      }
      for (const auto& path : job->outputs) {
        std::error_code ec;
        fs::remove(path, ec);
      }
      {
        std::lock_guard<std::mutex> videos_lock(videos_mutex_);
        videos_.erase(job->id);
      }
      answer_json(res, 200, {{"id", job->id}, {"object", "video.deleted"}, {"deleted", true}});
    });
    // Pictures answered as URLs: only the service's own files, by name.
    http_.Get(R"(/v1/files/(img_[0-9a-f]+_[0-9]+\.png))",
              [this](const httplib::Request& req, httplib::Response& res) {
                serve_file(res, output_dir_ / std::string(req.matches[1]), "image/png");
              });
  }

  void serve_file(httplib::Response& res, const fs::path& path, const char* type) {
    std::ifstream in(path, std::ios::binary);
    if (!in) {
      return answer_error(res, make_error(404, "no file '" + path.filename().string() + "'",
                                          "invalid_request_error", "", "not_found"));
    }
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    res.set_content(std::move(bytes), type);
  }

 public:
  void set_resolve_mutex(std::mutex* m) { resolve_mutex_ = m; }

 private:
  const RunConfig& run_;
  const ServeConfig config_;
  Runner& runner_;
  const ResolvedArgs& plan_;
  parallel::Communicator* world_;
  Scheduler scheduler_;
  Metrics metrics_;
  httplib::Server http_;
  std::thread listener_;
  int port_ = 0;
  bool video_ = false;
  bool edits_ = false;
  fs::path output_dir_;
  fs::path input_dir_;
  std::mutex* resolve_mutex_ = nullptr;
  std::atomic<int> active_{0};
  std::atomic<double> last_batch_seconds_{0};
  int64_t started_unix_ = unix_now();
  // "loading", "ok", "draining", "unhealthy".
  struct State {
    mutable std::mutex m;
    std::string s = "loading";
    State& operator=(const std::string& v) {
      std::lock_guard<std::mutex> l(m);
      s = v;
      return *this;
    }
    operator std::string() const {
      std::lock_guard<std::mutex> l(m);
      return s;
    }
    bool operator==(const char* v) const { return std::string(*this) == v; }
    bool operator!=(const char* v) const { return !(*this == v); }
  } state_;
  std::mutex running_mutex_;
  std::vector<std::shared_ptr<Job>> running_;
  std::mutex videos_mutex_;
  std::map<std::string, std::shared_ptr<Job>> videos_;
};

}  // namespace

void add_serve_flags(CLI::App& app, ServeConfig& c) {
  const char* group = "Serving";
  app.add_option("--host", c.host, "address to listen on (default loopback only)")->group(group);
  app.add_option("--port", c.port, "TCP port (0: any free port, see --port_file)")
      ->check(CLI::Range(0, 65535))
      ->group(group);
  app.add_option("--port_file", c.port_file, "write the bound port to this file once listening")
      ->group(group);
  app.add_option("--api_key", c.api_key,
                 "require 'Authorization: Bearer KEY' on every endpoint but /health (default: "
                 "$XFUSER_API_KEY, else none)")
      ->group(group);
  app.add_option("--max_queue", c.max_queue, "jobs queued before requests get HTTP 429")
      ->check(CLI::Range(1, 100000))
      ->group(group);
  app.add_option("--max_batch_size", c.max_batch_size,
                 "images (same size and parameters) generated together")
      ->check(CLI::Range(1, 4096))
      ->group(group);
  app.add_option("--batch_wait_ms", c.batch_wait_ms,
                 "how long a batch waits for more same-shape requests")
      ->check(CLI::Range(0, 60000))
      ->group(group);
  app.add_option("--max_n", c.max_n, "the most images one request may ask for (n)")
      ->check(CLI::Range(1, 4096))
      ->group(group);
  app.add_option("--request_timeout", c.request_timeout,
                 "seconds an image request waits for its pictures (HTTP 504 after)")
      ->check(CLI::Range(0.001, 1e9))
      ->group(group);
  app.add_option("--max_request_bytes", c.max_request_bytes,
                 "the largest request body (HTTP 413 above)")
      ->check(CLI::Range(int64_t{1024}, int64_t{1} << 40))
      ->group(group);
}

int serve(const RunConfig& given_run, const ServeConfig& given) {
  ServeConfig config = given;
  if (config.api_key.empty()) {
    if (const char* key = std::getenv("XFUSER_API_KEY")) config.api_key = key;
  }
  RunConfig run = given_run;
  parallel::MpiEnvironment mpi(nullptr, nullptr);
  install_fault_handlers(mpi.rank());
  set_stop_meaning(
      mpi.rank() == 0
          ? "draining: running and queued requests finish, new ones get 503, then exit 0"
          : "ignored here: rank 0 decides when the service ends");
  if (mpi.size() > 1) start_parent_watchdog();
  init_logging(mpi.rank(), run.log_level);
  // Flags of a batch run have no meaning for a service: named, not ignored.
  for (const auto& [given_flag, name] :
       {std::pair{!run.dataset_path.empty(), "--dataset_path"}, std::pair{run.resume, "--resume"},
        std::pair{run.profile, "--profile"}, std::pair{run.batch_size.has_value(), "--batch_size"},
        std::pair{!run.latents.empty(), "--latents"}, std::pair{run.save_latents, "--save_latents"},
        std::pair{run.pipefusion_psnr, "--pipefusion_psnr"}, std::pair{run.dry_run, "--dry_run"},
        std::pair{run.num_iterations != 1, "--num_iterations"},
        std::pair{run.warmup_calls != 0, "--warmup_calls"},
        std::pair{!run.prompt.empty(), "--prompt"},
        std::pair{!run.negative_prompt.empty(), "--negative_prompt"},
        std::pair{!run.input_images.empty(), "--input_images"}}) {
    XF_CHECK(!given_flag, "xfuser serve: ", name,
             " is a flag of a run, not of the service (requests carry their own inputs)");
  }
  XF_CHECK(run.data_parallel_degree == 1, "xfuser serve: --data_parallel_degree ",
           run.data_parallel_degree,
           " is not supported: every rank runs each batch together (start one service per "
           "replica behind a load balancer)");
  validate_values(run);
  // The other ranks wait for the next batch in a collective bounded by --comm_timeout; rank 0
  // sends a heartbeat between batches, but not while a batch waits for more requests.
  XF_CHECK(config.batch_wait_ms / 1000.0 < run.comm_timeout / 2, "xfuser serve: --batch_wait_ms ",
           config.batch_wait_ms, " must be under half of --comm_timeout (", run.comm_timeout,
           " s): the other ranks would time out waiting for the batch");
  std::shared_ptr<parallel::ProcessGroups> groups = make_process_groups(run, mpi);
  track_host_tensor_memory();
  configure_threads(mpi.local_size());
  parallel::Communicator* world = groups ? &groups->world() : nullptr;

  Runner runner(run, groups);
  const ResolvedArgs plan = runner.resolve_plan();
  std::unique_ptr<Service> service;
  std::mutex resolve_mutex;
  if (mpi.rank() == 0) {
    service = std::make_unique<Service>(run, config, runner, plan, world);
    service->set_resolve_mutex(&resolve_mutex);
    service->start();
  }
  runner.initialize(plan);
  // The rank that holds the decoded pictures sends them to rank 0.
  int writer = 0;
  if (world) {
    at::Tensor w = at::full({1}, runner.writes_images() ? world->rank() : -1, at::kLong);
    world->all_reduce(w, parallel::ReduceOp::kMax);
    writer = static_cast<int>(w.item<int64_t>());
  }
  // Progress for the video jobs; no stop between steps: a drain finishes the running batch.
  Service* s = service.get();
  runner.model().set_step_callback([s](int step, int total) {
    if (s) s->progress(step, total);
  });
  if (world) world->barrier();  // every rank loaded: ready
  const fs::path input_dir =
      fs::path(run.output_directory) / ".serve-inputs" / ("rank" + std::to_string(mpi.rank()));
  if (service) {
    service->set_ready();
    service->loop(resolve_mutex, writer);
  } else {
    std::string json, pictures;
    for (;;) {
      const int64_t op = exchange(world, kIdle, &json, &pictures);
      if (op == kIdle) continue;
      if (op == kExit) break;
      run_batch(runner, plan, resolve_mutex, nlohmann::json::parse(json), pictures, input_dir,
                world, writer);
    }
  }
  spdlog::info("drained: every queued request answered; exiting");
  runner.cleanup();
  return 0;
}

}  // namespace xfuser::runner::serve
