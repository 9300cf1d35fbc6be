// 3xTF32 by concatenated K: C = Ah*Bh + Ah*Bl + Al*Bh as ONE TF32 GEMM of inner size 3k, where
// op(A)' = [Ah Ah Al] and op(B)' = [Bh; Bl; Bh]. Times every fp32 GEMM shape of the XAsset L=1
// batched step: pedantic SGEMM (as ours) vs the split kernels + the TF32 GEMM; error vs fp64.
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <cmath>
#include <cstring>
#include <cublas_v2.h>
#include <cuda_runtime.h>
#define CK(x) do{ auto e=(x); if(e){printf("ERR %s:%d %d\n",__FILE__,__LINE__,(int)e); exit(1);} }while(0)
struct Shape { const char* name; cublasOperation_t ta, tb; int m,n,k,lda,ldb,ldc; };

__device__ __forceinline__ void split1(float x, float& hi, float& lo){
  unsigned u=__float_as_uint(x); unsigned r=(u+0x1000u)&0xFFFFE000u; hi=__uint_as_float(r); lo=x-hi;
}
// k contiguous: src is `outer` vectors of length k (stride ld); dst is `outer` vectors of 3k.
// pattern bit i set = lo in third i.
__global__ void split_inner(const float* src,int k,int ld,int outer,float* dst,int pat){
  int o=blockIdx.y; const float* s=src+(size_t)o*ld; float* d=dst+(size_t)o*3*k;
  for(int i=blockIdx.x*blockDim.x+threadIdx.x;i<k;i+=gridDim.x*blockDim.x){
    float h,l; split1(s[i],h,l);
    d[i]=(pat&1)?l:h; d[k+i]=(pat&2)?l:h; d[2*k+i]=(pat&4)?l:h;
  }
}
// k outer: src is k vectors of length len (stride ld); dst is 3k vectors of length len (stride len).
__global__ void split_outer(const float* src,int len,int ld,int k,float* dst,int pat){
  size_t total=(size_t)len*k;
  for(size_t t=(size_t)blockIdx.x*blockDim.x+threadIdx.x;t<total;t+=(size_t)gridDim.x*blockDim.x){
    int j=t/len, i=t%len; float h,l; split1(src[(size_t)j*ld+i],h,l);
    size_t blk=(size_t)len*k;
    dst[t]=(pat&1)?l:h; dst[blk+t]=(pat&2)?l:h; dst[2*blk+t]=(pat&4)?l:h;
  }
}
template<class F> static float timeit(cudaStream_t s, int reps, F fn){
  cudaEvent_t a,b; cudaEventCreate(&a); cudaEventCreate(&b);
  for(int i=0;i<5;i++) fn(); cudaStreamSynchronize(s);
  cudaGraph_t g; cudaGraphExec_t ge;
  CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  for(int i=0;i<reps;i++) fn();
  CK(cudaStreamEndCapture(s,&g)); CK(cudaGraphInstantiate(&ge,g,0));
  cudaGraphLaunch(ge,s); cudaStreamSynchronize(s);
  float best=1e9;
  for(int t=0;t<5;t++){ cudaEventRecord(a,s); cudaGraphLaunch(ge,s); cudaEventRecord(b,s); cudaEventSynchronize(b);
    float ms; cudaEventElapsedTime(&ms,a,b); if(ms<best) best=ms; }
  cudaGraphExecDestroy(ge); cudaGraphDestroy(g);
  return best*1000.f/reps;
}
int main(){
  const int M=3072;
  struct NK{const char*n;int N,K;} lin[]={{"emb",256,193},{"qkv",768,256},{"o",256,256},{"f1",1024,256},{"f2",256,1024}};
  std::vector<Shape> sh;
  for(auto&l:lin){ char* nm;
    asprintf(&nm,"%s.fwd",l.n); sh.push_back({nm,CUBLAS_OP_T,CUBLAS_OP_N,l.N,M,l.K,l.K,l.K,l.N});
    if(l.K!=193){ asprintf(&nm,"%s.dx",l.n); sh.push_back({nm,CUBLAS_OP_N,CUBLAS_OP_N,l.K,M,l.N,l.K,l.N,l.K}); }
    asprintf(&nm,"%s.dw",l.n); sh.push_back({nm,CUBLAS_OP_N,CUBLAS_OP_T,l.K,l.N,M,l.K,l.N,l.K});
  }
  size_t big=64<<20; float *A,*B,*C,*A3,*B3; CK(cudaMalloc(&A,big)); CK(cudaMalloc(&B,big)); CK(cudaMalloc(&C,big));
  CK(cudaMalloc(&A3,3*big)); CK(cudaMalloc(&B3,3*big));
  std::vector<float> ha(big/4), hb(big/4); srand(7);
  for(auto&v:ha) v=(rand()/(float)RAND_MAX-0.5f)*2.f; for(auto&v:hb) v=(rand()/(float)RAND_MAX-0.5f)*0.1f;
  cudaMemcpy(A,ha.data(),big,cudaMemcpyHostToDevice); cudaMemcpy(B,hb.data(),big,cudaMemcpyHostToDevice);
  void* ws; size_t wsz=32<<20; CK(cudaMalloc(&ws,wsz));
  cudaStream_t s; cudaStreamCreate(&s);
  cublasHandle_t h; cublasCreate(&h); cublasSetStream(h,s); cublasSetWorkspace(h,ws,wsz);
  float one=1,zero=0; const int R=100;
  double t32=0,tsplit=0,tg=0,tgl=0;
  std::vector<float> hc;
  printf("%-8s %9s %9s %9s %9s %9s   %9s %9s\n","shape","fp32 us","splitA","splitB","tf32x3k","total","err fp32","err 3xtf");
  for(auto& x: sh){
    cublasSetMathMode(h,CUBLAS_PEDANTIC_MATH);
    auto f32=[&]{cublasSgemm(h,x.ta,x.tb,x.m,x.n,x.k,&one,A,x.lda,B,x.ldb,&zero,C,x.ldc);};
    float a32=timeit(s,R,f32);
    // error helper: op(A)(i,t), op(B)(t,j) from host copies (col-major)
    auto opA=[&](int i,int t){ return x.ta==CUBLAS_OP_N? ha[(size_t)t*x.lda+i] : ha[(size_t)i*x.lda+t]; };
    auto opB=[&](int t,int j){ return x.tb==CUBLAS_OP_N? hb[(size_t)j*x.ldb+t] : hb[(size_t)t*x.ldb+j]; };
    auto err=[&]{ hc.resize((size_t)x.ldc*x.n); cudaMemcpy(hc.data(),C,hc.size()*4,cudaMemcpyDeviceToHost);
      double num=0,den=0; for(int j=0;j<x.n;j+=37) for(int i=0;i<x.m;i+=29){ double r=0; for(int t=0;t<x.k;t++) r+=(double)opA(i,t)*opB(t,j);
        double d=hc[(size_t)j*x.ldc+i]-r; num+=d*d; den+=r*r; } return sqrt(num/den); };
    f32(); cudaStreamSynchronize(s); double e32=err();
    // split A: op(A) is m x k. ta=T: A stored k x m (lda), k contiguous -> inner. ta=N: stored m x k, k outer.
    int lda3, ldb3;
    auto sA=[&]{ if(x.ta==CUBLAS_OP_T){ dim3 g((x.k+255)/256>4?4:(x.k+255)/256, x.m); split_inner<<<g,256,0,s>>>(A,x.k,x.lda,x.m,A3,4); }
                 else { split_outer<<<1024,256,0,s>>>(A,x.m,x.lda,x.k,A3,4); } };
    lda3 = x.ta==CUBLAS_OP_T? 3*x.k : x.m;
    auto sB=[&]{ if(x.tb==CUBLAS_OP_N){ dim3 g((x.k+255)/256>4?4:(x.k+255)/256, x.n); split_inner<<<g,256,0,s>>>(B,x.k,x.ldb,x.n,B3,2); }
                 else { split_outer<<<1024,256,0,s>>>(B,x.n,x.ldb,x.k,B3,2); } };
    ldb3 = x.tb==CUBLAS_OP_N? 3*x.k : x.n;
    cublasSetMathMode(h,CUBLAS_DEFAULT_MATH);
    auto g3=[&]{ cublasGemmEx(h,x.ta,x.tb,x.m,x.n,3*x.k,&one,A3,CUDA_R_32F,lda3,B3,CUDA_R_32F,ldb3,&zero,C,CUDA_R_32F,x.ldc,CUBLAS_COMPUTE_32F_FAST_TF32,CUBLAS_GEMM_DEFAULT); };
    float asa=timeit(s,R,sA), asb=timeit(s,R,sB), ag=timeit(s,R,g3);
    sA(); sB(); g3(); cudaStreamSynchronize(s); double e3=err();
    auto all=[&]{ sA(); sB(); g3(); }; float aall=timeit(s,R,all);
    printf("%-8s %9.2f %9.2f %9.2f %9.2f %9.2f   %9.2e %9.2e  %s\n",x.name,a32,asa,asb,ag,aall,e32,e3,cudaGetErrorString(cudaGetLastError()));
    t32+=a32; tsplit+=asa+asb; tg+=ag; tgl+=aall;
  }
  printf("TOTAL fp32 %.1f us; 3xTF32 split %.1f + gemm %.1f; together %.1f us\n",t32,tsplit,tg,tgl);
}
