// iha-ckpt: check and list IHA checkpoints.
//
//   iha-ckpt inspect DIR [--meta KEY]   tensors (name, dtype, shape, bytes) and metadata of the
//                                       checkpoint DIR (a step directory, or a root whose
//                                       `latest` is followed); --meta prints one value whole
//                                       (e.g. the config text a fine-tune starts from)
//   iha-ckpt verify DIR                 re-hashes every tensor against its integrity hashes;
//                                       under mpiexec the ranks share the work
// Exit status: 0 ok, 2 usage error, bad path or damaged checkpoint (bad input, as for every
// IHA command), 1 any other error.
#include <mpi.h>

#include <charconv>
#include <cstdio>
#include <cstring>
#include <cstdlib>
#include <sstream>
#include <string>

#include "checkpoint/checkpoint.h"

namespace {

using namespace iha;

// Asked for (--help): stdout and 0; a wrong command line: stderr and 2.
int usage(bool asked = false) {
  std::fprintf(asked ? stdout : stderr,
               "usage: iha-ckpt inspect DIR [--meta KEY]\n"
               "       iha-ckpt verify DIR\n"
               "DIR is a checkpoint step directory or a root holding a 'latest' pointer.\n");
  return asked ? 0 : 2;
}

// Shortest text that reads back as the same double.
std::string number(double x) {
  char buf[32];
  const auto r = std::to_chars(buf, buf + sizeof buf, x);
  return std::string(buf, r.ptr);
}

std::string value_text(const MetaValue& v, bool whole) {
  std::ostringstream os;
  std::visit(
      [&](const auto& x) {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, std::string>) {
          if (whole) {
            os << x;
          } else {
            std::string shown = x.substr(0, 60);
            for (char& c : shown)
              if (c == '\n') c = ' ';
            os << "string (" << x.size() << " bytes) \"" << shown << (x.size() > 60 ? "...\"" : "\"");
          }
        } else if constexpr (std::is_same_v<T, int64_t>) {
          os << (whole ? "" : "i64 ") << x;
        } else if constexpr (std::is_same_v<T, uint64_t>) {
          os << (whole ? "" : "u64 ") << x;
        } else if constexpr (std::is_same_v<T, double>) {
          os << (whole ? "" : "f64 ") << number(x);
        } else {
          using E = typename T::value_type;
          if (!whole)
            os << (std::is_same_v<E, double> ? "f64" : std::is_same_v<E, int64_t> ? "i64" : "u64")
               << "[" << x.size() << "] ";
          os << "[";
          for (size_t i = 0; i < x.size(); ++i) {
            os << (i ? ", " : "");
            if constexpr (std::is_same_v<E, double>) os << number(x[i]);
            else os << x[i];
          }
          os << "]";
        }
      },
      v);
  return os.str();
}

int inspect(const std::string& dir, const std::string& meta_key) {
  const CheckpointInfo info = inspect_checkpoint(dir);
  if (!meta_key.empty()) {
    auto it = info.meta.find(meta_key);
    if (it == info.meta.end()) throw ConfigError("checkpoint " + info.dir + " has no metadata '" + meta_key + "'");
    const std::string text = value_text(it->second, true);
    std::fputs(text.c_str(), stdout);
    if (text.empty() || text.back() != '\n') std::fputc('\n', stdout);
    return 0;
  }
  int64_t total = 0;
  size_t width = 4;
  for (const TensorInfo& t : info.tensors) {
    total += t.numel() * static_cast<int64_t>(dtype_size(t.dtype));
    width = std::max(width, t.name.size());
  }
  std::printf("checkpoint %s\n  step %lld, format version %lld, written by %lld ranks, "
              "integrity chunks of %lld elements\n",
              info.dir.c_str(), static_cast<long long>(info.step),
              static_cast<long long>(info.format_version), static_cast<long long>(info.writer_ranks),
              static_cast<long long>(info.hash_chunk_elems));
  std::printf("tensors: %zu, %lld bytes\n", info.tensors.size(), static_cast<long long>(total));
  for (const TensorInfo& t : info.tensors)
    std::printf("  %-*s  %-4s  %-16s %lld bytes\n", static_cast<int>(width), t.name.c_str(),
                dtype_name(t.dtype), shape_str(t.shape).c_str(),
                static_cast<long long>(t.numel() * dtype_size(t.dtype)));
  std::printf("metadata: %zu\n", info.meta.size());
  for (const auto& [key, v] : info.meta)
    std::printf("  %-*s  %s\n", static_cast<int>(width), key.c_str(), value_text(v, false).c_str());
  return 0;
}

int verify(int* argc, char*** argv, const std::string& dir) {
  MpiRuntime runtime(argc, argv);
  Communicator& world = *runtime.world();
  int rc = 0;
  try {
    const VerifyReport rep = verify_checkpoint(world, dir);
    if (world.rank() == 0)
      std::printf("OK: %s: %lld tensors, %lld chunks, %lld bytes verified\n", dir.c_str(),
                  static_cast<long long>(rep.tensors), static_cast<long long>(rep.chunks),
                  static_cast<long long>(rep.bytes));
  } catch (const ConfigError& e) {
    if (world.rank() == 0) std::fprintf(stderr, "iha-ckpt: %s\n", e.what());
    rc = 2;
  } catch (const std::exception& e) {
    if (world.rank() == 0) std::fprintf(stderr, "iha-ckpt: %s\n", iha::error_text(e).c_str());
    rc = 1;
  }
  return rc;
}

// A wrong command line: the line naming what is wrong, then the usage, exit 2.
int bad_usage(const std::string& what) {
  std::fprintf(stderr, "iha-ckpt: error: %s\n", what.c_str());
  return usage();
}

}  // namespace

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i)
    if (std::strcmp(argv[i], "--help") == 0 || std::strcmp(argv[i], "-h") == 0) return usage(true);
  if (argc < 2) return bad_usage("missing command (inspect or verify)");
  const std::string cmd = argv[1];
  if (cmd != "inspect" && cmd != "verify")
    return bad_usage("unknown command '" + cmd + "' (expected inspect or verify)");
  if (argc < 3) return bad_usage(cmd + ": missing DIR");
  const std::string dir = argv[2];
  std::string meta_key;
  for (int i = 3; i < argc; ++i) {
    const std::string a = argv[i];
    if (cmd == "inspect" && a == "--meta") {
      if (i + 1 >= argc) return bad_usage("option --meta needs a KEY");
      meta_key = argv[++i];
    } else if (!a.empty() && a[0] == '-') {
      return bad_usage(cmd + ": unknown option '" + a + "'");
    } else {
      return bad_usage(cmd + ": unexpected argument '" + a + "' (one DIR only)");
    }
  }
  try {
    if (cmd == "inspect") return inspect(dir, meta_key);
    return verify(&argc, &argv, dir);
  } catch (const ConfigError& e) {
    std::fprintf(stderr, "iha-ckpt: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "iha-ckpt: %s\n", iha::error_text(e).c_str());
    return 1;
  }
}
