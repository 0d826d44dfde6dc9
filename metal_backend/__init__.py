"""Apple Metal backend of the gdn ops: shaders, host dispatch, AOTI C shims, lowering.

Layout (in ExecuTorch's backend shape):

* ``kernels/``: the Metal Shading Language kernels (``gated_delta_rule.metal``)
  and their launch-parameter header, shared by every consumer below;
* ``runtime/``: launch planning (``launch.h``, plain C++), the Objective-C++
  dispatch on ExecuTorch's Metal stream and the AOTInductor C shims, built by
  ``CMakeLists.txt`` into ``gdn_metal_ops`` (macOS);
* ``shims.py``: the ``custom_ops_to_c_shims`` mapping AOTInductor receives;
* ``lowering.py``: ``lower_to_metal`` for ``export_qwen35 --backend metal``;
* ``mps_eager.py``: the ops on MPS tensors in eager PyTorch;
* ``emulation/``, ``emulation.py``: the kernels compiled as C++ and run in
  lockstep on the CPU, which is how Linux CI checks them;
* ``device/``: the same kernels compiled as CUDA, for an NVIDIA GPU's
  concurrency and compute-sanitizer (one device call);
* ``strict_check.py``, ``strict/``: the stricter compilers of ``make metal-check``.

Importing the package registers the eager MPS kernels when MPS is available
(on other machines it does nothing).
"""

from metal_backend import mps_eager

mps_eager.register()
