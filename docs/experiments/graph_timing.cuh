// Shared by the measurement programs here: a checked CUDA call, and the time of a body of
// launches captured `reps` times into one CUDA graph (best of 7 runs of 5 replays, in us per body).
#pragma once
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>
#define CK(x) do{ auto err_=(x); if(err_){printf("ERR %s:%d %s\n",__FILE__,__LINE__,cudaGetErrorString(err_)); exit(1);} }while(0)
template<class F> float graph_us(cudaStream_t s, F body, int reps){
  cudaGraph_t g; cudaGraphExec_t ge; cudaEvent_t a,b; cudaEventCreate(&a); cudaEventCreate(&b);
  CK(cudaStreamBeginCapture(s,cudaStreamCaptureModeThreadLocal)); for(int r=0;r<reps;r++) body(); CK(cudaStreamEndCapture(s,&g));
  CK(cudaGraphInstantiate(&ge,g,0));
  for(int i=0;i<3;i++) cudaGraphLaunch(ge,s); CK(cudaStreamSynchronize(s));
  float best=1e9; for(int t=0;t<7;t++){ cudaEventRecord(a,s); for(int r=0;r<5;r++) cudaGraphLaunch(ge,s); cudaEventRecord(b,s); cudaEventSynchronize(b); float ms; cudaEventElapsedTime(&ms,a,b); if(ms<best) best=ms; }
  CK(cudaGetLastError());
  return best*1000.f/(reps*5);
}
