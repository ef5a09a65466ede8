#include "checkpoint/hdf5.h"

#include <algorithm>
#include <vector>

namespace iha {

namespace {
// HDF5 1.10 cannot recover from a failed H5Fclose (disk full while it writes a file's
// metadata): the file ID stays registered after its state is freed, and closing the library
// then crashes (SIGSEGV after a clean error message). The library closes itself from two
// hooks: an atexit handler, and, when it initialises after MPI_Init, an attribute on
// MPI_COMM_SELF that MPI_Finalize deletes. Every file this process opens is closed
// explicitly, so neither has anything useful to do: the atexit handler is turned off and the
// library initialised here, before main and so before MPI_Init, which leaves no MPI hook.
const bool hdf5_close_hooks_off = [] {
  H5dont_atexit();
  H5open();
  return true;
}();
}  // namespace

std::mutex& hdf5_mutex() {
  static std::mutex m;
  return m;
}

// ---- the error policy ----

namespace {
// Per thread: the sessions open on it, and what the outermost one found set.
thread_local int session_depth = 0;
thread_local H5E_auto2_t saved_func = nullptr;
thread_local void* saved_data = nullptr;
}  // namespace

Hdf5Session::Hdf5Session() {
  if (session_depth++ > 0) return;
  hdf5_mutex().lock();
  H5Eget_auto2(H5E_DEFAULT, &saved_func, &saved_data);
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
}

Hdf5Session::~Hdf5Session() {
  if (--session_depth > 0) return;
  H5Eset_auto2(H5E_DEFAULT, saved_func, saved_data);
  hdf5_mutex().unlock();
}

namespace {
herr_t collect_error(unsigned, const H5E_error2_t* e, void* data) {
  auto* out = static_cast<std::vector<std::string>*>(data);
  if (e->desc && *e->desc) out->push_back(e->desc);
  return 0;
}
}  // namespace

std::string hdf5_error_text() {
  std::vector<std::string> lines;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, collect_error, &lines);
  H5Eclear2(H5E_DEFAULT);
  if (lines.empty()) return "HDF5 error";
  // The innermost frames say what actually went wrong (e.g. "truncated file").
  std::string s;
  const size_t n = std::min<size_t>(lines.size(), 3);
  for (size_t i = 0; i < n; ++i) s += (i ? "; " : "") + lines[i];
  std::replace(s.begin(), s.end(), '\n', ' ');
  return s;
}

// ---- handles ----

herr_t hdf5_close(hid_t id) {
  switch (H5Iget_type(id)) {
    case H5I_FILE: return H5Fclose(id);
    case H5I_GROUP: return H5Gclose(id);
    case H5I_DATASET: return H5Dclose(id);
    case H5I_DATATYPE: return H5Tclose(id);
    case H5I_DATASPACE: return H5Sclose(id);
    case H5I_ATTR: return H5Aclose(id);
    case H5I_GENPROP_LST: return H5Pclose(id);
    default: return H5Idec_ref(id) < 0 ? -1 : 0;
  }
}

// ---- the storage check ----

std::string hdf5_storage_problem(hid_t file, const std::string& name, hid_t dset) {
  // Each link on the path: an external link reads another file, which can change under the run.
  for (size_t end = name.find('/', 1);; end = name.find('/', end + 1)) {
    const std::string prefix = name.substr(0, end);
    if (!prefix.empty() && prefix != "/") {
      H5L_info_t link;
      if (H5Lget_info(file, prefix.c_str(), &link, H5P_DEFAULT) < 0) return "its link '" + prefix + "' cannot be read";
      if (link.type == H5L_TYPE_EXTERNAL)
        return "'" + prefix + "' is an external link into another file; copy the data into this file";
      if (link.type != H5L_TYPE_HARD && link.type != H5L_TYPE_SOFT)
        return "'" + prefix + "' is a user-defined link; only plain datasets are read";
    }
    if (end == std::string::npos) break;
  }
  const hid_t dcpl = H5Dget_create_plist(dset);
  if (dcpl < 0) return "its storage properties cannot be read";
  const H5D_layout_t layout = H5Pget_layout(dcpl);
  const int external = H5Pget_external_count(dcpl);
  hsize_t chunk[H5S_MAX_RANK] = {0};
  const int chunk_rank = layout == H5D_CHUNKED ? H5Pget_chunk(dcpl, H5S_MAX_RANK, chunk) : 0;
  H5Pclose(dcpl);
  if (layout == H5D_VIRTUAL)
    return "is a virtual dataset (its elements live in other datasets or files); write the tokens "
           "into this file as a plain dataset";
  if (layout != H5D_CONTIGUOUS && layout != H5D_CHUNKED && layout != H5D_COMPACT)
    return "has a storage layout this reader does not know";
  if (external != 0)
    return "keeps its elements in external raw files (HDF5 external storage); write them into this file";

  const hid_t space = H5Dget_space(dset);
  if (space < 0) return "its shape cannot be read";
  hsize_t dims[H5S_MAX_RANK] = {0};
  const int rank = H5Sget_simple_extent_dims(space, dims, nullptr);
  H5Sclose(space);
  if (rank < 0) return "its shape cannot be read";
  hsize_t elements = 1;
  for (int i = 0; i < rank; ++i) elements *= dims[i];
  if (elements == 0 || layout == H5D_COMPACT) return "";  // compact data sits in the header, written whole

  if (layout == H5D_CHUNKED) {
    if (chunk_rank != rank) return "its chunk shape cannot be read";
    hsize_t expected = 1;
    for (int i = 0; i < rank; ++i) {
      if (chunk[i] == 0) return "its chunk shape cannot be read";
      expected *= (dims[i] + chunk[i] - 1) / chunk[i];
    }
    hsize_t written = 0;
    const hid_t whole = H5Dget_space(dset);
    const herr_t rc = whole < 0 ? -1 : H5Dget_num_chunks(dset, whole, &written);
    if (whole >= 0) H5Sclose(whole);
    if (rc < 0) return "its chunk index cannot be read (damaged file?)";
    if (written != expected)
      return "has " + std::to_string(expected - written) + " of its " + std::to_string(expected) +
             " chunks never written (they would read as fill values, not data)";
    return "";
  }
  H5D_space_status_t status;
  if (H5Dget_space_status(dset, &status) < 0) return "its storage cannot be inspected";
  if (status != H5D_SPACE_STATUS_ALLOCATED)
    return "was never written (no storage allocated: it would read as fill values, not data)";
  return "";
}

}  // namespace iha
