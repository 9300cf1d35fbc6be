// Shared by the NCCL measurement programs here (sym_allreduce.cu, p2p_allreduce.cu,
// nccl_front.cu): a checked CUDA call and a checked NCCL call, each naming the call and its
// line and exiting on failure.
#pragma once
#include <cuda_runtime.h>
#include <nccl.h>

#include <cstdio>
#include <cstdlib>

#define CK(x)                                                                           \
  do {                                                                                  \
    cudaError_t e = (x);                                                                \
    if (e != cudaSuccess) {                                                             \
      fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e)); \
      exit(1);                                                                          \
    }                                                                                   \
  } while (0)
#define NK(x)                                                                           \
  do {                                                                                  \
    ncclResult_t e = (x);                                                               \
    if (e != ncclSuccess) {                                                             \
      fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, ncclGetErrorString(e)); \
      exit(1);                                                                          \
    }                                                                                   \
  } while (0)
