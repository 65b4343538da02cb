"""The one part of the build that pyproject.toml cannot say: the optional C kernel of the
IFMA backend (common/crypto/ifma_lanes.c, design §4.9).

It is plain C over ctypes buffers (no Python headers), compiled only on x86-64 with a
compiler that knows -mavx512ifma; where it cannot be built the install goes on without
it (`optional=True`) and the fixed-base products stay on gmpy2.
"""
import platform

from setuptools import Extension, setup

kernels = []
if platform.machine() in ("x86_64", "AMD64"):
    kernels.append(Extension("common.crypto._ifma_lanes", sources=["common/crypto/ifma_lanes.c"],
                             extra_compile_args=["-O3", "-funroll-loops", "-mavx512f", "-mavx512ifma"], optional=True))

setup(ext_modules=kernels)
