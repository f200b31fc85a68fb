// USP attention (Ulysses, ring, hybrid) against single-rank backends::attention over the full
// sequence. Every rank builds the same global q/k/v from a fixed seed, takes its shard, runs USP,
// and the gathered result is compared with the reference. Run with NP 2 and NP 4: every
// (ulysses, ring) layout whose sp divides the world runs (dp = world / sp), so NP 4 covers
// ulysses 2, ring 2, ulysses 2 x ring 2, ulysses 4 and ring 4.
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>
#include <gtest/gtest.h>

#include "backends/attention.h"
#include "backends/error.h"
#include "parallel/mpi_communicator.h"
#include "parallel/mpi_env.h"
#include "parallel/sequence_shard.h"
#include "parallel/usp_attention.h"
#include "parallel/world_config.h"
#include "tests/test_util.h"

namespace xfuser::parallel {
namespace {

using xfuser::testing::max_rel_error;

constexpr double kFp32Tol = 1e-5;
constexpr double kBf16Tol = 2e-2;

// ---- MPI set-up: one environment per process, groups cached per (ulysses, ring) ---------------

struct Mesh {
  WorldConfig config;
  std::unique_ptr<Communicator> ulysses, ring, sp;
};

struct MpiState {
  std::unique_ptr<MpiEnvironment> env;
  std::unique_ptr<MpiCommunicator> world;
  std::map<std::pair<int, int>, Mesh> meshes;
};

MpiState& state() {
  static MpiState s;
  return s;
}

class MpiTestEnvironment : public ::testing::Environment {
 public:
  void SetUp() override {
    state().env = std::make_unique<MpiEnvironment>(nullptr, nullptr);
    state().world = std::make_unique<MpiCommunicator>("world", std::chrono::milliseconds(60000));
  }
  void TearDown() override {
    state().meshes.clear();
    state().world.reset();
    state().env.reset();
  }
};

const auto* const kEnvironment = ::testing::AddGlobalTestEnvironment(new MpiTestEnvironment);

int world_size() { return state().world->size(); }
int world_rank() { return state().world->rank(); }

std::unique_ptr<Communicator> make_group(const WorldConfig& cfg, MeshDim dim) {
  const int rank = world_rank();
  const auto members = cfg.group(dim, rank);
  return state().world->split(members[0], cfg.coords(rank).get(dim), cfg.group_name(dim, rank));
}

// The groups of this rank for ulysses x ring, with dp = world / (ulysses * ring). Collective.
Mesh& mesh(int ulysses, int ring) {
  auto key = std::make_pair(ulysses, ring);
  auto it = state().meshes.find(key);
  if (it != state().meshes.end()) return it->second;
  Mesh m;
  m.config = WorldConfig::from_degrees(world_size(), world_size() / (ulysses * ring), 1, 1, ulysses,
                                       ring, 1);
  m.ulysses = make_group(m.config, MeshDim::kUlysses);
  m.ring = make_group(m.config, MeshDim::kRing);
  m.sp = make_group(m.config, MeshDim::kSp);
  return state().meshes.emplace(key, std::move(m)).first->second;
}

// Every (ulysses, ring) with ulysses * ring > 1 dividing the world size.
std::vector<std::pair<int, int>> layouts() {
  std::vector<std::pair<int, int>> out;
  for (int u = 1; u <= world_size(); ++u) {
    for (int r = 1; u * r <= world_size(); ++r) {
      if (u * r > 1 && world_size() % (u * r) == 0) out.emplace_back(u, r);
    }
  }
  return out;
}

std::string layout_name(int u, int r) {
  return "ulysses " + std::to_string(u) + " x ring " + std::to_string(r);
}

// ---- one case -------------------------------------------------------------------------------

struct Case {
  int64_t batch = 2;
  int64_t heads = 4;
  int64_t head_dim = 8;
  int64_t text = 8;    // global text tokens L
  int64_t image = 12;  // global image tokens N
  bool text_first = true;
  at::ScalarType dtype = at::kFloat;
  uint64_t seed = 1234;
};

struct Global {
  at::Tensor q, k, v;  // [B, L + N, H, D] (text first or last), the case's dtype
};

Global make_global(const Case& c) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(c.seed);
  auto opts = at::TensorOptions().dtype(at::kFloat);
  auto make = [&] {
    return at::randn({c.batch, c.text + c.image, c.heads, c.head_dim}, gen, opts).to(c.dtype);
  };
  Global g;
  g.q = make();
  g.k = make();
  g.v = make();
  return g;
}

struct Result {
  at::Tensor out;    // gathered [B, L + N, H, D] (text rows from this rank for replicated)
  at::Tensor local;  // this rank's output [B, S_local, H, D]
  TextMode mode = TextMode::kSplit;
  int64_t local_text = 0;
};

// Shards the global q/k/v for this rank, runs USP, and gathers the output over the SP group.
Result run_usp(const Case& c, const Global& g, Mesh& m) {
  const int sp = m.config.sp(), sp_rank = m.sp->rank();
  const SequenceShard image(c.image, sp);
  Result res;
  res.mode = choose_text_mode(c.text, sp);
  res.local_text = local_text_tokens(res.mode, c.text, sp);
  const int64_t text_start = c.text_first ? 0 : c.image, image_start = c.text_first ? c.text : 0;
  auto local = [&](const at::Tensor& x) {
    auto txt = x.narrow(1, text_start, c.text);
    if (res.mode == TextMode::kSplit) txt = txt.narrow(1, sp_rank * res.local_text, res.local_text);
    auto img = image.shard(x.narrow(1, image_start, c.image), 1, sp_rank);
    return c.text_first ? at::cat({txt, img}, 1) : at::cat({img, txt}, 1);
  };
  UspAttention usp(*m.ulysses, *m.ring, res.mode, image.valid_counts());
  res.local = usp.attention(local(g.q), local(g.k), local(g.v), res.local_text, c.text_first);
  EXPECT_EQ(res.local.sizes(), local(g.q).sizes());

  const int64_t lt = res.local_text;
  auto txt = res.local.narrow(1, c.text_first ? 0 : image.chunk(), lt);
  auto img = image.gather(res.local.narrow(1, c.text_first ? lt : 0, image.chunk()), 1, *m.sp);
  if (res.mode == TextMode::kSplit && sp > 1 && lt > 0) txt = m.sp->all_gather(txt.contiguous(), 1);
  res.out = c.text_first ? at::cat({txt, img}, 1) : at::cat({img, txt}, 1);
  return res;
}

at::Tensor reference(const Global& g) {
  return backends::attention(g.q.to(at::kFloat), g.k.to(at::kFloat), g.v.to(at::kFloat)).out;
}

// Runs `c` on every layout and checks the gathered output against the single-rank reference.
void check_all_layouts(const Case& c, double tol) {
  c10::InferenceMode guard;
  const Global g = make_global(c);
  const at::Tensor ref = reference(g);
  for (auto [u, r] : layouts()) {
    SCOPED_TRACE(layout_name(u, r));
    Result res = run_usp(c, g, mesh(u, r));
    ASSERT_EQ(res.out.sizes(), ref.sizes());
    EXPECT_EQ(res.out.scalar_type(), c.dtype);
    const double err = max_rel_error(res.out.to(at::kFloat), ref);
    EXPECT_LE(err, tol) << "text " << text_mode_name(res.mode) << ", L " << c.text << ", N "
                        << c.image << ", H " << c.heads;
    if (world_rank() == 0) {
      std::printf("[usp] %s  L=%lld N=%lld H=%lld %s text %s %s: max rel err %.3g\n",
                  layout_name(u, r).c_str(), static_cast<long long>(c.text),
                  static_cast<long long>(c.image), static_cast<long long>(c.heads),
                  text_mode_name(res.mode), c.text_first ? "first" : "last",
                  c.dtype == at::kFloat ? "fp32" : "bf16", err);
    }
  }
}

// ---- sequence_shard -------------------------------------------------------------------------

TEST(SequenceShard, ChunksPaddingAndValidRows) {
  SequenceShard s(13, 4);
  EXPECT_EQ(s.chunk(), 4);
  EXPECT_EQ(s.padded(), 16);
  EXPECT_EQ(s.padding(), 3);
  EXPECT_EQ(s.valid_counts(), (std::vector<int64_t>{4, 4, 4, 1}));
  const auto mask3 = s.valid_mask(3);
  EXPECT_EQ(mask3.scalar_type(), at::kBool);
  EXPECT_TRUE(at::equal(mask3.to(at::kLong), at::tensor(std::vector<int64_t>{1, 0, 0, 0})));
  EXPECT_EQ(s.valid_mask(0).sum().item<int64_t>(), 4);
  SequenceShard tiny(3, 4);  // a rank with no real rows at all
  EXPECT_EQ(tiny.valid_counts(), (std::vector<int64_t>{1, 1, 1, 0}));

  auto x = at::arange(2 * 13 * 3, at::kFloat).view({2, 13, 3});
  std::vector<at::Tensor> chunks;
  for (int r = 0; r < 4; ++r) chunks.push_back(s.shard(x, 1, r));
  EXPECT_EQ(chunks[3].sizes(), (std::vector<int64_t>{2, 4, 3}));
  EXPECT_TRUE(at::equal(chunks[1], x.narrow(1, 4, 4)));
  EXPECT_TRUE(at::equal(chunks[3].narrow(1, 1, 3), at::zeros({2, 3, 3})));
  EXPECT_TRUE(at::equal(s.unshard(chunks, 1), x));
  EXPECT_THROW(s.shard(x.narrow(1, 0, 12), 1, 0), xfuser::Error);
}

TEST(SequenceShard, TextMode) {
  EXPECT_EQ(choose_text_mode(512, 4), TextMode::kSplit);
  EXPECT_EQ(choose_text_mode(0, 4), TextMode::kSplit);
  EXPECT_EQ(choose_text_mode(77, 2), TextMode::kReplicated);
  EXPECT_EQ(local_text_tokens(TextMode::kSplit, 512, 4), 128);
  EXPECT_EQ(local_text_tokens(TextMode::kReplicated, 77, 2), 77);
  EXPECT_THROW(local_text_tokens(TextMode::kSplit, 77, 2), xfuser::Error);
}

TEST(SequenceShard, GatherOverTheGroupDropsPadding) {
  c10::InferenceMode guard;
  auto& m = mesh(1, world_size());
  SequenceShard s(2 * world_size() + 1, world_size());
  auto x = at::randn({2, s.tokens(), 3}, at::make_generator<at::CPUGeneratorImpl>(7));
  auto back = s.gather(s.shard(x, 1, m.sp->rank()), 1, *m.sp);
  EXPECT_TRUE(at::equal(back, x));
}

// ---- exactness ------------------------------------------------------------------------------

TEST(UspAttention, SplitTextExact) {
  Case c;
  c.text = 8;  // divisible by 2 and 4
  c.image = 12;
  check_all_layouts(c, kFp32Tol);
}

TEST(UspAttention, ReplicatedTextExact) {
  Case c;
  c.text = 5;  // divides no sp > 1
  c.image = 12;
  check_all_layouts(c, kFp32Tol);
}

TEST(UspAttention, ImageTokensNotDividingSpArePaddedAndMasked) {
  Case c;
  c.text = 8;
  c.image = 13;
  check_all_layouts(c, kFp32Tol);
  c.text = 5;
  c.image = 3;  // with sp 4 one rank holds only padding
  check_all_layouts(c, kFp32Tol);
}

TEST(UspAttention, HeadsNotDividingUlyssesArePadded) {
  Case c;
  c.heads = 3;
  c.text = 8;
  c.image = 13;
  check_all_layouts(c, kFp32Tol);
  c.text = 5;
  check_all_layouts(c, kFp32Tol);
}

TEST(UspAttention, TextLast) {
  Case c;
  c.text_first = false;
  c.text = 8;
  c.image = 11;
  check_all_layouts(c, kFp32Tol);
  c.text = 7;
  check_all_layouts(c, kFp32Tol);
}

TEST(UspAttention, NoText) {
  Case c;
  c.text = 0;
  c.image = 17;
  check_all_layouts(c, kFp32Tol);
}

TEST(UspAttention, Bf16WithinLooserBound) {
  Case c;
  c.dtype = at::kBFloat16;
  c.text = 5;
  c.image = 13;
  c.heads = 3;
  check_all_layouts(c, kBf16Tol);
  c.text = 8;
  check_all_layouts(c, kBf16Tol);
}

// Replicated text outputs are bit-identical on every rank of the SP group.
TEST(UspAttention, ReplicatedTextOutputsIdenticalAcrossRanks) {
  c10::InferenceMode guard;
  Case c;
  c.text = 5;
  c.image = 13;
  c.heads = 3;
  const Global g = make_global(c);
  for (auto [u, r] : layouts()) {
    SCOPED_TRACE(layout_name(u, r));
    auto& m = mesh(u, r);
    Result res = run_usp(c, g, m);
    auto txt = res.local.narrow(1, 0, c.text).contiguous();
    auto all = m.sp->all_gather(txt.unsqueeze(0), 0);  // [sp, B, L, H, D]
    for (int s = 0; s < m.config.sp(); ++s) EXPECT_TRUE(at::equal(all[s], txt)) << "sp rank " << s;
  }
}

// A replicated text key must count once. The reference with the text keys repeated sp times
// (xDiT's FLUX quirk) differs clearly; USP matches the correct one.
TEST(UspAttention, ReplicatedTextKeysCountedOnce) {
  c10::InferenceMode guard;
  Case c;
  c.text = 5;
  c.image = 12;
  const Global g = make_global(c);
  const at::Tensor ref = reference(g);
  for (auto [u, r] : layouts()) {
    SCOPED_TRACE(layout_name(u, r));
    const int sp = u * r;
    auto tk = g.k.narrow(1, 0, c.text), tv = g.v.narrow(1, 0, c.text);
    auto ik = g.k.narrow(1, c.text, c.image), iv = g.v.narrow(1, c.text, c.image);
    std::vector<at::Tensor> ks(sp, tk), vs(sp, tv);
    ks.push_back(ik);
    vs.push_back(iv);
    const at::Tensor repeated = backends::attention(g.q, at::cat(ks, 1), at::cat(vs, 1)).out;
    Result res = run_usp(c, g, mesh(u, r));
    ASSERT_EQ(res.mode, TextMode::kReplicated);
    const double err_once = max_rel_error(res.out, ref);
    const double err_repeated = max_rel_error(res.out, repeated);
    EXPECT_LE(err_once, kFp32Tol);
    EXPECT_GT(err_repeated, 1e-2) << "counting text keys sp times would go unnoticed";
    if (world_rank() == 0) {
      std::printf("[usp] %s replicated text: err vs once-counted %.3g, vs %d-times-counted %.3g\n",
                  layout_name(u, r).c_str(), err_once, sp, err_repeated);
    }
  }
}

// Padding keys must be masked: attending the zero padding rows (xDiT's quirk) is measurably off.
TEST(UspAttention, PaddingKeysAreNotAttended) {
  c10::InferenceMode guard;
  Case c;
  c.text = 8;
  c.image = 13;
  const Global g = make_global(c);
  const at::Tensor ref = reference(g);
  for (auto [u, r] : layouts()) {
    SCOPED_TRACE(layout_name(u, r));
    const int sp = u * r;
    const int64_t pad = SequenceShard(c.image, sp).padding();
    if (pad == 0) continue;
    auto zeros = at::zeros({c.batch, pad, c.heads, c.head_dim});
    const at::Tensor unmasked =
        backends::attention(g.q, at::cat({g.k, zeros}, 1), at::cat({g.v, zeros}, 1)).out;
    Result res = run_usp(c, g, mesh(u, r));
    EXPECT_LE(max_rel_error(res.out, ref), kFp32Tol);
    EXPECT_GT(max_rel_error(res.out, unmasked), 1e-3);
  }
}

// ---- communication volume --------------------------------------------------------------------

TEST(UspAttention, CommunicatedBytesEqualTheFormula) {
  c10::InferenceMode guard;
  for (auto dtype : {at::kFloat, at::kBFloat16}) {
    for (auto [text, image, heads] :
         {std::tuple<int64_t, int64_t, int64_t>{8, 12, 4}, {5, 13, 3}, {0, 9, 4}}) {
      Case c;
      c.dtype = dtype;
      c.text = text;
      c.image = image;
      c.heads = heads;
      const Global g = make_global(c);
      for (auto [u, r] : layouts()) {
        SCOPED_TRACE(layout_name(u, r) + ", L " + std::to_string(text) + ", N " +
                     std::to_string(image) + ", H " + std::to_string(heads));
        auto& m = mesh(u, r);
        m.ulysses->reset_stats();
        m.ring->reset_stats();
        const int sp = u * r;
        const SequenceShard shard(c.image, sp);
        const TextMode mode = choose_text_mode(c.text, sp);
        UspShape shape;
        shape.batch = c.batch;
        shape.heads = c.heads;
        shape.head_dim = c.head_dim;
        shape.text_tokens = local_text_tokens(mode, c.text, sp);
        shape.image_tokens = shard.chunk();
        shape.element_size = at::elementSize(dtype);
        shape.text_mode = mode;
        shape.ulysses = u;
        shape.ring = r;

        // Only the USP call itself (run_usp's gather uses the separate sp group).
        UspAttention usp(*m.ulysses, *m.ring, mode, shard.valid_counts());
        const int64_t s_local = shape.text_tokens + shape.image_tokens;
        auto q = g.q.narrow(1, 0, s_local).contiguous();  // any data: only shapes matter here
        usp.attention(q, q, q, shape.text_tokens, true);

        auto bytes = [](Communicator& comm, const char* op) {
          const auto stats = comm.stats();  // a copy: stats() returns by value
          auto it = stats.find(op);
          return it == stats.end() ? int64_t{0} : it->second.bytes;
        };
        auto calls = [](Communicator& comm, const char* op) {
          const auto stats = comm.stats();
          auto it = stats.find(op);
          return it == stats.end() ? int64_t{0} : it->second.calls;
        };
        const CommVolume uv = ulysses_comm_volume(shape), rv = ring_comm_volume(shape);
        const CommVolume total = usp_comm_volume(shape);
        EXPECT_EQ(bytes(*m.ulysses, "all_to_all"), uv.all_to_all);
        EXPECT_EQ(bytes(*m.ulysses, "all_gather"), uv.all_gather);
        EXPECT_EQ(bytes(*m.ring, "send"), rv.send);
        EXPECT_EQ(total.total(), uv.total() + rv.total());
        // Fused Q/K/V: exactly one all_to_all in and one out; R-1 K/V messages.
        EXPECT_EQ(calls(*m.ulysses, "all_to_all"), u > 1 ? 2 : 0);
        EXPECT_EQ(calls(*m.ring, "send"), r - 1);
        if (u > 1) {
          // Spot check of the formula itself: Q, K, V, out each move (U-1)/U of their size.
          const int64_t hp = (c.heads + u - 1) / u * u;
          const int64_t rows = mode == TextMode::kReplicated && c.text > 0
                                   ? shape.image_tokens
                                   : shape.text_tokens + shape.image_tokens;
          EXPECT_EQ(uv.all_to_all, 4 * c.batch * rows * hp * c.head_dim *
                                       static_cast<int64_t>(at::elementSize(dtype)) * (u - 1) / u);
        }
        if (r > 1) {
          EXPECT_GT(rv.send, 0);
        }
      }
    }
  }
}

// ---- errors ---------------------------------------------------------------------------------

// Masked text keys on a replicated text (HunyuanVideo's padded prompts): every layout equals one
// rank with the key mask [B, 1, 1, L + N], text first and last, with padded image chunks, and a
// text key mask without replicated text is refused.
TEST(UspAttention, ReplicatedTextKeyMaskEqualsTheMaskedReference) {
  c10::InferenceMode guard;
  for (const bool text_first : {true, false}) {
    Case c;
    c.text = 6;
    c.image = 13;
    c.text_first = text_first;
    const Global g = make_global(c);
    auto keys = at::ones({c.batch, c.text}, at::kBool);
    keys[0].narrow(0, 4, 2).fill_(false);  // row 0: 4 real tokens, then padding
    keys[1][1] = false;                    // row 1: any pattern
    keys[1][4] = false;
    const auto image_keys = at::ones({c.batch, c.image}, at::kBool);
    backends::AttentionOptions opts;
    opts.mask = (text_first ? at::cat({keys, image_keys}, 1) : at::cat({image_keys, keys}, 1))
                    .view({c.batch, 1, 1, -1});
    const at::Tensor ref = backends::attention(g.q, g.k, g.v, opts).out;
    for (auto [u, r] : layouts()) {
      SCOPED_TRACE(layout_name(u, r) + (text_first ? ", text first" : ", text last"));
      auto& m = mesh(u, r);
      const int sp = m.config.sp(), sp_rank = m.sp->rank();
      const SequenceShard image(c.image, sp);
      const int64_t text_start = text_first ? 0 : c.image, image_start = text_first ? c.text : 0;
      auto local = [&](const at::Tensor& x) {
        auto txt = x.narrow(1, text_start, c.text);
        auto img = image.shard(x.narrow(1, image_start, c.image), 1, sp_rank);
        return text_first ? at::cat({txt, img}, 1) : at::cat({img, txt}, 1);
      };
      UspAttention usp(*m.ulysses, *m.ring, TextMode::kReplicated, image.valid_counts());
      const at::Tensor out =
          usp.attention(local(g.q), local(g.k), local(g.v), c.text, text_first, {}, keys);
      const at::Tensor want = local(ref);
      // Compare the real rows (a padded chunk's extra rows are not outputs).
      const int64_t valid = image.valid_counts()[sp_rank];
      const int64_t img_at = text_first ? c.text : 0;
      const double err_text =
          max_rel_error(out.narrow(1, text_start == 0 ? 0 : image.chunk(), c.text),
                        want.narrow(1, text_start == 0 ? 0 : image.chunk(), c.text));
      const double err_image =
          valid == 0 ? 0.0
                     : max_rel_error(out.narrow(1, img_at, valid), want.narrow(1, img_at, valid));
      EXPECT_LE(err_text, kFp32Tol);
      EXPECT_LE(err_image, kFp32Tol);
      if (world_rank() == 0) {
        std::printf("[usp] %s text key mask, text %s: text %.3g image %.3g\n",
                    layout_name(u, r).c_str(), text_first ? "first" : "last", err_text, err_image);
      }
      if (sp > 1) {
        UspAttention split(*m.ulysses, *m.ring, TextMode::kSplit, image.valid_counts());
        EXPECT_THROW(
            split.attention(local(g.q), local(g.k), local(g.v), c.text, text_first, {}, keys),
            xfuser::Error);
      }
    }
  }
}

TEST(UspAttention, RejectsMasksUnderSequenceParallelism) {
  c10::InferenceMode guard;
  auto& m = mesh(world_size(), 1);
  UspAttention usp(*m.ulysses, *m.ring, TextMode::kSplit, std::vector<int64_t>(world_size(), 4));
  auto q = at::randn({1, 4, world_size(), 8});
  auto mask = at::ones({1, 4}, at::kBool);
  EXPECT_THROW(usp.attention(q, q, q, 0, true, mask), xfuser::Error);
  EXPECT_THROW(UspAttention(*m.ulysses, *m.ring, TextMode::kSplit, {4}), xfuser::Error);
}

}  // namespace
}  // namespace xfuser::parallel
