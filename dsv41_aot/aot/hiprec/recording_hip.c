/*
 * A recording HIP runtime: the suite's one stand-in for the AMD GPU that no
 * machine here has (MOCK-GPU). No GPU work is done: each HIP call the loader,
 * the bands' exported host code (FlyDSL's AOT runtime) and FlyDSL's JIT
 * runtime make is answered and written to a log, one tab-separated line a
 * call, so the tests can read what a real libamdhip64 would have been handed.
 *
 * Built by dsv41_aot/aot/hiprec/__init__.py (build) with the system C
 * compiler, once, into a cache folder, as libamdhip64.so.7 (its SONAME) with
 * every hip* symbol at version hip_4.2 (recording_hip.map), so FlyDSL's
 * libfly_jit_runtime.so binds to it (LD_LIBRARY_PATH, or mapped first) and
 * the loader opens it through DSV41_AOT_HIP_LIB. verify --against-jit and
 * the tests launch through it.
 *
 * Told by the environment:
 *   RECORDING_HIP_LOG      file the calls are appended to (none: nothing recorded)
 *   RECORDING_HIP_DEVICES  devices reported (default 1)
 *   RECORDING_HIP_ARCH     gcnArchName in hipDeviceProp, one a device, comma-separated (a
 *                          device past the list: the last; unset: none, no gfx arch named)
 *   RECORDING_HIP_VERSION  hipRuntimeGetVersion (default 60443483: ROCm 6.4.3)
 *   RECORDING_HIP_FAIL     "call=status" or "call=status@n": that call returns
 *                          status (every time, or only its n-th time, 1-based);
 *                          several, comma-separated, one per call
 *   RECORDING_HIP_KERNELS  file of kernel argument layouts, one line per kernel:
 *                          name TAB kernarg_segment_size TAB offset:size,...
 *                          (written from the code object's own AMDGPU
 *                          metadata; reread when a kernel is not in it)
 *   RECORDING_HIP_IMAGES   folder each loaded image is written to, as <sha256>.co
 *   RECORDING_HIP_CAPTURING  hipStreamIsCapturing's answer for every stream (default 0: none)
 *
 * Log line: pid TAB call TAB status TAB field=value ... Fields of
 * hipModuleLaunchKernel: kernel, module (its image's sha256), fn, device,
 * fn_device, grid, block, shared, stream, extra, nparams and kernarg (the
 * argument segment HIP would build from kernelParams and the layout above,
 * hex; "?" when the kernel has no layout).
 */

#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

typedef int hipError_t;
typedef void *hipStream_t;
typedef void *hipEvent_t;

enum {
    OK = 0, INVALID_VALUE = 1, NOT_INITIALIZED = 3, INVALID_DEVICE = 101, INVALID_IMAGE = 200,
    INVALID_HANDLE = 400, NOT_FOUND = 500,
};

/* ------------------------------------------------------------------ sha256 */

static const uint32_t K256[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
};

#define ROR(x, n) (((x) >> (n)) | ((x) << (32 - (n))))

static void sha256_block(uint32_t h[8], const unsigned char *p) {
    uint32_t w[64], a, b, c, d, e, f, g, k, t1, t2;
    for (int i = 0; i < 16; i++)
        w[i] = (uint32_t)p[4 * i] << 24 | (uint32_t)p[4 * i + 1] << 16 | (uint32_t)p[4 * i + 2] << 8 | p[4 * i + 3];
    for (int i = 16; i < 64; i++) {
        uint32_t s0 = ROR(w[i - 15], 7) ^ ROR(w[i - 15], 18) ^ (w[i - 15] >> 3);
        uint32_t s1 = ROR(w[i - 2], 17) ^ ROR(w[i - 2], 19) ^ (w[i - 2] >> 10);
        w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], k = h[7];
    for (int i = 0; i < 64; i++) {
        t1 = k + (ROR(e, 6) ^ ROR(e, 11) ^ ROR(e, 25)) + ((e & f) ^ (~e & g)) + K256[i] + w[i];
        t2 = (ROR(a, 2) ^ ROR(a, 13) ^ ROR(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
        k = g, g = f, f = e, e = d + t1, d = c, c = b, b = a, a = t1 + t2;
    }
    h[0] += a, h[1] += b, h[2] += c, h[3] += d, h[4] += e, h[5] += f, h[6] += g, h[7] += k;
}

static void sha256_hex(const unsigned char *data, size_t n, char out[65]) {
    uint32_t h[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
    unsigned char tail[128] = {0};
    size_t full = n / 64 * 64, rest = n - full;
    for (size_t i = 0; i < full; i += 64) sha256_block(h, data + i);
    memcpy(tail, data + full, rest);
    tail[rest] = 0x80;
    size_t len = rest < 56 ? 64 : 128;
    uint64_t bits = (uint64_t)n * 8;
    for (int i = 0; i < 8; i++) tail[len - 1 - i] = (unsigned char)(bits >> (8 * i));
    for (size_t i = 0; i < len; i += 64) sha256_block(h, tail + i);
    for (int i = 0; i < 8; i++) sprintf(out + 8 * i, "%08x", h[i]);
}

/* ------------------------------------------------------------------ configuration and log */

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static __thread int current_device;
static __thread hipError_t last_error;

static int env_int(const char *name, int fallback) {
    const char *v = getenv(name);
    return v && *v ? atoi(v) : fallback;
}

static int device_count(void) { return env_int("RECORDING_HIP_DEVICES", 1); }

static int recording(void) {
    const char *path = getenv("RECORDING_HIP_LOG");
    return path && *path;
}

/* a line: "pid\tcall\tstatus\t" + fields, written with one write() (O_APPEND: whole lines across processes) */
static void record(const char *call, hipError_t status, const char *fields) {
    const char *path = getenv("RECORDING_HIP_LOG");
    if (!path || !*path) return;
    size_t n = strlen(fields) + strlen(call) + 64;
    char *line = malloc(n);
    if (!line) return;
    int len = snprintf(line, n, "%d\t%s\t%d\t%s\n", (int)getpid(), call, status, fields);
    int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (fd >= 0) {
        ssize_t off = 0;
        while (off < len) {
            ssize_t w = write(fd, line + off, (size_t)(len - off));
            if (w <= 0) break;
            off += w;
        }
        close(fd);
    }
    free(line);
}

/* the status RECORDING_HIP_FAIL asks of this call (0: none); counts the call */
static hipError_t injected(const char *call) {
    static int counts[64];
    static const char *names[64];
    const char *spec = getenv("RECORDING_HIP_FAIL");
    size_t n = strlen(call);
    while (spec && (strncmp(spec, call, n) != 0 || spec[n] != '=')) {  /* this call's "call=..." */
        spec = strchr(spec, ',');
        if (spec) spec++;
    }
    if (!spec) return OK;
    pthread_mutex_lock(&lock);
    int i = 0, seen;
    while (i < 63 && names[i] && strcmp(names[i], call) != 0) i++;
    names[i] = call;
    seen = ++counts[i];
    pthread_mutex_unlock(&lock);
    int status = atoi(spec + n + 1);
    const char *at = strchr(spec + n + 1, '@'), *next = strchr(spec, ',');
    if (at && next && at > next) at = NULL;  /* another call's "@n" */
    return at && atoi(at + 1) != seen ? OK : status;
}

static hipError_t done(const char *call, hipError_t status, const char *fields) {
    record(call, status, fields);
    if (status != OK) last_error = status;
    return status;
}

#define FAIL_OR(call, fields)                       \
    do {                                            \
        hipError_t f_ = injected(call);             \
        if (f_ != OK) return done(call, f_, fields); \
    } while (0)

/* ------------------------------------------------------------------ devices */

hipError_t hipRuntimeGetVersion(int *v) {
    FAIL_OR("hipRuntimeGetVersion", "");
    *v = env_int("RECORDING_HIP_VERSION", 60443483);
    char f[32];
    snprintf(f, sizeof f, "version=%d", *v);
    return done("hipRuntimeGetVersion", OK, f);
}

hipError_t hipGetDeviceCount(int *n) {
    FAIL_OR("hipGetDeviceCount", "");
    *n = device_count();
    char f[32];
    snprintf(f, sizeof f, "count=%d", *n);
    return done("hipGetDeviceCount", *n ? OK : 100 /* hipErrorNoDevice */, f);
}

hipError_t hipGetDevice(int *d) {
    FAIL_OR("hipGetDevice", "");
    *d = current_device;
    char f[32];
    snprintf(f, sizeof f, "device=%d", *d);
    return done("hipGetDevice", OK, f);
}

hipError_t hipSetDevice(int d) {
    char f[32];
    snprintf(f, sizeof f, "device=%d", d);
    FAIL_OR("hipSetDevice", f);
    if (d < 0 || d >= device_count()) return done("hipSetDevice", INVALID_DEVICE, f);
    current_device = d;
    return done("hipSetDevice", OK, f);
}

/* hipDeviceProp_t is not laid out here: its name and gcnArchName are written
 * as C strings (the loader scans the buffer for gcnArchName); the caller's
 * buffer is assumed to be at least PROPS_BYTES long (the loader's is 16 KiB). */
#define PROPS_BYTES 1472
static hipError_t props(const char *call, void *p, int d) {
    char f[32];
    snprintf(f, sizeof f, "device=%d", d);
    FAIL_OR(call, f);
    if (d < 0 || d >= device_count()) return done(call, INVALID_DEVICE, f);
    const char *arch = getenv("RECORDING_HIP_ARCH"), *comma;
    if (!arch) arch = "";
    for (int i = 0; i < d && (comma = strchr(arch, ',')); i++) arch = comma + 1;  /* device d's name */
    memset(p, 0, PROPS_BYTES);
    strcpy((char *)p, "Recording HIP (stand-in for the AMD GPU)");
    snprintf((char *)p + 1160, 256, "%.*s", (int)strcspn(arch, ","), arch);
    return done(call, OK, f);
}
hipError_t hipGetDevicePropertiesR0600(void *p, int d) { return props("hipGetDevicePropertiesR0600", p, d); }
hipError_t hipGetDeviceProperties(void *p, int d) { return props("hipGetDeviceProperties", p, d); }

hipError_t hipDeviceSynchronize(void) {
    FAIL_OR("hipDeviceSynchronize", "");
    return done("hipDeviceSynchronize", OK, "");
}

hipError_t hipGetLastError(void) {
    hipError_t e = last_error;
    last_error = OK;
    char f[32];
    snprintf(f, sizeof f, "last=%d", e);
    record("hipGetLastError", OK, f);
    return e;
}

const char *hipGetErrorName(hipError_t e) {
    switch (e) {
    case 0: return "hipSuccess";
    case 1: return "hipErrorInvalidValue";
    case 2: return "hipErrorOutOfMemory";
    case 3: return "hipErrorNotInitialized";
    case 98: return "hipErrorInvalidDeviceFunction";
    case 100: return "hipErrorNoDevice";
    case 101: return "hipErrorInvalidDevice";
    case 200: return "hipErrorInvalidImage";
    case 209: return "hipErrorNoBinaryForGpu";
    case 218: return "hipErrorInvalidKernelFile";
    case 400: return "hipErrorInvalidHandle";
    case 500: return "hipErrorNotFound";
    case 701: return "hipErrorLaunchOutOfResources";
    case 719: return "hipErrorLaunchFailure";
    default: return "hipErrorUnknown";
    }
}

/* ------------------------------------------------------------------ modules and functions */

#define MAGIC_MODULE 0x4d4f44554c45ULL
#define MAGIC_FUNCTION 0x46554e4354ULL

#define MAX_FUNCTIONS 16

struct function {
    uint64_t magic;
    int pid;
    struct module *module;
    char name[512];
};

struct module {
    uint64_t magic;
    int pid, device, unloaded, nfunctions;
    char sha[65];
    const unsigned char *image;
    size_t bytes;
    struct function *functions[MAX_FUNCTIONS];
};

/* an ELF image's extent: the furthest of its headers' and sections' ends */
static size_t elf_bytes(const unsigned char *p) {
    if (memcmp(p, "\x7f" "ELF", 4) != 0 || p[4] != 2) return 0;
    uint64_t phoff, shoff, end;
    uint16_t phentsize, phnum, shentsize, shnum;
    memcpy(&phoff, p + 32, 8), memcpy(&shoff, p + 40, 8);
    memcpy(&phentsize, p + 54, 2), memcpy(&phnum, p + 56, 2), memcpy(&shentsize, p + 58, 2), memcpy(&shnum, p + 60, 2);
    end = 64;
    if (phoff + (uint64_t)phentsize * phnum > end) end = phoff + (uint64_t)phentsize * phnum;
    if (shoff + (uint64_t)shentsize * shnum > end) end = shoff + (uint64_t)shentsize * shnum;
    for (int i = 0; i < shnum; i++) {
        const unsigned char *s = p + shoff + (uint64_t)i * shentsize;
        uint32_t type;
        uint64_t off, size;
        memcpy(&type, s + 4, 4), memcpy(&off, s + 24, 8), memcpy(&size, s + 32, 8);
        if (type != 8 /* SHT_NOBITS */ && off + size > end) end = off + size;
    }
    return (size_t)end;
}

static void save_image(const struct module *m) {
    const char *dir = getenv("RECORDING_HIP_IMAGES");
    if (!dir || !*dir) return;
    char path[4096], tmp[4200];
    snprintf(path, sizeof path, "%s/%s.co", dir, m->sha);
    if (access(path, F_OK) == 0) return;
    snprintf(tmp, sizeof tmp, "%s.%d.tmp", path, (int)getpid());
    FILE *f = fopen(tmp, "wb");
    if (!f) return;
    fwrite(m->image, 1, m->bytes, f);
    fclose(f);
    rename(tmp, path);
}

hipError_t hipModuleLoadData(void **module, const void *image) {
    FAIL_OR("hipModuleLoadData", "");
    size_t n = image ? elf_bytes(image) : 0;
    if (!n) return done("hipModuleLoadData", INVALID_IMAGE, "sha256=?");
    struct module *m = calloc(1, sizeof *m);
    m->magic = MAGIC_MODULE, m->pid = getpid(), m->device = current_device, m->image = image, m->bytes = n;
    sha256_hex(image, n, m->sha);
    save_image(m);
    *module = m;
    char f[200];
    snprintf(f, sizeof f, "module=%p\tsha256=%s\tbytes=%zu\tdevice=%d", (void *)m, m->sha, n, m->device);
    return done("hipModuleLoadData", OK, f);
}

/* a handle of this process's HIP (a forked child's are not: HIP does not survive fork) */
static int live_module(const struct module *m) {
    return m && m->magic == MAGIC_MODULE && m->pid == getpid() && !m->unloaded;
}

hipError_t hipModuleUnload(void *module) {
    struct module *m = module;
    char f[200];
    snprintf(f, sizeof f, "module=%p\tsha256=%s", module, m && m->magic == MAGIC_MODULE ? m->sha : "?");
    FAIL_OR("hipModuleUnload", f);
    if (!live_module(m)) return done("hipModuleUnload", INVALID_HANDLE, f);
    m->unloaded = 1;
    return done("hipModuleUnload", OK, f);
}

/* the module's function of kernel ``name``: one handle a name (HIP keeps a module's functions), the
 * name checked against the image's bytes (a NUL-terminated symbol name in its string table) once */
static struct function *function_of(struct module *m, const char *name) {
    pthread_mutex_lock(&lock);
    struct function *h = NULL;
    for (int i = 0; i < m->nfunctions && !h; i++)
        if (strcmp(m->functions[i]->name, name) == 0) h = m->functions[i];
    if (!h && m->nfunctions < MAX_FUNCTIONS && strlen(name) < sizeof h->name
        && memmem(m->image, m->bytes, name, strlen(name) + 1) != NULL) {
        h = calloc(1, sizeof *h);
        h->magic = MAGIC_FUNCTION, h->pid = getpid(), h->module = m;
        snprintf(h->name, sizeof h->name, "%s", name);
        m->functions[m->nfunctions++] = h;
    }
    pthread_mutex_unlock(&lock);
    return h;
}

hipError_t hipModuleGetFunction(void **fn, void *module, const char *name) {
    struct module *m = module;
    hipError_t status = injected("hipModuleGetFunction");
    struct function *h = NULL;
    if (status == OK && !live_module(m)) status = INVALID_HANDLE;
    if (status == OK && !(name && (h = function_of(m, name)))) status = NOT_FOUND;
    if (status == OK) *fn = h;
    if (status != OK) last_error = status;
    if (recording()) {
        char f[800];
        snprintf(f, sizeof f, "module=%p\tkernel=%.500s\tdevice=%d\tfn=%p", module, name ? name : "",
                 current_device, (void *)h);
        record("hipModuleGetFunction", status, f);
    }
    return status;
}

hipError_t hipModuleOccupancyMaxActiveBlocksPerMultiprocessor(int *blocks, void *fn, int block, size_t shared) {
    (void)fn, (void)block, (void)shared;
    FAIL_OR("hipModuleOccupancyMaxActiveBlocksPerMultiprocessor", "");
    *blocks = 1;
    return done("hipModuleOccupancyMaxActiveBlocksPerMultiprocessor", OK, "blocks=1");
}

/* ------------------------------------------------------------------ kernel argument layouts */

struct layout {
    char name[512];
    size_t segment, n, offset[128], size[128];
};
static struct layout *layouts;
static size_t nlayouts;

static void read_layouts(void) {
    const char *path = getenv("RECORDING_HIP_KERNELS");
    FILE *f = path && *path ? fopen(path, "r") : NULL;
    if (!f) return;
    free(layouts), layouts = NULL, nlayouts = 0;
    size_t cap = 0;
    char *line = NULL;
    size_t len = 0;
    while (getline(&line, &len, f) > 0) {
        if (nlayouts == cap) layouts = realloc(layouts, (cap = cap ? 2 * cap : 256) * sizeof *layouts);
        struct layout *l = &layouts[nlayouts];
        char *tab = strchr(line, '\t');
        if (!tab || tab - line >= (long)sizeof l->name) continue;
        memcpy(l->name, line, (size_t)(tab - line)), l->name[tab - line] = 0;
        char *p = tab + 1;
        l->segment = strtoul(p, &p, 10), l->n = 0;
        if (*p == '\t') p++;
        while (*p && *p != '\n' && l->n < 128) {
            l->offset[l->n] = strtoul(p, &p, 10);
            if (*p == ':') p++;
            l->size[l->n++] = strtoul(p, &p, 10);
            if (*p == ',') p++;
        }
        nlayouts++;
    }
    free(line);
    fclose(f);
}

static const struct layout *layout_of(const char *name) {
    for (int pass = 0; pass < 2; pass++) {
        for (size_t i = 0; i < nlayouts; i++)
            if (strcmp(layouts[i].name, name) == 0) return &layouts[i];
        if (pass == 0) read_layouts();
    }
    return NULL;
}

/* the argument segment HIP builds: each kernelParams[i]'s bytes at argument i's offset, zeros between */
static void kernarg_hex(const char *name, void **params, char **out) {
    pthread_mutex_lock(&lock);
    const struct layout *l = layout_of(name);
    if (!l || !params) {
        pthread_mutex_unlock(&lock);
        *out = strdup(params ? "?" : "none");
        return;
    }
    unsigned char *seg = calloc(1, l->segment + 1);
    for (size_t i = 0; i < l->n; i++)
        if (l->offset[i] + l->size[i] <= l->segment) memcpy(seg + l->offset[i], params[i], l->size[i]);
    *out = malloc(2 * l->segment + 1);
    for (size_t i = 0; i < l->segment; i++) sprintf(*out + 2 * i, "%02x", seg[i]);
    (*out)[2 * l->segment] = 0;
    pthread_mutex_unlock(&lock);
    free(seg);
}

hipError_t hipModuleLaunchKernel(void *fn, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                                 unsigned bz, unsigned shared, hipStream_t stream, void **params, void **extra) {
    struct function *h = fn;
    int valid = h && h->magic == MAGIC_FUNCTION && h->pid == getpid() && live_module(h->module);
    hipError_t status = injected("hipModuleLaunchKernel");
    if (status == OK && !valid) status = INVALID_HANDLE;
    if (status == OK && h->module->device != current_device) status = INVALID_HANDLE;  /* another device's */
    if (!recording()) {  /* nothing to write: only the checks (bench/launch.py times this path) */
        if (status != OK) last_error = status;
        return status;
    }
    const char *name = valid ? h->name : "?";
    char *kernarg;
    kernarg_hex(valid ? h->name : "", params, &kernarg);
    size_t n = strlen(kernarg) + strlen(name) + 400;
    char *f = malloc(n);
    snprintf(f, n,
             "kernel=%s\tmodule=%s\tfn=%p\tdevice=%d\tfn_device=%d\tgrid=%u,%u,%u\tblock=%u,%u,%u\tshared=%u\t"
             "stream=%#lx\textra=%p\tkernarg=%s",
             name, valid ? h->module->sha : "?", fn, current_device, valid ? h->module->device : -1, gx, gy, gz,
             bx, by, bz, shared, (unsigned long)(uintptr_t)stream, (void *)extra, kernarg);
    free(kernarg);
    done("hipModuleLaunchKernel", status, f);
    free(f);
    return status;
}

/* ------------------------------------------------------------------ streams and graph capture */

hipError_t hipStreamIsCapturing(hipStream_t stream, int *status) {
    char f[64];
    snprintf(f, sizeof f, "stream=%#lx", (unsigned long)(uintptr_t)stream);
    FAIL_OR("hipStreamIsCapturing", f);
    *status = env_int("RECORDING_HIP_CAPTURING", 0);  /* 0: hipStreamCaptureStatusNone, 1: active */
    return done("hipStreamIsCapturing", OK, f);
}

static hipError_t quiet(const char *call) {
    FAIL_OR(call, "");
    return done(call, OK, "");
}

hipError_t hipStreamCreate(hipStream_t *s) {
    static uintptr_t next = 0x5000;
    pthread_mutex_lock(&lock);
    *s = (hipStream_t)(next += 0x10);
    pthread_mutex_unlock(&lock);
    return quiet("hipStreamCreate");
}
hipError_t hipStreamDestroy(hipStream_t s) { (void)s; return quiet("hipStreamDestroy"); }
hipError_t hipStreamSynchronize(hipStream_t s) { (void)s; return quiet("hipStreamSynchronize"); }
hipError_t hipStreamWaitEvent(hipStream_t s, hipEvent_t e, unsigned flags) {
    (void)s, (void)e, (void)flags;
    return quiet("hipStreamWaitEvent");
}
hipError_t hipEventCreateWithFlags(hipEvent_t *e, unsigned flags) {
    (void)flags;
    *e = malloc(16);
    return quiet("hipEventCreateWithFlags");
}
hipError_t hipEventDestroy(hipEvent_t e) { free(e); return quiet("hipEventDestroy"); }
hipError_t hipEventRecord(hipEvent_t e, hipStream_t s) { (void)e, (void)s; return quiet("hipEventRecord"); }
hipError_t hipEventSynchronize(hipEvent_t e) { (void)e; return quiet("hipEventSynchronize"); }

/* ------------------------------------------------------------------ memory (host memory stands for device memory) */

hipError_t hipMalloc(void **p, size_t n) {
    FAIL_OR("hipMalloc", "");
    *p = calloc(1, n ? n : 1);
    return done("hipMalloc", *p ? OK : 2, "");
}
hipError_t hipFree(void *p) { free(p); return quiet("hipFree"); }
hipError_t hipMemcpy(void *d, const void *s, size_t n, int kind) {
    (void)kind;
    memmove(d, s, n);
    return quiet("hipMemcpy");
}
hipError_t hipMemcpyAsync(void *d, const void *s, size_t n, int kind, hipStream_t st) {
    (void)kind, (void)st;
    memmove(d, s, n);
    return quiet("hipMemcpyAsync");
}
hipError_t hipMemset(void *d, int v, size_t n) { memset(d, v, n); return quiet("hipMemset"); }
hipError_t hipMemsetD16Async(void *d, unsigned short v, size_t n, hipStream_t st) {
    (void)st;
    for (size_t i = 0; i < n; i++) ((unsigned short *)d)[i] = v;
    return quiet("hipMemsetD16Async");
}
hipError_t hipMemsetD32Async(void *d, int v, size_t n, hipStream_t st) {
    (void)st;
    for (size_t i = 0; i < n; i++) ((int *)d)[i] = v;
    return quiet("hipMemsetD32Async");
}
hipError_t hipHostRegister(void *p, size_t n, unsigned flags) { (void)p, (void)n, (void)flags; return quiet("hipHostRegister"); }
hipError_t hipHostUnregister(void *p) { (void)p; return quiet("hipHostUnregister"); }
hipError_t hipHostGetDevicePointer(void **d, void *h, unsigned flags) {
    (void)flags;
    *d = h;
    return quiet("hipHostGetDevicePointer");
}
