// Input fuzzer, second round (docs/reliability.md): with fixed seeds it generates the classes
// of hostile input beyond extreme values, each checked against the promise of its class:
//   - YAML features: anchors and aliases (single and nested "billion laughs"), empty and null
//     values, integers with leading zeros, over-long keys, several documents, a repeated key
//     inside a --set mapping, in the file and through --set: a ConfigError naming the key the
//     user wrote, at once;
//   - HDF5 storage kinds of a token file: contiguous, chunked (every chunk written or not),
//     never written, external raw storage, virtual datasets, external links, ids outside the
//     vocabulary, absurd declared doc_starts: read exactly, or a ConfigError naming file and
//     dataset when the file opens (never fill values, never std::bad_alloc);
//   - file types where a file is read (config, token file): FIFOs, directories, devices,
//     symbolic links to them and dangling ones: a ConfigError naming the file, never a hang;
//   - checkpoint-root names and links: only the protocol's own temporaries are removable; a
//     `lock` that is a link (symbolic or hard) or not a file is refused and its target left
//     as it was; a `latest` that is a link or not a file is refused.
// A hang fails through ctest's timeout (and the alarm below).
#include <gtest/gtest.h>
#include <hdf5.h>
#include <sys/stat.h>
#include <unistd.h>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <yaml-cpp/yaml.h>

#include "checkpoint/root.h"
#include "core/config.h"
#include "model/data.h"
#include "model/run_config.h"

namespace fs = std::filesystem;

namespace {

std::string tmp(const std::string& name) {
  return (fs::temp_directory_path() / ("iha_ifuzz_" + std::to_string(::getpid()) + "_" + name)).string();
}

std::string read_file(const std::string& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void write_file(const std::string& p, const std::string& text) { std::ofstream(p) << text; }

// Every case of a test must finish well within this; a hang ends the test binary.
struct Alarm {
  explicit Alarm(unsigned s) { ::alarm(s); }
  ~Alarm() { ::alarm(0); }
};

// The error of loading `file` with `overrides`, "" if it loads.
std::string load_error(const std::string& file, const std::vector<std::string>& overrides) {
  try {
    iha::load_run_config(file, overrides);
    return "";
  } catch (const iha::ConfigError& e) {
    return std::string(e.what()).empty() ? "ConfigError with an empty message" : e.what();
  } catch (const std::exception& e) {
    return std::string("NOT A CONFIG ERROR: ") + e.what();
  }
}

// ---- YAML features ----

// demo.yaml as section -> key -> scalar text, in order, so a case edits the text it writes.
struct Leaf {
  std::string section, key, value;
};

std::vector<Leaf> demo_leaves() {
  const YAML::Node root = YAML::LoadFile(std::string(IHA_SOURCE_DIR) + "/configs/demo.yaml");
  std::vector<Leaf> out;
  for (const auto& sec : root)
    for (const auto& kv : sec.second)
      if (kv.second.IsScalar()) out.push_back({sec.first.Scalar(), kv.first.Scalar(), kv.second.Scalar()});
  return out;
}

std::string emit(const std::vector<Leaf>& ls, const std::string& extra_top = "") {
  std::string out = extra_top, section;
  for (const Leaf& l : ls) {
    if (l.section != section) out += (section = l.section) + ":\n";
    out += "  " + l.key + ": " + l.value + "\n";
  }
  return out;
}

bool is_integer_text(const std::string& s) {
  if (s.empty()) return false;
  for (size_t i = s[0] == '-' ? 1 : 0; i < s.size(); ++i)
    if (s[i] < '0' || s[i] > '9') return false;
  return s != "-";
}

struct YamlCase {
  std::string text;
  std::vector<std::string> overrides;
  std::vector<std::string> must_name;  // every one must be in the message
  std::string what;
};

// "billion laughs": `depth` levels, each a list naming the previous level `width` times.
std::string alias_bomb(int depth, int width) {
  std::string s = "l0: &l0 [x]\n";
  for (int d = 1; d <= depth; ++d) {
    s += "l" + std::to_string(d) + ": &l" + std::to_string(d) + " [";
    for (int w = 0; w < width; ++w) s += (w ? ", *l" : "*l") + std::to_string(d - 1);
    s += "]\n";
  }
  return s;
}

YamlCase yaml_case(const std::vector<Leaf>& base, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<Leaf> ls = base;
  for (Leaf& l : ls) {
    if (l.section == "checkpoint" && l.key == "dir") l.value = "''";
    if (l.section == "logging" && l.key == "jsonl") l.value = "''";
  }
  // i before j in the file: an alias before its anchor is a YAML syntax error of its own.
  size_t i = rng() % ls.size(), j = (i + 1 + rng() % (ls.size() - 1)) % ls.size();
  if (j < i) std::swap(i, j);
  const std::string key = ls[i].section + "." + ls[i].key;
  std::vector<size_t> ints;
  for (size_t k = 0; k < ls.size(); ++k)
    if (is_integer_text(ls[k].value) && ls[k].value[0] != '-') ints.push_back(k);
  YamlCase c;
  switch (rng() % 10) {
    case 0: {  // an anchor on one key, its alias at another
      ls[i].value = "&shared " + ls[i].value;
      ls[j].value = "*shared";
      c.must_name = {key};
      c.what = "anchor at " + key + ", alias at " + ls[j].section + "." + ls[j].key;
      break;
    }
    case 1: {  // nested aliases that expand to width^depth nodes
      const int depth = 2 + static_cast<int>(rng() % 10), width = 2 + static_cast<int>(rng() % 8);
      c.text = emit(ls, alias_bomb(depth, width));
      c.must_name = {"l0"};
      c.what = "alias bomb " + std::to_string(width) + "^" + std::to_string(depth);
      return c;
    }
    case 2: {  // an empty or null value in the file, at a number (a string key reads it as "")
      const char* nulls[] = {"", "null", "~", "Null"};
      const Leaf& l = ls[ints[rng() % ints.size()]];
      ls[&l - ls.data()].value = nulls[rng() % 4];
      c.must_name = {l.section + "." + l.key, "empty"};
      c.what = "null at " + l.section + "." + l.key;
      break;
    }
    case 3: {  // an integer with a leading zero in the file
      const Leaf& l = ls[ints[rng() % ints.size()]];
      ls[&l - ls.data()].value = "0" + l.value;
      c.must_name = {l.section + "." + l.key, "leading zero"};
      c.what = "leading zero at " + l.section + "." + l.key;
      break;
    }
    case 4: {  // an over-long key (past 1024 bytes, YAML itself refuses a plain key: a syntax
               // error, named by its line and length)
      const size_t n = 129 + rng() % 1900;
      ls.insert(ls.begin() + static_cast<long>(i) + 1, Leaf{ls[i].section, std::string(n, 'k'), "1"});
      if (n <= 1024) c.must_name = {ls[i].section, "bytes"};
      else c.must_name = {"line ", "kkkkkkkk", "bytes long"};
      c.what = "key of " + std::to_string(n) + " bytes under " + ls[i].section;
      break;
    }
    case 5: {  // --set with an empty or null value, at a number
      const char* nulls[] = {"", "null", "~"};
      const Leaf& l = ls[ints[rng() % ints.size()]];
      const std::string k = l.section + "." + l.key;
      c.overrides = {k + "=" + nulls[rng() % 3]};
      c.must_name = {k, "empty"};
      c.what = "--set " + c.overrides[0];
      break;
    }
    case 6: {  // --set of an integer with a leading zero
      const Leaf& l = ls[ints[rng() % ints.size()]];
      const std::string k = l.section + "." + l.key;
      c.overrides = {k + "=0" + std::to_string(rng() % 100)};
      c.must_name = {k, "leading zero"};
      c.what = "--set " + c.overrides[0];
      break;
    }
    case 7: {  // a repeated key inside a --set mapping
      c.overrides = {ls[i].section + "={" + ls[i].key + ": 1, " + ls[i].key + ": 2}"};
      c.must_name = {"--set " + ls[i].section, key, "duplicate"};
      c.what = "--set " + c.overrides[0];
      break;
    }
    case 8: {  // an anchor or alias inside --set
      c.overrides = {key + (rng() % 2 ? "=&a 1" : "=[&a 1, *a]")};
      c.must_name = {key};
      c.what = "--set " + c.overrides[0];
      break;
    }
    default: {  // a second document
      c.text = emit(ls) + "---\n" + ls[i].section + ":\n  " + ls[i].key + ": 1\n";
      c.must_name = {"document"};
      c.what = "two documents";
      return c;
    }
  }
  c.text = emit(ls);
  return c;
}

TEST(InputFuzz, YamlFeaturesAreRefusedNamingTheKey) {
  const std::vector<Leaf> base = demo_leaves();
  ASSERT_GT(base.size(), 10u);
  const std::string file = tmp("yaml.yaml");
  write_file(file, emit(base));
  {
    std::vector<Leaf> ls = base;
    for (Leaf& l : ls)
      if (l.key == "dir" || l.key == "jsonl") l.value = "''";
    write_file(file, emit(ls));
    ASSERT_EQ(load_error(file, {}), "") << "the unmutated demo config must load";
  }
  for (uint64_t seed = 1; seed <= 300; ++seed) {
    const YamlCase c = yaml_case(base, seed);
    write_file(file, c.text);
    Alarm alarm(60);
    const std::string err = load_error(file, c.overrides);
    SCOPED_TRACE("case " + std::to_string(seed) + ": " + c.what);
    ASSERT_FALSE(err.empty()) << "accepted";
    EXPECT_EQ(err.find("NOT A CONFIG ERROR"), std::string::npos) << err;
    for (const std::string& n : c.must_name) EXPECT_NE(err.find(n), std::string::npos) << "'" << n << "' not in: " << err;
  }
  fs::remove(file);
}

// The example of the issue: an override of a key that shares its value with another changed
// both. Aliases are refused, so one key's override can only change that key.
TEST(InputFuzz, AnOverrideChangesOnlyItsKey) {
  const std::string text = "a: {x: &v 1, y: *v}\n";
  EXPECT_THROW(iha::ConfigNode::from_string(text, "t"), iha::ConfigError);
  iha::ConfigNode n = iha::ConfigNode::from_string("a: {x: 1, y: 1}\n", "t");
  n.apply_override("a.x=2");
  EXPECT_EQ(n.child("a").get<int64_t>("x", 0), 2);
  EXPECT_EQ(n.child("a").get<int64_t>("y", 0), 1);
}

// The probe's examples, one by one, through what iha-train loads.
TEST(InputFuzz, TheProbesConfigExamplesNameTheKeyTheUserWrote) {
  const std::string demo = std::string(IHA_SOURCE_DIR) + "/configs/demo.yaml";
  const std::vector<std::string> quiet = {"checkpoint.dir=", "logging.jsonl="};
  auto with = [&](std::vector<std::string> more) {
    more.insert(more.begin(), quiet.begin(), quiet.end());
    return load_error(demo, more);
  };
  ASSERT_EQ(with({}), "");
  std::string e = with({"model.H=0"});
  EXPECT_NE(e.find("'model.H'"), std::string::npos) << e;
  EXPECT_EQ(e.find("kv_heads"), std::string::npos) << e;
  e = with({"train.steps=010"});
  EXPECT_NE(e.find("'train.steps'"), std::string::npos) << e;
  for (const char* v : {"optim.lr=", "optim.lr=null"}) {
    e = with({v});
    EXPECT_NE(e.find("'optim.lr'"), std::string::npos) << v << ": " << e;
  }
  e = with({"model={D: 64, D: 32}"});
  EXPECT_NE(e.find("--set model"), std::string::npos) << e;
  EXPECT_NE(e.find("'model.D'"), std::string::npos) << e;
  EXPECT_EQ(e.find("line 2"), std::string::npos) << "blames a line of the config file: " << e;
  const std::string dir = tmp("config-dir");
  fs::create_directories(dir);
  e = load_error(dir, {});
  EXPECT_NE(e.find("is a directory"), std::string::npos) << e;
  fs::remove_all(dir);
  // Nested aliases, 9 levels of 9 (the hang): refused at once.
  const std::string bomb = tmp("bomb.yaml");
  write_file(bomb, alias_bomb(9, 9) + read_file(demo));
  Alarm alarm(20);
  e = load_error(bomb, quiet);
  EXPECT_NE(e.find("anchor"), std::string::npos) << e;
  fs::remove(bomb);
}

// ---- file types ----

// Paths that are not regular files, made fresh under dir: name -> path.
std::vector<std::pair<std::string, std::string>> odd_files(const std::string& dir) {
  fs::create_directories(dir + "/a_directory");
  const std::string fifo = dir + "/a_fifo";
  ::mkfifo(fifo.c_str(), 0600);
  fs::create_symlink(dir + "/a_directory", dir + "/link_to_directory");
  fs::create_symlink(fifo, dir + "/link_to_fifo");
  fs::create_symlink(dir + "/nothing_here", dir + "/dangling_link");
  return {{"directory", dir + "/a_directory"}, {"FIFO", fifo}, {"character device", "/dev/null"},
          {"link to a directory", dir + "/link_to_directory"}, {"link to a FIFO", dir + "/link_to_fifo"},
          {"dangling link", dir + "/dangling_link"}};
}

TEST(InputFuzz, NonRegularFilesAreRefusedNotHungOn) {
  const std::string dir = tmp("kinds");
  fs::remove_all(dir);
  fs::create_directories(dir);
  for (const auto& [kind, path] : odd_files(dir)) {
    SCOPED_TRACE(kind + " " + path);
    Alarm alarm(30);
    try {
      iha::ConfigNode::from_file(path);
      ADD_FAILURE() << "config accepted";
    } catch (const iha::ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("config file '" + path + "'"), std::string::npos) << e.what();
    }
    try {
      iha::open_token_file(path, "tokens", 4, 256);
      ADD_FAILURE() << "token file accepted";
    } catch (const iha::ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("token file '" + path + "'"), std::string::npos) << e.what();
    }
  }
  fs::remove_all(dir);
}

// ---- HDF5 storage kinds ----

enum class Storage {
  contiguous,
  chunked,
  chunked_unwritten,
  never_written,
  external_raw,
  virtual_missing_source,
  external_link,
  id_outside_vocab,
  huge_doc_starts,
  kinds
};
const char* storage_name(Storage s) {
  const char* n[] = {"contiguous", "chunked", "chunked with unwritten chunks", "never written",
                     "external raw storage", "virtual with a missing source", "external link",
                     "an id outside the vocabulary", "huge declared doc_starts"};
  return n[static_cast<int>(s)];
}

void put_vocab(hid_t dset, int64_t vocab) {
  const hid_t sp = H5Screate(H5S_SCALAR);
  const hid_t a = H5Acreate2(dset, "vocab_size", H5T_STD_I64LE, sp, H5P_DEFAULT, H5P_DEFAULT);
  H5Awrite(a, H5T_NATIVE_INT64, &vocab);
  H5Aclose(a);
  H5Sclose(sp);
}

// Writes a token file of `kind` at `path` holding `ids` (where the kind stores them at all).
void write_storage(const std::string& path, Storage kind, const std::vector<int64_t>& ids, int64_t vocab,
                   std::mt19937_64& rng) {
  const hsize_t n = ids.size();
  const hid_t f = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  ASSERT_GE(f, 0);
  const hid_t space = H5Screate_simple(1, &n, nullptr);
  const hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
  const hsize_t chunk = 1 + rng() % (n / 2);
  if (kind == Storage::chunked || kind == Storage::chunked_unwritten || kind == Storage::huge_doc_starts)
    H5Pset_chunk(dcpl, 1, &chunk);
  if (kind == Storage::external_raw) {
    const std::string raw = path + ".raw";
    if (rng() % 2) write_file(raw, "");  // empty, or missing
    H5Pset_external(dcpl, raw.c_str(), 0, n * 8);
  }
  if (kind == Storage::virtual_missing_source) {
    const hid_t src_space = H5Screate_simple(1, &n, nullptr);
    H5Pset_virtual(dcpl, space, (path + ".missing-source.h5").c_str(), "tokens", src_space);
    H5Sclose(src_space);
  }
  std::string name = "tokens";
  hid_t target = f;
  if (kind == Storage::external_link) {
    // A proper dataset in another file, reached through an external link.
    target = H5Fcreate((path + ".target.h5").c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    H5Lcreate_external((path + ".target.h5").c_str(), "tokens", f, "tokens", H5P_DEFAULT, H5P_DEFAULT);
  }
  const hid_t d = H5Dcreate2(target, name.c_str(), H5T_STD_I64LE, space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
  ASSERT_GE(d, 0) << storage_name(kind);
  put_vocab(d, vocab);
  if (kind == Storage::chunked_unwritten) {
    // Every chunk but one or more, chosen at random.
    const hsize_t chunks = (n + chunk - 1) / chunk, skip = rng() % chunks;
    for (hsize_t c = 0; c < chunks; ++c) {
      if (c == skip) continue;
      const hsize_t start = c * chunk, count = std::min(chunk, n - start);
      const hid_t ms = H5Screate_simple(1, &count, nullptr);
      const hid_t fs_ = H5Dget_space(d);
      H5Sselect_hyperslab(fs_, H5S_SELECT_SET, &start, nullptr, &count, nullptr);
      H5Dwrite(d, H5T_NATIVE_INT64, ms, fs_, H5P_DEFAULT, ids.data() + start);
      H5Sclose(fs_);
      H5Sclose(ms);
    }
  } else if (kind != Storage::never_written && kind != Storage::external_raw &&
             kind != Storage::virtual_missing_source) {
    H5Dwrite(d, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, ids.data());
  }
  if (kind == Storage::huge_doc_starts) {
    const hsize_t huge = hsize_t(1) << (40 + rng() % 20), one = 1;
    const hid_t hs = H5Screate_simple(1, &huge, nullptr);
    const hid_t hp = H5Pcreate(H5P_DATASET_CREATE);
    const hsize_t hc = 1024;
    H5Pset_chunk(hp, 1, &hc);
    const hid_t ds = H5Dcreate2(f, "doc_starts", H5T_STD_I64LE, hs, H5P_DEFAULT, hp, H5P_DEFAULT);
    const hid_t ms = H5Screate_simple(1, &one, nullptr);
    const hid_t fs_ = H5Dget_space(ds);
    const hsize_t zero = 0;
    H5Sselect_hyperslab(fs_, H5S_SELECT_SET, &zero, nullptr, &one, nullptr);
    const int64_t first = 0;
    H5Dwrite(ds, H5T_NATIVE_INT64, ms, fs_, H5P_DEFAULT, &first);
    H5Sclose(fs_);
    H5Sclose(ms);
    H5Dclose(ds);
    H5Pclose(hp);
    H5Sclose(hs);
  }
  H5Dclose(d);
  if (target != f) H5Fclose(target);
  H5Pclose(dcpl);
  H5Sclose(space);
  H5Fclose(f);
}

TEST(InputFuzz, TokenFilesAreReadExactlyOrRefusedNamingFileAndDataset) {
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  const std::string dir = tmp("storage");
  fs::remove_all(dir);
  fs::create_directories(dir);
  const int64_t vocab = 50;
  for (uint64_t seed = 1; seed <= 90; ++seed) {
    std::mt19937_64 rng(seed);
    const Storage kind = static_cast<Storage>(rng() % static_cast<uint64_t>(Storage::kinds));
    const int64_t N = 4 + static_cast<int64_t>(rng() % 16);
    const int64_t total = N + 1 + static_cast<int64_t>(rng() % 3000);
    std::vector<int64_t> ids(static_cast<size_t>(total));
    for (auto& t : ids) t = 1 + static_cast<int64_t>(rng() % (vocab - 1));  // never the fill value 0
    if (kind == Storage::id_outside_vocab) ids[rng() % ids.size()] = rng() % 2 ? vocab : -1;
    const std::string path = dir + "/case" + std::to_string(seed) + ".h5";
    SCOPED_TRACE("case " + std::to_string(seed) + ": " + storage_name(kind) + ", " + std::to_string(total) + " tokens");
    write_storage(path, kind, ids, vocab, rng);
    Alarm alarm(60);
    std::shared_ptr<iha::TokenSource> src;
    std::string err;
    try {
      src = iha::open_token_file(path, "tokens", N, vocab);
    } catch (const iha::ConfigError& e) {
      err = e.what();
    } catch (const std::exception& e) {
      err = std::string("NOT A CONFIG ERROR: ") + e.what();
    }
    if (kind == Storage::contiguous || kind == Storage::chunked) {
      ASSERT_EQ(err, "");
      const int64_t s = static_cast<int64_t>(rng() % static_cast<uint64_t>(src->num_sequences()));
      std::vector<int32_t> tok(N), tgt(N);
      std::vector<uint8_t> ans(N);
      src->fill(s, {iha::TokenRange{0, N}}, tok.data(), tgt.data(), ans.data());
      for (int64_t k = 0; k < N; ++k) {
        ASSERT_EQ(tok[k], ids[s * N + k]) << "token " << s * N + k;
        ASSERT_EQ(tgt[k], ids[s * N + k + 1]) << "target " << s * N + k;
      }
      continue;
    }
    ASSERT_FALSE(err.empty()) << "opened: its tokens would be trained on";
    EXPECT_EQ(err.find("NOT A CONFIG ERROR"), std::string::npos) << err;
    EXPECT_NE(err.find("token file '" + path + "'"), std::string::npos) << err;
    EXPECT_NE(err.find(kind == Storage::huge_doc_starts ? "doc_starts" : "dataset 'tokens'"), std::string::npos) << err;
  }
  fs::remove_all(dir);
}

// ---- checkpoint-root names and links ----

TEST(InputFuzz, OnlyTheProtocolsOwnTemporariesAreRemovable) {
  std::mt19937_64 rng(7);
  const std::string alphabet = "abcdefghijklmnopqrstuvwxyz0123456789_-.";
  for (int c = 0; c < 2000; ++c) {
    // The protocol's own names: removable.
    const std::string nonce = iha::ckpt::random_nonce();
    const std::string stem[] = {"step_" + std::to_string(rng() % 100000), "latest", "write-probe", "run"};
    const std::string own = stem[rng() % 4] + (rng() % 2 ? ".tmp-" : ".tmp-del-") + nonce;
    EXPECT_TRUE(iha::ckpt::is_own_temporary(own)) << own;
    // A user's name holding ".tmp-": kept.
    std::string user;
    for (int k = 1 + static_cast<int>(rng() % 12); k > 0; --k) user += alphabet[rng() % alphabet.size()];
    const std::string forms[] = {user + ".tmp-" + user, "thesis.tmp-draft", "step_1.tmp-" + user,
                                 own + "x", own.substr(0, own.size() - 1), "latest.tmp-" + nonce + ".bak",
                                 "step_x.tmp-" + nonce, "x" + own};
    const std::string& name = forms[rng() % 8];
    if (name != own) {
      EXPECT_FALSE(iha::ckpt::is_own_temporary(name)) << name;
    }
  }
}

TEST(InputFuzz, LinkedOrOddLockAndLatestAreRefusedTargetsUntouched) {
  const std::string dir = tmp("root");
  for (int kind = 0; kind < 4; ++kind) {
    fs::remove_all(dir);
    fs::create_directories(dir + "/root");
    const std::string user = dir + "/users-file.txt", lock = dir + "/root/lock";
    write_file(user, "the user's words\n");
    if (kind == 0) fs::create_symlink(user, lock);
    if (kind == 1) fs::create_hard_link(user, lock);
    if (kind == 2) fs::create_symlink(dir + "/nowhere", lock);
    if (kind == 3) ::mkfifo(lock.c_str(), 0600);
    SCOPED_TRACE("lock kind " + std::to_string(kind));
    Alarm alarm(30);
    try {
      iha::RootLock l(dir + "/root");
      ADD_FAILURE() << "locked";
    } catch (const iha::ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(lock), std::string::npos) << e.what();
    }
    EXPECT_EQ(read_file(user), "the user's words\n");
    EXPECT_FALSE(fs::exists(dir + "/nowhere"));
  }
  for (int kind = 0; kind < 4; ++kind) {
    fs::remove_all(dir);
    fs::create_directories(dir + "/root/step_1");
    const std::string latest = dir + "/root/latest";
    write_file(dir + "/elsewhere", "step_1\n");
    if (kind == 0) fs::create_symlink(dir + "/root/step_9", latest);  // dangling
    if (kind == 1) fs::create_symlink(dir + "/elsewhere", latest);
    if (kind == 2) fs::create_directories(latest);
    if (kind == 3) ::mkfifo(latest.c_str(), 0600);
    SCOPED_TRACE("latest kind " + std::to_string(kind));
    Alarm alarm(30);
    try {
      iha::ckpt::read_latest(dir + "/root");
      ADD_FAILURE() << "read";
    } catch (const iha::ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(latest), std::string::npos) << e.what();
    }
  }
  fs::remove_all(dir);
}

}  // namespace
