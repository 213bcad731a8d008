/* Probe behind the PCIe lane (docs/executor.md): can the GPU read a model file's
 * pages in place over PCIe once they are registered (cudaHostRegister, read-only),
 * how fast (one expert, three, 64 MiB, 1 GiB; by grid size), against a copy-engine
 * copy, and how the GPU's reads and 16 CPU threads' reads of RAM add up.
 *   nvcc -O2 -arch=sm_90 -o /tmp/pcie_probe bench/pcie_probe.cu -lpthread
 *   /tmp/pcie_probe FILE MIB [private [register-only]]
 * "private" maps the file MAP_PRIVATE (registration did not return on the H100
 * machine; shared: 16 GiB in 0.6 s). */
#include <cuda_runtime.h>
#include <stdint.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
static double now() {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}
#define CK(x)                                                                                      \
    do {                                                                                           \
        cudaError_t e_ = (x);                                                                      \
        if (e_) {                                                                                  \
            fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(e_));                               \
        }                                                                                          \
    } while (0)
__global__ void rd(const uint4 *p, size_t n, unsigned *out) {
    unsigned acc = 0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        uint4 v = p[i];
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (acc == 0x12345678) out[0] = acc;
}
static volatile int cpu_go, cpu_stop;
static unsigned char *cpu_buf;
static size_t cpu_bytes;
static double cpu_rate[16];
static void *cpu_reader(void *a) {
    long id = (long)a;
    size_t per = cpu_bytes / 16;
    const uint64_t *p = (const uint64_t *)(cpu_buf + id * per);
    while (!cpu_go)
        ;
    uint64_t s = 0;
    double t0 = now();
    size_t done = 0;
    while (!cpu_stop) {
        for (size_t i = 0; i < per / 8; i += 8)
            s += p[i] ^ p[i + 1] ^ p[i + 2] ^ p[i + 3] ^ p[i + 4] ^ p[i + 5] ^ p[i + 6] ^ p[i + 7];
        done += per;
    }
    cpu_rate[id] = done / (now() - t0) / 1e9;
    if (s == 42) printf("x");
    return NULL;
}
static double gpu_read(const void *dp, size_t bytes, int blocks, int reps, unsigned *out) {
    cudaEvent_t a, b;
    cudaEventCreate(&a);
    cudaEventCreate(&b);
    rd<<<blocks, 256>>>((const uint4 *)dp, bytes / 16, out);
    CK(cudaDeviceSynchronize());
    cudaEventRecord(a);
    for (int r = 0; r < reps; r++) rd<<<blocks, 256>>>((const uint4 *)dp, bytes / 16, out);
    cudaEventRecord(b);
    CK(cudaEventSynchronize(b));
    float ms;
    cudaEventElapsedTime(&ms, a, b);
    return bytes * (double)reps / (ms * 1e-3) / 1e9;
}
int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IONBF, 0);
    const char *path = argv[1];
    size_t want = (size_t)atol(argv[2]) << 20;
    int fd = open(path, O_RDONLY);
    struct stat st;
    fstat(fd, &st);
    size_t len = (size_t)st.st_size < want ? (size_t)st.st_size : want;
    printf("file %s %.2f GiB, using %.2f GiB\n", path, st.st_size / 1073741824.0,
           len / 1073741824.0);
    unsigned *out;
    CK(cudaMalloc(&out, 4));
    cudaFree(0);
    int priv = argc > 3 && argv[3][0] == 'p';
    void *m = mmap(NULL, len, PROT_READ, priv ? MAP_PRIVATE : MAP_SHARED, fd, 0);
    printf("%s mapping\n", priv ? "private" : "shared");
    madvise(m, len, MADV_WILLNEED);
    double t0 = now();
    volatile unsigned char s = 0;
    for (size_t i = 0; i < len; i += 4096) s += ((unsigned char *)m)[i];
    printf("touch %.2f s\n", now() - t0);
    t0 = now();
    cudaError_t e = cudaHostRegister(m, len, cudaHostRegisterMapped | cudaHostRegisterReadOnly);
    printf("register RO: %s in %.2f s\n", cudaGetErrorString(e), now() - t0);
    if (argc > 4) return 0;
    void *reg = m;
    if (e) {
        cudaGetLastError();
        munmap(m, len);
        m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
        t0 = now();
        e = cudaHostRegister(m, len, cudaHostRegisterMapped);
        printf("register private RW: %s in %.2f s\n", cudaGetErrorString(e), now() - t0);
        reg = m;
        if (e) return 1;
    }
    void *dp;
    CK(cudaHostGetDevicePointer(&dp, reg, 0));
    int sms;
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
    size_t sizes[] = {2653184, 3 * 2653184, 64 << 20, 1 << 30};
    for (int i = 0; i < 4; i++)
        for (int bm = 1; bm <= 8; bm *= 2)
            printf("gpu zero-copy read %8.2f MB blocks %4d: %6.1f GB/s\n", sizes[i] / 1e6, sms * bm,
                   gpu_read(dp, sizes[i] < len ? sizes[i] : len, sms * bm, i < 2 ? 50 : 3, out));
    // copy engine for comparison
    void *d;
    CK(cudaMalloc(&d, 64 << 20));
    cudaEvent_t a, b;
    cudaEventCreate(&a);
    cudaEventCreate(&b);
    cudaEventRecord(a);
    for (int r = 0; r < 10; r++) cudaMemcpyAsync(d, reg, 64 << 20, cudaMemcpyHostToDevice);
    cudaEventRecord(b);
    cudaEventSynchronize(b);
    float ms;
    cudaEventElapsedTime(&ms, a, b);
    printf("memcpy H2D from the registered file 64 MB: %.1f GB/s\n",
           10 * 64.0 * 1048576 / (ms * 1e-3) / 1e9);
    // concurrent
    cpu_bytes = (size_t)1 << 30;
    cpu_buf = (unsigned char *)malloc(cpu_bytes);
    memset(cpu_buf, 1, cpu_bytes);
    for (int pass = 0; pass < 2; pass++) {
        pthread_t th[16];
        cpu_go = 0;
        cpu_stop = 0;
        for (long i = 0; i < 16; i++) pthread_create(&th[i], NULL, cpu_reader, (void *)i);
        cpu_go = 1;
        if (!pass) usleep(200000);
        double g = pass ? gpu_read(dp, len < (1u << 30) ? len : (1u << 30), sms * 4, 20, out) : 0;
        usleep(pass ? 0 : 300000);
        cpu_stop = 1;
        double c = 0;
        for (int i = 0; i < 16; i++) {
            pthread_join(th[i], NULL);
            c += cpu_rate[i];
        }
        printf("%s: cpu 16 threads %.1f GB/s, gpu zero-copy %.1f GB/s\n",
               pass ? "together" : "cpu alone", c, g);
    }
    CK(cudaHostUnregister(reg));
    return 0;
}
