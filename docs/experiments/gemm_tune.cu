// Times every fp32 GEMM of the XAsset L=1 batched step (B=256,S=12): cublasSgemm (pedantic, as
// ours) vs cublasLt heuristic algorithms with split-K variants. Prints per shape the best.
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <cstring>
#include <cublas_v2.h>
#include <cublasLt.h>
#include <cuda_runtime.h>
#define CK(x) do{ auto e=(x); if(e){printf("ERR %s:%d %d\n",__FILE__,__LINE__,(int)e); exit(1);} }while(0)
struct Shape { const char* name; cublasOperation_t ta, tb; int m,n,k,lda,ldb,ldc; };
template<class F> static float timeit(cudaStream_t s, int reps, F fn){
  cudaEvent_t a,b; cudaEventCreate(&a); cudaEventCreate(&b);
  for(int i=0;i<5;i++) fn(); cudaStreamSynchronize(s);
  // capture reps calls in a graph to mimic our captured step
  cudaGraph_t g; cudaGraphExec_t ge;
  CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  for(int i=0;i<reps;i++) fn();
  CK(cudaStreamEndCapture(s,&g)); CK(cudaGraphInstantiate(&ge,g,0));
  cudaGraphLaunch(ge,s); cudaStreamSynchronize(s);
  float best=1e9;
  for(int t=0;t<5;t++){ cudaEventRecord(a,s); cudaGraphLaunch(ge,s); cudaEventRecord(b,s); cudaEventSynchronize(b);
    float ms; cudaEventElapsedTime(&ms,a,b); if(ms<best) best=ms; }
  cudaGraphExecDestroy(ge); cudaGraphDestroy(g);
  return best*1000.f/reps; // us
}
int main(){
  const int M=3072; int L=getenv("L")?atoi(getenv("L")):1; (void)L;
  struct NK{const char*n;int N,K;} lin[]={{"emb",256,193},{"qkv",768,256},{"o",256,256},{"f1",1024,256},{"f2",256,1024}};
  std::vector<Shape> sh;
  for(auto&l:lin){ char* nm;
    asprintf(&nm,"%s.fwd",l.n); sh.push_back({nm,CUBLAS_OP_T,CUBLAS_OP_N,l.N,M,l.K,l.K,l.K,l.N});
    if(l.K!=193){ asprintf(&nm,"%s.dx",l.n); sh.push_back({nm,CUBLAS_OP_N,CUBLAS_OP_N,l.K,M,l.N,l.K,l.N,l.K}); }
    asprintf(&nm,"%s.dw",l.n); sh.push_back({nm,CUBLAS_OP_N,CUBLAS_OP_T,l.K,l.N,M,l.K,l.N,l.K});
  }
  float *A,*B,*C; size_t big=64<<20; CK(cudaMalloc(&A,big)); CK(cudaMalloc(&B,big)); CK(cudaMalloc(&C,big));
  cudaMemset(A,0,big); cudaMemset(B,0,big); cudaMemset(C,0,big);
  void* ws; size_t wsz=32<<20; CK(cudaMalloc(&ws,wsz));
  cudaStream_t s; cudaStreamCreate(&s);
  cublasHandle_t h; cublasCreate(&h); cublasSetStream(h,s); cublasSetMathMode(h,CUBLAS_PEDANTIC_MATH);
  cublasSetWorkspace(h,ws,wsz);
  cublasLtHandle_t lt; cublasLtCreate(&lt);
  float one=1,zero=0; const int R=100;
  double tot_def=0,tot_h0=0,tot_best=0;
  for(auto& x: sh){
    float tdef=timeit(s,R,[&]{cublasSgemm(h,x.ta,x.tb,x.m,x.n,x.k,&one,A,x.lda,B,x.ldb,&zero,C,x.ldc);});
    cublasLtMatmulDesc_t d; CK(cublasLtMatmulDescCreate(&d,CUBLAS_COMPUTE_32F,CUDA_R_32F));
    cublasLtMatmulDescSetAttribute(d,CUBLASLT_MATMUL_DESC_TRANSA,&x.ta,sizeof(x.ta));
    cublasLtMatmulDescSetAttribute(d,CUBLASLT_MATMUL_DESC_TRANSB,&x.tb,sizeof(x.tb));
    const char* E=getenv("EPI"); bool isdw=strstr(x.name,".dw"), isfwd=strstr(x.name,".fwd");
    if(E && ((!strcmp(E,"bgradb")&&isdw) || (!strcmp(E,"bias")&&isfwd))){
      cublasLtEpilogue_t ep = isdw? CUBLASLT_EPILOGUE_BGRADB : CUBLASLT_EPILOGUE_BIAS;
      CK(cublasLtMatmulDescSetAttribute(d,CUBLASLT_MATMUL_DESC_EPILOGUE,&ep,sizeof(ep)));
      void* bp = (char*)C + (48<<20); CK(cublasLtMatmulDescSetAttribute(d,CUBLASLT_MATMUL_DESC_BIAS_POINTER,&bp,sizeof(bp)));
      cudaDataType_t bt=CUDA_R_32F; cublasLtMatmulDescSetAttribute(d,CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,&bt,sizeof(bt));
    }
    int ar=x.ta==CUBLAS_OP_N?x.m:x.k, ac=x.ta==CUBLAS_OP_N?x.k:x.m;
    int br=x.tb==CUBLAS_OP_N?x.k:x.n, bc=x.tb==CUBLAS_OP_N?x.n:x.k;
    cublasLtMatrixLayout_t la,lb,lc; cublasLtMatrixLayoutCreate(&la,CUDA_R_32F,ar,ac,x.lda);
    cublasLtMatrixLayoutCreate(&lb,CUDA_R_32F,br,bc,x.ldb); cublasLtMatrixLayoutCreate(&lc,CUDA_R_32F,x.m,x.n,x.ldc);
    cublasLtMatmulPreference_t p; cublasLtMatmulPreferenceCreate(&p);
    cublasLtMatmulPreferenceSetAttribute(p,CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,&wsz,sizeof(wsz));
    cublasLtMatmulHeuristicResult_t res[32]; int nres=0;
    {auto st=cublasLtMatmulAlgoGetHeuristic(lt,d,la,lb,lc,lc,p,32,res,&nres); if(st||nres==0){printf("%-8s no algo (status %d)\n",x.name,(int)st); continue;}}
    float th0=1e9,tbest=1e9; int bi=-1,bsk=0,bsch=0,btile=0; 
    std::vector<cublasLtMatmulAlgo_t> cands;
    for(int i=0;i<nres;i++){ cands.push_back(res[i].algo);
      int sks[]={2,3,4,6,8,12,16};
      for(int sk: sks){ cublasLtMatmulAlgo_t a=res[i].algo; 
        cublasLtMatmulAlgoConfigSetAttribute(&a,CUBLASLT_ALGO_CONFIG_SPLITK_NUM,&sk,sizeof(sk));
        uint32_t sch=CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE; cublasLtMatmulAlgoConfigSetAttribute(&a,CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME,&sch,sizeof(sch));
        cublasLtMatmulHeuristicResult_t chk; if(cublasLtMatmulAlgoCheck(lt,d,la,lb,lc,lc,&a,&chk)==CUBLAS_STATUS_SUCCESS && chk.workspaceSize<=wsz) cands.push_back(a);
        sch=CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE; cublasLtMatmulAlgoConfigSetAttribute(&a,CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME,&sch,sizeof(sch));
        if(cublasLtMatmulAlgoCheck(lt,d,la,lb,lc,lc,&a,&chk)==CUBLAS_STATUS_SUCCESS && chk.workspaceSize<=wsz) cands.push_back(a);
      }
    }
    for(size_t i=0;i<cands.size();i++){ auto a=cands[i];
      float t=timeit(s,R,[&]{cublasLtMatmul(lt,d,&one,A,la,B,lb,&zero,C,lc,C,lc,&a,ws,wsz,s);});
      if(i==0) th0=t; if(t<tbest){tbest=t;bi=i;
        size_t w; cublasLtMatmulAlgoConfigGetAttribute(&a,CUBLASLT_ALGO_CONFIG_SPLITK_NUM,&bsk,sizeof(bsk),&w);
        cublasLtMatmulAlgoConfigGetAttribute(&a,CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME,&bsch,sizeof(bsch),&w);
        cublasLtMatmulAlgoConfigGetAttribute(&a,CUBLASLT_ALGO_CONFIG_TILE_ID,&btile,sizeof(btile),&w);}
    }
    printf("%-8s m=%5d n=%5d k=%5d  sgemm %7.2f us  lt[0] %7.2f  best %7.2f (cand %d/%zu splitk %d scheme %d tile %d)\n",x.name,x.m,x.n,x.k,tdef,th0,tbest,bi,cands.size(),bsk,bsch,btile);
    tot_def+=tdef; tot_h0+=th0; tot_best+=tbest;
  }
  printf("TOTAL sgemm %.1f us  lt[0] %.1f  best %.1f\n",tot_def,tot_h0,tot_best);
}
