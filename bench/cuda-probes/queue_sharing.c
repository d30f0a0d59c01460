// Probe 2: where enqueueing blocks as streams pile up in device-side waits,
// and whether a copy stream created (and used) first still runs.
#include <cuda.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
#define CK(x) do { CUresult r_ = (x); if (r_) { const char *n; cuGetErrorName(r_, &n); printf("%s:%d %s -> %s\n", __FILE__, __LINE__, #x, n); exit(1);} } while (0)
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
static volatile unsigned *word; static double t_last; static const char *where="start";
static void *watchdog(void*a){(void)a; for(;;){usleep(100000); if(now()-t_last>3){printf("  STUCK at %s for 3 s: releasing the word\n",where); *word=1000000; return 0;}}}
static int finishes(CUstream s, double secs){double t0=now();while(now()-t0<secs){CUresult r=cuStreamQuery(s);if(r==CUDA_SUCCESS)return 1;if(r!=CUDA_ERROR_NOT_READY){printf("query err %d\n",r);return 0;}}return 0;}
static void host_fn(void *d){(void)d;}
int main(int argc,char**argv){
  setvbuf(stdout,0,_IONBF,0);
  int nblock = argc>1?atoi(argv[1]):64; int hostfn = argc>2?atoi(argv[2]):0;
  CUdevice dev; CUcontext ctx; CK(cuInit(0)); CK(cuDeviceGet(&dev,0)); CK(cuDevicePrimaryCtxRetain(&ctx,dev)); CK(cuCtxSetCurrent(ctx));
  CK(cuMemHostAlloc((void**)&word,64,CU_MEMHOSTALLOC_DEVICEMAP|CU_MEMHOSTALLOC_PORTABLE)); *word=0;
  CUdeviceptr dword; CK(cuMemHostGetDevicePointer(&dword,(void*)word,0));
  CUdeviceptr dmem; CK(cuMemAlloc(&dmem,1<<20)); void *h; CK(cuMemHostAlloc(&h,1<<20,0));
  CUstream cs; CK(cuStreamCreate(&cs,CU_STREAM_NON_BLOCKING)); CK(cuMemcpyHtoDAsync(dmem,h,4096,cs)); CK(cuStreamSynchronize(cs));
  CUstream *bs=calloc(nblock,sizeof *bs);
  for(int i=0;i<nblock;i++) CK(cuStreamCreate(&bs[i],CU_STREAM_NON_BLOCKING));
  printf("%d streams created; copy stream used once\n", nblock);
  t_last=now(); pthread_t w; pthread_create(&w,0,watchdog,0);
  int i;
  for(i=0;i<nblock;i++){
    if(hostfn){ where="cuLaunchHostFunc"; CK(cuLaunchHostFunc(bs[i],host_fn,0)); }
    where="cuStreamWaitValue32"; CK(cuStreamWaitValue32(bs[i],dword,1,CU_STREAM_WAIT_VALUE_GEQ));
    if(now()-t_last>2){printf("  enqueue %d returned only after the release\n",i+1);break;}
    t_last=now();
    if((i+1)%4==0 && *word==0){ where="copy"; CK(cuMemcpyHtoDAsync(dmem,h,4096,cs)); int ok=finishes(cs,1.0); t_last=now(); printf("%d waiting: copy on the early copy stream %s\n",i+1,ok?"ran":"STUCK 1 s"); if(!ok){ finishes(cs,10); } }
  }
  printf("%d waits enqueued; word %u\n", i, *word);
  *word=1000000; t_last=now()+100; CK(cuCtxSynchronize()); printf("all done\n");
  return 0;
}
