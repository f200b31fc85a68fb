// TwoPlaneCommunicator (parallel/two_plane_communicator.h) over MPI, on one rank and two: CPU
// tensors take the host plane with its results and counters unchanged, split() keeps both planes,
// the stats sum both planes, and make_world_communicator decides the same on every rank. On a
// host with a GPU the ranks share cuda:0 and CUDA tensors cross the host plane through host
// memory (no device plane): every operation equals the same operation on CPU tensors.
#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <gtest/gtest.h>

#include "backends/error.h"
#include "parallel/mpi_communicator.h"
#include "parallel/process_groups.h"
#include "parallel/two_plane_communicator.h"
#include "tests/mpi_test_main.h"

namespace xfuser::parallel {
namespace {

using namespace std::chrono_literals;

using xfuser::testing::g_world;  // tests/mpi_test_main.cpp

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

bool have_gpu() { return at::hasCUDA() && at::detail::getCUDAHooks().getNumGPUs() > 0; }

// The same collectives on `comm` for tensors on `device`; results returned on the CPU.
struct Results {
  at::Tensor reduced, gathered, exchanged, broadcast, ring;
};

Results exercise(Communicator& comm, const at::Device& device) {
  const int P = comm.size(), me = comm.rank();
  const auto opts = at::TensorOptions().dtype(at::kFloat).device(device);
  Results r;
  at::Tensor x = at::arange(6, opts).view({2, 3}) + 10 * me;
  comm.all_reduce(x, ReduceOp::kSum);
  r.reduced = x.cpu();
  r.gathered = comm.all_gather(at::full({1, 2}, me, opts), 1).cpu();
  r.exchanged = comm.all_to_all(at::arange(2 * P, opts).view({P, 2}) + 100 * me).cpu();
  at::Tensor b = at::full({3}, me == 0 ? 7.0 : -1.0, opts);
  comm.broadcast(b, 0);
  r.broadcast = b.cpu();
  at::Tensor from_prev = at::zeros({4}, opts);
  comm.batch_p2p({P2POp::recv(from_prev, (me - 1 + P) % P, Tag::kRingKv),
                  P2POp::send(at::full({4}, me, opts), (me + 1) % P, Tag::kRingKv)})
      ->wait();
  r.ring = from_prev.cpu();
  return r;
}

void expect_same(const Results& a, const Results& b) {
  EXPECT_TRUE(a.reduced.equal(b.reduced)) << a.reduced << b.reduced;
  EXPECT_TRUE(a.gathered.equal(b.gathered)) << a.gathered << b.gathered;
  EXPECT_TRUE(a.exchanged.equal(b.exchanged)) << a.exchanged << b.exchanged;
  EXPECT_TRUE(a.broadcast.equal(b.broadcast)) << a.broadcast << b.broadcast;
  EXPECT_TRUE(a.ring.equal(b.ring)) << a.ring << b.ring;
}

TEST(TwoPlane, CpuTensorsTakeTheHostPlaneUnchanged) {
  auto host = std::shared_ptr<Communicator>(g_world->split(0, g_world->rank(), "world"));
  TwoPlaneCommunicator two(host, nullptr);
  EXPECT_EQ(two.backend(), "mpi");
  EXPECT_EQ(two.name(), "world");
  EXPECT_EQ(two.size(), g_world->size());
  EXPECT_EQ(two.rank(), g_world->rank());
  auto via_two = exercise(two, at::kCPU);
  auto direct = exercise(*g_world, at::kCPU);
  expect_same(via_two, direct);
  // Counted once, by the host plane, and reported through the two-plane communicator.
  const auto stats = two.stats();
  EXPECT_EQ(stats.at("all_reduce").calls, 1);
  EXPECT_EQ(stats.at("all_reduce").bytes, 6 * 4);
  EXPECT_EQ(stats.at("broadcast").calls, 1);
  EXPECT_EQ(stats.at("send").calls, 1);
  EXPECT_EQ(stats.at("recv").calls, 1);
  two.reset_stats();
  EXPECT_TRUE(two.stats().empty());
  EXPECT_TRUE(host->stats().empty());
}

// A device plane takes no CPU tensor; the stats sum both planes; split() splits both.
TEST(TwoPlane, StatsSumBothPlanesAndSplitKeepsBoth) {
  auto host = std::shared_ptr<Communicator>(g_world->split(0, g_world->rank(), "g"));
  auto dev = std::shared_ptr<Communicator>(g_world->split(0, g_world->rank(), "g-dev"));
  TwoPlaneCommunicator two(host, dev);
  EXPECT_EQ(two.backend(), "mpi+mpi");
  at::Tensor x = at::ones({5});
  two.all_reduce(x);
  EXPECT_EQ(x[0].item<float>(), static_cast<float>(g_world->size()));
  EXPECT_TRUE(dev->stats().empty()) << "a CPU tensor went to the device plane";
  at::Tensor y = at::ones({3});
  dev->all_reduce(y);
  const auto stats = two.stats();
  EXPECT_EQ(stats.at("all_reduce").calls, 2);
  EXPECT_EQ(stats.at("all_reduce").bytes, (5 + 3) * 4);

  auto sub = two.split(g_world->rank() % 2, 0, "half");
  auto* sub2 = dynamic_cast<TwoPlaneCommunicator*>(sub.get());
  ASSERT_NE(sub2, nullptr);
  ASSERT_NE(sub2->device_plane(), nullptr);
  EXPECT_EQ(sub2->size(), 1);
  EXPECT_EQ(sub2->name(), "half");
}

TEST(TwoPlane, PlanesWithDifferentMembersAreRefused) {
  if (g_world->size() < 2) GTEST_SKIP() << "needs 2 ranks";
  auto host = std::shared_ptr<Communicator>(g_world->split(0, g_world->rank(), "g"));
  auto single = std::shared_ptr<Communicator>(g_world->split(g_world->rank(), 0, "solo"));
  const std::string msg = error_of([&] { TwoPlaneCommunicator two(host, single); });
  EXPECT_NE(msg.find("does not have the host plane's members"), std::string::npos) << msg;
}

// A mesh built over a two-plane world has two-plane groups that work as MPI groups on the CPU.
TEST(TwoPlane, ProcessGroupsOverATwoPlaneWorld) {
  auto world = std::make_shared<TwoPlaneCommunicator>(
      std::shared_ptr<Communicator>(g_world->split(0, g_world->rank(), "world")), nullptr);
  const int P = g_world->size();
  ProcessGroups groups(WorldConfig::from_degrees(P, 1, 1, 1, P, 1, 1), world);
  EXPECT_NE(dynamic_cast<TwoPlaneCommunicator*>(&groups.ulysses()), nullptr);
  at::Tensor x = at::full({2}, 1.0);
  groups.ulysses().all_reduce(x);
  EXPECT_EQ(x[1].item<float>(), static_cast<float>(P));
  EXPECT_EQ(groups.stats().at(groups.ulysses().name()).at("all_reduce").calls, 1);
}

TEST(TwoPlane, WorldCommunicatorOnTheCpuIsMpi) {
  auto world = make_world_communicator("auto", at::Device(at::kCPU), 1, 0, 10s);
  EXPECT_EQ(world->backend(), "mpi");
  EXPECT_EQ(world->size(), g_world->size());
  auto mpi = make_world_communicator("mpi", at::Device(at::kCPU), 1, 0, 10s);
  EXPECT_EQ(mpi->backend(), "mpi");
  std::string msg =
      error_of([] { make_world_communicator("nccl", at::Device(at::kCPU), 1, 0, 10s); });
  EXPECT_NE(msg.find("--comm_backend nccl needs --device cuda"), std::string::npos) << msg;
  msg = error_of([] { make_world_communicator("gloo", at::Device(at::kCPU), 1, 0, 10s); });
  EXPECT_NE(msg.find("--comm_backend 'gloo' is not a backend"), std::string::npos) << msg;
}

// GPU hosts: the ranks share cuda:0; with the MPI plane (no NCCL) CUDA tensors travel through
// host memory and every result equals the CPU path's. NCCL on a shared GPU is refused on every
// rank, naming the sharing.
TEST(TwoPlane, CudaTensorsStagedThroughTheHostEqualTheCpuPath) {
  if (!have_gpu()) GTEST_SKIP() << "needs a CUDA libtorch and a GPU";
  const at::Device cuda(at::kCUDA, 0);
  const int gpus = at::detail::getCUDAHooks().getNumGPUs();
  auto world = make_world_communicator("mpi", cuda, g_world->size(), gpus, 30s);
  EXPECT_EQ(world->backend(), "mpi");
  auto staged = exercise(*world, cuda);
  auto host = exercise(*g_world, at::kCPU);
  expect_same(staged, host);
  if (g_world->size() > gpus) {
    const std::string msg =
        error_of([&] { make_world_communicator("nccl", cuda, g_world->size(), gpus, 30s); });
    EXPECT_NE(msg.find("ranks share a GPU"), std::string::npos) << msg;
  }
}

}  // namespace
}  // namespace xfuser::parallel
