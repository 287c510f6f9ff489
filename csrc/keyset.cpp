// torch_cachepolicy._C: batched "which dispatch keys have a kernel registered
// directly for this operator".
//
// Why this exists: a cache policy classifies every operator it may meet by the
// dispatch keys that carry a direct kernel registration (Meta, CPU,
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

#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/DispatchKey.h>
#include <c10/util/Exception.h>

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <string>
#include <vector>

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

std::vector<c10::DispatchKey> to_dispatch_keys(
    const std::vector<int64_t>& keys) {
  TORCH_CHECK(
      keys.size() <= kMaxKeys,
      "torch_cachepolicy._C.kernel_masks: at most ",
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
        "torch_cachepolicy._C.kernel_masks: ",
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
  const std::vector<c10::DispatchKey> dispatch_keys = to_dispatch_keys(keys);
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

} // namespace
} // namespace torch_cachepolicy

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "Batched dispatcher queries for torch_cachepolicy.keyset.";
  m.def(
      "kernel_masks",
      &torch_cachepolicy::kernel_masks,
      pybind11::arg("names"),
      pybind11::arg("keys"),
      "For each 'ns::name.overload' in names, a mask whose bit i is set iff\n"
      "keys[i] (an int(torch._C.DispatchKey)) has a kernel registered\n"
      "directly for that operator. Raises RuntimeError for an unknown\n"
      "operator or overload, more than 63 keys, or a key out of range.");
}
