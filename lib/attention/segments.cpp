#include "attention/segments.h"

#include <algorithm>

#include "core/error.h"

namespace iha {

void check_segment_starts(const SegmentStarts& starts, int64_t B, int64_t N, const char* what) {
  if (starts.empty()) return;
  IHA_CHECK(static_cast<int64_t>(starts.size()) == B, what, ": segment starts for ", starts.size(),
            " sequences, the batch has ", B);
  for (size_t b = 0; b < starts.size(); ++b) {
    const std::vector<int64_t>& s = starts[b];
    IHA_CHECK(!s.empty() && s.front() == 0, what, ": sequence ", b, "'s segment starts must begin with 0");
    for (size_t i = 0; i < s.size(); ++i) {
      IHA_CHECK(s[i] >= 0 && s[i] < N, what, ": sequence ", b, " segment start ", s[i], " at index ", i,
                " is outside [0, ", N, ")");
      IHA_CHECK(i == 0 || s[i] > s[i - 1], what, ": sequence ", b, "'s segment starts are not ascending at index ", i,
                " (", s[i - 1], " then ", s[i], ")");
    }
  }
}

int64_t segment_start_of(const std::vector<int64_t>& starts, int64_t n) {
  const auto it = std::upper_bound(starts.begin(), starts.end(), n);
  return it == starts.begin() ? 0 : *(it - 1);
}

std::vector<int64_t> row_segment_starts(const std::vector<int64_t>& starts, const std::vector<int64_t>& tokens,
                                        int64_t P) {
  std::vector<int64_t> out;
  out.reserve(tokens.size() * static_cast<size_t>(P));
  size_t k = 0;  // tokens ascend: walk the starts once
  for (int64_t n : tokens) {
    while (k + 1 < starts.size() && starts[k + 1] <= n) ++k;
    const int64_t s = starts.empty() ? 0 : starts[k] * P;
    for (int64_t j = 0; j < P; ++j) out.push_back(s);
  }
  return out;
}

}  // namespace iha
