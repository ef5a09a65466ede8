// The shared host-and-device headers compiled by nvcc: evaluated on the host (always) and on
// the GPU (when present), for test_shared_hd.cpp to compare with the C++ compiler's results.
#include <cuda_runtime.h>

#include <algorithm>

#define IHA_HD_EVAL_NS nvcc_eval
#include "shared_hd_eval.h"

#include "core/cuda_device.h"

namespace iha::test {

namespace {

template <class In, class Out, class Fn>
void eval_all(const std::vector<In>& in, std::vector<Out>& out, Fn fn) {
  out.resize(in.size());
  for (size_t i = 0; i < in.size(); ++i) out[i] = fn(in[i]);
}

__global__ void eval_kernel(const MaskQuery* masks, int n_masks, const int64_t* row_pos,
                            int n_row_pos, MaskAnswer* mask_out,
                            const MergeCase* merges, int n_merges, MergeCase* merge_out,
                            const ChunkQuery* chunks, int n_chunks, int64_t* chunk_out,
                            int64_t* rank_chunk_out, const float* floats, int n_floats,
                            uint16_t* bits_out, float* back_out, const int64_t* rope_pos,
                            int n_rope, double* rope_out) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n_masks) mask_out[i] = nvcc_eval::eval_mask(masks[i], row_pos, n_row_pos);
  if (i < n_merges) merge_out[i] = nvcc_eval::eval_merge(merges[i]);
  if (i < n_chunks) {
    chunk_out[i] = nvcc_eval::eval_chunk(chunks[i]);
    rank_chunk_out[i] = nvcc_eval::eval_rank_chunk(chunks[i]);
  }
  if (i < n_floats) {
    bits_out[i] = nvcc_eval::eval_bf16_bits(floats[i]);
    back_out[i] = nvcc_eval::eval_bf16_back(floats[i]);
  }
  if (i < n_rope * 8) rope_out[i] = nvcc_eval::eval_rope(rope_pos[i / 8], i % 8);
}

// A device copy of a host vector (or a device buffer of n elements), freed on scope exit.
template <class T>
class DeviceVec {
 public:
  explicit DeviceVec(size_t n) : n_(n) {
    if (n_) IHA_CUDA_CHECK(cudaMalloc(&p_, n_ * sizeof(T)));
  }
  explicit DeviceVec(const std::vector<T>& h) : DeviceVec(h.size()) {
    if (n_) IHA_CUDA_CHECK(cudaMemcpy(p_, h.data(), n_ * sizeof(T), cudaMemcpyHostToDevice));
  }
  ~DeviceVec() {
    if (p_) cudaFree(p_);
  }
  DeviceVec(const DeviceVec&) = delete;
  DeviceVec& operator=(const DeviceVec&) = delete;
  T* get() const { return p_; }
  std::vector<T> to_host() const {
    std::vector<T> h(n_);
    if (n_) IHA_CUDA_CHECK(cudaMemcpy(h.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
  }

 private:
  T* p_ = nullptr;
  size_t n_;
};

}  // namespace

HdResults eval_hd_nvcc_host(const HdInputs& in) {
  HdResults r;
  for (const MaskQuery& q : in.masks)
    r.masks.push_back(nvcc_eval::eval_mask(q, in.row_pos.data(), static_cast<int64_t>(in.row_pos.size())));
  eval_all(in.merges, r.merges, nvcc_eval::eval_merge);
  eval_all(in.chunks, r.chunk_begins, nvcc_eval::eval_chunk);
  eval_all(in.chunks, r.rank_chunks, nvcc_eval::eval_rank_chunk);
  eval_all(in.floats, r.bf16_bits, nvcc_eval::eval_bf16_bits);
  eval_all(in.floats, r.bf16_back, nvcc_eval::eval_bf16_back);
  for (int64_t pos : in.rope_pos)
    for (int64_t i = 0; i < 8; ++i) r.rope_angles.push_back(nvcc_eval::eval_rope(pos, i));
  return r;
}

HdResults eval_hd_device(const HdInputs& in) {
  DeviceVec<MaskQuery> masks(in.masks);
  DeviceVec<int64_t> row_pos(in.row_pos);
  DeviceVec<MergeCase> merges(in.merges);
  DeviceVec<ChunkQuery> chunks(in.chunks);
  DeviceVec<float> floats(in.floats);
  DeviceVec<int64_t> rope_pos(in.rope_pos);
  DeviceVec<MaskAnswer> mask_out(in.masks.size());
  DeviceVec<MergeCase> merge_out(in.merges.size());
  DeviceVec<int64_t> chunk_out(in.chunks.size()), rank_chunk_out(in.chunks.size());
  DeviceVec<uint16_t> bits_out(in.floats.size());
  DeviceVec<float> back_out(in.floats.size());
  DeviceVec<double> rope_out(in.rope_pos.size() * 8);
  size_t n = std::max({in.masks.size(), in.merges.size(), in.chunks.size(), in.floats.size(),
                       in.rope_pos.size() * 8});
  const int threads = 128;
  eval_kernel<<<static_cast<unsigned>((n + threads - 1) / threads), threads>>>(
      masks.get(), static_cast<int>(in.masks.size()), row_pos.get(),
      static_cast<int>(in.row_pos.size()), mask_out.get(), merges.get(),
      static_cast<int>(in.merges.size()), merge_out.get(), chunks.get(),
      static_cast<int>(in.chunks.size()), chunk_out.get(), rank_chunk_out.get(), floats.get(),
      static_cast<int>(in.floats.size()), bits_out.get(), back_out.get(), rope_pos.get(),
      static_cast<int>(in.rope_pos.size()), rope_out.get());
  IHA_CUDA_LAUNCH_CHECK("eval_kernel");
  IHA_CUDA_CHECK(cudaDeviceSynchronize());
  HdResults r;
  r.masks = mask_out.to_host();
  r.merges = merge_out.to_host();
  r.chunk_begins = chunk_out.to_host();
  r.rank_chunks = rank_chunk_out.to_host();
  r.bf16_bits = bits_out.to_host();
  r.bf16_back = back_out.to_host();
  r.rope_angles = rope_out.to_host();
  return r;
}

}  // namespace iha::test
