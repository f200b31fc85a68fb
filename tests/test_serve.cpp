// `xfuser serve` (runner/serve/): the request parser, the queue and its batching, the metrics;
// then the service itself, started under its own process (and under mpirun at 2 ranks), called
// over HTTP: its pictures and videos equal xfuser-run's given the same parameters pixel for pixel,
// every bad request is a 4xx naming the field and the service goes on, a full queue is a 429, a
// SIGTERM drains (queued requests answered, exit 0), a failing rank ends every rank. The official
// `openai` Python client is used where a Python with it is found ($XFUSER_TEST_PYTHON, else
// python3).
#include <httplib.h>

#include <chrono>
#include <fstream>
#include <future>
#include <regex>
#include <thread>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "backends/base64.h"
#include "runner/outputs.h"
#include "runner/serve/api.h"
#include "runner/serve/scheduler.h"
#include "runner/video.h"
#include "tests/background_job.h"
#include "tests/test_util.h"

namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using namespace xfuser::runner::serve;
using namespace std::chrono_literals;

// ---- the request parser ----

std::optional<ApiError> parse(const json& body, Endpoint endpoint, ParsedRequest* out,
                              bool form = false) {
  return parse_request(body, endpoint, /*max_n=*/4, /*default_fps=*/16, form, out);
}

TEST(ServeApi, ReadsAnImageRequest) {
  ParsedRequest r;
  ASSERT_FALSE(parse({{"prompt", "a cat"},
                      {"model", "tiny-shapes"},
                      {"n", 2},
                      {"size", "256x128"},
                      {"seed", -3},
                      {"response_format", "url"},
                      {"negative_prompt", "dog"},
                      {"num_inference_steps", 7},
                      {"guidance_scale", 2.5},
                      {"user", "someone"}},
                     Endpoint::kImageGenerations, &r));
  EXPECT_EQ(r.inputs.prompt, "a cat");
  EXPECT_EQ(r.model, "tiny-shapes");
  EXPECT_EQ(r.inputs.n, 2);
  EXPECT_EQ(r.inputs.width, 256);
  EXPECT_EQ(r.inputs.height, 128);
  EXPECT_EQ(r.inputs.seed, -3);
  EXPECT_EQ(r.response_format, "url");
  EXPECT_EQ(r.inputs.negative_prompt, "dog");
  EXPECT_EQ(r.inputs.num_inference_steps, 7);
  EXPECT_EQ(r.inputs.guidance_scale, 2.5);
}

TEST(ServeApi, NamesTheFieldOfEveryRefusal) {
  const std::vector<std::pair<json, std::string>> cases = {
      {{{"n", 1}}, "prompt"},
      {{{"prompt", ""}}, "prompt"},
      {{{"prompt", 3}}, "prompt"},
      {{{"prompt", "x"}, {"n", 5}}, "n"},
      {{{"prompt", "x"}, {"n", 0}}, "n"},
      {{{"prompt", "x"}, {"n", 1.5}}, "n"},
      {{{"prompt", "x"}, {"size", "big"}}, "size"},
      {{{"prompt", "x"}, {"size", "64x64x3"}}, "size"},
      {{{"prompt", "x"}, {"response_format", "jpeg"}}, "response_format"},
      {{{"prompt", "x"}, {"output_format", "webp"}}, "output_format"},
      {{{"prompt", "x"}, {"quality", "hd"}}, "quality"},
      {{{"prompt", "x"}, {"colour", "red"}}, "colour"},
      {{{"prompt", "x"}, {"seed", "7"}}, "seed"},
      {{{"prompt", "x"}, {"seed", 18446744073709551615ull}}, "seed"},
      {{{"prompt", "x"}, {"guidance_scale", "high"}}, "guidance_scale"},
      {{{"prompt", "x"}, {"num_inference_steps", 0}}, "num_inference_steps"},
      {{{"prompt", "x"}, {"num_frames", 9}}, "num_frames"},  // a video field
  };
  for (const auto& [body, param] : cases) {
    ParsedRequest r;
    const auto e = parse(body, Endpoint::kImageGenerations, &r);
    ASSERT_TRUE(e.has_value()) << body.dump();
    EXPECT_EQ(e->status, 400) << body.dump();
    EXPECT_EQ(e->param, param) << body.dump() << ": " << e->message;
    EXPECT_NE(e->message.find(param), std::string::npos) << e->message;
  }
  ParsedRequest r;
  EXPECT_TRUE(parse(json::array({1}), Endpoint::kImageGenerations, &r).has_value());
}

TEST(ServeApi, FormValuesAreReadAsNumbersAndSecondsBecomeFrames) {
  ParsedRequest r;
  ASSERT_FALSE(parse({{"prompt", "x"}, {"n", "2"}, {"guidance_scale", "1.5"}, {"seed", "9"}},
                     Endpoint::kImageEdits, &r, /*form=*/true));
  EXPECT_EQ(r.inputs.n, 2);
  EXPECT_EQ(r.inputs.guidance_scale, 1.5);
  EXPECT_EQ(r.inputs.seed, 9);
  // In JSON a number must be a number.
  EXPECT_TRUE(parse({{"prompt", "x"}, {"n", "2"}}, Endpoint::kImageGenerations, &r));
  // Videos: seconds (OpenAI sends a string) x fps + 1 frames; with num_frames it is ambiguous.
  ASSERT_FALSE(parse({{"prompt", "x"}, {"seconds", "4"}}, Endpoint::kVideos, &r));
  EXPECT_EQ(r.inputs.num_frames, 65);
  ASSERT_FALSE(parse({{"prompt", "x"}, {"seconds", 2}, {"fps", 8}}, Endpoint::kVideos, &r));
  EXPECT_EQ(r.inputs.num_frames, 17);
  const auto e =
      parse({{"prompt", "x"}, {"seconds", "1"}, {"num_frames", 9}}, Endpoint::kVideos, &r);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->param, "seconds");
  EXPECT_TRUE(parse({{"prompt", "x"}, {"n", 2}}, Endpoint::kVideos, &r).has_value());
}

TEST(ServeApi, ASeedLeftOutIsDrawnPerRequest) {
  ParsedRequest a, b;
  ASSERT_FALSE(parse({{"prompt", "x"}}, Endpoint::kImageGenerations, &a));
  ASSERT_FALSE(parse({{"prompt", "x"}}, Endpoint::kImageGenerations, &b));
  EXPECT_NE(a.inputs.seed, b.inputs.seed);
  EXPECT_GE(a.inputs.seed, 0);
}

TEST(ServeApi, ErrorObjectAndBase64) {
  ApiError e;
  e.message = "m";
  e.param = "size";
  const json body = error_body(e);
  EXPECT_EQ(body["error"]["message"], "m");
  EXPECT_EQ(body["error"]["param"], "size");
  EXPECT_EQ(body["error"]["type"], "invalid_request_error");
  EXPECT_TRUE(body["error"]["code"].is_null());
  EXPECT_EQ(xfuser::backends::base64_encode("Man"), "TWFu");
  EXPECT_EQ(xfuser::backends::base64_encode("Ma"), "TWE=");
  EXPECT_EQ(xfuser::backends::base64_encode("M"), "TQ==");
  EXPECT_EQ(xfuser::backends::base64_decode("TWE=", "test"), "Ma");
  EXPECT_EQ(picture_extension(std::string("\x89PNG\r\n\x1a\nxx", 10)), "png");
  EXPECT_EQ(picture_extension("\xFF\xD8\xFFxx"), "jpg");
  EXPECT_EQ(picture_extension("GIF89a"), "");
}

// ---- the queue ----

std::shared_ptr<Job> make_job(const std::string& id, int n = 1, int height = 64) {
  auto j = std::make_shared<Job>();
  j->id = id;
  j->inputs.prompt = id;
  j->inputs.n = n;
  j->inputs.height = height;
  return j;
}

std::vector<std::string> ids(const std::vector<std::shared_ptr<Job>>& batch) {
  std::vector<std::string> out;
  for (const auto& j : batch) out.push_back(j->id);
  return out;
}

TEST(ServeScheduler, BatchesSameShapeJobsInOrderUpToTheBatchSize) {
  Scheduler s(/*max_queue=*/8, /*max_batch_outputs=*/4, /*batch_wait=*/0ms);
  for (auto j : {make_job("a", 1), make_job("b", 1, 128), make_job("c", 2), make_job("d", 2),
                 make_job("e", 1)}) {
    ASSERT_EQ(s.submit(j), SubmitResult::kQueued);
  }
  // a (1) + c (2) fit; d (2) would make 5; e (1) makes 4.
  EXPECT_EQ(ids(s.next_batch(10ms)), (std::vector<std::string>{"a", "c", "e"}));
  EXPECT_EQ(ids(s.next_batch(10ms)), (std::vector<std::string>{"b"}));
  EXPECT_EQ(ids(s.next_batch(10ms)), (std::vector<std::string>{"d"}));
  EXPECT_TRUE(s.next_batch(10ms).empty());
}

TEST(ServeScheduler, AJobWithPicturesRunsAlone) {
  Scheduler s(8, 4, 0ms);
  auto a = make_job("a");
  a->inputs.pictures = {"png"};
  a->inputs.picture_extensions = {"png"};
  s.submit(a);
  s.submit(make_job("b"));
  EXPECT_EQ(ids(s.next_batch(10ms)), (std::vector<std::string>{"a"}));
  EXPECT_EQ(ids(s.next_batch(10ms)), (std::vector<std::string>{"b"}));
}

TEST(ServeScheduler, WaitsForMoreJobsOfTheShapeWithinTheBatchWait) {
  Scheduler s(8, 3, 2000ms);
  s.submit(make_job("a"));
  std::thread later([&] {
    std::this_thread::sleep_for(50ms);
    s.submit(make_job("b"));
    s.submit(make_job("c"));
  });
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(ids(s.next_batch(10ms)), (std::vector<std::string>{"a", "b", "c"}));
  // Full at 3: it did not wait out the 2 s.
  EXPECT_LT(std::chrono::steady_clock::now() - start, 1500ms);
  later.join();
}

TEST(ServeScheduler, FullClosedCancelledAndFailed) {
  Scheduler s(2, 4, 0ms);
  auto a = make_job("a"), b = make_job("b"), c = make_job("c");
  EXPECT_EQ(s.submit(a), SubmitResult::kQueued);
  EXPECT_EQ(s.submit(b), SubmitResult::kQueued);
  EXPECT_EQ(s.submit(c), SubmitResult::kFull);
  EXPECT_TRUE(s.cancel("a"));
  EXPECT_FALSE(s.cancel("a"));
  EXPECT_EQ(a->state, JobState::kCancelled);
  EXPECT_TRUE(a->wait_until(std::chrono::steady_clock::now()));
  s.close();
  EXPECT_EQ(s.submit(c), SubmitResult::kClosed);
  // A closed queue still hands out what it holds (a drain), then nothing at once.
  EXPECT_EQ(ids(s.next_batch(10ms)), (std::vector<std::string>{"b"}));
  EXPECT_EQ(b->state, JobState::kRunning);
  EXPECT_TRUE(s.next_batch(10s).empty());
  Scheduler t(4, 4, 0ms);
  auto d = make_job("d");
  t.submit(d);
  ApiError e;
  e.status = 503;
  t.fail_all(e);
  EXPECT_EQ(d->state, JobState::kFailed);
  EXPECT_EQ(d->error.status, 503);
  EXPECT_EQ(t.submit(make_job("e")), SubmitResult::kClosed);
}

TEST(ServeMetrics, PrometheusText) {
  Metrics m;
  m.request("/v1/images/generations", 200, 0.3);
  m.request("/v1/images/generations", 400, 0.001);
  m.batch(3, 16, 2.0);
  const std::string text = m.text(5, true);
  for (const char* line :
       {"xfuser_queue_length 5", "xfuser_healthy 1",
        "xfuser_requests_total{endpoint=\"/v1/images/generations\",status=\"200\"} 1",
        "xfuser_request_seconds_bucket{endpoint=\"/v1/images/generations\",le=\"0.1\"} 1",
        "xfuser_request_seconds_bucket{endpoint=\"/v1/images/generations\",le=\"0.5\"} 2",
        "xfuser_request_seconds_count{endpoint=\"/v1/images/generations\"} 2",
        "xfuser_batches_total{outputs=\"3\"} 1", "xfuser_steps_per_second 8"}) {
    EXPECT_NE(text.find(line), std::string::npos) << line << "\n" << text;
  }
}

// ---- the service ----

fs::path bin(const std::string& name) { return xfuser::testing::binary_dir() / "bin" / name; }

// One cache of built tiny models for every server and run of this test program.
const fs::path& model_cache() {
  static xfuser::testing::TempDir* dir = new xfuser::testing::TempDir();
  return dir->path();
}

std::string environment() {
  return "env XFUSER_CACHE=" + model_cache().string() + " OMP_NUM_THREADS=1 ";
}

// A running `xfuser serve`, its port read from --port_file once it listens.
class Server {
 public:
  Server(const std::string& flags, const fs::path& dir, const std::string& launcher = "")
      : dir_(dir), out_(dir / "out") {
    const std::string command = environment() + launcher + bin("xfuser").string() + " serve " +
                                flags + " --port 0 --port_file " + (dir / "port").string() +
                                " --output_directory " + out_.string();
    job_ = std::make_unique<xfuser::testing::Job>(command, dir / "serve.log");
  }
  // Waits until /health answers 200; false when the service ended or took longer.
  bool wait_ready(double seconds = 120) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    while (std::chrono::steady_clock::now() < deadline) {
      if (job_->finished()) return false;
      std::ifstream in(dir_ / "port");
      if (in >> port_) {
        httplib::Client c("127.0.0.1", port_);
        auto r = c.Get("/health");
        if (r && r->status == 200) return true;
      }
      std::this_thread::sleep_for(100ms);
    }
    return false;
  }
  httplib::Client client(const std::string& key = "") const {
    httplib::Client c("127.0.0.1", port_);
    c.set_read_timeout(300, 0);
    if (!key.empty()) c.set_bearer_token_auth(key);
    return c;
  }
  std::string base_url() const { return "http://127.0.0.1:" + std::to_string(port_) + "/v1"; }
  int port() const { return port_; }
  xfuser::testing::Job& job() { return *job_; }
  const fs::path& out() const { return out_; }

 private:
  fs::path dir_;
  fs::path out_;
  int port_ = 0;
  std::unique_ptr<xfuser::testing::Job> job_;
};

httplib::Result post_json(httplib::Client& c, const std::string& path, const json& body) {
  return c.Post(path.c_str(), body.dump(), "application/json");
}

// The pictures of an images response, decoded.
std::vector<at::Tensor> pictures(const httplib::Result& r, const fs::path& dir) {
  std::vector<at::Tensor> out;
  const json body = json::parse(r->body);
  for (size_t k = 0; k < body["data"].size(); ++k) {
    const fs::path path = dir / ("answer_" + std::to_string(k) + ".png");
    xfuser::runner::write_file_atomic(
        path, xfuser::backends::base64_decode(body["data"][k]["b64_json"], "b64_json"));
    out.push_back(xfuser::runner::read_png(path));
  }
  return out;
}

// xfuser-run's picture (or video frames) for the same parameters.
at::Tensor xfuser_run(const std::string& flags, const fs::path& dir, bool video = false,
                      const std::string& launcher = "") {
  fs::create_directories(dir);
  std::string output;
  const int code =
      xfuser::testing::run_command(environment() + launcher + bin("xfuser-run").string() + " " +
                                       flags + " --output_directory " + dir.string(),
                                   &output);
  EXPECT_EQ(code, 0) << output;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string ext = e.path().extension().string();
    if (!video && ext == ".png") return xfuser::runner::read_png(e.path());
    if (video && ext == ".mp4") return xfuser::runner::read_video_frames(e.path());
  }
  ADD_FAILURE() << "xfuser-run wrote nothing into " << dir << "\n" << output;
  return at::Tensor();
}

void expect_error(const httplib::Result& r, int status, const std::string& param,
                  const std::string& contains = "") {
  ASSERT_TRUE(r) << "no answer";
  EXPECT_EQ(r->status, status) << r->body;
  json body;
  ASSERT_NO_THROW(body = json::parse(r->body)) << r->body;
  ASSERT_TRUE(body.contains("error")) << r->body;
  if (!param.empty()) {
    EXPECT_EQ(body["error"]["param"], param) << r->body;
  }
  if (!contains.empty()) {
    EXPECT_NE(body["error"]["message"].get<std::string>().find(contains), std::string::npos)
        << r->body;
  }
}

// A picture written to `file` as PNG; its bytes, as a client uploads them.
std::string png_upload(const at::Tensor& picture, const fs::path& file) {
  xfuser::runner::write_png(file, picture);
  std::ifstream in(file, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// Polls a video job until it completes or fails (or 2 minutes pass); its last object.
json wait_for_video(httplib::Client& c, const std::string& path) {
  json video;
  for (int i = 0; i < 1200; ++i) {
    auto r = c.Get(path.c_str());
    if (!r) break;
    video = json::parse(r->body);
    if (video["status"] == "completed" || video["status"] == "failed") break;
    std::this_thread::sleep_for(100ms);
  }
  return video;
}

std::string python() {
  const char* p = std::getenv("XFUSER_TEST_PYTHON");
  return p ? p : "python3";
}
bool python_has_openai() {
  return xfuser::testing::run_command(python() + " -c 'import openai'") == 0;
}

const std::string kPrompt = "a large red circle in the center on a blue background";

// kPrompt with each of `seeds`, generated by xfuser-run as one batch (a dataset of those rows,
// --batch_size their count, 8 steps): its pictures in row order, as one service request of n
// pictures draws them.
std::vector<at::Tensor> batch_run(const std::vector<int>& seeds, const fs::path& dir) {
  fs::create_directories(dir);
  std::string rows;
  for (int seed : seeds) rows += json({{"prompt", kPrompt}, {"seed", seed}}).dump() + "\n";
  xfuser::runner::write_file_atomic(dir / "rows.jsonl", rows);
  const fs::path out = dir / "out";
  std::string output;
  EXPECT_EQ(xfuser::testing::run_command(
                environment() + bin("xfuser-run").string() +
                    " --model tiny-shapes --dtype fp32 --num_inference_steps 8 --batch_size " +
                    std::to_string(seeds.size()) + " --dataset_path " +
                    (dir / "rows.jsonl").string() + " --output_directory " + out.string(),
                &output),
            0)
      << output;
  std::vector<at::Tensor> pictures;
  for (size_t k = 0; k < seeds.size(); ++k) {
    const fs::path file = out / ("tiny-shapes_u1r1_tc_False_96x96_" + std::to_string(k) + ".png");
    if (fs::exists(file)) pictures.push_back(xfuser::runner::read_png(file));
  }
  return pictures;
}

class ServeImages : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new xfuser::testing::TempDir();
    // fp32, not the CPU's default (bf16 where it has AVX512-BF16): a batch's pictures are
    // compared with one-prompt runs within a level or two, which bf16's rounding exceeds (up to
    // 12 levels measured on such a CPU).
    server_ = new Server(
        "--model tiny-shapes --dtype fp32 --api_key sekret --max_batch_size 4 --batch_wait_ms 300 "
        "--max_request_bytes 1048576",
        dir_->path());
    ready_ = server_->wait_ready();
  }
  static void TearDownTestSuite() {
    delete server_;
    delete dir_;
  }
  void SetUp() override { ASSERT_TRUE(ready_) << server_->job().log(); }
  static xfuser::testing::TempDir* dir_;
  static Server* server_;
  static bool ready_;
};
xfuser::testing::TempDir* ServeImages::dir_ = nullptr;
Server* ServeImages::server_ = nullptr;
bool ServeImages::ready_ = false;

TEST_F(ServeImages, PicturesEqualXfuserRunPixelForPixel) {
  auto c = server_->client("sekret");
  auto r = post_json(c, "/v1/images/generations",
                     {{"prompt", kPrompt}, {"n", 2}, {"seed", 7}, {"num_inference_steps", 8}});
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const json body = json::parse(r->body);
  EXPECT_EQ(body["data"][0]["seed"], 7);
  EXPECT_EQ(body["data"][1]["seed"], 8);
  EXPECT_EQ(body["size"], "96x96");
  xfuser::testing::TempDir work;
  const auto answers = pictures(r, work.path());
  ASSERT_EQ(answers.size(), 2u);
  const auto run = batch_run({7, 8}, work.path() / "run");
  ASSERT_EQ(run.size(), 2u);
  for (int k = 0; k < 2; ++k) {
    EXPECT_TRUE(at::equal(answers[k], run[k])) << "output " << k;
  }
  // A one-prompt run of the second row stays within two levels of it (a batch's matrix products
  // may round differently from a single row's).
  const at::Tensor alone = xfuser_run(
      "--model tiny-shapes --dtype fp32 --num_inference_steps 8 --seed 8 "
      "--prompt \"" +
          kPrompt + "\"",
      work.path() / "alone");
  EXPECT_LE((alone.to(at::kInt) - answers[1].to(at::kInt)).abs().max().item<int>(), 2);
  // The PNG records the generation as xfuser-run's does.
  std::map<std::string, std::string> text;
  xfuser::runner::read_png(work.path() / "answer_1.png", &text);
  EXPECT_EQ(text["seed"], "8");
  EXPECT_EQ(text["prompt"], kPrompt);
}

TEST_F(ServeImages, ConcurrentSameShapeRequestsShareOneGenerationAndKeepTheirPictures) {
  std::vector<std::future<httplib::Result>> answers;
  for (int k = 0; k < 3; ++k) {
    answers.push_back(std::async(std::launch::async, [k] {
      auto c = server_->client("sekret");
      return post_json(c, "/v1/images/generations",
                       {{"prompt", kPrompt}, {"seed", 100 + k}, {"num_inference_steps", 5}});
    }));
  }
  xfuser::testing::TempDir work;
  std::vector<at::Tensor> batched;
  for (auto& a : answers) {
    auto r = a.get();
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    batched.push_back(pictures(r, work.path()).front());
  }
  auto c = server_->client("sekret");
  auto metrics = c.Get("/metrics");
  ASSERT_TRUE(metrics);
  EXPECT_TRUE(
      std::regex_search(metrics->body, std::regex("xfuser_batches_total\\{outputs=\"[23]\"\\}")))
      << metrics->body;
  // Alone, each request gives the picture it got in the batch.
  for (int k = 0; k < 3; ++k) {
    auto r = post_json(c, "/v1/images/generations",
                       {{"prompt", kPrompt}, {"seed", 100 + k}, {"num_inference_steps", 5}});
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200);
    const at::Tensor alone = pictures(r, work.path()).front();
    EXPECT_LE((alone.to(at::kInt) - batched[k].to(at::kInt)).abs().max().item<int>(), 1)
        << "request " << k;
  }
}

TEST_F(ServeImages, UrlAnswersAreFilesOfTheOutputFolder) {
  auto c = server_->client("sekret");
  auto r = post_json(
      c, "/v1/images/generations",
      {{"prompt", kPrompt}, {"seed", 3}, {"num_inference_steps", 4}, {"response_format", "url"}});
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const std::string url = json::parse(r->body)["data"][0]["url"];
  const std::string path = url.substr(url.find("/v1/files/"));
  auto file = c.Get(path.c_str());
  ASSERT_TRUE(file);
  EXPECT_EQ(file->status, 200);
  EXPECT_EQ(file->get_header_value("Content-Type"), "image/png");
  EXPECT_TRUE(fs::exists(server_->out() / path.substr(std::string("/v1/files/").size())));
  // Nothing else of the folder is served.
  expect_error(c.Get("/v1/files/..%2Fserve.log"), 404, "");
  expect_error(c.Get("/v1/files/img_00_0.png"), 404, "");
}

TEST_F(ServeImages, BadRequestsAre4xxNamingTheFieldAndTheServiceGoesOn) {
  auto c = server_->client("sekret");
  expect_error(post_json(c, "/v1/images/generations", {{"prompt", "x"}, {"size", "100x100"}}), 400,
               "size", "multiple of 16");
  expect_error(post_json(c, "/v1/images/generations", {{"prompt", "x"}, {"colour", 1}}), 400,
               "colour");
  expect_error(post_json(c, "/v1/images/generations", {{"prompt", "x"}, {"n", 99}}), 400, "n");
  expect_error(post_json(c, "/v1/images/generations", {{"prompt", "x"}, {"guidance_scale_2", 1}}),
               400, "guidance_scale_2");
  expect_error(post_json(c, "/v1/images/generations", {{"prompt", "x"}, {"model", "dall-e-3"}}),
               404, "model", "tiny-shapes");
  expect_error(c.Post("/v1/images/generations", "{\"prompt\": ", "application/json"), 400, "",
               "not valid JSON");
  expect_error(
      c.Post("/v1/images/generations", "--xx\r\nbroken", "multipart/form-data; boundary=xx"), 400,
      "");
  expect_error(post_json(c, "/v1/images/generations",
                         {{"prompt", "x"}, {"negative_prompt", "y"}, {"true_cfg_scale", "2"}}),
               400, "true_cfg_scale");
  // Bodies over --max_request_bytes (1 MiB here): 413, read no further.
  expect_error(post_json(c, "/v1/images/generations", {{"prompt", std::string(2 << 20, 'a')}}), 413,
               "");
  // Edits need a model that takes pictures; videos a video model.
  httplib::MultipartFormDataItems form = {{"prompt", "x", "", ""},
                                          {"image", "\x89PNG\r\n\x1a\n", "a.png", "image/png"}};
  expect_error(c.Post("/v1/images/edits", form), 400, "image", "no edits");
  expect_error(post_json(c, "/v1/videos", {{"prompt", "x"}}), 400, "model", "/v1/images");
  expect_error(c.Get("/v1/nothing"), 404, "");
  // Still serving.
  auto r =
      post_json(c, "/v1/images/generations", {{"prompt", kPrompt}, {"num_inference_steps", 2}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body;
  auto metrics = c.Get("/metrics");
  ASSERT_TRUE(metrics);
  EXPECT_NE(metrics->body.find("status=\"400\""), std::string::npos);
  EXPECT_NE(metrics->body.find("status=\"413\""), std::string::npos) << metrics->body;
}

TEST_F(ServeImages, TheApiKeyIsRequiredEverywhereButHealth) {
  auto anonymous = server_->client();
  expect_error(post_json(anonymous, "/v1/images/generations", {{"prompt", "x"}}), 401, "",
               "API key");
  expect_error(anonymous.Get("/v1/models"), 401, "");
  auto wrong = server_->client("guess");
  expect_error(wrong.Get("/metrics"), 401, "");
  auto health = anonymous.Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
  EXPECT_EQ(json::parse(health->body)["status"], "ok");
  auto c = server_->client("sekret");
  auto models = c.Get("/v1/models");
  ASSERT_TRUE(models);
  ASSERT_EQ(models->status, 200);
  EXPECT_EQ(json::parse(models->body)["data"][0]["id"], "tiny-shapes");
}

TEST_F(ServeImages, TheOpenAiPythonClientWorksUnchanged) {
  if (!python_has_openai()) {
    GTEST_SKIP() << python() << " has no `openai` package (set XFUSER_TEST_PYTHON to one that has)";
  }
  xfuser::testing::TempDir work;
  std::string output;
  ASSERT_EQ(xfuser::testing::run_command(
                python() + " " +
                    (xfuser::testing::source_dir() / "tests/serve_openai_client.py").string() +
                    " " + server_->base_url() + " sekret images " + work.path().string(),
                &output),
            0)
      << output;
  const json seen = json::parse(output.substr(output.rfind("\n{") + 1));
  EXPECT_EQ(seen["b64_images"], 2);
  EXPECT_EQ(seen["bad_request"]["status"], 400);
  EXPECT_EQ(seen["bad_request"]["param"], "size");
  // The two base64 pictures came from one request of n=2, so one batch: xfuser-run's batch of
  // the same rows. The URL picture came alone: a one-prompt run.
  const auto run = batch_run({11, 12}, work.path() / "run");
  ASSERT_EQ(run.size(), 2u);
  for (int k = 0; k < 2; ++k) {
    EXPECT_TRUE(at::equal(
        xfuser::runner::read_png(work.path() / ("openai_" + std::to_string(k) + ".png")), run[k]))
        << "output " << k;
  }
  const at::Tensor alone =
      xfuser_run("--model tiny-shapes --dtype fp32 --num_inference_steps 8 --seed 11 --prompt \"" +
                     kPrompt + "\"",
                 work.path() / "alone");
  EXPECT_TRUE(at::equal(xfuser::runner::read_png(work.path() / "openai_url.png"), alone));
}

TEST(Serve, AFullQueueIs429WithRetryAfterAndAnAbandonedJobLeavesIt) {
  xfuser::testing::TempDir dir;
  Server server(
      "--model tiny-shapes --max_queue 1 --max_batch_size 1 --batch_wait_ms 0 "
      "--request_timeout 60",
      dir.path());
  ASSERT_TRUE(server.wait_ready()) << server.job().log();
  // One running (many steps), one queued, the third refused.
  auto slow = [&](int seed) {
    return std::async(std::launch::async, [&server, seed] {
      auto c = server.client();
      return post_json(c, "/v1/images/generations",
                       {{"prompt", kPrompt}, {"seed", seed}, {"num_inference_steps", 300}});
    });
  };
  // Waits until /health reports `running` jobs generating and `queued` waiting.
  auto wait_for = [&server](int running, int queued) {
    auto c = server.client();
    for (int i = 0; i < 3000; ++i) {
      auto h = c.Get("/health");
      if (h) {
        const json body = json::parse(h->body);
        if (body["running"] == running && body["queued"] == queued) return true;
      }
      std::this_thread::sleep_for(10ms);
    }
    return false;
  };
  auto first = slow(1);
  ASSERT_TRUE(wait_for(1, 0));
  auto second = slow(2);
  ASSERT_TRUE(wait_for(1, 1));
  auto c = server.client();
  auto third = post_json(c, "/v1/images/generations", {{"prompt", kPrompt}});
  expect_error(third, 429, "", "queue is full");
  EXPECT_FALSE(third->get_header_value("Retry-After").empty());
  EXPECT_EQ(first.get()->status, 200);
  EXPECT_EQ(second.get()->status, 200);
  // A client that gives up while its job waits: the job leaves the queue at once.
  auto running = slow(3);
  ASSERT_TRUE(wait_for(1, 0));
  {
    httplib::Client impatient("127.0.0.1", server.port());
    impatient.set_read_timeout(1, 0);
    auto r = post_json(impatient, "/v1/images/generations", {{"prompt", kPrompt}});
    EXPECT_FALSE(r) << "answered although the queue was behind a 300-step job";
  }
  EXPECT_TRUE(wait_for(1, 0)) << "the abandoned job stayed queued";
  EXPECT_EQ(running.get()->status, 200);
  EXPECT_NE(server.job().log().find("the client went away"), std::string::npos)
      << server.job().log();
}

TEST(Serve, SigtermDrainsQueuedRequestsAndExitsZero) {
  xfuser::testing::TempDir dir;
  Server server("--model tiny-shapes --max_batch_size 1", dir.path());
  ASSERT_TRUE(server.wait_ready()) << server.job().log();
  std::vector<std::future<httplib::Result>> answers;
  for (int k = 0; k < 3; ++k) {
    answers.push_back(std::async(std::launch::async, [&server, k] {
      auto c = server.client();
      return post_json(c, "/v1/images/generations",
                       {{"prompt", kPrompt}, {"seed", k}, {"num_inference_steps", 40}});
    }));
  }
  std::this_thread::sleep_for(1500ms);
  ASSERT_EQ(::kill(server.job().pid(), SIGTERM), 0);
  std::this_thread::sleep_for(200ms);
  auto c = server.client();
  auto late = post_json(c, "/v1/images/generations", {{"prompt", kPrompt}});
  if (late) {
    expect_error(late, 503, "", "shutting down");  // (or the listener is gone)
  }
  for (auto& a : answers) {
    auto r = a.get();
    ASSERT_TRUE(r) << server.job().log();
    EXPECT_EQ(r->status, 200) << r->body;
  }
  ASSERT_TRUE(server.job().wait(60)) << server.job().log();
  EXPECT_EQ(server.job().exit_code(), 0) << server.job().log();
  const std::string log = server.job().log();
  EXPECT_NE(log.find("received SIGTERM: draining"), std::string::npos) << log;
  EXPECT_NE(log.find("drained"), std::string::npos) << log;
  // Nothing half-written is left in the output folder.
  for (const auto& e : fs::recursive_directory_iterator(server.out())) {
    EXPECT_EQ(e.path().filename().string().find(".tmp"), std::string::npos) << e.path();
  }
}

TEST(Serve, VideoJobsMatchXfuserRunAndAreDeletable) {
  xfuser::testing::TempDir dir;
  Server server("--model tiny-wan", dir.path());
  ASSERT_TRUE(server.wait_ready()) << server.job().log();
  auto c = server.client();
  auto created = post_json(c, "/v1/videos", {{"prompt", "a cat"}, {"seed", 5}, {"num_frames", 9}});
  ASSERT_TRUE(created);
  ASSERT_EQ(created->status, 200) << created->body;
  json video = json::parse(created->body);
  EXPECT_EQ(video["object"], "video");
  EXPECT_EQ(video["size"], "48x32");
  EXPECT_EQ(video["seconds"], "0.5");
  const std::string id = video["id"];
  const std::string path = "/v1/videos/" + id;
  video = wait_for_video(c, path);
  ASSERT_EQ(video["status"], "completed") << video.dump();
  EXPECT_EQ(video["progress"], 100);
  auto content = c.Get((path + "/content").c_str());
  ASSERT_TRUE(content);
  ASSERT_EQ(content->status, 200);
  EXPECT_EQ(content->get_header_value("Content-Type"), "video/mp4");
  xfuser::testing::TempDir work;
  xfuser::runner::write_file_atomic(work.path() / "served.mp4", content->body);
  const at::Tensor expected =
      xfuser_run("--model tiny-wan --prompt \"a cat\" --seed 5 --num_frames 9", work.path() / "run",
                 /*video=*/true);
  EXPECT_TRUE(at::equal(xfuser::runner::read_video_frames(work.path() / "served.mp4"), expected));
  expect_error(post_json(c, "/v1/videos", {{"prompt", "x"}, {"size", "50x32"}}), 400, "size");
  expect_error(post_json(c, "/v1/images/generations", {{"prompt", "x"}}), 400, "model",
               "/v1/videos");
  auto list = c.Get("/v1/videos");
  ASSERT_TRUE(list);
  EXPECT_EQ(json::parse(list->body)["data"].size(), 1u);
  auto deleted = c.Delete(path.c_str());
  ASSERT_TRUE(deleted);
  EXPECT_EQ(json::parse(deleted->body)["deleted"], true);
  expect_error(c.Get(path.c_str()), 404, "video_id");
  EXPECT_FALSE(fs::exists(server.out() / (id + "_0.mp4")));
  if (python_has_openai()) {
    std::string output;
    ASSERT_EQ(xfuser::testing::run_command(
                  python() + " " +
                      (xfuser::testing::source_dir() / "tests/serve_openai_client.py").string() +
                      " " + server.base_url() + " none videos " + work.path().string(),
                  &output),
              0)
        << output;
    EXPECT_TRUE(at::equal(xfuser::runner::read_video_frames(work.path() / "openai.mp4"), expected));
  }
}

TEST(Serve, EditsTakeTheUploadedPictureAsXfuserRunTakesTheFile) {
  xfuser::testing::TempDir dir, work;
  Server server("--model tiny-flux2", dir.path());
  ASSERT_TRUE(server.wait_ready()) << server.job().log();
  // A picture to edit.
  const at::Tensor picture =
      at::arange(64 * 64 * 3, at::kInt).remainder(251).to(at::kByte).reshape({64, 64, 3});
  const fs::path file = work.path() / "in.png";
  const std::string bytes = png_upload(picture, file);
  auto c = server.client();
  httplib::MultipartFormDataItems form = {{"prompt", "make it red", "", ""},
                                          {"seed", "4", "", ""},
                                          {"image", bytes, "in.png", "image/png"}};
  auto r = c.Post("/v1/images/edits", form);
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const at::Tensor expected = xfuser_run(
      "--model tiny-flux2 --prompt \"make it red\" --seed 4 --input_images " + file.string(),
      work.path() / "run");
  EXPECT_TRUE(at::equal(pictures(r, work.path()).front(), expected));
  httplib::MultipartFormDataItems not_a_picture = {{"prompt", "x", "", ""},
                                                   {"image", "hello", "a.txt", "text/plain"}};
  expect_error(c.Post("/v1/images/edits", not_a_picture), 400, "image", "not a PNG or JPEG");
  expect_error(c.Post("/v1/images/edits", httplib::MultipartFormDataItems{{"prompt", "x", "", ""}}),
               400, "image");
}

TEST(Serve, AVideoFromAFirstFrameTakesTheUploadedPicture) {
  xfuser::testing::TempDir dir, work;
  Server server("--model tiny-wan-i2v", dir.path());
  ASSERT_TRUE(server.wait_ready()) << server.job().log();
  const at::Tensor picture =
      at::arange(32 * 48 * 3, at::kInt).remainder(199).to(at::kByte).reshape({32, 48, 3});
  const fs::path file = work.path() / "first.png";
  const std::string bytes = png_upload(picture, file);
  auto c = server.client();
  httplib::MultipartFormDataItems form = {{"prompt", "a cat", "", ""},
                                          {"seed", "9", "", ""},
                                          {"num_frames", "5", "", ""},
                                          {"input_reference", bytes, "first.png", "image/png"}};
  auto created = c.Post("/v1/videos", form);
  ASSERT_TRUE(created);
  ASSERT_EQ(created->status, 200) << created->body;
  const std::string path = "/v1/videos/" + json::parse(created->body)["id"].get<std::string>();
  const json video = wait_for_video(c, path);
  ASSERT_EQ(video["status"], "completed") << video.dump();
  auto content = c.Get((path + "/content").c_str());
  ASSERT_TRUE(content);
  xfuser::runner::write_file_atomic(work.path() / "served.mp4", content->body);
  const at::Tensor expected = xfuser_run(
      "--model tiny-wan-i2v --prompt \"a cat\" --seed 9 "
      "--num_frames 5 --input_images " +
          file.string(),
      work.path() / "run", /*video=*/true);
  EXPECT_TRUE(at::equal(xfuser::runner::read_video_frames(work.path() / "served.mp4"), expected));
  // The uploaded picture is not left behind.
  for (const auto& e : fs::recursive_directory_iterator(server.out())) {
    EXPECT_NE(e.path().extension(), ".png") << e.path();
  }
}

TEST(Serve, LoraScalesPerRequestEqualXfuserRunAtThatScale) {
  xfuser::testing::TempDir dir, work;
  const std::string adapter =
      (xfuser::testing::source_dir() / "examples/tiny_shapes/lora_night.safetensors").string();
  Server server("--model tiny-shapes --lora " + adapter + ":0.8 --lora_mode unfused", dir.path());
  ASSERT_TRUE(server.wait_ready()) << server.job().log();
  auto c = server.client();
  auto models = c.Get("/v1/models");
  ASSERT_TRUE(models);
  EXPECT_EQ(json::parse(models->body)["data"][0]["lora"][0]["name"], "lora_night") << models->body;
  const std::string prompt = "a large red circle in the center on a white background";
  for (const double scale : {0.8, 0.3}) {
    json body = {{"prompt", prompt}, {"seed", 2}, {"num_inference_steps", 6}};
    if (scale != 0.8) body["lora_scales"] = {{"lora_night", scale}};
    auto r = post_json(c, "/v1/images/generations", body);
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    char spec[32];
    std::snprintf(spec, sizeof(spec), ":%.1f", scale);
    const at::Tensor expected = xfuser_run(
        "--model tiny-shapes --lora " + adapter + spec +
            " --lora_mode unfused --seed 2 --num_inference_steps 6 --prompt \"" + prompt + "\"",
        work.path() / ("run" + std::string(spec + 1)));
    EXPECT_TRUE(at::equal(pictures(r, work.path()).front(), expected)) << "scale " << scale;
  }
  expect_error(post_json(c, "/v1/images/generations",
                         {{"prompt", prompt}, {"lora_scales", {{"lora_day", 1.0}}}}),
               400, "lora_scales", "lora_night");
  expect_error(post_json(c, "/v1/images/generations", {{"prompt", prompt}, {"lora_scales", 1}}),
               400, "lora_scales");
}

TEST(Serve, TwoRanksServeWhatXfuserRunMakesOnTheSameLayout) {
  xfuser::testing::TempDir dir, work;
  Server server("--model tiny-shapes --ulysses_degree 2", dir.path(),
                xfuser::testing::mpirun_prefix(2, 600));
  ASSERT_TRUE(server.wait_ready(240)) << server.job().log();
  auto c = server.client();
  auto r = post_json(c, "/v1/images/generations",
                     {{"prompt", kPrompt}, {"seed", 21}, {"num_inference_steps", 6}});
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const at::Tensor expected = xfuser_run(
      "--model tiny-shapes --ulysses_degree 2 --num_inference_steps 6 --seed 21 "
      "--prompt \"" +
          kPrompt + "\"",
      work.path() / "run", false, xfuser::testing::mpirun_prefix(2, 300));
  EXPECT_TRUE(at::equal(pictures(r, work.path()).front(), expected));
  auto health = c.Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
}

TEST(Serve, TwoRanksServeAVideoAsXfuserRunMakesIt) {
  xfuser::testing::TempDir dir, work;
  Server server("--model tiny-wan --ulysses_degree 2", dir.path(),
                xfuser::testing::mpirun_prefix(2, 600));
  ASSERT_TRUE(server.wait_ready(240)) << server.job().log();
  auto c = server.client();
  auto created = post_json(c, "/v1/videos", {{"prompt", "a cat"}, {"seed", 6}, {"num_frames", 5}});
  ASSERT_TRUE(created);
  ASSERT_EQ(created->status, 200) << created->body;
  const std::string path = "/v1/videos/" + json::parse(created->body)["id"].get<std::string>();
  const json video = wait_for_video(c, path);
  ASSERT_EQ(video["status"], "completed") << video.dump();
  auto content = c.Get((path + "/content").c_str());
  ASSERT_TRUE(content);
  xfuser::runner::write_file_atomic(work.path() / "served.mp4", content->body);
  const at::Tensor expected =
      xfuser_run("--model tiny-wan --ulysses_degree 2 --prompt \"a cat\" --seed 6 --num_frames 5",
                 work.path() / "run", /*video=*/true, xfuser::testing::mpirun_prefix(2, 300));
  EXPECT_TRUE(at::equal(xfuser::runner::read_video_frames(work.path() / "served.mp4"), expected));
}

TEST(Serve, ARankKilledMidRequestEndsEveryRank) {
  xfuser::testing::TempDir dir;
  // Rank 1 stalls in its first step (printing its pid) and is then killed with SIGKILL: no
  // message, no exception, only a peer gone.
  Server server("--model tiny-shapes --ulysses_degree 2 --comm_timeout 20", dir.path(),
                "env XFUSER_INJECT_FAILURE=1:1:stall " + xfuser::testing::mpirun_prefix(2, 600) +
                    "-x XFUSER_INJECT_FAILURE ");
  ASSERT_TRUE(server.wait_ready(240)) << server.job().log();
  auto answer = std::async(std::launch::async, [&server] {
    auto c = server.client();
    return post_json(c, "/v1/images/generations", {{"prompt", kPrompt}});
  });
  const std::string pid = server.job().wait_for_log("injected stall .* pid ([0-9]+)", 60);
  ASSERT_FALSE(pid.empty()) << server.job().log();
  ASSERT_EQ(::kill(std::stoi(pid), SIGKILL), 0);
  ASSERT_TRUE(server.job().wait(60)) << server.job().log();
  EXPECT_NE(server.job().exit_code(), 0);
  auto r = answer.get();
  if (r) {
    EXPECT_GE(r->status, 500) << r->body;
  }
}

TEST(Serve, AFailingRankEndsEveryRankWithANonZeroExit) {
  xfuser::testing::TempDir dir;
  // Rank 1 fails in its first denoising step: the request's generation cannot finish.
  Server server("--model tiny-shapes --ulysses_degree 2 --comm_timeout 20", dir.path(),
                "env XFUSER_INJECT_FAILURE=1:1 " + xfuser::testing::mpirun_prefix(2, 600) +
                    "-x XFUSER_INJECT_FAILURE ");
  ASSERT_TRUE(server.wait_ready(240)) << server.job().log();
  auto c = server.client();
  auto r = post_json(c, "/v1/images/generations", {{"prompt", kPrompt}});
  // The answer is a 500 naming the failure, or the connection ends with the job.
  if (r) {
    EXPECT_GE(r->status, 500) << r->body;
  }
  ASSERT_TRUE(server.job().wait(60)) << server.job().log();
  EXPECT_NE(server.job().exit_code(), 0);
  EXPECT_NE(server.job().log().find("injected failure"), std::string::npos) << server.job().log();
}

}  // namespace
