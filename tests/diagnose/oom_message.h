// The CUDA out-of-memory message PyTorch 2.x prints, as the diagnose tests append it to logs.
#pragma once

namespace lt::test {

inline constexpr const char* kOom =
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 23.65 GiB "
    "of which 120.00 MiB is free. Including non-PyTorch memory, this process has 23.50 GiB memory in use. Of the "
    "allocated memory 22.90 GiB is allocated by PyTorch, and 100.00 MiB is reserved by PyTorch but unallocated.\n";

}  // namespace lt::test
