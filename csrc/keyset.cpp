// torch_cachepolicy._C.kernel_masks and KernelWatch (torch_cachepolicy.keyset):
// dispatcher questions a cache policy asks, answered without a Python round
// trip per (operator, key).
//
// kernel_masks: batched "which dispatch keys have a kernel registered directly
// for this operator". A cache policy classifies every operator it may meet by
// the dispatch keys that carry a direct kernel registration (Meta, CPU,
// CompositeImplicitAutograd, ...). From Python that is one
// torch._C._dispatch_has_kernel_for_dispatch_key call per (operator, key)
// pair, each re-parsing the name and repeating the dispatcher lookup: for the
// few thousand operators of a stock build and a dozen keys, tens of thousands
// of round trips. kernel_masks answers a whole batch in one call, with one
// lookup per operator.
//
// Semantics are those of torch_cachepolicy/keyset.py's pure-Python fallback,
// which the tests hold this file to: the operator must be registered with a
// schema (findSchema, as torch._C._dispatch_find_schema_or_throw), then bit i
// is OperatorHandle::hasKernelForDispatchKey(keys[i]), the very call that
// _dispatch_has_kernel_for_dispatch_key makes. That binding looks the operator
// up with findOp, which also finds impl-only entries (an impl() whose def()
// has not run); both paths here reject those, since nothing can call them.
//
// KernelWatch: "which kernels would fake dispatch run for this operator right
// now", as an int that a cache can key entries on, cheap enough to ask on
// every cache hit. See Note [Kernel fingerprints].

#include "module.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/DispatchKey.h>
#include <c10/util/Exception.h>

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

// Note [Reaching the OperatorEntry]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A kernel fingerprint needs the identity of the kernel registered for a key.
// impl::OperatorEntry has it publicly (kernelForDispatchKey returns a
// reference to the KernelFunction inside the entry's list of registrations),
// but OperatorHandle, the only thing the Dispatcher hands out, keeps its
// OperatorEntry in the private operatorDef_ and forwards everything except
// that accessor. Nothing public fills the gap in torch 2.13 or 2.14:
// OpRegistrationListener fires on def() only, never on impl(); there is no
// per-operator registration counter; getComputedKernelForDispatchKey
// registers a new KernelToken on the kernel on every call (the list is never
// pruned, so per-hit use leaks); dumpState() is a string costing ~10 us and
// names a Library's creation line, not the kernel.
//
// OperatorHandle and Dispatcher befriend every specialization of
// TypedOperatorHandle (`template <class> friend class TypedOperatorHandle;`).
// The specialization below, on a tag type of ours that torch never uses, is
// ordinary C++ (no access-check loophole, no offsets): it reads operatorDef_
// by name, so a rename or a dropped friendship in torch fails the build here
// instead of reading the wrong memory. It is the one non-public thing this
// file relies on. The fix to ask upstream for is public: forward
// OperatorEntry::kernelForDispatchKey from OperatorHandle (as 2.14 started
// doing for lookup()), or a per-OperatorEntry kernel generation counter
// bumped by registerKernel/deregisterKernel_, which would also make the
// tokens below unnecessary.
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

namespace torch_cachepolicy {
namespace {

// Bit 63 stays clear so that every mask is a non-negative int64 on both sides.
constexpr size_t kMaxKeys = 63;

// Splits "ns::name.overload" at the first '.', exactly as keyset._split does,
// so that both paths look up the same (name, overload) pair.
c10::OperatorName split_name(const std::string& qualified) {
  const auto dot = qualified.find('.');
  if (dot == std::string::npos) {
    return c10::OperatorName(qualified, "");
  }
  return c10::OperatorName(qualified.substr(0, dot), qualified.substr(dot + 1));
}

// `api` names the caller in error messages.
std::vector<c10::DispatchKey> to_dispatch_keys(
    const std::vector<int64_t>& keys,
    const char* api) {
  TORCH_CHECK(
      keys.size() <= kMaxKeys,
      api,
      ": at most ",
      kMaxKeys,
      " dispatch keys fit in a mask, got ",
      keys.size());
  std::vector<c10::DispatchKey> out;
  out.reserve(keys.size());
  for (const int64_t key : keys) {
    // Casting an int outside the enum's range would be undefined behaviour;
    // every value in [0, EndOfAliasKeys] is a declared DispatchKey. Undefined
    // (0) is allowed because the torch binding accepts it too (never a kernel).
    TORCH_CHECK(
        key >= 0 &&
            key <= static_cast<int64_t>(c10::DispatchKey::EndOfAliasKeys),
        api,
        ": ",
        key,
        " is not a c10::DispatchKey value (expected 0..",
        static_cast<int64_t>(c10::DispatchKey::EndOfAliasKeys),
        ")");
    out.push_back(static_cast<c10::DispatchKey>(key));
  }
  return out;
}

// The GIL stays held on purpose: a lookup costs well under a microsecond, so
// there is nothing to overlap, and holding it keeps Python code from
// destroying a torch.library.Library mid-batch, which would deregister an
// operator whose OperatorHandle is still in use here.
std::vector<int64_t> kernel_masks(
    const std::vector<std::string>& names,
    const std::vector<int64_t>& keys) {
  const std::vector<c10::DispatchKey> dispatch_keys =
      to_dispatch_keys(keys, "torch_cachepolicy._C.kernel_masks");
  auto& dispatcher = c10::Dispatcher::singleton();

  std::vector<int64_t> masks;
  masks.reserve(names.size());
  for (const std::string& name : names) {
    const c10::OperatorName op_name = split_name(name);
    const auto op = dispatcher.findSchema(op_name);
    if (!op.has_value()) {
      // Say which half is wrong; "unknown operator" alone sends people
      // looking for a missing import when the overload was misspelled.
      const bool impl_only = dispatcher.findOp(op_name).has_value();
      TORCH_CHECK(
          false,
          "operator '",
          name,
          "' ",
          impl_only ? "has kernels but no schema (impl() without def())"
                    : "is not registered (no schema for name '" +
                  op_name.name + "', overload '" + op_name.overload_name +
                  "')");
    }
    uint64_t mask = 0;
    for (size_t bit = 0; bit < dispatch_keys.size(); ++bit) {
      if (op->hasKernelForDispatchKey(dispatch_keys[bit])) {
        mask |= uint64_t{1} << bit;
      }
    }
    masks.push_back(static_cast<int64_t>(mask));
  }
  return masks;
}

// Note [Kernel fingerprints]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~
// KernelWatch::fingerprint() names the kernels registered directly for an
// operator under the watched keys (keyset.FAKE_KERNEL_KEYS: Meta and the
// Composite* alias keys, whatever fake dispatch can land on). Two calls give
// the same value iff every watched key has the very same registered kernel in
// both, or none in both: an override, a new Library's impl(), a destroyed
// Library, a reloaded .so all change it; a registration for another key
// (CPU, Autograd) does not.
//
// Backend fallbacks (Library.fallback, TORCH_LIBRARY_IMPL(_, ...)) are left
// out on purpose: they belong to a key, not to the operator, so a fingerprint
// of per-operator registrations cannot see them. torch's only one among these
// keys is Meta's, which raises NotImplementedError ("no meta kernel"), so no
// entry is ever computed by it; replacing it is a process-wide act a cache
// need not follow.
//
// Identity of a kernel: the address of the KernelFunction that
// OperatorEntry::kernelForDispatchKey returns. Every registration is a new
// node of the entry's std::list, so a live kernel keeps its address and two
// live kernels never share one. A dead kernel's address can be reused by a
// later registration (destroy a Library, register again: the allocator hands
// back the same node), so an address alone would miss that change (ABA).
// Hence a KernelToken per kernel ever seen (KernelFunction::registerToken,
// public; ~KernelFunction invalidates it) and a serial number per (address,
// live token): a known address whose token is invalid is a new kernel and
// gets a new serial. Serials are never reused, so a fingerprint names kernels,
// not addresses.
//
// Cost: a token is registered once per kernel per process (one weak_ptr in the
// kernel's token list), never per call. A hit is one findSchema by the cached
// OperatorName (no handle is cached: the OperatorDef it points to is freed
// when the operator's last def()/impl() goes away), two hash lookups per key
// and one atomic load per live kernel; the tables below are only touched when
// something changed.
//
// Fingerprint values are process-wide: the tuple of serials (one per key,
// 0 = none) is interned in one table, so two watches of the same operator (two
// modes sharing a store) agree, and a value is never reused for another set
// of kernels. kNoKernel: the operator has no kernel under any watched key.
// kMissing: no schema (unknown, impl()-only, or deregistered).
//
// Threads: the GIL stays held by every binding here. The registry has its
// own mutex anyway, since it is process-wide; a KernelWatch is not safe for
// concurrent use without the GIL. A registration racing from a C++ thread
// that does not hold the GIL can race with the reads below, exactly as it
// can with torch's own _dispatch_has_kernel_for_dispatch_key.
constexpr int64_t kMissing = -1;
constexpr int64_t kNoKernel = 0;

class KernelRegistry {
 public:
  // Leaked on purpose: watches and tokens may be used while static objects
  // (the Dispatcher's kernels included) are being destroyed at exit.
  static KernelRegistry& get() {
    static KernelRegistry* registry = new KernelRegistry();
    return *registry;
  }

  // The serial of `kernel`, registering a token with it the first time, and
  // the token that proves the serial still names this kernel.
  std::pair<uint64_t, std::shared_ptr<c10::KernelToken>> identify(
      const c10::KernelFunction& kernel) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto [it, inserted] = seen_.try_emplace(&kernel);
    if (inserted || !it->second.token->isValid()) {
      // New address, or a dead kernel's address reused (ABA): a new kernel.
      auto token = std::make_shared<c10::KernelToken>();
      kernel.registerToken(token);
      it->second = Seen{std::move(token), next_serial_++};
      if (inserted) {
        maybe_prune();
      }
    }
    return {it->second.serial, it->second.token};
  }

  // The fingerprint of a tuple of serials (0 = no kernel under that key).
  int64_t intern(const std::vector<uint64_t>& serials) {
    bool any = false;
    for (const uint64_t serial : serials) {
      any = any || serial != 0;
    }
    if (!any) {
      return kNoKernel;
    }
    std::lock_guard<std::mutex> lock(mutex_);
    auto [it, inserted] = states_.try_emplace(serials, next_state_);
    if (inserted) {
      ++next_state_;
    }
    return it->second;
  }

 private:
  struct Seen {
    std::shared_ptr<c10::KernelToken> token;
    uint64_t serial = 0;
  };

  // Entries of dead kernels whose address nobody reused would pile up over
  // many registrations; drop them (and the states naming them, which can
  // never recur since serials are not reused) whenever the table doubles.
  // Precondition: mutex_ is held.
  void maybe_prune() {
    if (seen_.size() < prune_at_) {
      return;
    }
    std::vector<uint64_t> dead;
    for (auto it = seen_.begin(); it != seen_.end();) {
      if (it->second.token->isValid()) {
        ++it;
      } else {
        dead.push_back(it->second.serial);
        it = seen_.erase(it);
      }
    }
    if (!dead.empty()) {
      std::sort(dead.begin(), dead.end());
      for (auto it = states_.begin(); it != states_.end();) {
        bool names_dead = false;
        for (const uint64_t serial : it->first) {
          names_dead = names_dead ||
              std::binary_search(dead.begin(), dead.end(), serial);
        }
        it = names_dead ? states_.erase(it) : std::next(it);
      }
    }
    prune_at_ = std::max<size_t>(kMinPrune, 2 * seen_.size());
  }

  static constexpr size_t kMinPrune = 1024;

  std::mutex mutex_;
  std::unordered_map<const c10::KernelFunction*, Seen> seen_;
  std::map<std::vector<uint64_t>, int64_t> states_;
  uint64_t next_serial_ = 1;
  int64_t next_state_ = kNoKernel + 1;
  size_t prune_at_ = kMinPrune;
};

using EntryAccess = c10::TypedOperatorHandle<OperatorEntryAccess>;

class KernelWatch {
 public:
  KernelWatch(std::string name, const std::vector<int64_t>& keys)
      : name_(std::move(name)),
        op_name_(split_name(name_)),
        keys_(to_dispatch_keys(keys, "torch_cachepolicy._C.KernelWatch")),
        kernels_(keys_.size(), nullptr),
        tokens_(keys_.size()),
        current_(keys_.size(), nullptr) {}

  const std::string& name() const {
    return name_;
  }

  int64_t fingerprint() {
    const auto op = c10::Dispatcher::singleton().findSchema(op_name_);
    if (!op.has_value()) {
      // The cached kernels stay: if they are alive when the operator is
      // back, they are still its kernels and the old value is still right.
      return kMissing;
    }
    const c10::impl::OperatorEntry& entry = EntryAccess::entry(*op);
    bool same = fingerprint_ != kUnknown;
    for (size_t i = 0; i < keys_.size(); ++i) {
      const c10::KernelFunction* kernel =
          entry.hasKernelForDispatchKey(keys_[i])
          ? &entry.kernelForDispatchKey(keys_[i])
          : nullptr;
      current_[i] = kernel;
      same = same && kernel == kernels_[i] &&
          (kernel == nullptr || tokens_[i]->isValid());
    }
    return same ? fingerprint_ : refresh();
  }

  // For tests: the address of each watched key's kernel (0 if none), to show
  // that the allocator did reuse an address where ABA is being tested.
  std::vector<uintptr_t> kernel_addresses() {
    fingerprint();
    std::vector<uintptr_t> out;
    out.reserve(current_.size());
    for (const c10::KernelFunction* kernel : current_) {
      out.push_back(reinterpret_cast<uintptr_t>(kernel));
    }
    return out;
  }

 private:
  // Slow path: current_ differs from the last kernels seen.
  int64_t refresh() {
    auto& registry = KernelRegistry::get();
    std::vector<uint64_t> serials(keys_.size(), 0);
    for (size_t i = 0; i < keys_.size(); ++i) {
      kernels_[i] = current_[i];
      tokens_[i].reset();
      if (current_[i] != nullptr) {
        std::tie(serials[i], tokens_[i]) = registry.identify(*current_[i]);
      }
    }
    fingerprint_ = registry.intern(serials);
    return fingerprint_;
  }

  static constexpr int64_t kUnknown = std::numeric_limits<int64_t>::min();

  const std::string name_;
  const c10::OperatorName op_name_;
  const std::vector<c10::DispatchKey> keys_;
  // The kernels behind fingerprint_, with the tokens that show each is alive.
  std::vector<const c10::KernelFunction*> kernels_;
  std::vector<std::shared_ptr<c10::KernelToken>> tokens_;
  int64_t fingerprint_ = kUnknown;
  // Scratch for fingerprint(), kept to avoid an allocation per call.
  std::vector<const c10::KernelFunction*> current_;
};

} // namespace

void init_keyset(pybind11::module& m) {
  m.def(
      "kernel_masks",
      &kernel_masks,
      pybind11::arg("names"),
      pybind11::arg("keys"),
      "For each 'ns::name.overload' in names, a mask whose bit i is set iff\n"
      "keys[i] (an int(torch._C.DispatchKey)) has a kernel registered\n"
      "directly for that operator. Raises RuntimeError for an unknown\n"
      "operator or overload, more than 63 keys, or a key out of range.");

  pybind11::class_<KernelWatch>(
      m,
      "KernelWatch",
      "Watches the kernels registered for one operator under the given\n"
      "dispatch keys. See torch_cachepolicy.keyset.kernel_watch.")
      .def(
          pybind11::init<std::string, const std::vector<int64_t>&>(),
          pybind11::arg("name"),
          pybind11::arg("keys"))
      .def_property_readonly("name", &KernelWatch::name)
      .def(
          "fingerprint",
          &KernelWatch::fingerprint,
          "An int naming the kernels registered for the operator under the\n"
          "watched keys right now: equal iff they are the same kernels.\n"
          "MISSING if the operator has no schema, NO_KERNEL if none.")
      .def(
          "_kernel_addresses",
          &KernelWatch::kernel_addresses,
          "For tests: each watched key's kernel address, 0 if none.")
      .def("__repr__", [](const KernelWatch& self) {
        return "<torch_cachepolicy._C.KernelWatch '" + self.name() + "'>";
      });
  m.attr("MISSING") = kMissing;
  m.attr("NO_KERNEL") = kNoKernel;
}

} // namespace torch_cachepolicy
