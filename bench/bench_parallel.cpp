// bench_parallel: the sequence-parallel FLUX forward (Ulysses, ring) against one rank, and the
// bytes every rank sends against the analytic formula of each strategy. Run under mpirun:
//
//   mpirun -np 2 bench_parallel [--threads N] [--configs small,medium] [--dtypes fp32,bf16]
//                               [--strategies ulysses,ring] [--reps R] [--warmup W]
//                               [--timeout S] [--out FILE]
//
// For every config and dtype (configs of bench_flux, seeded random weights, identical on every
// rank):
//   T1: rank 0 alone runs `warmup` + `reps` model.forward() while the other ranks wait in a
//       barrier (MpiCommunicator polls with sleeps of up to 1 ms, so they leave the cores to
//       rank 0); median of the timed forwards.
//   T2: every rank runs models/flux/flux_parallel.h sequence_parallel_forward on the global
//       inputs (Ulysses: ulysses degree P; ring: ring degree P); each timed forward starts after
//       a world barrier and its time is the slowest rank's; median over `reps`.
//   efficiency = T1 / (P * T2) (1.0: perfect scaling over P ranks).
//   bytes: ProcessGroups::stats() over the timed forwards (per group kind and operation: calls,
//       bytes sent by this rank, seconds), per forward, against comm_formula() below; the ratio
//       measured / formula is reported per rank (1.0 exactly when the code moves what the
//       formula says).
//   max_rel_error: the parallel output against the 1-rank output (rank 0), max|a-b| / max|b|.
// The JSON is written by rank 0 and holds every rank's byte counts.
#include <cmath>
#include <cstring>
#include <iostream>
#include <numeric>

#include "backends/backend.h"
#include "bench/bench_common.h"
#include "bench/bench_flux_configs.h"
#include "models/common/kernels.h"
#include "models/flux/flux_parallel.h"
#include "parallel/mpi_communicator.h"
#include "parallel/mpi_env.h"
#include "parallel/process_groups.h"
#include "parallel/sequence_shard.h"
#include "parallel/usp_attention.h"
#include "parallel/world_config.h"

namespace xb = xfuser::bench;
namespace xp = xfuser::parallel;
using xb::BenchConfig;
using xfuser::models::flux::FluxConfig;
using xfuser::models::flux::FluxInputs;
using xfuser::models::flux::FluxTransformer2DModel;

namespace {

struct Strategy {
  std::string name;  // "ulysses", "ring"
  int ulysses = 1;
  int ring = 1;
};

// Expected (calls, bytes) of one operation kind on one group kind, per forward and rank.
struct Expected {
  int64_t calls = 0;
  int64_t bytes = 0;
};
// group kind ("ulysses", "ring", "sp") -> operation -> expected.
using Formula = std::map<std::string, std::map<std::string, Expected>>;

// Bytes one rank SENDS in one sequence_parallel_forward, by group and operation, counting what
// our code does (models/flux/flux_parallel.cpp, parallel/usp_attention.cpp; every op counts the
// bytes this rank sends, parallel/communicator.h):
//
//   P = U * R ranks. Image tokens N are padded to P chunks of c = ceil(N / P) rows. Text tokens L
//   are split (T = L / P rows per rank) when L % P == 0, else replicated (T = L on every rank).
//   Local sequence S = T + c. e = bytes per element of the compute dtype, B = batch, H heads
//   padded to Hp = ceil(H / U) * U, D = head dim, A = attention layers = double + single blocks
//   (one joint attention each).
//   Sd = rows that go through the Ulysses all-to-all: S with split text, c with replicated text.
//
//   Ulysses group, per attention layer (only when U > 1):
//     Q, K, V: ONE all_to_all of the stacked [U, 3, B, Sd, Hp/U, D] buffer; chunk j goes to
//       Ulysses rank j, so a rank sends U-1 of its U chunks: 3*B*Sd*Hp*D*e * (U-1)/U bytes.
//     output: ONE all_to_all of [U, B, Sd, Hp/U, D]: B*Sd*Hp*D*e * (U-1)/U bytes.
//     => 2 all_to_all calls, 4*B*Sd*Hp*D*e*(U-1)/U bytes.
//     replicated text only: the text output of this rank's heads [B, T, Hp/U, D] is
//       all_gathered over heads: 1 all_gather call, B*T*(Hp/U)*D*e*(U-1) bytes.
//   Ring group, per attention layer (only when R > 1): the stacked K/V block
//     [2, B, U*Sd, Hp/U, D] (after Ulysses) is isent to the next ring rank R-1 times while the
//     current block is computed: R-1 send calls, (R-1)*2*B*U*Sd*(Hp/U)*D*e bytes; the matching
//     R-1 irecvs count 0 bytes.
//   SP group, once per forward: the output chunks [B, c, C_out] (C_out = patch^2 * out_channels)
//     are all_gathered: 1 all_gather call, B*c*C_out*e*(P-1) bytes.
//
//   So with P = 2, split text: Ulysses sends A*(2*B*S*H*D*e) + B*c*C_out*e per forward (half of
//   each Q, K, V and output); ring sends A*(2*B*S*H*D*e) + B*c*C_out*e (all of K and V once).
Formula comm_formula(const FluxConfig& cfg, const BenchConfig& b, const Strategy& st,
                     int64_t element_size) {
  const int64_t u = st.ulysses, r = st.ring, p = u * r;
  const int64_t batch = 1, n = b.grid * b.grid, l = b.text_tokens;
  const int64_t c = (n + p - 1) / p;
  const bool replicated = l % p != 0;
  const int64_t t = replicated ? l : l / p;
  const int64_t s = t + c;
  const int64_t sd = replicated && t > 0 ? c : s;
  const int64_t h = cfg.num_attention_heads, d = cfg.attention_head_dim;
  const int64_t hp = (h + u - 1) / u * u;
  const int64_t layers = cfg.num_layers + cfg.num_single_layers;
  const int64_t e = element_size;
  Formula f;
  if (u > 1) {
    f["ulysses"]["all_to_all"] = {2 * layers, layers * 4 * batch * sd * hp * d * e / u * (u - 1)};
    if (replicated && t > 0) {
      f["ulysses"]["all_gather"] = {layers, layers * batch * t * (hp / u) * d * e * (u - 1)};
    }
  }
  if (r > 1) {
    f["ring"]["send"] = {layers * (r - 1),
                         layers * (r - 1) * 2 * batch * u * sd * (hp / u) * d * e};
    f["ring"]["recv"] = {layers * (r - 1), 0};
  }
  if (p > 1) f["sp"]["all_gather"] = {1, batch * c * cfg.output_dim() * e * (p - 1)};
  return f;
}

// The library's own per-call volume (parallel::usp_comm_volume) times the attention layers, plus
// the output gather: a second, independent statement of the same count.
int64_t library_formula_bytes(const FluxConfig& cfg, const BenchConfig& b, const Strategy& st,
                              int64_t element_size) {
  const int p = st.ulysses * st.ring;
  const int64_t n = b.grid * b.grid, l = b.text_tokens;
  const xp::TextMode mode = xp::choose_text_mode(l, p);
  xp::UspShape shape;
  shape.batch = 1;
  shape.heads = cfg.num_attention_heads;
  shape.head_dim = cfg.attention_head_dim;
  shape.text_tokens = xp::local_text_tokens(mode, l, p);
  shape.image_tokens = (n + p - 1) / p;
  shape.element_size = element_size;
  shape.text_mode = mode;
  shape.ulysses = st.ulysses;
  shape.ring = st.ring;
  const int64_t layers = cfg.num_layers + cfg.num_single_layers;
  return layers * xp::usp_comm_volume(shape).total() +
         shape.image_tokens * cfg.output_dim() * element_size * (p - 1);
}

// "ulysses[0,1]" -> "ulysses".
std::string group_kind(const std::string& name) { return name.substr(0, name.find('[')); }

double max_rel_error(const at::Tensor& a, const at::Tensor& b) {
  auto a64 = a.to(at::kDouble), b64 = b.to(at::kDouble);
  const double denom = b64.abs().max().item<double>();
  const double num = (a64 - b64).abs().max().item<double>();
  return denom == 0.0 ? num : num / denom;
}

}  // namespace

int main(int argc, char** argv) {
  int world_size = 1;
  try {
    xp::MpiEnvironment mpi(&argc, &argv);
    world_size = mpi.size();
    const int rank = mpi.rank();
    xb::Args args(argc, argv, {});
    args.check_known(
        {"threads", "configs", "dtypes", "strategies", "reps", "warmup", "timeout", "out"});
    XF_CHECK(world_size >= 2, "bench_parallel needs at least 2 ranks: run it under mpirun -np 2");
    const int threads = static_cast<int>(args.get_int("threads", 1));
    const bool openblas = xb::set_threads(threads);
    // The overridable ops as the runner resolves them (docs/backends.md).
    const xfuser::models::KernelTable kernels =
        xfuser::models::KernelTable::resolve(xfuser::backends::backend_for("cpu"), false);
    xfuser::models::KernelScope kernel_scope(&kernels);
    const int reps_override = static_cast<int>(args.get_int("reps", 0));
    const int warmup = static_cast<int>(args.get_int("warmup", 1));
    XF_CHECK(reps_override >= 0 && warmup >= 0, "--reps and --warmup must be >= 0");
    const auto configs = xb::select_configs(args.get("configs", "small,medium"), "configs");
    const auto dtypes = xb::select_dtypes(args.get("dtypes", "fp32"), "dtypes");
    const int p = world_size;
    std::vector<Strategy> strategies;
    {
      const std::string list = "," + args.get("strategies", "ulysses,ring") + ",";
      if (list.find(",ulysses,") != std::string::npos) strategies.push_back({"ulysses", p, 1});
      if (list.find(",ring,") != std::string::npos) strategies.push_back({"ring", 1, p});
      XF_CHECK(!strategies.empty(), "--strategies selects nothing (ulysses, ring)");
    }
    const auto timeout = std::chrono::milliseconds(args.get_int("timeout", 3600) * 1000);
    auto world = std::make_shared<xp::MpiCommunicator>("world", timeout);

    c10::InferenceMode guard;
    nlohmann::json runs = nlohmann::json::array();
    for (const auto& b : configs) {
      const FluxConfig cfg = xb::flux_config(b);
      const FluxInputs inputs = xb::make_inputs(cfg, b);
      const int reps = reps_override > 0 ? reps_override : std::min(b.default_reps, 3);
      for (auto dtype : dtypes) {
        FluxTransformer2DModel model(cfg);
        model.init_random(7, 0.02, dtype);  // the same weights on every rank
        const int64_t esize = static_cast<int64_t>(c10::elementSize(dtype));

        // ---- T1: rank 0 alone ------------------------------------------------------------
        world->barrier();
        std::vector<double> t1;
        at::Tensor reference;  // [1, N, C_out], rank 0 only
        if (rank == 0) {
          for (int i = 0; i < warmup; ++i) model.forward(inputs);
          for (int i = 0; i < reps; ++i) {
            const double t0 = xb::now_seconds();
            reference = model.forward(inputs);
            t1.push_back(xb::now_seconds() - t0);
          }
          std::cerr << "parallel " << b.name << " " << xb::dtype_name(dtype) << ": 1 rank "
                    << xb::median(t1) * 1e3 << " ms\n";
        }
        world->barrier();  // the other ranks idle here while rank 0 measures

        for (const auto& st : strategies) {
          auto groups = std::make_shared<xp::ProcessGroups>(
              xp::WorldConfig::from_degrees(p, 1, 1, 1, st.ulysses, st.ring, 1), world);
          for (int i = 0; i < warmup; ++i) {
            xfuser::models::flux::sequence_parallel_forward(model, inputs, *groups);
          }
          world->barrier();
          groups->reset_stats();
          std::vector<double> mine;
          at::Tensor out;
          for (int i = 0; i < reps; ++i) {
            world->barrier();
            const double t0 = xb::now_seconds();
            out = xfuser::models::flux::sequence_parallel_forward(model, inputs, *groups);
            mine.push_back(xb::now_seconds() - t0);
          }
          const auto stats = groups->stats();  // before any further communication

          // Per forward, per rank: measured (calls, bytes, seconds) by group kind and op.
          const Formula formula = comm_formula(cfg, b, st, esize);
          nlohmann::json measured = nlohmann::json::object();
          int64_t measured_bytes = 0;
          for (const auto& [group, ops] : stats) {
            const std::string kind = group_kind(group);
            if (kind == "world") continue;  // the timing barriers
            for (const auto& [op, s] : ops) {
              measured[kind][op] = {{"group", group},
                                    {"calls", static_cast<double>(s.calls) / reps},
                                    {"bytes", static_cast<double>(s.bytes) / reps},
                                    {"seconds", s.seconds / reps}};
              measured_bytes += s.bytes;
            }
          }
          int64_t formula_bytes = 0;
          nlohmann::json expected = nlohmann::json::object();
          bool calls_match = true;
          for (const auto& [kind, ops] : formula) {
            for (const auto& [op, e] : ops) {
              expected[kind][op] = {{"calls", e.calls}, {"bytes", e.bytes}};
              formula_bytes += e.bytes;
              const double got = measured.contains(kind) && measured[kind].contains(op)
                                     ? measured[kind][op]["calls"].get<double>()
                                     : 0.0;
              calls_match = calls_match && got == static_cast<double>(e.calls);
            }
          }
          for (auto k = measured.begin(); k != measured.end(); ++k) {  // ops not in the formula
            for (auto o = k.value().begin(); o != k.value().end(); ++o) {
              if (!formula.count(k.key()) || !formula.at(k.key()).count(o.key())) {
                calls_match = false;
              }
            }
          }
          const double bytes_per_forward = static_cast<double>(measured_bytes) / reps;
          nlohmann::json rank_json = {
              {"rank", rank},
              {"seconds", mine},
              {"measured", measured},
              {"measured_bytes_per_forward", bytes_per_forward},
              {"formula", expected},
              {"formula_bytes_per_forward", formula_bytes},
              {"library_formula_bytes_per_forward", library_formula_bytes(cfg, b, st, esize)},
              {"bytes_ratio", formula_bytes > 0 ? bytes_per_forward / formula_bytes : 0.0},
              {"calls_match", calls_match}};

          // Slowest rank per timed forward; every rank's report to rank 0.
          at::Tensor times = at::tensor(mine, at::kDouble);
          world->all_reduce(times, xp::ReduceOp::kMax);
          std::vector<double> t2(times.data_ptr<double>(), times.data_ptr<double>() + reps);
          const std::string text = rank_json.dump();
          at::Tensor len = at::tensor(std::vector<int64_t>{static_cast<int64_t>(text.size())});
          world->all_reduce(len, xp::ReduceOp::kMax);
          at::Tensor buf = at::zeros({len.item<int64_t>()}, at::kByte);
          std::memcpy(buf.data_ptr(), text.data(), text.size());
          at::Tensor all = world->all_gather(buf, 0);  // [P * len]
          groups.reset();

          if (rank == 0) {
            nlohmann::json per_rank = nlohmann::json::array();
            double worst_ratio = 1.0;
            bool all_calls = true;
            for (int r = 0; r < p; ++r) {
              const auto* bytes = all.data_ptr<uint8_t>() + r * len.item<int64_t>();
              std::string s(reinterpret_cast<const char*>(bytes), len.item<int64_t>());
              s.resize(std::strlen(s.c_str()));
              per_rank.push_back(nlohmann::json::parse(s));
              const double ratio = per_rank.back()["bytes_ratio"].get<double>();
              if (std::abs(ratio - 1.0) > std::abs(worst_ratio - 1.0)) worst_ratio = ratio;
              all_calls = all_calls && per_rank.back()["calls_match"].get<bool>();
            }
            const double t1m = xb::median(t1), t2m = xb::median(t2);
            const double err = max_rel_error(out, reference);
            nlohmann::json r = {{"config", b.name},
                                {"dtype", xb::dtype_name(dtype)},
                                {"strategy", st.name},
                                {"ranks", p},
                                {"ulysses_degree", st.ulysses},
                                {"ring_degree", st.ring},
                                {"hidden", cfg.inner_dim()},
                                {"image_tokens", b.grid * b.grid},
                                {"text_tokens", b.text_tokens},
                                {"warmup", warmup},
                                {"reps", reps},
                                {"t1_seconds", t1},
                                {"t2_seconds", t2},
                                {"t1_median_seconds", t1m},
                                {"t2_median_seconds", t2m},
                                {"speedup", t1m / t2m},
                                {"efficiency", t1m / (p * t2m)},
                                {"max_rel_error_vs_1rank", err},
                                {"bytes_ratio_worst_rank", worst_ratio},
                                {"calls_match_formula", all_calls},
                                {"per_rank", per_rank}};
            std::cerr << "parallel " << b.name << " " << xb::dtype_name(dtype) << " " << st.name
                      << " " << p << ": " << t2m * 1e3 << " ms, efficiency " << t1m / (p * t2m)
                      << ", bytes measured/formula " << worst_ratio << ", calls "
                      << (all_calls ? "match" : "DIFFER") << ", max rel error " << err << "\n";
            runs.push_back(r);
          }
        }
      }
    }
    if (rank == 0) {
      nlohmann::json out = {
          {"benchmark", "flux_sequence_parallel"},
          {"environment", xb::environment_json(threads, openblas)},
          {"world_size", p},
          {"efficiency_formula", "T1 / (P * T2)"},
          {"bytes_formula",
           "per rank and forward: ulysses all_to_all A*4*B*Sd*Hp*D*e*(U-1)/U (+ replicated text "
           "all_gather A*B*T*Hp/U*D*e*(U-1)); ring send A*(R-1)*2*B*U*Sd*Hp/U*D*e; sp all_gather "
           "B*c*C_out*e*(P-1)"},
          {"runs", runs}};
      xb::emit_json(args, out);
    }
    world->barrier();
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "bench_parallel: " << e.what() << "\n";
    if (world_size > 1) xp::MpiEnvironment::abort(1);
    return 1;
  }
}
