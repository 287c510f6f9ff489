// torch_cachepolicy._C: the module definition. See module.h.

#include "module.h"

// setup.py passes torch.__version__ at build time (Note [An extension built
// for another torch] in torch_cachepolicy/_native.py).
#ifndef TORCH_CACHEPOLICY_TORCH_VERSION
#error "build torch_cachepolicy._C through setup.py, which defines TORCH_CACHEPOLICY_TORCH_VERSION"
#endif

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() =
      "Native helpers of torch_cachepolicy: the kernel watch (_keyset), the\n"
      "cache key builder (_key), the common case of the key extension\n"
      "(_key_extension) and the meta tensors of cache hits (_synth). Loaded by\n"
      "torch_cachepolicy._native.";
  // The torch.__version__ this extension was built against.
  m.attr("TORCH_VERSION") = TORCH_CACHEPOLICY_TORCH_VERSION;
  torch_cachepolicy::init_keyset(m);
  torch_cachepolicy::init_keybuilder(m);
  torch_cachepolicy::init_keyparts(m);
  torch_cachepolicy::init_synth(m);
}
