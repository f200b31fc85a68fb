#include "models/common/offload.h"

#include <algorithm>
#include <array>
#include <map>
#include <utility>

#include <ATen/ATen.h>
#include <c10/core/Event.h>
#include <c10/core/Stream.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include "backends/error.h"

namespace xfuser::models {

struct OffloadGroup final : ParamGroup {
  void use() override { owner->use(*this); }
  Offloader* owner = nullptr;
  OffloadComponent* component = nullptr;
  std::string name;  // "transformer", "transformer: transformer_blocks.3"
  bool block = false;
  size_t index = 0;  // position among the component's blocks
  struct Entry {
    ParamSlot* slot = nullptr;
    at::Tensor host;        // the parameter in host memory (slot->tensor)
    at::Tensor host_data;   // or its fp8 values
    at::Tensor host_scale;  // and scales (undefined for fp8 storage)
    // Points the slot at these tensors (the device copies, or the host ones).
    void point_at(at::Tensor t, at::Tensor data, at::Tensor scale) const {
      if (slot->fp8) {
        slot->fp8->data = std::move(data);
        slot->fp8->scale = std::move(scale);
      } else {
        slot->tensor = std::move(t);
      }
    }
    void point_at_host() const { point_at(host, host_data, host_scale); }
  };
  std::vector<Entry> entries;
  int64_t bytes = 0;
  bool resident = false;  // device copies exist or are being made
  // (in_use: resident, copied, and the group its component uses now)
  std::unique_ptr<c10::Event> ready;  // recorded on the side stream after a prefetch's copies
};

struct OffloadComponent {
  std::string name;
  std::shared_ptr<Module> module;
  std::vector<std::unique_ptr<OffloadGroup>> groups;
  std::vector<OffloadGroup*> blocks;  // streamed blocks in forward order (sequential)
  int64_t bytes = 0;
};

struct Offloader::SideStream {
  c10::Stream stream;
};

namespace {

int64_t held_bytes(const at::Tensor& t) {
  return t.defined() ? t.numel() * static_cast<int64_t>(t.element_size()) : 0;
}

}  // namespace

const char* offload_mode_name(OffloadMode mode) {
  switch (mode) {
    case OffloadMode::kNone:
      return "none";
    case OffloadMode::kModel:
      return "model";
    case OffloadMode::kSequential:
      return "sequential";
  }
  return "?";
}

Offloader::Offloader(OffloadMode mode, c10::Device device) : mode_(mode), device_(device) {
  XF_CHECK(mode != OffloadMode::kNone, "Offloader needs an offload mode");
  streams_ = device_.is_cuda();
  if (streams_) {
    c10::impl::VirtualGuardImpl impl(device_.type());
    side_ = std::make_unique<SideStream>(SideStream{impl.getStreamFromGlobalPool(device_)});
  }
}

Offloader::~Offloader() {
  // The components may outlive the offloader (shared): their slots go back to plain host tensors.
  for (auto& c : components_) {
    for (auto& g : c->groups) {
      if (g->ready) wait(*g);
      for (auto& e : g->entries) {
        e.slot->group = nullptr;
        e.point_at_host();
      }
    }
  }
}

void Offloader::add_component(const std::string& name, std::shared_ptr<Module> module,
                              const std::vector<std::string>& block_prefixes) {
  XF_CHECK(module != nullptr, "offload: component ", name, " is null");
  for (const auto& c : components_) {
    XF_CHECK(c->module != module, "offload: ", name, " is already offloaded as ", c->name);
  }
  auto comp = std::make_unique<OffloadComponent>();
  comp->name = name;
  comp->module = module;
  const bool stream_blocks = mode_ == OffloadMode::kSequential && !block_prefixes.empty();

  auto new_group = [&](std::string group_name, bool block) {
    auto g = std::make_unique<OffloadGroup>();
    g->owner = this;
    g->component = comp.get();
    g->name = std::move(group_name);
    g->block = block;
    comp->groups.push_back(std::move(g));
    return comp->groups.back().get();
  };
  OffloadGroup* rest = new_group(name, false);
  std::map<std::pair<int, int64_t>, OffloadGroup*> blocks;

  // A host copy: the tensor itself when it is in host memory already (and the device is the
  // CPU: the very tensors a run without offload computes with); for another device contiguous,
  // as loading to a device makes them (backends::DeviceUploader), and pinned (page-locked) for
  // CUDA, so that copies from it are asynchronous DMA.
  auto host = [&](const at::Tensor& t) {
    if (!t.defined()) return t;
    at::Tensor h = t.device().is_cpu() ? t : t.to(at::kCPU);
    if (device_.is_cpu()) return h;
    h = h.contiguous();
    if (device_.is_cuda() && !h.is_pinned()) h = h.pin_memory();
    return h;
  };
  for (auto& [pname, slot] : module->named_parameters()) {
    if (!slot->loaded()) continue;
    XF_CHECK(slot->group == nullptr, "offload: parameter ", pname, " of ", name,
             " is already held by an offloader or FSDP");
    OffloadGroup* g = rest;
    if (stream_blocks) {
      const auto key = block_list_key(pname, block_prefixes);
      if (key.first >= 0) {
        auto& b = blocks[key];
        if (!b) {
          b = new_group(name + ": " + block_prefixes[key.first] + std::to_string(key.second), true);
        }
        g = b;
      }
    }
    OffloadGroup::Entry e;
    e.slot = slot;
    if (slot->fp8) {
      e.host_data = host(slot->fp8->data);
      e.host_scale = host(slot->fp8->scale);
      slot->fp8->data = e.host_data;
      slot->fp8->scale = e.host_scale;
      g->bytes += held_bytes(e.host_data) + held_bytes(e.host_scale);
    } else {
      e.host = host(slot->tensor);
      slot->tensor = e.host;
      g->bytes += held_bytes(e.host);
    }
    slot->group = g;
    g->entries.push_back(std::move(e));
  }
  for (auto& [key, g] : blocks) {
    g->index = comp->blocks.size();
    comp->blocks.push_back(g);
  }
  TwoLargest<int64_t> largest;
  for (const auto& g : comp->groups) {
    comp->bytes += g->bytes;
    if (!g->block) continue;
    ++stats_.blocks;
    largest.add(g->bytes);
  }
  ++stats_.components;
  stats_.largest_component_bytes = std::max(stats_.largest_component_bytes, comp->bytes);
  if (comp->blocks.empty()) {
    stats_.bound_bytes = std::max(stats_.bound_bytes, comp->bytes);
  } else {
    stats_.largest_block_bytes = std::max(stats_.largest_block_bytes, largest.first);
    stats_.largest_resident_part_bytes = std::max(stats_.largest_resident_part_bytes, rest->bytes);
    stats_.bound_bytes = std::max(stats_.bound_bytes, rest->bytes + largest.sum());
    stats_.streamed_bound_bytes =
        std::max(stats_.streamed_bound_bytes, rest->bytes + largest.sum());
  }
  components_.push_back(std::move(comp));
}

void Offloader::use(OffloadGroup& g) {
  if (g.in_use) return;
  OffloadComponent& c = *g.component;
  if (active_ != &c) {
    // The previous component leaves the device before this one arrives (one at a time).
    if (active_ != nullptr) offload_component(*active_);
    active_ = &c;
  }
  if (!g.block) {
    if (!g.resident) onload(g, /*prefetch=*/false);
    wait(g);
    g.in_use = true;
    return;
  }
  // A streamed block: the block in use leaves, this one (prefetched or copied now) takes its
  // place, and the next one in forward order starts copying.
  if (active_block_ != nullptr && active_block_ != &g) offload(*active_block_);
  if (prefetched_ == &g) prefetched_ = nullptr;
  if (!g.resident) onload(g, /*prefetch=*/false);
  wait(g);
  g.in_use = true;
  active_block_ = &g;
  OffloadGroup* next = c.blocks[(g.index + 1) % c.blocks.size()];
  if (next == &g || next->resident) return;
  // An out-of-order use (the first forward, a PipeFusion stage) may leave a copy that is not
  // the next block: it goes, so at most two blocks are on the device.
  if (prefetched_ != nullptr) offload(*prefetched_);
  onload(*next, /*prefetch=*/true);
  prefetched_ = next;
}

void Offloader::onload(OffloadGroup& g, bool prefetch) {
  XF_CONTEXT("offload: copying ", g.name, " to ", device_.str());
  stats_.onloads += 1;
  stats_.onload_bytes += g.bytes;
  stats_.resident_bytes += g.bytes;
  stats_.peak_resident_bytes = std::max(stats_.peak_resident_bytes, stats_.resident_bytes);
  if (active_ != nullptr && !active_->blocks.empty()) {
    stats_.peak_streamed_bytes = std::max(stats_.peak_streamed_bytes, stats_.resident_bytes);
  }
  g.resident = true;
  g.in_use = false;
  if (device_.is_cpu()) return;  // the host tensors are the device's
  if (prefetch && streams_) {
    // The device memory is allocated on the compute stream, so the caching allocator reuses it
    // in that stream's order; the side stream copies into it once the compute stream has
    // reached this point, and records `ready`, which the compute stream waits for before use.
    c10::impl::VirtualGuardImpl impl(device_.type());
    const c10::Stream compute = impl.getStream(device_);
    auto empty_on_device = [&](const at::Tensor& h) {
      return h.defined() ? at::empty(h.sizes(), h.options().device(device_).pinned_memory(false))
                         : h;
    };
    std::vector<std::array<at::Tensor, 3>> dev(g.entries.size());
    for (size_t i = 0; i < g.entries.size(); ++i) {
      const auto& e = g.entries[i];
      dev[i] = {empty_on_device(e.host), empty_on_device(e.host_data),
                empty_on_device(e.host_scale)};
    }
    c10::Event allocated(device_.type());
    allocated.record(compute);
    {
      c10::StreamGuard guard(side_->stream);
      allocated.block(side_->stream);
      for (size_t i = 0; i < g.entries.size(); ++i) {
        const auto& e = g.entries[i];
        if (e.host.defined()) dev[i][0].copy_(e.host, /*non_blocking=*/true);
        if (e.host_data.defined()) dev[i][1].copy_(e.host_data, /*non_blocking=*/true);
        if (e.host_scale.defined()) dev[i][2].copy_(e.host_scale, /*non_blocking=*/true);
      }
      g.ready = std::make_unique<c10::Event>(device_.type());
      g.ready->record(side_->stream);
    }
    for (size_t i = 0; i < g.entries.size(); ++i) {
      g.entries[i].point_at(dev[i][0], dev[i][1], dev[i][2]);
    }
    return;
  }
  // On the compute stream: ordered before the kernels that read the weights (asynchronous from
  // pinned memory).
  auto to_device = [&](const at::Tensor& h) {
    return h.defined() ? h.to(h.options().device(device_).pinned_memory(false),
                              /*non_blocking=*/h.is_pinned())
                       : h;
  };
  for (auto& e : g.entries) {
    e.point_at(to_device(e.host), to_device(e.host_data), to_device(e.host_scale));
  }
}

void Offloader::wait(OffloadGroup& g) {
  if (!g.ready) return;
  c10::impl::VirtualGuardImpl impl(device_.type());
  g.ready->block(impl.getStream(device_));
  g.ready.reset();
}

void Offloader::offload(OffloadGroup& g) {
  if (!g.resident) return;
  // A copy still in flight must finish before its memory can be freed and reused.
  wait(g);
  for (const auto& e : g.entries) e.point_at_host();
  g.resident = false;
  g.in_use = false;
  stats_.resident_bytes -= g.bytes;
  if (active_block_ == &g) active_block_ = nullptr;
  if (prefetched_ == &g) prefetched_ = nullptr;
}

void Offloader::offload_component(OffloadComponent& c) {
  for (auto& g : c.groups) offload(*g);
  if (active_ == &c) active_ = nullptr;
}

void Offloader::offload_all() {
  for (auto& c : components_) offload_component(*c);
}

OffloadStats Offloader::stats() const { return stats_; }

}  // namespace xfuser::models
