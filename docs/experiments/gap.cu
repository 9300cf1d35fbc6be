// What a dependent kernel boundary costs inside a CUDA graph on this GPU, and what programmatic
// dependent launch (PDL) takes off it: chains of N kernels captured into one graph.
#include <cstdio>
#include <cuda_runtime.h>
#define CK(x) do{ auto e=(x); if(e){printf("ERR %s:%d %s\n",__FILE__,__LINE__,cudaGetErrorString(e)); return 1;} }while(0)
__global__ void tiny(float* p, int pdl){ if(pdl) cudaGridDependencySynchronize(); if(threadIdx.x==0&&blockIdx.x==0) p[0]+=1.f; }
// elementwise y = tanh(x)+y over n floats (a typical activation kernel)
__global__ void elem(const float* x, float* y, int n, int pdl){
  if(pdl) cudaGridDependencySynchronize();
  for(int i=blockIdx.x*blockDim.x+threadIdx.x;i<n;i+=gridDim.x*blockDim.x) y[i]=tanhf(x[i])+y[i];
}
template<class F> float graph_us(cudaStream_t s, F body, int reps){
  cudaGraph_t g; cudaGraphExec_t ge; cudaEvent_t a,b; cudaEventCreate(&a); cudaEventCreate(&b);
  cudaStreamBeginCapture(s,cudaStreamCaptureModeThreadLocal); body(); cudaStreamEndCapture(s,&g);
  if(cudaGraphInstantiate(&ge,g,0)){ printf("instantiate failed\n"); return -1; }
  for(int i=0;i<3;i++) cudaGraphLaunch(ge,s); cudaStreamSynchronize(s);
  float best=1e9; for(int t=0;t<7;t++){ cudaEventRecord(a,s); for(int r=0;r<reps;r++) cudaGraphLaunch(ge,s); cudaEventRecord(b,s); cudaEventSynchronize(b); float ms; cudaEventElapsedTime(&ms,a,b); if(ms<best) best=ms; }
  return best*1000.f/reps;
}
template<class K, class... A> void launch(cudaStream_t s, bool pdl, dim3 g, dim3 b, K k, A... a){
  cudaLaunchConfig_t c={}; c.gridDim=g; c.blockDim=b; c.stream=s; cudaLaunchAttribute at[1];
  at[0].id=cudaLaunchAttributeProgrammaticStreamSerialization; at[0].val.programmaticStreamSerializationAllowed=1;
  c.attrs=at; c.numAttrs=pdl?1:0; cudaLaunchKernelEx(&c,k,a...);
}
int main(){
  cudaDeviceProp p; cudaGetDeviceProperties(&p,0); printf("%s\n",p.name);
  cudaStream_t s; cudaStreamCreateWithFlags(&s,cudaStreamNonBlocking);
  float *x,*y; CK(cudaMalloc(&x,64<<20)); CK(cudaMalloc(&y,64<<20)); cudaMemset(x,0,64<<20); cudaMemset(y,0,64<<20);
  const int N=60;
  for(int pdl=0;pdl<2;pdl++){
    float t=graph_us(s,[&]{ for(int i=0;i<N;i++) launch(s,pdl,dim3(1),dim3(32),tiny,y,pdl); },20);
    printf("tiny x%d  pdl=%d: %.2f us a graph, %.2f us a node (%s)\n",N,pdl,t,t/N,cudaGetErrorString(cudaGetLastError()));
  }
  int sizes[]={3072*256, 3072*1024, 12*12*256*8};
  for(int n: sizes) for(int pdl=0;pdl<2;pdl++){
    int blocks=(n+255)/256; if(blocks>132*8) blocks=132*8;
    float one=graph_us(s,[&]{ launch(s,pdl,dim3(blocks),dim3(256),elem,(const float*)x,y,n,pdl); },200);
    float t=graph_us(s,[&]{ for(int i=0;i<N;i++) launch(s,pdl,dim3(blocks),dim3(256),elem,(const float*)x,y,n,pdl); },20);
    printf("elem n=%8d pdl=%d: alone %.2f us; chain of %d: %.2f us a node (%s)\n",n,pdl,one,N,t/N,cudaGetErrorString(cudaGetLastError()));
  }
  return 0;
}
