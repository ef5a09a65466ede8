// GoogleTest main for tests run under mpiexec: initialises MPI, runs every test on every
// rank, and prints the full report on rank 0 and only failures on the others.
#include <gtest/gtest.h>
#include <mpi.h>

#include "mpi_env.h"

namespace {

class FailuresOnly : public ::testing::EmptyTestEventListener {
 public:
  explicit FailuresOnly(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (r.failed())
      fprintf(stderr, "[rank %d] %s:%d: failure\n%s\n", rank_, r.file_name() ? r.file_name() : "?",
              r.line_number(), r.summary());
  }

 private:
  int rank_;
};

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  iha::MpiRuntime runtime(&argc, &argv);
  iha::test::set_world(runtime.world());
  const int rank = runtime.world()->rank();
  if (rank != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new FailuresOnly(rank));
  }
  const int rc = RUN_ALL_TESTS();
  // Any rank failing makes every rank's exit code non-zero. A run in which every test skipped
  // (e.g. GPU tests without a GPU) exits with 77, which CTest reports as Skipped; a run with
  // any failure or any pass is never reported as skipped.
  const auto* unit = ::testing::UnitTest::GetInstance();
  int status[2] = {rc != 0, unit->successful_test_count() == 0 && unit->skipped_test_count() > 0};
  int any_failed = status[0], all_skipped = status[1];
  MPI_Allreduce(MPI_IN_PLACE, &any_failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Allreduce(MPI_IN_PLACE, &all_skipped, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  iha::test::set_world(nullptr);
  if (any_failed) return 1;
  return all_skipped ? 77 : 0;
}
