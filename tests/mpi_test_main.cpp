#include "tests/mpi_test_main.h"

#include <chrono>
#include <cstdio>
#include <exception>

#include <gtest/gtest.h>

#include "parallel/mpi_env.h"

namespace xfuser::testing {

std::shared_ptr<parallel::MpiCommunicator> g_world;

}  // namespace xfuser::testing

int main(int argc, char** argv) {
  xfuser::parallel::MpiEnvironment env(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  int rc = 1;
  try {
    xfuser::testing::g_world =
        std::make_shared<xfuser::parallel::MpiCommunicator>("world", std::chrono::seconds(10));
    rc = RUN_ALL_TESTS();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "[rank %d] %s\n", env.rank(), e.what());
  }
  xfuser::testing::g_world.reset();
  return rc;
}
