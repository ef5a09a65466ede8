// Cost of opening a token file (docs/reliability.md): open_token_file reads and checks every
// token id against vocab_size before the first step. Writes the file first if it is absent
// (random ids, the library's writer), then times opens of it.
//
//   bench_token_open FILE [TOKENS=100000000] [VOCAB=32000] [REPEATS=3]
//
// Prints, per open: seconds, the file's bytes and GB/s (of the file), tokens/s. The first open
// after writing finds the file in the page cache; drop caches before a run for a cold figure.
#include <sys/stat.h>

#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "model/data.h"

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: bench_token_open FILE [TOKENS] [VOCAB] [REPEATS]\n");
    return 2;
  }
  const std::string path = argv[1];
  const int64_t tokens = argc > 2 ? std::stoll(argv[2]) : 100000000;
  const int64_t vocab = argc > 3 ? std::stoll(argv[3]) : 32000;
  const int repeats = argc > 4 ? std::stoi(argv[4]) : 3;
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    const auto t0 = std::chrono::steady_clock::now();
    iha::TokenFileWriter w(path, "tokens", vocab);
    std::mt19937_64 rng(1);
    std::vector<int64_t> block(1 << 20);
    for (int64_t done = 0; done < tokens;) {
      const int64_t n = std::min<int64_t>(static_cast<int64_t>(block.size()), tokens - done);
      for (int64_t i = 0; i < n; ++i) block[i] = static_cast<int64_t>(rng() % static_cast<uint64_t>(vocab));
      w.append(block.data(), n);
      done += n;
    }
    w.close();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("wrote %s: %lld tokens, vocab %lld, %.1f s\n", path.c_str(), static_cast<long long>(tokens),
                static_cast<long long>(vocab), s);
    ::stat(path.c_str(), &st);
  }
  for (int r = 0; r < repeats; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    auto src = iha::open_token_file(path, "tokens", 1024, vocab);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const double n = static_cast<double>(src->num_sequences()) * 1024;
    std::printf("open %d: %.3f s, file %.3f GB, %.2f GB/s, %.0f M tokens/s (%lld sequences of 1024)\n", r, s,
                st.st_size / 1e9, st.st_size / 1e9 / s, n / s / 1e6,
                static_cast<long long>(src->num_sequences()));
  }
  return 0;
}
