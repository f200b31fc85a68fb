// UniPCMultistepScheduler against diffusers v0.33.1 (unipc_flow.json / .safetensors): timesteps,
// sigmas and a seeded multistep trajectory for Wan's flow configs (shift 3 and 5, also with a
// bfloat16 model output on float32 latents as Wan runs it), an epsilon-prediction VP config, a
// bh1 / order-3 / disable_corrector flow config, v_prediction without predict_x0 on cosine betas
// with trailing spacing and a sigma_min end, sample prediction with leading spacing on zero-SNR
// betas, and a flow sigma_min end without lower_order_final; plus config errors and state handling.
#include <cmath>
#include <fstream>

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "backends/error.h"
#include "models/schedulers/unipc_multistep.h"
#include "tests/test_util.h"

namespace {

namespace fs = std::filesystem;
using xfuser::models::schedulers::FlowSigmas;
using xfuser::models::schedulers::UniPCMultistepConfig;
using xfuser::models::schedulers::UniPCMultistepScheduler;
using xfuser::models::schedulers::UniPCPrediction;
using xfuser::testing::expect_error_containing;
using xfuser::testing::max_rel_error;

// The fixtures of diffusers 0.33.1 (the flow sigmas of Wan's own code) and 0.42.1 (the flow
// sigmas from 1): each config carries the _diffusers_version that picks its schedule.
fs::path json_path(const std::string& version = "0.33.1") {
  return xfuser::testing::fixtures_dir() / ("diffusers-v" + version) / "unipc_flow.json";
}
fs::path tensors_path(const std::string& version = "0.33.1") {
  return xfuser::testing::fixtures_dir() / ("diffusers-v" + version) / "unipc_flow.safetensors";
}

std::vector<double> to_vector(const at::Tensor& t) {
  const at::Tensor d = t.to(at::kDouble).contiguous();
  return std::vector<double>(d.data_ptr<double>(), d.data_ptr<double>() + d.numel());
}

// The Wan 2.1 scheduler_config.json as diffusers 0.33.1 writes it (flow_shift given).
nlohmann::json wan_config(double flow_shift) {
  return {{"_class_name", "UniPCMultistepScheduler"},
          {"_diffusers_version", "0.33.1"},
          {"beta_end", 0.02},
          {"beta_schedule", "linear"},
          {"beta_start", 0.0001},
          {"disable_corrector", nlohmann::json::array()},
          {"dynamic_thresholding_ratio", 0.995},
          {"final_sigmas_type", "zero"},
          {"flow_shift", flow_shift},
          {"lower_order_final", true},
          {"num_train_timesteps", 1000},
          {"predict_x0", true},
          {"prediction_type", "flow_prediction"},
          {"rescale_betas_zero_snr", false},
          {"sample_max_value", 1.0},
          {"solver_order", 2},
          {"solver_p", nullptr},
          {"solver_type", "bh2"},
          {"steps_offset", 0},
          {"thresholding", false},
          {"timestep_spacing", "linspace"},
          {"trained_betas", nullptr},
          {"use_beta_sigmas", false},
          {"use_exponential_sigmas", false},
          {"use_flow_sigmas", true},
          {"use_karras_sigmas", false}};
}

void check_every_series(const std::string& version) {
  const auto fixture = xfuser::testing::read_json(json_path(version));
  const auto tensors = xfuser::testing::read_tensors(tensors_path(version));
  auto get = [&](const std::string& key) {
    const auto it = tensors.find(key);
    EXPECT_NE(it, tensors.end()) << key;
    return it == tensors.end() ? at::Tensor() : it->second;
  };
  int series_checked = 0, steps_checked = 0;
  double worst_sigma = 0.0, worst_x = 0.0;
  for (const auto& [name, series] : fixture["series"].items()) {
    SCOPED_TRACE(name);
    UniPCMultistepScheduler scheduler(UniPCMultistepConfig::from_json(series["scheduler_config"]));
    const int64_t n = series["num_inference_steps"].get<int64_t>();
    scheduler.set_timesteps(n);

    ASSERT_EQ(scheduler.timesteps().scalar_type(), at::kLong);
    ASSERT_EQ(scheduler.sigmas().scalar_type(), at::kFloat);
    const auto timesteps = series["timesteps"].get<std::vector<int64_t>>();
    const auto sigmas = series["sigmas"].get<std::vector<double>>();
    ASSERT_EQ(scheduler.timesteps().numel(), static_cast<int64_t>(timesteps.size()));
    ASSERT_EQ(scheduler.sigmas().numel(), static_cast<int64_t>(sigmas.size()));
    for (size_t i = 0; i < timesteps.size(); ++i) {
      EXPECT_EQ(scheduler.timesteps()[static_cast<int64_t>(i)].item<int64_t>(), timesteps[i]) << i;
    }
    const auto got_sigmas = to_vector(scheduler.sigmas());
    double sigma_err = 0.0;
    // 1e-6, relative above 1: the VP training sigmas come from a float32 torch.linspace of the
    // betas whose rounding differs between libtorch 1.13 (here) and torch 2.5.1 (the fixture) by an
    // ulp in the middle, which puts epsilon_vp's sigma 14.6146 2 float32 ulps (1.3e-7 relative)
    // off. The flow sigmas (Wan) do not use the betas and are all <= 1.
    for (size_t i = 0; i < sigmas.size(); ++i) {
      const double err = std::abs(got_sigmas[i] - sigmas[i]) / std::max(1.0, std::abs(sigmas[i]));
      EXPECT_LE(err, 1e-6) << "sigma " << i << ": " << got_sigmas[i] << " vs " << sigmas[i];
      sigma_err = std::max(sigma_err, err);
    }
    worst_sigma = std::max(worst_sigma, sigma_err);

    // The trajectory: x = step(model_output_i, timesteps[i], x), every step against diffusers.
    at::Tensor x = get(name + "/x0");
    ASSERT_TRUE(x.defined());
    const bool bh1 = series["scheduler_config"]["solver_type"] == "bh1";
    double series_x = 0.0;
    for (int64_t i = 0; i < n; ++i) {
      SCOPED_TRACE("step " + std::to_string(i));
      const at::Tensor mo = get(name + "/model_output/" + std::to_string(i));
      const at::Tensor want = get(name + "/x/" + std::to_string(i));
      ASSERT_TRUE(mo.defined() && want.defined());
      x = scheduler.step(mo, timesteps[static_cast<size_t>(i)], x);
      ASSERT_EQ(x.scalar_type(), want.scalar_type());
      ASSERT_EQ(x.sizes(), want.sizes());
      EXPECT_EQ(scheduler.step_index(), i + 1);
      if (bh1 && i == n - 1) {
        // diffusers' bh1 step to a zero sigma: B(h) = -inf times a zero residual is NaN.
        EXPECT_TRUE(want.isnan().all().item<bool>());
        EXPECT_TRUE(x.isnan().all().item<bool>());
        x = want;
        continue;
      }
      ASSERT_TRUE(want.isfinite().all().item<bool>());
      const double err = max_rel_error(x, want);
      EXPECT_LE(err, 1e-5);
      series_x = std::max(series_x, err);
      ++steps_checked;
    }
    std::cout << "[unipc] " << name << ": max rel step err " << series_x << std::endl;
    worst_x = std::max(worst_x, series_x);
    ++series_checked;
  }
  EXPECT_EQ(series_checked, 16);
  EXPECT_EQ(steps_checked, 110);
  std::cout << "[unipc] diffusers " << version << ": " << series_checked << " series, "
            << steps_checked << " steps: max sigma err (relative above 1) " << worst_sigma
            << ", max rel step err " << worst_x << std::endl;
}

TEST(UniPCFixture, EverySeriesMatchesDiffusers) {
  XF_REQUIRE_FIXTURE(json_path());
  XF_REQUIRE_FIXTURE(tensors_path());
  check_every_series("0.33.1");
}

// diffusers 0.42.1 (torch 2.11, numpy 2.4): the flow series start from sigma 1, and its configs
// carry the keys 0.42 added (time_shift_type, sigma_min / sigma_max, shift_terminal null).
TEST(UniPCFixture, EverySeriesMatchesDiffusers042) {
  XF_REQUIRE_FIXTURE(json_path("0.42.1"));
  XF_REQUIRE_FIXTURE(tensors_path("0.42.1"));
  check_every_series("0.42.1");
}

TEST(UniPCFixture, ResetReplaysTheSameTrajectory) {
  XF_REQUIRE_FIXTURE(tensors_path());
  const auto tensors = xfuser::testing::read_tensors(tensors_path());
  UniPCMultistepScheduler scheduler(UniPCMultistepConfig::from_json(wan_config(5.0)));
  scheduler.set_timesteps(10);
  auto run = [&]() {
    at::Tensor x = tensors.at("wan_shift5/10/x0");
    for (int64_t i = 0; i < 10; ++i) {
      x = scheduler.step(tensors.at("wan_shift5/10/model_output/" + std::to_string(i)),
                         scheduler.timesteps()[i].item<int64_t>(), x);
    }
    return x;
  };
  const at::Tensor first = run();
  // A finished generation refuses another step until reset.
  expect_error_containing(
      [&] { scheduler.step(first, scheduler.timesteps()[0].item<int64_t>(), first); },
      {"steps are done", "reset()"});
  scheduler.reset();
  const at::Tensor second = run();
  EXPECT_TRUE(at::equal(first, second));
  EXPECT_LE(max_rel_error(second, tensors.at("wan_shift5/10/x/9")), 1e-5);
}

TEST(UniPC, NarrowedSchedulersStepTheirPartsAsTheWhole) {
  // PipeFusion after its warm-up: the whole-image scheduler split into per-patch schedulers
  // at step k; stepping each patch with its own scheduler equals slicing the whole step (the
  // history, the corrector and the order warm-up carry over).
  at::manual_seed(3);
  const int64_t steps = 6;
  std::vector<at::Tensor> outputs;
  for (int64_t i = 0; i < steps; ++i) outputs.push_back(at::randn({2, 10, 4}));
  const at::Tensor x0 = at::randn({2, 10, 4});
  for (int64_t split = 0; split < steps; ++split) {
    SCOPED_TRACE("split at step " + std::to_string(split));
    UniPCMultistepScheduler whole(UniPCMultistepConfig::from_json(wan_config(5.0)));
    whole.set_timesteps(steps);
    UniPCMultistepScheduler main(UniPCMultistepConfig::from_json(wan_config(5.0)));
    main.set_timesteps(steps);
    at::Tensor x = x0, y = x0;
    std::vector<UniPCMultistepScheduler> parts;
    const std::vector<std::pair<int64_t, int64_t>> ranges = {{0, 3}, {3, 4}, {7, 3}};
    for (int64_t i = 0; i < steps; ++i) {
      const int64_t t = whole.timesteps()[i].item<int64_t>();
      x = whole.step(outputs[i], t, x);
      if (i < split) {
        y = main.step(outputs[i], t, y);
        continue;
      }
      if (i == split) {
        for (auto [start, length] : ranges) parts.push_back(main.narrowed(1, start, length));
      }
      std::vector<at::Tensor> pieces;
      for (size_t r = 0; r < ranges.size(); ++r) {
        const auto [start, length] = ranges[r];
        pieces.push_back(parts[r].step(outputs[i].narrow(1, start, length), t,
                                       y.narrow(1, start, length).clone()));
      }
      y = at::cat(pieces, 1);
    }
    EXPECT_TRUE(at::allclose(x, y, 0, 0)) << (x - y).abs().max().item<double>();
  }
  UniPCMultistepScheduler s(UniPCMultistepConfig::from_json(wan_config(5.0)));
  s.set_timesteps(steps);
  s.step(outputs[0], s.timesteps()[0].item<int64_t>(), x0);
  expect_error_containing([&] { s.narrowed(1, 8, 4); }, {"narrowed", "[8, 12)", "outside"});
}

TEST(UniPC, WanFlowScheduleByFormula) {
  // Reference (Wan's code, diffusers <= 0.41): sigma_j = s*v / (1 + (s-1) v),
  // v = 1 - linspace(1, 1/1000, n+1)[n-j]; timestep int(sigma*1000).
  auto reference = wan_config(3.0);
  reference["_diffusers_version"] = "0.33.0.dev0";  // as the published Wan folders say
  UniPCMultistepScheduler scheduler(UniPCMultistepConfig::from_json(reference));
  EXPECT_EQ(scheduler.config().flow_sigmas, FlowSigmas::kReference);
  scheduler.set_timesteps(50);
  auto sigmas = to_vector(scheduler.sigmas());
  ASSERT_EQ(sigmas.size(), 51u);
  const double v0 = 1.0 - 0.001;
  EXPECT_NEAR(sigmas[0], 3.0 * v0 / (1.0 + 2.0 * v0), 1e-7);
  EXPECT_EQ(sigmas[50], 0.0);
  EXPECT_EQ(scheduler.timesteps()[0].item<int64_t>(), 999);
  for (size_t i = 1; i < 50; ++i) EXPECT_LT(sigmas[i], sigmas[i - 1]) << i;

  // From one (diffusers >= 0.42, and a config without a version): v = linspace(1, 1/1000, n+1)[j],
  // the first sigma (exactly 1 after any shift) lowered by 1e-6.
  auto unversioned = wan_config(3.0);
  unversioned.erase("_diffusers_version");
  UniPCMultistepScheduler today(UniPCMultistepConfig::from_json(unversioned));
  EXPECT_EQ(today.config().flow_sigmas, FlowSigmas::kFromOne);
  today.set_timesteps(50);
  sigmas = to_vector(today.sigmas());
  EXPECT_NEAR(sigmas[0], 1.0 - 1e-6, 1e-7);
  const double v1 = 1.0 - 0.999 / 50.0;
  EXPECT_NEAR(sigmas[1], 3.0 * v1 / (1.0 + 2.0 * v1), 1e-7);
  EXPECT_EQ(sigmas[50], 0.0);

  // Shift 8, 3 steps: where the two differ by a timestep (a Wan 2.2 boundary at 0.8 then sends the
  // last step to the other expert).
  auto timesteps = [](nlohmann::json config) {
    UniPCMultistepScheduler s(UniPCMultistepConfig::from_json(config));
    s.set_timesteps(3);
    const at::Tensor t = s.timesteps().contiguous();
    return std::vector<int64_t>(t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + t.numel());
  };
  auto v042 = wan_config(8.0);
  v042["_diffusers_version"] = "0.42.1";
  auto v035 = wan_config(8.0);
  v035["_diffusers_version"] = "0.35.2";
  EXPECT_EQ(timesteps(v042), (std::vector<int64_t>{999, 941, 800}));
  EXPECT_EQ(timesteps(v035), (std::vector<int64_t>{999, 941, 799}));
  // A run's choice overrides the folder's version.
  auto forced = UniPCMultistepConfig::from_json(v035);
  forced.flow_sigmas = FlowSigmas::kFromOne;
  UniPCMultistepScheduler f(forced);
  f.set_timesteps(3);
  EXPECT_EQ(f.timesteps()[2].item<int64_t>(), 800);
}

TEST(UniPC, StepChecksItsInputs) {
  UniPCMultistepScheduler scheduler(UniPCMultistepConfig::from_json(wan_config(3.0)));
  const at::Tensor x = at::randn({1, 4, 2, 4, 4});
  expect_error_containing([&] { scheduler.step(x, 999, x); }, {"before set_timesteps"});
  scheduler.set_timesteps(4);
  expect_error_containing([&] { scheduler.step(x, 998, x); },
                          {"timestep 998", "not in the schedule"});
  expect_error_containing([&] { scheduler.step(x.slice(4, 0, 2), 999, x); }, {"differ in shape"});
  scheduler.step(x, 999, x);
  expect_error_containing([&] { scheduler.step(x, 999, x); }, {"timestep 999", "step index 1"});
  // set_begin_index starts a generation mid-schedule (img2img).
  scheduler.reset();
  scheduler.set_begin_index(2);
  scheduler.step(x, scheduler.timesteps()[2].item<int64_t>(), x);
  EXPECT_EQ(scheduler.step_index(), 3);
  expect_error_containing([&] { scheduler.set_begin_index(4); }, {"begin index 4"});
}

// Many steps or a small shift repeat timesteps at the start of the schedule (int(sigma * 1000)):
// with the begin index at 0, as diffusers' Wan pipeline sets it, step i is schedule index i and all
// steps run; looking the index up by the repeated timestep would start one step late.
TEST(UniPC, RepeatedTimestepsStepInOrderFromTheBeginIndex) {
  for (auto [steps, shift] : {std::pair{300, 5.0}, std::pair{4, 1e-6}}) {
    UniPCMultistepScheduler scheduler(UniPCMultistepConfig::from_json(wan_config(shift)));
    scheduler.set_timesteps(steps);
    const at::Tensor t = scheduler.timesteps();
    ASSERT_TRUE(t.slice(0, 1).eq(t.slice(0, 0, -1)).any().item<bool>())
        << steps << " steps at shift " << shift << " repeat no timestep";
    scheduler.set_begin_index(0);
    at::Tensor x = at::ones({1, 4});
    for (int64_t i = 0; i < steps; ++i) {
      x = scheduler.step(at::zeros_like(x), t[i].item<int64_t>(), x);
      ASSERT_EQ(scheduler.step_index(), i + 1) << steps << " steps at shift " << shift;
    }
    EXPECT_TRUE(x.isfinite().all().item<bool>());
  }
}

TEST(UniPC, ResultKeepsTheSampleDtype) {
  // Wan: a bfloat16 transformer output on float32 latents gives float32 latents; an all-bfloat16
  // generation stays bfloat16 (diffusers casts each update to its own sample's dtype).
  UniPCMultistepScheduler scheduler(UniPCMultistepConfig::from_json(wan_config(5.0)));
  scheduler.set_timesteps(4);
  const at::Tensor x = at::randn({1, 4, 2, 4, 4});
  const at::Tensor mo = at::randn({1, 4, 2, 4, 4}).to(at::kBFloat16);
  at::Tensor y = x;
  for (int64_t i = 0; i < 4; ++i) {
    y = scheduler.step(mo, scheduler.timesteps()[i].item<int64_t>(), y);
    EXPECT_EQ(y.scalar_type(), at::kFloat) << i;
  }
  scheduler.reset();
  y = x.to(at::kBFloat16);
  for (int64_t i = 0; i < 4; ++i) {
    y = scheduler.step(mo, scheduler.timesteps()[i].item<int64_t>(), y);
    EXPECT_EQ(y.scalar_type(), at::kBFloat16) << i;
  }
  EXPECT_TRUE(y.isfinite().all().item<bool>());
}

TEST(UniPCConfig, DefaultsAndWanConfig) {
  const auto d = UniPCMultistepConfig::from_json(nlohmann::json::object());
  EXPECT_EQ(d.prediction_type, UniPCPrediction::kEpsilon);
  EXPECT_EQ(d.solver_order, 2);
  EXPECT_FALSE(d.use_flow_sigmas);
  EXPECT_EQ(d.flow_shift, 1.0);
  const auto w = UniPCMultistepConfig::from_json(wan_config(5.0));
  EXPECT_EQ(w.prediction_type, UniPCPrediction::kFlowPrediction);
  EXPECT_TRUE(w.use_flow_sigmas);
  EXPECT_EQ(w.flow_shift, 5.0);

  xfuser::testing::TempDir dir("unipc_config");
  {
    std::ofstream out(dir / "scheduler_config.json");
    out << wan_config(3.0).dump();
  }
  EXPECT_EQ(UniPCMultistepConfig::from_file(dir.path()).flow_shift, 3.0);
  expect_error_containing([&] { UniPCMultistepConfig::from_file(dir / "missing.json"); },
                          {"cannot open", "missing.json"});
}

TEST(UniPCConfig, UnsupportedSettingsNameTheKey) {
  auto with = [](const char* key, nlohmann::json value) {
    auto j = wan_config(3.0);
    j[key] = std::move(value);
    return j;
  };
  for (const char* key : {"thresholding", "use_karras_sigmas", "use_exponential_sigmas",
                          "use_beta_sigmas", "use_dynamic_shifting"}) {
    expect_error_containing([&] { UniPCMultistepConfig::from_json(with(key, true)); },
                            {key, "not supported"});
  }
  expect_error_containing([&] { UniPCMultistepConfig::from_json(with("shift_terminal", 0.1)); },
                          {"shift_terminal", "not supported"});
  // diffusers 0.42 writes them null / false when unused: accepted.
  EXPECT_NO_THROW(UniPCMultistepConfig::from_json(with("shift_terminal", nullptr)));
  EXPECT_NO_THROW(UniPCMultistepConfig::from_json(with("use_dynamic_shifting", false)));
  expect_error_containing(
      [&] { UniPCMultistepConfig::from_json(with("prediction_type", "x_prediction")); },
      {"prediction_type", "x_prediction"});
  expect_error_containing([&] { UniPCMultistepConfig::from_json(with("solver_type", "bh3")); },
                          {"solver_type", "bh3"});
  expect_error_containing(
      [&] { UniPCMultistepConfig::from_json(with("final_sigmas_type", "one")); },
      {"final_sigmas_type", "one"});
  expect_error_containing(
      [&] { UniPCMultistepConfig::from_json(with("timestep_spacing", "cosine")); },
      {"timestep_spacing", "cosine"});
  expect_error_containing([&] { UniPCMultistepConfig::from_json(with("beta_schedule", "sq")); },
                          {"beta_schedule", "sq"});
  expect_error_containing(
      [&] {
        UniPCMultistepConfig::from_json(with("trained_betas", {0.1, 0.2}));
      },
      {"trained_betas"});
  expect_error_containing([&] { UniPCMultistepConfig::from_json(with("predict_x0", false)); },
                          {"flow_prediction", "predict_x0"});
  expect_error_containing([&] { UniPCMultistepConfig::from_json(with("solver_order", 0)); },
                          {"solver_order"});
  expect_error_containing([&] { UniPCMultistepConfig::from_json(with("flow_shift", "3")); },
                          {"flow_shift", "wrong type"});
  // The same range as --flow_shift.
  for (double bad : {-3.0, 0.0, 1e4}) {
    expect_error_containing([&] { UniPCMultistepConfig::from_json(with("flow_shift", bad)); },
                            {"scheduler config: flow_shift must be a number in (0, 1000]"});
  }
  expect_error_containing(
      [&] { UniPCMultistepConfig::from_json(with("_class_name", "DDIMScheduler")); },
      {"DDIMScheduler", "UniPCMultistepScheduler"});
}

}  // namespace
