// The library's side of the Hugging Face export test (tests/python/test_hf_export.py): what the
// library's own model (lib/model, the code iha-train runs) computes from a checkpoint, and
// whether two checkpoints hold the same weights. One process.
//
//   library_reference logits CHECKPOINT OUT.safetensors ID...
//       the logits of the model for one sequence of token ids, computed in float32 and in
//       float64 from the checkpoint's weights; OUT holds ids [N] (F32), logits_f32 [N, V] (F32)
//       and logits_f64 [N, V] (F64)
//   library_reference same-weights CHECKPOINT_A CHECKPOINT_B
//       exit 0 when both store float32 weights of the same architecture and every parameter
//       is bit-equal; else exit 1, naming the first difference
#include <cstdio>
#include <cstring>
#include <iostream>

#include "convert.h"
#include "model/train_checkpoint.h"
#include "parallel/comm.h"
#include "safetensors.h"

namespace iha {
namespace {

// A one-sequence run config of the checkpoint's architecture (the data section is never used).
RunConfig run_config(const CheckpointModel& ck, int64_t N, const char* dtype) {
  const std::string text = convert::model_yaml(ck.model) + "sequence:\n  length: " + std::to_string(N) +
                           "\ntrain:\n  dtype: " + dtype + "\n  steps: 1\n  batch_size: 1\n"
                           "data: {kind: multikey, pairs: 1, queries: 1, key_tokens: 1, value_tokens: 1}\n"
                           "eval: {sequences: 0}\n";
  return parse_run_config(ConfigNode::from_string(text, "library_reference"), text);
}

template <class T>
std::vector<T> logits(const std::string& ckpt, const std::vector<int32_t>& ids, std::shared_ptr<Communicator> world,
                      int64_t& V) {
  const CheckpointModel ck = inspect_train_checkpoint(*world, ckpt, "CHECKPOINT");
  const int64_t N = static_cast<int64_t>(ids.size());
  Trainer<T> trainer(run_config(ck, N, std::is_same_v<T, double> ? "float64" : "float32"), world,
                     ck.model.window_virtual);
  trainer.init();
  TrainCheckpoints<T>(trainer, 2).load(ckpt, StateParts::weights);
  TokenBatch batch;
  batch.B = 1;
  batch.n = N;
  for (int64_t t : trainer.tokens()) {  // one rank: every token, in the layout's order
    batch.tokens.push_back(ids[t]);
    batch.targets.push_back(-1);
    batch.answer.push_back(0);
  }
  const Tensor out = trainer.model().logits(batch);
  V = out.numel() / N;
  std::vector<T> rows(static_cast<size_t>(out.numel()));
  for (int64_t r = 0; r < N; ++r)  // back to sequence order
    std::memcpy(&rows[trainer.tokens()[r] * V], out.data<T>() + r * V, sizeof(T) * V);
  return rows;
}

int write_logits(const std::string& ckpt, const std::string& out, const std::vector<int32_t>& ids,
                 std::shared_ptr<Communicator> world) {
  int64_t V = 0;
  const std::vector<float> f32 = logits<float>(ckpt, ids, world, V);
  const std::vector<double> f64 = logits<double>(ckpt, ids, world, V);
  const int64_t N = static_cast<int64_t>(ids.size());
  convert::write_safetensors(out,
                             {{"ids", {N}, std::vector<float>(ids.begin(), ids.end())}, {"logits_f32", {N, V}, f32}},
                             {{"logits_f64", {N, V}, f64}});
  return 0;
}

int same_weights(const std::string& a, const std::string& b, std::shared_ptr<Communicator> world) {
  const CheckpointModel ca = inspect_train_checkpoint(*world, a, "CHECKPOINT_A");
  const CheckpointModel cb = inspect_train_checkpoint(*world, b, "CHECKPOINT_B");
  if (ca.dtype != DType::f32 || cb.dtype != DType::f32) {
    std::cerr << "same-weights: both checkpoints must store float32 weights\n";
    return 1;
  }
  if (convert::model_yaml(ca.model) != convert::model_yaml(cb.model)) {
    std::cerr << "same-weights: the architectures differ:\n" << convert::model_yaml(ca.model) << "vs\n"
              << convert::model_yaml(cb.model);
    return 1;
  }
  // float32 trainers: loading float32 weights copies them, so bytes compared are bytes stored.
  Trainer<float> ta(run_config(ca, ca.seq_len, "float32"), world, ca.model.window_virtual);
  Trainer<float> tb(run_config(cb, cb.seq_len, "float32"), world, cb.model.window_virtual);
  ta.init();
  tb.init();
  TrainCheckpoints<float>(ta, 2).load(a, StateParts::weights);
  TrainCheckpoints<float>(tb, 2).load(b, StateParts::weights);
  const ParamLayout& L = ta.model().params().layout();
  for (size_t i = 0; i < L.specs().size(); ++i) {
    const Tensor x = ta.model().params().view(i), y = tb.model().params().view(i);
    if (x.numel() != y.numel() || std::memcmp(x.data<float>(), y.data<float>(), sizeof(float) * x.numel()) != 0) {
      std::cerr << "same-weights: parameter " << L.specs()[i].name << " differs\n";
      return 1;
    }
  }
  std::printf("same-weights: %zu parameters bit-equal (float32)\n", L.specs().size());
  return 0;
}

int dispatch(int argc, char** argv, std::shared_ptr<Communicator> world) {
  const std::string cmd = argc >= 2 ? argv[1] : "";
  if (cmd == "logits" && argc >= 5) {
    std::vector<int32_t> ids;
    for (int i = 4; i < argc; ++i) ids.push_back(std::stoi(argv[i]));
    return write_logits(argv[2], argv[3], ids, world);
  }
  if (cmd == "same-weights" && argc == 4) return same_weights(argv[2], argv[3], world);
  std::cerr << "usage: library_reference logits CHECKPOINT OUT.safetensors ID...\n"
               "       library_reference same-weights CHECKPOINT_A CHECKPOINT_B\n";
  return 2;
}

}  // namespace
}  // namespace iha

int main(int argc, char** argv) {
  iha::MpiRuntime runtime(&argc, &argv);
  try {
    return iha::dispatch(argc, argv, runtime.world());
  } catch (const std::exception& e) {
    std::cerr << "library_reference: " << e.what() << "\n";
    return 1;
  }
}
