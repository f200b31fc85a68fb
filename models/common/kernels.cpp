#include "models/common/kernels.h"

#include <ATen/ATen.h>

#include "backends/backend.h"
#include "models/common/layers.h"

namespace xfuser::models {
namespace {

thread_local const KernelTable* current_table = nullptr;

std::pair<at::Tensor, at::Tensor> rope_qk_eager(const at::Tensor& q, const at::Tensor& k,
                                                const at::Tensor& cos, const at::Tensor& sin) {
  const RotaryTables rope{cos, sin};
  return {apply_rotary_emb(q, rope, RotaryPairing::kInterleaved),
          apply_rotary_emb(k, rope, RotaryPairing::kInterleaved)};
}

}  // namespace

const KernelTable& KernelTable::eager() {
  static const KernelTable table{backends::norm_modulate_eager, rope_qk_eager};
  return table;
}

KernelTable KernelTable::resolve(backends::Backend& backend, bool try_compile, bool overrides) {
  const KernelTable& ref = eager();
  KernelTable t;
  t.norm_modulate = backend.wrap<backends::NormModulateFn>("norm_modulate", ref.norm_modulate,
                                                           try_compile, overrides);
  t.rope_qk = backend.wrap<backends::RopeQkFn>("rope_qk", ref.rope_qk, try_compile, overrides);
  return t;
}

const KernelTable& kernels() { return current_table ? *current_table : KernelTable::eager(); }

KernelScope::KernelScope(const KernelTable* table) : previous_(current_table) {
  current_table = table;
}

KernelScope::~KernelScope() { current_table = previous_; }

}  // namespace xfuser::models
