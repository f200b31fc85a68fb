// A checked device for tests: a second device whose memory is host memory, so that code written
// for a GPU can run on a machine without one and be held to a GPU's rules.
//
// The device is libtorch's PrivateUse1 backend, named "xfcheck" ("xfcheck:0"). Its tensors live
// in host memory; views alias as on any device; every operator without a kernel of its own runs
// the CPU kernel on host copies and writes results back (at::native::cpu_fallback). Before that,
// each operator's tensor arguments are checked as a CUDA kernel checks them: a tensor on the CPU
// with one or more dimensions among checked-device tensors is an error naming the operator, the
// argument and its shape. That is the bug a model has when it makes a tensor without options
// taken from an input or from the load options: on a GPU it is a "found at least two devices"
// error (or a silent host round trip); here it is caught without one. Like CUDA, 0-dim CPU
// tensors (scalars) and CPU index tensors of aten::index / index_put_ are allowed.
//
// Host reads stay possible (item(), copies to the CPU), as on a GPU. Each is counted
// (host_reads()): on a GPU every one is a device synchronisation.
//
// Needs libtorch >= 2.4 (PrivateUse1 naming, the non-const Allocator); available() is false on
// older ones and tests skip.
#pragma once

#include <cstdint>
#include <string>

#include <c10/core/Device.h>

namespace xfuser::testing {

// Whether this libtorch can host the checked device.
bool checked_device_available();
// The checked device ("xfcheck:0"), registering the backend on first use.
c10::Device checked_device();
// Operators that copied a checked-device tensor to the CPU (item(), .cpu(), .to(kCPU)) so far.
int64_t checked_device_host_reads();
// Operators that ran on the checked device so far (a test can tell that something ran there).
int64_t checked_device_ops();
// Bytes the checked device's tensors hold now, and at the peak since the last reset (as a GPU's
// caching allocator reports allocated bytes, without its caching).
int64_t checked_device_allocated_bytes();
int64_t checked_device_peak_bytes();
void checked_device_reset_peak();

}  // namespace xfuser::testing
