#include "autoencoder_kl.h"

#include <algorithm>

namespace lt::plan {

namespace {

int64_t working(const models::sd::VAEConfig& vae, const Shape& s, bool decode) {
  const int64_t f = int64_t(1) << (vae.block_out_channels.size() - 1);
  int64_t lh = std::max<int64_t>(1, s.height / f), lw = std::max<int64_t>(1, s.width / f);
  const int64_t b = s.batch;
  int64_t worst = 0;
  const size_t levels = vae.block_out_channels.size();
  for (size_t i = 0; i < levels; ++i) {
    const int64_t scale = int64_t(1) << i;  // level 0 is full resolution
    const int64_t hw = (lh * f / scale) * (lw * f / scale);
    const int64_t c_out = vae.block_out_channels[i];
    // A resnet's input (the decoder's: upsampled from the level above) kept for the residual while
    // its normalised, activated and convolved copies come and go.
    const int64_t c_in = decode && i + 1 < levels ? vae.block_out_channels[i + 1] : c_out;
    worst = std::max(worst, b * hw * (c_in + (decode ? 4 : 3) * c_out));
  }
  const int64_t cells = lh * lw;
  const int64_t mid = vae.block_out_channels.back();
  worst = std::max(worst, b * (2 * cells * cells + 4 * mid * cells));
  return worst * 4;
}

// The tile the VAE works on: the configured sample size, or half the latent when that is smaller,
// rounded up to a multiple of 4 cells (AutoencoderKLImpl::tile_latent_for: whole-cell steps at the
// 0.25 overlap).
Shape tile_of(const models::sd::VAEConfig& vae, const Shape& s, const Compute& c) {
  Shape tile = s;
  if (c.vae_tiling) {
    const int64_t f = int64_t(1) << (vae.block_out_channels.size() - 1);
    const int64_t side = std::max(s.width, s.height) / f;
    const int64_t min_tile = vae.sample_size / f;
    const int64_t t = side > min_tile ? min_tile : (std::max<int64_t>(8, (side + 1) / 2) + 3) / 4 * 4;
    if (t < side) tile.width = tile.height = t * f;
  }
  return tile;
}

}  // namespace

int64_t autoencoder_kl_encode(const models::sd::VAEConfig& vae, const Shape& s, const Compute& c) {
  return working(vae, tile_of(vae, s, c), false);
}

int64_t autoencoder_kl_decode(const models::sd::VAEConfig& vae, const Shape& s, const Compute& c) {
  // The decoded image itself, in fp32, stays while the tiles are blended.
  return working(vae, tile_of(vae, s, c), true) + (c.vae_tiling ? s.batch * 3 * s.width * s.height * 4 : 0);
}

}  // namespace lt::plan
