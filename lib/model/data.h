// Token data: sequences of N + 1 tokens (N inputs, each with the next token as its label),
// from an HDF5 token file or from a built-in synthetic task, and the loader that gives each
// rank only its shard of each sequence (the SequenceLayout map says which tokens) with the
// label after each of its chunks.
//
// A source is a pure function of the sequence index: sequence s is the same whichever rank,
// mesh or order asks for it, so a resumed or re-meshed run sees the same data. The position in
// the data is one integer (sequences consumed), kept by the trainer and checkpointed.
//
// HDF5 token files (docs/data.md): a 1-D integer dataset (default name "tokens"; any
// integer type, e.g. uint8 for bytes, uint16, int32) with an integer attribute `vocab_size` on
// the dataset; every id must be in [0, vocab_size). Sequence s is tokens[s*N, s*N + N + 1)
// (consecutive sequences share one token); there are floor((T - 1) / N) of them and the
// loader wraps around after the last.
//
// Packed documents (DESIGN.md section 10): an optional int64 dataset `doc_starts` beside the
// tokens (same group), strictly ascending, first element 0, every value < T. Sequences stay
// windows of the stream; the documents that meet a sequence's window are its segments (a
// document cut by a sequence boundary is a segment on each side), and the target of a
// segment's last token, the first token of the next document, is -1 (no loss across a
// boundary). A file without doc_starts is one document.
//
// Synthetic tasks (docs/training.md): multi-key retrieval (RULER-style multi-key needle in a
// haystack) and 2-hop relation composition. Token 0 is the query marker; other ids are split
// into key/value (or entity) alphabets and filler.
//
// Threads: a source is read by one thread at a time. HDF5 is not thread-safe here; the reader
// serialises its calls on one process-wide mutex.
// defines: iha::TokenBatch, iha::TokenSource, iha::MultiKeySpec, iha::TwoHopSpec,
//          iha::LossOn, iha::make_multikey_source, iha::make_twohop_source,
//          iha::make_orderedpair_source,
//          iha::make_needle_depth_source,
//          iha::open_token_file, iha::TokenFileWriter, iha::doc_starts_dataset, iha::DataLoader
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "parallel/layout.h"
#include "parallel/plan.h"

namespace iha {

// One micro-batch as one rank holds it: B sequences, n local tokens of each (rows in ascending
// global position, as the layout orders them). target -1: no loss on this row.
struct TokenBatch {
  int64_t B = 0, n = 0;
  std::vector<int32_t> tokens;   // [B * n]
  std::vector<int32_t> targets;  // [B * n]
  std::vector<uint8_t> answer;   // [B * n] 1 where the target is an answer token
  // Segment starts of each sequence of the batch as positions in [0, N) of the whole sequence
  // (not of this rank's rows): ascending, first 0. Empty: one segment per sequence.
  std::vector<std::vector<int64_t>> seg_starts;
  int64_t target_count() const;
};

class TokenSource {
 public:
  virtual ~TokenSource() = default;
  virtual int64_t vocab() const = 0;
  virtual int64_t seq_len() const = 0;  // N
  // Number of distinct sequences; -1 for an endless (synthetic) source.
  virtual int64_t num_sequences() const = 0;
  // For sequence s and the given chunks of its positions (ascending, disjoint, within [0, N)),
  // writes one row per position n: tokens = x[n], targets = x[n + 1] (or -1 where the source
  // trains on answers only), answer = 1 where x[n + 1] is an answer token.
  virtual void fill(int64_t s, const std::vector<TokenRange>& chunks, int32_t* tokens,
                    int32_t* targets, uint8_t* answer) const = 0;
  // Where sequence s's segments (documents packed into it) start, as positions in [0, N):
  // ascending, first element 0. A source without document boundaries has one segment.
  virtual std::vector<int64_t> segment_starts(int64_t s) const;
  virtual std::string describe() const = 0;
};

enum class LossOn : uint8_t { all, answer };

// Multi-key retrieval: `pairs` (key, value) pairs with distinct keys at random depths in
// filler, then `queries` blocks (QUERY, key, value), each asking a pair drawn uniformly (with
// replacement, so no answer follows by elimination); the value is the answer. Keys are uniform over `key_tokens` ids,
// values uniform over `value_tokens` ids.
struct MultiKeySpec {
  int64_t pairs = 4;
  int64_t queries = 1;
  int64_t key_tokens = 16;
  int64_t value_tokens = 16;
  LossOn loss_on = LossOn::answer;
  int64_t asked = 2;  // the orderedpair task only: distinct keys a query asks
  bool fused = false;  // the orderedpair task only: each pair is one token (below)
  bool question_token = false;  // the orderedpair task only: a query is one token (below)
};

// Ordered-tuple retrieval (docs/experiments.md section 4.4): `pairs` (key, value) pairs as in
// the multikey task, then `queries` blocks (QUERY, k1, ..., kA, answer) with k1..kA `asked`
// distinct keys of the context (drawn per query, with replacement across queries); the answer
// is one of value_tokens^A ids after the values, the ordered tuple (v(k1), ..., v(kA)) read
// as base-value_tokens digits, v(k1) first. With A = 2 (the default): value_tokens * v(k1) +
// v(k2), the ordered pair. One attention pattern averaging the retrieved values loses their
// order; one pattern per asked key keeps it. The spec is MultiKeySpec's (the same data.* keys,
// and data.asked). With `fused` (data.fused), each pair is one token, id fused_base + key *
// value_tokens + value after the answer ids, so a value is found by its own token's key part
// in one attention step, without the previous-token step a two-token pair needs. With
// `question_token` (data.question_token), a query block is (question, answer): one token,
// question_base + the asked keys' indices read as base-key_tokens digits (k1 first), after the
// fused ids (or the answers), so the answer is predicted at a token that names every asked key
// and one attention layer can retrieve them all.
// 2-hop composition: `chains` chains a -> b -> c over distinct entities, stated as 2-token
// facts (a b), (b c) in shuffled order at random depths in filler; a query (QUERY, a, c)
// asks for the entity two hops from a chain drawn uniformly (with replacement); c is the
// answer.
struct TwoHopSpec {
  int64_t chains = 4;
  int64_t queries = 1;
  int64_t entity_tokens = 32;
  LossOn loss_on = LossOn::answer;
};

// How the caller of a task source names its inputs in messages (core/error.h's FieldNames):
// the spec's fields, its query count, the vocabulary and the sequence length. The
// configuration module passes its keys (task_config_names, model/run_config.h); the default
// names the arguments of the call.
struct TaskNames {
  FieldNames spec{"field", "spec.", {}};
  std::string queries;  // empty: spec("queries")
  std::string vocab = "argument 'vocab'";
  std::string length = "argument 'N'";
};

// The sources: synthetic ones are a pure function of (seed, s). Throw ConfigError naming the
// input at fault as `names` names it when the task does not fit the vocabulary or the sequence
// length.
std::shared_ptr<TokenSource> make_multikey_source(const MultiKeySpec& spec, int64_t vocab, int64_t N,
                                                  uint64_t seed, const TaskNames& names = {});
std::shared_ptr<TokenSource> make_twohop_source(const TwoHopSpec& spec, int64_t vocab, int64_t N, uint64_t seed,
                                                const TaskNames& names = {});
std::shared_ptr<TokenSource> make_orderedpair_source(const MultiKeySpec& spec, int64_t vocab, int64_t N,
                                                     uint64_t seed, const TaskNames& names = {});
// Needle-depth probe of the multikey task (for length sweeps): sequences drawn as by
// make_multikey_source with one query, except that the query always asks pair `depth_bin`.
// The k = spec.pairs pairs sit in k equal segments of the haystack in order, so bin i holds
// the answer at depth [i/k, (i+1)/k) of the context; the mean over the k bins is the multikey
// accuracy with the asked pair drawn uniformly. ConfigError as make_multikey_source, and
// naming `depth_bin` when it is outside [0, pairs).
std::shared_ptr<TokenSource> make_needle_depth_source(const MultiKeySpec& spec, int64_t vocab, int64_t N,
                                                      uint64_t seed, int64_t depth_bin,
                                                      const TaskNames& names = {});
// The attribute of a token dataset that holds the checksum of its ids: a uint64, the
// checkpoint integrity sum (checkpoint/integrity.h, scheme iha-sum64-v1) of the ids as
// 64-bit values, element i hashed with index i. HDF5 reads storage that was allocated but
// never written (a chunk written in part, contiguous storage allocated early) as fill values
// without an error; only a sum stored by the writer tells them from data. A file without the
// attribute (written by other tools) is read as it is.
inline constexpr const char* kTokenChecksumAttribute = "iha_sum64_v1";

// Opens an HDF5 token file; errors name the file and dataset (missing, wrong dtype or rank,
// no vocab_size, vocab_size above the model's, too short for one sequence; doc_starts not
// int64, not 1-D, empty, first not 0, not strictly ascending, or out of range; ids that do not
// match the writer's checksum). The model's vocabulary is named `model_vocab_name`, as the
// caller names it (the configuration module: "config key 'model.vocab_size'"). Ids are
// checked against vocab_size when the file opens and as they are read. doc_starts is held in
// memory (8 bytes a document).
std::shared_ptr<TokenSource> open_token_file(const std::string& path, const std::string& dataset,
                                             int64_t N, int64_t model_vocab,
                                             const std::string& model_vocab_name = "model_vocab");
// Writes an HDF5 token file: a 1-D dataset of the narrowest unsigned type holding vocab - 1
// (uint8, uint16 or uint32), chunked and extendible, with the vocab_size attribute and, when
// not empty, `tokenizer` (and `tokenizer_model`) string attributes. Tokens are appended in
// blocks; close() (or the destructor) finishes the file. Ids outside [0, vocab) are an error
// naming the position. begin_document() starts a document at the next appended token; a
// document that gets no tokens is dropped, and tokens appended before the first
// begin_document() belong to a first document. A file with at least one begin_document()
// gets the doc_starts dataset, written by close(). close() also stores the tokens' checksum
// (kTokenChecksumAttribute below), which open_token_file verifies.
class TokenFileWriter {
 public:
  TokenFileWriter(const std::string& path, const std::string& dataset, int64_t vocab,
                  const std::string& tokenizer = "", const std::string& tokenizer_model = "");
  ~TokenFileWriter();
  TokenFileWriter(const TokenFileWriter&) = delete;
  TokenFileWriter& operator=(const TokenFileWriter&) = delete;
  void begin_document() { document_pending_ = true; }
  void append(const int64_t* tokens, int64_t count);
  void close();
  int64_t written() const { return written_; }
  int64_t documents() const { return static_cast<int64_t>(doc_starts_.size()); }

 private:
  std::string path_, dataset_;
  int64_t vocab_, written_ = 0;
  uint64_t checksum_ = 0;  // of the tokens appended so far (kTokenChecksumAttribute)
  int64_t file_ = -1, dset_ = -1;  // HDF5 ids (hid_t)
  bool document_pending_ = false, documented_ = false;
  std::vector<int64_t> doc_starts_;
};

// The path of the doc_starts dataset beside a token dataset ("tokens" -> "doc_starts",
// "a/ids" -> "a/doc_starts").
std::string doc_starts_dataset(const std::string& token_dataset);

// Gives one rank its shard of consecutive sequences.
class DataLoader {
 public:
  DataLoader(std::shared_ptr<TokenSource> source, const SequenceLayout& layout, int64_t sp_index);
  // The rows of any ascending list of tokens of [0, N), e.g. a head x sequence rank's
  // ReplicaLayout::tokens_of(s, t).
  DataLoader(std::shared_ptr<TokenSource> source, int64_t N, const std::vector<int64_t>& tokens);
  // This rank's rows of the plan's map (ParallelPlan::tokens).
  DataLoader(std::shared_ptr<TokenSource> source, const ParallelPlan& plan)
      : DataLoader(std::move(source), plan.seq_len(), plan.tokens()) {}
  // Sequences [first, first + count) of the source (wrapping around a finite source), with
  // every sequence's segment starts.
  TokenBatch batch(int64_t first, int64_t count) const;
  const TokenSource& source() const { return *source_; }
  const std::shared_ptr<TokenSource>& shared_source() const { return source_; }
  // The source's sequence that batch position i reads (a finite source wraps around).
  int64_t sequence(int64_t i) const;
  int64_t local_tokens() const { return n_local_; }

 private:
  std::shared_ptr<TokenSource> source_;
  std::vector<TokenRange> chunks_;
  int64_t n_local_ = 0;
};

}  // namespace iha
