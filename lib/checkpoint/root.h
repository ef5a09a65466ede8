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
//   - Recovery (every crash point of Checkpointer::save leaves one of these states):
//       temporaries (step_<N>, latest or write-probe, then .tmp-[del-]<16 hex digits>): never
//       committed, removed; nothing else in the root is ever removed
//       step directories newer than what `latest` names (a crash between the rename of the
//       step directory and the update of `latest`), or step directories and no `latest` (the
//       same crash during the first save): the newest one is verified (every integrity hash,
//       and its step equals its name) and adopted (`latest` names it); one that fails is set
//       aside as step_<N>.rejected (.1, .2, ... if taken), which no command reads or removes; so
//       is one whose meta `run_id` (kRunIdMeta) differs from that of the checkpoint `latest`
//       names (another run's step directory, copied or moved in); then the next
//       newest is tried. A root is recovered once: no state makes a later open loop.
//     Recovery changes the root only for the resuming uses; a fresh run refuses a root that
//     holds any checkpoint (`latest` or a step directory) and changes nothing.
//   - `latest` is read bounded (a few bytes): a damaged one is a ConfigError naming the file,
//     never echoed whole.
// Errors are thrown on every rank (collective_check); bad roots are ConfigErrors naming `key`.
// defines: iha::RootUse, iha::RootLock, iha::CheckpointRoot, iha::kRunIdMeta, iha::ckpt::parse_step_name,
//          iha::ckpt::read_latest, iha::ckpt::random_nonce, iha::ckpt::bcast_string,
//          iha::ckpt::is_own_temporary
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
  // `key` (e.g. "checkpoint.dir") names the root in messages.
  CheckpointRoot(Communicator& comm, const std::string& root, const std::string& key, RootUse use);
  ~CheckpointRoot();
  // Whether the run continues from root/latest.
  bool resume() const { return resume_; }
  // What recovery did, one line each (the same on every rank), for the run's log.
  const std::vector<std::string>& notes() const { return notes_; }
  const std::string& path() const { return root_; }

 private:
  std::string root_;
  std::unique_ptr<RootLock> lock_;  // rank 0
  bool resume_ = false;
  std::vector<std::string> notes_;
};

// Checkpoint meta naming the run that wrote it (a writer that sets it, iha-train, carries it
// across resumes): recovery adopts a newer step directory only from the run of `latest`.
inline constexpr const char* kRunIdMeta = "run_id";

namespace ckpt {
// Small helpers shared by the save protocol and the root protocol.
std::string random_nonce();  // 16 hex digits for temporary names
// True only for the names the protocol gives its temporaries: `step_<N>`, `latest` or
// `write-probe`, then `.tmp-` or `.tmp-del-`, then exactly random_nonce()'s 16 hex digits. Only
// these are ever removed from a root: a user's `notes.tmp-draft` is not ours.
bool is_own_temporary(const std::string& name);
// Root rank's string, on every rank (collective).
std::string bcast_string(Communicator& comm, const std::string& s, int root);
// step_<digits> -> step, else -1.
int64_t parse_step_name(const std::string& name);
// The step directory name that root/latest holds ("" if there is no latest). Throws ConfigError
// naming the file if it does not hold a step name (at most a short excerpt is quoted).
std::string read_latest(const std::string& root);
}  // namespace ckpt

}  // namespace iha
