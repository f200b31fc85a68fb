// MpiCommunicator and ProcessGroups under mpiexec (NP 2 and 4) and without it (a world of 1).
// Every expected value is computed locally from what each rank is known to contribute. Every
// communicator has a timeout, so a failing rank makes the others fail, never hang.
#include <chrono>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "backends/error.h"
#include "parallel/mpi_communicator.h"
#include "parallel/mpi_env.h"
#include "parallel/process_groups.h"
#include "parallel/world_config.h"
#include "tests/mpi_test_main.h"

namespace xfuser::parallel {
namespace {

using namespace std::chrono_literals;

using xfuser::testing::g_world;  // tests/mpi_test_main.cpp

MpiCommunicator& world() { return *g_world; }

// What rank `r` contributes: distinct per rank and element, exact in every dtype used
// (bfloat16 holds integers up to 256 exactly).
at::Tensor contribution(int r, at::IntArrayRef shape, at::ScalarType dtype) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  at::Tensor base = at::arange(n, at::kDouble).reshape(shape);
  if (dtype == at::kBFloat16 || dtype == at::kHalf) return (base.fmod(8) + 16 * r).to(dtype);
  return (base + 1000 * r).to(dtype);
}

std::string message_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

class Mpi : public ::testing::TestWithParam<at::ScalarType> {};

TEST(MpiWorld, MatchesTheMpiEnvironment) {
  int size = 0, rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  EXPECT_EQ(world().size(), size);
  EXPECT_EQ(world().rank(), rank);
  EXPECT_EQ(world().name(), "world");
  EXPECT_EQ(world().backend(), "mpi");
  EXPECT_EQ(world().timeout(), 10s);
  std::vector<int> ranks(size);
  for (int i = 0; i < size; ++i) ranks[i] = i;
  EXPECT_EQ(world().world_ranks(), ranks);
}

// Run directly (no mpirun), MPI starts as a singleton: a world of 1 where every collective is
// the identity and a rank can send to itself.
TEST(MpiWorld, SingletonWithoutMpirun) {
  if (std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr) GTEST_SKIP() << "running under mpiexec";
  ASSERT_EQ(world().size(), 1);
  ASSERT_EQ(world().rank(), 0);
  at::Tensor x = contribution(0, {4, 3}, at::kFloat);
  at::Tensor y = x.clone();
  world().all_reduce(y);
  EXPECT_TRUE(y.equal(x));
  EXPECT_TRUE(world().all_gather(x, 1).equal(x));
  EXPECT_TRUE(world().all_to_all(x).equal(x));
  at::Tensor got = at::zeros_like(x);
  auto r = world().irecv(got, 0);
  world().send(x, 0);
  r->wait();
  EXPECT_TRUE(got.equal(x));
  world().barrier();
  ProcessGroups groups(WorldConfig(), g_world);
  EXPECT_EQ(groups.ulysses().name(), "ulysses[0]");
  EXPECT_EQ(groups.dp().size(), 1);
}

TEST_P(Mpi, AllReduceSumMaxMin) {
  const auto dtype = GetParam();
  const int P = world().size(), me = world().rank();
  const std::vector<int64_t> shape{3, 5};
  at::Tensor sum = at::zeros(shape, at::kDouble), mx = sum.clone(), mn = sum.clone();
  for (int r = 0; r < P; ++r) {
    at::Tensor c = contribution(r, shape, dtype).to(at::kDouble);
    sum += c;
    mx = r == 0 ? c : at::maximum(mx, c);
    mn = r == 0 ? c : at::minimum(mn, c);
  }
  at::Tensor t = contribution(me, shape, dtype);
  world().all_reduce(t);
  EXPECT_EQ(t.scalar_type(), dtype);
  EXPECT_TRUE(t.to(at::kDouble).equal(sum)) << t;
  t = contribution(me, shape, dtype);
  world().all_reduce(t, ReduceOp::kMax);
  EXPECT_TRUE(t.to(at::kDouble).equal(mx));
  t = contribution(me, shape, dtype);
  world().all_reduce(t, ReduceOp::kMin);
  EXPECT_TRUE(t.to(at::kDouble).equal(mn));
  // A non-contiguous view is reduced in place: the [5, 3] transpose of a [3, 5] buffer.
  at::Tensor buf = contribution(me, {3, 5}, dtype);
  at::Tensor view = buf.t();
  ASSERT_FALSE(view.is_contiguous());
  world().all_reduce(view);
  EXPECT_TRUE(buf.to(at::kDouble).equal(sum));
}

TEST_P(Mpi, AllGatherAlongEveryDimWithUnevenSizes) {
  const auto dtype = GetParam();
  const int P = world().size(), me = world().rank();
  const std::vector<int64_t> shape{3, 5, 7};
  for (int64_t dim : {0, 1, 2, -1, -2}) {
    std::vector<at::Tensor> parts;
    for (int r = 0; r < P; ++r) parts.push_back(contribution(r, shape, dtype));
    const at::Tensor want = at::cat(parts, dim);
    const at::Tensor got = world().all_gather(contribution(me, shape, dtype), dim);
    EXPECT_TRUE(got.equal(want)) << "dim " << dim;
    EXPECT_TRUE(got.is_contiguous());
  }
  // Non-contiguous input: a [7, 3] slice of a transposed buffer, gathered along dim 1.
  std::vector<at::Tensor> parts;
  for (int r = 0; r < P; ++r) parts.push_back(contribution(r, {3, 9}, dtype).t().slice(0, 1, 8));
  const at::Tensor in = contribution(me, {3, 9}, dtype).t().slice(0, 1, 8);
  ASSERT_FALSE(in.is_contiguous());
  EXPECT_TRUE(world().all_gather(in, 1).equal(at::cat(parts, 1)));
}

TEST_P(Mpi, AllToAllChunkOrdering) {
  const auto dtype = GetParam();
  const int P = world().size(), me = world().rank();
  const std::vector<int64_t> shape{2 * P, 3, 2};
  // Chunk j of the result is rows [2*me, 2*me+2) of rank j's input.
  std::vector<at::Tensor> parts;
  for (int j = 0; j < P; ++j)
    parts.push_back(contribution(j, shape, dtype).slice(0, 2 * me, 2 * me + 2));
  const at::Tensor want = at::cat(parts, 0);
  EXPECT_TRUE(world().all_to_all(contribution(me, shape, dtype)).equal(want));
  // The same through a non-contiguous input.
  const at::Tensor nc = contribution(me, {3, 2 * P}, dtype).t();
  std::vector<at::Tensor> nparts;
  for (int j = 0; j < P; ++j) {
    nparts.push_back(contribution(j, {3, 2 * P}, dtype).t().slice(0, 2 * me, 2 * me + 2));
  }
  EXPECT_TRUE(world().all_to_all(nc).equal(at::cat(nparts, 0)));
  // Dim 0 not divisible by the group size.
  if (P > 1) {
    const std::string msg = message_of([&] { world().all_to_all(at::zeros({P + 1, 2}, dtype)); });
    EXPECT_NE(msg.find("all_to_all on group 'world'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("divisible by the group size"), std::string::npos) << msg;
  }
}

TEST_P(Mpi, BroadcastFromEveryRoot) {
  const auto dtype = GetParam();
  const int P = world().size(), me = world().rank();
  for (int root = 0; root < P; ++root) {
    at::Tensor t = contribution(me, {4, 6}, dtype);
    world().broadcast(t, root);
    EXPECT_TRUE(t.equal(contribution(root, {4, 6}, dtype))) << "root " << root;
  }
}

TEST_P(Mpi, SendRecvAroundTheRing) {
  const auto dtype = GetParam();
  const int P = world().size(), me = world().rank();
  const int next = (me + 1) % P, prev = (me + P - 1) % P;
  // Two messages with different tags, posted in the opposite order to their receives; the
  // second receive lands in a non-contiguous view.
  at::Tensor a = at::zeros({4, 3}, dtype);
  at::Tensor b_buf = at::zeros({3, 4}, dtype);
  at::Tensor b = b_buf.t();
  auto rb = world().irecv(b, prev, Tag::kPipeLatent);
  auto ra = world().irecv(a, prev, Tag::kRingKv);
  const at::Tensor sa = contribution(me, {4, 3}, dtype);
  const at::Tensor sb = contribution(me + 7, {4, 3}, dtype);
  auto wa = world().isend(sa, next, Tag::kRingKv);
  auto wb = world().isend(sb, next, Tag::kPipeLatent);
  ra->wait();
  rb->wait();
  wa->wait();
  wb->wait();
  EXPECT_TRUE(wa->test());
  EXPECT_TRUE(a.equal(contribution(prev, {4, 3}, dtype)));
  EXPECT_TRUE(b.equal(contribution(prev + 7, {4, 3}, dtype)));
  // Blocking send/recv between pairs (0,1), (2,3), ...
  if (P >= 2 && me < P - P % 2) {
    const int peer = me ^ 1;
    at::Tensor got = at::zeros({5}, dtype);
    if (me % 2 == 0) {
      world().send(contribution(me, {5}, dtype), peer);
      world().recv(got, peer);
    } else {
      world().recv(got, peer);
      world().send(contribution(me, {5}, dtype), peer);
    }
    EXPECT_TRUE(got.equal(contribution(peer, {5}, dtype)));
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, Mpi, ::testing::Values(at::kFloat, at::kBFloat16, at::kLong),
                         [](const auto& info) { return std::string(c10::toString(info.param)); });

TEST(MpiCollectives, OtherDtypes) {
  const int P = world().size(), me = world().rank();
  // bool: kSum / kMax are a logical or, kMin a logical and.
  at::Tensor flags = at::tensor(std::vector<uint8_t>{uint8_t(me == 0), 1, 0}).to(at::kBool);
  at::Tensor any = flags.clone(), all = flags.clone();
  world().all_reduce(any, ReduceOp::kSum);
  world().all_reduce(all, ReduceOp::kMin);
  EXPECT_TRUE(any.equal(at::tensor(std::vector<uint8_t>{1, 1, 0}).to(at::kBool)));
  EXPECT_TRUE(all.equal(at::tensor(std::vector<uint8_t>{uint8_t(P == 1), 1, 0}).to(at::kBool)));
  for (auto dtype : {at::kDouble, at::kInt, at::kByte, at::kHalf}) {
    at::Tensor t = contribution(me, {6}, dtype == at::kByte ? at::kHalf : dtype);
    if (dtype == at::kByte) t = (at::arange(6) + me).to(at::kByte);
    at::Tensor want = at::zeros({6}, at::kDouble);
    for (int r = 0; r < P; ++r) {
      want += dtype == at::kByte ? (at::arange(6) + r).to(at::kDouble)
                                 : contribution(r, {6}, dtype).to(at::kDouble);
    }
    world().all_reduce(t);
    EXPECT_TRUE(t.to(at::kDouble).equal(want)) << dtype;
    EXPECT_EQ(world().all_gather(t, 0).size(0), 6 * P);
  }
  const std::string msg =
      message_of([&] { world().all_gather(at::zeros({2}, at::kComplexFloat), 0); });
  EXPECT_NE(msg.find("all_gather: dtype ComplexFloat is not supported"), std::string::npos) << msg;
}

// all_gather_into: several pairs of any dtype as one non-blocking operation; each output holds
// every member's input in rank order once the Work completed, and each pair counts as one
// all_gather call.
TEST(MpiCollectives, AllGatherIntoGathersEveryPairInRankOrder) {
  const int P = world().size(), me = world().rank();
  world().reset_stats();
  const std::vector<std::pair<std::vector<int64_t>, at::ScalarType>> kinds = {
      {{5}, at::kFloat}, {{3, 2}, at::kBFloat16}, {{7}, at::kByte}, {{2, 2}, at::kLong}};
  auto input = [&](int r, size_t k) {
    const auto& [shape, dtype] = kinds[k];
    if (dtype == at::kByte) return (at::arange(7) * 3 + r).to(at::kByte);
    return contribution(r, shape, dtype);
  };
  std::vector<at::Tensor> ins, outs;
  for (size_t k = 0; k < kinds.size(); ++k) {
    ins.push_back(input(me, k));
    outs.push_back(at::empty({P * ins.back().numel()}, ins.back().options()));
  }
  auto work = world().all_gather_into(ins, outs);
  work->wait();
  EXPECT_TRUE(work->test());
  for (size_t k = 0; k < kinds.size(); ++k) {
    std::vector<at::Tensor> want;
    for (int r = 0; r < P; ++r) want.push_back(input(r, k).reshape({-1}));
    EXPECT_TRUE(outs[k].equal(at::cat(want))) << "pair " << k;
  }
  const auto stats = world().stats();
  ASSERT_EQ(stats.count("all_gather"), 1u);
  EXPECT_EQ(stats.at("all_gather").calls, static_cast<int64_t>(kinds.size()));
  // A wrong output size is refused before anything is posted, naming the pair.
  const std::string msg =
      message_of([&] { world().all_gather_into({at::zeros({4})}, {at::zeros({4 * P + 1})}); });
  EXPECT_NE(msg.find("pair 0"), std::string::npos) << msg;
  EXPECT_NE(msg.find("needs " + std::to_string(P) + " times the input's elements"),
            std::string::npos)
      << msg;
  // The communicator is still usable after the refusal.
  at::Tensor one = at::ones({1});
  world().all_reduce(one);
  EXPECT_EQ(one.item<float>(), static_cast<float>(P));
}

TEST(MpiCollectives, NonCpuTensorIsAnErrorNamingTheOp) {
  at::Tensor meta = at::empty({4}, at::TensorOptions().device(at::kMeta));
  for (const auto& [op, fn] : std::vector<std::pair<std::string, std::function<void()>>>{
           {"all_reduce", [&] { world().all_reduce(meta); }},
           {"all_to_all", [&] { world().all_to_all(meta); }},
           {"send", [&] { world().send(meta, 0); }}}) {
    const std::string msg = message_of(fn);
    EXPECT_NE(msg.find(op + " on group 'world': the MPI communicator needs dense CPU tensors"),
              std::string::npos)
        << msg;
    EXPECT_NE(msg.find("meta"), std::string::npos) << msg;
  }
  EXPECT_TRUE(world().broken_reason().empty());
}

// Messages above the per-call element limit are split into several MPI calls.
TEST(MpiCollectives, LargeMessagesAreChunked) {
  const int P = world().size(), me = world().rank();
  auto comm = world().split(0, me, "chunked", 10s);
  comm->set_max_elements_per_call(7);
  at::Tensor t = contribution(me, {10, 10}, at::kFloat);
  at::Tensor want = at::zeros({10, 10}, at::kFloat);
  for (int r = 0; r < P; ++r) want += contribution(r, {10, 10}, at::kFloat);
  comm->all_reduce(t);
  EXPECT_TRUE(t.equal(want));
  at::Tensor b = contribution(me, {50}, at::kLong);
  comm->broadcast(b, P - 1);
  EXPECT_TRUE(b.equal(contribution(P - 1, {50}, at::kLong)));
  at::Tensor got = at::zeros({23}, at::kBFloat16);
  auto r = comm->irecv(got, (me + P - 1) % P);
  // The Work keeps the temporary it sends alive until it completes.
  auto s = comm->isend(contribution(me, {23}, at::kBFloat16), (me + 1) % P);
  r->wait();
  s->wait();
  EXPECT_TRUE(got.equal(contribution((me + P - 1) % P, {23}, at::kBFloat16)));
  // all_to_all / all_gather refuse per-rank chunks above the limit, on every rank alike.
  const std::string msg = message_of([&] { comm->all_to_all(at::zeros({P, 8})); });
  EXPECT_NE(msg.find("all_to_all on group 'chunked': chunks of 8 elements"), std::string::npos)
      << msg;
  EXPECT_NE(msg.find("exceed the MPI count limit of 7"), std::string::npos) << msg;
  EXPECT_NE(message_of([&] { comm->all_gather(at::zeros({8}), 0); }).find("count limit"),
            std::string::npos);
  comm->barrier();
}

TEST(MpiCollectives, StatsCountTheBytesThisRankSends) {
  const int P = world().size(), me = world().rank();
  auto comm = world().split(0, me, "stats", 10s);
  comm->all_to_all(at::zeros({4 * P, 8}, at::kFloat));  // 128*P bytes, (P-1)/P sent
  comm->all_to_all(at::zeros({2 * P, 8}, at::kBFloat16));
  comm->all_gather(at::zeros({3, 5}, at::kFloat), 1);  // 60 bytes to each of P-1 others
  at::Tensor h = at::zeros({10}, at::kBFloat16);
  comm->all_reduce(h);  // the caller's buffer: 20 bytes
  at::Tensor bc = at::zeros({6}, at::kLong);
  comm->broadcast(bc, 0);  // 48 on the root, 0 elsewhere
  at::Tensor got = at::zeros({16}, at::kFloat);
  auto r = comm->irecv(got, (me + P - 1) % P);
  comm->send(at::zeros({16}, at::kFloat), (me + 1) % P);  // 64
  r->wait();
  comm->barrier();
  const auto& s = comm->stats();
  ASSERT_EQ(s.size(), 7u);
  EXPECT_EQ(s.at("all_to_all").calls, 2);
  EXPECT_EQ(s.at("all_to_all").bytes, 128 * (P - 1) + 32 * (P - 1));
  EXPECT_EQ(s.at("all_gather").calls, 1);
  EXPECT_EQ(s.at("all_gather").bytes, 60 * (P - 1));
  EXPECT_EQ(s.at("all_reduce").bytes, 20);
  EXPECT_EQ(s.at("broadcast").bytes, me == 0 ? 48 : 0);
  EXPECT_EQ(s.at("send").calls, 1);
  EXPECT_EQ(s.at("send").bytes, 64);
  EXPECT_EQ(s.at("recv").calls, 1);
  EXPECT_EQ(s.at("recv").bytes, 0);
  EXPECT_EQ(s.at("barrier").calls, 1);
  EXPECT_EQ(s.at("barrier").bytes, 0);
  for (const auto& [op, st] : s) EXPECT_GE(st.seconds, 0.0) << op;
  comm->reset_stats();
  EXPECT_TRUE(comm->stats().empty());
}

// For every factorisation of the world size, each ProcessGroups communicator has exactly the
// members, order and name of the WorldConfig group, and reduces over exactly those ranks.
TEST(ProcessGroupsMpi, GroupsMatchTheWorldConfig) {
  const int P = world().size(), me = world().rank();
  int configs = 0;
  for (int dp = 1; dp <= P; ++dp)
    for (int cfg = 1; cfg <= 2; ++cfg)
      for (int pp = 1; pp <= P; ++pp)
        for (int u = 1; u <= P; ++u)
          for (int ring = 1; ring <= P; ++ring)
            for (int tp = 1; tp <= P; ++tp) {
              if (dp * cfg * pp * u * ring * tp != P) continue;
              ++configs;
              const auto config = WorldConfig::from_degrees(P, dp, cfg, pp, u, ring, tp);
              SCOPED_TRACE(config.to_string());
              world().reset_stats();
              ProcessGroups groups(config, g_world);
              EXPECT_EQ(groups.coords(), config.coords(me));
              const std::pair<MeshDim, Communicator*> dims[] = {
                  {MeshDim::kTp, &groups.tp()},     {MeshDim::kUlysses, &groups.ulysses()},
                  {MeshDim::kRing, &groups.ring()}, {MeshDim::kSp, &groups.sp()},
                  {MeshDim::kPp, &groups.pp()},     {MeshDim::kCfg, &groups.cfg()},
                  {MeshDim::kDp, &groups.dp()}};
              for (const auto& [dim, comm] : dims) {
                const auto members = config.group(dim, me);
                EXPECT_EQ(comm->world_ranks(), members) << mesh_dim_name(dim);
                EXPECT_EQ(comm->rank(), config.coords(me).get(dim));
                EXPECT_EQ(comm->size(), config.degree(dim));
                EXPECT_EQ(comm->name(), config.group_name(dim, me));
                EXPECT_EQ(comm->timeout(), world().timeout());
                at::Tensor t = at::full({2}, me + 1, at::kLong);
                comm->all_reduce(t);
                int64_t want = 0;
                for (int m : members) want += m + 1;
                EXPECT_EQ(t[0].item<int64_t>(), want) << comm->name();
                // Rank order inside the group: all_gather returns members in coordinate order.
                const at::Tensor order = comm->all_gather(at::full({1}, me, at::kInt), 0);
                EXPECT_EQ(
                    std::vector<int>(order.data_ptr<int>(), order.data_ptr<int>() + order.numel()),
                    members);
              }
              EXPECT_EQ(&groups.world(), g_world.get());
              // FSDP's group: the ranks with this rank's tp, pp and dp coordinates.
              EXPECT_EQ(groups.fsdp(), nullptr);
              groups.create_fsdp_group();
              ASSERT_NE(groups.fsdp(), nullptr);
              std::vector<int> fsdp_members;
              for (int r = 0; r < P; ++r) {
                const RankCoords c = config.coords(r), mine = config.coords(me);
                if (c.tp == mine.tp && c.pp == mine.pp && c.dp == mine.dp) {
                  fsdp_members.push_back(r);
                }
              }
              EXPECT_EQ(groups.fsdp()->world_ranks(), fsdp_members);
              EXPECT_EQ(groups.fsdp()->size(), config.ulysses() * config.ring() * config.cfg());
              const auto stats = groups.stats();
              EXPECT_EQ(stats.count("world"), 0u);  // the splits do not count as traffic
              ASSERT_EQ(stats.count(config.group_name(MeshDim::kUlysses, me)), 1u);
              // ulysses/sp/ring... groups can share a name only across dimensions: none here.
              EXPECT_EQ(stats.at(config.group_name(MeshDim::kUlysses, me)).at("all_reduce").calls,
                        1);
              groups.reset_stats();
              EXPECT_TRUE(groups.stats().empty());
            }
  EXPECT_GE(configs, P == 1 ? 1 : 6);
  // A config for another world size is refused.
  const std::string msg = message_of(
      [&] { ProcessGroups(WorldConfig::from_degrees(P + 1, P + 1, 1, 1, 1, 1, 1), g_world); });
  EXPECT_NE(msg.find("has " + std::to_string(P) + " ranks but the parallel config is world " +
                     std::to_string(P + 1)),
            std::string::npos)
      << msg;
}

// Rank 1 joins a collective (and a send) only after rank 0's timeout has expired: rank 0 throws
// within about the timeout naming the op and the group, and the communicator refuses further
// use. Rank 1's late calls then complete against rank 0's parked requests, and every rank meets
// again on the world barrier.
TEST(MpiTimeout, AMissingPeerIsAnErrorNotAHang) {
  const int P = world().size(), me = world().rank();
  if (P < 2) GTEST_SKIP() << "needs 2 ranks";
  constexpr auto kTimeout = 500ms;
  auto probe = world().split(me < 2 ? 0 : 1, me, "probe", kTimeout);
  auto probe_p2p = world().split(me < 2 ? 0 : 1, me, "probe_p2p", kTimeout);
  world().barrier();
  if (me == 0) {
    at::Tensor x = at::tensor(std::vector<float>{1, 2, 3, 4});
    auto start = std::chrono::steady_clock::now();
    std::string msg = message_of([&] { probe->all_reduce(x); });
    double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_NE(msg.find("timed out after 0.5s in all_reduce on group 'probe' (rank 0 of 2, "
                       "16 bytes)"),
              std::string::npos)
        << msg;
    EXPECT_GE(waited, 0.5);
    EXPECT_LT(waited, 1.0);
    EXPECT_EQ(probe->broken_reason(), "all_reduce");
    msg = message_of([&] { probe->barrier(); });
    EXPECT_NE(msg.find("barrier on group 'probe': the communicator is unusable after all_reduce "
                       "timed out"),
              std::string::npos)
        << msg;

    at::Tensor got = at::zeros({8}, at::kLong);
    auto work = probe_p2p->irecv(got, 1, Tag::kHeartbeat);
    start = std::chrono::steady_clock::now();
    msg = message_of([&] { work->wait(); });
    waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_NE(msg.find("timed out after 0.5s in recv on group 'probe_p2p' (rank 0 of 2, peer 1, "
                       "0 bytes)"),
              std::string::npos)
        << msg;
    EXPECT_GE(waited, 0.5);
    EXPECT_LT(waited, 1.0);
  } else if (me == 1) {
    std::this_thread::sleep_for(1500ms);
    at::Tensor y = at::tensor(std::vector<float>{10, 20, 30, 40});
    probe->all_reduce(y);  // matches rank 0's parked all_reduce
    EXPECT_TRUE(y.equal(at::tensor(std::vector<float>{11, 22, 33, 44})));
    probe_p2p->send(at::arange(8, at::kLong), 0, Tag::kHeartbeat);
    EXPECT_TRUE(probe->broken_reason().empty());
  }
  world().barrier();
}

// A Work dropped while its receive is pending parks the request (MPI may still write the
// buffer) and marks the communicator unusable; the late message still lands in the parked buffer.
TEST(MpiTimeout, DroppingAPendingWorkBreaksTheCommunicator) {
  const int P = world().size(), me = world().rank();
  if (P < 2) GTEST_SKIP() << "needs 2 ranks";
  auto probe = world().split(me < 2 ? 0 : 1, me, "dropped", 2s);
  if (me == 0) {
    at::Tensor got = at::zeros({4}, at::kFloat);
    probe->irecv(got, 1).reset();
    EXPECT_EQ(probe->broken_reason(), "recv (a pending Work was dropped)");
    const std::string msg = message_of([&] { probe->send(got, 1); });
    EXPECT_NE(msg.find("send on group 'dropped': the communicator is unusable after recv"),
              std::string::npos)
        << msg;
    world().barrier();
    world().barrier();  // rank 1 has sent by now; the message matches the parked receive
    const auto deadline = std::chrono::steady_clock::now() + 2s;
    while (!got.equal(at::full({4}, 7.0f)) && std::chrono::steady_clock::now() < deadline) {
      int flag = 0;  // drives MPI progress
      MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_COMM_SELF, &flag, MPI_STATUS_IGNORE);
      std::this_thread::sleep_for(1ms);
    }
    EXPECT_TRUE(got.equal(at::full({4}, 7.0f))) << got;
  } else {
    world().barrier();
    if (me == 1) probe->send(at::full({4}, 7.0f), 0);
    world().barrier();
  }
}

}  // namespace
}  // namespace xfuser::parallel
