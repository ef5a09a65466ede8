// Host staging of device buffers around a host-memory communicator.
#include "parallel/staged_comm.h"

#include <cuda_runtime_api.h>

#include <vector>

#include "core/cuda_device.h"
#include "core/error.h"

namespace iha {

namespace {

bool is_device_memory(const void* p) {
  if (p == nullptr) return false;
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    cudaGetLastError();  // a plain host pointer is an answer, not a sticky error
    return false;
  }
  return a.type == cudaMemoryTypeDevice;
}

// A buffer as the inner communicator sees it: the caller's pointer when it is host memory, else
// a host copy (filled from the device when `in`).
class Staged {
 public:
  Staged(const void* p, size_t bytes, bool in) : user_(const_cast<void*>(p)), bytes_(bytes) {
    device_ = bytes > 0 && is_device_memory(p);
    if (!device_) return;
    host_.resize(bytes);
    if (in) IHA_CUDA_CHECK(cudaMemcpy(host_.data(), p, bytes, cudaMemcpyDeviceToHost));
  }
  void* get() { return device_ ? host_.data() : user_; }
  // Copies the host result back to the device buffer.
  void finish() {
    if (device_) IHA_CUDA_CHECK(cudaMemcpy(user_, host_.data(), bytes_, cudaMemcpyHostToDevice));
  }

 private:
  void* user_;
  size_t bytes_;
  bool device_ = false;
  std::vector<char> host_;
};

class StagedPending final : public PendingExchange {
 public:
  StagedPending(std::unique_ptr<PendingExchange> inner, std::vector<Staged> sends, std::vector<Staged> recvs)
      : inner_(std::move(inner)), sends_(std::move(sends)), recvs_(std::move(recvs)) {}
  ~StagedPending() override {
    try {
      wait();
    } catch (...) {  // the owner is unwinding already; the inner exchange has completed
    }
  }
  void wait() override {
    if (done_) return;
    inner_->wait();
    finish();
  }
  bool test() override {
    if (done_) return true;
    if (!inner_->test()) return false;
    finish();
    return true;
  }

 private:
  void finish() {
    done_ = true;
    for (Staged& r : recvs_) r.finish();
  }
  std::unique_ptr<PendingExchange> inner_;
  std::vector<Staged> sends_, recvs_;
  bool done_ = false;
};

class StagedCommunicator final : public Communicator {
 public:
  explicit StagedCommunicator(std::shared_ptr<Communicator> inner) : inner_(std::move(inner)) {
    IHA_CHECK(inner_ != nullptr && inner_->device() == Device::cpu,
              "host staging needs a communicator of host memory");
    // One set of counters: the inner communicator's (aliasing constructor).
    counters_ = std::shared_ptr<CommCounters>(inner_, &inner_->counters());
  }
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  Device device() const override { return Device::cuda; }

  std::unique_ptr<PendingExchange> start_exchange(const std::vector<SendOp>& sends, const std::vector<RecvOp>& recvs,
                                                  const std::string& site) override {
    std::vector<Staged> s, r;
    s.reserve(sends.size());
    r.reserve(recvs.size());
    std::vector<SendOp> hs;
    std::vector<RecvOp> hr;
    for (const SendOp& op : sends) {
      s.emplace_back(op.buf, op.bytes, true);
      hs.push_back({s.back().get(), op.bytes, op.peer});
    }
    for (const RecvOp& op : recvs) {
      r.emplace_back(op.buf, op.bytes, false);
      hr.push_back({r.back().get(), op.bytes, op.peer});
    }
    auto inner = inner_->start_exchange(hs, hr, site);
    return std::make_unique<StagedPending>(std::move(inner), std::move(s), std::move(r));
  }

  void all_reduce(void* buf, int64_t count, DType dt, ReduceOp op, const std::string& site) override {
    Staged b(buf, bytes(count, dt), true);
    inner_->all_reduce(b.get(), count, dt, op, site);
    b.finish();
  }
  std::unique_ptr<PendingExchange> start_all_reduce(void* buf, int64_t count, DType dt, ReduceOp op,
                                                    const std::string& site) override {
    std::vector<Staged> r;
    r.emplace_back(buf, bytes(count, dt), true);
    auto inner = inner_->start_all_reduce(r.back().get(), count, dt, op, site);
    return std::make_unique<StagedPending>(std::move(inner), std::vector<Staged>{}, std::move(r));
  }
  void all_gather(const void* send, void* recv, int64_t count, DType dt, const std::string& site) override {
    Staged s(send, bytes(count, dt), true), r(recv, bytes(count, dt) * size(), false);
    inner_->all_gather(s.get(), r.get(), count, dt, site);
    r.finish();
  }
  void reduce_scatter(const void* send, void* recv, int64_t count, DType dt, const std::string& site) override {
    Staged s(send, bytes(count, dt) * size(), true), r(recv, bytes(count, dt), false);
    inner_->reduce_scatter(s.get(), r.get(), count, dt, site);
    r.finish();
  }
  std::unique_ptr<PendingExchange> start_all_gather(const void* send, void* recv, int64_t count, DType dt,
                                                    const std::string& site) override {
    std::vector<Staged> s, r;
    s.emplace_back(send, bytes(count, dt), true);
    r.emplace_back(recv, bytes(count, dt) * size(), false);
    auto inner = inner_->start_all_gather(s.back().get(), r.back().get(), count, dt, site);
    return std::make_unique<StagedPending>(std::move(inner), std::move(s), std::move(r));
  }
  std::unique_ptr<PendingExchange> start_reduce_scatter(const void* send, void* recv, int64_t count, DType dt,
                                                        const std::string& site) override {
    std::vector<Staged> s, r;
    s.emplace_back(send, bytes(count, dt) * size(), true);
    r.emplace_back(recv, bytes(count, dt), false);
    auto inner = inner_->start_reduce_scatter(s.back().get(), r.back().get(), count, dt, site);
    return std::make_unique<StagedPending>(std::move(inner), std::move(s), std::move(r));
  }
  void all_to_all(const void* send, void* recv, int64_t count, DType dt, const std::string& site) override {
    Staged s(send, bytes(count, dt) * size(), true), r(recv, bytes(count, dt) * size(), false);
    inner_->all_to_all(s.get(), r.get(), count, dt, site);
    r.finish();
  }
  void broadcast(void* buf, int64_t count, DType dt, int root, const std::string& site) override {
    Staged b(buf, bytes(count, dt), true);
    inner_->broadcast(b.get(), count, dt, root, site);
    b.finish();
  }
  void barrier() override { inner_->barrier(); }
  std::shared_ptr<Communicator> split(int color, int key) override {
    return std::make_shared<StagedCommunicator>(inner_->split(color, key));
  }

 private:
  static size_t bytes(int64_t count, DType dt) { return static_cast<size_t>(count) * dtype_size(dt); }
  std::shared_ptr<Communicator> inner_;
};

}  // namespace

std::shared_ptr<Communicator> make_host_staged_communicator(std::shared_ptr<Communicator> host) {
  return std::make_shared<StagedCommunicator>(std::move(host));
}

}  // namespace iha
