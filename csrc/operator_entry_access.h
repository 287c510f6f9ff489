// Friend access to c10::impl::OperatorEntry, the one non-public part of
// torch that torch_cachepolicy._C relies on (keyset.cpp's KernelWatch).

#pragma once

#include <ATen/core/dispatch/Dispatcher.h>

// Note [Reaching the OperatorEntry]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A kernel fingerprint needs the identity of the kernel registered for a key.
// impl::OperatorEntry has it publicly (kernelForDispatchKey), but
// OperatorHandle, all the Dispatcher hands out, keeps its OperatorEntry in the
// private operatorDef_, and nothing public fills the gap in torch 2.13 or 2.14
// (OpRegistrationListener fires on def() only; getComputedKernelForDispatchKey
// registers a new token per call, a leak per hit; dumpState() costs ~10 us and
// names a Library's line, not the kernel). OperatorHandle befriends every
// specialization of TypedOperatorHandle; the one below, on a tag type of ours,
// reads operatorDef_ by name, so a rename or a dropped friendship fails the
// build instead of reading the wrong memory. The upstream fix: forward
// kernelForDispatchKey from OperatorHandle, or a per-entry kernel generation
// counter (which would also make keyset.cpp's tokens unnecessary).
#ifdef C10_DISPATCHER_ONE_KERNEL_PER_DISPATCH_KEY
// Mobile builds overwrite one kernel slot per key in place, so a kernel's
// address says nothing about its identity (Note [Kernel fingerprints]).
#error "torch_cachepolicy._C needs the dispatcher's list of kernels per key"
#endif

namespace torch_cachepolicy {
struct OperatorEntryAccess;
} // namespace torch_cachepolicy

namespace c10 {
template <>
class TypedOperatorHandle<torch_cachepolicy::OperatorEntryAccess> final {
 public:
  static const impl::OperatorEntry& entry(const OperatorHandle& op) {
    return op.operatorDef_->op;
  }
};
} // namespace c10
