#include "models/vae/patch_parallel.h"

#include <algorithm>

#include <ATen/ATen.h>

#include "backends/error.h"
#include "backends/tensor_util.h"
#include "models/vae/autoencoder_kl.h"
#include "parallel/communicator.h"

namespace xfuser::models::vae {

std::vector<int64_t> band_rows(int64_t rows, int parts) {
  XF_CHECK(parts >= 1 && rows >= 0, "band_rows: cannot split ", rows, " rows into ", parts,
           " bands");
  std::vector<int64_t> out(parts, rows / parts);
  for (int64_t r = 0; r < rows % parts; ++r) ++out[r];
  return out;
}

CommSpatialContext::CommSpatialContext(parallel::Communicator& comm, std::vector<int64_t> rows)
    : comm_(comm), rows_(std::move(rows)) {
  XF_CHECK(static_cast<int>(rows_.size()) == comm_.size(), "CommSpatialContext: ", rows_.size(),
           " bands for the ", comm_.size(), " ranks of group '", comm_.name(), "'");
  for (int64_t r : rows_) {
    XF_CHECK(r >= 1, "CommSpatialContext: every band needs at least one latent row");
  }
}

at::Tensor CommSpatialContext::pad_rows(const at::Tensor& x, int64_t halo) const {
  // x [B, C, h, W] -> [B, C, h + 2*halo, W]
  const int rank = comm_.rank(), size = comm_.size();
  XF_CHECK(x.size(2) >= halo, "patch-parallel VAE: band of ", x.size(2), " rows on rank ", rank,
           " is thinner than the halo of ", halo, " rows");
  at::Tensor above = at::zeros({x.size(0), x.size(1), halo, x.size(3)}, x.options());
  at::Tensor below = at::zeros_like(above);
  // One grouped exchange (receives listed first): safe on NCCL, where ungrouped receives posted
  // before the sends would block every rank.
  using parallel::P2POp;
  std::vector<P2POp> ops;
  if (rank > 0) ops.push_back(P2POp::recv(above, rank - 1, parallel::Tag::kVaeHalo));
  if (rank + 1 < size) ops.push_back(P2POp::recv(below, rank + 1, parallel::Tag::kVaeHalo));
  const at::Tensor top = x.narrow(2, 0, halo).contiguous();
  const at::Tensor bottom = x.narrow(2, x.size(2) - halo, halo).contiguous();
  if (rank > 0) ops.push_back(P2POp::send(top, rank - 1, parallel::Tag::kVaeHalo));
  if (rank + 1 < size) ops.push_back(P2POp::send(bottom, rank + 1, parallel::Tag::kVaeHalo));
  comm_.batch_p2p(std::move(ops))->wait();
  return at::cat({above, x, below}, 2);
}

std::pair<at::Tensor, at::Tensor> CommSpatialContext::group_moments(const at::Tensor& x) const {
  // x [B, G, n] fp32 -> mean, biased variance [B, G] over every rank's values (two passes,
  // float64 sums: the same statistics as one rank's var_mean up to rounding).
  const int64_t b = x.size(0), g = x.size(1);
  at::Tensor xd = x.to(at::kDouble);
  at::Tensor sums = at::cat(
      {xd.sum(-1).reshape({-1}), at::full({1}, static_cast<double>(x.size(2)), xd.options())});
  comm_.all_reduce(sums);  // [B*G + 1]: sums, then the element count
  const double count = sums[b * g].item<double>();
  at::Tensor mean = sums.narrow(0, 0, b * g).reshape({b, g}) / count;  // [B, G]
  at::Tensor sq = (xd - mean.unsqueeze(-1)).pow(2).sum(-1).contiguous();
  comm_.all_reduce(sq);
  return {mean.to(at::kFloat), (sq / count).to(at::kFloat)};
}

at::Tensor CommSpatialContext::gather_uneven(const at::Tensor& x, int64_t dim) const {
  at::Tensor len = at::full({1}, x.size(dim), at::kLong);
  at::Tensor lens = comm_.all_gather(len, 0);  // [P]
  int64_t longest = 0;
  for (int i = 0; i < comm_.size(); ++i) longest = std::max(longest, lens[i].item<int64_t>());
  at::Tensor padded = x;
  if (x.size(dim) < longest) {
    std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
    shape[dim] = longest - x.size(dim);
    padded = at::cat({x, at::zeros(shape, x.options())}, dim);
  }
  at::Tensor all = comm_.all_gather(padded.contiguous(), dim);  // P blocks of `longest`
  std::vector<at::Tensor> parts;
  for (int i = 0; i < comm_.size(); ++i) {
    parts.push_back(all.narrow(dim, i * longest, lens[i].item<int64_t>()));
  }
  return at::cat(parts, dim);
}

at::Tensor CommSpatialContext::gather_tokens(const at::Tensor& tokens) const {
  return gather_uneven(tokens, 1);  // [B, n_r, C] -> [B, N, C], rows in band order
}

at::Tensor patch_parallel_decode(const AutoencoderKL& vae, const at::Tensor& z,
                                 parallel::Communicator& comm) {
  XF_CONTEXT("patch-parallel VAE decode on group '", comm.name(), "'");
  XF_CHECK(z.dim() == 4, "patch-parallel VAE decode expects z [B, C, h, w], got ",
           xfuser::shape_string(z.sizes()));
  const int64_t h = z.size(2);
  if (comm.size() == 1 || h < comm.size()) return vae.decode(z);  // whole latent on every rank
  auto rows = band_rows(h, comm.size());
  int64_t start = 0;
  for (int r = 0; r < comm.rank(); ++r) start += rows[r];
  CommSpatialContext ctx(comm, rows);
  auto decode_band = [&](const at::Tensor& zi) {
    at::Tensor band = vae.decode_full(zi.narrow(2, start, rows[comm.rank()]), &ctx);
    return ctx.gather_uneven(band.contiguous(), 2);  // [b, out, H, W]
  };
  if (vae.slicing() && z.size(0) > 1) {
    std::vector<at::Tensor> parts;
    for (const auto& zi : z.split(1)) parts.push_back(decode_band(zi));
    return at::cat(parts);
  }
  return decode_band(z);
}

DiagonalGaussian patch_parallel_encode(const AutoencoderKL& vae, const at::Tensor& x,
                                       parallel::Communicator& comm) {
  XF_CONTEXT("patch-parallel VAE encode on group '", comm.name(), "'");
  XF_CHECK(x.dim() == 4, "patch-parallel VAE encode expects x [B, C, H, W], got ",
           xfuser::shape_string(x.sizes()));
  const int64_t f = vae.spatial_scale();
  const int64_t h = x.size(2) / f;  // latent rows
  if (comm.size() == 1 || x.size(2) % f != 0 || h < comm.size()) return vae.encode(x);
  const auto rows = band_rows(h, comm.size());
  int64_t start = 0;
  for (int r = 0; r < comm.rank(); ++r) start += rows[r];
  CommSpatialContext ctx(comm, rows);
  auto encode_band = [&](const at::Tensor& xi) {
    at::Tensor band = vae.encode_full(xi.narrow(2, start * f, rows[comm.rank()] * f), &ctx);
    return ctx.gather_uneven(band.contiguous(), 2);  // [b, 2 * latent, h, w]
  };
  at::Tensor moments;
  if (vae.slicing() && x.size(0) > 1) {
    std::vector<at::Tensor> parts;
    for (const auto& xi : x.split(1)) parts.push_back(encode_band(xi));
    moments = at::cat(parts);
  } else {
    moments = encode_band(x);
  }
  return AutoencoderKL::posterior(moments);
}

}  // namespace xfuser::models::vae
