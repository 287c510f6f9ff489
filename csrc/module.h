// torch_cachepolicy._C: the native helpers of torch_cachepolicy.
//
// One extension module, defined in module.cpp. Each source file binds the
// functions of one Python module of the package through its init_* function
// below, and depends on no other source file; torch_cachepolicy/_native.py
// loads the extension once for all of them.

#pragma once

#include <pybind11/pybind11.h>

namespace torch_cachepolicy {

// keyset.cpp (torch_cachepolicy._keyset): KernelWatch, MISSING, NO_KERNEL.
void init_keyset(pybind11::module& m);
// keybuilder.cpp (torch_cachepolicy._key): KeyBuilder.
void init_keybuilder(pybind11::module& m);
// keyparts.cpp (torch_cachepolicy._key_extension): plain_args.
void init_keyparts(pybind11::module& m);
// synth.cpp (torch_cachepolicy._synth): meta_empty_strided, meta_view_of,
// meta_template, meta_fresh_like.
void init_synth(pybind11::module& m);

} // namespace torch_cachepolicy
