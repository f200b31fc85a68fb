// Bad inputs, named (the table is docs/errors.md): every case runs xfuser-run
// (or mpirun + xfuser-run) on a bad flag, checkpoint or environment and asserts the exit status
// is non-zero, the error text names the thing and what was expected, and nothing was written.
// Dataset inputs (missing, empty, bad CSV quoting, invalid UTF-8) belong to the dataset readers
// and are added with them.
#include <unistd.h>

#include <cmath>
#include <fstream>
#include <functional>
#include <sstream>

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "backends/error.h"
#include "models/weights/safetensors.h"
#include "runner/outputs.h"
#include "tests/test_util.h"

namespace {

namespace fs = std::filesystem;

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void write_file(const fs::path& p, const std::string& bytes) {
  std::ofstream(p, std::ios::binary | std::ios::trunc) << bytes;
}

std::string bin(const std::string& name) {
  return (xfuser::testing::binary_dir() / "bin" / name).string();
}

// A case: how to break the input (given a fresh copy of a tiny FLUX pipeline folder and an
// empty output folder) -> the command's arguments; and the texts the error must contain.
struct Case {
  std::string name;
  std::function<std::string(const fs::path& pipe, const fs::path& out)> args;
  std::vector<std::string> expected;
  int np = 1;  // > 1: under mpirun
  // Texts the output must not contain (e.g. "loading": the error comes before any weight).
  std::vector<std::string> absent = {};
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

const std::string kRun = " --model tiny-flux --prompt x --height 32 --width 32 ";

// Flags only: the embedded tiny model.
Case flags(const std::string& name, const std::string& args, std::vector<std::string> expected) {
  return {name,
          [args](const fs::path&, const fs::path& out) {
            return args + " --output_directory " + out.string();
          },
          std::move(expected)};
}

// A checkpoint edit on the pipeline copy, then a run from it.
Case pipeline(const std::string& name, std::function<void(const fs::path&)> edit,
              std::vector<std::string> expected) {
  return {name,
          [edit](const fs::path& pipe, const fs::path& out) {
            edit(pipe);
            return kRun + " --model_path " + pipe.string() + " --output_directory " + out.string();
          },
          std::move(expected)};
}

// Rewrites a safetensors file with `change` applied to its tensors.
void rewrite_tensors(const fs::path& file,
                     const std::function<void(std::map<std::string, at::Tensor>&)>& change) {
  std::map<std::string, at::Tensor> tensors;
  {
    xfuser::models::SafetensorsFile f(file.string());
    for (const auto& n : f.names()) tensors[n] = f.get(n).clone();
  }
  change(tensors);
  xfuser::models::save_safetensors(file.string(), tensors);
}

void edit_json(const fs::path& file, const std::function<void(nlohmann::json&)>& change) {
  auto j = nlohmann::json::parse(read_file(file));
  change(j);
  write_file(file, j.dump());
}

const fs::path kTransformer = fs::path("transformer") / "diffusion_pytorch_model.safetensors";
const std::string kQ = "transformer_blocks.0.attn.to_q.weight";

std::vector<Case> cases() {
  std::vector<Case> c = {
      // ---- CLI values ----
      flags("ZeroSteps", kRun + "--num_inference_steps 0",
            {"--num_inference_steps must be >= 1 (got 0)"}),
      flags("NegativeSteps", kRun + "--num_inference_steps -3",
            {"--num_inference_steps must be >= 1 (got -3)"}),
      flags("HeightNotMultipleOf16", "--model tiny-flux --prompt x --height 250",
            {"--height must be a positive multiple of 16 (got 250)"}),
      flags("WidthNotMultipleOf16", "--model tiny-flux --prompt x --width 100",
            {"--width must be a positive multiple of 16 (got 100)"}),
      flags("ZeroHeight", "--model tiny-flux --prompt x --height 0",
            {"--height must be a positive multiple of 16 (got 0)"}),
      flags("WidthTooLarge", "--model tiny-flux --prompt x --width 32768",
            {"--width must be at most 16384 (got 32768)"}),
      flags("UnknownModel", "--model no-such-model --prompt x", {"unknown model 'no-such-model'"}),
      flags("NoModel", "--prompt x", {"--model is required"}),
      flags("DegreesExceedWorldSize", kRun + "--ulysses_degree 2",
            {"ulysses 2", "but the world size is 1"}),
      flags("ZeroDegree", kRun + "--ring_degree 0", {"--ring_degree must be >= 1 (got 0)"}),
      flags("NanGuidance", kRun + "--guidance_scale nan",
            {"--guidance_scale must be a finite number (got nan)"}),
      flags("InfGuidance", kRun + "--guidance_scale inf",
            {"--guidance_scale must be a finite number (got inf)"}),
      flags("NegativeInfTrueCfg", kRun + "--negative_prompt y --true_cfg_scale -inf",
            {"--true_cfg_scale must be a finite number (got -inf)"}),
      flags("NegativeGuidance", kRun + "--guidance_scale -1",
            {"--guidance_scale must be >= 0 (got -1)"}),
      flags("NoPrompt", "--model tiny-flux", {"--prompt is required"}),
      flags("EmptyPrompt", "--model tiny-flux --prompt ''", {"--prompt 0 is empty"}),
      flags("NegativePromptCount",
            kRun + "--prompt y --prompt z --negative_prompt a --negative_prompt b",
            {"--negative_prompt: give one, or one per --prompt (3), got 2"}),
      flags("ZeroCommTimeout", kRun + "--comm_timeout 0",
            {"--comm_timeout must be a positive number of seconds (got 0)"}),
      flags("UnknownDtype", kRun + "--dtype int8", {"--dtype", "int8", "fp32"}),
      flags("NonNumericHeight", "--model tiny-flux --prompt x --height abc", {"--height", "abc"}),
      flags("ZeroMaxSequenceLength", kRun + "--max_sequence_length 0",
            {"--max_sequence_length must be >= 1 (got 0)"}),
      flags("ZeroIterations", kRun + "--num_iterations 0",
            {"--num_iterations must be >= 1 (got 0)"}),
      flags("FsdpOnOneGenerationRank", kRun + "--use_fsdp",
            {"--use_fsdp shards the weights over the ranks that run a generation together",
             "ulysses 1, ring 1, cfg 1"}),
      flags("DeviceMemoryWithoutDryRun", kRun + "--device_memory_gib 80",
            {"--device_memory_gib is read by --dry_run's plan: give --dry_run too"}),
      flags("HybridFsdpWithoutFsdp", kRun + "--hybrid_fsdp",
            {"--hybrid_fsdp chooses how --use_fsdp shards", "give --use_fsdp too"}),
      flags("FsdpWithCpuOffload", kRun + "--use_fsdp --enable_model_cpu_offload",
            {"--use_fsdp with --enable_model_cpu_offload is not supported"}),
      flags("BothCpuOffloads", kRun + "--enable_model_cpu_offload --enable_sequential_cpu_offload",
            {"--enable_model_cpu_offload and --enable_sequential_cpu_offload", "give one"}),
      // ---- step caching ----
      flags("CacheParameterOfAnotherMethod", kRun + "--cache fbcache --cache_interval 2",
            {"--cache_interval is a parameter of --cache taylorseer, not of --cache fbcache"}),
      flags("CacheParameterWithoutCache", kRun + "--cache_threshold 0.1",
            {"--cache_threshold is a parameter of --cache fbcache, magcache and teacache",
             "not of --cache none"}),
      flags("UnknownCacheMethod", kRun + "--cache fastercache",
            {"--cache 'fastercache' is not a step-cache method"}),
      flags("TeaCacheWithoutPublishedFit",
            " --model tiny-sd3 --prompt x --height 32 --width 32 --cache teacache",
            {"--cache teacache: tiny-sd3", "SD3Transformer2DModel",
             "has no published TeaCache polynomial", "--cache_teacache_coefficients"}),
      flags("NegativeCacheThreshold", kRun + "--cache fbcache --cache_threshold -1",
            {"--cache_threshold must be a non-negative number (got -1)"}),
      flags("CacheWithPipeFusion", kRun + "--cache magcache --pipefusion_parallel_degree 2",
            {"--cache magcache with --pipefusion_parallel_degree 2 is not supported"}),
      flags("MagCacheWithoutRatios",
            " --model tiny-sd3 --prompt x --height 32 --width 32 --cache magcache",
            {"--cache magcache", "SD3Transformer2DModel", "has no published magnitude ratios",
             "--cache_mag_ratios", "--cache_calibrate"}),
      // ---- absurd values: refused with the limit ----
      flags("AbsurdStepCount", kRun + "--num_inference_steps 2147483647",
            {"--num_inference_steps must be at most 10000 (got 2147483647)"}),
      flags("AbsurdTrueCfgScale", kRun + "--negative_prompt y --true_cfg_scale 1e30",
            {"--true_cfg_scale must be at most 1000 (got 1e+30)"}),
      flags("SeedAbove2To63", kRun + "--seed 9223372036854775808",
            {"--seed 9223372036854775808 is out of range", "9223372036854775807]"}),
      {"TooLargeForThisMachine",
       [](const fs::path&, const fs::path& out) {
         std::string prompts;
         for (int i = 0; i < 8; ++i) prompts += " --prompt p" + std::to_string(i);
         return "--model tiny-flux --height 16384 --width 16384" + prompts +
                " --output_directory " + out.string();
       },
       {"this run needs about", "GiB of memory (weights", "at 16384x16384, batch 8",
        "is available (MemAvailable + SwapFree)"},
       1,
       {"loading tiny-flux"}},
      {"OutputFolderCannotBeCreated",
       [](const fs::path&, const fs::path&) {
         return kRun + " --output_directory /proc/xfuser-out/images";
       },
       {"--output_directory /proc/xfuser-out/images does not exist and cannot be created"}},
      {"OutputFolderIsAFile",
       [](const fs::path&, const fs::path& out) {
         write_file(out.parent_path() / "a-file", "x");
         return kRun + " --output_directory " + (out.parent_path() / "a-file").string();
       },
       {"a-file is not a folder"}},
      {"OutputFolderNotWritable",
       [](const fs::path&, const fs::path&) { return kRun + " --output_directory /proc/self"; },
       {"--output_directory /proc/self is not writable"}},

      // ---- checkpoints ----
      {"ModelPathMissing",
       [](const fs::path&, const fs::path& out) {
         return kRun + " --model_path /nonexistent/flux --output_directory " + out.string();
       },
       {"model folder /nonexistent/flux does not exist"}},
      pipeline("TruncatedSafetensors",
               [](const fs::path& p) {
                 const std::string bytes = read_file(p / kTransformer);
                 write_file(p / kTransformer, bytes.substr(0, bytes.size() - 1000));
               },
               {"diffusion_pytorch_model.safetensors", "data section"}),
      pipeline("SafetensorsShorterThanItsHeader",
               [](const fs::path& p) {
                 write_file(p / kTransformer, read_file(p / kTransformer).substr(0, 100));
               },
               {"diffusion_pytorch_model.safetensors", "header"}),
      pipeline("CorruptedSafetensorsHeader",
               [](const fs::path& p) {
                 std::string bytes = read_file(p / kTransformer);
                 bytes.replace(8, 12, "#!garbage!#{");
                 write_file(p / kTransformer, bytes);
               },
               {"diffusion_pytorch_model.safetensors", "JSON"}),
      pipeline("WrongDtype",
               [](const fs::path& p) {
                 rewrite_tensors(p / kTransformer, [](auto& t) { t[kQ] = t[kQ].to(at::kLong); });
               },
               {"dtype mismatches", kQ + ": checkpoint I64, model expects a floating-point type"}),
      pipeline("ShapeMismatch",
               [](const fs::path& p) {
                 rewrite_tensors(p / kTransformer,
                                 [](auto& t) { t[kQ] = t[kQ].narrow(0, 0, t[kQ].size(0) - 1); });
               },
               {"shape mismatches", kQ + ": checkpoint ["}),
      pipeline("MissingTensor",
               [](const fs::path& p) {
                 rewrite_tensors(p / kTransformer, [](auto& t) { t.erase(kQ); });
               },
               {"1 missing", kQ}),
      pipeline("MissingConfigJson",
               [](const fs::path& p) { fs::remove(p / "transformer" / "config.json"); },
               {"transformer/config.json"}),
      pipeline("ConfigJsonNotJson",
               [](const fs::path& p) { write_file(p / "vae" / "config.json", "{\"a\": "); },
               {"vae/config.json"}),
      pipeline("ConfigValueOfWrongType",
               [](const fs::path& p) {
                 edit_json(p / "transformer" / "config.json",
                           [](auto& j) { j["num_layers"] = "two"; });
               },
               {"transformer/config.json", "num_layers"}),
      // Sizes from configs are bounded before anything is built (one check in the config getter
      // for every family, text encoder and VAE), naming the file and key.
      pipeline("HugeLayerCount",
               [](const fs::path& p) {
                 edit_json(p / "transformer" / "config.json",
                           [](auto& j) { j["num_layers"] = 1000000000; });
               },
               {"transformer/config.json: config key 'num_layers' = 1000000000 is out of range "
                "for a layer or block count (0 to 1024)"}),
      pipeline("HugeTextEncoderVocabulary",
               [](const fs::path& p) {
                 edit_json(p / "text_encoder" / "config.json",
                           [](auto& j) { j["vocab_size"] = 1000000000000LL; });
               },
               {"text_encoder/config.json: config key 'vocab_size' = 1000000000000 is out of range "
                "for a vocabulary size"}),
      pipeline("HugeVaeChannels",
               [](const fs::path& p) {
                 edit_json(p / "vae" / "config.json",
                           [](auto& j) { j["block_out_channels"][0] = 1000000000; });
               },
               {"vae/config.json: config key 'block_out_channels[0]' = 1000000000 is out of range"}),
      pipeline("NegativeHeadCount",
               [](const fs::path& p) {
                 edit_json(p / "transformer" / "config.json",
                           [](auto& j) { j["num_attention_heads"] = -2; });
               },
               {"config key 'num_attention_heads' = -2 is out of range for a head count"}),
      // A key that sets a shape, missing: the mismatch names it and the default read instead.
      pipeline("MissingShapeKey",
               [](const fs::path& p) {
                 edit_json(p / "transformer" / "config.json",
                           [](auto& j) { j.erase("num_layers"); });
               },
               {"transformer/config.json lacks keys that were read as diffusers' / transformers' "
                "defaults (num_layers = 19)"}),
      pipeline("MissingClipMerges",
               [](const fs::path& p) { fs::remove(p / "tokenizer" / "merges.txt"); },
               {"merges.txt"}),
      pipeline("MissingT5SentencePieceModel",
               [](const fs::path& p) { fs::remove(p / "tokenizer_2" / "spiece.model"); },
               {"tokenizer_2"}),
      pipeline("MalformedModelIndex",
               [](const fs::path& p) { write_file(p / "model_index.json", "{\"vae\": [\"diff"); },
               {"malformed", "model_index.json: not valid JSON"}),
      pipeline("ModelIndexEntryNotAPair",
               [](const fs::path& p) {
                 edit_json(p / "model_index.json", [](auto& j) { j["vae"] = "AutoencoderKL"; });
               },
               {"model_index.json: component 'vae' must be a [library, class] pair"}),
      pipeline("ModelIndexWithoutAComponent",
               [](const fs::path& p) {
                 edit_json(p / "model_index.json", [](auto& j) { j.erase("vae"); });
               },
               {"model_index.json lists no 'vae' component"}),
      pipeline("MissingModelIndex", [](const fs::path& p) { fs::remove(p / "model_index.json"); },
               {"has no model_index.json"}),

      // ---- non-finite results ----
      pipeline("NanWeights",
               [](const fs::path& p) {
                 rewrite_tensors(p / kTransformer, [](auto& t) { t[kQ].fill_(NAN); });
               },
               {"the latents are not finite (NaN or Inf) after denoising step 1 of 4",
                "Likely cause: NaN or Inf in the model's weights"}),
      pipeline("NanVaeWeights",
               [](const fs::path& p) {
                 rewrite_tensors(p / "vae" / "diffusion_pytorch_model.safetensors",
                                 [](auto& t) { t["decoder.conv_out.weight"].fill_(NAN); });
               },
               {"the decoded pixels are not finite (NaN or Inf) in 1 of 1 picture(s)",
                "Likely cause: NaN or Inf in the VAE's weights"}),
      // --latents: checked before any compute, named as the input.
      {"NanInLatentsFile",
       [](const fs::path& pipe, const fs::path& out) {
         at::Tensor latents = at::zeros({1, 16, 4, 4});
         latents[0][3][1][2] = NAN;
         xfuser::models::save_safetensors((pipe / "nan.safetensors").string(),
                                          {{"latents", latents}});
         return kRun + " --latents " + (pipe / "nan.safetensors").string() +
                " --output_directory " + out.string();
       },
       {"nan.safetensors: tensor 'latents' holds NaN or Inf (first in row 0, prompt 0)"},
       1,
       {"loading tiny-flux"}},
      // A picture declaring 100000 x 100000 pixels in 70 bytes: refused before decoding.
      {"DecompressionBombPicture",
       [](const fs::path& pipe, const fs::path& out) {
         write_file(pipe / "bomb.png", xfuser::testing::png_declaring(100000, 100000));
         return " --model tiny-wan-i2v --prompt x --input_images " + (pipe / "bomb.png").string() +
                " --output_directory " + out.string();
       },
       {"bomb.png declares 100000x100000 = 10000000000 pixels, more than the limit of 178956970",
        "--max_input_pixels"},
       1,
       {"loading"}},
      // Invalid UTF-8 is named in the prompt as given, before loading.
      flags("InvalidUtf8Prompt", " --model tiny-flux --prompt \"$(printf 'ab\\377c')\" ",
            {"--prompt 0 is not valid UTF-8 (byte offset 2)"}),
      flags("InvalidUtf8NegativePrompt",
            kRun + " --true_cfg_scale 2 --negative_prompt \"$(printf 'ok \\300\\200')\" ",
            {"--negative_prompt 0 is not valid UTF-8 (byte offset 3)"}),
      // A picture too small to give the output size names the picture, not a --height of 0.
      {"PictureTooSmallForItsSize",
       [](const fs::path& pipe, const fs::path& out) {
         xfuser::runner::write_png(pipe / "one.png", at::zeros({1, 1, 3}, at::kByte));
         return " --model tiny-flux2 --prompt x --input_images " + (pipe / "one.png").string() +
                " --output_directory " + out.string();
       },
       {"one.png is 1x1 pixels: too small for tiny-flux2 to take its output size from"},
       1,
       {"--height 0", "loading"}},
      {"CommTimeoutBelowAMillisecond",
       [](const fs::path&, const fs::path& out) {
         return kRun + " --ulysses_degree 2 --comm_timeout 1e-9 --output_directory " + out.string();
       },
       {"--comm_timeout must be at least 0.001 seconds"},
       2,
       {"MPI communicator"}},
      {"HugeLatentsFile",
       [](const fs::path& pipe, const fs::path& out) {
         xfuser::models::save_safetensors((pipe / "huge.safetensors").string(),
                                          {{"latents", at::full({1, 16, 4, 4}, 1e30)}});
         return kRun + " --latents " + (pipe / "huge.safetensors").string() +
                " --output_directory " + out.string();
       },
       {"huge.safetensors: tensor 'latents' holds values up to 1e+30 in magnitude"},
       1,
       {"loading tiny-flux"}},

      // ---- layouts the model cannot run: refused before any weight is read ----
      {"CfgParallelWithoutTrueCfg",
       [](const fs::path&, const fs::path& out) {
         return kRun + " --use_cfg_parallel --output_directory " + out.string();
       },
       {"--use_cfg_parallel needs true CFG"},
       2,
       {"loading tiny-flux"}},
      {"TensorParallelOverMoreRanksThanHeads",
       [](const fs::path&, const fs::path& out) {
         return kRun + " --tensor_parallel_degree 3 --output_directory " + out.string();
       },
       {"--tensor_parallel_degree 3 does not divide the 2 attention heads"},
       3,
       {"loading tiny-flux"}},
      {"PipeFusionWithMoreStagesThanBlocks",
       [](const fs::path&, const fs::path& out) {
         return kRun + " --pipefusion_parallel_degree 5 --output_directory " + out.string();
       },
       {"--pipefusion_parallel_degree 5 exceeds the 4 transformer blocks"},
       5,
       {"loading tiny-flux"}},

      // ---- environment: every rank ends, non-zero ----
      {"WorldSizeSmallerThanDegrees",
       [](const fs::path&, const fs::path& out) {
         return kRun + " --ulysses_degree 4 --output_directory " + out.string();
       },
       {"ulysses 4", "world size is 2"},
       2},
      {"WorldSizeLargerThanDegrees",
       [](const fs::path&, const fs::path& out) {
         return kRun + " --ulysses_degree 2 --output_directory " + out.string();
       },
       {"ulysses 2", "world size is 3"},
       3},
      {"BadFlagUnderMpirun",
       [](const fs::path&, const fs::path& out) {
         return kRun + " --ulysses_degree 2 --num_inference_steps 0 --output_directory " +
                out.string();
       },
       {"--num_inference_steps must be >= 1 (got 0)"},
       2},

      // ---- scheduler settings from the folder: the same checks as the flags ----
      pipeline("SchedulerShiftOutOfRange",
               [](const fs::path& p) {
                 edit_json(p / "scheduler" / "scheduler_config.json", [](auto& j) {
                   j["use_dynamic_shifting"] = false;
                   j["shift"] = -3;
                 });
               },
               {"scheduler config: shift must be a number in (0, 1000] (got -3)",
                "scheduler_config.json"}),
  };
  return c;
}

class BadInput : public ::testing::TestWithParam<Case> {
 protected:
  static void SetUpTestSuite() {
    cache_ = new xfuser::testing::TempDir("xfuser-bad-cache");
    pristine_ = new xfuser::testing::TempDir("xfuser-bad-pipe");
    std::string log;
    ASSERT_EQ(
        xfuser::testing::run_command(
            bin("xfuser") + " make-tiny --arch flux --out " + (*pristine_ / "pipe").string(), &log),
        0)
        << log;
  }
  static void TearDownTestSuite() {
    delete cache_;
    delete pristine_;
  }
  static xfuser::testing::TempDir* cache_;
  static xfuser::testing::TempDir* pristine_;
};
xfuser::testing::TempDir* BadInput::cache_ = nullptr;
xfuser::testing::TempDir* BadInput::pristine_ = nullptr;

TEST_P(BadInput, FailsWithANamedErrorAndWritesNothing) {
  const Case& c = GetParam();
  xfuser::testing::TempDir work("xfuser-bad");
  const fs::path pipe = work / "pipe";
  const fs::path out = work / "out";
  fs::copy(*pristine_ / "pipe", pipe, fs::copy_options::recursive);
  fs::create_directories(out);
  std::string cmd = "XFUSER_CACHE=" + cache_->path().string() + " OMP_NUM_THREADS=1 ";
  if (c.np > 1) {
    cmd += "timeout 120 mpirun -np " + std::to_string(c.np) + " --oversubscribe ";
    if (::geteuid() == 0) cmd += "--allow-run-as-root ";
    cmd += "-x XFUSER_CACHE -x OMP_NUM_THREADS ";
  } else {
    cmd += "timeout 120 ";
  }
  cmd += bin("xfuser-run") + " " + c.args(pipe, out);
  std::string log;
  const int code = xfuser::testing::run_command(cmd, &log);
  EXPECT_NE(code, 0) << cmd << "\n" << log;
  EXPECT_NE(code, 124) << "timed out (a hang): " << cmd << "\n" << log;
  for (const auto& text : c.expected) {
    EXPECT_NE(log.find(text), std::string::npos) << "expected '" << text << "' in:\n" << log;
  }
  for (const auto& text : c.absent) {
    EXPECT_EQ(log.find(text), std::string::npos) << "unexpected '" << text << "' in:\n" << log;
  }
  EXPECT_TRUE(fs::is_empty(out)) << "a failed run wrote files";
}

INSTANTIATE_TEST_SUITE_P(Cases, BadInput, ::testing::ValuesIn(cases()),
                         [](const auto& info) { return info.param.name; });

// A run into a folder another run is writing is refused at once, naming the
// folder (the test holds the folder's lock as a running xfuser-run does).
TEST(BadInputLockedFolder, ARunIntoAFolderAnotherRunHoldsIsRefused) {
  xfuser::testing::TempDir cache("xfuser-bad-cache"), out;
  xfuser::runner::OutputDirectoryLock held(out.path());
  std::string log;
  const int code = xfuser::testing::run_command("XFUSER_CACHE=" + cache.path().string() +
                                                    " timeout 120 " + bin("xfuser-run") + kRun +
                                                    " --output_directory " + out.path().string(),
                                                &log);
  EXPECT_NE(code, 0) << log;
  EXPECT_NE(
      log.find("--output_directory " + out.path().string() + " is in use by another xfuser-run"),
      std::string::npos)
      << log;
  EXPECT_EQ(log.find("loading tiny-flux"), std::string::npos) << log;
  EXPECT_TRUE(fs::is_empty(out.path()));
}

// The first line of a failed multi-rank run is the reason, and Open MPI's
// follow-up is announced as its consequence.
TEST(BadInputErrorOutput, TheFirstLineIsTheReason) {
  xfuser::testing::TempDir cache("xfuser-bad-cache"), out;
  std::string cmd = "XFUSER_CACHE=" + cache.path().string() +
                    " OMP_NUM_THREADS=1 timeout 120 mpirun -np 2 --oversubscribe ";
  if (::geteuid() == 0) cmd += "--allow-run-as-root ";
  cmd += "-x XFUSER_CACHE -x OMP_NUM_THREADS " + bin("xfuser-run") + kRun +
         " --ulysses_degree 2 --num_inference_steps 0 --output_directory " + out.path().string();
  std::string log;
  EXPECT_NE(xfuser::testing::run_command(cmd, &log), 0);
  const std::string first = log.substr(0, log.find('\n'));
  EXPECT_NE(first.find("--num_inference_steps must be >= 1 (got 0)"), std::string::npos) << log;
  EXPECT_NE(log.find("are its consequence, not further errors"), std::string::npos) << log;
  EXPECT_EQ(log.find("[rank -1]"), std::string::npos) << log;
}

// A thread count far beyond the machine's cores is capped, with a warning naming it, and the run
// completes (uncapped, libtorch creates every thread first: minutes, deaf to SIGTERM).
TEST(BadInputEnvironment, AHugeThreadCountIsCappedWithAWarning) {
  xfuser::testing::TempDir cache("xfuser-bad-cache"), out;
  std::string log;
  EXPECT_EQ(
      xfuser::testing::run_command(
          "XFUSER_CACHE=" + cache.path().string() + " OMP_NUM_THREADS=100000 timeout -s KILL 120 " +
              bin("xfuser-run") + kRun + " --output_directory " + out.path().string(),
          &log),
      0)
      << log;
  EXPECT_NE(log.find("OMP_NUM_THREADS=100000 exceeds the "), std::string::npos) << log;
}

// The free-space check runs before any compute: a run that cannot fit is refused with the sizes.
TEST(BadInputFreeSpace, AFullOutputFolderIsRefusedWithTheSizes) {
  xfuser::testing::TempDir out;
  try {
    xfuser::runner::check_free_space(out.path(), uint64_t{1} << 62, "this rank's images");
    FAIL() << "expected an error";
  } catch (const xfuser::Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("--output_directory " + out.path().string() + " has "), std::string::npos)
        << msg;
    EXPECT_NE(msg.find("free, but this rank's images need about 4.0 EiB (4611686018427387904 "
                       "bytes)"),
              std::string::npos)
        << msg;
  }
  EXPECT_NO_THROW(xfuser::runner::check_free_space(out.path(), 1024, "a small file"));
  EXPECT_EQ(xfuser::runner::byte_size_text(200 * 1024), "200.0 KiB");
  EXPECT_EQ(xfuser::runner::byte_size_text(512), "512 bytes");
  EXPECT_EQ(xfuser::runner::byte_size_text((uint64_t{1} << 20) - 1), "1023.9 KiB");
  EXPECT_EQ(xfuser::runner::byte_size_text(uint64_t{3} << 29), "1.5 GiB");
}

}  // namespace
