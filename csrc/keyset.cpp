// torch_cachepolicy._C.KernelWatch (torch_cachepolicy._keyset.kernel_watch):
// "which kernels would fake dispatch run for this operator right now", as an
// int that a cache can key entries on, cheap enough to ask on every cache
// hit. See Note [Kernel fingerprints].

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

#include "operator_entry_access.h"

namespace torch_cachepolicy {
namespace {

// Splits "ns::name.overload" at the first '.', as _keyset.kernel_keys does.
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
  std::vector<c10::DispatchKey> out;
  out.reserve(keys.size());
  for (const int64_t key : keys) {
    // Casting an int outside the enum's range would be undefined behaviour;
    // every value in [0, EndOfAliasKeys] is a declared DispatchKey. Undefined
    // (0) is allowed because torch's bindings accept it too (never a kernel).
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

// Note [Kernel fingerprints]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~
// KernelWatch::fingerprint() names the kernels registered directly for an
// operator under the watched keys (_keyset.FAKE_KERNEL_KEYS: Meta and the
// Composite* keys fake dispatch can land on). Two calls agree iff every
// watched key has the very same registered kernel in both, or none: an
// override, a new Library's impl(), a destroyed Library, a reloaded .so change
// it; a registration for another key does not. Backend fallbacks belong to a
// key, not the operator, and are left out (torch's Meta fallback only raises).
//
// A kernel's identity is the address of the KernelFunction that
// OperatorEntry::kernelForDispatchKey returns: each registration is a new node
// of the entry's std::list, so live kernels keep distinct addresses, but a dead
// kernel's address can come back for a later registration (ABA). Hence a
// KernelToken per kernel ever seen (KernelFunction::registerToken; the
// kernel's destructor invalidates it) and a serial per (address, live token),
// never reused. A token is registered once per kernel per process; a call is
// one findSchema (no handle is cached: its OperatorDef dies with the op's last
// registration), two hash lookups per key and an atomic load per kernel.
//
// Values are process-wide (the tuple of serials is interned), so two watches
// of an operator agree. kNoKernel: no kernel under any watched key; kMissing:
// no schema. The GIL is held by every binding; the registry has its own mutex.
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
  pybind11::class_<KernelWatch>(
      m,
      "KernelWatch",
      "Watches the kernels registered for one operator under the given\n"
      "dispatch keys. See torch_cachepolicy._keyset.kernel_watch.")
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
