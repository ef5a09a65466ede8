// The checkpoint-root protocol: how every command that writes checkpoints opens a root
// directory (docs/checkpoint.md "The checkpoint directory", docs/reliability.md).
//
//   CheckpointRoot root(world, dir, "checkpoint.dir", RootUse::resume_auto);  // collective
//   if (root.resume()) ...load dir/latest...; else ...start fresh...
//   ...train, Checkpointer::save(dir, step) as often as wanted...
//   // the lock is released when `root` is destroyed, or by the kernel when the process dies
//
// Rules
//   - Lock: rank 0 holds an exclusive flock(2) on <root>/lock for the object's life. The kernel
//     drops it when the process exits in any way (kill -9 included), so a requeued job always
//     gets it; a second live writer fails at once with a ConfigError naming the holder
//     (pid@host). The lock file itself is never removed (removing it would let two processes
//     lock two different files). Within one process the lock is shared: Checkpointer::save
//     takes it too, for the duration of a save, so library users get the same exclusion.
//   - Writability: the root is created if absent, and a probe file is written and removed
//     before anything else, so a read-only or non-directory root fails before any training.
//   - The run's record: <root>/run holds the run id of the run that owns the root (kRunIdMeta,
//     the id its checkpoints carry; run_id()). It is written before the first save can start,
//     as `latest` is (a protocol temporary, fsync, rename, fsync of the root): with a new id
//     when a run starts fresh (RootUse::fresh, or resume_auto finding nothing to resume), with
//     the id of the checkpoint a resume continues otherwise. Read bounded; a link or a
//     non-regular or damaged file is a ConfigError naming it, never followed or echoed whole.
//   - Recovery (every crash point of Checkpointer::save leaves one of these states):
//       temporaries (step_<N>, latest, write-probe or run, then .tmp-[del-]<16 hex digits>):
//       never committed, removed; nothing else in the root is ever removed
//       step directories newer than what `latest` names (a crash between the rename of the
//       step directory and the update of `latest`), or step directories and no `latest` (the
//       same crash during the first save): the newest one is verified (every integrity hash,
//       its step equals its name, and it is the owner's: below) and adopted (`latest` names
//       it); one that fails is set aside as step_<N>.rejected (.1, .2, ... if taken), which no
//       command reads or removes, with a note naming it and why; then the next newest is tried.
//       A root is recovered once: no state makes a later open loop.
//       The owner is the run_id of the checkpoint `latest` names, else the record's. Where
//       there is an owner, a step directory is adopted only if its meta run_id equals it: one
//       of another run (copied or moved in) or one without run_id is set aside. Where there is
//       none (no record, and no `latest` whose checkpoint has a run_id), a step directory that
//       carries a run_id is set aside (it cannot be shown to be this root's); one without is
//       adopted as before: a root that no CheckpointRoot ever recorded, written by a writer that
//       sets no run_id (Checkpointer alone), cannot tell runs apart.
//     Recovery changes the root only for the resuming uses; a fresh run refuses a root that
//     holds any checkpoint (`latest` or a step directory) and changes nothing.
//   - A writer that opens its root here stamps run_id() on its checkpoints (iha-train does,
//     through TrainCheckpoints::set_run_id); otherwise its own interrupted saves are set aside.
//   - `latest` is read bounded (a few bytes): a damaged one is a ConfigError naming the file,
//     never echoed whole.
// Errors are thrown on every rank (collective_check); bad roots are ConfigErrors naming `key`.
// defines: iha::RootUse, iha::RootLock, iha::CheckpointRoot, iha::kRunIdMeta, iha::ckpt::parse_step_name,
//          iha::ckpt::read_latest, iha::ckpt::random_nonce, iha::ckpt::bcast_string,
//          iha::ckpt::is_own_temporary, iha::ckpt::kRunRecord, iha::ckpt::read_run_record
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "parallel/comm.h"

namespace iha {

enum class RootUse : uint8_t {
  fresh,        // a new run: the root must hold no checkpoint
  resume,       // continue `latest` (after recovery); an error if there is none
  resume_auto,  // continue `latest` if there is one (after recovery), else start fresh
};

// The process's exclusive lock of a checkpoint root (see the header comment). Local: taken by
// the one rank that writes the root's directory entries (rank 0).
class RootLock {
 public:
  // Creates root if needed. Throws ConfigError naming the root (and the holder, if another
  // process holds the lock; or the system's reason, if the lock file cannot be created).
  explicit RootLock(const std::string& root);
  ~RootLock();
  RootLock(const RootLock&) = delete;
  RootLock& operator=(const RootLock&) = delete;
  struct Held;

 private:
  std::shared_ptr<Held> held_;
};

class CheckpointRoot {
 public:
  // Collective over comm. Locks, probes, recovers and decides as the header comment says;
  // `what` is how the caller names the root in messages (iha-train: "config key
  // 'checkpoint.dir'").
  CheckpointRoot(Communicator& comm, const std::string& root, const std::string& what, RootUse use);
  ~CheckpointRoot();
  // Whether the run continues from root/latest.
  bool resume() const { return resume_; }
  // What recovery did, one line each (the same on every rank), for the run's log.
  const std::vector<std::string>& notes() const { return notes_; }
  const std::string& path() const { return root_; }
  // The run id the run stamps on its checkpoints (kRunIdMeta), the one in the root's record:
  // new for a run that starts fresh, the continued checkpoint's on a resume. Empty only on a
  // resume of a root that records no run (see the header comment): then the writer picks one.
  const std::string& run_id() const { return run_id_; }

 private:
  std::string root_;
  std::string run_id_;
  std::unique_ptr<RootLock> lock_;  // rank 0
  bool resume_ = false;
  std::vector<std::string> notes_;
};

// Checkpoint meta naming the run that wrote it (a writer that sets it, iha-train, carries it
// across resumes; CheckpointRoot::run_id() gives it): recovery adopts a step directory only
// from the run that owns the root.
inline constexpr const char* kRunIdMeta = "run_id";

namespace ckpt {
// The root's record of the run that owns it (see the header comment).
inline constexpr const char* kRunRecord = "run";
// Small helpers shared by the save protocol and the root protocol.
std::string random_nonce();  // 16 hex digits for temporary names
// True only for the names the protocol gives its temporaries: `step_<N>`, `latest`,
// `write-probe` or `run`, then `.tmp-` or `.tmp-del-`, then exactly random_nonce()'s 16 hex digits. Only
// these are ever removed from a root: a user's `notes.tmp-draft` is not ours.
bool is_own_temporary(const std::string& name);
// Root rank's string, on every rank (collective).
std::string bcast_string(Communicator& comm, const std::string& s, int root);
// step_<digits> -> step, else -1.
int64_t parse_step_name(const std::string& name);
// The step directory name that root/latest holds ("" if there is no latest). Throws ConfigError
// naming the file if it does not hold a step name (at most a short excerpt is quoted).
std::string read_latest(const std::string& root);
// The run id that root/run records ("" if there is no record). Throws ConfigError naming the
// file if it is a link, not a regular file, or does not hold a run id (quoted in excerpt only).
std::string read_run_record(const std::string& root);
}  // namespace ckpt

}  // namespace iha
