// Communicator::batch_p2p on the MPI backend (one rank, NP 2 and 4): every pattern is posted
// with the receives before the sends they pair with, which would block ungrouped on NCCL; MPI
// posts all of them before waiting, so the order in the list never matters. Expected values are
// computed from what each rank is known to send.
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "backends/error.h"
#include "parallel/mpi_communicator.h"
#include "tests/mpi_test_main.h"

namespace xfuser::parallel {
namespace {

using namespace std::chrono_literals;

using xfuser::testing::g_world;  // tests/mpi_test_main.cpp
MpiCommunicator& world() { return *g_world; }

// What rank `r` sends to rank `to` under `tag`: distinct per (sender, receiver, tag, element).
at::Tensor payload(int r, int to, int tag, int64_t n, at::ScalarType dtype) {
  return (at::arange(n, at::kDouble).fmod(16) + 100 * r + 10 * to + tag % 7).to(dtype);
}

std::string message_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// Every rank receives from its left neighbour and sends to its right one, both directions of
// the ring at once, receives listed first.
TEST(BatchP2P, RingBothWaysWithReceivesBeforeSends) {
  const int P = world().size(), me = world().rank();
  const int next = (me + 1) % P, prev = (me - 1 + P) % P;
  for (auto dtype : {at::kFloat, at::kBFloat16, at::kLong}) {
    at::Tensor from_prev = at::zeros({5, 3}, dtype), from_next = at::zeros({7}, dtype);
    const int tag = static_cast<int>(Tag::kRingKv);
    world().reset_stats();
    auto work = world().batch_p2p(
        {P2POp::recv(from_prev, prev, Tag::kRingKv), P2POp::recv(from_next, next, Tag::kRingKv),
         P2POp::send(payload(me, next, tag, 15, dtype).view({5, 3}), next, Tag::kRingKv),
         P2POp::send(payload(me, prev, tag, 7, dtype), prev, Tag::kRingKv)});
    work->wait();
    EXPECT_TRUE(work->test());
    EXPECT_TRUE(from_prev.equal(payload(prev, me, tag, 15, dtype).view({5, 3}))) << dtype;
    EXPECT_TRUE(from_next.equal(payload(next, me, tag, 7, dtype))) << dtype;
    const auto& s = world().stats();
    const int64_t esize = at::elementSize(dtype);
    EXPECT_EQ(s.at("send").calls, 2);
    EXPECT_EQ(s.at("send").bytes, (15 + 7) * esize);
    EXPECT_EQ(s.at("recv").calls, 2);
    EXPECT_EQ(s.at("recv").bytes, 0);
  }
}

// A rank sends to and receives from itself inside one batch (the recv listed first).
TEST(BatchP2P, SelfSendReceive) {
  const int me = world().rank();
  at::Tensor got = at::zeros({4, 2}, at::kFloat);
  const at::Tensor sent = payload(me, me, 1, 8, at::kFloat).view({4, 2});
  world().batch_p2p({P2POp::recv(got, me), P2POp::send(sent, me)})->wait();
  EXPECT_TRUE(got.equal(sent)) << got;
}

// Two messages between the same pair under different tags, listed in the opposite order on the
// two sides: the tags decide the matching, not the order. A non-contiguous receive target is
// filled in place.
TEST(BatchP2P, MixedTagsMatchByTagNotOrder) {
  const int P = world().size(), me = world().rank();
  const int peer = me ^ 1;
  if (peer >= P) GTEST_SKIP() << "needs a partner rank";
  const int a = static_cast<int>(Tag::kPipeActivation), l = static_cast<int>(Tag::kPipeLatent);
  at::Tensor acts = at::zeros({6}, at::kFloat);
  at::Tensor lat_storage = at::zeros({3, 4}, at::kFloat);
  at::Tensor lats = lat_storage.t();  // [4, 3], not contiguous
  ASSERT_FALSE(lats.is_contiguous());
  std::vector<P2POp> ops;
  if (me < peer) {
    ops = {P2POp::recv(lats, peer, Tag::kPipeLatent), P2POp::recv(acts, peer, Tag::kPipeActivation),
           P2POp::send(payload(me, peer, a, 6, at::kFloat), peer, Tag::kPipeActivation),
           P2POp::send(payload(me, peer, l, 12, at::kFloat).view({4, 3}), peer, Tag::kPipeLatent)};
  } else {
    ops = {P2POp::send(payload(me, peer, l, 12, at::kFloat).view({4, 3}), peer, Tag::kPipeLatent),
           P2POp::send(payload(me, peer, a, 6, at::kFloat), peer, Tag::kPipeActivation),
           P2POp::recv(acts, peer, Tag::kPipeActivation),
           P2POp::recv(lats, peer, Tag::kPipeLatent)};
  }
  world().batch_p2p(std::move(ops))->wait();
  EXPECT_TRUE(acts.equal(payload(peer, me, a, 6, at::kFloat))) << acts;
  EXPECT_TRUE(lats.equal(payload(peer, me, l, 12, at::kFloat).view({4, 3}))) << lats;
}

TEST(BatchP2P, EmptyBatchIsComplete) {
  auto work = world().batch_p2p({});
  EXPECT_TRUE(work->test());
  work->wait();
}

TEST(BatchP2P, BadOperationIsAnErrorBeforeAnythingIsPosted) {
  const int P = world().size();
  at::Tensor x = at::zeros({2}, at::kFloat);
  std::string msg = message_of([&] { world().batch_p2p({P2POp::send(x, P)}); });
  EXPECT_NE(msg.find("batch_p2p op 0 (send to peer " + std::to_string(P) +
                     ") on group 'world': "
                     "peer rank " +
                     std::to_string(P) + " is outside [0, " + std::to_string(P) + ")"),
            std::string::npos)
      << msg;
  msg = message_of([&] { world().batch_p2p({P2POp::recv(x, 0), P2POp::recv(at::Tensor(), 0)}); });
  EXPECT_NE(msg.find("batch_p2p op 1 (recv from peer 0) on group 'world': undefined tensor"),
            std::string::npos)
      << msg;
  EXPECT_TRUE(world().broken_reason().empty()) << "a refused batch must leave nothing pending";
}

// Rank 0 waits for a message rank 1 sends only after rank 0's timeout: the error names the
// operation, the group and the peer that did not answer (and not the one that did), within
// about the timeout; the communicator is then unusable. Rank 1's late send matches the parked
// receive, and both ranks meet again on the world barrier.
TEST(BatchP2P, APeerThatNeverAnswersIsATimeoutNamingIt) {
  const int P = world().size(), me = world().rank();
  if (P < 2) GTEST_SKIP() << "needs 2 ranks";
  auto probe = world().split(me < 2 ? 0 : 1, me, "probe", 500ms);
  world().barrier();
  if (me == 0) {
    at::Tensor from_self = at::zeros({3}, at::kFloat), from_one = at::zeros({4}, at::kFloat);
    auto work = probe->batch_p2p({P2POp::recv(from_one, 1, Tag::kVaeHalo),
                                  P2POp::recv(from_self, 0, Tag::kVaeHalo),
                                  P2POp::send(at::ones({3}, at::kFloat), 0, Tag::kVaeHalo)});
    const auto start = std::chrono::steady_clock::now();
    const std::string msg = message_of([&] { work->wait(); });
    const double waited =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_NE(msg.find("timed out after 0.5s in batch_p2p on group 'probe' (rank 0 of 2, 3 "
                       "operations); not completed: recv from peer 1 (tag 400, 16 bytes)"),
              std::string::npos)
        << msg;
    EXPECT_EQ(msg.find("peer 0"), std::string::npos) << "the self exchange completed: " << msg;
    EXPECT_GE(waited, 0.5);
    EXPECT_LT(waited, 1.5);
    EXPECT_EQ(probe->broken_reason(), "batch_p2p");
    const std::string again = message_of([&] { probe->batch_p2p({}); });
    EXPECT_NE(again.find("batch_p2p on group 'probe': the communicator is unusable after "
                         "batch_p2p timed out"),
              std::string::npos)
        << again;
  } else if (me == 1) {
    std::this_thread::sleep_for(1500ms);
    probe->send(at::full({4}, 2.0f), 0, Tag::kVaeHalo);  // matches rank 0's parked receive
  }
  world().barrier();
}

}  // namespace
}  // namespace xfuser::parallel
