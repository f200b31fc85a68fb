#include "models/common/fsdp.h"

#include <algorithm>
#include <array>
#include <map>
#include <set>
#include <utility>

#include <ATen/ATen.h>

#include "backends/error.h"
#include "parallel/communicator.h"
#include "profiling/trace.h"

namespace xfuser::models {

struct FsdpGroup final : ParamGroup {
  void use() override { owner->use(*this); }
  FsdpSharder* owner = nullptr;
  FsdpComponent* component = nullptr;
  std::string name;  // "transformer", "transformer: transformer_blocks.3"
  bool block = false;
  size_t index = 0;     // position among the component's blocks
  int64_t ordinal = 0;  // identity carried by its gathers: component << 32 | group
  struct Piece {
    at::Tensor shard;  // this rank's chunk, [chunk, ...]
    int64_t rows = 0;  // dim 0 of the whole tensor
  };
  struct Entry {
    ParamSlot* slot = nullptr;
    Piece tensor, data, scale;  // `tensor`, or fp8's values and scales
    void point_at(at::Tensor t, at::Tensor d, at::Tensor s) const {
      if (slot->fp8) {
        slot->fp8->data = std::move(d);
        slot->fp8->scale = std::move(s);
      } else {
        slot->tensor = std::move(t);
      }
    }
    void point_at_shards() const { point_at(tensor.shard, data.shard, scale.shard); }
  };
  std::vector<Entry> entries;
  int64_t bytes = 0;                // whole parameters
  int64_t shard_bytes = 0;          // this rank's chunks
  bool gathered = false;            // gathered or being gathered
  std::vector<at::Tensor> buffers;  // the gathers' outputs (the whole parameters are views)
  at::Tensor identity;              // [size, 2] int64 after the gather (bytes until then)
  std::unique_ptr<parallel::Work> work;
};

struct FsdpComponent {
  std::string name;
  std::shared_ptr<Module> module;
  std::vector<std::unique_ptr<FsdpGroup>> groups;
  std::vector<FsdpGroup*> blocks;  // forward order
};

namespace {

int64_t shard_nbytes(const at::Tensor& t) {
  return t.defined() ? t.numel() * static_cast<int64_t>(t.element_size()) : 0;
}

bool is_block_index(const std::string& s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// The bytes of a contiguous tensor, flat (what travels).
at::Tensor as_bytes(const at::Tensor& t) { return t.reshape({-1}).view(at::kByte); }

}  // namespace

std::vector<std::string> FsdpSharder::find_block_prefixes(const std::vector<std::string>& names) {
  std::vector<std::string> order;
  std::map<std::string, std::set<std::string>> indices;
  for (const auto& name : names) {
    // The outermost numbered segment: "encoder.block.3.layer.0.SelfAttention.q.weight" ->
    // "encoder.block." with index 3.
    size_t start = 0;
    while (start < name.size()) {
      const size_t dot = name.find('.', start);
      if (dot == std::string::npos) break;
      if (is_block_index(name.substr(start, dot - start))) {
        const std::string prefix = name.substr(0, start);
        if (!prefix.empty()) {
          if (!indices.count(prefix)) order.push_back(prefix);
          indices[prefix].insert(name.substr(start, dot - start));
        }
        break;
      }
      start = dot + 1;
    }
  }
  std::vector<std::string> out;
  for (const auto& p : order) {
    if (indices[p].size() >= 2) out.push_back(p);
  }
  return out;
}

FsdpSharder::FsdpSharder(parallel::Communicator& group, c10::Device device)
    : group_(group), device_(device) {
  stats_.group_size = group_.size();
}

FsdpSharder::~FsdpSharder() {
  // The components may outlive the sharder (shared): their slots go back to their shards and
  // no longer call it. A gather still in flight is waited for (its buffers are in use by the
  // communicator); a failure here follows another error, which is the one to report.
  for (auto& c : components_) {
    for (auto& g : c->groups) {
      if (g->work) {
        try {
          g->work->wait();
        } catch (const std::exception&) {
        }
        g->work.reset();
      }
      for (auto& e : g->entries) {
        e.slot->group = nullptr;
        e.point_at_shards();
      }
    }
  }
}

void FsdpSharder::configure(LoadOptions& options) const {
  options.row_part = group_.rank();
  options.row_parts = group_.size();
}

void FsdpSharder::add_component(const std::string& name, std::shared_ptr<Module> module,
                                std::vector<std::string> block_prefixes) {
  XF_CHECK(module != nullptr, "fsdp: component ", name, " is null");
  auto params = module->named_parameters();
  if (block_prefixes.empty()) {
    std::vector<std::string> names;
    for (const auto& [pname, slot] : params) names.push_back(pname);
    block_prefixes = find_block_prefixes(names);
  }
  auto comp = std::make_unique<FsdpComponent>();
  comp->name = name;
  comp->module = module;
  const int64_t component_index = static_cast<int64_t>(components_.size());
  auto new_group = [&](std::string group_name, bool block) {
    auto g = std::make_unique<FsdpGroup>();
    g->owner = this;
    g->component = comp.get();
    g->name = std::move(group_name);
    g->block = block;
    g->ordinal = (component_index << 32) | static_cast<int64_t>(comp->groups.size());
    comp->groups.push_back(std::move(g));
    return comp->groups.back().get();
  };
  FsdpGroup* rest = new_group(name, false);
  std::map<std::pair<int, int64_t>, FsdpGroup*> blocks;
  for (auto& [pname, slot] : params) {
    if (!slot->loaded()) continue;
    XF_CHECK(slot->group == nullptr, "fsdp: parameter ", pname, " of ", name,
             " is already held by an offloader or FSDP");
    if (!slot->rows) {
      stats_.replicated_bytes += slot->bytes();
      stats_.model_bytes += slot->bytes();
      continue;
    }
    const RowShard& rs = *slot->rows;
    XF_CHECK(rs.parts == group_.size() && rs.part == group_.rank(), "fsdp: parameter ", pname,
             " of ", name, " was loaded as row chunk ", rs.part, " of ", rs.parts,
             ", but this rank is ", group_.rank(), " of ", group_.size(), " in group '",
             group_.name(), "'");
    FsdpGroup* g = rest;
    const auto key = block_list_key(pname, block_prefixes);
    if (key.first >= 0) {
      auto& b = blocks[key];
      if (!b)
        b = new_group(name + ": " + block_prefixes[key.first] + std::to_string(key.second), true);
      g = b;
    }
    FsdpGroup::Entry e;
    e.slot = slot;
    auto piece = [&](const at::Tensor& t) {
      FsdpGroup::Piece p;
      if (!t.defined()) return p;
      XF_CHECK(t.dim() >= 1 && t.size(0) == rs.chunk() && t.is_contiguous(), "fsdp: parameter ",
               pname, " of ", name, " holds a ", t.sizes(), " tensor, expected a contiguous chunk",
               " of ", rs.chunk(), " rows");
      p.shard = t;
      p.rows = rs.rows;
      const int64_t whole = shard_nbytes(t) / rs.chunk() * rs.rows;
      g->bytes += whole;
      g->shard_bytes += shard_nbytes(t);
      return p;
    };
    if (slot->fp8) {
      e.data = piece(slot->fp8->data);
      e.scale = piece(slot->fp8->scale);
    } else {
      e.tensor = piece(slot->tensor);
    }
    slot->group = g;
    g->entries.push_back(std::move(e));
  }
  for (auto& [key, g] : blocks) {
    g->index = comp->blocks.size();
    comp->blocks.push_back(g);
  }
  for (const auto& g : comp->groups) {
    stats_.shard_bytes += g->shard_bytes;
    stats_.model_bytes += g->bytes;
    if (!g->block) continue;
    ++stats_.blocks;
    stats_.largest_block_bytes = std::max(stats_.largest_block_bytes, g->bytes);
  }
  ++stats_.components;
  stats_.largest_rest_bytes = std::max(stats_.largest_rest_bytes, rest->bytes);
  stats_.resident_bytes = stats_.shard_bytes + stats_.replicated_bytes + stats_.gathered_bytes;
  stats_.peak_resident_bytes = std::max(stats_.peak_resident_bytes, stats_.resident_bytes);
  components_.push_back(std::move(comp));
  // The bound: every shard, plus the most one component gathers at once: two blocks while the
  // blocks run, or its rest and the block prefetched for the next step.
  int64_t gathered_bound = 0;
  for (const auto& c : components_) {
    TwoLargest<int64_t> blocks;
    int64_t rest_bytes = 0;
    for (const auto& g : c->groups) {
      if (g->block) {
        blocks.add(g->bytes);
      } else {
        rest_bytes += g->bytes;
      }
    }
    gathered_bound = std::max(gathered_bound, std::max(blocks.sum(), rest_bytes + blocks.first));
  }
  stats_.bound_bytes = stats_.shard_bytes + stats_.replicated_bytes + gathered_bound;
}

void FsdpSharder::use(FsdpGroup& g) {
  if (g.in_use) return;
  FsdpComponent& c = *g.component;
  if (active_ != &c) {
    if (active_ != nullptr) release_component(*active_);
    active_ = &c;
  }
  if (!g.block) {
    // The rest is read before the blocks (embedders) and after them (final norm and
    // projection): the block that ran last is done, so it goes first; the one prefetched for the
    // next step stays.
    if (active_block_ != nullptr) release(*active_block_);
    if (!g.gathered) gather(g);
    wait(g);
    g.in_use = true;
    return;
  }
  // A block: the rest of its component goes while the blocks run, so the component never holds
  // its rest and two blocks at once.
  for (auto& other : c.groups) {
    if (!other->block && other->gathered) release(*other);
  }
  if (active_block_ != nullptr && active_block_ != &g) release(*active_block_);
  if (prefetched_ == &g) prefetched_ = nullptr;
  if (!g.gathered) gather(g);
  wait(g);
  g.in_use = true;
  active_block_ = &g;
  FsdpGroup* next = c.blocks[(g.index + 1) % c.blocks.size()];
  if (next == &g || next->gathered) return;
  // An out-of-order use may leave a gather that is not the next block: it goes, so at most two
  // blocks are whole at once.
  if (prefetched_ != nullptr) release(*prefetched_);
  gather(*next);
  prefetched_ = next;
}

void FsdpSharder::gather(FsdpGroup& g) {
  XF_CONTEXT("fsdp: gathering ", g.name, " over group '", group_.name(), "'");
  XF_SPAN("fsdp", "gather");
  const int n = group_.size();
  std::vector<at::Tensor> inputs, outputs;
  std::vector<std::array<at::Tensor, 3>> whole(g.entries.size());
  auto post = [&](const FsdpGroup::Piece& p) -> at::Tensor {
    if (!p.shard.defined()) return p.shard;
    at::Tensor in = as_bytes(p.shard);
    at::Tensor out = at::empty({n * in.numel()}, in.options());
    inputs.push_back(in);
    outputs.push_back(out);
    g.buffers.push_back(out);
    std::vector<int64_t> shape = p.shard.sizes().vec();
    shape[0] *= n;
    return out.view(p.shard.scalar_type()).view(shape).narrow(0, 0, p.rows);
  };
  for (size_t i = 0; i < g.entries.size(); ++i) {
    const auto& e = g.entries[i];
    whole[i] = {post(e.tensor), post(e.data), post(e.scale)};
  }
  // The group's identity travels with it: a rank that gathers another group is named.
  at::Tensor id = at::tensor(std::vector<int64_t>{g.ordinal, static_cast<int64_t>(g.bytes)},
                             at::TensorOptions().dtype(at::kLong))
                      .to(device_);
  at::Tensor ids = at::empty({n * 16}, id.options().dtype(at::kByte));
  inputs.push_back(as_bytes(id));
  outputs.push_back(ids);
  g.identity = ids;
  g.work = group_.all_gather_into(inputs, outputs);
  for (size_t i = 0; i < g.entries.size(); ++i) {
    g.entries[i].point_at(whole[i][0], whole[i][1], whole[i][2]);
  }
  g.gathered = true;
  g.in_use = false;
  stats_.gathers += 1;
  stats_.gather_bytes += g.bytes;
  stats_.gathered_bytes += g.bytes;
  stats_.peak_gathered_bytes = std::max(stats_.peak_gathered_bytes, stats_.gathered_bytes);
  stats_.resident_bytes = stats_.shard_bytes + stats_.replicated_bytes + stats_.gathered_bytes;
  stats_.peak_resident_bytes = std::max(stats_.peak_resident_bytes, stats_.resident_bytes);
}

void FsdpSharder::wait(FsdpGroup& g) {
  if (!g.work) return;
  {
    XF_CONTEXT("fsdp: waiting for the gather of ", g.name, " over group '", group_.name(), "'");
    g.work->wait();
    g.work.reset();
  }
  at::Tensor ids = g.identity.view(at::kLong);
  g.identity = at::Tensor();
  if (ids.device().is_cpu()) {
    unchecked_.emplace_back(ids, &g);
    check_identities();
  } else {
    // Read at release_all: a host read here would stall the device's queue.
    at::Tensor host =
        at::empty(ids.sizes(), ids.options().device(at::kCPU).pinned_memory(device_.is_cuda()));
    host.copy_(ids, /*non_blocking=*/true);
    unchecked_.emplace_back(host, &g);
  }
}

void FsdpSharder::check_identities() {
  if (unchecked_.empty()) return;
  std::map<int64_t, const FsdpGroup*> by_ordinal;
  for (const auto& c : components_) {
    for (const auto& g : c->groups) by_ordinal[g->ordinal] = g.get();
  }
  for (const auto& [ids, g] : unchecked_) {
    const auto* p = ids.data_ptr<int64_t>();
    for (int r = 0; r < group_.size(); ++r) {
      if (p[2 * r] == g->ordinal && p[2 * r + 1] == g->bytes) continue;
      auto it = by_ordinal.find(p[2 * r]);
      const std::string theirs =
          it != by_ordinal.end() ? it->second->name : "unknown group " + std::to_string(p[2 * r]);
      unchecked_.clear();
      XF_THROW("fsdp: ranks of group '", group_.name(), "' gathered different parameters: rank ",
               group_.rank(), " gathered ", g->name, " (", g->bytes, " bytes), rank ", r,
               " gathered ", theirs, " (", p[2 * r + 1],
               " bytes); every rank of an FSDP group must run the same forwards in the same "
               "order");
    }
  }
  unchecked_.clear();
}

void FsdpSharder::release(FsdpGroup& g) {
  if (!g.gathered) return;
  wait(g);  // the communicator may still write the buffers
  for (const auto& e : g.entries) e.point_at_shards();
  g.buffers.clear();
  g.gathered = false;
  g.in_use = false;
  stats_.gathered_bytes -= g.bytes;
  stats_.resident_bytes = stats_.shard_bytes + stats_.replicated_bytes + stats_.gathered_bytes;
  if (active_block_ == &g) active_block_ = nullptr;
  if (prefetched_ == &g) prefetched_ = nullptr;
}

void FsdpSharder::release_component(FsdpComponent& c) {
  for (auto& g : c.groups) release(*g);
  if (active_ == &c) active_ = nullptr;
}

void FsdpSharder::release_all() {
  for (auto& c : components_) release_component(*c);
  check_identities();
}

}  // namespace xfuser::models
