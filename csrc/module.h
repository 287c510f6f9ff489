// torch_cachepolicy._C: the native helpers of torch_cachepolicy.
//
// One extension module, defined in module.cpp. Each source file binds the
// functions of one Python module of the package and exposes them through its
// init_* function below; torch_cachepolicy/native.py loads the extension once
// for all of them.

#pragma once

#include <pybind11/pybind11.h>

namespace torch_cachepolicy {

// keyset.cpp (torch_cachepolicy.keyset): kernel_masks, KernelWatch, MISSING, NO_KERNEL.
void init_keyset(pybind11::module& m);
// keybuilder.cpp (torch_cachepolicy.keybuilder): KeyBuilder.
void init_keybuilder(pybind11::module& m);
// keyparts.cpp (torch_cachepolicy.keyparts): plain_args.
void init_keyparts(pybind11::module& m);
// synth.cpp (torch_cachepolicy.synth): meta_empty_strided, meta_view_of.
void init_synth(pybind11::module& m);
// hitpath.cpp (torch_cachepolicy.hitpath): HitPath.
void init_hitpath(pybind11::module& m);

// What hitpath.cpp calls in the other files, as their Python bindings do.

// KeyBuilder.build(mode, prefix, args, kwargs) without a state: a static
// key's tuple, or a str (the reason to take the Python path).
pybind11::object build_static_key(
    pybind11::handle builder,
    pybind11::handle mode,
    pybind11::tuple prefix,
    pybind11::handle args,
    pybind11::handle kwargs);
// _C.plain_args.
bool plain_args(const pybind11::handle& args, const pybind11::handle& kwargs);
// _C.meta_empty_strided, _C.meta_view_of.
pybind11::object meta_empty_strided(
    const pybind11::handle& shape,
    const pybind11::handle& stride,
    const pybind11::handle& dtype,
    bool requires_grad);
pybind11::object meta_view_of(
    const pybind11::handle& base,
    const pybind11::handle& shape,
    const pybind11::handle& stride,
    int64_t storage_offset,
    const pybind11::handle& dtype);

} // namespace torch_cachepolicy
