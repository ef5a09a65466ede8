// The checkpoint-root protocol of root.h: lock, writability probe, crash recovery.
#include "checkpoint/root.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <random>

#include "checkpoint/checkpoint.h"
#include "checkpoint/posix_io.h"
#include "core/error.h"
#include "core/files.h"

namespace iha {

using namespace ckpt;

namespace {

constexpr const char* kLockFile = "lock";
// `latest` holds "step_<N>\n"; anything longer is damage, and is not read whole.
constexpr off_t kLatestMaxBytes = 64;
// The record holds "<run id>\n"; anything longer is damage.
constexpr off_t kRecordMaxBytes = 65;

// Printable excerpt of untrusted bytes for a message.
std::string excerpt(const std::string& s) {
  std::string out;
  for (unsigned char ch : s) {
    if (ch >= 0x20 && ch < 0x7f) {
      out += static_cast<char>(ch);
    } else {
      char b[8];
      std::snprintf(b, sizeof b, "\\x%02x", ch);
      out += b;
    }
  }
  return out;
}

std::string holder_of(int fd) {
  char buf[200];
  const ssize_t n = ::pread(fd, buf, sizeof buf - 1, 0);
  std::string s = n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s.empty() ? "a process that has not yet written its name" : excerpt(s);
}

// Writes and removes a file in root: fails (ConfigError) where the lock file alone could
// pass, e.g. an existing writable lock file in a directory that no longer accepts new files.
void probe_writable(const std::string& root) {
  const std::string probe = join_path(root, "write-probe.tmp-" + random_nonce());
  try {
    write_text_file_synced(probe, "probe\n");
  } catch (const Error& e) {
    ::unlink(probe.c_str());
    throw ConfigError("checkpoint directory " + root + " is not writable: " + e.what());
  }
  ::unlink(probe.c_str());
}

// Whether s can be a run id in the root's record: what random_nonce() makes, or any short
// printable word a writer put in its checkpoints' kRunIdMeta.
bool valid_run_id(const std::string& s) {
  return !s.empty() && s.size() <= static_cast<size_t>(kRecordMaxBytes) - 1 &&
         std::all_of(s.begin(), s.end(), [](char c) { return c > 0x20 && c < 0x7f; });
}

// Replaces root/<name> with `text` as `latest` is replaced: a protocol temporary, fsync,
// rename, fsync of the root.
void replace_file_synced(const std::string& root, const std::string& name, const std::string& text) {
  const std::string tmp = join_path(root, name + ".tmp-" + random_nonce());
  try {
    write_text_file_synced(tmp, text);
    rename_path(tmp, join_path(root, name));
  } catch (...) {
    ::unlink(tmp.c_str());
    throw;
  }
  fsync_dir(root);
}

// Which run owns the root, for recovery: the run_id of the checkpoint `latest` names, else the
// root's record; empty if neither says.
struct Owner {
  std::string id;
  std::string from;  // where id came from, for messages
};

// A step directory newer than `latest` (or without `latest`) is adopted only as the owner's
// interrupted save: one written by another run (copied or moved in), or one that cannot say
// which run wrote it where the owner is known, must not be resumed from.
void check_owner(const std::string& root, const Owner& owner, const CheckpointInfo& candidate) {
  const bool has = candidate.has_meta(kRunIdMeta);
  const std::string mine = has ? candidate.get<std::string>(kRunIdMeta) : std::string();
  if (owner.id.empty()) {
    // Nothing here names a run: a root that no CheckpointRoot recorded and whose checkpoints
    // carry no run_id (a writer that never sets one) is recovered as before; a step directory
    // that does name a run cannot be shown to be this root's.
    IHA_CONFIG_CHECK(!has, "it carries run_id ", excerpt(mine), " but nothing in ", root,
                     " says which run owns the root (no record ", join_path(root, kRunRecord),
                     ", and no 'latest' whose checkpoint has a run_id): it may be another run's");
    return;
  }
  IHA_CONFIG_CHECK(has, "it carries no run_id (meta '", kRunIdMeta, "'), so it cannot be told from "
                   "another run's; the run that owns ", root, " is run_id ", excerpt(owner.id), " (",
                   owner.from, ")");
  IHA_CONFIG_CHECK(mine == owner.id, "it was written by another run (run_id ", excerpt(mine),
                   ") than the one that owns ", root, " (run_id ", excerpt(owner.id), ", ", owner.from, ")");
}

}  // namespace

// ---- lock ----

struct RootLock::Held {
  int fd = -1;
  ~Held() {
    if (fd >= 0) ::close(fd);  // drops the flock
  }
};

namespace {
// Locks this process holds, by the lock file's identity: flock(2) conflicts between two open
// files of one process too, so a second RootLock of the same root shares the first one.
std::mutex held_mutex;
std::map<std::pair<dev_t, ino_t>, std::weak_ptr<RootLock::Held>> held_locks;
}  // namespace

RootLock::RootLock(const std::string& root) {
  try {
    make_dirs(root);
  } catch (const Error& e) {
    throw ConfigError(e.what());
  }
  const std::string file = join_path(root, kLockFile);
  int fd;
  do {
    // O_NOFOLLOW: a `lock` that is a symbolic link must not lead the truncate below into the
    // file it names.
    fd = ::open(file.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0644);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0 && errno == ELOOP)
    throw ConfigError("lock file " + file + " is a symbolic link; refusing to write through it "
                      "(remove the link: the run creates its own lock file)");
  if (fd < 0)
    throw ConfigError("checkpoint directory " + root + " is not writable: cannot create its lock file " +
                      file + ": " + std::strerror(errno));
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    throw ConfigError("cannot stat " + file + ": " + std::strerror(err));
  }
  // A hard link to a user's file, or a FIFO or device, is not the lock this protocol created.
  if (!S_ISREG(st.st_mode) || st.st_nlink != 1) {
    ::close(fd);
    throw ConfigError("lock file " + file + " is " +
                      (S_ISREG(st.st_mode) ? "a file with " + std::to_string(st.st_nlink) + " hard links"
                                           : file_kind_name(st.st_mode)) +
                      ", not the lock file a run creates; remove it");
  }
  std::lock_guard<std::mutex> guard(held_mutex);
  auto& slot = held_locks[{st.st_dev, st.st_ino}];
  if (std::shared_ptr<Held> h = slot.lock()) {
    ::close(fd);
    held_ = std::move(h);
    return;
  }
  int rc;
  do {
    rc = ::flock(fd, LOCK_EX | LOCK_NB);
  } while (rc != 0 && errno == EINTR);
  if (rc != 0) {
    const int err = errno;
    const std::string who = err == EWOULDBLOCK ? holder_of(fd) : "";
    ::close(fd);
    if (err == EWOULDBLOCK)
      throw ConfigError("checkpoint directory " + root + " is in use by another run (" + who +
                        " holds " + file + "); one run writes a checkpoint directory at a time");
    throw ConfigError("cannot lock " + file + ": " + std::strerror(err));
  }
  // Who holds it, for the message a second run gets; best effort (the lock is what counts).
  char host[256] = "?";
  ::gethostname(host, sizeof host - 1);
  const std::string me = "pid " + std::to_string(::getpid()) + "@" + host + "\n";
  if (::ftruncate(fd, 0) == 0) {
    const ssize_t w = ::pwrite(fd, me.data(), me.size(), 0);
    (void)w;
  }
  held_ = std::make_shared<Held>();
  held_->fd = fd;
  slot = held_;
}

RootLock::~RootLock() {
  std::lock_guard<std::mutex> guard(held_mutex);
  held_.reset();
}

// ---- latest ----

namespace ckpt {

std::string random_nonce() {
  std::random_device rd;
  char b[24];
  std::snprintf(b, sizeof b, "%08x%08x", rd(), rd());
  return b;
}

std::string bcast_string(Communicator& comm, const std::string& s, int root) {
  int64_t n = static_cast<int64_t>(s.size());
  comm.broadcast(&n, 1, DType::i64, root, "ckpt.meta");
  std::string out = s;
  out.resize(static_cast<size_t>(n));
  if (n) comm.broadcast(out.data(), n, DType::u8, root, "ckpt.meta");
  return out;
}

bool is_own_temporary(const std::string& name) {
  const size_t tmp = name.rfind(".tmp-");
  if (tmp == std::string::npos) return false;
  const std::string stem = name.substr(0, tmp);
  if (stem != "latest" && stem != "write-probe" && stem != kRunRecord && parse_step_name(stem) < 0)
    return false;
  std::string nonce = name.substr(tmp + 5);
  if (nonce.compare(0, 4, "del-") == 0) nonce = nonce.substr(4);
  return nonce.size() == 16 &&
         std::all_of(nonce.begin(), nonce.end(), [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

int64_t parse_step_name(const std::string& name) {
  if (name.size() <= 5 || name.size() > 24 || name.compare(0, 5, "step_") != 0) return -1;
  for (size_t i = 5; i < name.size(); ++i)
    if (name[i] < '0' || name[i] > '9') return -1;
  errno = 0;
  const long long v = std::strtoll(name.c_str() + 5, nullptr, 10);
  return errno == ERANGE ? -1 : v;
}

namespace {
// The text of a small protocol file (`latest`, the run record), trailing whitespace removed;
// nullopt if there is none. Refused before it is read: a symbolic link (the protocol writes a
// regular file `holding` something), anything but a regular file, and more than max_bytes
// (not_what: what such a file cannot be).
std::optional<std::string> read_protocol_file(const std::string& file, off_t max_bytes,
                                              const std::string& holding, const char* not_what) {
  // lstat: a dangling symbolic link is not "no file" (for `latest`, that would start recovery
  // from whatever step directories are there).
  struct stat st;
  if (::lstat(file.c_str(), &st) != 0) {
    if (errno == ENOENT) return std::nullopt;
    throw ConfigError("cannot stat " + file + ": " + std::strerror(errno));
  }
  IHA_CONFIG_CHECK(!S_ISLNK(st.st_mode), file, " is a symbolic link; the checkpoint protocol "
                   "writes it as a regular file holding ", holding);
  IHA_CONFIG_CHECK(S_ISREG(st.st_mode), file, " is ", file_kind_name(st.st_mode), ", not a regular file");
  IHA_CONFIG_CHECK(st.st_size <= max_bytes, file, " is ", st.st_size, " bytes long: not ", not_what,
                   "; the file is damaged");
  std::string text;
  try {
    text = read_text_file(file);
  } catch (const Error& e) {
    throw ConfigError(e.what());
  }
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ' || text.back() == '\r'))
    text.pop_back();
  return text;
}
}  // namespace

std::string read_latest(const std::string& root) {
  const std::string latest = join_path(root, "latest");
  const std::optional<std::string> name =
      read_protocol_file(latest, kLatestMaxBytes, "step_<N> (replace the link by such a file)",
                         "a step directory name (step_<N>)");
  if (!name) return "";
  IHA_CONFIG_CHECK(parse_step_name(*name) >= 0, latest, " holds '", excerpt(*name),
                   "', not a step directory name (step_<N>)");
  return *name;
}

std::string read_run_record(const std::string& root) {
  const std::string file = join_path(root, kRunRecord);
  const std::optional<std::string> id =
      read_protocol_file(file, kRecordMaxBytes, "the run id of the root's run (remove the link)",
                         "a run id");
  if (!id) return "";
  IHA_CONFIG_CHECK(valid_run_id(*id), file, " holds '", excerpt(*id), "', not a run id");
  return *id;
}

}  // namespace ckpt

namespace {

// What rank 0 finds in the root before recovery.
struct RootScan {
  std::string latest;  // the step directory `latest` names; "" if none
  std::string record;  // the root's record of its run; "" if none
  Owner owner;         // the run that owns the root (for recovery)
  std::string latest_id;  // run_id of the checkpoint `latest` names, as recovery leaves it
  std::vector<std::string> candidates;  // step directories newer than `latest`, newest first
};

// The run that owns the root: the run_id of the checkpoint `latest` names, else the record's.
void find_owner(const std::string& root, RootScan& s) {
  if (!s.latest.empty()) {
    try {
      const CheckpointInfo of_latest = inspect_checkpoint(join_path(root, s.latest));
      if (of_latest.has_meta(kRunIdMeta)) s.latest_id = of_latest.get<std::string>(kRunIdMeta);
    } catch (const Error&) {
      // `latest`'s own checkpoint is judged when it is loaded
    }
  }
  if (!s.latest_id.empty())
    s.owner = {s.latest_id, "the run_id of " + s.latest + ", which 'latest' names"};
  else if (!s.record.empty())
    s.owner = {s.record, "recorded in " + join_path(root, kRunRecord)};
}

// Rank 0, holding the root's lock: `latest`, the record and the owner; removes the protocol's
// own temporaries; the step directories newer than `latest` (none where the run starts fresh).
void scan_root(const std::string& root, RootUse use, RootScan& s) {
  probe_writable(root);
  s.latest = read_latest(root);
  IHA_CONFIG_CHECK(s.latest.empty() || is_dir(join_path(root, s.latest)), join_path(root, "latest"),
                   " names ", s.latest, ", which does not exist (restore it, or point 'latest' "
                   "at a step directory that does)");
  s.record = read_run_record(root);
  find_owner(root, s);
  const int64_t latest_step = s.latest.empty() ? -1 : parse_step_name(s.latest);
  std::vector<std::pair<int64_t, std::string>> newer;
  for (const std::string& name : list_dir(root)) {
    const int64_t step = parse_step_name(name);
    if (step > latest_step && is_dir(join_path(root, name))) newer.push_back({step, name});
    // Never committed (Checkpointer::save writes and removes these under the lock).
    if (is_own_temporary(name)) remove_tree(join_path(root, name));
  }
  std::sort(newer.rbegin(), newer.rend());
  if (use == RootUse::fresh) {
    IHA_CONFIG_CHECK(s.latest.empty() && newer.empty(), "it already holds checkpoints (",
                     s.latest.empty() ? newer.front().second + ", no 'latest'" : "latest: " + s.latest,
                     "): continue them with --resume (or --resume auto), or choose another "
                     "directory");
  } else {
    for (const auto& n : newer) s.candidates.push_back(n.second);
  }
}

// Rank 0's candidates on every rank; whether rank 0 found a `latest`.
bool share_scan(Communicator& comm, RootScan& s) {
  std::string joined;
  for (const std::string& c : s.candidates) joined += c + "\n";
  joined = bcast_string(comm, joined, 0);
  s.candidates.clear();
  size_t b = 0;
  for (size_t e; (e = joined.find('\n', b)) != std::string::npos; b = e + 1)
    s.candidates.push_back(joined.substr(b, e - b));
  int64_t has_latest = s.latest.empty() ? 0 : 1;
  comm.broadcast(&has_latest, 1, DType::i64, 0, "ckpt.root");
  return has_latest != 0;
}

// Candidate step directory `name`: adopted as latest if it verifies and is the owner's (true),
// else set aside under a name no command reads. Either way a note for the run's log.
bool adopt_or_set_aside(Communicator& comm, const std::string& root, const std::string& name,
                        RootScan& s, std::vector<std::string>& notes) {
  const std::string dir = join_path(root, name);
  std::string why;
  try {
    verify_checkpoint(comm, dir);
    collective_check(comm, [&] {
      if (comm.rank() != 0) return;
      const CheckpointInfo info = inspect_checkpoint(dir);
      IHA_CONFIG_CHECK(info.step == parse_step_name(name), "its file holds step ", info.step);
      check_owner(root, s.owner, info);
      s.latest_id = info.has_meta(kRunIdMeta) ? info.get<std::string>(kRunIdMeta) : std::string();
    });
  } catch (const Error& e) {
    why = e.what();
  }
  // Where a rejected directory goes: a name no command reads, lists as a step, or removes.
  std::string aside = name + ".rejected";
  if (comm.rank() == 0)
    for (int k = 1; path_exists(join_path(root, aside)); ++k) aside = name + ".rejected." + std::to_string(k);
  aside = bcast_string(comm, aside, 0);
  std::string note;
  collective_check(comm, [&] {
    if (why.empty()) {
      note = "recovered " + dir + ": a complete checkpoint newer than 'latest' (left by an "
             "interrupted save), verified and adopted as latest";
      if (comm.rank() != 0) return;
      replace_file_synced(root, "latest", name + "\n");
    } else {
      note = "set aside " + dir + " as " + aside + " (not adopted as latest: " + why + ")";
      if (comm.rank() != 0) return;
      rename_path(dir, join_path(root, aside));
      fsync_dir(root);
    }
  });
  notes.push_back(note);
  return why.empty();
}

}  // namespace

// ---- the protocol ----

CheckpointRoot::CheckpointRoot(Communicator& comm, const std::string& root, const std::string& what,
                               RootUse use)
    : root_(root) {
  const std::string where = what + " = '" + root + "'";
  RootScan scan;  // rank 0's, but for the candidates shipped to every rank
  collective_check(comm, [&] {
    IHA_CONFIG_CHECK(!root.empty(), what, " is empty: no checkpoint directory");
    if (comm.rank() != 0) return;
    try {
      lock_ = std::make_unique<RootLock>(root);
      scan_root(root, use, scan);
    } catch (const Error& e) {
      lock_.reset();
      throw ConfigError(where + ": " + e.what());
    }
  });
  resume_ = share_scan(comm, scan);
  // Newest first: adopt the first that verifies; set aside those that do not.
  for (const std::string& name : scan.candidates) {
    if (adopt_or_set_aside(comm, root, name, scan, notes_)) {
      resume_ = true;
      break;
    }
  }
  collective_check(comm, [&] {
    IHA_CONFIG_CHECK(resume_ || use != RootUse::resume, "--resume: ", where,
                     " holds no checkpoint (no 'latest'); --resume auto starts fresh there");
  });
  // The run that writes the root from now on, recorded before its first save can start: a new
  // id for a run that starts fresh; on a resume, that of the checkpoint it continues (else the
  // record's; a root whose checkpoints carry no run_id and that has no record stays without).
  collective_check(comm, [&] {
    if (comm.rank() != 0) return;
    try {
      if (!resume_)
        run_id_ = random_nonce();
      else
        run_id_ = !scan.latest_id.empty() ? scan.latest_id : scan.record;
      if (valid_run_id(run_id_) && run_id_ != scan.record)
        replace_file_synced(root, kRunRecord, run_id_ + "\n");
    } catch (const Error& e) {
      throw ConfigError(where + ": cannot record the run in " + join_path(root, kRunRecord) + ": " + e.what());
    }
  });
  run_id_ = bcast_string(comm, run_id_, 0);
}

CheckpointRoot::~CheckpointRoot() = default;

}  // namespace iha
