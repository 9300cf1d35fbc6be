// LayerNorm with the residual add, tanh's backward with its column sums, AdamW and the pooled
// head's backward at the batched step's shapes, kernels from the folder given with -I: time in a
// graph, and every output dumped to the file named by argv[1], so two builds (two kernel
// folders) can be compared bit for bit with cmp.
#include <cstdio>
#include <vector>
#include <cmath>
#include <cuda_runtime.h>
#include "graph_timing.cuh"
#include "rows.cu"
#include "fused.cu"
#include "train.cu"
static u64 cdiv(u64 a, u64 b){ return (a+b-1)/b; }
int main(int argc, char** argv){
  FILE* dump = fopen(argv[1], "wb");
  cudaStream_t s; CK(cudaStreamCreateWithFlags(&s,cudaStreamNonBlocking));
  const size_t big = 64<<20;
  float *a,*b,*c,*d,*e,*f,*part,*w,*bias; unsigned* tickets;
  for (float** t: {&a,&b,&c,&d,&e,&f,&part,&w,&bias}) CK(cudaMalloc(t,big));
  CK(cudaMalloc(&tickets,4096*4)); cudaMemset(tickets,0,4096*4);
  std::vector<float> h(big/4); for(size_t i=0;i<h.size();i++) h[i]=0.001f*(float)((i*2654435761u)%2001)-1.0f;
  for(float* t: {a,b,w,bias,e}) CK(cudaMemcpy(t,h.data(),big,cudaMemcpyHostToDevice));
  auto save = [&](float* p, size_t n){ std::vector<float> v(n); CK(cudaStreamSynchronize(s)); cudaMemcpy(v.data(),p,n*4,cudaMemcpyDeviceToHost); fwrite(v.data(),4,n,dump); };
  for (u64 n: {256ull, 193ull, 64ull, 512ull}) {
    u64 rows = 3072;
    auto k=[&]{ zc_add_layer_norm_rows_f32<<<cdiv(rows,8),256,0,s>>>(c,d,f,f+(1<<20),a,b,w,bias,1,1,rows,n,1e-5f); };
    k(); save(c,rows*n); save(d,rows*n); save(f,rows); save(f+(1<<20),rows);
    printf("add_layer_norm [%llu, %llu]: %.2f us\n", rows, n, graph_us(s,k,20));
  }
  for (u64 n: {1024ull, 256ull, 1000ull}) {
    u64 rows=3072, tiles=cdiv(n,32), wanted=std::min(std::max<u64>(1024/tiles,1), std::max<u64>(rows/32,1)), chunk=cdiv(rows,wanted), chunks=cdiv(rows,chunk);
    auto k=[&]{ zc_tanh_backward_cols_f32<<<dim3(tiles,chunks),256,0,s>>>(c,part,d,tickets,a,b,rows,n,chunk); };
    cudaMemsetAsync(d,0,n*4,s); k(); save(c,rows*n); save(d,n);
    printf("tanh_backward_cols [%llu, %llu] (%llu chunks of %llu): %.2f us\n", rows, n, chunks, chunk, graph_us(s,k,20));
    // in place: gx is g
    CK(cudaMemcpyAsync(e,a,rows*n*4,cudaMemcpyDeviceToDevice,s)); cudaMemsetAsync(d,0,n*4,s);
    zc_tanh_backward_cols_f32<<<dim3(tiles,chunks),256,0,s>>>(e,part,d,tickets,e,b,rows,n,chunk); save(e,rows*n); save(d,n);
  }
  // AdamW over XAsset's L = 1 and L = 3 parameter counts, slot [lr, t, gate 0]
  { std::vector<float> slot = {1e-3f, 3.0f, 0.0f}; float* sl; CK(cudaMalloc(&sl,16)); CK(cudaMemcpy(sl,slot.data(),12,cudaMemcpyHostToDevice));
    for (u64 n: {839937ull, 2419969ull}) {
      u64 blocks = std::min<u64>(cdiv(n,1024),16384);
      CK(cudaMemcpy(c,h.data(),n*4,cudaMemcpyHostToDevice)); CK(cudaMemcpy(d,h.data()+7,n*4,cudaMemcpyHostToDevice)); CK(cudaMemcpy(f,h.data()+13,n*4,cudaMemcpyHostToDevice));
      // v must be >= 0: use |h|
      { std::vector<float> av(n); for(size_t i=0;i<n;i++) av[i]=fabsf(h[i+13]); CK(cudaMemcpy(f,av.data(),n*4,cudaMemcpyHostToDevice)); }
      zc_adamw_f32<<<blocks,256,0,s>>>(c,d,f,a,sl,n,0.9f,0.999f,1e-8f,0.01f,3); save(c,n); save(d,n); save(f,n);
      auto k=[&]{ zc_adamw_f32<<<blocks,256,0,s>>>(c,d,f,a,sl,n,0.9f,0.999f,1e-8f,0.01f,3); };
      printf("adamw n %llu: %.2f us\n", n, graph_us(s,k,20));
    } }
  // the pooled head's backward, batch 256, S 12, d 256 (96 parts)
  { u64 batch=256, S=12, dd=256, rows=batch*S, parts=cdiv(rows,32);
    float* g1; CK(cudaMalloc(&g1,16)); float one=1.0f; CK(cudaMemcpy(g1,&one,4,cudaMemcpyHostToDevice));
    std::vector<float> lab(batch); for(u64 i=0;i<batch;i++) lab[i]=(float)(i%3==0); CK(cudaMemcpy(bias,lab.data(),batch*4,cudaMemcpyHostToDevice));
    auto k=[&]{ zc_pool_head_bce_backward_last_f32<<<dim3(cdiv(dd,32),parts),dim3(32,8),0,s>>>(c,part,d,f,tickets,g1,a,w,b,bias,batch,S,dd,1u); };
    cudaMemsetAsync(d,0,dd*4,s); cudaMemsetAsync(f,0,4,s); k(); save(c,rows*dd); save(d,dd); save(f,1);
    printf("pooled head backward (256 x 12 x 256, %llu parts): %.2f us\n", parts, graph_us(s,k,20)); }
  fclose(dump);
  return 0;
}
