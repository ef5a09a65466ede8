// Writes HDF5 token files with raw HDF5 calls, including broken ones the library's writer
// refuses to produce (wrong dtype, ids out of range, missing attribute, 2-D; doc_starts of the
// wrong type, shape or values), for the bad-data tests.
// defines: iha::test::RawTokenFile, iha::test::write_raw_dataset, iha::test::write_raw_token_file
#pragma once

#include <hdf5.h>

#include <cstdint>
#include <string>
#include <vector>

namespace iha::test {

struct RawTokenFile {
  std::string dataset = "tokens";
  hid_t file_type = H5T_STD_I32LE;  // e.g. H5T_IEEE_F32LE for the wrong-dtype case
  std::vector<int64_t> tokens;
  int64_t vocab_size = 32;          // < 0: no vocab_size attribute
  bool two_d = false;               // store as [n/2, 2]
  // A doc_starts dataset beside the tokens when has_doc_starts, of doc_starts_type (2-D
  // [n/2, 2] with doc_starts_two_d).
  bool has_doc_starts = false;
  std::vector<int64_t> doc_starts;
  hid_t doc_starts_type = H5T_STD_I64LE;
  bool doc_starts_two_d = false;
};

// A 1-D (or [n/2, 2]) dataset of `type` holding `values`, written from int64 or double.
inline void write_raw_dataset(hid_t file, const std::string& name, hid_t type,
                              const std::vector<int64_t>& values, bool two_d) {
  hsize_t dims[2] = {static_cast<hsize_t>(values.size()), 2};
  if (two_d) dims[0] /= 2;
  hid_t space = H5Screate_simple(two_d ? 2 : 1, dims, nullptr);
  hid_t dset = H5Dcreate2(file, name.c_str(), type, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  if (!values.empty()) {
    std::vector<double> as_double(values.begin(), values.end());
    if (H5Tget_class(type) == H5T_FLOAT)
      H5Dwrite(dset, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, as_double.data());
    else
      H5Dwrite(dset, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data());
  }
  H5Dclose(dset);
  H5Sclose(space);
}

inline void write_raw_token_file(const std::string& path, const RawTokenFile& f) {
  hid_t file = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  hsize_t dims[2] = {static_cast<hsize_t>(f.tokens.size()), 2};
  if (f.two_d) dims[0] /= 2;
  hid_t space = H5Screate_simple(f.two_d ? 2 : 1, dims, nullptr);
  hid_t dset = H5Dcreate2(file, f.dataset.c_str(), f.file_type, space, H5P_DEFAULT, H5P_DEFAULT,
                          H5P_DEFAULT);
  if (!f.tokens.empty()) {
    std::vector<double> as_double(f.tokens.begin(), f.tokens.end());
    if (H5Tget_class(f.file_type) == H5T_FLOAT)
      H5Dwrite(dset, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, as_double.data());
    else
      H5Dwrite(dset, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, f.tokens.data());
  }
  if (f.vocab_size >= 0) {
    hid_t as = H5Screate(H5S_SCALAR);
    hid_t a = H5Acreate2(dset, "vocab_size", H5T_STD_I64LE, as, H5P_DEFAULT, H5P_DEFAULT);
    H5Awrite(a, H5T_NATIVE_INT64, &f.vocab_size);
    H5Aclose(a);
    H5Sclose(as);
  }
  H5Dclose(dset);
  H5Sclose(space);
  if (f.has_doc_starts) write_raw_dataset(file, "doc_starts", f.doc_starts_type, f.doc_starts, f.doc_starts_two_d);
  H5Fclose(file);
}

}  // namespace iha::test
