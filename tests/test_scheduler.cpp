// FlowMatchEulerDiscreteScheduler against diffusers v0.33.1 (flow_match_euler.json): timesteps,
// sigmas and an Euler trajectory for every series, calculate_shift, plus error cases and the
// config paths the fixture does not cover (linear shift, shift_terminal, invert_sigmas).
#include <cmath>
#include <fstream>

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "backends/error.h"
#include "models/schedulers/flow_match_euler.h"
#include "tests/test_util.h"

namespace {

namespace fs = std::filesystem;
using xfuser::models::schedulers::calculate_shift;
using xfuser::models::schedulers::FlowMatchEulerConfig;
using xfuser::models::schedulers::FlowMatchEulerDiscreteScheduler;
using xfuser::models::schedulers::TimeShiftType;

fs::path fixture_path() {
  return xfuser::testing::fixtures_dir() / "diffusers-v0.33.1" / "flow_match_euler.json";
}

nlohmann::json read_fixture() {
  std::ifstream in(fixture_path());
  return nlohmann::json::parse(in);
}

std::vector<double> to_vector(const at::Tensor& t) {
  const at::Tensor d = t.to(at::kDouble).contiguous();
  return std::vector<double>(d.data_ptr<double>(), d.data_ptr<double>() + d.numel());
}

double max_abs_diff(const std::vector<double>& a, const std::vector<double>& b) {
  EXPECT_EQ(a.size(), b.size());
  double m = 0.0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) m = std::max(m, std::abs(a[i] - b[i]));
  return m;
}

FlowMatchEulerDiscreteScheduler make_scheduler(const nlohmann::json& series) {
  FlowMatchEulerDiscreteScheduler scheduler(
      FlowMatchEulerConfig::from_json(series["scheduler_config"]));
  const auto& kwargs = series["set_timesteps_kwargs"];
  std::optional<std::vector<double>> sigmas;
  std::optional<double> mu;
  if (kwargs.contains("sigmas") && !kwargs["sigmas"].is_null()) {
    sigmas = kwargs["sigmas"].get<std::vector<double>>();
  }
  if (kwargs.contains("mu") && !kwargs["mu"].is_null()) mu = kwargs["mu"].get<double>();
  scheduler.set_timesteps(kwargs["num_inference_steps"].get<int64_t>(), sigmas, mu);
  return scheduler;
}

TEST(FlowMatchEulerFixture, EverySeriesMatchesDiffusers) {
  XF_REQUIRE_FIXTURE(fixture_path());
  const auto fixture = read_fixture();
  int series_checked = 0;
  double worst_sigma = 0.0, worst_timestep_rel = 0.0, worst_x = 0.0;
  for (const auto& [name, series] : fixture["schedules"].items()) {
    SCOPED_TRACE(name);
    FlowMatchEulerDiscreteScheduler scheduler(
        FlowMatchEulerConfig::from_json(series["scheduler_config"]));
    EXPECT_NEAR(scheduler.sigma_min(), series["init_sigma_min"].get<double>(), 1e-9);
    EXPECT_NEAR(scheduler.sigma_max(), series["init_sigma_max"].get<double>(), 1e-9);
    scheduler = make_scheduler(series);

    EXPECT_EQ(scheduler.timesteps().scalar_type(), at::kFloat);
    EXPECT_EQ(scheduler.sigmas().scalar_type(), at::kFloat);
    const auto timesteps = series["timesteps"].get<std::vector<double>>();
    const auto sigmas = series["sigmas"].get<std::vector<double>>();
    ASSERT_EQ(scheduler.timesteps().numel(), static_cast<int64_t>(timesteps.size()));
    ASSERT_EQ(scheduler.sigmas().numel(), static_cast<int64_t>(sigmas.size()));
    const double sigma_err = max_abs_diff(to_vector(scheduler.sigmas()), sigmas);
    const double timestep_err = max_abs_diff(to_vector(scheduler.timesteps()), timesteps) / 1000.0;
    EXPECT_LE(sigma_err, 1e-6);
    EXPECT_LE(timestep_err, 1e-6);  // relative to num_train_timesteps

    // Euler trajectory: x_{i+1} = step(model_output, i, x_i), model_output fixed.
    const auto& traj = series["euler_trajectory"];
    const auto model_output =
        at::tensor(traj["model_output"].get<std::vector<double>>(), at::kFloat);
    at::Tensor x = at::tensor(traj["x0"].get<std::vector<double>>(), at::kFloat);
    const auto& xs = traj["x"];
    ASSERT_EQ(xs.size(), timesteps.size() + 1);
    double x_err = max_abs_diff(to_vector(x), xs[0].get<std::vector<double>>());
    for (size_t i = 0; i < timesteps.size(); ++i) {
      x = scheduler.step(model_output, static_cast<int64_t>(i), x);
      x_err = std::max(x_err, max_abs_diff(to_vector(x), xs[i + 1].get<std::vector<double>>()));
    }
    EXPECT_LE(x_err, 1e-6);
    worst_sigma = std::max(worst_sigma, sigma_err);
    worst_timestep_rel = std::max(worst_timestep_rel, timestep_err);
    worst_x = std::max(worst_x, x_err);
    ++series_checked;
  }
  EXPECT_EQ(series_checked, 6);
  std::cout << "[flow_match_euler] max |sigma err| " << worst_sigma << ", max |timestep err|/1000 "
            << worst_timestep_rel << ", max |x err| " << worst_x << std::endl;
}

TEST(FlowMatchEulerFixture, CalculateShiftTable) {
  XF_REQUIRE_FIXTURE(fixture_path());
  const auto fixture = read_fixture();
  const auto& cs = fixture["calculate_shift"];
  EXPECT_NEAR(calculate_shift(cs["image_seq_len"].get<int64_t>()), cs["mu"].get<double>(), 1e-12);
  for (const auto& [seq, mu] : cs["mu_table"].items()) {
    EXPECT_NEAR(calculate_shift(std::stoll(seq)), mu.get<double>(), 1e-12) << seq;
  }
  FlowMatchEulerDiscreteScheduler scheduler;
  EXPECT_NEAR(scheduler.calculate_shift(4096), 1.15, 1e-12);
}

TEST(FlowMatchEuler, StaticShiftIsAppliedTwice) {
  // shift 3: init shifts sigma_min = 1/1000 to 3e-3/(1+2e-3); set_timesteps(1) keeps sigma_max = 1
  // and shifts again, so a 2-step schedule ends at shift(shift(0.001)), not shift(0.001).
  FlowMatchEulerConfig config;
  config.shift = 3.0;
  FlowMatchEulerDiscreteScheduler scheduler(config);
  const double once = 3.0 * 0.001 / (1.0 + 2.0 * 0.001);
  EXPECT_NEAR(scheduler.sigma_min(), once, 1e-8);
  scheduler.set_timesteps(2);
  const double twice = 3.0 * once / (1.0 + 2.0 * once);
  const auto sigmas = to_vector(scheduler.sigmas());
  ASSERT_EQ(sigmas.size(), 3u);
  EXPECT_NEAR(sigmas[0], 1.0, 1e-7);
  EXPECT_NEAR(sigmas[1], twice, 1e-7);
  EXPECT_EQ(sigmas[2], 0.0);
}

TEST(FlowMatchEuler, LinearShiftTerminalAndInvert) {
  FlowMatchEulerConfig config;
  config.use_dynamic_shifting = true;
  config.time_shift_type = TimeShiftType::kLinear;
  config.shift_terminal = 0.1;
  FlowMatchEulerDiscreteScheduler scheduler(config);
  const std::vector<double> in = {1.0, 0.75, 0.5, 0.25};
  scheduler.set_timesteps(4, in, 2.0);
  // linear: mu / (mu + 1/s - 1), then stretched so the last sigma is shift_terminal.
  std::vector<double> expected;
  for (double s : in) expected.push_back(2.0 / (2.0 + 1.0 / s - 1.0));
  const double scale = (1.0 - expected.back()) / (1.0 - 0.1);
  for (auto& s : expected) s = 1.0 - (1.0 - s) / scale;
  auto sigmas = to_vector(scheduler.sigmas());
  ASSERT_EQ(sigmas.size(), 5u);
  for (size_t i = 0; i < 4; ++i) EXPECT_NEAR(sigmas[i], expected[i], 1e-6) << i;
  EXPECT_NEAR(sigmas[3], 0.1, 1e-6);
  EXPECT_EQ(sigmas[4], 0.0);

  FlowMatchEulerConfig inverted;
  inverted.invert_sigmas = true;
  FlowMatchEulerDiscreteScheduler inv(inverted);
  inv.set_timesteps(3);
  sigmas = to_vector(inv.sigmas());
  const auto timesteps = to_vector(inv.timesteps());
  ASSERT_EQ(sigmas.size(), 4u);
  EXPECT_NEAR(sigmas[0], 0.0, 1e-7);
  EXPECT_NEAR(sigmas[2], 1.0 - 0.001, 1e-6);
  EXPECT_EQ(sigmas[3], 1.0);
  for (size_t i = 0; i < 3; ++i) EXPECT_NEAR(timesteps[i], sigmas[i] * 1000.0, 1e-3);
}

TEST(FlowMatchEuler, StepKeepsTheModelOutputDtypeAndScaleNoise) {
  FlowMatchEulerDiscreteScheduler scheduler;
  scheduler.set_timesteps(4);
  const auto sigmas = to_vector(scheduler.sigmas());
  const at::Tensor sample = at::full({2, 3}, 2.0, at::kFloat);
  const at::Tensor v = at::full({2, 3}, 1.0, at::kBFloat16);
  const at::Tensor out = scheduler.step(v, 1, sample);
  EXPECT_EQ(out.scalar_type(), at::kBFloat16);
  EXPECT_NEAR(out[0][0].item<float>(), 2.0 + (sigmas[2] - sigmas[1]), 1e-2);
  const at::Tensor noise = at::full({2, 3}, 10.0, at::kFloat);
  const at::Tensor noised = scheduler.scale_noise(sample, 1, noise);
  EXPECT_NEAR(noised[1][2].item<float>(), sigmas[1] * 10.0 + (1.0 - sigmas[1]) * 2.0, 1e-5);
  EXPECT_EQ(scheduler.index_for_timestep(scheduler.timesteps()[2].item<float>()), 2);
}

TEST(FlowMatchEuler, Errors) {
  FlowMatchEulerDiscreteScheduler scheduler;
  EXPECT_THROW(scheduler.set_timesteps(0), xfuser::Error);
  EXPECT_THROW(scheduler.set_timesteps(-3), xfuser::Error);
  EXPECT_THROW(scheduler.set_timesteps(3, std::vector<double>{1.0, 0.5}), xfuser::Error);
  EXPECT_THROW(scheduler.step(at::ones({2}), 0, at::ones({2})), xfuser::Error);  // no schedule
  scheduler.set_timesteps(2);
  EXPECT_THROW(scheduler.step(at::ones({2}), 2, at::ones({2})), xfuser::Error);
  EXPECT_THROW(scheduler.step(at::ones({2}), 0, at::ones({3})), xfuser::Error);

  FlowMatchEulerConfig dynamic;
  dynamic.use_dynamic_shifting = true;
  FlowMatchEulerDiscreteScheduler needs_mu(dynamic);
  EXPECT_THROW(needs_mu.set_timesteps(4), xfuser::Error);

  for (const char* key :
       {"use_karras_sigmas", "use_exponential_sigmas", "use_beta_sigmas", "stochastic_sampling"}) {
    EXPECT_THROW(FlowMatchEulerConfig::from_json({{key, true}}), xfuser::Error) << key;
    EXPECT_NO_THROW(FlowMatchEulerConfig::from_json({{key, false}})) << key;
  }
  // Read from a file, every error names the file as well as the key.
  {
    xfuser::testing::TempDir dir("xfuser-scheduler");
    std::ofstream(dir / "scheduler_config.json") << R"({"stochastic_sampling": true})";
    xfuser::testing::expect_error_containing(
        [&] { FlowMatchEulerConfig::from_file(dir.path()); },
        {"stochastic_sampling=true is not supported", (dir / "scheduler_config.json").string()});
  }
  EXPECT_THROW(FlowMatchEulerConfig::from_json({{"time_shift_type", "cubic"}}), xfuser::Error);
  EXPECT_THROW(FlowMatchEulerConfig::from_json({{"_class_name", "DDIMScheduler"}}), xfuser::Error);
  EXPECT_THROW(FlowMatchEulerConfig::from_json({{"shift", "three"}}), xfuser::Error);
  // A folder's static shift passes the same check as --flow_shift (dynamic shifting ignores it).
  for (double bad : {-3.0, 0.0, 1e4}) {
    xfuser::testing::expect_error_containing(
        [&] {
          FlowMatchEulerConfig::from_json({{"shift", bad}});
        },
        {"scheduler config: shift must be a number in (0, 1000]"});
  }
  EXPECT_NO_THROW(
      FlowMatchEulerConfig::from_json({{"shift", -3.0}, {"use_dynamic_shifting", true}}));
  EXPECT_THROW(FlowMatchEulerConfig::from_file("/nonexistent/scheduler"), xfuser::Error);
}

TEST(FlowMatchEuler, ReadsAConfigFolder) {
  xfuser::testing::TempDir dir("xfuser-sched");
  std::ofstream(dir / "scheduler_config.json")
      << R"({"_class_name": "FlowMatchEulerDiscreteScheduler", "shift": 3.0,
            "use_dynamic_shifting": true, "base_image_seq_len": 256, "max_image_seq_len": 4096,
            "base_shift": 0.5, "max_shift": 1.15, "shift_terminal": null})";
  const auto config = FlowMatchEulerConfig::from_file(dir.path());
  EXPECT_EQ(config.shift, 3.0);
  EXPECT_TRUE(config.use_dynamic_shifting);
  EXPECT_FALSE(config.shift_terminal.has_value());
  EXPECT_EQ(config.time_shift_type, TimeShiftType::kExponential);
  EXPECT_EQ(config.num_train_timesteps, 1000);
}

}  // namespace
