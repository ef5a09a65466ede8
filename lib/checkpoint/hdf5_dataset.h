// Whether an HDF5 dataset's elements are ones a writer stored in this file. HDF5 answers a read
// of storage that was never written with the fill value (zeros) and no error, and it follows
// external links, external raw storage and virtual datasets into other files (or none), so a
// token or layer file could be "read" whole without one element in it. Input datasets are read
// only from plain storage in the file itself, every chunk of it written.
// Call with the HDF5 lock held (checkpoint/hdf5_lock.h). Header-only: the readers of token and
// layer files live in different libraries.
// defines: iha::hdf5_storage_problem
#pragma once

#include <hdf5.h>

#include <string>

namespace iha {

// "" when dataset `name` of `file` (opened as `dset`) is stored plainly in the file with every
// element written; otherwise why not, in words for a message that already names the file and
// dataset.
inline std::string hdf5_storage_problem(hid_t file, const std::string& name, hid_t dset) {
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
