// CudaBackend's frozen weights: uploaded once and kept resident (keyed on address, shape,
// storage and a content fingerprint), or used in place when they already lie in device memory;
// X W^T panel by panel of dequantized rows.
// (CudaBackend is declared in cuda_backend.h, which lists where each operation family lives.)
#include <algorithm>
#include <cstring>

#include "cuda_backend.h"
#include "quant/ggml_types.h"

namespace qlft::cu {

uint64_t weight_fingerprint(const QWeight& W) {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&h](uint64_t v) {
    for (int i = 0; i < 8; ++i) h = (h ^ ((v >> (8 * i)) & 0xff)) * 1099511628211ull;
  };
  mix(uint64_t(W.kind));
  mix(W.ggml_type);
  const size_t n = W.data.size();
  const uint8_t* b = static_cast<const uint8_t*>(W.data.data());
  mix(n);
  if (n >= 8)
    for (size_t i = 0; i < 64; ++i) {
      uint64_t v;
      std::memcpy(&v, b + (n - 8) * i / 63, 8);
      mix(v);
    }
  else
    for (size_t i = 0; i < n; ++i) mix(b[i]);
  return h;
}

// The kernels' view of W's kind and shape (data and scales not set).
DevWeight CudaBackend::describe(const QWeight& W) {
  cu::DevWeight w;
  w.kind = W.kind;
  w.ggml_type = W.ggml_type;
  w.rows = W.rows;
  w.cols = W.cols;
  w.blocksize = W.blocksize;
  if (W.kind == QuantKind::GGML) {
    const GgmlTypeTraits* t = ggml_type_traits(W.ggml_type);
    QLFT_CHECK_ARG(t && t->dequantizable, "cuda backend: unknown GGUF type %u", W.ggml_type);
    if (t->block == 1) {  // plain GGUF F32/F16/BF16 tensors kept as GGML: treat as such
      const GgmlType g = static_cast<GgmlType>(W.ggml_type);
      QLFT_CHECK_ARG(g == GgmlType::F32 || g == GgmlType::F16 || g == GgmlType::BF16,
                     "cuda backend: GGUF type %s is not supported on the device", t->name);
      w.kind = g == GgmlType::F32   ? QuantKind::F32
               : g == GgmlType::F16 ? QuantKind::F16
                                    : QuantKind::BF16;
    }
  }
  return w;
}

namespace {
// The double-quantized absmax fields of w (an NF4 weight of W's form) over device arrays.
void set_nested(DevWeight& w, const QWeight& W, const uint8_t* q, const float* nested_absmax,
                const float* nested_code) {
  w.scales = nullptr;
  w.absmax_q = q;
  w.nested_absmax = nested_absmax;
  w.nested_code = nested_code;
  w.nested_blocksize = W.nested_blocksize;
  w.nested_offset = W.nested_offset;
}
}  // namespace

// A weight whose storage already lives in this backend's memory (ZeRO-3 over NCCL gathers
// units there): used in place, never cached (the next gather reuses the memory). A double-
// quantized NF4 weight is read in its own form (the kernel decodes the block absmax).
const DevWeight& CudaBackend::in_place(const QWeight& W) {
  auto held = [&](const Buffer& b) {
    QLFT_CHECK_ARG(b.empty() || mem_.holds(b.data(), int64_t(b.size())),
                   "cuda backend: a %s weight is partly in device memory, partly on the host",
                   W.type_name().c_str());
  };
  for (const Buffer* b : {&W.absmax, &W.nested_absmax, &W.nested_code, &W.scb}) held(*b);
  cu::DevWeight& w = in_place_.w;
  w = describe(W);
  w.data = W.data.data();
  w.scales = nullptr;
  if (W.kind == QuantKind::NF4 && !W.double_quant) {
    w.scales = W.absmax.as<float>();
  } else if (W.kind == QuantKind::NF4) {
    set_nested(w, W, W.absmax.as<uint8_t>(), W.nested_absmax.as<float>(),
               W.nested_code.as<float>());
  } else if (W.kind == QuantKind::INT8) {
    w.scales = W.scb.as<float>();
  }
  return w;
}

const DevWeight& CudaBackend::resident(const QWeight& W) {
  if (!W.data.empty() && mem_.holds(W.data.data(), int64_t(W.data.size()))) return in_place(W);
  auto it = weights_.find(&W);
  if (it != weights_.end() && it->second.host_data == W.data.data() && it->second.rows == W.rows &&
      it->second.cols == W.cols && it->second.fingerprint == weight_fingerprint(W))
    return it->second.w;
  ResidentWeight rw;
  rw.host_data = W.data.data();
  rw.fingerprint = weight_fingerprint(W);
  rw.rows = W.rows;
  rw.cols = W.cols;
  cu::DevWeight& w = rw.w;
  w = describe(W);
  rw.data = DeviceMemory(tracker_, MemCategory::Weights, std::max<size_t>(W.data.size(), 1),
                         "device weight");
  copy_up(rw.data.data(), W.data.data(), int64_t(W.data.size()));
  if (W.kind == QuantKind::NF4 && W.double_quant) {
    // As the host keeps it (bitsandbytes' double quantization: ~1 byte of absmax per block, not
    // 4): one block of the 8-bit codes, the nested absmax and the code book, each 16-aligned.
    const size_t qa = (W.absmax.size() + 15) / 16 * 16,
                 na = (W.nested_absmax.size() + 15) / 16 * 16;
    rw.scales = DeviceMemory(tracker_, MemCategory::Weights, qa + na + W.nested_code.size(),
                             "device nf4 absmax (double-quantized)");
    uint8_t* d = static_cast<uint8_t*>(rw.scales.data());
    copy_up(d, W.absmax.data(), int64_t(W.absmax.size()));
    copy_up(d + qa, W.nested_absmax.data(), int64_t(W.nested_absmax.size()));
    copy_up(d + qa + na, W.nested_code.data(), int64_t(W.nested_code.size()));
    set_nested(w, W, d, reinterpret_cast<const float*>(d + qa),
               reinterpret_cast<const float*>(d + qa + na));
  } else if (W.kind == QuantKind::NF4) {
    rw.scales = DeviceMemory(tracker_, MemCategory::Weights, std::max<size_t>(W.absmax.size(), 1),
                             "device nf4 absmax");
    copy_up(rw.scales.data(), W.absmax.data(), int64_t(W.absmax.size()));
  } else if (W.kind == QuantKind::INT8) {
    rw.scales = DeviceMemory(tracker_, MemCategory::Weights, std::max<size_t>(W.scb.size(), 1),
                             "device int8 scales");
    copy_up(rw.scales.data(), W.scb.data(), int64_t(W.scb.size()));
  }
  sync();  // uploaded before the caller may change or free the host bytes
  w.data = rw.data.data();
  if (!w.absmax_q) w.scales = rw.scales.as<float>();
  auto& slot = weights_[&W];
  slot = std::move(rw);
  return slot.w;
}

// Y [M, N] = X W^T (X fp32 compact [M, K] on the device), panel by panel of W rows.
void CudaBackend::matmul_xwt(const QWeight& W, const float* X, int64_t M, float* Y,
                             const uint16_t* X16) {
  const int64_t N = W.rows, K = W.cols;
  const cu::DevWeight& dw = resident(W);
  const void* xin = X16 ? static_cast<const void*>(X16) : X;
  DeviceMemory Xh;
  if (tile_ != TileType::F32 && !X16) {
    Xh = dev(M * K * 2, MemCategory::Workspace, "linear input (16-bit)");
    cu::convert_tile(X, M, K, K, Xh.data(), tile_, stream_);
    xin = Xh.data();
  }
  const int64_t P = std::min(panel_rows(K), std::max<int64_t>(N, 1));
  DeviceMemory T =
      dev(P * K * int64_t(cu::tile_elem_bytes(tile_)), MemCategory::Workspace, "weight panel");
  for (int64_t p0 = 0; p0 < N; p0 += P) {
    const int64_t n = std::min(P, N - p0);
    cu::dequant_rows(dw, nullptr, p0, n, T.data(), tile_, stream_);
    gemm_->run(M, n, K, 1.f, {xin, tile_, K, false}, {T.data(), tile_, K, true}, 0.f, Y + p0, N);
  }
  if (K == 0 && N > 0) QLFT_CUDA_CHECK(cudaMemsetAsync(Y, 0, size_t(M * N) * 4, stream_));
}

// The embedding and head at 16-bit tiles: the fp32 matrix rounded to nearest even on the host a
// slab at a time (pageable copies: the slab is read when copy_up returns; no fp32 copy on the
// device at any time) and kept in the tile type. It replaces an fp32 copy resident(W) made.
const DevWeight& CudaBackend::resident16(const QWeight& W) {
  const bool plain = W.kind == QuantKind::F32 ||
                     (W.kind == QuantKind::GGML && W.ggml_type == uint32_t(GgmlType::F32));
  if (tile_ == TileType::F32 || !plain || W.data.empty() ||
      mem_.holds(W.data.data(), int64_t(W.data.size())))
    return resident(W);
  const QuantKind k16 = tile_ == TileType::BF16 ? QuantKind::BF16 : QuantKind::F16;
  const uint64_t fp = weight_fingerprint(W);
  auto it = weights_.find(&W);
  if (it != weights_.end()) {
    const ResidentWeight& r = it->second;
    if (r.host_data == W.data.data() && r.rows == W.rows && r.cols == W.cols &&
        r.fingerprint == fp && r.w.kind == k16)
      return r.w;
    weights_.erase(it);  // an fp32 copy, or one of other bytes
  }
  ResidentWeight rw;
  rw.host_data = W.data.data();
  rw.fingerprint = fp;
  rw.rows = W.rows;
  rw.cols = W.cols;
  rw.w = describe(W);
  rw.w.kind = k16;
  const int64_t n = W.numel();
  rw.data = DeviceMemory(tracker_, MemCategory::Weights, size_t(std::max<int64_t>(n, 1)) * 2,
                         "device weight (16-bit)");
  const DType t = tile_ == TileType::BF16 ? DType::BF16 : DType::F16;
  constexpr int64_t kSlab = int64_t(1) << 20;  // values per host conversion
  std::unique_ptr<uint16_t[]> slab(new uint16_t[size_t(std::min(n, kSlab))]);
  const float* src = W.data.as<float>();
  for (int64_t i = 0; i < n; i += kSlab) {
    const int64_t m = std::min(kSlab, n - i);
    f32_to_16_n(t, src + i, slab.get(), size_t(m));
    copy_up(static_cast<uint16_t*>(rw.data.data()) + i, slab.get(), m * 2);
  }
  rw.w.data = rw.data.data();
  rw.w.scales = nullptr;
  auto& slot = weights_[&W];
  slot = std::move(rw);
  return slot.w;
}

}  // namespace qlft::cu
