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

} // namespace torch_cachepolicy
