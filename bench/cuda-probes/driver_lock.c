// Probe 3: which driver calls block while a stream of the context waits on
// memory (cuStreamWaitValue32), and whether a copy in a second context, or
// in the same one, can run while such a call is blocked.
#include <cuda.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#define CK(x) do { CUresult r_ = (x); if (r_) { const char *n; cuGetErrorName(r_, &n); printf("%s:%d %s -> %s\n", __FILE__, __LINE__, #x, n); exit(1);} } while (0)
typedef CUresult (*ctxcreate_t)(CUcontext*,unsigned,CUdevice);
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
static CUcontext A, B; static CUstream sa, sb, sB; static volatile unsigned *word; static CUdeviceptr dword, dmem, victim;
static void *h; static const char *which; static volatile double call_done;
static void *blocker(void *x){ (void)x; CK(cuCtxSetCurrent(A)); double t0=now();
  if(!strcmp(which,"cuMemFree")) CK(cuMemFree(victim));
  else if(!strcmp(which,"cuMemAlloc")) { CUdeviceptr p; CK(cuMemAlloc(&p, 64<<20)); }
  else if(!strcmp(which,"cuMemHostRegister")) { void *m=aligned_alloc(4096,1<<20); CK(cuMemHostRegister(m,1<<20,CU_MEMHOSTREGISTER_PORTABLE)); }
  else if(!strcmp(which,"cuCtxSynchronize")) CK(cuCtxSynchronize());
  else if(!strcmp(which,"cuModuleLoadData")) { static const char ptx[]=".version 7.0\n.target sm_50\n.address_size 64\n.visible .entry k()\n{\n ret;\n}\n"; CUmodule m; CK(cuModuleLoadData(&m, ptx)); CUfunction f; CK(cuModuleGetFunction(&f,m,"k")); CUstream s; CK(cuStreamCreate(&s,CU_STREAM_NON_BLOCKING)); CK(cuLaunchKernel(f,1,1,1,1,1,1,0,s,0,0)); }
  else if(!strcmp(which,"cuStreamCreateDestroy")) { CUstream s; CK(cuStreamCreate(&s,CU_STREAM_NON_BLOCKING)); CK(cuStreamDestroy(s)); }
  else if(!strcmp(which,"cuMemHostAlloc")) { void *p; CK(cuMemHostAlloc(&p,1<<20,CU_MEMHOSTALLOC_DEVICEMAP|CU_MEMHOSTALLOC_PORTABLE)); }
  else if(!strcmp(which,"cuMemcpyDtoH")) { static char b[4096]; CK(cuMemcpyDtoH(b,dmem,4096)); }
  else if(!strcmp(which,"cuMemHostUnregister")) { void *m=aligned_alloc(4096,1<<20); CK(cuMemHostRegister(m,1<<20,CU_MEMHOSTREGISTER_PORTABLE)); CK(cuMemHostUnregister(m)); }
  else if(!strcmp(which,"cuMemFreeHost")) { void *p; CK(cuMemHostAlloc(&p,4096,0)); CK(cuMemFreeHost(p)); }
  call_done=now()-t0; return 0; }
static void *watchdog(void *x){(void)x; sleep(6); if(!*word){printf("  (watchdog: enqueue blocked; releasing the word)\n"); *word=1;} return 0;}
static int finishes(CUstream s,double secs){double t0=now();while(now()-t0<secs){CUresult r=cuStreamQuery(s);if(r==0)return 1;if(r!=CUDA_ERROR_NOT_READY)return 0;usleep(100);}return 0;}
int main(int argc,char**argv){ setvbuf(stdout,0,_IONBF,0); which=argv[1];
  CUdevice dev; CK(cuInit(0)); CK(cuDeviceGet(&dev,0)); CK(cuDevicePrimaryCtxRetain(&A,dev)); CK(cuCtxSetCurrent(A));
  CK(cuMemHostAlloc((void**)&word,64,CU_MEMHOSTALLOC_DEVICEMAP|CU_MEMHOSTALLOC_PORTABLE)); *word=0; CK(cuMemHostGetDevicePointer(&dword,(void*)word,0));
  CK(cuMemAlloc(&dmem,1<<20)); CK(cuMemAlloc(&victim,1<<20)); CK(cuMemHostAlloc(&h,1<<20,CU_MEMHOSTALLOC_PORTABLE));
  CK(cuStreamCreate(&sa,CU_STREAM_NON_BLOCKING)); CK(cuStreamCreate(&sb,CU_STREAM_NON_BLOCKING));
  CK(cuMemcpyHtoDAsync(dmem,h,4096,sb)); CK(cuStreamSynchronize(sb));
  ctxcreate_t cc=(ctxcreate_t)dlsym(RTLD_DEFAULT,"cuCtxCreate_v2"); CK(cc(&B,0,dev)); CK(cuStreamCreate(&sB,CU_STREAM_NON_BLOCKING)); CUcontext x; CK(cuCtxPopCurrent(&x));
  CK(cuCtxSetCurrent(B)); CK(cuMemcpyHtoDAsync(dmem,h,4096,sB)); CK(cuStreamSynchronize(sB)); CK(cuCtxSetCurrent(A));
  CK(cuStreamWaitValue32(sa,dword,1,CU_STREAM_WAIT_VALUE_GEQ));
  pthread_t t, w; pthread_create(&w,0,watchdog,0); call_done=-1; pthread_create(&t,0,blocker,0); usleep(300000);
  printf("%s while a stream waits: %s\n", which, call_done>=0?"returned":"BLOCKED");
  CK(cuCtxSetCurrent(B)); CK(cuMemcpyHtoDAsync(dmem,h,1<<20,sB)); printf("  copy in a second context: %s\n", finishes(sB,2)?"ran":"STUCK");
  CK(cuCtxSetCurrent(A)); CK(cuMemcpyHtoDAsync(dmem,h,1<<20,sb)); printf("  copy in the same context: %s\n", finishes(sb,2)?"ran":"STUCK");
  *word=1; pthread_join(t,0); printf("  released; %s returned\n", which); return 0; }
