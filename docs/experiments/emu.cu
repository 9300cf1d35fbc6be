// fp32 GEMM f1.fwd-like shape: pedantic SGEMM vs BF16x9 emulation vs TF32 (speed and error vs fp64 reference on the host).
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <cmath>
#include <cublas_v2.h>
#include <cuda_runtime.h>
int main(){
  int m=1024,n=3072,k=256; // col-major C[m,n] = A^T[m,k] B[k,n]
  std::vector<float> ha((size_t)k*m), hb((size_t)k*n); srand(1);
  for(auto&v:ha) v=(rand()/(float)RAND_MAX-0.5f); for(auto&v:hb) v=(rand()/(float)RAND_MAX-0.5f);
  float *A,*B,*C; cudaMalloc(&A,ha.size()*4); cudaMalloc(&B,hb.size()*4); cudaMalloc(&C,(size_t)m*n*4);
  cudaMemcpy(A,ha.data(),ha.size()*4,cudaMemcpyHostToDevice); cudaMemcpy(B,hb.data(),hb.size()*4,cudaMemcpyHostToDevice);
  void* ws; cudaMalloc(&ws,32<<20);
  cublasHandle_t h; cublasCreate(&h); cublasSetWorkspace(h,ws,32<<20);
  // reference on a sample of outputs
  struct Mode{const char* name; cublasComputeType_t ct; cublasMath_t mm;} modes[]={
    {"fp32 pedantic",CUBLAS_COMPUTE_32F_PEDANTIC,CUBLAS_PEDANTIC_MATH},
    {"fp32 default",CUBLAS_COMPUTE_32F,CUBLAS_DEFAULT_MATH},
    {"bf16x9 emulated",CUBLAS_COMPUTE_32F_EMULATED_16BFX9,CUBLAS_DEFAULT_MATH},
    {"tf32",CUBLAS_COMPUTE_32F_FAST_TF32,CUBLAS_DEFAULT_MATH}};
  float one=1,zero=0; cudaEvent_t a,b; cudaEventCreate(&a); cudaEventCreate(&b);
  std::vector<float> hc((size_t)m*n);
  for(auto& md: modes){
    cublasSetMathMode(h,md.mm);
    auto st=cublasGemmEx(h,CUBLAS_OP_T,CUBLAS_OP_N,m,n,k,&one,A,CUDA_R_32F,k,B,CUDA_R_32F,k,&zero,C,CUDA_R_32F,m,md.ct,CUBLAS_GEMM_DEFAULT);
    if(st){printf("%s: status %d\n",md.name,(int)st); continue;}
    cudaDeviceSynchronize(); cudaEventRecord(a); for(int i=0;i<200;i++) cublasGemmEx(h,CUBLAS_OP_T,CUBLAS_OP_N,m,n,k,&one,A,CUDA_R_32F,k,B,CUDA_R_32F,k,&zero,C,CUDA_R_32F,m,md.ct,CUBLAS_GEMM_DEFAULT);
    cudaEventRecord(b); cudaEventSynchronize(b); float ms; cudaEventElapsedTime(&ms,a,b);
    cudaMemcpy(hc.data(),C,hc.size()*4,cudaMemcpyDeviceToHost);
    double num=0,den=0; for(int j=0;j<n;j+=7) for(int i=0;i<m;i+=5){ double r=0; for(int t=0;t<k;t++) r+=(double)ha[(size_t)i*k+t]*hb[(size_t)j*k+t]; double d=hc[(size_t)j*m+i]-r; num+=d*d; den+=r*r; }
    printf("%-16s %7.2f us  rel err %.2e  (%s)\n",md.name,ms*1000/200,sqrt(num/den),cudaGetErrorString(cudaGetLastError()));
  }
}
