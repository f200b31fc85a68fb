// The overridable ops a model runs (backends/kernels.h), resolved once per model through the
// backend contract (Backend::wrap: compile -> override -> eager) and installed for the calling
// thread while the model runs, so layer code calls kernels().op(...) without knowing which
// implementation it gets.
#pragma once

#include <functional>
#include <string>

#include "backends/kernels.h"

namespace xfuser::backends {
class Backend;
}

namespace xfuser::models {

struct KernelTable {
  std::function<backends::NormModulateFn> norm_modulate;
  std::function<backends::RopeQkFn> rope_qk;

  // The reference implementations (diffusers' op sequences).
  static const KernelTable& eager();
  // Every op wrapped by `backend` (each call appends to its timeline). `try_compile` is
  // --use_torch_compile; `overrides` false skips hand-written kernels (debugging, parity runs).
  static KernelTable resolve(backends::Backend& backend, bool try_compile, bool overrides = true);
};

// The table installed on this thread (KernelTable::eager() when none is).
const KernelTable& kernels();

// Installs `table` on this thread for the scope's lifetime (nests; restores the previous one).
class KernelScope {
 public:
  explicit KernelScope(const KernelTable* table);
  ~KernelScope();
  KernelScope(const KernelScope&) = delete;
  KernelScope& operator=(const KernelScope&) = delete;

 private:
  const KernelTable* previous_;
};

}  // namespace xfuser::models
