// Host staging of device buffers around a host-memory communicator (host_staging.h).
#include "parallel/host_staging.h"

#include <vector>

#include "core/error.h"

namespace iha {

namespace {

// A buffer as the inner communicator sees it: the caller's pointer when it is host memory, else
// a host copy (filled from the device when `in`).
class Staged {
 public:
  Staged(std::shared_ptr<const DeviceMemory> mem, const void* p, size_t bytes, bool in)
      : mem_(std::move(mem)), user_(const_cast<void*>(p)), bytes_(bytes) {
    device_ = bytes > 0 && p != nullptr && mem_->is_device(p);
    if (!device_) return;
    host_.resize(bytes);
    if (in) mem_->to_host(host_.data(), p, bytes);
  }
  void* get() { return device_ ? host_.data() : user_; }
  // Copies the host result back to the device buffer.
  void finish() {
    if (device_) mem_->to_device(user_, host_.data(), bytes_);
  }

 private:
  std::shared_ptr<const DeviceMemory> mem_;
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
  StagedCommunicator(std::shared_ptr<Communicator> inner, DeviceMemory memory)
      : inner_(std::move(inner)), mem_(std::make_shared<const DeviceMemory>(std::move(memory))) {
    IHA_CHECK(inner_ != nullptr && inner_->device() == Device::cpu, "host staging needs a communicator of host memory");
    // One set of counters: the inner communicator's (aliasing constructor).
    counters_ = std::shared_ptr<CommCounters>(inner_, &inner_->counters());
  }
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  Device device() const override { return mem_->device; }

  std::unique_ptr<PendingExchange> start_exchange(const std::vector<SendOp>& sends, const std::vector<RecvOp>& recvs,
                                                  const std::string& site) override {
    std::vector<Staged> s, r;
    s.reserve(sends.size());
    r.reserve(recvs.size());
    std::vector<SendOp> hs;
    std::vector<RecvOp> hr;
    for (const SendOp& op : sends) {
      s.emplace_back(mem_, op.buf, op.bytes, true);
      hs.push_back({s.back().get(), op.bytes, op.peer});
    }
    for (const RecvOp& op : recvs) {
      r.emplace_back(mem_, op.buf, op.bytes, false);
      hr.push_back({r.back().get(), op.bytes, op.peer});
    }
    auto inner = inner_->start_exchange(hs, hr, site);
    return std::make_unique<StagedPending>(std::move(inner), std::move(s), std::move(r));
  }

  void all_reduce(void* buf, int64_t count, DType dt, ReduceOp op, const std::string& site) override {
    Staged b = stage(buf, count, dt, 1, true);
    inner_->all_reduce(b.get(), count, dt, op, site);
    b.finish();
  }
  std::unique_ptr<PendingExchange> start_all_reduce(void* buf, int64_t count, DType dt, ReduceOp op,
                                                    const std::string& site) override {
    std::vector<Staged> r;
    r.push_back(stage(buf, count, dt, 1, true));
    auto inner = inner_->start_all_reduce(r.back().get(), count, dt, op, site);
    return std::make_unique<StagedPending>(std::move(inner), std::vector<Staged>{}, std::move(r));
  }
  void all_gather(const void* send, void* recv, int64_t count, DType dt, const std::string& site) override {
    Staged s = stage(send, count, dt, 1, true), r = stage(recv, count, dt, size(), false);
    inner_->all_gather(s.get(), r.get(), count, dt, site);
    r.finish();
  }
  void reduce_scatter(const void* send, void* recv, int64_t count, DType dt, const std::string& site) override {
    Staged s = stage(send, count, dt, size(), true), r = stage(recv, count, dt, 1, false);
    inner_->reduce_scatter(s.get(), r.get(), count, dt, site);
    r.finish();
  }
  std::unique_ptr<PendingExchange> start_all_gather(const void* send, void* recv, int64_t count, DType dt,
                                                    const std::string& site) override {
    std::vector<Staged> s, r;
    s.push_back(stage(send, count, dt, 1, true));
    r.push_back(stage(recv, count, dt, size(), false));
    auto inner = inner_->start_all_gather(s.back().get(), r.back().get(), count, dt, site);
    return std::make_unique<StagedPending>(std::move(inner), std::move(s), std::move(r));
  }
  std::unique_ptr<PendingExchange> start_reduce_scatter(const void* send, void* recv, int64_t count, DType dt,
                                                        const std::string& site) override {
    std::vector<Staged> s, r;
    s.push_back(stage(send, count, dt, size(), true));
    r.push_back(stage(recv, count, dt, 1, false));
    auto inner = inner_->start_reduce_scatter(s.back().get(), r.back().get(), count, dt, site);
    return std::make_unique<StagedPending>(std::move(inner), std::move(s), std::move(r));
  }
  void all_to_all(const void* send, void* recv, int64_t count, DType dt, const std::string& site) override {
    Staged s = stage(send, count, dt, size(), true), r = stage(recv, count, dt, size(), false);
    inner_->all_to_all(s.get(), r.get(), count, dt, site);
    r.finish();
  }
  void broadcast(void* buf, int64_t count, DType dt, int root, const std::string& site) override {
    Staged b = stage(buf, count, dt, 1, true);
    inner_->broadcast(b.get(), count, dt, root, site);
    b.finish();
  }
  void barrier() override { inner_->barrier(); }
  bool set_background_progress(bool on) override { return inner_->set_background_progress(on); }
  std::shared_ptr<Communicator> split(int color, int key) override {
    return std::make_shared<StagedCommunicator>(inner_->split(color, key), *mem_);
  }

 private:
  // `blocks` blocks of count elements; a negative count stages nothing (the inner call rejects it).
  Staged stage(const void* p, int64_t count, DType dt, int blocks, bool in) const {
    const size_t bytes = count > 0 ? static_cast<size_t>(count) * dtype_size(dt) * static_cast<size_t>(blocks) : 0;
    return Staged(mem_, p, bytes, in);
  }
  std::shared_ptr<Communicator> inner_;
  std::shared_ptr<const DeviceMemory> mem_;  // shared with the staged buffers of pending calls
};

}  // namespace

std::shared_ptr<Communicator> make_host_staged_communicator(std::shared_ptr<Communicator> host, DeviceMemory memory) {
  return std::make_shared<StagedCommunicator>(std::move(host), std::move(memory));
}

}  // namespace iha
