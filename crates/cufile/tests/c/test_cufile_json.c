// cufile.json through CUFILE_ENV_PATH_JSON: the keys libcufile applies
// (comments allowed, as NVIDIA's own file has them), and a file it cannot
// parse refused at open. Run by scripts/cufile-check.
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <cufile.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define CHECK(what, cond)                                                  \
    do {                                                                   \
        if (!(cond)) {                                                     \
            fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, what);      \
            exit(1);                                                       \
        }                                                                  \
    } while (0)

static char path[256];

static void json(const char *text) {
    FILE *f = fopen(path, "w");
    CHECK("write cufile.json", f && fputs(text, f) >= 0 && fclose(f) == 0);
}

int main(int argc, char **argv) {
    const char *dir = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    snprintf(path, sizeof path, "%s/ugds-cufile-%d.json", dir, (int)getpid());
    setenv("CUFILE_ENV_PATH_JSON", path, 1);
    if (argc > 1 && !strcmp(argv[1], "bad")) {
        // A file that does not parse: the driver does not open.
        json("{ \"properties\": { \"io_batchsize\": } }");
        CHECK("a bad cufile.json refuses the open", cuFileDriverOpen().err == CU_FILE_DRIVER_INVALID_PROPS);
        CHECK("and nothing is open", cuFileUseCount() == 0);
        unlink(path);
        printf("test_cufile_json bad: ok\n");
        return 0;
    }
    json("// NVIDIA's file has comments like this one\n"
         "{\n"
         "    \"logging\": { \"dir\": \"/var/log//cufile\", \"level\": \"ERROR\" },  # and these\n"
         "    \"profile\": { \"cufile_stats\": 1 },\n"
         "    \"properties\": {\n"
         "        \"max_direct_io_size_kb\": 4096,\n"
         "        \"io_batchsize\": 32,\n"
         "        \"use_poll_mode\": false,\n"
         "        \"poll_mode_max_size_kb\": 8,\n"
         "        \"allow_compat_mode\": true,\n"
         "        \"max_device_cache_size_kb\": 131072\n"
         "    }\n"
         "}\n");
    CHECK("DriverOpen", cuFileDriverOpen().err == CU_FILE_SUCCESS);
    size_t v = 0;
    CHECK("io_batchsize", cuFileGetParameterSizeT(CUFILE_PARAM_PROPERTIES_IO_BATCHSIZE, &v).err == 0 && v == 32);
    CHECK("max_direct_io_size_kb",
          cuFileGetParameterSizeT(CUFILE_PARAM_PROPERTIES_MAX_DIRECT_IO_SIZE_KB, &v).err == 0 && v == 4096);
    CHECK("poll_mode_max_size_kb", cuFileGetParameterSizeT(CUFILE_PARAM_POLLTHRESHOLD_SIZE_KB, &v).err == 0 && v == 8);
    bool poll = true;
    CHECK("use_poll_mode", cuFileGetParameterBool(CUFILE_PARAM_PROPERTIES_USE_POLL_MODE, &poll).err == 0 && !poll);
    int level = 0;
    CHECK("profile.cufile_stats", cuFileGetStatsLevel(&level).err == 0 && level == 1);
    CUfileDrvProps_t props;
    CHECK("GetProperties", cuFileDriverGetProperties(&props).err == 0);
    CHECK("props: batch size", props.max_batch_io_size == 32);
    CHECK("props: poll mode off", !(props.nvfs.dcontrolflags & (1u << CU_FILE_USE_POLL_MODE)));
    CUfileBatchHandle_t b;
    CHECK("a batch over io_batchsize", cuFileBatchIOSetUp(&b, 33).err == CU_FILE_INVALID_VALUE);
    CHECK("a batch of io_batchsize", cuFileBatchIOSetUp(&b, 32).err == CU_FILE_SUCCESS);
    cuFileBatchIODestroy(b);
    // A file registered now completes by interrupts (use_poll_mode false),
    // and reads the same.
    char data[256];
    snprintf(data, sizeof data, "%s/ugds-cufile-json-%d.img", dir, (int)getpid());
    int fd = open(data, O_CREAT | O_TRUNC | O_RDWR, 0600);
    static char bytes[65536];
    for (size_t i = 0; i < sizeof bytes; i++) bytes[i] = (char)(i * 7);
    CHECK("write the data file", fd >= 0 && write(fd, bytes, sizeof bytes) == (ssize_t)sizeof bytes);
    CUfileDescr_t d;
    memset(&d, 0, sizeof d);
    d.type = CU_FILE_HANDLE_TYPE_OPAQUE_FD;
    d.handle.fd = fd;
    CUfileHandle_t fh;
    CHECK("HandleRegister", cuFileHandleRegister(&fh, &d).err == CU_FILE_SUCCESS);
    static char back[65536];
    CHECK("a read with interrupt completion", cuFileRead(fh, back, sizeof back, 0, 0) == (ssize_t)sizeof back);
    CHECK("its data", !memcmp(back, bytes, sizeof back));
    cuFileHandleDeregister(fh);
    close(fd);
    unlink(data);
    CHECK("DriverClose", cuFileDriverClose().err == CU_FILE_SUCCESS);
    unlink(path);
    printf("test_cufile_json: ok\n");
    return 0;
}
