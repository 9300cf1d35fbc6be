// dX and dW(+bias colsum stand-in) of each Linear backward: serial on one stream vs concurrent on two (graph captured).
#include <cstdio>
#include <cstdlib>
#include <cublas_v2.h>
#include <cuda_runtime.h>
#define CK(x) do{ auto e=(x); if(e){printf("ERR %s:%d %d\n",__FILE__,__LINE__,(int)e); exit(1);} }while(0)
__global__ void colsum(float* out, const float* g, int rows, int n){ // one thread per column, 
  int c=blockIdx.x*blockDim.x+threadIdx.x; if(c>=n) return; int r0=blockIdx.y*128; float s=0; for(int r=r0;r<r0+128&&r<rows;r++) s+=g[(size_t)r*n+c]; atomicAdd(out+c,s); }
int main(){
  const int M=3072; struct NK{const char*n;int N,K;} lin[]={{"qkv",768,256},{"o",256,256},{"f1",1024,256},{"f2",256,1024}};
  float *A,*B,*C,*D,*E; size_t big=64<<20; CK(cudaMalloc(&A,big)); CK(cudaMalloc(&B,big)); CK(cudaMalloc(&C,big)); CK(cudaMalloc(&D,big)); CK(cudaMalloc(&E,big));
  cudaMemset(A,0,big); cudaMemset(B,0,big);
  void *ws1,*ws2; CK(cudaMalloc(&ws1,32<<20)); CK(cudaMalloc(&ws2,32<<20));
  cudaStream_t s1,s2; cudaStreamCreateWithFlags(&s1,cudaStreamNonBlocking); cudaStreamCreateWithFlags(&s2,cudaStreamNonBlocking);
  cublasHandle_t h1,h2; cublasCreate(&h1); cublasCreate(&h2); cublasSetStream(h1,s1); cublasSetStream(h2,s2);
  cublasSetMathMode(h1,CUBLAS_PEDANTIC_MATH); cublasSetMathMode(h2,CUBLAS_PEDANTIC_MATH); cublasSetWorkspace(h1,ws1,32<<20); cublasSetWorkspace(h2,ws2,32<<20);
  cudaEvent_t fk,jn,a,b; cudaEventCreateWithFlags(&fk,cudaEventDisableTiming); cudaEventCreateWithFlags(&jn,cudaEventDisableTiming); cudaEventCreate(&a); cudaEventCreate(&b);
  float one=1;float zero=0;
  for(int mode=0;mode<2;mode++){
    cudaGraph_t g; cudaGraphExec_t ge; CK(cudaStreamBeginCapture(s1,cudaStreamCaptureModeThreadLocal));
    const int R=20;
    for(int r=0;r<R;r++) for(auto&l:lin){
      // dX = dY W : col-major m=K n=M k=N
      if(mode==1){ cudaEventRecord(fk,s1); cudaStreamWaitEvent(s2,fk,0);} 
      cublasSgemm(h1,CUBLAS_OP_N,CUBLAS_OP_N,l.K,M,l.N,&one,A,l.K,B,l.N,&zero,C,l.K);
      cublasHandle_t hw = mode? h2:h1; cudaStream_t sw = mode? s2:s1;
      cublasSgemm(hw,CUBLAS_OP_N,CUBLAS_OP_T,l.K,l.N,M,&one,A,l.K,B,l.N,&one,D,l.K);
      colsum<<<dim3((l.N+127)/128,M/128),128,0,sw>>>(E,B,M,l.N);
      if(mode==1){ cudaEventRecord(jn,s2); cudaStreamWaitEvent(s1,jn,0);} 
    }
    CK(cudaStreamEndCapture(s1,&g)); CK(cudaGraphInstantiate(&ge,g,0));
    cudaGraphLaunch(ge,s1); cudaStreamSynchronize(s1);
    float best=1e9; for(int t=0;t<5;t++){ cudaEventRecord(a,s1); cudaGraphLaunch(ge,s1); cudaEventRecord(b,s1); cudaEventSynchronize(b); float ms; cudaEventElapsedTime(&ms,a,b); if(ms<best)best=ms; }
    printf("%s: %.1f us per 4 linear backwards (dX+dW+colsum)\n", mode?"two streams":"one stream", best*1000/R);
  }
}
