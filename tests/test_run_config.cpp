#include <CLI/CLI.hpp>
#include <gtest/gtest.h>

#include "backends/error.h"
#include "runner/run_config.h"

namespace {

using xfuser::runner::RunConfig;

RunConfig parse(std::vector<std::string> args) {
  RunConfig c;
  CLI::App app;
  xfuser::runner::add_run_flags(app, c);
  std::reverse(args.begin(), args.end());
  app.parse(args);
  return c;
}

std::string validation_error(std::vector<std::string> args) {
  RunConfig c = parse(std::move(args));
  try {
    xfuser::runner::validate_values(c);
  } catch (const xfuser::Error& e) {
    return e.message();
  }
  return "";
}

TEST(RunConfig, ParsesXditFlagNames) {
  RunConfig c = parse({"--model",
                       "FLUX.1-dev",
                       "--prompt",
                       "a cat",
                       "--prompt",
                       "a dog",
                       "--ulysses_degree",
                       "4",
                       "--ring_degree",
                       "2",
                       "--height",
                       "512",
                       "--num_inference_steps",
                       "8",
                       "--guidance_scale",
                       "3.5",
                       "--seed",
                       "7",
                       "--num_iterations",
                       "3",
                       "--warmup_calls",
                       "1",
                       "--output_directory",
                       "/tmp/x"});
  EXPECT_EQ(c.model, "FLUX.1-dev");
  ASSERT_EQ(c.prompt.size(), 2u);
  EXPECT_EQ(c.prompt[1], "a dog");
  EXPECT_EQ(c.ulysses_degree, 4);
  EXPECT_EQ(c.ring_degree, 2);
  EXPECT_EQ(c.height.value(), 512);
  EXPECT_FALSE(c.width.has_value());
  EXPECT_EQ(c.num_inference_steps.value(), 8);
  EXPECT_DOUBLE_EQ(c.guidance_scale.value(), 3.5);
  EXPECT_EQ(c.seed, 7);
  EXPECT_EQ(c.num_iterations, 3);
  EXPECT_EQ(c.warmup_calls, 1);
  EXPECT_EQ(c.output_directory, "/tmp/x");
}

TEST(RunConfig, DefaultsMatchXdit) {
  RunConfig c = parse({});
  EXPECT_EQ(c.seed, 42);
  EXPECT_EQ(c.num_iterations, 1);
  EXPECT_EQ(c.warmup_calls, 0);
  EXPECT_EQ(c.output_directory, ".");
  EXPECT_EQ(c.profile_wait, 2);
  EXPECT_EQ(c.profile_warmup, 2);
  EXPECT_EQ(c.profile_active, 1);
}

TEST(RunConfig, HelpIsGroupedLikeXdit) {
  RunConfig c;
  CLI::App app;
  xfuser::runner::add_run_flags(app, c);
  std::string help = app.help();
  for (const char* group : {"Model selection", "Parallelization", "Input parameters",
                            "Optimization options", "Benchmarking", "Profiling"}) {
    EXPECT_NE(help.find(group), std::string::npos) << group;
  }
}

TEST(RunConfig, BadValuesNameTheFlag) {
  EXPECT_EQ(validation_error({"--num_inference_steps", "0"}),
            "--num_inference_steps must be >= 1 (got 0)");
  EXPECT_EQ(validation_error({"--num_inference_steps", "-3"}),
            "--num_inference_steps must be >= 1 (got -3)");
  EXPECT_EQ(validation_error({"--height", "500"}),
            "--height must be a positive multiple of 16 (got 500)");
  EXPECT_EQ(validation_error({"--width", "32768"}), "--width must be at most 16384 (got 32768)");
  EXPECT_EQ(validation_error({"--guidance_scale", "nan"}),
            "--guidance_scale must be a finite number (got nan)");
  EXPECT_EQ(validation_error({"--ulysses_degree", "0"}), "--ulysses_degree must be >= 1 (got 0)");
  EXPECT_EQ(validation_error({"--comm_timeout", "-1"}),
            "--comm_timeout must be a positive number of seconds (got -1)");
  EXPECT_EQ(validation_error({"--height", "512", "--width", "768"}), "");
}

// Absurd values are refused with the limit in the message (they used to reach
// the kernel's OOM killer).
TEST(RunConfig, AbsurdValuesAreRefusedWithTheLimit) {
  EXPECT_EQ(validation_error({"--num_inference_steps", "2147483647"}),
            "--num_inference_steps must be at most 10000 (got 2147483647)");
  EXPECT_EQ(validation_error({"--batch_size", "100000"}),
            "--batch_size must be at most 4096 (got 100000)");
  EXPECT_EQ(validation_error({"--max_sequence_length", "2000000000"}),
            "--max_sequence_length must be at most 65536 (got 2000000000)");
  EXPECT_EQ(validation_error({"--num_iterations", "2000000000"}),
            "--num_iterations must be at most 1000000 (got 2000000000)");
  EXPECT_EQ(validation_error({"--true_cfg_scale", "1e30"}),
            "--true_cfg_scale must be at most 1000 (got 1e+30): larger scales overflow the "
            "latents");
  EXPECT_EQ(validation_error({"--guidance_scale", "inf"}),
            "--guidance_scale must be a finite number (got inf)");
  EXPECT_EQ(validation_error({"--num_inference_steps", "10000", "--true_cfg_scale", "1000"}), "");
}

// Seeds of 2^63 or more were clamped to 2^63 - 1 and recorded so; now the full
// signed range is accepted and anything outside it is an error naming the range.
TEST(RunConfig, SeedsOutsideTheSigned64BitRangeAreRejectedNotClamped) {
  EXPECT_EQ(parse({"--seed", "9223372036854775807"}).seed, INT64_MAX);
  EXPECT_EQ(parse({"--seed", "-9223372036854775808"}).seed, INT64_MIN);
  EXPECT_EQ(parse({"--seed", "0"}).seed, 0);
  for (const char* bad : {"9223372036854775808", "18446744073709551615", "-9223372036854775809",
                          "99999999999999999999999"}) {
    try {
      parse({"--seed", bad});
      FAIL() << "--seed " << bad << " was accepted";
    } catch (const CLI::ValidationError& e) {
      EXPECT_NE(std::string(e.what()).find("out of range"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("9223372036854775807"), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(parse({"--seed", "12abc"}), CLI::ValidationError);
}

TEST(RunConfig, UnknownDtypeIsAParseError) {
  EXPECT_THROW(parse({"--dtype", "fp64"}), CLI::ValidationError);
}

}  // namespace
