#include "tests/checked_device.h"

#include <torch/version.h>

#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
#define XFUSER_CHECKED_DEVICE 1
#endif

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <sstream>
#include <unordered_map>

#include "backends/error.h"

#ifdef XFUSER_CHECKED_DEVICE
#include <ATen/ATen.h>
#include <ATen/EmptyTensor.h>
#include <ATen/native/CPUFallback.h>
#include <ATen/ops/_reshape_alias_cpu_dispatch.h>
#include <ATen/ops/as_strided_cpu_dispatch.h>
#include <ATen/ops/resize_cpu_dispatch.h>
#include <ATen/ops/set_cpu_dispatch.h>
#include <ATen/ops/unfold_cpu_dispatch.h>
#include <ATen/ops/view_as_complex_cpu_dispatch.h>
#include <ATen/ops/view_as_real_cpu_dispatch.h>
#include <ATen/ops/view_cpu_dispatch.h>
#include <c10/core/Allocator.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/core/impl/alloc_cpu.h>
#include <torch/library.h>

#include "backends/tensor_util.h"
#endif

namespace xfuser::testing {
namespace {

std::atomic<int64_t> g_host_reads{0};
std::atomic<int64_t> g_ops{0};
// The checked device's memory: bytes held by its tensors now and at the peak since the last reset.
std::mutex g_memory_mutex;
int64_t g_allocated = 0;
int64_t g_peak = 0;

}  // namespace

#ifdef XFUSER_CHECKED_DEVICE
namespace {

constexpr c10::DeviceType kChecked = c10::DeviceType::PrivateUse1;

// The size of every live allocation, for the byte counts.
std::unordered_map<void*, size_t>& allocation_sizes() {
  static auto* sizes = new std::unordered_map<void*, size_t>();
  return *sizes;
}

void checked_free(void* p) {
  if (p != nullptr) {
    std::lock_guard<std::mutex> lock(g_memory_mutex);
    auto& sizes = allocation_sizes();
    auto it = sizes.find(p);
    if (it != sizes.end()) {
      g_allocated -= static_cast<int64_t>(it->second);
      sizes.erase(it);
    }
  }
  c10::free_cpu(p);
}

// Host memory that says it is on the checked device, counted as a GPU's allocator counts.
struct CheckedAllocator final : c10::Allocator {
  c10::DataPtr allocate(size_t nbytes) override {
    void* p = nbytes ? c10::alloc_cpu(nbytes) : nullptr;
    if (p != nullptr) {
      std::lock_guard<std::mutex> lock(g_memory_mutex);
      allocation_sizes()[p] = nbytes;
      g_allocated += static_cast<int64_t>(nbytes);
      g_peak = std::max(g_peak, g_allocated);
    }
    return {p, p, &checked_free, c10::Device(kChecked, 0)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &checked_free; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
};
CheckedAllocator g_allocator;

// One device and one stream, on which work completes as it is issued: an event is the host
// clock when it was recorded.
struct CheckedGuard final : c10::impl::DeviceGuardImplInterface {
  using Clock = std::chrono::steady_clock;
  c10::DeviceType type() const override { return kChecked; }
  c10::Device exchangeDevice(c10::Device) const override { return c10::Device(kChecked, 0); }
  c10::Device getDevice() const override { return c10::Device(kChecked, 0); }
  void setDevice(c10::Device) const override {}
  void uncheckedSetDevice(c10::Device) const noexcept override {}
  c10::Stream getStream(c10::Device d) const override {
    return c10::Stream(c10::Stream::DEFAULT, d);
  }
  c10::Stream exchangeStream(c10::Stream s) const override { return s; }
  c10::DeviceIndex deviceCount() const noexcept override { return 1; }
  void record(void** event, const c10::Stream&, const c10::DeviceIndex,
              const c10::EventFlag) const override {
    if (*event == nullptr) *event = new Clock::time_point();
    *static_cast<Clock::time_point*>(*event) = Clock::now();
  }
  void destroyEvent(void* event, const c10::DeviceIndex) const noexcept override {
    delete static_cast<Clock::time_point*>(event);
  }
  void block(void*, const c10::Stream&) const override {}
  bool queryEvent(void*) const override { return true; }
  void synchronizeEvent(void*) const override {}
  void synchronizeDevice(const c10::DeviceIndex) const override {}
  bool queryStream(const c10::Stream&) const override { return true; }
  void synchronizeStream(const c10::Stream&) const override {}
  double elapsedTime(void* begin, void* end, const c10::DeviceIndex) const override {
    return std::chrono::duration<double, std::milli>(*static_cast<Clock::time_point*>(end) -
                                                     *static_cast<Clock::time_point*>(begin))
        .count();
  }
};
C10_REGISTER_GUARD_IMPL(PrivateUse1, CheckedGuard)

// Copies the fallback makes to run a CPU kernel are not host reads of the model's.
thread_local int t_in_fallback = 0;
struct InFallback {
  InFallback() { ++t_in_fallback; }
  ~InFallback() { --t_in_fallback; }
  InFallback(const InFallback&) = delete;
  InFallback& operator=(const InFallback&) = delete;
};

// A CPU tensor over a checked-device tensor's memory (same sizes, strides and offset).
at::Tensor host_view(const at::Tensor& t) {
  if (t.numel() == 0) return at::empty(t.sizes(), t.options().device(at::kCPU));
  return at::from_blob(t.data_ptr(), t.sizes(), t.strides(), t.options().device(at::kCPU));
}

at::Tensor empty_memory_format(c10::IntArrayRef size, std::optional<c10::ScalarType> dtype,
                               std::optional<c10::Layout>, std::optional<c10::Device>,
                               std::optional<bool>, std::optional<c10::MemoryFormat> format) {
  return at::detail::empty_generic(size, &g_allocator,
                                   c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                   c10::dtype_or_default(dtype), format);
}

at::Tensor empty_strided(c10::IntArrayRef size, c10::IntArrayRef stride,
                         std::optional<c10::ScalarType> dtype, std::optional<c10::Layout>,
                         std::optional<c10::Device>, std::optional<bool>) {
  return at::detail::empty_strided_generic(size, stride, &g_allocator,
                                           c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                           c10::dtype_or_default(dtype));
}

at::Tensor copy_from(const at::Tensor& self, const at::Tensor& dst, bool /*non_blocking*/) {
  const bool from_device = self.device().type() == kChecked;
  const bool to_device = dst.device().type() == kChecked;
  if (from_device && !to_device && t_in_fallback == 0) ++g_host_reads;
  at::Tensor d = to_device ? host_view(dst) : dst;
  d.copy_(from_device ? host_view(self) : self);
  return dst;
}

at::Tensor copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  dst.resize_(self.sizes());
  return copy_from(self, dst, false);
}

at::Scalar local_scalar_dense(const at::Tensor& self) {
  ++g_host_reads;
  return at::_local_scalar_dense(host_view(self));
}

at::Tensor as_strided(const at::Tensor& self, c10::IntArrayRef size, c10::IntArrayRef stride,
                      std::optional<int64_t> offset) {
  return at::cpu::as_strided(self, size, stride, offset);
}
at::Tensor view(const at::Tensor& self, c10::IntArrayRef size) { return at::cpu::view(self, size); }
at::Tensor reshape_alias(const at::Tensor& self, c10::IntArrayRef size, c10::IntArrayRef stride) {
  return at::cpu::_reshape_alias(self, size, stride);
}
at::Tensor unfold(const at::Tensor& self, int64_t dim, int64_t size, int64_t step) {
  return at::cpu::unfold(self, dim, size, step);
}
at::Tensor view_as_complex(const at::Tensor& self) { return at::cpu::view_as_complex(self); }
at::Tensor view_as_real(const at::Tensor& self) { return at::cpu::view_as_real(self); }
const at::Tensor& resize(const at::Tensor& self, c10::IntArrayRef size,
                         std::optional<c10::MemoryFormat> format) {
  return at::cpu::resize_(self, size, format);
}
at::Tensor& set_storage(at::Tensor& self, c10::Storage source) {
  return at::cpu::set_(self, source);
}
at::Tensor& set_storage_offset(at::Tensor& self, c10::Storage source, int64_t offset,
                               c10::IntArrayRef size, c10::IntArrayRef stride) {
  return at::cpu::set_(self, source, offset, size, stride);
}

void check_on_device(const char* op, const char* what, const at::Tensor& t) {
  XF_CHECK(t.device().type() == kChecked, "checked device: ", op, " argument '", what, "' is on ",
           t.device().str(), " (shape ", xfuser::shape_string(t.sizes()), ") among tensors on ",
           c10::Device(kChecked, 0).str());
}

// at::convolution's kernel for backends without one: the CPU convolution on host views.
at::Tensor convolution(const at::Tensor& input, const at::Tensor& weight,
                       const std::optional<at::Tensor>& bias, c10::IntArrayRef stride,
                       c10::IntArrayRef padding, c10::IntArrayRef dilation, bool transposed,
                       c10::IntArrayRef output_padding, int64_t groups) {
  ++g_ops;
  check_on_device("aten::convolution_overrideable", "input", input);
  check_on_device("aten::convolution_overrideable", "weight", weight);
  std::optional<at::Tensor> b;
  if (bias && bias->defined()) {
    check_on_device("aten::convolution_overrideable", "bias", *bias);
    b = host_view(*bias);
  }
  InFallback scope;
  return at::convolution(host_view(input), host_view(weight), b, stride, padding, dilation,
                         transposed, output_padding, groups)
      .to(input.device());
}

// The check a CUDA kernel makes, then the CPU kernel on host copies.
void checked_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  ++g_ops;
  const auto& schema = op.schema();
  const auto& arguments = schema.arguments();
  const std::string& name = schema.name();
  // CUDA's indexing takes CPU index tensors (it moves them).
  const bool cpu_indices_ok = name == "aten::index" || name == "aten::index_put_" ||
                              name == "aten::index_put" || name == "aten::_index_put_impl_";
  const auto args = torch::jit::last(*stack, arguments.size());
  const auto check = [&](const at::Tensor& t, size_t i, const std::string& element) {
    XF_CHECK(!t.defined() || !t.device().is_cpu() || t.dim() == 0,
             "checked device: ", schema.operator_name(), " argument '", arguments[i].name(), "'",
             element, " is a CPU tensor of shape ", xfuser::shape_string(t.sizes()),
             " among tensors on ", c10::Device(kChecked, 0).str(),
             ": a tensor made without the options of an input or of the load options (on a "
             "GPU this is a device mismatch or a host round trip)");
  };
  for (size_t i = 0; i < args.size(); ++i) {
    const c10::IValue& v = args[i];
    if (v.isTensor()) {
      check(v.toTensor(), i, "");
    } else if (v.isList() && !cpu_indices_ok) {
      const auto list = v.toListRef();
      for (size_t j = 0; j < list.size(); ++j) {
        if (!list[j].isTensor()) continue;
        std::ostringstream element;  // (not "[" + ... + "]": GCC 12 warns on it falsely)
        element << '[' << j << ']';
        check(list[j].toTensor(), i, element.str());
      }
    }
  }
  InFallback scope;
  at::native::cpu_fallback(op, stack, /*error_on_views=*/true);
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("empty.memory_format", empty_memory_format);
  m.impl("empty_strided", empty_strided);
  m.impl("_copy_from", copy_from);
  m.impl("_copy_from_and_resize", copy_from_and_resize);
  m.impl("_local_scalar_dense", local_scalar_dense);
  m.impl("convolution_overrideable", convolution);
  m.impl("as_strided", as_strided);
  m.impl("view", view);
  m.impl("_reshape_alias", reshape_alias);
  m.impl("unfold", unfold);
  m.impl("view_as_complex", view_as_complex);
  m.impl("view_as_real", view_as_real);
  m.impl("resize_", resize);
  m.impl("set_.source_Storage", set_storage);
  m.impl("set_.source_Storage_storage_offset", set_storage_offset);
}

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&checked_fallback>());
}

}  // namespace

bool checked_device_available() { return true; }

c10::Device checked_device() {
  static std::once_flag once;
  std::call_once(once, [] {
    c10::register_privateuse1_backend("xfcheck");
    c10::SetAllocator(kChecked, &g_allocator);
  });
  return c10::Device(kChecked, 0);
}

#else

bool checked_device_available() { return false; }

c10::Device checked_device() {
  XF_CHECK(false, "the checked device needs libtorch >= 2.4, this is ", TORCH_VERSION);
  return c10::Device(c10::kCPU);
}

#endif

int64_t checked_device_allocated_bytes() {
  std::lock_guard<std::mutex> lock(g_memory_mutex);
  return g_allocated;
}

int64_t checked_device_peak_bytes() {
  std::lock_guard<std::mutex> lock(g_memory_mutex);
  return g_peak;
}

void checked_device_reset_peak() {
  std::lock_guard<std::mutex> lock(g_memory_mutex);
  g_peak = g_allocated;
}

int64_t checked_device_host_reads() { return g_host_reads; }
int64_t checked_device_ops() { return g_ops; }

}  // namespace xfuser::testing
