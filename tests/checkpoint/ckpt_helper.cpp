// Test driver run under mpiexec by the cross-run, crash and interoperability tests
// (tests/checkpoint/CMakeLists.txt). The state is model_state.h's, with values salted by the
// step, so a checkpoint of one step can never pass for another.
//
//   ckpt_helper save ROOT STEP HP SP [--fresh] [--dump DIR]
//       saves the state laid out on mesh HP x SP; --fresh empties ROOT first; --dump writes
//       every global tensor's raw bytes and an index.json (the oracle for check_h5py.py)
//   ckpt_helper load PATH STEP HP SP
//       loads PATH (root or step directory) on mesh HP x SP and checks every piece and the
//       metadata against the generator for STEP
//   ckpt_helper save_run ROOT STEP HP SP
//       as a command that writes ROOT: opens it (CheckpointRoot, RootUse::resume_auto), then
//       saves STEP stamped with the run id the root records (kRunIdMeta), as iha-train does
//   ckpt_helper check_then_save ROOT STEP NEW_STEP HP SP
//       open ROOT as every resuming command does (CheckpointRoot, RootUse::resume: lock,
//       recovery), load its latest (must be STEP), then save NEW_STEP and check that no
//       temporary is left in ROOT (the crash test's recovery run)
// Exit status 0 on success; 1 with a message on stderr (rank 0) otherwise.
#include <mpi.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "checkpoint/root.h"
#include "model_state.h"

namespace fs = std::filesystem;
using namespace iha;
using Locals = std::map<std::string, std::vector<Tensor>>;

namespace {

void save(Communicator& c, std::shared_ptr<Communicator> world, const std::string& root,
          int64_t step, const test::Layout& L, const std::string& run_id = "") {
  Checkpointer ck(world);
  Locals locals;
  test::register_state(ck, L, c.rank(), c.size(), true, locals, static_cast<uint64_t>(step));
  for (const auto& [k, v] : test::state_meta(step)) ck.set_meta(k, v);
  if (!run_id.empty()) ck.set_meta(kRunIdMeta, run_id);
  ck.save(root, step);
}

// Empty if the loaded state equals the generator's for `step` on every rank.
std::string load(Communicator& c, std::shared_ptr<Communicator> world, const std::string& path,
                 int64_t step, const test::Layout& L) {
  Checkpointer ck(world);
  Locals locals;
  test::register_state(ck, L, c.rank(), c.size(), false, locals);
  const CheckpointInfo info = ck.load(path);
  std::string err = test::check_state(L, c.rank(), c.size(), locals, static_cast<uint64_t>(step));
  if (err.empty() && info.step != step)
    err = "loaded step " + std::to_string(info.step) + ", expected " + std::to_string(step);
  MetaMap meta = info.meta;
  meta.erase(kRunIdMeta);  // save_run's stamp
  if (err.empty() && !(meta == test::state_meta(step))) err = "metadata differs";
  int64_t bad = err.empty() ? 0 : 1;
  c.all_reduce(&bad, 1, DType::i64, ReduceOp::max, "helper");
  if (bad && err.empty()) err = "another rank found a difference";
  return err;
}

void dump(const std::string& dir, int64_t step) {
  fs::create_directories(dir);
  std::ofstream index(dir + "/index.json");
  index << "{\n  \"step\": " << step << ",\n  \"tensors\": [";
  bool first = true;
  for (const test::StateTensor& t : test::state_tensors()) {
    const Tensor g = test::global_tensor(t, static_cast<uint64_t>(step));
    std::string file = t.name;
    for (char& ch : file)
      if (ch == '/') ch = '~';
    std::ofstream(dir + "/" + file + ".bin", std::ios::binary)
        .write(static_cast<const char*>(g.raw()), static_cast<std::streamsize>(g.nbytes()));
    index << (first ? "\n" : ",\n") << "    {\"name\": \"" << t.name << "\", \"dtype\": \""
          << dtype_name(t.dtype) << "\", \"shape\": [";
    for (size_t k = 0; k < t.shape.size(); ++k) index << (k ? ", " : "") << t.shape[k];
    index << "], \"file\": \"" << file << ".bin\"}";
    first = false;
  }
  index << "\n  ],\n  \"config\": \"";
  const MetaMap meta = test::state_meta(step);
  for (char ch : std::get<std::string>(meta.at("config")))
    index << (ch == '\n' ? std::string("\\n") : std::string(1, ch));
  index << "\"\n}\n";
}

bool no_temporaries(const std::string& root, std::string& err) {
  for (const auto& e : fs::directory_iterator(root)) {
    const std::string n = e.path().filename().string();
    if (n.find(".tmp-") != std::string::npos) {
      err = "temporary left in " + root + ": " + n;
      return false;
    }
  }
  return true;
}

int run(int argc, char** argv, std::shared_ptr<Communicator> world) {
  Communicator& c = *world;
  const std::vector<std::string> a(argv + 1, argv + argc);
  auto flag = [&](const std::string& f) {
    for (const std::string& s : a) if (s == f) return true;
    return false;
  };
  auto option = [&](const std::string& f) {
    for (size_t i = 0; i + 1 < a.size(); ++i) if (a[i] == f) return a[i + 1];
    return std::string();
  };
  IHA_CONFIG_CHECK(a.size() >= 5, "usage: ckpt_helper save|save_run|load|check_then_save ...");
  const std::string& cmd = a[0];
  const std::string& path = a[1];
  const int64_t step = std::stoll(a[2]);
  std::string err;
  if (cmd == "save") {
    if (flag("--fresh") && c.rank() == 0) fs::remove_all(path);
    c.barrier();
    save(c, world, path, step, {std::stoll(a[3]), std::stoll(a[4])});
    if (!option("--dump").empty() && c.rank() == 0) dump(option("--dump"), step);
  } else if (cmd == "save_run") {
    CheckpointRoot opened(c, path, "argument ROOT", RootUse::resume_auto);
    for (const std::string& note : opened.notes())
      if (c.rank() == 0) std::printf("ckpt_helper: %s\n", note.c_str());
    save(c, world, path, step, {std::stoll(a[3]), std::stoll(a[4])}, opened.run_id());
  } else if (cmd == "load") {
    err = load(c, world, path, step, {std::stoll(a[3]), std::stoll(a[4])});
  } else if (cmd == "check_then_save") {
    IHA_CONFIG_CHECK(a.size() >= 6, "usage: ckpt_helper check_then_save ROOT STEP NEW_STEP HP SP");
    const test::Layout L{std::stoll(a[4]), std::stoll(a[5])};
    CheckpointRoot opened(c, path, "argument ROOT", RootUse::resume);
    for (const std::string& note : opened.notes())
      if (c.rank() == 0) std::printf("ckpt_helper: %s\n", note.c_str());
    err = load(c, world, path, step, L);
    if (err.empty()) {
      save(c, world, path, std::stoll(a[3]), L);
      if (c.rank() == 0) no_temporaries(path, err);
    }
  } else {
    IHA_CONFIG_CHECK(false, "unknown command '", cmd, "'");
  }
  if (!err.empty()) {
    if (c.rank() == 0) std::fprintf(stderr, "ckpt_helper %s: %s\n", cmd.c_str(), err.c_str());
    return 1;
  }
  if (c.rank() == 0) std::printf("ckpt_helper %s %s step %lld: ok\n", cmd.c_str(), path.c_str(),
                                 static_cast<long long>(step));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  MpiRuntime runtime(&argc, &argv);
  int rc = 0;
  try {
    rc = run(argc, argv, runtime.world());
  } catch (const std::exception& e) {
    if (runtime.world()->rank() == 0) std::fprintf(stderr, "ckpt_helper: %s\n", e.what());
    rc = 1;
  }
  int any = rc;
  MPI_Allreduce(MPI_IN_PLACE, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  return any;
}
