// Shared pieces of the model tests: tiny model configs, random token batches, and a run
// config for the trainer written as YAML (so tests exercise the same parser as the app).
// defines: iha::test::tiny_model, iha::test::random_batch, iha::test::local_factory,
//          iha::test::tiny_run_yaml, iha::test::run_config_from, iha::test::TrainRun,
//          iha::test::train
#pragma once

#include <string>
#include <vector>

#include "core/rng.h"
#include "model/run_config.h"
#include "model/trainer.h"
#include "model/transformer.h"
#include "reference/compare.h"

namespace iha::test {

// V = 11, D = 8, H = 2, d = 4, P = 2, two blocks "LG", F = 12, window Wv = 5 (odd, so not a
// multiple of P), rope base 100 (large angles).
inline ModelConfig tiny_model(GlobalKind global = GlobalKind::iha, int64_t P = 2) {
  ModelConfig m;
  m.vocab = 11;
  m.D = 8;
  m.H = 2;
  m.d = 4;
  m.P = P;
  m.layers = 2;
  m.ffn = 12;
  m.pattern = "LG";
  m.global_kind = global;
  m.rope_base = 100.0;
  m.init_std = 0.3;
  m.window.window_virtual = 5;
  m.resolve_window(16, std::nullopt);
  return m;
}

// B sequences of n tokens, every target set, every third one flagged as an answer.
inline TokenBatch random_batch(int64_t B, int64_t n, int64_t vocab, uint64_t seed) {
  TokenBatch b;
  b.B = B;
  b.n = n;
  Rng r{seed, 0};
  for (int64_t i = 0; i < B * n; ++i) {
    b.tokens.push_back(static_cast<int32_t>(r.next_below(vocab)));
    b.targets.push_back(static_cast<int32_t>(r.next_below(vocab)));
    b.answer.push_back(i % 3 == 0);
  }
  return b;
}

template <class T>
typename Transformer<T>::CoreFactory local_factory(int64_t N) {
  return [N](const LayerConfig& lc, int64_t) { return make_local_core<T>(lc, N, FlashTiles{3, 5}); };
}

// A small training run as YAML: tiny model, multikey data, float64 unless overridden.
// `extra` is appended verbatim (later keys of a section must not repeat earlier ones, so pass
// whole sections that are not in the base, or use --set style overrides via apply).
inline std::string tiny_run_yaml(int64_t sp, int64_t dp, const std::string& layout,
                                 const std::string& dtype, int64_t N, const std::string& loss_on) {
  return "mesh: {dp: " + std::to_string(dp) + ", hp: 1, sp: " + std::to_string(sp) + "}\n"
         "sequence: {length: " + std::to_string(N) + ", layout: " + layout + ", tile_q: 4, tile_k: 8}\n"
         "model: {vocab_size: 32, D: 16, H: 2, d: 8, P: 2, layers: 2, ffn: 24, pattern: LG,\n"
         "        rope_base: 100, init_std: 0.2, window: 3}\n"
         "train: {dtype: " + dtype + ", steps: 5, batch_size: 12, micro_batch: " +
         std::to_string(12 / (2 * dp) > 0 ? 12 / (2 * dp) : 1) + ", seed: 3}\n"
         "optim: {lr: 1.0e-2, warmup_steps: 2, weight_decay: 0.1, clip: 0.5}\n"
         "data: {kind: multikey, seed: 5, pairs: " + std::string(N >= 13 ? "4" : "2") +
         ", queries: " + std::string(N >= 13 ? "2" : "1") + ", key_tokens: 8, value_tokens: 8,\n"
         "       loss_on: " + loss_on + "}\n"
         "eval: {sequences: 6, batch: 2}\n";
}

// Parses YAML text (with optional "key=value" overrides) into a run config.
inline RunConfig run_config_from(const std::string& yaml, const std::vector<std::string>& overrides = {}) {
  ConfigNode root = ConfigNode::from_string(yaml, "test");
  for (const auto& o : overrides) root.apply_override(o);
  const std::string text = root.to_yaml();
  return parse_run_config(ConfigNode::from_string(text, "test"), text);
}

// Losses of `steps` training steps from a fresh init, and the parameters after them.
struct TrainRun {
  std::vector<double> losses, params;
};

template <class T>
TrainRun train(const RunConfig& cfg, std::shared_ptr<Communicator> comm, int steps = 5) {
  Trainer<T> t(cfg, comm);
  t.init();
  TrainRun r;
  for (int i = 0; i < steps; ++i) r.losses.push_back(t.train_step().loss);
  r.params = as_f64(t.whole_params());
  return r;
}

}  // namespace iha::test
