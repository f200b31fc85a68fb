#include "models/dit/dit_checks.h"

#include <algorithm>
#include <map>
#include <utility>

#include <nlohmann/json.hpp>

#include "backends/error.h"
#include "models/common/component.h"
#include "models/common/fsdp.h"
#include "models/dit/dit_parallel.h"
#include "models/dit/dit_pipefusion.h"
#include "models/weights/component_folder.h"

namespace xfuser::models::dit {
namespace fs = std::filesystem;

namespace {

// A parameter a component loads: its elements, and the dtype it keeps whatever the run's (Wan's
// _keep_in_fp32_modules), if any.
struct Param {
  std::string name;
  uint64_t elements = 0;
  int fixed_bytes = 0;  // 0: the component's dtype
};

// The parameters a component loads: the module its config builds declares them (a transformer
// through the family's DiT factory) with their shapes and kept dtypes; no weight file is opened,
// so configs alone are enough (a checkpoint may hold more: FLUX.2's text encoder checkpoint has
// layers past the one it uses).
std::vector<Param> folder_params(const fs::path& dir, bool transformer) {
  std::shared_ptr<Module> module;
  if (transformer) {
    module = describe_dit_transformer(dir.string());
  } else {
    const ComponentFolder folder = open_component_config(dir.string());
    XF_CONTEXT("the parameters of ", folder.class_name, " from ", folder.config_path);
    module = ComponentRegistry::create(folder.class_name, folder.config, folder.config_path);
  }
  std::vector<Param> out;
  for (const auto& [name, slot] : std::as_const(*module).named_parameters()) {
    uint64_t n = 1;
    for (int64_t d : slot->stored_shape()) n *= static_cast<uint64_t>(d);
    out.push_back({name, n, slot->dtype ? static_cast<int>(c10::elementSize(*slot->dtype)) : 0});
  }
  return out;
}

uint64_t param_bytes(const Param& p, uint64_t bytes) {
  return p.elements * (p.fixed_bytes > 0 ? static_cast<uint64_t>(p.fixed_bytes) : bytes);
}

uint64_t parameter_bytes(const fs::path& dir, bool transformer, uint64_t bytes) {
  uint64_t total = 0;
  for (const Param& p : folder_params(dir, transformer)) total += param_bytes(p, bytes);
  return total;
}

// Under FSDP: a component's parameter bytes, and the most of them it gathers at once (two blocks,
// or its parameters outside the blocks and one block; models/common/fsdp.h).
struct ShardedBytes {
  uint64_t total = 0;
  uint64_t gathered = 0;
};

ShardedBytes sharded_bytes(const fs::path& dir, bool transformer,
                           std::vector<std::string> block_prefixes, uint64_t bytes) {
  const std::vector<Param> params = folder_params(dir, transformer);
  if (block_prefixes.empty()) {
    std::vector<std::string> names;
    for (const Param& p : params) names.push_back(p.name);
    block_prefixes = FsdpSharder::find_block_prefixes(names);
  }
  std::map<std::pair<int, int64_t>, uint64_t> blocks;
  uint64_t rest = 0;
  ShardedBytes c;
  for (const Param& p : params) {
    const uint64_t n = param_bytes(p, bytes);
    c.total += n;
    const auto key = block_list_key(p.name, block_prefixes);
    (key.first >= 0 ? blocks[key] : rest) += n;
  }
  TwoLargest<uint64_t> largest;
  for (const auto& [key, n] : blocks) largest.add(n);
  c.gathered = std::max(largest.sum(), rest + largest.first);
  return c;
}

// The component's own model of a call's activations (Component::activation_bytes), from the
// module its config builds (no weight is read).
uint64_t component_activation_bytes(const fs::path& dir, const ActivationQuery& query) {
  const ComponentFolder folder = open_component_config(dir.string());
  const auto component =
      ComponentRegistry::create(folder.class_name, folder.config, folder.config_path);
  return component->activation_bytes(query);
}

}  // namespace

MemoryEstimate check_dit_run(const fs::path& dir, const RunLayout& run, const DiTRunTraits& t) {
  const auto model = describe_dit_transformer((dir / "transformer").string());
  const std::string config_path = (dir / "transformer" / "config.json").string();
  const ComponentFolder vae_folder = open_component_config((dir / "vae").string());

  XF_CHECK(run.cfg == 1 || t.cfg, "--use_cfg_parallel needs ", t.cfg_parallel_needs);
  XF_CHECK(model->num_heads() % run.tensor == 0, "--tensor_parallel_degree ", run.tensor,
           " does not divide the ", model->num_heads(), " attention heads of ", config_path,
           ": every rank must hold whole heads");
  XF_CHECK(run.pipefusion == 1 || run.tensor == 1,
           "--pipefusion_parallel_degree with --tensor_parallel_degree is not supported yet: use "
           "one of them");
  const int64_t multiple = t.pixels_per_token;
  XF_CHECK(run.height % multiple == 0, "--height ", run.height, " must be a multiple of ", multiple,
           " for this ", t.family, " pipeline (", vae_folder.config_path, ", ", config_path, ")");
  XF_CHECK(run.width % multiple == 0, "--width ", run.width, " must be a multiple of ", multiple,
           " for this ", t.family, " pipeline (", vae_folder.config_path, ", ", config_path, ")");
  XF_CHECK(t.max_grid == 0 ||
               (run.height / multiple <= t.max_grid && run.width / multiple <= t.max_grid),
           "--height ", run.height, " x --width ", run.width, " exceeds the ",
           t.max_grid * multiple, " pixels a side that the transformer's position table holds (",
           config_path, ")");
  XF_CHECK(run.max_sequence_length >= 1 && run.max_sequence_length <= t.max_sequence_length,
           "--max_sequence_length must be in [1, ", t.max_sequence_length, "] for ", t.family,
           " (got ", run.max_sequence_length, ")");
  if (run.pipefusion > 1) {
    pipefusion_stage_layers(*model, run.pipefusion, run.pipefusion_layers, t.blocks_what);
    const int patches = run.num_pipeline_patch > 0 ? run.num_pipeline_patch : run.pipefusion;
    pipefusion_patch_rows(t.latent_frames * (run.height / multiple), patches);
  }

  // Memory of one rank. Weights in each component's load dtype; the transformer split over tp
  // ranks or pp stages.
  const uint64_t bytes = static_cast<uint64_t>(run.bytes_per_element);
  auto part_bytes = [&](const std::string& part) {
    return t.float32_components.count(part) ? uint64_t{4} : bytes;
  };
  MemoryEstimate m;
  const uint64_t tbytes = static_cast<uint64_t>(run.transformer_bytes_per_element);
  m.weights = parameter_bytes(dir / "transformer", true, tbytes) /
              static_cast<uint64_t>(run.tensor * run.pipefusion);
  for (const auto& part : t.components) {
    const bool expert = part == "transformer_2";
    m.weights += parameter_bytes(dir / part, expert, expert ? tbytes : part_bytes(part));
  }
  if (run.fsdp > 1) {
    // FSDP: 1/N of every component but the VAE, plus what one component gathers at once.
    const uint64_t n = static_cast<uint64_t>(run.fsdp);
    const ShardedBytes tr =
        sharded_bytes(dir / "transformer", true, model->block_list_prefixes(), tbytes);
    uint64_t shards = (tr.total + n - 1) / n;
    uint64_t gathered = tr.gathered;
    for (const auto& part : t.components) {
      if (part.rfind("vae", 0) == 0) {
        shards += parameter_bytes(dir / part, false, part_bytes(part));
        continue;
      }
      const bool expert = part == "transformer_2";
      const ShardedBytes c = sharded_bytes(
          dir / part, expert, expert ? model->block_list_prefixes() : std::vector<std::string>{},
          expert ? tbytes : part_bytes(part));
      shards += (c.total + n - 1) / n;
      gathered = std::max(gathered, c.gathered);
    }
    m.weights = shards + gathered;
  }

  // Encoding the prompt: each encoder runs on its own (one call per prompt kind), the largest
  // call is the stage's peak.
  for (const auto& [part, tokens] : t.encoders) {
    ActivationQuery q;
    q.batch = run.batch_size;
    q.tokens = tokens;
    q.bytes = static_cast<int>(part_bytes(part));
    q.cpu = run.cpu;
    m.text_encoders = std::max(m.text_encoders, component_activation_bytes(dir / part, q));
  }

  // One denoising step. The CFG branches run one after the other, on their own ranks, or as one
  // batch.
  const uint64_t batch =
      static_cast<uint64_t>(run.batch_size) * (t.cfg && t.cfg_batched && run.cfg == 1 ? 2 : 1);
  const uint64_t image_tokens = static_cast<uint64_t>(t.latent_frames) *
                                static_cast<uint64_t>(run.height / multiple) *
                                static_cast<uint64_t>(run.width / multiple);
  const uint64_t joint = image_tokens + static_cast<uint64_t>(t.text_tokens);
  const uint64_t sp = static_cast<uint64_t>(run.ulysses) * static_cast<uint64_t>(run.ring);
  const uint64_t tokens = (joint + sp - 1) / sp;
  const uint64_t dim = static_cast<uint64_t>(model->hidden_size());
  const uint64_t hidden = batch * tokens * dim * bytes;  // one [B, S, D] tensor of this rank
  // A block's live tensors at its peak: the residual streams, the norms and modulations, q / k /
  // v, the attention output and the 4x MLP (measured: bench/run_plan_check).
  // Tensor parallel splits the heads and the MLP's hidden units, ~10 of a block's 16 tensors.
  m.transformer = hidden * static_cast<uint64_t>(t.live_hidden_tensors) *
                  (6 + 10 / static_cast<uint64_t>(run.tensor)) / 16;
  if (bytes < 4)
    m.transformer += batch * tokens * dim * 4 * static_cast<uint64_t>(t.half_fp32_tensors);
  // Cross-attention: the text's keys and values in every head, and their projections.
  const uint64_t cross = static_cast<uint64_t>(t.cross_attention_tokens);
  m.transformer += 4 * batch * cross * dim * bytes;
  // Sequence parallel: Ulysses' all-to-alls hold q, k, v and the output in both layouts; ring
  // attention a second k / v in flight.
  if (run.ulysses > 1) m.comm += 8 * hidden;
  if (run.ring > 1) m.comm += 4 * hidden;
  m.transformer += m.comm;
  if (run.cpu) {
    // The CPU attention kernels' scratch (backends/attention.cpp), per call: the blocked kernel
    // holds the fp32 scores and probabilities of one query block (~1 MiB of scores, >= 16 rows)
    // for one head at a time; with a mask, the chunked kernel holds scores of up to 2^24 elements
    // for every head at once, and k / v in fp32.
    const uint64_t heads = static_cast<uint64_t>(model->num_heads() / run.tensor);
    const uint64_t keys = run.ring > 1 ? tokens : joint;
    const uint64_t queries = run.ulysses > 1 ? joint / static_cast<uint64_t>(run.ring) : tokens;
    const uint64_t head_dim = dim / static_cast<uint64_t>(model->num_heads());
    // Self-attention, or cross-attention's queries against the text.
    const uint64_t cross_rows = std::min<uint64_t>(
        tokens, std::max<uint64_t>(16, (uint64_t{1} << 20) / (4 * std::max<uint64_t>(cross, 1))));
    const uint64_t cross_scratch =
        cross > 0 ? cross_rows * cross * (8 + (bytes == 4 ? 0 : bytes)) + cross * head_dim * 4 : 0;
    if (t.masked_attention && batch > 1) {
      const uint64_t scores = std::min<uint64_t>(uint64_t{1} << 24, batch * heads * queries * keys);
      m.transformer += scores * 4 + 2 * batch * heads * keys * head_dim * 4;
    } else {
      const uint64_t rows = std::min<uint64_t>(
          queries, std::max<uint64_t>(16, (uint64_t{1} << 20) / (4 * std::max<uint64_t>(keys, 1))));
      m.transformer += std::max(rows * keys * (8 + (bytes == 4 ? 0 : bytes)) + keys * head_dim * 4,
                                cross_scratch);
    }
  }

  // The VAE's own model of encoding an input picture or video, and of decoding (a tile with
  // --enable_tiling).
  auto vae_call = [&](const char* method, int64_t frames, int64_t height, int64_t width) {
    ActivationQuery q;
    q.method = method;
    q.batch = run.batch_size;
    q.frames = frames;
    q.height = height;
    q.width = width;
    q.tiled = run.enable_tiling;
    q.bytes = static_cast<int>(part_bytes("vae"));
    q.cpu = run.cpu;
    return component_activation_bytes(dir / "vae", q);
  };
  if (t.encode_height > 0) {
    m.image_encode = vae_call("encode", t.encode_frames, t.encode_height, t.encode_width);
  }
  m.vae = vae_call("decode", std::max(1, run.num_frames), run.height, run.width);
  return m;
}

}  // namespace xfuser::models::dit
