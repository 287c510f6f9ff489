// torch_cachepolicy._C: the module definition. See module.h.

#include "module.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() =
      "Native helpers of torch_cachepolicy: dispatcher queries (keyset), the\n"
      "cache key builder (keybuilder), the common case of the key extension\n"
      "(keyparts), the meta tensors of cache hits (synth) and the common case\n"
      "of a hit in one call (hitpath). Loaded by torch_cachepolicy.native.";
  torch_cachepolicy::init_keyset(m);
  torch_cachepolicy::init_keybuilder(m);
  torch_cachepolicy::init_keyparts(m);
  torch_cachepolicy::init_synth(m);
  torch_cachepolicy::init_hitpath(m);
}
