#include "score.h"

#include <sys/stat.h>

#include <cstdio>
#include <vector>

#include "checkpoint/hdf5.h"
#include "core/error.h"

namespace iha::app {

void check_score_out(const std::string& out) {
  IHA_CONFIG_CHECK(!out.empty(), "iha-train score needs --out FILE (the HDF5 file of the scores)");
  struct stat st {};
  IHA_CONFIG_CHECK(::stat(out.c_str(), &st) != 0, "--out '", out, "' exists: scores are never written over a file");
  const size_t slash = out.find_last_of('/');
  const std::string dir = slash == std::string::npos ? "." : out.substr(0, slash == 0 ? 1 : slash);
  IHA_CONFIG_CHECK(::stat(dir.c_str(), &st) == 0 && S_ISDIR(st.st_mode), "--out '", out, "': directory '", dir,
                   "' does not exist");
}

namespace {

void write_attr(hid_t obj, const char* name, int64_t v, const std::string& where) {
  Hdf5Handle space(H5Screate(H5S_SCALAR));
  Hdf5Handle attr(H5Acreate2(obj, name, H5T_STD_I64LE, space.get(), H5P_DEFAULT, H5P_DEFAULT));
  IHA_CONFIG_CHECK(attr.ok() && H5Awrite(attr.get(), H5T_NATIVE_INT64, &v) >= 0, where, ": cannot write attribute ",
                   name, ": ", hdf5_error_text());
}

void write_attr(hid_t obj, const char* name, const std::string& v, const std::string& where) {
  Hdf5Handle type(H5Tcopy(H5T_C_S1));
  H5Tset_size(type.get(), v.empty() ? 1 : v.size());
  Hdf5Handle space(H5Screate(H5S_SCALAR));
  Hdf5Handle attr(H5Acreate2(obj, name, type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT));
  IHA_CONFIG_CHECK(attr.ok() && H5Awrite(attr.get(), type.get(), v.c_str()) >= 0, where,
                   ": cannot write attribute ", name, ": ", hdf5_error_text());
}

template <class E>
void write_matrix(hid_t file, const char* name, hid_t file_type, hid_t mem_type, const std::vector<E>& v,
                  const TokenScores& s, const std::string& where) {
  const hsize_t dims[2] = {static_cast<hsize_t>(s.sequences), static_cast<hsize_t>(s.N)};
  Hdf5Handle space(H5Screate_simple(2, dims, nullptr));
  Hdf5Handle d(H5Dcreate2(file, name, file_type, space.get(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
  IHA_CONFIG_CHECK(d.ok() && H5Dwrite(d.get(), mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data()) >= 0, where,
                   ": cannot write dataset '", name, "': ", hdf5_error_text());
}

}  // namespace

void write_scores(const std::string& out, const TokenScores& s, int64_t step, const std::string& checkpoint) {
  const std::string tmp = out + ".tmp";
  const std::string where = "--out '" + out + "'";
  std::vector<float> loss(s.loss.begin(), s.loss.end());
  {
    Hdf5Session session;
    Hdf5Handle file(H5Fcreate(tmp.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT));
    IHA_CONFIG_CHECK(file.ok(), where, ": cannot create '", tmp, "': ", hdf5_error_text());
    write_matrix(file.get(), "loss", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, loss, s, where);
    write_matrix(file.get(), "hit", H5T_STD_U8LE, H5T_NATIVE_UINT8, s.hit, s, where);
    write_attr(file.get(), "seq_len", s.N, where);
    write_attr(file.get(), "step", step, where);
    write_attr(file.get(), "checkpoint", checkpoint, where);
    IHA_CONFIG_CHECK(file.close() >= 0, where, ": cannot close '", tmp, "': ", hdf5_error_text());
  }
  IHA_CONFIG_CHECK(std::rename(tmp.c_str(), out.c_str()) == 0, where, ": cannot rename '", tmp, "' to it");
}

}  // namespace iha::app
