// Anchors the precompiled LibTorch header (see LtTorch.cmake).
