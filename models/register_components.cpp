// register_builtin_components(): every built-in component class, registered once: the shared
// ones (text encoders, CLIP image encoders, VAEs) and every family's (its transformers).
#include <mutex>

#include "models/common/component.h"
#include "models/image/register.h"
#include "models/registry.h"
#include "models/text_encoders/register.h"
#include "models/vae/register.h"

namespace xfuser::models {

void register_builtin_components() {
  static std::once_flag once;
  std::call_once(once, [] {
    register_text_encoders();
    register_image_encoders();
    register_vae();
    for (const auto& family : FamilyRegistry::all()) {
      if (family.register_components) family.register_components();
    }
  });
}

}  // namespace xfuser::models
