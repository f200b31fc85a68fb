#include <chrono>

#include <gtest/gtest.h>

#include "backends/error.h"
#include "parallel/communicator.h"
#include "parallel/nccl_communicator.h"

namespace xp = xfuser::parallel;

namespace {

// A world of one process, standing in for the MPI bootstrap group: broadcast from rank 0 leaves
// the tensor as it is (and is counted, so tests see whether the factory used it).
class WorldOfOne final : public xp::Communicator {
 public:
  std::string backend() const override { return "local"; }
  int rank() const override { return 0; }
  int size() const override { return 1; }
  const std::string& name() const override { return name_; }
  const std::vector<int>& world_ranks() const override { return ranks_; }
  std::chrono::milliseconds timeout() const override { return std::chrono::seconds(10); }
  void broadcast(at::Tensor& tensor, int root) override {
    XF_CHECK(root == 0, "world of one: root ", root);
    count("broadcast", tensor.numel() * tensor.element_size(), 0.0);
  }

 private:
  std::string name_ = "world";
  std::vector<int> ranks_{0};
};

bool nccl_usable() {
  try {
    xp::nccl_probe();
    return at::hasCUDA();
  } catch (const xfuser::Error&) {
    return false;
  }
}

}  // namespace

// On CPU-only machines selecting NCCL must be a clear error, never a crash; where a GPU exists
// the probe describes it.
TEST(Nccl, ProbeIsAClearErrorWithoutAGpu) {
  try {
    std::string desc = xp::nccl_probe();
    EXPECT_TRUE(xp::nccl_compiled_in());
    EXPECT_NE(desc.find("NCCL "), std::string::npos) << desc;
    EXPECT_NE(desc.find("CUDA devices"), std::string::npos) << desc;
  } catch (const xfuser::Error& e) {
    std::string msg = e.what();
    if (xp::nccl_compiled_in()) {
      EXPECT_NE(msg.find("no CUDA device is usable"), std::string::npos) << msg;
    } else {
      EXPECT_NE(msg.find("no NCCL support"), std::string::npos) << msg;
    }
  }
}

// The build configuration (XFUSER_WITH_NCCL, passed by tests/nccl.cmake) decides which
// implementation the library carries; both export the same entry points.
TEST(Nccl, LibraryMatchesTheBuildConfiguration) {
  EXPECT_EQ(xp::nccl_compiled_in(), XFUSER_EXPECT_NCCL != 0);
}

// Without a usable GPU (or without NCCL in the build) the factory fails with the probe's
// message, names the communicator being created, and fails before using the bootstrap group.
TEST(Nccl, FactoryFailsClearlyWithoutAGpu) {
  if (nccl_usable()) GTEST_SKIP() << "a CUDA device and a CUDA libtorch are present";
  WorldOfOne bootstrap;
  try {
    auto comm = xp::make_nccl_communicator(bootstrap, "tp", std::chrono::seconds(5));
    FAIL() << "make_nccl_communicator succeeded without a usable GPU";
  } catch (const xfuser::Error& e) {
    const std::string msg = e.what();
    if (!xp::nccl_compiled_in()) {
      EXPECT_NE(msg.find("no NCCL support"), std::string::npos) << msg;
    } else if (msg.find("no CUDA device is usable") == std::string::npos) {
      // A GPU with a CPU-only libtorch.
      EXPECT_NE(msg.find("libtorch built with CUDA"), std::string::npos) << msg;
    }
    EXPECT_NE(msg.find("creating NCCL communicator 'tp' over local group 'world'"),
              std::string::npos)
        << msg;
  }
  EXPECT_TRUE(bootstrap.stats().empty()) << "the bootstrap group was used before the probe";
}

// GPU hosts only (CUDA libtorch): a world-1 NCCL communicator runs every collective, counts it,
// and rejects CPU tensors naming the operation.
TEST(Nccl, WorldOfOneCollectivesOnGpu) {
  if (!nccl_usable()) GTEST_SKIP() << "needs a CUDA device and a CUDA libtorch";
  WorldOfOne bootstrap;
  auto comm = xp::make_nccl_communicator(bootstrap, "tp", std::chrono::seconds(30));
  EXPECT_EQ(bootstrap.stats().at("broadcast").calls, 1);
  EXPECT_EQ(comm->backend(), "nccl");
  EXPECT_EQ(comm->size(), 1);
  EXPECT_EQ(comm->rank(), 0);
  const at::Device cuda(at::kCUDA, 0);

  for (auto dtype : {at::kFloat, at::kHalf, at::kBFloat16, at::kDouble}) {
    at::Tensor x = at::randn({4, 6}, at::TensorOptions().dtype(dtype).device(cuda));  // [4, 6]
    at::Tensor ref = x.clone();
    comm->all_reduce(x, xp::ReduceOp::kSum);
    EXPECT_TRUE(at::equal(x.cpu(), ref.cpu())) << dtype;
    comm->all_reduce(x, xp::ReduceOp::kMax);
    EXPECT_TRUE(at::equal(x.cpu(), ref.cpu())) << dtype;
  }
  at::Tensor i = at::arange(12, at::TensorOptions().dtype(at::kLong).device(cuda)).view({3, 4});
  EXPECT_TRUE(at::equal(comm->all_gather(i, 1).cpu(), i.cpu()));
  EXPECT_TRUE(at::equal(comm->all_to_all(i).cpu(), i.cpu()));
  at::Tensor b = i.to(at::kInt);
  comm->broadcast(b, 0);
  EXPECT_TRUE(at::equal(b.cpu(), i.to(at::kInt).cpu()));
  comm->barrier();
  EXPECT_EQ(comm->stats().at("all_reduce").calls, 8);
  EXPECT_EQ(comm->stats().at("all_gather").calls, 1);
  EXPECT_EQ(comm->stats().at("all_gather").bytes, 0);  // nothing to send in a world of one
  EXPECT_EQ(comm->stats().at("broadcast").bytes, 12 * 4);
  EXPECT_EQ(comm->stats().at("barrier").calls, 1);

  auto sub = comm->split(0, 0, "sub");
  EXPECT_EQ(sub->size(), 1);
  EXPECT_EQ(sub->name(), "sub");
  at::Tensor y = at::ones({5}, at::TensorOptions().device(cuda));
  sub->all_reduce(y);
  EXPECT_EQ(y.sum().item<float>(), 5.0f);

  at::Tensor cpu = at::ones({2});
  try {
    comm->all_reduce(cpu);
    FAIL() << "a CPU tensor was accepted";
  } catch (const xfuser::Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("all_reduce"), std::string::npos) << msg;
    EXPECT_NE(msg.find("needs a CUDA tensor"), std::string::npos) << msg;
  }
}
