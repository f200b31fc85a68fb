#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#if XFUSER_TORCH_CUDA
#include <ATen/cuda/Sleep.h>
#endif

#include "backends/error.h"
#include "parallel/communicator.h"
#include "parallel/nccl_communicator.h"
#include "tests/test_util.h"

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

// GPU hosts only: a rank sends to and receives from itself in one batch_p2p (one NCCL group),
// and the operations are asynchronous: the host returns before they are waited for, the results
// are right on the compute stream, and the counts arrive once they complete.
TEST(Nccl, WorldOfOneSelfSendRecvAndAsynchronousCounts) {
  if (!nccl_usable()) GTEST_SKIP() << "needs a CUDA device and a CUDA libtorch";
  WorldOfOne bootstrap;
  auto comm = xp::make_nccl_communicator(bootstrap, "self", std::chrono::seconds(30));
  const at::Device cuda(at::kCUDA, 0);
  at::Tensor out = at::arange(1 << 20, at::TensorOptions().dtype(at::kFloat).device(cuda));
  at::Tensor in = at::zeros_like(out);
  std::vector<xp::P2POp> ops(2);
  ops[0].kind = xp::P2POp::Kind::kRecv;  // the receive first: grouped, the order does not matter
  ops[0].tensor = in;
  ops[0].peer = 0;
  ops[1].kind = xp::P2POp::Kind::kSend;
  ops[1].tensor = out;
  ops[1].peer = 0;
  auto work = comm->batch_p2p(std::move(ops));
  work->wait();  // orders the compute stream; the host goes on
  EXPECT_TRUE(at::equal(in.cpu(), out.cpu()));
  EXPECT_TRUE(work->test());
  auto stats = comm->stats();  // waits for the operations in flight
  EXPECT_EQ(stats.at("send").calls, 1);
  EXPECT_EQ(stats.at("send").bytes, (1 << 20) * 4);
  EXPECT_EQ(stats.at("recv").calls, 1);
  EXPECT_GT(stats.at("send").seconds + stats.at("recv").seconds, 0.0) << "CUDA-event time";

  // Many collectives queue without the host waiting for each; the last result is exact.
  at::Tensor x = at::ones({1 << 16}, at::TensorOptions().device(cuda));
  for (int i = 0; i < 200; ++i) comm->all_reduce(x);
  EXPECT_EQ(x.sum().item<float>(), static_cast<float>(1 << 16));
  EXPECT_EQ(comm->stats().at("all_reduce").calls, 200);
}

// The child of Nccl.TheWatchdogEndsTheJobNamingTheOperationAndPeer: a grouped send/recv to itself
// queued behind a compute stream that spins for about 30 s, past its 2 s deadline. (A receive
// that no send matches cannot stand in: NCCL refuses a self-receive without its send on the
// host.) The host does not block on it; the watchdog must end the process. The pair is
// connected by a first exchange before the spin: NCCL connects a pair on its first
// point-to-point call, and that set-up waited for the spinning device (on an H100 the first
// call's ncclGroupEnd itself then ran past the deadline, which the call's own wait reports).
// ncclCommAbort waits for the spin (it frees device memory), so the job ends after the
// watchdog's abort grace (10 s), not when the device is done.
TEST(NcclChild, OperationPastItsDeadline) {
  const char* child = std::getenv("XFUSER_TEST_NCCL_CHILD");
  if (child == nullptr || !*child) GTEST_SKIP() << "runs as the child of a watchdog test";
#if XFUSER_TORCH_CUDA
  WorldOfOne bootstrap;
  auto comm = xp::make_nccl_communicator(bootstrap, "lonely", std::chrono::seconds(2));
  const auto opts = at::TensorOptions().device(at::Device(at::kCUDA, 0));
  at::Tensor in = at::zeros({256}, opts), out = at::ones({256}, opts);
  const auto exchange = [&] {
    std::vector<xp::P2POp> ops(2);
    ops[0].kind = xp::P2POp::Kind::kRecv;
    ops[0].tensor = in;
    ops[0].peer = 0;
    ops[1].kind = xp::P2POp::Kind::kSend;
    ops[1].tensor = out;
    ops[1].peer = 0;
    comm->batch_p2p(std::move(ops))->wait();
  };
  exchange();  // connects the pair
  ASSERT_EQ(in.sum().item<float>(), 256.0f);
  in.zero_();
  at::cuda::sleep(int64_t{60} * 1000 * 1000 * 1000);  // clock cycles: ~30 s at 2 GHz
  exchange();
  (void)in.sum().item<float>();  // blocks on the stream until the watchdog ends the process
  FAIL() << "the operation completed before the watchdog ended the process";
#else
  FAIL() << "needs a CUDA libtorch";
#endif
}

TEST(Nccl, TheWatchdogEndsTheJobNamingTheOperationAndPeer) {
  if (!nccl_usable()) GTEST_SKIP() << "needs a CUDA device and a CUDA libtorch";
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe");
  std::string out;
  const auto start = std::chrono::steady_clock::now();
  const int rc =
      xfuser::testing::run_command("XFUSER_TEST_NCCL_CHILD=1 timeout 120 " + self.string() +
                                       " --gtest_filter=NcclChild.OperationPastItsDeadline",
                                   &out);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("the child ended after %.1f s (the device spins ~30 s)\n", seconds);
  EXPECT_NE(rc, 0) << out;
  // Deadline 2 s, abort grace 10 s, plus start-up: well before the ~30 s spin ends.
  EXPECT_LT(seconds, 25.0) << "the job waited for the device\n" << out;
  EXPECT_NE(rc, 124) << "the watchdog did not end the process\n" << out;
  EXPECT_NE(out.find("nccl batch_p2p on group 'lonely' (1024 bytes) [recv from rank 0, send to "
                     "rank 0]"),
            std::string::npos)
      << out;
  // The watchdog's words; or, where the NCCL call itself still waits for the device, the call's
  // own deadline (the communicator aborted either way).
  const bool watchdog = out.find("did not complete before its deadline") != std::string::npos;
  const bool in_call = out.find("timed out after 2000 ms in NCCL call") != std::string::npos;
  EXPECT_TRUE(watchdog || in_call) << out;
  std::printf("deadline enforced by %s\n", watchdog ? "the watchdog" : "the NCCL call's wait");
  EXPECT_EQ(out.find("the operation completed"), std::string::npos) << out;
}
