// Host-and-device qualifiers for code shared by the CPU and CUDA paths.
// defines: IHA_HD, IHA_HD_INLINE
#pragma once

#if defined(__CUDACC__)
#define IHA_HD __host__ __device__
#else
#define IHA_HD
#endif
#define IHA_HD_INLINE IHA_HD inline
