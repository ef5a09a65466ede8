#include "model/data.h"

#include <hdf5.h>
#include <sys/stat.h>

#include <algorithm>
#include <mutex>
#include <sstream>

#include "checkpoint/hdf5.h"
#include "checkpoint/integrity.h"
#include "core/error.h"
#include "core/files.h"
#include "core/rng.h"

namespace iha {

int64_t TokenBatch::target_count() const {
  int64_t c = 0;
  for (int32_t t : targets) c += t >= 0;
  return c;
}

std::vector<int64_t> TokenSource::segment_starts(int64_t) const { return {0}; }

std::string doc_starts_dataset(const std::string& token_dataset) {
  const size_t slash = token_dataset.rfind('/');
  return (slash == std::string::npos ? std::string() : token_dataset.substr(0, slash + 1)) + "doc_starts";
}

namespace {

// The tasks' id and token counts are sums and products of inputs up to INT64_MAX each: they
// are formed in 128 bits, where no sum or product of a few of them overflows, and compared
// there, so no message prints a wrapped (negative) count.
__extension__ typedef __int128 Wide;
std::string wide(Wide v) {
  if (v >= INT64_MIN && v <= INT64_MAX) return std::to_string(static_cast<int64_t>(v));
  const bool neg = v < 0;
  __extension__ unsigned __int128 u = neg ? -static_cast<unsigned __int128>(v) : static_cast<unsigned __int128>(v);
  std::string out;
  while (u > 0) {
    out.insert(out.begin(), static_cast<char>('0' + static_cast<int>(u % 10)));
    u /= 10;
  }
  return neg ? "-" + out : out;
}


constexpr int32_t kQueryToken = 0;

// ---- synthetic tasks ----

// The tokens a task places in a sequence (needles and queries), sorted by position; every
// other position holds filler. answer_positions are positions whose token is an answer.
struct Placement {
  std::vector<std::pair<int64_t, int32_t>> placed;
  std::vector<int64_t> answer_positions;
};

// k distinct values from [0, n) in random order (partial Fisher-Yates).
std::vector<int64_t> distinct_draw(Rng& rng, int64_t n, int64_t k) {
  std::vector<int64_t> all(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) all[i] = i;
  for (int64_t i = 0; i < k; ++i) std::swap(all[i], all[i + rng.next_below(n - i)]);
  all.resize(static_cast<size_t>(k));
  return all;
}

// A source whose sequences are filler plus a placement, both pure functions of (seed, s).
class SyntheticSource : public TokenSource {
 public:
  SyntheticSource(int64_t vocab, int64_t N, uint64_t seed, int64_t filler_base, LossOn loss_on)
      : vocab_(vocab), N_(N), seed_(seed), filler_base_(filler_base), loss_on_(loss_on) {}

  int64_t vocab() const override { return vocab_; }
  int64_t seq_len() const override { return N_; }
  int64_t num_sequences() const override { return -1; }

  void fill(int64_t s, const std::vector<TokenRange>& chunks, int32_t* tokens, int32_t* targets,
            uint8_t* answer) const override {
    const Placement pl = place(s);
    auto token_at = [&](int64_t p) -> int32_t {
      auto it = std::lower_bound(pl.placed.begin(), pl.placed.end(), std::make_pair(p, INT32_MIN));
      if (it != pl.placed.end() && it->first == p) return it->second;
      const uint64_t n_filler = static_cast<uint64_t>(vocab_ - filler_base_);
      const uint64_t h = hash3(seed_ ^ 0xf111e7ull, static_cast<uint64_t>(s), static_cast<uint64_t>(p));
      return static_cast<int32_t>(filler_base_ +
                                  static_cast<int64_t>((static_cast<unsigned __int128>(h) * n_filler) >> 64));
    };
    auto is_answer = [&](int64_t p) {
      return std::binary_search(pl.answer_positions.begin(), pl.answer_positions.end(), p);
    };
    int64_t row = 0;
    for (const TokenRange& c : chunks) {
      for (int64_t n = c.begin; n < c.end; ++n, ++row) {
        tokens[row] = token_at(n);
        const bool ans = is_answer(n + 1);
        answer[row] = ans;
        targets[row] = (ans || loss_on_ == LossOn::all) ? token_at(n + 1) : -1;
      }
    }
  }

 protected:
  virtual Placement place(int64_t s) const = 0;
  // Start of needle slot i of `slots` equal segments of [0, len), each slot `width` tokens.
  static int64_t slot_position(Rng& rng, int64_t len, int64_t slots, int64_t i, int64_t width) {
    const int64_t seg = len / slots;
    return i * seg + static_cast<int64_t>(rng.next_below(static_cast<uint64_t>(seg - width + 1)));
  }
  // The k = spec.pairs key-value pairs of the multikey family, placed in [0, haystack): k
  // distinct keys, values drawn with replacement, pair i at its slot (key, then value). Keys
  // are ids 1 + [0, key_tokens), values 1 + key_tokens + [0, value_tokens). Returns the
  // drawn key and value indices; the draws from rng are the same for every task of the family.
  // With fused_base >= 0, pair i is the one token fused_base + key * value_tokens + value.
  static std::pair<std::vector<int64_t>, std::vector<int64_t>> place_pairs(Rng& rng, const MultiKeySpec& spec,
                                                                           int64_t haystack, Placement& pl,
                                                                           int64_t fused_base = -1) {
    const int64_t k = spec.pairs, key_base = 1, value_base = 1 + spec.key_tokens;
    std::vector<int64_t> keys = distinct_draw(rng, spec.key_tokens, k);
    std::vector<int64_t> values(static_cast<size_t>(k));
    for (auto& v : values) v = static_cast<int64_t>(rng.next_below(spec.value_tokens));
    for (int64_t i = 0; i < k; ++i) {
      if (fused_base >= 0) {
        const int64_t p = slot_position(rng, haystack, k, i, 1);
        pl.placed.emplace_back(p, static_cast<int32_t>(fused_base + keys[i] * spec.value_tokens + values[i]));
        continue;
      }
      const int64_t p = slot_position(rng, haystack, k, i, 2);
      pl.placed.emplace_back(p, static_cast<int32_t>(key_base + keys[i]));
      pl.placed.emplace_back(p + 1, static_cast<int32_t>(value_base + values[i]));
    }
    return {std::move(keys), std::move(values)};
  }
  // "name(pairs=.., queries=.., key_tokens=.., value_tokens=.., N=.., seed=..)"
  std::string describe_pairs(const char* name, const MultiKeySpec& spec) const {
    std::ostringstream os;
    os << name << "(pairs=" << spec.pairs << ", queries=" << spec.queries << ", key_tokens=" << spec.key_tokens
       << ", value_tokens=" << spec.value_tokens << ", N=" << N_ << ", seed=" << seed_ << ")";
    return os.str();
  }

  static void finish(Placement& pl) {
    std::sort(pl.placed.begin(), pl.placed.end());
    std::sort(pl.answer_positions.begin(), pl.answer_positions.end());
  }

  int64_t vocab_, N_;
  uint64_t seed_;
  int64_t filler_base_;
  LossOn loss_on_;
};

class MultiKeySource final : public SyntheticSource {
 public:
  MultiKeySource(const MultiKeySpec& spec, int64_t vocab, int64_t N, uint64_t seed)
      : SyntheticSource(vocab, N, seed, 1 + spec.key_tokens + spec.value_tokens, spec.loss_on),
        spec_(spec) {}
  std::string describe() const override { return describe_pairs("multikey", spec_); }

 protected:
  Placement place(int64_t s) const override {
    Rng rng{hash3(seed_, 0x6d6b6579ull, static_cast<uint64_t>(s)), 0};
    const int64_t k = spec_.pairs, q = spec_.queries;
    const int64_t key_base = 1, value_base = 1 + spec_.key_tokens;
    const int64_t haystack = N_ + 1 - 3 * q;
    Placement pl;
    const auto [keys, values] = place_pairs(rng, spec_, haystack, pl);
    // Each query asks a pair drawn independently (with replacement): with distinct draws the
    // last answers could be found by elimination instead of retrieval.
    for (int64_t j = 0; j < q; ++j) {
      const int64_t p = haystack + 3 * j;
      const int64_t asked = static_cast<int64_t>(rng.next_below(k));
      pl.placed.emplace_back(p, kQueryToken);
      pl.placed.emplace_back(p + 1, static_cast<int32_t>(key_base + keys[asked]));
      pl.placed.emplace_back(p + 2, static_cast<int32_t>(value_base + values[asked]));
      pl.answer_positions.push_back(p + 2);
    }
    finish(pl);
    return pl;
  }

 private:
  MultiKeySpec spec_;
};

class OrderedPairSource final : public SyntheticSource {
 public:
  OrderedPairSource(const MultiKeySpec& spec, int64_t vocab, int64_t N, uint64_t seed)
      : SyntheticSource(vocab, N, seed, question_base(spec) + question_ids(spec), spec.loss_on), spec_(spec) {}
  std::string describe() const override {
    std::string d = describe_pairs("orderedpair", spec_);
    if (spec_.asked != 2) d.insert(d.size() - 1, ", asked=" + std::to_string(spec_.asked));
    if (spec_.fused) d.insert(d.size() - 1, ", fused");
    if (spec_.question_token) d.insert(d.size() - 1, ", question_token");
    return d;
  }
  // The ids after the query marker, keys and values: value_tokens^asked answers, then the fused
  // pairs' key_tokens * value_tokens (with fused), then the questions' key_tokens^asked (with
  // question_token); the caller checked that they fit the vocabulary.
  static int64_t power(int64_t base, int64_t exponent) {
    int64_t n = 1;
    for (int64_t i = 0; i < exponent; ++i) n *= base;
    return n;
  }
  static int64_t answer_base(const MultiKeySpec& spec) { return 1 + spec.key_tokens + spec.value_tokens; }
  static int64_t fused_base(const MultiKeySpec& spec) {
    return answer_base(spec) + power(spec.value_tokens, spec.asked);
  }
  static int64_t question_base(const MultiKeySpec& spec) {
    return fused_base(spec) + (spec.fused ? spec.key_tokens * spec.value_tokens : 0);
  }
  static int64_t question_ids(const MultiKeySpec& spec) {
    return spec.question_token ? power(spec.key_tokens, spec.asked) : 0;
  }

 protected:
  Placement place(int64_t s) const override {
    Rng rng{hash3(seed_, 0x6f70616972ull, static_cast<uint64_t>(s)), 0};
    const int64_t k = spec_.pairs, q = spec_.queries, nv = spec_.value_tokens;
    const int64_t key_base = 1, answers = answer_base(spec_);
    // A query block: QUERY, the a asked keys, the answer; or the question token, the answer.
    const int64_t a = spec_.asked, block = spec_.question_token ? 2 : a + 2;
    const int64_t haystack = N_ + 1 - block * q;
    Placement pl;
    const auto [keys, values] = place_pairs(rng, spec_, haystack, pl, spec_.fused ? fused_base(spec_) : -1);
    for (int64_t j = 0; j < q; ++j) {
      const int64_t p = haystack + block * j;
      const std::vector<int64_t> asked = distinct_draw(rng, k, a);  // ordered: first, second, ...
      int64_t answer = 0, question = 0;
      for (int64_t i = 0; i < a; ++i) {
        answer = answer * nv + values[asked[i]];
        question = question * spec_.key_tokens + keys[asked[i]];
      }
      if (spec_.question_token) {
        pl.placed.emplace_back(p, static_cast<int32_t>(question_base(spec_) + question));
      } else {
        pl.placed.emplace_back(p, kQueryToken);
        for (int64_t i = 0; i < a; ++i)
          pl.placed.emplace_back(p + 1 + i, static_cast<int32_t>(key_base + keys[asked[i]]));
      }
      pl.placed.emplace_back(p + block - 1, static_cast<int32_t>(answers + answer));
      pl.answer_positions.push_back(p + block - 1);
    }
    finish(pl);
    return pl;
  }

 private:
  MultiKeySpec spec_;
};

class TwoHopSource final : public SyntheticSource {
 public:
  TwoHopSource(const TwoHopSpec& spec, int64_t vocab, int64_t N, uint64_t seed)
      : SyntheticSource(vocab, N, seed, 1 + spec.entity_tokens, spec.loss_on), spec_(spec) {}
  std::string describe() const override {
    std::ostringstream os;
    os << "twohop(chains=" << spec_.chains << ", queries=" << spec_.queries
       << ", entity_tokens=" << spec_.entity_tokens << ", N=" << N_ << ", seed=" << seed_ << ")";
    return os.str();
  }

 protected:
  Placement place(int64_t s) const override {
    Rng rng{hash3(seed_, 0x32686f70ull, static_cast<uint64_t>(s)), 0};
    const int64_t c = spec_.chains, q = spec_.queries;
    // Chain i is a = ent[3i] -> b = ent[3i+1] -> c = ent[3i+2]; facts 2i (a b), 2i+1 (b c).
    const std::vector<int64_t> ent = distinct_draw(rng, spec_.entity_tokens, 3 * c);
    const std::vector<int64_t> fact_order = distinct_draw(rng, 2 * c, 2 * c);
    const int64_t haystack = N_ + 1 - 3 * q;
    Placement pl;
    for (int64_t slot = 0; slot < 2 * c; ++slot) {
      const int64_t f = fact_order[slot], chain = f / 2, hop = f % 2;
      const int64_t p = slot_position(rng, haystack, 2 * c, slot, 2);
      pl.placed.emplace_back(p, static_cast<int32_t>(1 + ent[3 * chain + hop]));
      pl.placed.emplace_back(p + 1, static_cast<int32_t>(1 + ent[3 * chain + hop + 1]));
    }
    for (int64_t j = 0; j < q; ++j) {
      const int64_t p = haystack + 3 * j;
      const int64_t asked = static_cast<int64_t>(rng.next_below(c));
      pl.placed.emplace_back(p, kQueryToken);
      pl.placed.emplace_back(p + 1, static_cast<int32_t>(1 + ent[3 * asked]));
      pl.placed.emplace_back(p + 2, static_cast<int32_t>(1 + ent[3 * asked + 2]));
      pl.answer_positions.push_back(p + 2);
    }
    finish(pl);
    return pl;
  }

 private:
  TwoHopSpec spec_;
};

// The multikey task with the query pinned to one pair: the needle sits at a known depth.
// Keys, values and slots are drawn as MultiKeySource draws them for one query.
class NeedleDepthSource final : public SyntheticSource {
 public:
  NeedleDepthSource(const MultiKeySpec& spec, int64_t vocab, int64_t N, uint64_t seed, int64_t bin)
      : SyntheticSource(vocab, N, seed, 1 + spec.key_tokens + spec.value_tokens, spec.loss_on),
        spec_(spec), bin_(bin) {}
  std::string describe() const override {
    std::ostringstream os;
    os << "needle_depth(pairs=" << spec_.pairs << ", bin=" << bin_ << ", key_tokens="
       << spec_.key_tokens << ", value_tokens=" << spec_.value_tokens << ", N=" << N_
       << ", seed=" << seed_ << ")";
    return os.str();
  }

 protected:
  Placement place(int64_t s) const override {
    Rng rng{hash3(seed_, 0x64657074ull, static_cast<uint64_t>(s)), 0};
    const int64_t k = spec_.pairs, key_base = 1, value_base = 1 + spec_.key_tokens;
    const std::vector<int64_t> keys = distinct_draw(rng, spec_.key_tokens, k);
    const int64_t haystack = N_ + 1 - 3;
    Placement pl;
    int64_t asked_value = 0;
    for (int64_t i = 0; i < k; ++i) {
      const int64_t value = static_cast<int64_t>(rng.next_below(spec_.value_tokens));
      if (i == bin_) asked_value = value;
      const int64_t p = slot_position(rng, haystack, k, i, 2);
      pl.placed.emplace_back(p, static_cast<int32_t>(key_base + keys[i]));
      pl.placed.emplace_back(p + 1, static_cast<int32_t>(value_base + value));
    }
    pl.placed.emplace_back(haystack, kQueryToken);
    pl.placed.emplace_back(haystack + 1, static_cast<int32_t>(key_base + keys[bin_]));
    pl.placed.emplace_back(haystack + 2, static_cast<int32_t>(value_base + asked_value));
    pl.answer_positions.push_back(haystack + 2);
    finish(pl);
    return pl;
  }

 private:
  MultiKeySpec spec_;
  int64_t bin_;
};

// ---- HDF5 ----

// Every HDF5 call here runs inside an Hdf5Session (checkpoint/hdf5.h): the process-wide HDF5
// lock (the library here is built without thread safety, and the checkpoint writer's
// background thread makes HDF5 calls too) with HDF5's own error printing off, since we report
// errors ourselves, naming the file and dataset.

const char* type_class_name(H5T_class_t c) {
  switch (c) {
    case H5T_INTEGER: return "integer";
    case H5T_FLOAT: return "floating-point";
    case H5T_STRING: return "string";
    case H5T_COMPOUND: return "compound";
    case H5T_ENUM: return "enum";
    case H5T_ARRAY: return "array";
    default: return "non-numeric";
  }
}

// "int64", "uint16", "float32", "string"...: what a dataset holds, for error messages.
std::string element_type_name(hid_t type) {
  const H5T_class_t cls = H5Tget_class(type);
  const size_t bits = 8 * H5Tget_size(type);
  if (cls == H5T_INTEGER) return (H5Tget_sign(type) == H5T_SGN_NONE ? "uint" : "int") + std::to_string(bits);
  if (cls == H5T_FLOAT) return "float" + std::to_string(bits);
  return type_class_name(cls);
}

class Hdf5TokenSource final : public TokenSource {
 public:
  Hdf5TokenSource(const std::string& path, const std::string& dataset, int64_t N, int64_t model_vocab,
                  const std::string& model_vocab_name)
      : path_(path), dataset_(dataset), N_(N) {
    Hdf5Session session;
    const std::string where = "token file '" + path + "'";
    IHA_CONFIG_CHECK(N >= 1, where, ": sequence length must be >= 1, got ", N);
    // Before HDF5 opens it: a FIFO would block the open, a directory gives HDF5's own words.
    // HDF5 opens the file checked (core/files.h), not whatever the path names by then.
    const InputFile checked(path, "token file");
    const std::string name = checked.reopen_path();
    if (H5Fis_hdf5(name.c_str()) <= 0)
      throw ConfigError(where + ": not an HDF5 file (or a truncated or corrupted one)");
    opened_ = identity();
    file_ = Hdf5Handle(H5Fopen(name.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT));
    IHA_CONFIG_CHECK(file_.ok(), where, ": HDF5 cannot open it (truncated or corrupted?)");
    const std::string ds = where + ", dataset '" + dataset + "'";
    const htri_t exists = H5Lexists(file_, dataset.c_str(), H5P_DEFAULT);
    if (exists <= 0) {
      close_all();
      throw ConfigError(ds + ": no such dataset");
    }
    dset_ = Hdf5Handle(H5Dopen2(file_, dataset.c_str(), H5P_DEFAULT));
    if (!dset_.ok()) {
      close_all();
      throw ConfigError(ds + ": cannot open the dataset (not a dataset, or the file is damaged)");
    }
    try {
      const std::string storage = hdf5_storage_problem(file_, dataset, dset_);
      IHA_CONFIG_CHECK(storage.empty(), ds, ": ", storage);
      {
        Hdf5Handle type(H5Dget_type(dset_));
        const H5T_class_t cls = H5Tget_class(type.get());
        IHA_CONFIG_CHECK(cls == H5T_INTEGER, ds, ": has ", type_class_name(cls),
                         " elements; token ids must be an integer type (e.g. uint8, uint16, int32)");
      }
      Hdf5Handle space(H5Dget_space(dset_));
      const int rank = H5Sget_simple_extent_ndims(space.get());
      IHA_CONFIG_CHECK(rank == 1, ds, ": must be 1-D, has ", rank, " dimensions");
      hsize_t dims[1] = {0};
      H5Sget_simple_extent_dims(space.get(), dims, nullptr);
      total_ = static_cast<int64_t>(dims[0]);
      IHA_CONFIG_CHECK(total_ > 0, ds, ": is empty");
      IHA_CONFIG_CHECK(H5Aexists(dset_, "vocab_size") > 0, ds,
                       ": has no 'vocab_size' attribute (the number of token ids)");
      Hdf5Handle attr(H5Aopen(dset_, "vocab_size", H5P_DEFAULT));
      Hdf5Handle atype(H5Aget_type(attr.get()));
      IHA_CONFIG_CHECK(H5Tget_class(atype.get()) == H5T_INTEGER, ds,
                       ": attribute 'vocab_size' must be an integer");
      int64_t v = 0;
      IHA_CONFIG_CHECK(H5Aread(attr.get(), H5T_NATIVE_INT64, &v) >= 0, ds,
                       ": cannot read attribute 'vocab_size'");
      vocab_ = v;
      IHA_CONFIG_CHECK(vocab_ >= 1, ds, ": vocab_size must be >= 1, got ", vocab_);
      IHA_CONFIG_CHECK(vocab_ <= model_vocab, ds, ": vocab_size ", vocab_,
                       " exceeds the model's (", model_vocab_name, " = ", model_vocab, ")");
      // total_ > N, not total_ >= N + 1: N may be INT64_MAX (iha-data info --seq-len).
      IHA_CONFIG_CHECK(total_ > N, ds, ": holds ", total_, " tokens, fewer than one sequence of ",
                       N, " tokens plus its label needs (", wide(Wide(N) + 1), ")");
      read_doc_starts(where);
      check_token_ids();
    } catch (...) {
      close_all();
      throw;
    }
  }
  ~Hdf5TokenSource() override {
    Hdf5Session session;
    close_all();
  }

  int64_t vocab() const override { return vocab_; }
  int64_t seq_len() const override { return N_; }
  int64_t num_sequences() const override { return (total_ - 1) / N_; }
  std::string describe() const override {
    return "hdf5 '" + path_ + "' dataset '" + dataset_ + "' (" + std::to_string(total_) +
           " tokens, vocab_size " + std::to_string(vocab_) + ", " +
           (doc_starts_.empty() ? std::string("no doc_starts")
                                : std::to_string(doc_starts_.size()) + " documents") +
           ", " + std::to_string(num_sequences()) + " sequences of " + std::to_string(N_) + ")";
  }

  std::vector<int64_t> segment_starts(int64_t s) const override {
    const int64_t base = s * N_;
    std::vector<int64_t> out = {0};
    for (auto it = std::upper_bound(doc_starts_.begin(), doc_starts_.end(), base);
         it != doc_starts_.end() && *it < base + N_; ++it)
      out.push_back(*it - base);
    return out;
  }

  void fill(int64_t s, const std::vector<TokenRange>& chunks, int32_t* tokens, int32_t* targets,
            uint8_t* answer) const override {
    int64_t row = 0;
    std::vector<int64_t> buf;
    for (const TokenRange& c : chunks) {
      if (c.empty()) continue;
      const int64_t first = s * N_ + c.begin, count = c.size() + 1;
      buf.resize(static_cast<size_t>(count));
      read(first, count, buf.data());
      for (int64_t i = 0; i < count; ++i) {
        IHA_CONFIG_CHECK(buf[i] >= 0 && buf[i] < vocab_, "token file '", path_, "', dataset '",
                         dataset_, "': token ", first + i, " has id ", buf[i],
                         ", outside [0, vocab_size = ", vocab_, ")");
      }
      // A label that is the first token of a document is not predicted from the previous one.
      auto next_doc = std::upper_bound(doc_starts_.begin(), doc_starts_.end(), first);
      for (int64_t i = 0; i < c.size(); ++i, ++row) {
        const bool boundary = next_doc != doc_starts_.end() && *next_doc == first + i + 1;
        if (boundary) ++next_doc;
        tokens[row] = static_cast<int32_t>(buf[i]);
        targets[row] = boundary ? -1 : static_cast<int32_t>(buf[i + 1]);
        answer[row] = 0;
      }
    }
  }

 private:
  void read(int64_t first, int64_t count, int64_t* out) const {
    Hdf5Session session;
    Hdf5Handle fspace(H5Dget_space(dset_));
    const hsize_t start[1] = {static_cast<hsize_t>(first)}, cnt[1] = {static_cast<hsize_t>(count)};
    H5Sselect_hyperslab(fspace.get(), H5S_SELECT_SET, start, nullptr, cnt, nullptr);
    Hdf5Handle mspace(H5Screate_simple(1, cnt, nullptr));
    check_unchanged();
    const herr_t rc = H5Dread(dset_, H5T_NATIVE_INT64, mspace.get(), fspace.get(), H5P_DEFAULT, out);
    IHA_CONFIG_CHECK(rc >= 0, "token file '", path_, "', dataset '", dataset_,
                     "': reading tokens [", first, ", ", first + count,
                     ") failed (truncated or corrupted file?)");
    // After the read too: HDF5 reads the part of a dataset beyond a truncated file's end as
    // zeros, so tokens read while the file changed are not trusted either.
    check_unchanged();
  }

  // What identifies the file's content as opened: replaced (another inode), truncated,
  // extended or rewritten in place (size or modification time).
  struct Identity {
    dev_t dev = 0;
    ino_t ino = 0;
    off_t size = 0;
    int64_t mtime_ns = 0;
    bool operator==(const Identity& o) const {
      return dev == o.dev && ino == o.ino && size == o.size && mtime_ns == o.mtime_ns;
    }
  };
  Identity identity() const {
    struct stat st;
    IHA_CONFIG_CHECK(::stat(path_.c_str(), &st) == 0, "token file '", path_, "', dataset '",
                     dataset_, "': the file is gone (removed or renamed during the run)");
    return {st.st_dev, st.st_ino, st.st_size,
            static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec};
  }
  void check_unchanged() const {
    const Identity now = identity();
    if (now == opened_) return;
    throw ConfigError("token file '" + path_ + "', dataset '" + dataset_ +
                      "': the file changed during the run (" +
                      (now.ino != opened_.ino || now.dev != opened_.dev
                           ? std::string("replaced by another file")
                           : now.size != opened_.size ? "size " + std::to_string(opened_.size) +
                                                            " -> " + std::to_string(now.size) + " bytes"
                                                      : std::string("rewritten in place")) +
                      "); tokens read from it can no longer be trusted");
  }
  // The doc_starts dataset beside the tokens, if any, whole and checked (DESIGN.md section 10:
  // int64, first 0, strictly ascending, below the token count).
  void read_doc_starts(const std::string& where) {
    const std::string name = doc_starts_dataset(dataset_);
    if (H5Lexists(file_, name.c_str(), H5P_DEFAULT) <= 0) return;
    const std::string ds = where + ", dataset '" + name + "'";
    Hdf5Handle d(H5Dopen2(file_, name.c_str(), H5P_DEFAULT));
    IHA_CONFIG_CHECK(d.get() >= 0, ds, ": cannot open the dataset (not a dataset, or the file is damaged)");
    const std::string storage = hdf5_storage_problem(file_, name, d.get());
    IHA_CONFIG_CHECK(storage.empty(), ds, ": ", storage);
    {
      Hdf5Handle type(H5Dget_type(d.get()));
      IHA_CONFIG_CHECK(H5Tget_class(type.get()) == H5T_INTEGER && H5Tget_size(type.get()) == 8 &&
                           H5Tget_sign(type.get()) != H5T_SGN_NONE,
                       ds, ": has ", element_type_name(type.get()), " elements; document starts must be int64");
    }
    Hdf5Handle space(H5Dget_space(d.get()));
    const int rank = H5Sget_simple_extent_ndims(space.get());
    IHA_CONFIG_CHECK(rank == 1, ds, ": must be 1-D, has ", rank, " dimensions");
    hsize_t dims[1] = {0};
    H5Sget_simple_extent_dims(space.get(), dims, nullptr);
    IHA_CONFIG_CHECK(dims[0] > 0, ds, ": is empty (a file of one document has doc_starts = [0])");
    // Strictly ascending starts below the token count: more of them than tokens is damage,
    // refused before a declared size is allocated.
    IHA_CONFIG_CHECK(dims[0] <= static_cast<hsize_t>(total_), ds, ": declares ", dims[0],
                     " document starts for ", total_, " tokens of dataset '", dataset_,
                     "' (at most one per token)");
    try {
      doc_starts_.resize(static_cast<size_t>(dims[0]));
    } catch (const std::bad_alloc&) {
      throw ConfigError(ds + ": " + std::to_string(dims[0]) + " document starts do not fit in memory");
    }
    IHA_CONFIG_CHECK(H5Dread(d.get(), H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, doc_starts_.data()) >= 0,
                     ds, ": reading it failed (truncated or corrupted file?)");
    IHA_CONFIG_CHECK(doc_starts_[0] == 0, ds, ": the first document starts at ", doc_starts_[0],
                     "; it must start at 0");
    for (size_t i = 1; i < doc_starts_.size(); ++i)
      IHA_CONFIG_CHECK(doc_starts_[i] > doc_starts_[i - 1], ds, ": not strictly ascending: element ", i,
                       " is ", doc_starts_[i], " after ", doc_starts_[i - 1],
                       " (empty documents are dropped when the file is written)");
    IHA_CONFIG_CHECK(doc_starts_.back() < total_, ds, ": element ", doc_starts_.size() - 1, " is ",
                     doc_starts_.back(), ", outside the ", total_, " tokens of dataset '", dataset_, "'");
  }
  // Every id, at open: a bad id is found before the first step, wherever the run would read it.
  void check_token_ids() const {
    constexpr int64_t kBlock = int64_t(1) << 20;
    uint64_t sum = 0;
    std::vector<int64_t> buf(static_cast<size_t>(std::min(total_, kBlock)));
    Hdf5Handle fspace(H5Dget_space(dset_));
    for (int64_t first = 0; first < total_; first += kBlock) {
      const int64_t count = std::min(kBlock, total_ - first);
      const hsize_t start[1] = {static_cast<hsize_t>(first)}, cnt[1] = {static_cast<hsize_t>(count)};
      H5Sselect_hyperslab(fspace.get(), H5S_SELECT_SET, start, nullptr, cnt, nullptr);
      Hdf5Handle mspace(H5Screate_simple(1, cnt, nullptr));
      IHA_CONFIG_CHECK(H5Dread(dset_, H5T_NATIVE_INT64, mspace.get(), fspace.get(), H5P_DEFAULT, buf.data()) >= 0,
                       "token file '", path_, "', dataset '", dataset_, "': reading tokens [", first, ", ",
                       first + count, ") failed (truncated or corrupted file?)");
      for (int64_t i = 0; i < count; ++i) {
        IHA_CONFIG_CHECK(buf[i] >= 0 && buf[i] < vocab_, "token file '", path_, "', dataset '", dataset_,
                         "': token ", first + i, " has id ", buf[i], ", outside [0, vocab_size = ",
                         vocab_, ")");
        sum += ckpt::element_hash(static_cast<uint64_t>(first + i), static_cast<uint64_t>(buf[i]));
      }
    }
    check_checksum(sum);
  }
  // The writer's checksum, where the file has one (kTokenChecksumAttribute).
  void check_checksum(uint64_t sum) const {
    const std::string ds = "token file '" + path_ + "', dataset '" + dataset_ + "'";
    const char* name = kTokenChecksumAttribute;
    if (H5Aexists(dset_, name) <= 0) return;
    Hdf5Handle attr(H5Aopen(dset_, name, H5P_DEFAULT));
    Hdf5Handle atype(H5Aget_type(attr.get()));
    Hdf5Handle aspace(H5Aget_space(attr.get()));
    IHA_CONFIG_CHECK(attr.ok() && H5Tget_class(atype.get()) == H5T_INTEGER && H5Tget_size(atype.get()) == 8 &&
                         H5Sget_simple_extent_npoints(aspace.get()) == 1,
                     ds, ": attribute '", name, "' (the ids' checksum) must be one 64-bit integer");
    uint64_t stored = 0;
    IHA_CONFIG_CHECK(H5Aread(attr.get(), H5T_NATIVE_UINT64, &stored) >= 0, ds, ": cannot read attribute '", name, "'");
    IHA_CONFIG_CHECK(stored == sum, ds, ": its ids do not match the checksum its writer stored (attribute '", name,
                     "'): part of the dataset was never written (e.g. a chunk written in part, which HDF5 reads "
                     "as fill values) or it changed after writing");
  }
  // Call inside an Hdf5Session (the handles close through the one HDF5 module).
  void close_all() {
    dset_.close();
    file_.close();
  }

  std::string path_, dataset_;
  int64_t N_ = 0, total_ = 0, vocab_ = 0;
  Hdf5Handle file_, dset_;
  Identity opened_;
  std::vector<int64_t> doc_starts_;  // empty: the file is one document
};

// A query takes 2 or more tokens: more queries than tokens never fit (named before the
// task's token count, whose message would blame the sequence length).
void check_queries(int64_t queries, const TaskNames& n, int64_t N) {
  const std::string key = n.queries.empty() ? n.spec("queries") : n.queries;
  IHA_CONFIG_CHECK(queries >= 1, key, ": must be >= 1, got ", queries);
  IHA_CONFIG_CHECK(queries <= N, key, ": ", queries, " queries do not fit in sequences of ", N, " tokens (",
                   n.length, ")");
}

}  // namespace

std::shared_ptr<TokenSource> make_multikey_source(const MultiKeySpec& spec, int64_t vocab, int64_t N,
                                                  uint64_t seed, const TaskNames& n) {
  const std::string& p = n.spec.prefix;
  IHA_CONFIG_CHECK(spec.pairs >= 1, n.spec("pairs"), ": must be >= 1, got ", spec.pairs);
  IHA_CONFIG_CHECK(spec.value_tokens >= 1, n.spec("value_tokens"), ": must be >= 1, got ", spec.value_tokens);
  IHA_CONFIG_CHECK(spec.key_tokens >= spec.pairs, n.spec("key_tokens"), ": ", spec.pairs,
                   " distinct keys need at least as many key tokens, got ", spec.key_tokens);
  check_queries(spec.queries, n, N);
  const Wide used = Wide(1) + spec.key_tokens + spec.value_tokens;
  IHA_CONFIG_CHECK(used < vocab, n.vocab, ": the multikey task needs ", wide(used), " ids (query marker, ", p,
                   "key_tokens, ", p, "value_tokens) plus at least one filler id, got ", vocab);
  const Wide need = Wide(2) * spec.pairs + Wide(3) * spec.queries - 1;
  IHA_CONFIG_CHECK(need <= N, n.length, ": ", spec.pairs, " pairs and ", spec.queries, " queries need at least ",
                   wide(need), " tokens, got ", N);
  return std::make_shared<MultiKeySource>(spec, vocab, N, seed);
}

std::shared_ptr<TokenSource> make_orderedpair_source(const MultiKeySpec& spec, int64_t vocab, int64_t N,
                                                     uint64_t seed, const TaskNames& n) {
  const std::string& p = n.spec.prefix;
  IHA_CONFIG_CHECK(spec.asked >= 1, n.spec("asked"), ": a query asks >= 1 key, got ", spec.asked);
  IHA_CONFIG_CHECK(spec.pairs >= spec.asked, n.spec("pairs"), ": the orderedpair task asks ", spec.asked,
                   " distinct keys, so it needs >= ", spec.asked, " pairs, got ", spec.pairs);
  IHA_CONFIG_CHECK(spec.value_tokens >= 1, n.spec("value_tokens"), ": must be >= 1, got ", spec.value_tokens);
  IHA_CONFIG_CHECK(spec.key_tokens >= spec.pairs, n.spec("key_tokens"), ": ", spec.pairs,
                   " distinct keys need at least as many key tokens, got ", spec.key_tokens);
  check_queries(spec.queries, n, N);
  // value_tokens^asked answer ids, counted without overflow: stop once past the vocabulary.
  int64_t answers = 1;
  for (int64_t i = 0; i < spec.asked && answers < vocab; ++i)
    answers = answers > vocab / spec.value_tokens ? vocab : answers * spec.value_tokens;
  // The fused pairs' and the questions' ids, likewise counted only up to the vocabulary.
  const int64_t fused =
      !spec.fused ? 0 : spec.key_tokens > vocab / spec.value_tokens ? vocab : spec.key_tokens * spec.value_tokens;
  int64_t questions = spec.question_token ? 1 : 0;
  for (int64_t i = 0; spec.question_token && i < spec.asked && questions < vocab; ++i)
    questions = questions > vocab / spec.key_tokens ? vocab : questions * spec.key_tokens;
  const Wide used = Wide(1) + spec.key_tokens + spec.value_tokens + answers + fused + questions;
  IHA_CONFIG_CHECK(used < vocab, n.vocab, ": the orderedpair task needs ",
                   answers >= vocab || questions >= vocab ? "more than " : "", wide(used), " ids (query marker, ", p,
                   "key_tokens, ", p, "value_tokens, ", p, "value_tokens^", p, "asked answer ids",
                   spec.fused ? ", the fused pairs' key_tokens * value_tokens" : "",
                   spec.question_token ? ", the questions' key_tokens^asked" : "",
                   ") plus at least one filler id, got ", vocab);
  const Wide block = spec.question_token ? Wide(2) : Wide(spec.asked) + 2, width = spec.fused ? 1 : 2;
  const Wide need = width * spec.pairs + block * spec.queries - 1;
  IHA_CONFIG_CHECK(need <= N, n.length, ": ", spec.pairs, " pairs and ", spec.queries, " queries need at least ",
                   wide(need), " tokens, got ", N);
  return std::make_shared<OrderedPairSource>(spec, vocab, N, seed);
}

std::shared_ptr<TokenSource> make_twohop_source(const TwoHopSpec& spec, int64_t vocab, int64_t N, uint64_t seed,
                                                const TaskNames& n) {
  IHA_CONFIG_CHECK(spec.chains >= 1, n.spec("chains"), ": must be >= 1, got ", spec.chains);
  IHA_CONFIG_CHECK(spec.entity_tokens >= Wide(3) * spec.chains, n.spec("entity_tokens"), ": ", spec.chains,
                   " chains need ", wide(Wide(3) * spec.chains), " distinct entities, got ", spec.entity_tokens);
  check_queries(spec.queries, n, N);
  const Wide used = Wide(1) + spec.entity_tokens;
  IHA_CONFIG_CHECK(used < vocab, n.vocab, ": the twohop task needs ", wide(used), " ids (query marker, ",
                   n.spec.prefix, "entity_tokens) plus at least one filler id, got ", vocab);
  const Wide need = Wide(4) * spec.chains + Wide(3) * spec.queries - 1;
  IHA_CONFIG_CHECK(need <= N, n.length, ": ", spec.chains, " chains and ", spec.queries, " queries need at least ",
                   wide(need), " tokens, got ", N);
  return std::make_shared<TwoHopSource>(spec, vocab, N, seed);
}

std::shared_ptr<TokenSource> make_needle_depth_source(const MultiKeySpec& spec, int64_t vocab, int64_t N,
                                                      uint64_t seed, int64_t depth_bin, const TaskNames& n) {
  MultiKeySpec one = spec;
  one.queries = 1;
  make_multikey_source(one, vocab, N, seed, n);  // the same checks, naming the same inputs
  IHA_CONFIG_CHECK(depth_bin >= 0 && depth_bin < spec.pairs, "needle depth bin ", depth_bin,
                   " outside [0, ", n.spec.prefix, "pairs = ", spec.pairs, ")");
  return std::make_shared<NeedleDepthSource>(one, vocab, N, seed, depth_bin);
}

std::shared_ptr<TokenSource> open_token_file(const std::string& path, const std::string& dataset,
                                             int64_t N, int64_t model_vocab, const std::string& model_vocab_name) {
  return std::make_shared<Hdf5TokenSource>(path, dataset, N, model_vocab, model_vocab_name);
}

// ---- writer ----

namespace {
void write_string_attribute(hid_t obj, const char* name, const std::string& value) {
  Hdf5Handle aspace(H5Screate(H5S_SCALAR));
  Hdf5Handle stype(H5Tcopy(H5T_C_S1));
  H5Tset_size(stype.get(), std::max<size_t>(1, value.size()));
  Hdf5Handle attr(H5Acreate2(obj, name, stype.get(), aspace.get(), H5P_DEFAULT, H5P_DEFAULT));
  H5Awrite(attr.get(), stype.get(), value.data());
}
}  // namespace

TokenFileWriter::TokenFileWriter(const std::string& path, const std::string& dataset,
                                 int64_t vocab, const std::string& tokenizer,
                                 const std::string& tokenizer_model)
    : path_(path), dataset_(dataset), vocab_(vocab) {
  IHA_CONFIG_CHECK(vocab >= 1 && vocab <= (int64_t(1) << 32), "token file '", path,
                   "': vocab_size must be in [1, 2^32], got ", vocab);
  Hdf5Session session;
  // Held by handles until the file is complete: a failure below closes what was opened.
  Hdf5Handle file(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT));
  IHA_CONFIG_CHECK(file.ok(), "token file '", path, "': cannot create it");
  const hid_t ftype = vocab <= 256 ? H5T_STD_U8LE : vocab <= 65536 ? H5T_STD_U16LE : H5T_STD_U32LE;
  const hsize_t dims[1] = {0}, maxdims[1] = {H5S_UNLIMITED}, chunk[1] = {1 << 20};
  Hdf5Handle space(H5Screate_simple(1, dims, maxdims));
  Hdf5Handle dcpl(H5Pcreate(H5P_DATASET_CREATE));
  H5Pset_chunk(dcpl.get(), 1, chunk);
  Hdf5Handle dset(H5Dcreate2(file, dataset.c_str(), ftype, space.get(), H5P_DEFAULT, dcpl.get(), H5P_DEFAULT));
  IHA_CONFIG_CHECK(dset.ok(), "token file '", path, "': cannot create dataset '", dataset, "'");
  {
    Hdf5Handle aspace(H5Screate(H5S_SCALAR));
    Hdf5Handle attr(H5Acreate2(dset, "vocab_size", H5T_STD_I64LE, aspace.get(), H5P_DEFAULT, H5P_DEFAULT));
    H5Awrite(attr.get(), H5T_NATIVE_INT64, &vocab_);
  }
  if (!tokenizer.empty()) write_string_attribute(dset, "tokenizer", tokenizer);
  if (!tokenizer_model.empty()) write_string_attribute(dset, "tokenizer_model", tokenizer_model);
  // data.h does not include <hdf5.h>: the writer keeps the ids and close() hands them back to
  // handles.
  file_ = file.release();
  dset_ = dset.release();
}

TokenFileWriter::~TokenFileWriter() {
  try {
    close();
  } catch (...) {
  }
}

void TokenFileWriter::append(const int64_t* tokens, int64_t count) {
  IHA_CHECK(dset_ >= 0, "token file '", path_, "' is closed");
  for (int64_t i = 0; i < count; ++i)
    IHA_CONFIG_CHECK(tokens[i] >= 0 && tokens[i] < vocab_, "token file '", path_, "': token ",
                     written_ + i, " has id ", tokens[i], ", outside [0, ", vocab_, ")");
  if (count == 0) return;
  for (int64_t i = 0; i < count; ++i)
    checksum_ += ckpt::element_hash(static_cast<uint64_t>(written_ + i), static_cast<uint64_t>(tokens[i]));
  if (document_pending_ || (!documented_ && written_ == 0)) {
    documented_ = documented_ || document_pending_;
    doc_starts_.push_back(written_);
    document_pending_ = false;
  }
  Hdf5Session session;
  const hsize_t new_size[1] = {static_cast<hsize_t>(written_ + count)};
  IHA_CHECK(H5Dset_extent(dset_, new_size) >= 0, "token file '", path_, "': cannot extend");
  Hdf5Handle fspace(H5Dget_space(dset_));
  const hsize_t start[1] = {static_cast<hsize_t>(written_)}, cnt[1] = {static_cast<hsize_t>(count)};
  H5Sselect_hyperslab(fspace.get(), H5S_SELECT_SET, start, nullptr, cnt, nullptr);
  Hdf5Handle mspace(H5Screate_simple(1, cnt, nullptr));
  IHA_CHECK(H5Dwrite(dset_, H5T_NATIVE_INT64, mspace.get(), fspace.get(), H5P_DEFAULT, tokens) >= 0,
            "token file '", path_, "': write failed");
  written_ += count;
}

void TokenFileWriter::close() {
  Hdf5Session session;
  // Closed when this returns or throws; a failed close leaves no open id behind.
  Hdf5Handle file(static_cast<hid_t>(file_)), dset(static_cast<hid_t>(dset_));
  file_ = dset_ = -1;
  if (dset.ok() && documented_ && !doc_starts_.empty()) {
    const std::string name = doc_starts_dataset(dataset_);
    const hsize_t dims[1] = {static_cast<hsize_t>(doc_starts_.size())};
    Hdf5Handle space(H5Screate_simple(1, dims, nullptr));
    Hdf5Handle d(H5Dcreate2(file, name.c_str(), H5T_STD_I64LE, space.get(), H5P_DEFAULT, H5P_DEFAULT,
                            H5P_DEFAULT));
    IHA_CHECK(d.get() >= 0 && H5Dwrite(d.get(), H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, doc_starts_.data()) >= 0,
              "token file '", path_, "': writing dataset '", name, "' failed");
    documented_ = false;
  }
  if (dset.ok()) {
    Hdf5Handle space(H5Screate(H5S_SCALAR));
    Hdf5Handle attr(H5Acreate2(dset, kTokenChecksumAttribute, H5T_STD_U64LE, space.get(), H5P_DEFAULT, H5P_DEFAULT));
    IHA_CHECK(attr.ok() && H5Awrite(attr.get(), H5T_NATIVE_UINT64, &checksum_) >= 0, "token file '", path_,
              "': writing attribute '", kTokenChecksumAttribute, "' failed");
    dset.close();
  }
  if (file.ok()) {
    const herr_t rc = file.close();
    IHA_CHECK(rc >= 0, "token file '", path_, "': closing failed (disk full?)");
  }
}

// ---- loader ----

DataLoader::DataLoader(std::shared_ptr<TokenSource> source, const SequenceLayout& layout,
                       int64_t sp_index)
    : source_(std::move(source)) {
  IHA_CHECK(source_ != nullptr, "DataLoader needs a source");
  IHA_CHECK(layout.tokens() == source_->seq_len(), "layout has N = ", layout.tokens(),
            " but the data has sequences of ", source_->seq_len());
  for (const TokenRange& c : layout.chunks_of(sp_index))
    if (!c.empty()) chunks_.push_back(c);
  n_local_ = layout.local_count(sp_index);
}

DataLoader::DataLoader(std::shared_ptr<TokenSource> source, int64_t N, const std::vector<int64_t>& tokens)
    : source_(std::move(source)) {
  IHA_CHECK(source_ != nullptr, "DataLoader needs a source");
  IHA_CHECK(N == source_->seq_len(), "the token map has N = ", N, " but the data has sequences of ",
            source_->seq_len());
  // Maximal runs of consecutive tokens: the chunks a source fills.
  for (size_t i = 0; i < tokens.size(); ++i) {
    const int64_t t = tokens[i];
    IHA_CHECK(t >= 0 && t < N && (i == 0 || t > tokens[i - 1]), "token list is not ascending in [0, ", N, ")");
    if (!chunks_.empty() && chunks_.back().end == t) {
      chunks_.back().end = t + 1;
    } else {
      chunks_.push_back({t, t + 1});
    }
  }
  n_local_ = static_cast<int64_t>(tokens.size());
}

int64_t DataLoader::sequence(int64_t i) const {
  const int64_t total = source_->num_sequences();
  return total > 0 ? i % total : i;
}

TokenBatch DataLoader::batch(int64_t first, int64_t count) const {
  TokenBatch b;
  b.B = count;
  b.n = n_local_;
  const size_t rows = static_cast<size_t>(count * n_local_);
  b.tokens.resize(rows);
  b.targets.resize(rows);
  b.answer.resize(rows);
  for (int64_t i = 0; i < count; ++i) {
    const int64_t s = sequence(first + i);
    const size_t off = static_cast<size_t>(i * n_local_);
    source_->fill(s, chunks_, b.tokens.data() + off, b.targets.data() + off, b.answer.data() + off);
    b.seg_starts.push_back(source_->segment_starts(s));
  }
  return b;
}

}  // namespace iha
