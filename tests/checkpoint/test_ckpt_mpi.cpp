// Checkpoints under mpiexec with 1-4 ranks: resharding between meshes, integrity failures,
// write failures, dtype rules, commit protocol, async saves. Expected values come from the
// generator in model_state.h, never from the code under test.
#include <gtest/gtest.h>
#include <hdf5.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>

#include "checkpoint/checkpoint.h"
#include "checkpoint/hdf5_lock.h"
#include "checkpoint/root.h"
#include "model_state.h"
#include "mpi_env.h"

namespace iha {
namespace {

// How iha-train names a checkpoint root in messages (the CheckpointRoot takes the caller's name).
const std::string kRootName = "config key 'checkpoint.dir'";

namespace fs = std::filesystem;
using test::Layout;
using test::world;
using Locals = std::map<std::string, std::vector<Tensor>>;

// A fresh directory for one test, the same path on every rank.
std::string make_root(const std::string& tag) {
  Communicator& c = world();
  std::string path;
  if (c.rank() == 0) {
    path = (fs::temp_directory_path() / ("iha_ckpt_" + std::to_string(::getpid()) + "_" + tag)).string();
    fs::remove_all(path);
    fs::create_directories(path);
  }
  int64_t n = static_cast<int64_t>(path.size());
  c.broadcast(&n, 1, DType::i64, 0, "test");
  path.resize(n);
  c.broadcast(path.data(), n, DType::u8, 0, "test");
  return path;
}

void remove_root(const std::string& path) {
  world().barrier();
  if (world().rank() == 0) fs::remove_all(path);
}

// Runs f, which must throw an iha::Error on every rank with the same message; returns it.
template <class F>
std::string expect_same_error(F&& f) {
  std::string msg;
  int64_t threw = 0;
  try {
    f();
  } catch (const Error& e) {
    msg = e.what();
    threw = 1;
  }
  Communicator& c = world();
  std::vector<int64_t> all(2 * c.size());
  int64_t mine[2] = {threw, static_cast<int64_t>(name_stream(msg.c_str()))};
  c.all_gather(mine, all.data(), 2, DType::i64, "test");
  for (int r = 0; r < c.size(); ++r) {
    EXPECT_EQ(all[2 * r], 1) << "rank " << r << " did not throw";
    EXPECT_EQ(all[2 * r + 1], all[1]) << "rank " << r << " has another message than rank 0";
  }
  return msg;
}

void expect_contains(const std::string& msg, const std::vector<std::string>& parts) {
  for (const std::string& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
}

CheckpointOptions small_chunks(int keep = 3) {
  CheckpointOptions o;
  o.hash_chunk_elems = 7;  // chunks straddle every shard boundary
  o.keep_last = keep;
  return o;
}

std::string save_state(const std::string& root, int64_t step, const Layout& L,
                        CheckpointOptions opt = small_chunks(), uint64_t salt = 0) {
  Communicator& c = world();
  Checkpointer ck(test::world_ptr(), opt);
  Locals locals;
  test::register_state(ck, L, c.rank(), c.size(), true, locals, salt);
  for (const auto& [k, v] : test::state_meta(step)) ck.set_meta(k, v);
  return ck.save(root, step);
}

// Loads into layout L and checks every piece and the metadata; returns the info.
CheckpointInfo load_and_check(const std::string& path, int64_t step, const Layout& L,
                              uint64_t salt = 0) {
  Communicator& c = world();
  Checkpointer ck(test::world_ptr(), small_chunks());
  Locals locals;
  test::register_state(ck, L, c.rank(), c.size(), false, locals);
  CheckpointInfo info = ck.load(path);
  EXPECT_EQ(test::check_state(L, c.rank(), c.size(), locals, salt), "");
  EXPECT_EQ(info.step, step);
  const MetaMap want = test::state_meta(step);
  EXPECT_EQ(info.meta.size(), want.size());
  for (const auto& [k, v] : want) {
    EXPECT_TRUE(info.has_meta(k) && info.meta.at(k) == v) << "metadata " << k;
  }
  EXPECT_EQ(info.get<uint64_t>("rng/counter"), uint64_t(1000 + step));
  return info;
}

// A root's entries, without the lock file every writer of the root creates (root.h).
// Collective: every rank lists root, then all wait, so that no rank's next step (a save or a
// CheckpointRoot, which writes a probe file) can appear in a slower rank's listing.
std::set<std::string> entries(const std::string& root) {
  std::set<std::string> s;
  for (const auto& e : fs::directory_iterator(root))
    if (e.path().filename() != "lock") s.insert(e.path().filename().string());
  world().barrier();
  return s;
}

std::string latest_of(const std::string& root) {
  std::ifstream in(root + "/latest");
  std::string s;
  in >> s;
  return s;
}

// HDF5 edits of a saved file, on rank 0 only (the test plays a damaged disk or a careless
// user); takes the library's HDF5 lock like any HDF5 user in the process must.
uint64_t dataset_offset(const std::string& file, const std::string& ds) {
  std::lock_guard<std::mutex> lock(hdf5_mutex());
  hid_t f = H5Fopen(file.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  hid_t d = H5Dopen2(f, ds.c_str(), H5P_DEFAULT);
  const haddr_t off = H5Dget_offset(d);
  H5Dclose(d);
  H5Fclose(f);
  return off;
}

void patch_bytes(const std::string& file, uint64_t offset, const std::vector<uint8_t>& bytes) {
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(static_cast<std::streamoff>(offset));
  f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

// ---------------------------------------------------------------------------------------
// Promise 5: resharding

TEST(CheckpointReshard, AllSequenceDegreePairs) {
  const std::string root = make_root("seqpairs");
  int64_t step = 0;
  for (int64_t a = 1; a <= 4; ++a) {
    for (int64_t b = 1; b <= 4; ++b) {
      SCOPED_TRACE("save sp=" + std::to_string(a) + " load sp=" + std::to_string(b));
      ++step;
      save_state(root, step, Layout{1, a});
      load_and_check(root, step, Layout{1, b});
    }
  }
  remove_root(root);
}

TEST(CheckpointReshard, HeadBySequenceMeshes) {
  const std::string root = make_root("headseq");
  // hp = 3 splits 4 heads unevenly (2, 1, 1); flat ranges then use 3..12 virtual ranks.
  const std::vector<std::pair<Layout, Layout>> pairs = {
      {{2, 2}, {4, 1}}, {{4, 1}, {2, 3}}, {{2, 3}, {1, 1}}, {{1, 2}, {2, 2}},
      {{3, 1}, {1, 4}}, {{3, 4}, {2, 1}}, {{1, 1}, {3, 2}}, {{4, 3}, {3, 3}},
  };
  int64_t step = 0;
  for (const auto& [A, B] : pairs) {
    SCOPED_TRACE("save " + A.str() + " load " + B.str());
    save_state(root, ++step, A);
    load_and_check(root, step, B);
  }
  remove_root(root);
}

TEST(CheckpointReshard, LargeChunksAndRoundTripOnSameMesh) {
  // Default chunk size (one chunk per tensor here) and the identity reshard.
  const std::string root = make_root("bigchunk");
  CheckpointOptions opt;
  save_state(root, 5, Layout{2, 2}, opt);
  load_and_check(root, 5, Layout{2, 2});
  load_and_check(root + "/step_5", 5, Layout{1, 3});
  remove_root(root);
}

TEST(CheckpointReshard, ReplicatedTensorIsWrittenOnce) {
  // The ranks' written bytes add up to the tensor bytes exactly: no element written twice.
  const std::string root = make_root("writeonce");
  Communicator& c = world();
  Checkpointer ck(test::world_ptr(), small_chunks());
  Tensor w({10, 9}, DType::f64);
  for (int64_t i = 0; i < w.numel(); ++i) w.data<double>()[i] = 0.5 * i;
  ck.add_tensor("w", w, {10, 9});
  ck.save(root, 1);
  int64_t bytes = ck.last_save_bytes();
  c.all_reduce(&bytes, 1, DType::i64, ReduceOp::sum, "test");
  EXPECT_EQ(bytes, 10 * 9 * 8);
  // The replicas split the writing: every rank writes its share of the 90 elements.
  EXPECT_GT(ck.last_save_bytes(), 0);
  remove_root(root);
}

TEST(CheckpointReshard, OverlappingHoldersWriteEachElementOnce) {
  // Rank 0 holds the whole tensor, every rank also holds a flat slice of it (rank 0 twice:
  // a second piece). Distinct, overlapping holdings: each element is still written once.
  const std::string root = make_root("overlap");
  Communicator& c = world();
  const int64_t n = 1000;
  test::StateTensor st{"w", DType::f32, {n}, test::Split::replicated};
  const Tensor g = test::global_tensor(st);
  Locals keep;
  {
    Checkpointer ck(test::world_ptr(), small_chunks());
    if (c.rank() == 0) {
      keep["w"].push_back(g.clone());
      ck.add_tensor("w", keep["w"].back(), {n});
    } else {
      const ShardSpec s = ShardSpec::flat_range(chunk_begin(n, c.size(), c.rank()),
                                                chunk_begin(n, c.size(), c.rank() + 1));
      keep["w"].push_back(test::extract(g, s));
      ck.add_tensor("w", keep["w"].back(), {n}, s);
    }
    ck.save(root, 1);
    int64_t bytes = ck.last_save_bytes();
    c.all_reduce(&bytes, 1, DType::i64, ReduceOp::sum, "test");
    EXPECT_EQ(bytes, n * 4);
  }
  verify_checkpoint(c, root);
  Checkpointer ck(test::world_ptr(), small_chunks());
  Tensor back({n}, DType::f32);
  ck.add_tensor("w", back, {n});
  ck.load(root);
  EXPECT_EQ(std::memcmp(back.raw(), g.raw(), n * 4), 0);
  remove_root(root);
}

// ---------------------------------------------------------------------------------------
// Promise 3: bad files name file, tensor and chunk, on every rank

TEST(CheckpointIntegrity, FlippedByteNamesTensorAndChunk) {
  const std::string root = make_root("flip");
  save_state(root, 1, Layout{2, 1});
  const std::string file = root + "/step_1/state.h5";
  // Element 30 of opt/exp_avg_sq/embed (f64) lies in chunk 30 / 7 = 4.
  if (world().rank() == 0) {
    const uint64_t off = dataset_offset(file, "/tensors/opt/exp_avg_sq/embed");
    std::ifstream in(file, std::ios::binary);
    in.seekg(static_cast<std::streamoff>(off + 30 * 8 + 3));
    char b = 0;
    in.get(b);
    patch_bytes(file, off + 30 * 8 + 3, {static_cast<uint8_t>(b ^ 0x10)});
  }
  world().barrier();
  for (const Layout& L : {Layout{1, 1}, Layout{1, 3}}) {
    const std::string msg = expect_same_error([&] { load_and_check(root, 1, L); });
    expect_contains(msg, {file, "tensor 'opt/exp_avg_sq/embed'", "chunk 4 ", "elements [28, 35)"});
  }
  const std::string vmsg = expect_same_error([&] { verify_checkpoint(world(), root); });
  expect_contains(vmsg, {file, "tensor 'opt/exp_avg_sq/embed'", "chunk 4 "});
  remove_root(root);
}

TEST(CheckpointIntegrity, UnwrittenRegionNeverReadsAsZeros) {
  // A region left as zeros (a lost write) fails the check instead of loading as zeros.
  const std::string root = make_root("zeros");
  save_state(root, 1, Layout{1, 2});
  const std::string file = root + "/step_1/state.h5";
  if (world().rank() == 0) {
    const uint64_t off = dataset_offset(file, "/tensors/model/layers.0/wq");
    patch_bytes(file, off + 14 * 4, std::vector<uint8_t>(7 * 4, 0));  // elements [14, 21): chunk 2
  }
  world().barrier();
  const std::string msg = expect_same_error([&] { load_and_check(root, 1, Layout{2, 1}); });
  expect_contains(msg, {file, "tensor 'model/layers.0/wq'", "chunk 2 "});
  remove_root(root);
}

TEST(CheckpointIntegrity, PartialLoadIsVerifiedToo) {
  // Loading only some rows leaves chunks partly covered: they are re-read whole and checked.
  const std::string root = make_root("partial");
  save_state(root, 1, Layout{1, 1});
  const std::string file = root + "/step_1/state.h5";
  if (world().rank() == 0) {
    const uint64_t off = dataset_offset(file, "/tensors/model/embed");
    patch_bytes(file, off + 13 * 4, {0xff, 0xff, 0xff, 0x7f});  // element 13, chunk 1
  }
  world().barrier();
  Checkpointer ck(test::world_ptr());
  Tensor rows({1, test::kModel}, DType::f32);  // row 1 = elements [12, 24): chunks 1-3 partly
  ck.add_tensor("model/embed", rows, {test::kVocab, test::kModel},
                ShardSpec::hyperslab({1, 0}, {1, test::kModel}));
  LoadOptions lo;
  lo.ignore_unregistered = true;
  const std::string msg = expect_same_error([&] { ck.load(root, lo); });
  expect_contains(msg, {"tensor 'model/embed'", "chunk 1 "});
  lo.verify = false;  // the bad value then arrives as stored: proof the check was real
  ck.load(root, lo);
  uint32_t bits;
  std::memcpy(&bits, rows.data<float>() + 1, 4);
  EXPECT_EQ(bits, 0x7fffffffu);
  remove_root(root);
}

TEST(CheckpointIntegrity, TruncatedFileNamesTensorAndChunk) {
  const std::string root = make_root("trunc");
  save_state(root, 1, Layout{1, 2});
  const std::string file = root + "/step_1/state.h5";
  if (world().rank() == 0) {
    const uint64_t off = dataset_offset(file, "/tensors/opt/exp_avg_sq/embed");
    fs::resize_file(file, off + 100 * 8 + 4);  // cuts inside element 100, chunk 14
  }
  world().barrier();
  const std::string msg = expect_same_error([&] { load_and_check(root, 1, Layout{1, 2}); });
  expect_contains(msg, {file, "truncated", "tensor 'opt/exp_avg_sq/embed' chunks 14-"});
  expect_same_error([&] { verify_checkpoint(world(), root); });
  remove_root(root);
}

TEST(CheckpointIntegrity, MissingDatasetAndMissingFile) {
  const std::string root = make_root("missing");
  save_state(root, 1, Layout{1, 1});
  save_state(root, 2, Layout{1, 1});
  const std::string file1 = root + "/step_1/state.h5";
  if (world().rank() == 0) {
    std::lock_guard<std::mutex> lock(hdf5_mutex());
    hid_t f = H5Fopen(file1.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    ASSERT_GE(H5Ldelete(f, "/tensors/model/layers.0/wo", H5P_DEFAULT), 0);
    H5Fclose(f);
    fs::remove(root + "/step_2/state.h5");
  }
  world().barrier();
  std::string msg = expect_same_error([&] { load_and_check(root + "/step_1", 1, Layout{1, 2}); });
  expect_contains(msg, {file1, "tensor 'model/layers.0/wo'", "missing"});
  msg = expect_same_error([&] { load_and_check(root, 2, Layout{1, 2}); });
  expect_contains(msg, {root + "/step_2", "state.h5 is missing"});
  remove_root(root);
}

TEST(CheckpointIntegrity, EditedMetadataAndMissingHashesFail) {
  const std::string root = make_root("meta");
  save_state(root, 1, Layout{1, 1});
  save_state(root, 2, Layout{1, 1});
  if (world().rank() == 0) {
    std::lock_guard<std::mutex> lock(hdf5_mutex());
    hid_t f = H5Fopen((root + "/step_1/state.h5").c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    hid_t d = H5Dopen2(f, "/meta/step", H5P_DEFAULT);
    const int64_t wrong = 99;
    H5Dwrite(d, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, &wrong);
    H5Dclose(d);
    H5Fclose(f);
    f = H5Fopen((root + "/step_2/state.h5").c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    H5Ldelete(f, "/integrity/opt/step", H5P_DEFAULT);
    H5Fclose(f);
  }
  world().barrier();
  std::string msg = expect_same_error([&] { load_and_check(root + "/step_1", 1, Layout{1, 1}); });
  expect_contains(msg, {"step_1/state.h5", "metadata fails its integrity hash"});
  msg = expect_same_error([&] { load_and_check(root + "/step_2", 2, Layout{1, 1}); });
  expect_contains(msg, {"step_2/state.h5", "tensor 'opt/step'", "integrity hashes", "missing"});
  remove_root(root);
}

TEST(CheckpointIntegrity, AnyFlippedFileByteIsCaughtOrHarmless) {
  // Every byte outside the tensor data (HDF5 structure, attributes, hashes, metadata) is
  // flipped in turn (every 3rd non-zero byte, every 16th zero byte): verify must fail with an
  // iha::Error, or the checkpoint must still load bit-exactly. Never a hang, never a crash
  // (a flipped byte in HDF5's unchecksummed global heap used to hang HDF5 forever).
  const std::string root = make_root("sweep");
  save_state(root, 1, Layout{1, 1});
  auto self = world().split(world().rank(), 0);
  if (world().rank() == 0) {
    const std::string dir = root + "/step_1", copy = root + "/copy";
    std::ifstream in(dir + "/state.h5", std::ios::binary);
    const std::vector<char> good((std::istreambuf_iterator<char>(in)), {});
    std::vector<std::pair<uint64_t, uint64_t>> data;
    for (const auto& t : test::state_tensors()) {
      if (shape_numel(t.shape) == 0) continue;
      const uint64_t off = dataset_offset(dir + "/state.h5", "/tensors/" + t.name);
      data.push_back({off, off + shape_numel(t.shape) * dtype_size(t.dtype)});
    }
    fs::create_directories(copy);
    fs::copy_file(dir + "/manifest.json", copy + "/manifest.json");
    int flipped = 0, caught = 0, zeros_seen = 0;
    for (size_t o = 0; o < good.size(); ++o) {
      bool in_data = false;
      for (const auto& [b, e] : data) in_data = in_data || (o >= b && o < e);
      if (in_data) continue;
      if (good[o] == 0 ? (zeros_seen++ % 16 != 0) : (o % 3 != 0)) continue;
      std::vector<char> bad = good;
      bad[o] ^= 0x01;
      std::ofstream(copy + "/state.h5", std::ios::binary | std::ios::trunc).write(bad.data(), bad.size());
      ++flipped;
      try {
        verify_checkpoint(*self, copy);
      } catch (const Error&) {
        ++caught;
        continue;
      }
      Checkpointer ck(self);
      Locals locals;
      test::register_state(ck, Layout{1, 1}, 0, 1, false, locals);
      const CheckpointInfo info = ck.load(copy);
      EXPECT_EQ(test::check_state(Layout{1, 1}, 0, 1, locals), "") << "byte " << o;
      EXPECT_TRUE(info.meta == test::state_meta(1)) << "byte " << o;
    }
    EXPECT_GT(flipped, 1000);
    EXPECT_GT(caught, flipped / 2);  // nearly every non-zero byte matters
  }
  remove_root(root);
}

TEST(CheckpointIntegrity, BadPaths) {
  const std::string root = make_root("paths");
  std::string msg = expect_same_error([&] { load_and_check(root + "/nope", 1, Layout{}); });
  expect_contains(msg, {root + "/nope", "does not exist"});
  msg = expect_same_error([&] { load_and_check(root, 1, Layout{}); });
  expect_contains(msg, {"neither a checkpoint directory", "latest"});
  if (world().rank() == 0) std::ofstream(root + "/latest") << "step_8\n";
  world().barrier();
  msg = expect_same_error([&] { load_and_check(root, 1, Layout{}); });
  expect_contains(msg, {"latest names step_8, which does not exist"});
  remove_root(root);
}

TEST(CheckpointIntegrity, VerifyAndInspectAGoodCheckpoint) {
  const std::string root = make_root("verify");
  save_state(root, 3, Layout{2, 2});
  const VerifyReport rep = verify_checkpoint(world(), root);
  EXPECT_EQ(rep.tensors, static_cast<int64_t>(test::state_tensors().size()));
  int64_t bytes = 0, chunks = 0;
  for (const auto& t : test::state_tensors()) {
    bytes += shape_numel(t.shape) * dtype_size(t.dtype);
    chunks += (shape_numel(t.shape) + 6) / 7;
  }
  EXPECT_EQ(rep.bytes, bytes);
  EXPECT_EQ(rep.chunks, chunks);
  Checkpointer ck(test::world_ptr());
  const CheckpointInfo info = ck.inspect(root);
  EXPECT_EQ(info.step, 3);
  EXPECT_EQ(info.writer_ranks, world().size());
  EXPECT_EQ(info.hash_chunk_elems, 7);
  for (const auto& t : test::state_tensors()) {
    const TensorInfo* ti = info.find_tensor(t.name);
    ASSERT_NE(ti, nullptr) << t.name;
    EXPECT_EQ(ti->shape, t.shape);
    EXPECT_EQ(ti->dtype, t.dtype);
  }
  EXPECT_EQ(info.get<std::string>("config"), std::get<std::string>(test::state_meta(3)["config"]));
  EXPECT_THROW(info.get<int64_t>("config"), ConfigError);
  EXPECT_THROW(info.get<int64_t>("absent"), ConfigError);
  if (world().rank() == 0) {
    EXPECT_EQ(inspect_checkpoint(root).tensors.size(), info.tensors.size());
  }
  remove_root(root);
}

// ---------------------------------------------------------------------------------------
// Promise 6: dtype rules

TEST(CheckpointDtype, NarrowingNeedsPermissionWideningIsExact) {
  const std::string root = make_root("dtype");
  {
    Checkpointer ck(test::world_ptr());
    Tensor f32({5}, DType::f32), b16({4}, DType::bf16), f64({3}, DType::f64), i32({2}, DType::i32);
    const float fv[5] = {1.0f, 1.00390625f, -3.0e-3f, 1.0e30f, 0.1f};
    std::memcpy(f32.raw(), fv, sizeof fv);
    for (int i = 0; i < 4; ++i) b16.data<bf16>()[i] = bf16::from_float(0.375f * (i - 1));
    const double dv[3] = {1.0 + 0x1.0p-30, -2.5e-40, 1e300};
    std::memcpy(f64.raw(), dv, sizeof dv);
    i32.data<int32_t>()[0] = -7;
    i32.data<int32_t>()[1] = 1 << 30;
    ck.add_tensor("f32", f32, {5});
    ck.add_tensor("b16", b16, {4});
    ck.add_tensor("f64", f64, {3});
    ck.add_tensor("i32", i32, {2});
    ck.save(root, 1);
  }
  // f32 -> bf16 and f64 -> f32 are refused by default, naming the tensor and the option.
  Checkpointer ck(test::world_ptr());
  Tensor f32_as_b16({5}, DType::bf16), b16_as_f32({4}, DType::f32), f64_as_f32({3}, DType::f32),
      i32_as_i64({2}, DType::i64);
  ck.add_tensor("f32", f32_as_b16, {5});
  ck.add_tensor("b16", b16_as_f32, {4});
  ck.add_tensor("f64", f64_as_f32, {3});
  ck.add_tensor("i32", i32_as_i64, {2});
  const std::string msg = expect_same_error([&] { ck.load(root); });
  expect_contains(msg, {"tensor 'f32'", "stored as f32", "bf16", "allow_narrowing"});
  LoadOptions allow;
  allow.allow_narrowing = true;
  ck.load(root, allow);
  const float fv[5] = {1.0f, 1.00390625f, -3.0e-3f, 1.0e30f, 0.1f};
  for (int i = 0; i < 5; ++i) EXPECT_EQ(f32_as_b16.data<bf16>()[i].bits, bf16::from_float(fv[i]).bits);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(b16_as_f32.data<float>()[i], 0.375f * (i - 1));
  EXPECT_EQ(f64_as_f32.data<float>()[0], 1.0f);
  EXPECT_EQ(f64_as_f32.data<float>()[1], static_cast<float>(-2.5e-40));
  EXPECT_TRUE(std::isinf(f64_as_f32.data<float>()[2]));
  EXPECT_EQ(i32_as_i64.data<int64_t>()[0], -7);
  EXPECT_EQ(i32_as_i64.data<int64_t>()[1], int64_t(1) << 30);

  // Widening alone needs no permission; integers never become floats.
  Checkpointer wide(test::world_ptr());
  Tensor b16_as_f64({4}, DType::f64), i32_as_f32({2}, DType::f32);
  wide.add_tensor("b16", b16_as_f64, {4});
  LoadOptions skip;
  skip.ignore_unregistered = true;
  wide.load(root, skip);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(b16_as_f64.data<double>()[i], 0.375 * (i - 1));
  wide.add_tensor("i32", i32_as_f32, {2});
  expect_contains(expect_same_error([&] { wide.load(root, skip); }),
                  {"tensor 'i32'", "stored as i32", "cannot be loaded into f32"});
  remove_root(root);
}

TEST(CheckpointDtype, ShapeMismatchAndUnregisteredTensors) {
  const std::string root = make_root("shape");
  save_state(root, 1, Layout{1, 1});
  Checkpointer ck(test::world_ptr());
  Tensor e({test::kVocab + 1, test::kModel}, DType::f32);
  ck.add_tensor("model/embed", e, {test::kVocab + 1, test::kModel});
  LoadOptions lo;
  lo.ignore_unregistered = true;
  expect_contains(expect_same_error([&] { ck.load(root, lo); }),
                  {"tensor 'model/embed'", "shape [37, 12]", "[38, 12]"});
  Checkpointer only(test::world_ptr());
  Tensor step({}, DType::i64);
  only.add_tensor("opt/step", step, {});
  expect_contains(expect_same_error([&] { only.load(root); }),
                  {"holds tensor 'data/mask' which is not registered", "ignore_unregistered"});
  only.load(root, lo);
  test::StateTensor st{"opt/step", DType::i64, {}, test::Split::replicated};
  EXPECT_EQ(std::memcmp(step.raw(), test::global_tensor(st).raw(), 8), 0);
  remove_root(root);
}

// ---------------------------------------------------------------------------------------
// Promises 2 and 7: failures become the same error on every rank, nothing left behind

void expect_previous_intact(const std::string& root, int64_t step) {
  EXPECT_EQ(latest_of(root), "step_" + std::to_string(step));
  for (const std::string& e : entries(root))
    EXPECT_TRUE(e == "latest" || (e.rfind("step_", 0) == 0 && e.find(".tmp") == std::string::npos))
        << "left behind: " << e;
  load_and_check(root, step, Layout{1, 2});
}

TEST(CheckpointFailure, InjectedFailureOnAnyRankAnyPhase) {
  const std::string root = make_root("inject");
  Communicator& c = world();
  save_state(root, 1, Layout{1, 2});
  int64_t step = 1;
  const std::vector<std::pair<std::string, int>> cases = {
      {"begin", c.size() - 1}, {"created", c.size() - 1}, {"data_half", 0},
      {"data_half", c.size() - 1}, {"data_done", c.size() / 2}, {"manifest", 0}, {"renamed", 0}};
  for (const auto& [phase, rank] : cases) {
    SCOPED_TRACE(phase + " on rank " + std::to_string(rank));
    ::setenv("IHA_CKPT_FAIL", (phase + ":" + std::to_string(rank)).c_str(), 1);
    const std::string msg = expect_same_error([&] { save_state(root, step + 1, Layout{2, 2}); });
    ::unsetenv("IHA_CKPT_FAIL");
    expect_contains(msg, {"injected failure", "'" + phase + "'", "rank " + std::to_string(rank)});
    world().barrier();
    expect_previous_intact(root, step);
  }
  // A malformed hook on one rank only is still one error everywhere, not a hang.
  if (c.rank() == c.size() - 1) ::setenv("IHA_CKPT_FAIL", "data_half", 1);
  expect_contains(expect_same_error([&] { save_state(root, step + 1, Layout{2, 2}); }),
                  {"IHA_CKPT_FAIL='data_half'", "expected <phase>:<rank>"});
  ::unsetenv("IHA_CKPT_FAIL");
  save_state(root, ++step, Layout{2, 2});
  expect_previous_intact(root, step);
  remove_root(root);
}

TEST(CheckpointFailure, FileSizeLimitOnOneRank) {
  // RLIMIT_FSIZE with SIGXFSZ ignored: writes past the limit fail with EFBIG (disk full
  // behaves the same way: a failing write).
  const std::string root = make_root("fsize");
  Communicator& c = world();
  const int64_t n = 1 << 17;  // 512 KiB of f32
  auto save_big = [&](int64_t step) {
    Checkpointer ck(test::world_ptr());
    Tensor big({chunk_begin(n, c.size(), c.rank() + 1) - chunk_begin(n, c.size(), c.rank())},
               DType::f32);
    ck.add_tensor("big", big, {n},
                  ShardSpec::flat_range(chunk_begin(n, c.size(), c.rank()),
                                        chunk_begin(n, c.size(), c.rank() + 1)));
    ck.save(root, step);
  };
  save_big(1);
  ::signal(SIGXFSZ, SIG_IGN);
  for (int k = 0; k < c.size(); ++k) {
    SCOPED_TRACE("limit on rank " + std::to_string(k));
    rlimit old;
    getrlimit(RLIMIT_FSIZE, &old);
    if (c.rank() == k) {
      rlimit lim = old;
      // Rank 0 fails when HDF5 sizes the new file; other ranks when writing their part,
      // which lies beyond this limit.
      lim.rlim_cur = 4096 + (k == 0 ? 0 : static_cast<rlim_t>(4 * n / c.size()) * k / 2);
      ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &lim), 0);
    }
    const std::string msg = expect_same_error([&] { save_big(2); });
    if (c.rank() == k) setrlimit(RLIMIT_FSIZE, &old);
    expect_contains(msg, {root + "/step_2.tmp-"});
    if (c.size() > 1) expect_contains(msg, {"rank " + std::to_string(k) + ": "});
    if (k > 0) expect_contains(msg, {"File too large", "tensor 'big'"});
    world().barrier();
    EXPECT_EQ(latest_of(root), "step_1");
    EXPECT_EQ(entries(root), (std::set<std::string>{"latest", "step_1"}));
  }
  ::signal(SIGXFSZ, SIG_DFL);
  verify_checkpoint(world(), root);
  remove_root(root);
}

TEST(CheckpointFailure, MismatchedRegistrationsFailEverywhere) {
  Communicator& c = world();
  if (c.size() < 2) GTEST_SKIP() << "needs two ranks to disagree";
  const std::string root = make_root("mismatch");
  {
    Checkpointer ck(test::world_ptr());
    Tensor w({4, c.rank() == 1 ? 9 : 8}, DType::f32);
    ck.add_tensor("w", w, w.shape());
    expect_contains(expect_same_error([&] { ck.save(root, 1); }),
                    {"rank 1", "tensor 'w' is f32 [4, 9] here but f32 [4, 8] on rank 0"});
  }
  {
    Checkpointer ck(test::world_ptr());
    Tensor w({4}, DType::f32);
    ck.add_tensor("w", w, {4});
    ck.set_meta("seed", int64_t(c.rank() == c.size() - 1 ? 5 : 4));
    expect_contains(expect_same_error([&] { ck.save(root, 1); }),
                    {"rank " + std::to_string(c.size() - 1), "metadata differs: 'seed'"});
  }
  {
    // Two ranks claim the same range of a sharded tensor: an overlap, caught before writing.
    Checkpointer ck(test::world_ptr());
    Tensor w({4}, DType::f32);
    const int64_t b = c.rank() == 1 ? 0 : 4 * c.rank();
    ck.add_tensor("w", w, {4 * c.size()}, ShardSpec::flat_range(b, b + 4));
    expect_contains(expect_same_error([&] { ck.save(root, 1); }),
                    {"cannot save tensor 'w'", "not covered exactly once"});
  }
  EXPECT_TRUE(entries(root).empty());
  remove_root(root);
}

TEST(CheckpointFailure, GapsAndBadShardsAreRefused) {
  const std::string root = make_root("gaps");
  Communicator& c = world();
  {
    Checkpointer ck(test::world_ptr());
    Tensor w({2}, DType::f64);
    // Element 2R (the last) belongs to nobody.
    ck.add_tensor("w", w, {2 * c.size() + 1}, ShardSpec::flat_range(2 * c.rank(), 2 * c.rank() + 2));
    expect_contains(expect_same_error([&] { ck.save(root, 1); }),
                    {"tensor 'w'", "held by no rank"});
  }
  Checkpointer ck(test::world_ptr());
  Tensor w({3, 3}, DType::f32);
  EXPECT_THROW(ck.add_tensor("w", w, {4, 4}, ShardSpec::hyperslab({2, 0}, {3, 3})), ConfigError);
  EXPECT_THROW(ck.add_tensor("w", w, {4, 4}, ShardSpec::flat_range(0, 8)), ConfigError);
  EXPECT_THROW(ck.add_tensor("bad name", w, {3, 3}), ConfigError);
  ck.add_tensor("a/b", w, {3, 3});
  EXPECT_THROW(ck.add_tensor("a", w, {3, 3}), ConfigError);
  EXPECT_THROW(ck.set_meta("x", std::string("a\0b", 3)), ConfigError);
  remove_root(root);
}

// ---------------------------------------------------------------------------------------
// Promises 1, 4, 8: commit protocol (the crash tests are in crash_test.cmake)

TEST(CheckpointCommit, KeepsLastKAndNeverWhatLatestNames) {
  const std::string root = make_root("keep");
  for (int64_t s = 1; s <= 5; ++s) {
    save_state(root, s, Layout{1, 2}, small_chunks(2));
    std::set<std::string> want = {"latest", "step_" + std::to_string(s)};
    if (s > 1) want.insert("step_" + std::to_string(s - 1));
    EXPECT_EQ(entries(root), want);
    EXPECT_EQ(latest_of(root), "step_" + std::to_string(s));
  }
  // Saving an older step again (a restart from an earlier checkpoint) keeps it: latest names it.
  save_state(root, 2, Layout{1, 2}, small_chunks(2));
  EXPECT_EQ(entries(root), (std::set<std::string>{"latest", "step_2", "step_4", "step_5"}));
  load_and_check(root, 2, Layout{1, 1});
  // The same step twice is refused.
  expect_contains(expect_same_error([&] { save_state(root, 5, Layout{1, 2}); }),
                  {"step 5 already exists"});
  remove_root(root);
}

TEST(CheckpointCommit, LeftoverTemporariesDoNotBlockASave) {
  const std::string root = make_root("leftover");
  save_state(root, 1, Layout{1, 1});
  // The protocol's temporaries carry 16 hex digits; a user's look-alikes are not removed.
  if (world().rank() == 0) {
    fs::create_directories(root + "/step_2.tmp-00000000deadbeef");
    std::ofstream(root + "/step_2.tmp-00000000deadbeef/state.h5") << "half a file";
    std::ofstream(root + "/latest.tmp-00000000deadbeef") << "step_2";
    fs::create_directories(root + "/step_0.tmp-del-0000000000000000");
    fs::create_directories(root + "/thesis.tmp-draft");
    std::ofstream(root + "/step_3.tmp-mine") << "mine";
  }
  world().barrier();
  save_state(root, 2, Layout{1, 1});
  EXPECT_EQ(entries(root), (std::set<std::string>{"latest", "step_1", "step_2", "thesis.tmp-draft", "step_3.tmp-mine"}));
  load_and_check(root, 2, Layout{1, 3});
  remove_root(root);
}

TEST(CheckpointCommit, FailureAfterLatestIsReplacedKeepsTheCommittedStep) {
  // The root's fsync after `latest` was replaced fails (injected there): the new step is what
  // `latest` names, so it must stay; the error says it was committed.
  const std::string root = make_root("latest_sync");
  save_state(root, 1, Layout{1, 2});
  ::setenv("IHA_CKPT_FAIL", "latest_renamed:0", 1);
  const std::string msg = expect_same_error([&] { save_state(root, 2, Layout{1, 2}); });
  ::unsetenv("IHA_CKPT_FAIL");
  expect_contains(msg, {"step 2 was committed to " + root + "/step_2", "injected failure"});
  world().barrier();
  EXPECT_EQ(latest_of(root), "step_2");
  load_and_check(root, 2, Layout{1, 1});
  remove_root(root);
}

// ---------------------------------------------------------------------------------------
// The checkpoint-root protocol (root.h): recovery of what each crash point leaves

// Points `latest` at `name` as a crash before its update would have left it.
void set_latest(const std::string& root, const std::string& name) {
  if (world().rank() == 0) {
    if (name.empty())
      fs::remove(root + "/latest");
    else
      std::ofstream(root + "/latest") << name << "\n";
  }
  world().barrier();
}

TEST(CheckpointRoot, CompleteStepNewerThanLatestIsVerifiedAndAdopted) {
  const std::string root = make_root("adopt");
  save_state(root, 1, Layout{1, 2});
  save_state(root, 2, Layout{2, 1});
  set_latest(root, "step_1");  // crash between the rename of step_2 and the update of latest
  {
    CheckpointRoot r(world(), root, kRootName, RootUse::resume);
    EXPECT_TRUE(r.resume());
    ASSERT_EQ(r.notes().size(), 1u);
    expect_contains(r.notes()[0], {"recovered " + root + "/step_2", "adopted"});
  }
  EXPECT_EQ(latest_of(root), "step_2");
  load_and_check(root, 2, Layout{1, 3});
  // Recovered once: the next open has nothing to do, and the next save proceeds.
  {
    CheckpointRoot r(world(), root, kRootName, RootUse::resume);
    EXPECT_TRUE(r.notes().empty());
    save_state(root, 3, Layout{1, 2});
  }
  EXPECT_EQ(latest_of(root), "step_3");
  remove_root(root);
}

TEST(CheckpointRoot, DamagedNewerStepIsSetAsideNotLoopedOn) {
  const std::string root = make_root("aside");
  save_state(root, 1, Layout{1, 2});
  save_state(root, 2, Layout{1, 2});
  save_state(root, 3, Layout{1, 2});
  set_latest(root, "step_1");
  if (world().rank() == 0) {  // step_3 damaged: one data byte flipped
    const std::string file = root + "/step_3/state.h5";
    const uint64_t off = dataset_offset(file, "/tensors/opt/exp_avg_sq/embed");
    std::ifstream in(file, std::ios::binary);
    in.seekg(static_cast<std::streamoff>(off + 5));
    char b = 0;
    in.get(b);
    patch_bytes(file, off + 5, {static_cast<uint8_t>(b ^ 0x01)});
  }
  world().barrier();
  {
    CheckpointRoot r(world(), root, kRootName, RootUse::resume_auto);
    EXPECT_TRUE(r.resume());
    ASSERT_EQ(r.notes().size(), 2u);
    expect_contains(r.notes()[0], {"set aside " + root + "/step_3 as step_3.rejected",
                                   "fails its integrity check"});
    expect_contains(r.notes()[1], {"recovered " + root + "/step_2"});
  }
  EXPECT_EQ(latest_of(root), "step_2");
  EXPECT_EQ(entries(root), (std::set<std::string>{"latest", "step_1", "step_2", "step_3.rejected"}));
  {
    CheckpointRoot r(world(), root, kRootName, RootUse::resume_auto);
    EXPECT_TRUE(r.notes().empty());
  }
  // The set-aside directory is neither pruned nor in the way of a save of step 3.
  save_state(root, 3, Layout{1, 2}, small_chunks(1));
  EXPECT_EQ(entries(root), (std::set<std::string>{"latest", "step_3", "step_3.rejected"}));
  remove_root(root);
}

TEST(CheckpointRoot, StepsWithoutLatestAreRefusedFreshAndAdoptedOnResume) {
  const std::string root = make_root("nolatest");
  save_state(root, 4, Layout{1, 2});
  set_latest(root, "");  // a crash during the first commit
  const std::set<std::string> before = entries(root);
  world().barrier();  // every rank has looked before rank 0 opens the root
  const std::string msg = expect_same_error(
      [&] { CheckpointRoot r(world(), root, kRootName, RootUse::fresh); });
  expect_contains(msg, {"config key 'checkpoint.dir' = '" + root + "'", "step_4, no 'latest'",
                        "--resume"});
  EXPECT_EQ(entries(root), before);  // a refused fresh run changes nothing
  {
    CheckpointRoot r(world(), root, kRootName, RootUse::resume_auto);
    EXPECT_TRUE(r.resume());
  }
  EXPECT_EQ(latest_of(root), "step_4");
  remove_root(root);
}

// The save of a run that stamps its checkpoints with `run_id` (as iha-train does).
std::string save_of_run(const std::string& root, int64_t step, const std::string& run_id) {
  Communicator& c = world();
  Checkpointer ck(test::world_ptr(), small_chunks());
  Locals locals;
  test::register_state(ck, Layout{1, 2}, c.rank(), c.size(), true, locals);
  for (const auto& [k, v] : test::state_meta(step)) ck.set_meta(k, v);
  ck.set_meta(kRunIdMeta, run_id);
  return ck.save(root, step);
}

// What the root's record of its run holds ("" if there is none).
std::string record_of(const std::string& root) {
  std::ifstream in(root + "/" + ckpt::kRunRecord);
  std::string s;
  in >> s;
  return s;
}

// Moves a step directory of another root into root (rank 0), as a user copying one in.
void move_in(const std::string& from, const std::string& root, const std::string& name) {
  if (world().rank() == 0) fs::rename(from + "/" + name, root + "/" + name);
  world().barrier();
}

TEST(CheckpointRoot, AnotherRunsStepWithoutLatestIsSetAsideByTheRootsRecord) {
  // This run opened the root (its record written) and died before its first save committed;
  // another run's step directory is then moved in. No `latest`: the record says whose it is.
  const std::string root = make_root("foreign_nolatest");
  const std::string theirs = make_root("foreign_theirs");
  std::string mine;
  {
    CheckpointRoot r(world(), root, kRootName, RootUse::fresh);
    mine = r.run_id();
  }
  EXPECT_EQ(mine.size(), 16u);
  EXPECT_EQ(record_of(root), mine);
  save_of_run(theirs, 3, "0123456789abcdef");
  move_in(theirs, root, "step_3");
  {
    CheckpointRoot r(world(), root, kRootName, RootUse::resume_auto);
    EXPECT_FALSE(r.resume());
    ASSERT_EQ(r.notes().size(), 1u);
    expect_contains(r.notes()[0], {"set aside " + root + "/step_3 as step_3.rejected", "another run",
                                   "0123456789abcdef", mine, root + "/run"});
    EXPECT_NE(r.run_id(), mine);  // it starts fresh: a new run
    EXPECT_EQ(record_of(root), r.run_id());
  }
  EXPECT_EQ(entries(root), (std::set<std::string>{"run", "step_3.rejected"}));
  EXPECT_EQ(latest_of(root), "");
  // A step directory that names a run, in a root that records none and has no `latest`: whose
  // it is cannot be shown, so it is set aside too.
  const std::string bare = make_root("foreign_bare");
  save_of_run(theirs, 4, "0123456789abcdef");
  move_in(theirs, bare, "step_4");
  {
    CheckpointRoot r(world(), bare, kRootName, RootUse::resume_auto);
    EXPECT_FALSE(r.resume());
    ASSERT_EQ(r.notes().size(), 1u);
    expect_contains(r.notes()[0], {"set aside " + bare + "/step_4 as step_4.rejected",
                                   "says which run owns the root"});
  }
  EXPECT_EQ(entries(bare), (std::set<std::string>{"run", "step_4.rejected"}));
  remove_root(bare);
  remove_root(theirs);
  remove_root(root);
}

TEST(CheckpointRoot, OwnInterruptedFirstSaveIsAdoptedByTheRootsRecord) {
  // A crash between the rename of the first step directory and the writing of `latest` (the
  // state IHA_CKPT_CRASH=renamed leaves; ckpt_crash_first_save_np2 kills a real run there).
  const std::string root = make_root("own_first");
  std::string mine;
  {
    CheckpointRoot r(world(), root, kRootName, RootUse::resume_auto);
    EXPECT_FALSE(r.resume());
    mine = r.run_id();
    save_of_run(root, 5, mine);
  }
  set_latest(root, "");
  {
    CheckpointRoot r(world(), root, kRootName, RootUse::resume);
    EXPECT_TRUE(r.resume());
    ASSERT_EQ(r.notes().size(), 1u);
    expect_contains(r.notes()[0], {"recovered " + root + "/step_5", "adopted"});
    EXPECT_EQ(r.run_id(), mine);  // the run continues under its id
  }
  EXPECT_EQ(latest_of(root), "step_5");
  EXPECT_EQ(record_of(root), mine);
  EXPECT_EQ(entries(root), (std::set<std::string>{"latest", "run", "step_5"}));
  remove_root(root);
}

TEST(CheckpointRoot, StepWithoutRunIdNextToLatestWithOneIsSetAside) {
  const std::string root = make_root("no_run_id");
  const std::string theirs = make_root("no_run_id_theirs");
  save_of_run(root, 1, "00000000000000aa");
  save_state(theirs, 2, Layout{1, 2});  // a writer that sets no run_id
  move_in(theirs, root, "step_2");
  {
    CheckpointRoot r(world(), root, kRootName, RootUse::resume);
    EXPECT_TRUE(r.resume());
    ASSERT_EQ(r.notes().size(), 1u);
    expect_contains(r.notes()[0], {"set aside " + root + "/step_2 as step_2.rejected",
                                   "carries no run_id", "00000000000000aa", "step_1, which 'latest' names"});
    EXPECT_EQ(r.run_id(), "00000000000000aa");
  }
  EXPECT_EQ(latest_of(root), "step_1");
  // Resuming recorded the run that owns the root (it had no record: an older writer's root).
  EXPECT_EQ(record_of(root), "00000000000000aa");
  EXPECT_EQ(entries(root), (std::set<std::string>{"latest", "run", "step_1", "step_2.rejected"}));
  remove_root(theirs);
  remove_root(root);
}

TEST(CheckpointRoot, ALinkedOrDamagedRecordIsRefusedNamingTheFile) {
  const std::string root = make_root("bad_record");
  if (world().rank() == 0) {
    std::ofstream(root + "/users.txt") << "precious";
    fs::create_symlink(root + "/users.txt", root + "/run");
  }
  world().barrier();
  expect_contains(expect_same_error([&] {
                    CheckpointRoot r(world(), root, kRootName, RootUse::resume_auto);
                  }),
                  {root + "/run is a symbolic link", "checkpoint.dir"});
  if (world().rank() == 0) {
    fs::remove(root + "/run");
    std::ofstream out(root + "/run");
    for (int i = 0; i < 1000; ++i) out << "garbage ";
  }
  world().barrier();
  const std::string msg = expect_same_error(
      [&] { CheckpointRoot r(world(), root, kRootName, RootUse::resume_auto); });
  expect_contains(msg, {root + "/run is 8000 bytes long"});
  EXPECT_LT(msg.size(), 400u);
  std::ifstream in(root + "/users.txt");
  std::string kept;
  in >> kept;
  EXPECT_EQ(kept, "precious");
  remove_root(root);
}

TEST(CheckpointRoot, EmptyRootResumeAutoStartsFreshResumeRefuses) {
  const std::string root = make_root("empty");
  {
    CheckpointRoot r(world(), root, kRootName, RootUse::resume_auto);
    EXPECT_FALSE(r.resume());
  }
  expect_contains(expect_same_error([&] {
                    CheckpointRoot r(world(), root, kRootName, RootUse::resume);
                  }),
                  {"--resume", "holds no checkpoint"});
  remove_root(root);
}

TEST(CheckpointRoot, DamagedLatestAndBadRootsNameTheFileAndKey) {
  const std::string root = make_root("badlatest");
  save_state(root, 1, Layout{1, 2});
  if (world().rank() == 0) {  // a huge garbage `latest` is not echoed into the message
    std::ofstream out(root + "/latest");
    for (int i = 0; i < 100000; ++i) out << "garbage ";
  }
  world().barrier();
  std::string msg = expect_same_error([&] { CheckpointRoot r(world(), root, kRootName, RootUse::resume); });
  expect_contains(msg, {root + "/latest is 800000 bytes long", "checkpoint.dir"});
  EXPECT_LT(msg.size(), 400u);
  msg = expect_same_error([&] { load_and_check(root, 1, Layout{1, 1}); });
  EXPECT_LT(msg.size(), 400u);
  set_latest(root, "step_9");
  expect_contains(expect_same_error([&] { CheckpointRoot r(world(), root, kRootName, RootUse::resume); }),
                  {"names step_9, which does not exist"});
  // A root that is a file fails before anything else, naming the key.
  if (world().rank() == 0) std::ofstream(root + "/plain") << "x";
  world().barrier();
  expect_contains(expect_same_error([&] {
                    CheckpointRoot r(world(), root + "/plain", kRootName, RootUse::fresh);
                  }),
                  {"config key 'checkpoint.dir'", "a file of that name exists"});
  remove_root(root);
}

// ---------------------------------------------------------------------------------------
// Promise 9: asynchronous save

TEST(CheckpointAsync, SavesTheStateAtTheCallNotLater) {
  const std::string root = make_root("async");
  Communicator& c = world();
  CheckpointOptions opt = small_chunks();
  opt.async = true;
  {
    Checkpointer ck(test::world_ptr(), opt);
    Locals locals;
    const Layout L{2, 2};
    test::register_state(ck, L, c.rank(), c.size(), true, locals);
    for (const auto& [k, v] : test::state_meta(1)) ck.set_meta(k, v);
    EXPECT_EQ(ck.save(root, 1), root + "/step_1");
    // Training moves on at once: overwrite every tensor with the next step's values.
    Locals next;
    Checkpointer scratch(test::world_ptr());
    test::register_state(scratch, L, c.rank(), c.size(), true, next, /*salt=*/1);
    for (auto& [name, pieces] : locals)
      for (size_t k = 0; k < pieces.size(); ++k) pieces[k].copy_from(next[name][k]);
    ck.set_meta("step", int64_t(2));
    ck.wait();
    // A second async save after the first: waits for nothing, writes the new values.
    ck.save(root, 2);
  }  // the destructor waits
  load_and_check(root + "/step_1", 1, Layout{1, 3});
  Checkpointer ck(test::world_ptr(), small_chunks());
  Locals locals;
  test::register_state(ck, Layout{1, 3}, c.rank(), c.size(), false, locals);
  const CheckpointInfo info = ck.load(root);
  EXPECT_EQ(info.step, 2);
  EXPECT_EQ(info.get<int64_t>("step"), 2);
  EXPECT_EQ(test::check_state(Layout{1, 3}, c.rank(), c.size(), locals, 1), "");
  remove_root(root);
}

TEST(CheckpointAsync, BackgroundFailureSurfacesOnEveryRank) {
  const std::string root = make_root("asyncfail");
  Communicator& c = world();
  CheckpointOptions opt = small_chunks();
  opt.async = true;
  Checkpointer ck(test::world_ptr(), opt);
  Locals locals;
  test::register_state(ck, Layout{1, 2}, c.rank(), c.size(), true, locals);
  for (const auto& [k, v] : test::state_meta(1)) ck.set_meta(k, v);
  ck.save(root, 1);
  ck.wait();
  // At the next checkpoint call...
  ::setenv("IHA_CKPT_FAIL", ("data_done:" + std::to_string(c.size() - 1)).c_str(), 1);
  ck.save(root, 2);  // returns: the failure happens in the background
  ::unsetenv("IHA_CKPT_FAIL");
  expect_contains(expect_same_error([&] { ck.save(root, 3); }), {"injected failure", "data_done"});
  // ...or at wait().
  ::setenv("IHA_CKPT_FAIL", "created:0", 1);
  ck.save(root, 4);
  ::unsetenv("IHA_CKPT_FAIL");
  expect_contains(expect_same_error([&] { ck.wait(); }), {"injected failure", "created"});
  ck.wait();  // reported once
  world().barrier();
  expect_previous_intact(root, 1);
  remove_root(root);
}

}  // namespace
}  // namespace iha
