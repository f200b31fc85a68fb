// register_builtin_components(): every built-in component class, registered once.
#include <mutex>

#include "models/common/component.h"
#include "models/flux/flux_transformer.h"
#include "models/text_encoders/register.h"
#include "models/vae/register.h"

namespace xfuser::models {

void register_builtin_components() {
  static std::once_flag once;
  std::call_once(once, [] {
    ComponentRegistry::add("FluxTransformer2DModel", flux::make_flux_transformer);
    register_text_encoders();
    register_vae();
  });
}

}  // namespace xfuser::models
