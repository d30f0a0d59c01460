// Probe 4: how many device-side waits one stream can have pending before the
// enqueue blocks (and one stream with host functions between them).
#include <cuda.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
static volatile unsigned *word; static volatile int last;
static void *watchdog(void *x){(void)x; int seen=-1; for(;;){ sleep(2); if(last==seen){ printf("enqueue %d blocked; releasing\n", last+1); *word=1; return 0;} seen=last; }}
static void hf(void *d){(void)d;}
int main(int argc, char **argv){ setvbuf(stdout,0,_IONBF,0); int hostfn = argc > 1;
  CUdevice dev; CUcontext c; cuInit(0); cuDeviceGet(&dev,0); cuDevicePrimaryCtxRetain(&c,dev); cuCtxSetCurrent(c);
  cuMemHostAlloc((void**)&word,64,CU_MEMHOSTALLOC_DEVICEMAP|CU_MEMHOSTALLOC_PORTABLE); *word=0; CUdeviceptr d; cuMemHostGetDevicePointer(&d,(void*)word,0);
  CUstream s; cuStreamCreate(&s,CU_STREAM_NON_BLOCKING); pthread_t w; last=0; pthread_create(&w,0,watchdog,0);
  for(int i=1;i<=2000 && !*word;i++){ if(hostfn) cuLaunchHostFunc(s,hf,0); cuStreamWaitValue32(s,d,1,CU_STREAM_WAIT_VALUE_GEQ); cuStreamWriteValue32(s,d+4,i,0); last=i; }
  printf("%s: %d waits enqueued on one stream\n", hostfn?"host fn + wait + write":"wait + write", last); *word=1; cuCtxSynchronize(); return 0; }
