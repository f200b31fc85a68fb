// NVTX ranges for Spans (profiling/trace.h). NVTX v3 is header-only: without an attached tool the
// first call finds no injection library and every later call is one null-pointer test.
#include <atomic>
#include <cstdlib>
#include <cstring>

#include "profiling/trace.h"

#if XFUSER_WITH_NVTX
#include <nvtx3/nvToolsExt.h>
#endif

namespace xfuser::profiling {

#if XFUSER_WITH_NVTX
namespace {

// The span categories in use, each a named NVTX category; anything else is "other".
constexpr const char* kCategories[] = {"run", "stage", "step", "block", "attention", "comm"};
constexpr uint32_t kOther = sizeof(kCategories) / sizeof(kCategories[0]) + 1;

uint32_t category_id(const char* category) {
  for (uint32_t i = 0; i + 1 < kOther; ++i) {
    if (std::strcmp(category, kCategories[i]) == 0) return i + 1;
  }
  return kOther;
}

// One colour per category in the timeline.
uint32_t category_colour(uint32_t id) {
  constexpr uint32_t kColours[] = {0xFF4E79A7, 0xFFF28E2B, 0xFF59A14F, 0xFFE15759,
                                   0xFF76B7B2, 0xFFEDC948, 0xFFB07AA1};
  return kColours[(id - 1) % (sizeof(kColours) / sizeof(kColours[0]))];
}

nvtxDomainHandle_t domain() {
  static const nvtxDomainHandle_t handle = [] {
    nvtxDomainHandle_t d = nvtxDomainCreateA("xfuser");
    for (uint32_t i = 0; i + 1 < kOther; ++i) nvtxDomainNameCategoryA(d, i + 1, kCategories[i]);
    nvtxDomainNameCategoryA(d, kOther, "other");
    return d;
  }();
  return handle;
}

// A tool is attached when the NVTX loader has a library to inject (nsys and ncu set this).
bool tool_attached() {
  for (const char* var : {"NVTX_INJECTION64_PATH", "NVTX_INJECTION32_PATH"}) {
    const char* v = std::getenv(var);
    if (v && *v) return true;
  }
  return false;
}

// Start-up setting: XFUSER_NVTX=0|1 wins, else on under a tool.
[[maybe_unused]] const bool g_nvtx_at_start = [] {
  const char* env = std::getenv("XFUSER_NVTX");
  const bool on = (env && *env) ? std::strcmp(env, "0") != 0 : tool_attached();
  detail::g_nvtx.store(on, std::memory_order_relaxed);
  return on;
}();

}  // namespace

bool nvtx_available() noexcept { return true; }

bool set_nvtx(bool on) noexcept {
  detail::g_nvtx.store(on, std::memory_order_relaxed);
  return on;
}

namespace detail {

void nvtx_push(const char* category, const char* name) noexcept {
  nvtxEventAttributes_t attr;
  std::memset(&attr, 0, sizeof(attr));
  attr.version = NVTX_VERSION;
  attr.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
  attr.category = category_id(category);
  attr.colorType = NVTX_COLOR_ARGB;
  attr.color = category_colour(attr.category);
  attr.messageType = NVTX_MESSAGE_TYPE_ASCII;
  attr.message.ascii = name;
  nvtxDomainRangePushEx(domain(), &attr);
}

void nvtx_pop() noexcept { nvtxDomainRangePop(domain()); }

}  // namespace detail

#else  // no NVTX headers in this build

bool nvtx_available() noexcept { return false; }

bool set_nvtx(bool) noexcept { return false; }

namespace detail {
void nvtx_push(const char*, const char*) noexcept {}
void nvtx_pop() noexcept {}
}  // namespace detail

#endif

}  // namespace xfuser::profiling
