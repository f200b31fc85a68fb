#include <gtest/gtest.h>

#include "backends/error.h"

namespace {

int checked_divide(int a, int b) {
  XF_CHECK(b != 0, "division of ", a, " by zero");
  return a / b;
}

TEST(Error, CarriesMessageLocationAndRank) {
  xfuser::set_process_rank(3);
  try {
    checked_divide(7, 0);
    FAIL() << "expected xfuser::Error";
  } catch (const xfuser::Error& e) {
    EXPECT_EQ(e.message(), "division of 7 by zero");
    EXPECT_EQ(e.rank(), 3);
    EXPECT_EQ(e.file(), "tests/test_error.cpp");
    std::string what = e.what();
    EXPECT_NE(what.find("tests/test_error.cpp:"), std::string::npos) << what;
    EXPECT_NE(what.find("(rank 3)"), std::string::npos) << what;
  }
  xfuser::set_process_rank(-1);
}

TEST(Error, ContextScopesNestAndUnwind) {
  try {
    XF_CONTEXT("loading ", "transformer");
    {
      XF_CONTEXT("reading tensor x");
      XF_THROW("bad bytes");
    }
  } catch (const xfuser::Error& e) {
    ASSERT_EQ(e.context().size(), 2u);
    EXPECT_EQ(e.context()[0], "loading transformer");
    EXPECT_EQ(e.context()[1], "reading tensor x");
    std::string what = e.what();
    // Innermost context first in the printed message.
    EXPECT_LT(what.find("while reading tensor x"), what.find("while loading transformer")) << what;
  }
  EXPECT_TRUE(xfuser::detail::current_context().empty());
}

TEST(Error, EmptyMessageNamesTheCheck) {
  try {
    XF_CHECK(1 + 1 == 3);
    FAIL();
  } catch (const xfuser::Error& e) {
    EXPECT_NE(std::string(e.what()).find("1 + 1 == 3"), std::string::npos);
  }
}

}  // namespace
