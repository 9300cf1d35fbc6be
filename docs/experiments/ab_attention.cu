// attention_short.cu's kernels (from the folder given with -I) at XAsset's shapes: time in a
// graph, and the outputs dumped to the file named by argv[1] for a bitwise comparison of two
// builds.
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <cuda_runtime.h>
#include "graph_timing.cuh"
#include "attention_short.cu"
static float* dev(size_t n, float scale, float off){ std::vector<float> h(n); for(auto&v:h) v=off+scale*(rand()/(float)RAND_MAX-0.5f); float* d; CK(cudaMalloc(&d,n*4)); CK(cudaMemcpy(d,h.data(),n*4,cudaMemcpyHostToDevice)); return d; }
int main(int argc, char** argv){
  FILE* dump=fopen(argv[1],"wb");
  unsigned H=4; float eps=1e-5f;
  cudaStream_t s; cudaStreamCreateWithFlags(&s,cudaStreamNonBlocking);
  for (unsigned dh: {64u, 32u}) for (unsigned S: {12u, 16u, 5u}) for(unsigned B: {256u, 64u, 1u}){
    srand(B*100+S+dh);
    size_t nq=(size_t)B*S*3*H*dh, no=(size_t)B*S*H*dh, np=4ull*B*H*dh;
    float* qkv=dev(nq,4.f,0.f); float* g=dev(no,2.f,0.f);
    float* qw=dev(dh,0.5f,1.f); float* qb=dev(dh,0.2f,0.f); float* kw=dev(dh,0.5f,1.f); float* kb=dev(dh,0.2f,0.f);
    float *o,*gq,*p; CK(cudaMalloc(&o,no*4)); CK(cudaMalloc(&gq,nq*4)); CK(cudaMalloc(&p,np*4));
    unsigned blocks=B*H, warps = blocks>=512 ? 4 : S;
    size_t fs=4*2*S*dh, bs=4*(8*S*dh+2*S*S+S);
    auto fw=[&]{ if(dh==64) zc_qk_norm_attention_dh64_f32<<<blocks,32*warps,fs,s>>>(o,qkv,qw,qb,kw,kb,B,S,H,dh,eps); else zc_qk_norm_attention_dh32_f32<<<blocks,32*warps,fs,s>>>(o,qkv,qw,qb,kw,kb,B,S,H,dh,eps); };
    auto bw=[&]{ if(dh==64) zc_qk_norm_attention_backward_dh64_f32<<<blocks,32*warps,bs,s>>>(gq,p,g,qkv,qw,qb,kw,kb,B,S,H,dh,eps); else zc_qk_norm_attention_backward_dh32_f32<<<blocks,32*warps,bs,s>>>(gq,p,g,qkv,qw,qb,kw,kb,B,S,H,dh,eps); };
    cudaMemset(o,0,no*4); cudaMemset(gq,0,nq*4); fw(); bw(); CK(cudaStreamSynchronize(s));
    std::vector<float> h1(no), h2(nq), h3(np);
    cudaMemcpy(h1.data(),o,no*4,cudaMemcpyDeviceToHost); cudaMemcpy(h2.data(),gq,nq*4,cudaMemcpyDeviceToHost); cudaMemcpy(h3.data(),p,np*4,cudaMemcpyDeviceToHost);
    fwrite(h1.data(),4,no,dump); fwrite(h2.data(),4,nq,dump); fwrite(h3.data(),4,np,dump);
    if (S==12) printf("dh %u S %u B %u (%u heads, %u warps): forward %.2f us, backward %.2f us\n",dh,S,B,blocks,warps,graph_us(s,fw,20),graph_us(s,bw,20));
    cudaFree(qkv); cudaFree(g); cudaFree(qw); cudaFree(qb); cudaFree(kw); cudaFree(kb); cudaFree(o); cudaFree(gq); cudaFree(p);
  }
  fclose(dump);
  return 0;
}
