// CPU offload of a pipeline's weights: the parameters live in host memory (pinned when the
// device is a GPU) and are copied to the compute device only while they are used.
//
// - Model offload (--enable_model_cpu_offload, diffusers' enable_model_cpu_offload): a whole
//   component (text encoder, transformer, VAE) is on the device while it runs; when another
//   component is first used, the previous one leaves the device. One component at a time.
// - Sequential offload (--enable_sequential_cpu_offload): a transformer's blocks stream to the
//   device one at a time, the next block copied while the current one computes (on a side
//   stream where the device has streams, as diffusers' group offloading with use_stream=True);
//   its parts outside the blocks (embedders, final norm and projection) stay on the device while
//   the transformer is in use. Other components are offloaded as in model offload. Blocks are
//   prefetched in forward order, cyclically, so a denoising loop finds block 0 ready after the
//   last one.
//
// The mechanism needs no call from the model code: every weight is read through
// ParamSlot::value() (or models::linear), which makes its group resident first. Residency is
// a rank's own affair (no collective), so it composes with every parallel layout: each rank
// offloads the parameters it holds (tensor-parallel slices, a PipeFusion stage's blocks).
// At the end of a generation every component leaves the device (diffusers'
// maybe_free_model_hooks).
//
// On the CPU the device copies are the host tensors themselves: the same bookkeeping runs (the
// stats below are what a device would hold) but no memory is saved.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <c10/core/Device.h>

#include "models/common/module.h"

namespace xfuser::models {

enum class OffloadMode { kNone, kModel, kSequential };

// "none", "model", "sequential" (run reports).
const char* offload_mode_name(OffloadMode mode);

// What the offload did in one process, in parameter bytes (fp8 values and scales count as
// they are held).
struct OffloadStats {
  int64_t onloads = 0;              // groups copied to the device
  int64_t onload_bytes = 0;         // bytes copied to the device, in all
  int64_t resident_bytes = 0;       // on the device now (resident or being copied)
  int64_t peak_resident_bytes = 0;  // the most at any time
  int64_t largest_component_bytes = 0;
  // Sequential offload: the largest streamed block, and the largest part of a streamed
  // component outside its blocks (0 in model offload).
  int64_t largest_block_bytes = 0;
  int64_t largest_resident_part_bytes = 0;
  int components = 0;
  int blocks = 0;  // streamed block groups over all components
  // The most the mode can hold at once: model: the largest component; sequential: the largest
  // of (a whole non-streamed component) and (a streamed component's resident part + its two
  // largest blocks). peak_resident_bytes never exceeds it.
  int64_t bound_bytes = 0;
  // Sequential offload: the most on the device while a streamed component (a transformer) was
  // in use, and its bound (that component's resident part + its two largest blocks).
  int64_t peak_streamed_bytes = 0;
  int64_t streamed_bound_bytes = 0;
};

// A set of parameters that moves together: a component (model offload), a block, or a streamed
// component's parameters outside its blocks.
struct OffloadGroup;
struct OffloadComponent;

class Offloader {
 public:
  // `mode` must not be kNone.
  Offloader(OffloadMode mode, c10::Device device);
  ~Offloader();
  Offloader(const Offloader&) = delete;
  Offloader& operator=(const Offloader&) = delete;

  OffloadMode mode() const { return mode_; }
  const c10::Device& device() const { return device_; }

  // Takes charge of every loaded parameter of `module` (named `name` in errors and reports):
  // its tensors become host tensors (pinned when the device is CUDA) and leave the device until
  // used. `block_prefixes` ("transformer_blocks.", ...): in sequential mode the parameters
  // under "<prefix><index>." form one streamed group per block, in the order of the prefixes
  // and then of the index; ignored in model mode. The module is kept alive by the offloader.
  void add_component(const std::string& name, std::shared_ptr<Module> module,
                     const std::vector<std::string>& block_prefixes = {});
  // Every component leaves the device (the end of a generation).
  void offload_all();
  OffloadStats stats() const;

  // Makes `group` resident and in use (ParamSlot::ensure_resident, through the group's use()):
  // copies, evictions, the next prefetch.
  void use(OffloadGroup& group);

 private:
  void onload(OffloadGroup& group, bool prefetch);
  void wait(OffloadGroup& group);
  void offload(OffloadGroup& group);
  void offload_component(OffloadComponent& component);

  OffloadMode mode_;
  c10::Device device_;
  bool streams_ = false;  // the device has streams: prefetches run on a side stream
  std::vector<std::unique_ptr<OffloadComponent>> components_;
  OffloadComponent* active_ = nullptr;    // the component in use
  OffloadGroup* active_block_ = nullptr;  // its block in use (sequential)
  OffloadGroup* prefetched_ = nullptr;    // the block being copied ahead (sequential)
  OffloadStats stats_;
  struct SideStream;
  std::unique_ptr<SideStream> side_;
};

}  // namespace xfuser::models
