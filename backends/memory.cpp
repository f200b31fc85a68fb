#include "backends/memory.h"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <type_traits>

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>

#include "backends/error.h"

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace xfuser {

bool configure_host_allocator() {
  if (const char* env = std::getenv("XFUSER_DEFAULT_MALLOC"); env && std::strcmp(env, "1") == 0) {
    return false;
  }
#if defined(__GLIBC__)
  // M_MMAP_THRESHOLD above HEAP_MAX/2 (32 MiB on 64-bit) is rejected by glibc.
  const bool ok = mallopt(M_MMAP_THRESHOLD, 32 << 20) == 1 &&
                  mallopt(M_TRIM_THRESHOLD, 1 << 30) == 1 && mallopt(M_TOP_PAD, 64 << 20) == 1;
  return ok;
#else
  return false;
#endif
}

namespace {

std::atomic<int64_t> g_host_allocated{0};
std::atomic<int64_t> g_host_peak{0};
std::atomic<bool> g_host_tracked{false};

void count_allocation(int64_t n) {
  const int64_t now = g_host_allocated.fetch_add(n, std::memory_order_relaxed) + n;
  int64_t peak = g_host_peak.load(std::memory_order_relaxed);
  while (now > peak && !g_host_peak.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
  }
}

// The counted block: 64 bytes of header (the size) before the tensor's data, so that the data
// stays 64-byte aligned, as libtorch's CPU allocator aligns it. The data pointer is also the
// context (raw_allocate / raw_deallocate need that).
constexpr size_t kHeader = 64;

void free_counted(void* data) {
  if (data == nullptr) return;
  auto* base = static_cast<uint8_t*>(data) - kHeader;
  int64_t bytes = 0;
  std::memcpy(&bytes, base, sizeof(bytes));
  g_host_allocated.fetch_sub(bytes, std::memory_order_relaxed);
  std::free(base);
}

c10::DataPtr allocate_counted(size_t n) {
  if (n == 0) return {nullptr, nullptr, &free_counted, c10::Device(c10::kCPU)};
  void* base = nullptr;
  XF_CHECK(::posix_memalign(&base, kHeader, n + kHeader) == 0 && base != nullptr,
           "out of host memory: a tensor of ", n, " bytes could not be allocated");
  const auto bytes = static_cast<int64_t>(n);
  std::memcpy(base, &bytes, sizeof(bytes));
  count_allocation(bytes);
  void* data = static_cast<uint8_t*>(base) + kHeader;
  return {data, data, &free_counted, c10::Device(c10::kCPU)};
}

// libtorch 2.3 made Allocator::allocate non-const (1.13's is const): the override follows the
// base's signature, detected here rather than by version number.
template <typename A, typename = void>
struct ConstAllocate : std::false_type {};
template <typename A>
struct ConstAllocate<
    A, std::void_t<decltype(static_cast<c10::DataPtr (A::*)(size_t) const>(&A::allocate))>>
    : std::true_type {};

// Partial specializations over the base class, so that only the one instantiated is checked.
template <bool kConst, typename Base>
struct CountingAllocator;

template <typename Base>
struct CountingAllocator<true, Base> final : Base {
  c10::DataPtr allocate(size_t n) const override { return allocate_counted(n); }
  c10::DeleterFnPtr raw_deleter() const override { return &free_counted; }
};

template <typename Base>
struct CountingAllocator<false, Base> final : Base {
  c10::DataPtr allocate(size_t n) override { return allocate_counted(n); }
  c10::DeleterFnPtr raw_deleter() const override { return &free_counted; }
  // Pure virtual since 2.3 (copy-on-write storage).
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    std::memcpy(dest, src, count);
  }
};

using HostCountingAllocator =
    CountingAllocator<ConstAllocate<c10::Allocator>::value, c10::Allocator>;

}  // namespace

void track_host_tensor_memory() {
  static std::once_flag once;
  std::call_once(once, [] {
    static HostCountingAllocator allocator;
    // The highest priority: a later SetCPUAllocator of a lower one keeps this.
    c10::SetCPUAllocator(&allocator, 255);
    g_host_tracked = c10::GetCPUAllocator() == &allocator;
  });
}

HostTensorMemory host_tensor_memory() {
  HostTensorMemory m;
  m.tracked = g_host_tracked.load();
  m.allocated = g_host_allocated.load();
  m.peak = g_host_peak.load();
  return m;
}

void reset_host_tensor_peak() { g_host_peak.store(g_host_allocated.load()); }

}  // namespace xfuser
