// Probe: which streams can still run work while many streams are blocked in
// cuStreamWaitValue32 on an unset word.
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <dlfcn.h>
typedef CUresult (*ctxcreate_t)(CUcontext*,unsigned,CUdevice);
#define CK(x) do { CUresult r_ = (x); if (r_) { const char *n; cuGetErrorName(r_, &n); printf("%s:%d %s -> %s\n", __FILE__, __LINE__, #x, n); exit(1);} } while (0)
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
static int finishes(CUstream s, double secs){double t0=now();while(now()-t0<secs){CUresult r=cuStreamQuery(s);if(r==CUDA_SUCCESS)return 1;if(r!=CUDA_ERROR_NOT_READY){printf("query err %d\n",r);return 0;}}return 0;}
int main(int argc,char**argv){
  setvbuf(stdout,0,_IONBF,0);
  int nblock = argc>1?atoi(argv[1]):64;
  CUdevice dev; CUcontext ctx; CK(cuInit(0)); CK(cuDeviceGet(&dev,0)); CK(cuDevicePrimaryCtxRetain(&ctx,dev)); CK(cuCtxSetCurrent(ctx));
  int lo,hi; CK(cuCtxGetStreamPriorityRange(&lo,&hi)); printf("priority range least %d greatest %d\n",lo,hi);
  volatile unsigned *word; CK(cuMemHostAlloc((void**)&word,64,CU_MEMHOSTALLOC_DEVICEMAP|CU_MEMHOSTALLOC_PORTABLE)); *word=0;
  CUdeviceptr dword; CK(cuMemHostGetDevicePointer(&dword,(void*)word,0));
  CUdeviceptr dmem; CK(cuMemAlloc(&dmem,1<<20)); void *h; CK(cuMemHostAlloc(&h,1<<20,0));
  // copy streams created first (as the library does at first registration)
  CUstream cdef, chi; CK(cuStreamCreate(&cdef,CU_STREAM_NON_BLOCKING)); CK(cuStreamCreateWithPriority(&chi,CU_STREAM_NON_BLOCKING,hi));
  CUstream *bs=calloc(nblock,sizeof *bs);
  for(int i=0;i<nblock;i++){CK(cuStreamCreate(&bs[i],CU_STREAM_NON_BLOCKING)); CK(cuStreamWaitValue32(bs[i],dword,1,CU_STREAM_WAIT_VALUE_GEQ)); if(i%8==7)printf("blocked %d\n",i+1);}
  printf("%d streams blocked\n",nblock);
  CK(cuMemcpyHtoDAsync(dmem,h,1<<20,cdef)); printf("copy on default-priority stream created first: %s\n", finishes(cdef,2)?"ran":"STUCK");
  CK(cuMemcpyHtoDAsync(dmem,h,1<<20,chi)); printf("copy on high-priority stream created first: %s\n", finishes(chi,2)?"ran":"STUCK");
  CUstream nhi; CK(cuStreamCreateWithPriority(&nhi,CU_STREAM_NON_BLOCKING,hi));
  CK(cuMemcpyHtoDAsync(dmem,h,1<<20,nhi)); printf("copy on high-priority stream created after: %s\n", finishes(nhi,2)?"ran":"STUCK");
  CUstream nlo; CK(cuStreamCreate(&nlo,CU_STREAM_NON_BLOCKING));
  CK(cuMemcpyHtoDAsync(dmem,h,1<<20,nlo)); printf("copy on new default stream: %s\n", finishes(nlo,2)?"ran":"STUCK");
  // another context
  CUcontext c2; CUctxCreateParams *p=0; (void)p;
  ctxcreate_t cc=(ctxcreate_t)dlsym(RTLD_DEFAULT,"cuCtxCreate_v2"); CUresult r = cc? cc(&c2,0,dev) : 999;
  if(r==0){ CUstream s2; CK(cuStreamCreate(&s2,CU_STREAM_NON_BLOCKING));
     r=cuMemcpyHtoDAsync(dmem,h,1<<20,s2); printf("copy from second context into primary ctx memory: enqueue %d, %s\n", r, r?"-":(finishes(s2,2)?"ran":"STUCK"));
     CK(cuCtxSetCurrent(ctx)); }
  else printf("cuCtxCreate failed %d\n",r);
  *word=1; __sync_synchronize();
  CK(cuCtxSynchronize()); printf("released, all done\n");
  return 0;
}
