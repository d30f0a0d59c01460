// Where ugds's libcufile and NVIDIA's disagreed in test_cufile's reference
// run: each call alone, its return, errno, and what follows from it, printed
// so that both libraries can be compared line by line. Built against the
// library under test (NVIDIA's on the GPU machine, or ugds's):
//   gcc -I$CUDA/include probe_reference.c -L$LIB -lcufile -o probe && ./probe FILE
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <cufile.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define SHOW(what, e)                                                               \
    do {                                                                            \
        CUfileError_t r_ = (e);                                                     \
        printf("%-52s err %d cu_err %d\n", what, (int)r_.err, (int)r_.cu_err);    \
    } while (0)

int main(int argc, char **argv) {
    const char *path = argc > 1 ? argv[1] : "/tmp/probe.img";
    // A file of known bytes (byte i of the file is i * 7 + (i >> 12)),
    // opened with O_DIRECT (NVIDIA's library refuses a handle without it:
    // CU_FILE_HANDLE_NOT_REGISTERED, seen: 1.15.1).
    int w = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    unsigned char *pat = malloc(1 << 20);
    for (size_t i = 0; i < (1 << 20); i++) pat[i] = (unsigned char)(i * 7 + (i >> 12));
    if (w < 0 || write(w, pat, 1 << 20) != 1 << 20) return 2;
    close(w);
    int fd = open(path, O_RDWR | O_DIRECT);
    if (fd < 0) fd = open(path, O_RDWR);
    size_t v = 0;
    printf("UseCount at start %ld\n", (long)cuFileUseCount());
    CUfileDrvProps_t props;
    SHOW("GetParameterSizeT(IO_BATCHSIZE) before anything", cuFileGetParameterSizeT(CUFILE_PARAM_PROPERTIES_IO_BATCHSIZE, &v));
    printf("  batch size %zu\n", v);
    SHOW("SetParameterSizeT(IO_BATCHSIZE, 64) before anything", cuFileSetParameterSizeT(CUFILE_PARAM_PROPERTIES_IO_BATCHSIZE, 64));
    cuFileGetParameterSizeT(CUFILE_PARAM_PROPERTIES_IO_BATCHSIZE, &v);
    printf("  batch size %zu\n", v);
    SHOW("DriverGetProperties before open", cuFileDriverGetProperties(&props));
    printf("  max_batch_io_size %u, UseCount %ld\n", props.max_batch_io_size, (long)cuFileUseCount());
    SHOW("SetParameterSizeT(IO_BATCHSIZE, 32) after GetProperties", cuFileSetParameterSizeT(CUFILE_PARAM_PROPERTIES_IO_BATCHSIZE, 32));
    SHOW("DriverOpen", cuFileDriverOpen());
    printf("  UseCount %ld\n", (long)cuFileUseCount());
    CUfileDescr_t d;
    memset(&d, 0, sizeof d);
    d.type = CU_FILE_HANDLE_TYPE_OPAQUE_FD;
    d.handle.fd = fd;
    CUfileHandle_t fh = NULL;
    SHOW("HandleRegister", cuFileHandleRegister(&fh, &d));
    unsigned char *buf = aligned_alloc(4096, 1 << 20);
    memset(buf, 0, 1 << 20);
    SHOW("BufRegister", cuFileBufRegister(buf, 1 << 20, 0));
    CUfileBatchHandle_t batch = NULL;
    SHOW("BatchIOSetUp(16)", cuFileBatchIOSetUp(&batch, 16));
    CUfileIOParams_t io[17];
    memset(io, 0, sizeof io);
    for (int i = 0; i < 17; i++) {
        io[i].mode = CUFILE_BATCH;
        io[i].fh = fh;
        io[i].opcode = CUFILE_READ;
        io[i].u.batch.devPtr_base = buf;
        io[i].u.batch.devPtr_offset = i * 4096;
        io[i].u.batch.file_offset = (off_t)i * 4096;  // buffer offset i * 4096 too
        io[i].u.batch.size = 4096;
        io[i].cookie = (void *)(uintptr_t)(100 + i);
    }
    errno = 0;
    SHOW("BatchIOSubmit(17 > 16)", cuFileBatchIOSubmit(batch, 17, io, 0));
    printf("  errno %d\n", errno);
    SHOW("BatchIOSubmit(1, NULL)", cuFileBatchIOSubmit(batch, 1, NULL, 0));
    SHOW("BatchIOSubmit(0, io)", cuFileBatchIOSubmit(batch, 0, io, 0));
    io[1].opcode = (CUfileOpcode_t)7;
    SHOW("BatchIOSubmit(2, second with opcode 7)", cuFileBatchIOSubmit(batch, 2, io, 0));
    io[1].opcode = CUFILE_READ;
    CUfileIOEvents_t ev[16];
    unsigned nr = 16;
    struct timespec ts = {2, 0};
    SHOW("BatchIOGetStatus(min 2)", cuFileBatchIOGetStatus(batch, 2, &nr, ev, &ts));
    for (unsigned i = 0; i < nr; i++)
        printf("  event cookie %lu status %d ret %zd\n", (unsigned long)(uintptr_t)ev[i].cookie, (int)ev[i].status,
               (ssize_t)ev[i].ret);
    // Where a batch's reads land: two reads into one registered buffer at
    // buffer offsets 0 and 4096 (file offsets 0 and 4096).
    memset(buf, 0, 8192);
    SHOW("BatchIOSubmit(2 reads, buffer offsets 0 and 4096)", cuFileBatchIOSubmit(batch, 2, io, 0));
    nr = 16;
    SHOW("BatchIOGetStatus(min 2)", cuFileBatchIOGetStatus(batch, 2, &nr, ev, &ts));
    for (unsigned i = 0; i < nr; i++)
        printf("  event cookie %lu status %d ret %zd\n", (unsigned long)(uintptr_t)ev[i].cookie, (int)ev[i].status,
               (ssize_t)ev[i].ret);
    printf("  buffer+0 holds file offset 0: %s; buffer+4096 holds file offset 4096: %s; buffer+4096 zero: %s\n",
           memcmp(buf, pat, 4096) ? "no" : "yes", memcmp(buf + 4096, pat + 4096, 4096) ? "no" : "yes",
           buf[4096] == 0 && !memcmp(buf + 4096, buf + 4097, 4095) ? "yes" : "no");
    io[0].u.batch.size = 0;
    SHOW("BatchIOSubmit(1, size 0)", cuFileBatchIOSubmit(batch, 1, io, 0));
    nr = 16;
    SHOW("BatchIOGetStatus(min 0)", cuFileBatchIOGetStatus(batch, 0, &nr, ev, &ts));
    for (unsigned i = 0; i < nr; i++)
        printf("  event cookie %lu status %d ret %zd\n", (unsigned long)(uintptr_t)ev[i].cookie, (int)ev[i].status,
               (ssize_t)ev[i].ret);
    io[0].u.batch.size = 4096;
    io[0].fh = NULL;
    SHOW("BatchIOSubmit(1, NULL handle)", cuFileBatchIOSubmit(batch, 1, io, 0));
    io[0].fh = fh;
    SHOW("BatchIOCancel", cuFileBatchIOCancel(batch));
    cuFileBatchIODestroy(batch);
    nr = 16;
    SHOW("BatchIOGetStatus after Destroy", cuFileBatchIOGetStatus(batch, 0, &nr, ev, &ts));
    SHOW("BatchIOSubmit after Destroy", cuFileBatchIOSubmit(batch, 1, io, 0));
    SHOW("BatchIOCancel after Destroy", cuFileBatchIOCancel(batch));
    SHOW("BufDeregister", cuFileBufDeregister(buf));
    cuFileHandleDeregister(fh);
    errno = 0;
    ssize_t r = cuFileRead(fh, buf, 4096, 0, 0);
    printf("%-52s ret %zd errno %d\n", "Read on a deregistered handle", r, errno);
    errno = 0;
    r = cuFileWrite(fh, buf, 4096, 0, 0);
    printf("%-52s ret %zd errno %d\n", "Write on a deregistered handle", r, errno);
    errno = 0;
    r = cuFileRead(NULL, buf, 4096, 0, 0);
    printf("%-52s ret %zd errno %d\n", "Read on a NULL handle", r, errno);
    SHOW("DriverClose", cuFileDriverClose());
    printf("UseCount after the last close %ld\n", (long)cuFileUseCount());
    SHOW("DriverClose when closed", cuFileDriverClose());
    printf("UseCount after that %ld\n", (long)cuFileUseCount());
    SHOW("DriverOpen again", cuFileDriverOpen());
    printf("UseCount %ld\n", (long)cuFileUseCount());
    SHOW("DriverClose", cuFileDriverClose());
    unlink(path);
    return 0;
}
