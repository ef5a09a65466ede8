// iha-data: makes and inspects HDF5 token files for iha-train (format in docs/data.md).
//
//   iha-data text INPUT... OUTPUT.h5 [--jsonl | --separator STR] [--spm MODEL] [--dataset NAME]
//   iha-data spm-train INPUT... MODEL_PREFIX --vocab-size V [--jsonl | --separator STR]
//                      [--model-type unigram|bpe|char|word]
//   iha-data info FILE.h5 [--dataset NAME] [--seq-len N]
//
// Documents (DESIGN.md section 10): one per input file, or with --jsonl one per line of a
// JSON-lines file (its "text" field), or with --separator STR the lines between lines that
// hold only STR (--separator % splits fortune files, strfile's format). Empty documents are
// dropped. Tokens: bytes (vocab_size 256) or, with --spm, a SentencePiece model's ids.
//
// Exit codes: 0 success, 2 bad arguments or input (the message names the file), 1 other errors.
#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>
#include <sys/stat.h>

#include <algorithm>
#include <sstream>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <functional>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/files.h"
#include "model/data.h"

namespace {

const char* kUsage =
    "usage: iha-data text INPUT... OUTPUT.h5 [--jsonl | --separator STR] [--spm MODEL] [--dataset NAME]\n"
    "       iha-data spm-train INPUT... MODEL_PREFIX --vocab-size V [--jsonl | --separator STR]\n"
    "                [--model-type unigram|bpe|char|word]\n"
    "       iha-data info FILE.h5 [--dataset NAME] [--seq-len N]\n";

enum class Split { file, jsonl, separator };

struct Options {
  std::vector<std::string> pos;
  std::string dataset = "tokens";
  int64_t seq_len = 1;
  Split split = Split::file;
  std::string separator;
  std::string spm_model;
  int64_t vocab_size = 0;
  std::string model_type = "unigram";
};

// ---- documents ----

// Calls `emit` with every non-empty document of the inputs, in order. A document is held in
// memory whole.
class Documents {
 public:
  Documents(const std::vector<std::string>& inputs, Split split, const std::string& separator)
      : inputs_(inputs), split_(split), separator_(separator) {}

  void for_each(const std::function<void(const std::string&)>& emit) const {
    for (const std::string& path : inputs_) {
      // The file checked is the file read (core/files.h), whatever the path names by now.
      const iha::InputFile checked(path, "input file");
      std::ifstream in(checked.reopen_path(), std::ios::binary);
      IHA_CONFIG_CHECK(in.good(), "cannot open input file '", path, "'");
      if (split_ == Split::jsonl) {
        jsonl(path, in, emit);
      } else if (split_ == Split::separator) {
        separated(path, in, emit);
      } else {
        std::string doc((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
        IHA_CONFIG_CHECK(!in.bad(), "reading input file '", path, "' failed");
        if (!doc.empty()) emit(doc);
      }
    }
  }

 private:
  static void jsonl(const std::string& path, std::istream& in,
                    const std::function<void(const std::string&)>& emit) {
    std::string line;
    for (int64_t no = 1; std::getline(in, line); ++no) {
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;  // a blank line
      nlohmann::json j;
      try {
        j = nlohmann::json::parse(line);
      } catch (const nlohmann::json::parse_error& e) {
        throw iha::ConfigError("JSON-lines file '" + path + "', line " + std::to_string(no) +
                               ": not valid JSON (" + e.what() + ")");
      }
      IHA_CONFIG_CHECK(j.is_object() && j.contains("text"), "JSON-lines file '", path, "', line ", no,
                       ": expected an object with a \"text\" field");
      IHA_CONFIG_CHECK(j["text"].is_string(), "JSON-lines file '", path, "', line ", no,
                       ": field \"text\" is ", j["text"].type_name(), ", not a string");
      const std::string& text = j["text"].get_ref<const std::string&>();
      if (!text.empty()) emit(text);
    }
    IHA_CONFIG_CHECK(!in.bad(), "reading JSON-lines file '", path, "' failed");
  }

  // A line holding only the separator (a trailing '\r' aside) ends a document; the
  // document is the lines before it, with their newlines.
  void separated(const std::string& path, std::istream& in,
                 const std::function<void(const std::string&)>& emit) const {
    std::string doc, line;
    while (std::getline(in, line)) {
      const bool ended = !in.eof();  // the line had its newline
      const size_t len = !line.empty() && line.back() == '\r' ? line.size() - 1 : line.size();
      if (line.compare(0, len, separator_) == 0 && len == separator_.size()) {
        if (!doc.empty()) emit(doc);
        doc.clear();
        continue;
      }
      doc += line;
      if (ended) doc += '\n';
    }
    IHA_CONFIG_CHECK(!in.bad(), "reading input file '", path, "' failed");
    if (!doc.empty()) emit(doc);
  }

  std::vector<std::string> inputs_;
  Split split_;
  std::string separator_;
};

// ---- tokenizers ----

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  virtual int64_t vocab() const = 0;
  virtual std::string name() const = 0;
  virtual void encode(const std::string& text, std::vector<int64_t>& ids) const = 0;
};

class ByteTokenizer final : public Tokenizer {
 public:
  int64_t vocab() const override { return 256; }
  std::string name() const override { return "bytes"; }
  void encode(const std::string& text, std::vector<int64_t>& ids) const override {
    ids.resize(text.size());
    for (size_t i = 0; i < text.size(); ++i) ids[i] = static_cast<unsigned char>(text[i]);
  }
};

class SentencePieceTokenizer final : public Tokenizer {
 public:
  explicit SentencePieceTokenizer(const std::string& model) : model_(model) {
    const iha::InputFile checked(model, "SentencePiece model (option --spm)");
    const auto status = sp_.Load(checked.reopen_path());
    IHA_CONFIG_CHECK(status.ok(), "SentencePiece model '", model, "' (option --spm): cannot load it (",
                     status.ToString(), ")");
  }
  int64_t vocab() const override { return sp_.GetPieceSize(); }
  std::string name() const override { return "sentencepiece"; }
  void encode(const std::string& text, std::vector<int64_t>& ids) const override {
    std::vector<int> pieces;
    const auto status = sp_.Encode(text, &pieces);
    IHA_CONFIG_CHECK(status.ok(), "SentencePiece model '", model_, "': encoding failed (", status.ToString(), ")");
    ids.assign(pieces.begin(), pieces.end());
  }

 private:
  std::string model_;
  sentencepiece::SentencePieceProcessor sp_;
};

// An output replaces what its name holds: it must not be an input under another name (the
// same path, a symlink or a hard link to it), nor a directory.
void check_not_an_input(const std::vector<std::string>& inputs, const std::string& out_path) {
  struct stat so;
  if (::stat(out_path.c_str(), &so) != 0) return;
  IHA_CONFIG_CHECK(!S_ISDIR(so.st_mode), "output '", out_path, "' is a directory");
  for (const std::string& in : inputs) {
    struct stat si;
    IHA_CONFIG_CHECK(!(::stat(in.c_str(), &si) == 0 && si.st_dev == so.st_dev && si.st_ino == so.st_ino),
                     "output '", out_path, "' is the input file '", in,
                     "' (the same file): writing it would destroy the input");
  }
}

int text_to_tokens(const Options& o) {
  const std::vector<std::string> inputs(o.pos.begin() + 1, o.pos.end() - 1);
  const std::string out_path = o.pos.back();
  for (const std::string& in : inputs) iha::require_regular_file(in, "input file");
  std::vector<std::string> read = inputs;
  if (!o.spm_model.empty()) read.push_back(o.spm_model);  // the tokenizer is an input too
  check_not_an_input(read, out_path);
  std::unique_ptr<Tokenizer> tok;
  if (o.spm_model.empty()) {
    tok = std::make_unique<ByteTokenizer>();
  } else {
    tok = std::make_unique<SentencePieceTokenizer>(o.spm_model);
  }
  for (const std::string& in : inputs) const iha::InputFile probe(in, "input file");  // before the output is created
  // Written beside the output and renamed over it when complete: bad input found half way
  // leaves no half-written file, and an existing output stays as it was.
  // The name is ours: whatever is there (a stale partial, or a symbolic link to any file) is
  // removed, not written through; HDF5 then creates a new file.
  const std::string partial = out_path + ".partial";
  struct stat ps;
  if (::lstat(partial.c_str(), &ps) == 0) {
    IHA_CONFIG_CHECK(!S_ISDIR(ps.st_mode), "temporary output '", partial, "' is a directory; remove it");
    IHA_CONFIG_CHECK(::unlink(partial.c_str()) == 0, "cannot remove the stale temporary output '", partial, "'");
  }
  int64_t written = 0, docs = 0;
  try {
    iha::TokenFileWriter out(partial, o.dataset, tok->vocab(), tok->name(), o.spm_model);
    std::vector<int64_t> ids;
    Documents(inputs, o.split, o.separator).for_each([&](const std::string& doc) {
      tok->encode(doc, ids);
      out.begin_document();
      out.append(ids.data(), static_cast<int64_t>(ids.size()));
    });
    written = out.written();
    docs = out.documents();
    IHA_CONFIG_CHECK(written > 0, "the inputs hold no non-empty document; nothing to write to '", out_path, "'");
    out.close();
    IHA_CHECK(std::rename(partial.c_str(), out_path.c_str()) == 0, "cannot rename '", partial, "' to '",
              out_path, "'");
  } catch (...) {
    std::remove(partial.c_str());
    throw;
  }
  std::cout << "wrote " << written << " tokens in " << docs << " documents (" << tok->name() << ", vocab_size "
            << tok->vocab() << ") to '" << out_path << "', datasets '" << o.dataset << "' and '"
            << iha::doc_starts_dataset(o.dataset) << "'" << std::endl;
  return 0;
}

// Training sentences for SentencePiece: the lines of every document, each cut into pieces
// short enough for the trainer (it refuses sentences over max_sentence_length bytes, and
// fails when it has skipped them all). Cuts fall on UTF-8 character boundaries.
class DocumentSentences final : public sentencepiece::SentenceIterator {
 public:
  static constexpr size_t kMaxSentenceBytes = 4096;

  explicit DocumentSentences(const Documents& docs) {
    docs.for_each([&](const std::string& d) {
      ++documents_;
      size_t b = 0;
      while (b < d.size()) {
        size_t e = d.find('\n', b);
        if (e == std::string::npos) e = d.size();
        for (size_t p = b; p < e;) {
          size_t q = std::min(e, p + kMaxSentenceBytes);
          while (q < e && q > p + 1 && (static_cast<unsigned char>(d[q]) & 0xC0) == 0x80) --q;
          docs_.push_back(d.substr(p, q - p));
          p = q;
        }
        b = e + 1;
      }
    });
  }
  size_t documents() const { return documents_; }
  bool done() const override { return at_ >= docs_.size(); }
  void Next() override { ++at_; }
  const std::string& value() const override { return docs_[at_]; }
  // OK: the documents were read (and checked) before training starts.
  sentencepiece::util::Status status() const override { return {}; }
  size_t size() const { return docs_.size(); }

 private:
  size_t documents_ = 0;
  std::vector<std::string> docs_;
  size_t at_ = 0;
};

int spm_train(const Options& o) {
  IHA_CONFIG_CHECK(o.vocab_size >= 2, "spm-train needs --vocab-size V (>= 2)");
  const std::vector<std::string> inputs(o.pos.begin() + 1, o.pos.end() - 1);
  const std::string prefix = o.pos.back();
  for (const std::string& in : inputs) iha::require_regular_file(in, "input file");
  // SentencePiece writes PREFIX.model and PREFIX.vocab by truncation, through any symbolic link.
  for (const char* ext : {".model", ".vocab"}) {
    check_not_an_input(inputs, prefix + ext);
    iha::require_new_output(prefix + ext, "SentencePiece output");
  }
  DocumentSentences sentences(Documents(inputs, o.split, o.separator));
  IHA_CONFIG_CHECK(sentences.size() > 0, "the inputs hold no non-empty document to train on");
  // byte_fallback: any byte of a later text has an id (no <unk> for unseen characters).
  const auto status = sentencepiece::SentencePieceTrainer::Train(
      {{"model_prefix", prefix},
       {"vocab_size", std::to_string(o.vocab_size)},
       {"model_type", o.model_type},
       {"byte_fallback", "true"},
       {"input_sentence_size", "2000000"},
       {"shuffle_input_sentence", "true"},
       {"max_sentence_length", std::to_string(DocumentSentences::kMaxSentenceBytes)},
       {"minloglevel", "1"}},
      &sentences);
  IHA_CONFIG_CHECK(status.ok(), "SentencePiece training (model prefix '", prefix, "') failed: ", status.ToString());
  std::cout << "wrote SentencePiece model '" << prefix << ".model' (vocab_size " << o.vocab_size << ", "
            << o.model_type << ") trained on " << sentences.documents() << " documents" << std::endl;
  return 0;
}

int info(const Options& o) {
  const std::string& path = o.pos[1];
  // Reading every sequence once also checks every id against vocab_size.
  auto src = iha::open_token_file(path, o.dataset, o.seq_len, INT32_MAX);
  iha::DataLoader loader(src, iha::SequenceLayout(iha::LayoutKind::contiguous, o.seq_len, 1), 0);
  int32_t lo = INT32_MAX, hi = INT32_MIN;
  int64_t segments = 0;
  const int64_t n = src->num_sequences();
  for (int64_t s = 0; s < n; s += 256) {
    const iha::TokenBatch b = loader.batch(s, std::min<int64_t>(256, n - s));
    for (size_t i = 0; i < b.tokens.size(); ++i) {
      lo = std::min(lo, b.tokens[i]);
      hi = std::max(hi, b.tokens[i]);
      if (b.targets[i] >= 0) hi = std::max(hi, b.targets[i]), lo = std::min(lo, b.targets[i]);
    }
    for (const auto& ss : b.seg_starts) segments += static_cast<int64_t>(ss.size());
  }
  std::cout << src->describe() << "\n  ids in sequences: [" << lo << ", " << hi << "]\n  segments: "
            << segments << " in " << n << " sequences (" << (n > 0 ? static_cast<double>(segments) / n : 0)
            << " a sequence)" << std::endl;
  return 0;
}

int64_t integer_option(const std::string& name, const char* value) {
  try {
    size_t used = 0;
    const int64_t v = std::stoll(value, &used);
    if (used == std::string(value).size()) return v;
  } catch (...) {
  }
  throw iha::ConfigError("option " + name + " needs an integer, got '" + value + "'");
}

// A wrong command line: named, then the usage (exit 2).
struct UsageError : iha::ConfigError {
  using iha::ConfigError::ConfigError;
};

template <class... A>
void usage_check(bool ok, const A&... parts) {
  if (ok) return;
  std::ostringstream os;
  (os << ... << parts);
  throw UsageError(os.str());
}
#define USAGE_CHECK(cond, ...) usage_check(static_cast<bool>(cond), __VA_ARGS__)

}  // namespace

int main(int argc, char** argv) {
  std::signal(SIGXFSZ, SIG_IGN);  // a write past ulimit -f fails (EFBIG) and is reported
  for (int i = 1; i < argc; ++i)
    if (std::string(argv[i]) == "--help" || std::string(argv[i]) == "-h") {
      std::cout << kUsage;
      return 0;
    }
  try {
    Options o;
    bool jsonl = false, separated = false;
    std::vector<std::string> given;  // the options on the command line
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      const bool valued = a == "--dataset" || a == "--seq-len" || a == "--separator" || a == "--spm" ||
                          a == "--vocab-size" || a == "--model-type";
      if (valued || a == "--jsonl") given.push_back(a);
      if (valued) {
        USAGE_CHECK(i + 1 < argc, "option ", a, " needs a value");
        const char* v = argv[++i];
        if (a == "--dataset") o.dataset = v;
        if (a == "--seq-len") o.seq_len = integer_option(a, v);
        if (a == "--vocab-size") o.vocab_size = integer_option(a, v);
        if (a == "--spm") o.spm_model = v;
        if (a == "--model-type") o.model_type = v;
        if (a == "--separator") {
          o.separator = v;
          separated = true;
          USAGE_CHECK(!o.separator.empty(), "option --separator needs a non-empty string");
        }
      } else if (a == "--jsonl") {
        jsonl = true;
      } else if (a.size() > 1 && a[0] == '-') {
        throw UsageError("unknown option '" + a + "'");
      } else {
        o.pos.push_back(a);
      }
    }
    USAGE_CHECK(o.seq_len >= 1, "option --seq-len must be >= 1");
    USAGE_CHECK(!(jsonl && separated), "options --jsonl and --separator exclude each other");
    o.split = jsonl ? Split::jsonl : separated ? Split::separator : Split::file;
    USAGE_CHECK(!o.pos.empty(), "missing command (text, spm-train or info)");
    const std::string cmd = o.pos[0];
    USAGE_CHECK(cmd == "text" || cmd == "spm-train" || cmd == "info", "unknown command '", cmd,
                     "' (expected text, spm-train or info)");
    // Every option given must be one of this command's.
    const std::vector<std::string> allowed =
        cmd == "text"        ? std::vector<std::string>{"--jsonl", "--separator", "--spm", "--dataset"}
        : cmd == "spm-train" ? std::vector<std::string>{"--jsonl", "--separator", "--vocab-size", "--model-type"}
                             : std::vector<std::string>{"--dataset", "--seq-len"};
    for (const std::string& opt : given)
      USAGE_CHECK(std::find(allowed.begin(), allowed.end(), opt) != allowed.end(), cmd,
                       ": option ", opt, " does not apply to this command");
    if (cmd == "text") {
      USAGE_CHECK(o.pos.size() >= 3, "text: needs INPUT... OUTPUT.h5, got ", o.pos.size() - 1, " path(s)");
      return text_to_tokens(o);
    }
    if (cmd == "spm-train") {
      USAGE_CHECK(o.pos.size() >= 3, "spm-train: needs INPUT... MODEL_PREFIX, got ", o.pos.size() - 1,
                       " path(s)");
      return spm_train(o);
    }
    USAGE_CHECK(o.pos.size() >= 2, "info: missing FILE.h5");
    USAGE_CHECK(o.pos.size() == 2, "info: unexpected argument '", o.pos[2], "' (one FILE.h5 only)");
    return info(o);
  } catch (const UsageError& e) {
    std::cerr << "iha-data: error: " << e.what() << "\n\n" << kUsage << std::flush;
    return 2;
  } catch (const iha::ConfigError& e) {
    std::cerr << "iha-data: error: " << e.what() << std::endl;
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "iha-data: error: " << iha::error_text(e) << std::endl;
    return 1;
  }
}
