// The one HDF5 module of the project: the lock, the error policy, the handle type and the
// storage check, used by the checkpoint files (schema.cpp), the token file reader and writer
// (lib/model/data.cpp) and iha-layer's layer files (apps/iha-layer/layer_file.cpp).
//
// - Lock: hdf5_mutex() (hdf5_lock.h, the part user code needs). Debian's HDF5 1.10 is not
//   built thread-safe; every HDF5 call in the process is made while holding it.
// - Error policy: an Hdf5Session holds the lock and turns HDF5's automatic error printing off
//   for its lifetime, restoring the caller's setting when the outermost session on the thread
//   ends. Our messages name the file and dataset (and may quote hdf5_error_text()); HDF5's
//   stack dumps on stderr would only bury them, and a library must not change a setting its
//   user's own HDF5 code relies on. Sessions nest on one thread (only the outermost locks),
//   so a function that opens one may call another that does.
// - Handles: Hdf5Handle closes an identifier with the close function of its HDF5 type. Every
//   HDF5 file and dataset of the project is closed through it (or hdf5_close), never by the
//   type's own close function elsewhere.
// Internal to the project (not installed): it includes <hdf5.h>.
// defines: iha::Hdf5Session, iha::Hdf5Handle, iha::hdf5_close, iha::hdf5_error_text,
//          iha::hdf5_storage_problem
#pragma once

#include <hdf5.h>

#include <string>

#include "checkpoint/hdf5_lock.h"

namespace iha {

// Holds hdf5_mutex() and silences HDF5's automatic error printing while it lives (see above).
// Hold it only around HDF5 calls: never while waiting on MPI or other ranks.
class Hdf5Session {
 public:
  Hdf5Session();
  ~Hdf5Session();
  Hdf5Session(const Hdf5Session&) = delete;
  Hdf5Session& operator=(const Hdf5Session&) = delete;
};

// Closes an HDF5 identifier with the close function of its type (file, group, dataset,
// datatype, dataspace, attribute, property list; any other by dropping a reference).
herr_t hdf5_close(hid_t id);

// An HDF5 identifier, closed on destruction; movable, not copyable. Negative: none (a failed
// call's result can be wrapped and tested with ok()). Use inside an Hdf5Session.
class Hdf5Handle {
 public:
  Hdf5Handle() = default;
  explicit Hdf5Handle(hid_t id) : id_(id) {}
  ~Hdf5Handle() { close(); }
  Hdf5Handle(Hdf5Handle&& o) noexcept : id_(o.id_) { o.id_ = -1; }
  Hdf5Handle& operator=(Hdf5Handle&& o) noexcept {
    if (this != &o) {
      close();
      id_ = o.id_;
      o.id_ = -1;
    }
    return *this;
  }
  Hdf5Handle(const Hdf5Handle&) = delete;
  Hdf5Handle& operator=(const Hdf5Handle&) = delete;

  hid_t get() const { return id_; }
  operator hid_t() const { return id_; }
  bool ok() const { return id_ >= 0; }
  // Gives the identifier up without closing it (to a holder that cannot include <hdf5.h>).
  hid_t release() {
    const hid_t id = id_;
    id_ = -1;
    return id;
  }
  // Closes now and reports failure (for a file, whose close flushes its metadata).
  herr_t close() {
    const herr_t rc = id_ >= 0 ? hdf5_close(id_) : 0;
    id_ = -1;
    return rc;
  }

 private:
  hid_t id_ = -1;
};

// The HDF5 error stack, innermost causes first (at most three), as one line; clears it.
// "HDF5 error" when the stack is empty.
std::string hdf5_error_text();

// Whether an HDF5 dataset's elements are ones a writer stored in this file. HDF5 answers a
// read of storage that was never written with the fill value (zeros) and no error, and it
// follows external links, external raw storage and virtual datasets into other files (or
// none), so a token or layer file could be "read" whole without one element in it. Input
// datasets are read only from plain storage in the file itself, every chunk of it written.
// "" when dataset `name` of `file` (opened as `dset`) is stored plainly in the file with every
// element written; otherwise why not, in words for a message that already names the file and
// dataset. Call inside an Hdf5Session.
std::string hdf5_storage_problem(hid_t file, const std::string& name, hid_t dset);

}  // namespace iha
