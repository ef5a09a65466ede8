// iha-data: makes and inspects HDF5 token files for iha-train (format in docs/training.md).
//
//   iha-data text INPUT.txt OUTPUT.h5 [--dataset NAME]   byte-level tokens (vocab_size 256)
//   iha-data info FILE.h5 [--dataset NAME] [--seq-len N]  size, vocab, id range, sequences
//
// Exit codes: 0 success, 2 bad arguments or input (the message names the file), 1 other errors.
#include <sys/stat.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "core/error.h"
#include "model/data.h"

namespace {

const char* kUsage =
    "usage: iha-data text INPUT.txt OUTPUT.h5 [--dataset NAME]\n"
    "       iha-data info FILE.h5 [--dataset NAME] [--seq-len N]\n";

int text_to_tokens(const std::string& in_path, const std::string& out_path, const std::string& dataset) {
  std::ifstream in(in_path, std::ios::binary);
  IHA_CONFIG_CHECK(in.good(), "cannot open text file '", in_path, "'");
  // The output is created by truncation: it must not be the input under another name (the
  // same path, a symlink or a hard link to it).
  struct stat si, so;
  IHA_CONFIG_CHECK(!(::stat(in_path.c_str(), &si) == 0 && ::stat(out_path.c_str(), &so) == 0 &&
                     si.st_dev == so.st_dev && si.st_ino == so.st_ino),
                   "output '", out_path, "' is the input file '", in_path,
                   "' (the same file): writing it would destroy the input");
  iha::TokenFileWriter out(out_path, dataset, 256, "bytes");
  std::vector<char> buf(1 << 20);
  std::vector<int64_t> ids;
  while (in) {
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    const std::streamsize n = in.gcount();
    if (n <= 0) break;
    ids.resize(static_cast<size_t>(n));
    for (std::streamsize i = 0; i < n; ++i) ids[i] = static_cast<unsigned char>(buf[i]);
    out.append(ids.data(), n);
  }
  IHA_CONFIG_CHECK(in.eof(), "reading text file '", in_path, "' failed");
  const int64_t written = out.written();
  out.close();
  std::cout << "wrote " << written << " byte tokens (vocab_size 256) to '" << out_path
            << "', dataset '" << dataset << "'" << std::endl;
  return 0;
}

int info(const std::string& path, const std::string& dataset, int64_t seq_len) {
  // Reading every sequence once also checks every id against vocab_size.
  auto src = iha::open_token_file(path, dataset, seq_len, INT32_MAX);
  iha::DataLoader loader(src, iha::SequenceLayout(iha::LayoutKind::contiguous, seq_len, 1), 0);
  int32_t lo = INT32_MAX, hi = INT32_MIN;
  const int64_t n = src->num_sequences();
  for (int64_t s = 0; s < n; s += 256) {
    const iha::TokenBatch b = loader.batch(s, std::min<int64_t>(256, n - s));
    for (size_t i = 0; i < b.tokens.size(); ++i) {
      lo = std::min({lo, b.tokens[i], b.targets[i]});
      hi = std::max({hi, b.tokens[i], b.targets[i]});
    }
  }
  std::cout << src->describe() << "\n  ids in sequences: [" << lo << ", " << hi << "]" << std::endl;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::signal(SIGXFSZ, SIG_IGN);  // a write past ulimit -f fails (EFBIG) and is reported
  try {
    std::vector<std::string> pos;
    std::string dataset = "tokens";
    int64_t seq_len = 1;
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      if (a == "--dataset" || a == "--seq-len") {
        IHA_CONFIG_CHECK(i + 1 < argc, "option ", a, " needs a value");
        if (a == "--dataset") {
          dataset = argv[++i];
        } else {
          try {
            seq_len = std::stoll(argv[++i]);
          } catch (...) {
            throw iha::ConfigError("option --seq-len needs an integer");
          }
          IHA_CONFIG_CHECK(seq_len >= 1, "option --seq-len must be >= 1");
        }
      } else {
        pos.push_back(a);
      }
    }
    if (pos.size() == 3 && pos[0] == "text") return text_to_tokens(pos[1], pos[2], dataset);
    if (pos.size() == 2 && pos[0] == "info") return info(pos[1], dataset, seq_len);
    std::cerr << kUsage;
    return 2;
  } catch (const iha::ConfigError& e) {
    std::cerr << "iha-data: error: " << e.what() << std::endl;
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "iha-data: error: " << e.what() << std::endl;
    return 1;
  }
}
