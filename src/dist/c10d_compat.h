// Everything in the dist area that differs between Debian's LibTorch 1.13 and the CUDA LibTorch
// 2.x shipped inside PyTorch. Only this header may test TORCH_VERSION_*.
#pragma once
#include <torch/version.h>

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#ifdef USE_C10D_GLOO
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#endif
#ifdef USE_C10D_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

namespace lt::dist::compat {

// 1.13: Gloo and NCCL derive from c10d::ProcessGroup. 2.x: they are c10d::Backend subclasses (a
// ProcessGroup there dispatches to backends by device; we hold the one backend we use). Both
// return c10d::Work from a collective.
#if TORCH_VERSION_MAJOR >= 2
using Collectives = c10d::Backend;
#else
using Collectives = c10d::ProcessGroup;
#endif

}  // namespace lt::dist::compat
