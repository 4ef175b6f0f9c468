/*
 * A stand-in libnvidia-ml.so.1 for gpu-exporter's tests.
 *
 * It exports the NVML symbols gpu-exporter resolves, with nvml.h's signatures, struct layouts,
 * struct versions and return codes, and answers them from a small GPU node described in a text
 * file. The exporter loads it through its normal `--backend nvml` path (nvml-wrapper dlopens
 * "libnvidia-ml.so.1"; LD_LIBRARY_PATH points at this library), so everything between the
 * sampler and the C ABI runs as it does on a real driver: symbol loading, struct versions,
 * buffer sizes, handles, unions, event sets, GPM sample buffers.
 *
 * Symbols nvml-wrapper looks up but this file does not define resolve to "missing" in
 * nvml-wrapper (it looks every symbol up at load and keeps the failures), which the exporter
 * treats as NVML_ERROR_FUNCTION_NOT_FOUND / not supported, as on an old driver.
 *
 * Configuration. NVML_STANDIN_CONFIG names a file of `key = value` lines (`#` comments). It is
 * re-read whenever it changes (tests replace it atomically with rename), so a test scripts
 * events and failures while the exporter runs. Without the variable, or without the file,
 * nvmlInit_v2 answers NVML_ERROR_DRIVER_NOT_LOADED. Keys (N: GPU index, S: MIG slot, P: GPU
 * instance profile index, ID: NVML field id in the *driver's* numbering):
 *
 *   driver_version, nvml_version (text), cuda_version (int), init_error (nvmlReturn_t)
 *   gpus                        number of GPUs
 *   gpu.N.uuid name serial vbios inforom_image inforom.oem inforom.ecc inforom.power
 *         pci_bus_id            text answers
 *   gpu.N.brand minor temp power_mw power_limit_mw enforced_limit_mw pstate fan pcie_gen
 *         pcie_width clock.sm clock.mem clock.video util.gpu util.mem enc dec
 *         clocks_event_reasons  integer answers; an absent key answers NOT_SUPPORTED
 *   gpu.N.mem.total .free .used .reserved           nvmlDeviceGetMemoryInfo_v2, bytes
 *   gpu.N.lost = 1              every call on the GPU answers NVML_ERROR_GPU_IS_LOST
 *   gpu.N.fail.<symbol> = rc    that function answers rc for this GPU
 *   gpu.N.field.ID[.scope] = spec    one nvmlDeviceGetFieldValues entry (no scope: scopeId 0);
 *                                    spec is one of
 *         u:<n>   UNSIGNED_LONG_LONG         i:<n>  SIGNED_LONG_LONG
 *         ui:<n>  UNSIGNED_INT (uiVal only)  d:<x>  DOUBLE
 *         err:<rc>                      the entry's nvmlReturn
 *         ui_as_double:<n>  valueType DOUBLE but the value stored in uiVal (NVIDIA bug
 *                           4300930, r545: NVML_FI_DEV_MEMORY_TEMP, POWER_INSTANT)
 *         no_type:<n>       nvmlReturn SUCCESS and ullVal set, valueType left as the caller
 *                           had it (NVML bug 2032468, ECC fields)
 *         untouched         the entry is left exactly as the caller passed it (NVML bug
 *                           2009232, ECC fields with ECC disabled)
 *       absent: the entry answers NVML_ERROR_NOT_SUPPORTED
 *   gpu.N.ecc = 0               ECC disabled (nvmlDeviceGetEccMode says so): entries for ids
 *                               1..31 (ECC and retired pages) are left untouched, as bug
 *                               2009232 describes
 *   gpu.N.gpm = 1, gpu.N.gpm.<metricId> = x    GPM support and nvmlGpmMetricsGet values
 *   gpu.N.nvlink.L.active = 0|1                 nvmlDeviceGetNvLinkState of link L
 *   gpu.N.nvlink.L.replay .recovery .crc_flit .crc_data .ecc_data
 *                               nvmlDeviceGetNvLinkErrorCounter of link L (per-link throughput
 *                               is field 138/139 with scope L; the link count is field 91)
 *   gpu.N.mig = 1, gpu.N.mig.slots, gpu.N.mig.gen
 *       gen: bumping it (a MIG reconfiguration) invalidates every MIG handle handed out
 *       before (they answer NVML_ERROR_INVALID_ARGUMENT) and raises nvmlEventMigConfigChange
 *   gpu.N.mig.S.gi .ci .uuid .profile (profile index) .mem.total/.free/.used/.reserved
 *   gpu.N.mig.S.gpm.<metricId> = x
 *   gpu.N.profile.P.id .name .slices .mem_mb     GPU instance profiles
 *   gpu.N.gi_denied = 1         nvmlDeviceGetGpuInstanceById answers NO_PERMISSION
 *   no_by_id_v = 1              nvmlDeviceGetGpuInstanceProfileInfoByIdV answers
 *                               FUNCTION_NOT_FOUND (drivers before R580)
 *   xid.<seq> = N xid [gi ci]   an XID event, raised once when first seen, in seq order, on
 *                               every event set that registered GPU N for XIDs
 *   events.fail_next = rc n     the next n nvmlEventSetWait_v2 calls answer rc
 *   events.fail_old_sets = rc   waits on every event set created before this key appeared
 *                               answer rc (the set is broken; a new one works)
 *   fail.<symbol> = rc          a function that takes no device answers rc
 *
 * Processes (nvmlDeviceGetComputeRunningProcesses_v3, nvmlDeviceGetMPSComputeRunningProcesses_v3,
 * nvmlDeviceGetProcessUtilization; K: any index below 64):
 *   gpu.N.proc.K = pid bytes [compute|mps|both]
 *                               a process on GPU N (no MIG): its usedGpuMemory in bytes (`na`:
 *                               NVML_VALUE_NOT_AVAILABLE), and which list has it (default compute;
 *                               `both`: an MPS client that drivers also list as compute)
 *   gpu.N.mig.S.proc.K = ...    the same on the MIG device of slot S (listed on its MIG handle,
 *                               with its GPU and compute instance ids)
 *   gpu.N.mig.aggregate_procs = 1    the physical handle of a MIG GPU lists every instance's
 *                               processes (a privileged caller); otherwise NO_PERMISSION
 *   race.<symbol> = n           the next n calls of a process list that pass a buffer answer
 *                               INSUFFICIENT_SIZE asking for 6 more entries than listed, as when
 *                               processes start between the count call and the fill call
 *   gpu.N.putil.K = pid sm mem enc dec
 *                               a process's utilisation (%), sampled by the "driver" every
 *                               gpu.N.putil_period_us (default 100000) on wall-clock multiples,
 *                               the last gpu.N.putil_depth (default 20) samples kept; a process
 *                               whose four values are 0 has no samples (nvml.h: one sample per
 *                               process that had non-zero utilisation). Samples newer than
 *                               lastSeenTimeStamp are returned; none: NVML_ERROR_NOT_FOUND.
 *   gpu.N.putil_old.K = pid timestamp_us sm mem enc dec    one fixed sample
 *   gpu.N.putil_unfiltered = 1  lastSeenTimeStamp is ignored: every buffered sample is returned
 *                               (a driver returning samples the caller has already seen)
 * Process utilisation is not supported on MIG-enabled GPUs or MIG handles (nvml.h's note).
 *
 * Status. NVML_STANDIN_STATUS names a file this library rewrites (atomically) with counters:
 * config_loads, sets_created, set.<id>.gpus, waits, wait_errors, events_delivered, and
 * calls.<symbol> for every call made, so tests can wait for what they need to observe; and
 * putil.N.last_seen (the lastSeenTimeStamp of the last nvmlDeviceGetProcessUtilization fill call
 * on GPU N), putil.N.returned (samples returned by fill calls), race.<symbol>.left.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define EXPORT __attribute__((visibility("default")))

/* ---- nvml.h: return codes, types and structs, as nvml.h lays them out ---------------------- */

typedef int nvmlReturn_t;
enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_NO_PERMISSION = 4,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_DRIVER_NOT_LOADED = 9,
    NVML_ERROR_TIMEOUT = 10,
    NVML_ERROR_FUNCTION_NOT_FOUND = 13,
    NVML_ERROR_GPU_IS_LOST = 15,
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25,
    NVML_ERROR_UNKNOWN = 999,
};

typedef struct nvmlDevice_st *nvmlDevice_t;
typedef struct nvmlGpuInstance_st *nvmlGpuInstance_t;
typedef struct nvmlEventSet_st *nvmlEventSet_t;
typedef struct nvmlGpmSample_st *nvmlGpmSample_t;

enum {
    NVML_VALUE_TYPE_DOUBLE = 0,
    NVML_VALUE_TYPE_UNSIGNED_INT = 1,
    NVML_VALUE_TYPE_UNSIGNED_LONG_LONG = 3,
    NVML_VALUE_TYPE_SIGNED_LONG_LONG = 4,
};

typedef union {
    double dVal;
    int siVal;
    unsigned int uiVal;
    unsigned long ulVal;
    unsigned long long ullVal;
    signed long long sllVal;
    unsigned short usVal;
} nvmlValue_t;

typedef struct {
    unsigned int fieldId;
    unsigned int scopeId;
    long long timestamp;
    long long latencyUsec;
    int valueType;
    nvmlReturn_t nvmlReturn;
    nvmlValue_t value;
} nvmlFieldValue_t;

typedef struct {
    char busIdLegacy[16];
    unsigned int domain;
    unsigned int bus;
    unsigned int device;
    unsigned int pciDeviceId;
    unsigned int pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;

typedef struct {
    unsigned int version;
    unsigned long long total;
    unsigned long long reserved;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_v2_t;

typedef struct {
    unsigned int gpu;
    unsigned int memory;
} nvmlUtilization_t;

typedef struct {
    unsigned int start;
    unsigned int size;
} nvmlGpuInstancePlacement_t;

typedef struct {
    nvmlDevice_t device;
    unsigned int id;
    unsigned int profileId;
    nvmlGpuInstancePlacement_t placement;
} nvmlGpuInstanceInfo_t;

typedef struct {
    unsigned int version;
    unsigned int id;
    unsigned int isP2pSupported;
    unsigned int sliceCount;
    unsigned int instanceCount;
    unsigned int multiprocessorCount;
    unsigned int copyEngineCount;
    unsigned int decoderCount;
    unsigned int encoderCount;
    unsigned int jpegCount;
    unsigned int ofaCount;
    unsigned long long memorySizeMB;
    char name[96];
} nvmlGpuInstanceProfileInfo_v2_t;

/* NVML_STRUCT_VERSION(GpuInstanceProfileInfo, 2) and NVML_STRUCT_VERSION(Memory, 2). */
#define PROFILE_INFO_V2 ((unsigned int)(sizeof(nvmlGpuInstanceProfileInfo_v2_t) | (2u << 24)))
#define MEMORY_V2 ((unsigned int)(sizeof(nvmlMemory_v2_t) | (2u << 24)))

typedef struct {
    unsigned int multiprocessorCount;
    unsigned int sharedCopyEngineCount;
    unsigned int sharedDecoderCount;
    unsigned int sharedEncoderCount;
    unsigned int sharedJpegCount;
    unsigned int sharedOfaCount;
    unsigned int gpuInstanceSliceCount;
    unsigned int computeInstanceSliceCount;
    unsigned long long memorySizeMB;
} nvmlDeviceAttributes_t;

typedef struct {
    nvmlDevice_t device;
    unsigned long long eventType;
    unsigned long long eventData;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
} nvmlEventData_t;

#define EVENT_XID 0x0000000000000008ULL
#define EVENT_MIG_CONFIG_CHANGE 0x0000000000000100ULL

typedef struct {
    unsigned int version;
    unsigned int isSupportedDevice;
} nvmlGpmSupport_t;

typedef struct {
    unsigned int metricId;
    nvmlReturn_t nvmlReturn;
    double value;
    struct {
        char *shortName;
        char *longName;
        char *unit;
    } metricInfo;
} nvmlGpmMetric_t;

typedef struct {
    unsigned int version;
    unsigned int numMetrics;
    nvmlGpmSample_t sample1;
    nvmlGpmSample_t sample2;
    nvmlGpmMetric_t metrics[]; /* NVML_GPM_METRIC_MAX entries in nvml.h; numMetrics are used */
} nvmlGpmMetricsGet_t;

#define GPM_METRIC_LIMIT 333 /* NVML_GPM_METRIC_MAX in CUDA 13.x */

/* nvmlProcessInfo_v2_t (= nvmlProcessInfo_t), what the _v3 process lists fill. */
typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory; /* bytes, or NVML_VALUE_NOT_AVAILABLE */
    unsigned int gpuInstanceId;       /* 0xFFFFFFFF when MIG is off */
    unsigned int computeInstanceId;
} nvmlProcessInfo_t;

typedef struct {
    unsigned int pid;
    unsigned long long timeStamp; /* CPU timestamp, µs */
    unsigned int smUtil;
    unsigned int memUtil;
    unsigned int encUtil;
    unsigned int decUtil;
} nvmlProcessUtilizationSample_t;

#define NVML_VALUE_NOT_AVAILABLE_ULL 0xFFFFFFFFFFFFFFFFULL

/* nvmlDeviceGetGridLicensableFeatures_v4's structures, as nvml.h lays them out. */
#define GRID_LICENSE_BUFFER_SIZE 128
#define GRID_LICENSE_FEATURE_MAX_COUNT 3
#define GRID_LICENSE_FEATURE_CODE_VGPU 1
#define GRID_LICENSE_FEATURE_CODE_NVIDIA_RTX 2

typedef struct {
    unsigned int year;
    unsigned short month;
    unsigned short day;
    unsigned short hour;
    unsigned short min;
    unsigned short sec;
    unsigned char status;
} nvmlGridLicenseExpiry_t;

typedef struct {
    unsigned int featureCode; /* nvmlGridLicenseFeatureCode_t */
    unsigned int featureState;
    char licenseInfo[GRID_LICENSE_BUFFER_SIZE];
    char productName[GRID_LICENSE_BUFFER_SIZE];
    unsigned int featureEnabled;
    nvmlGridLicenseExpiry_t licenseExpiry;
} nvmlGridLicensableFeature_t;

typedef struct {
    int isGridLicenseSupported;
    unsigned int licensableFeaturesCount;
    nvmlGridLicensableFeature_t gridLicensableFeatures[GRID_LICENSE_FEATURE_MAX_COUNT];
} nvmlGridLicensableFeatures_t;

/* ---- configuration -------------------------------------------------------------------------- */

#define MAX_GPUS 8
#define MAX_SLOTS 8
#define MAX_GI 16

struct kv {
    char *key;
    char *value;
};

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t events_cv = PTHREAD_COND_INITIALIZER;

static struct kv *entries;
static size_t n_entries;
static int config_present;
static struct stat config_stat;
static unsigned long long config_loads;
static int init_count;

static const char *lookup(const char *key) {
    for (size_t i = 0; i < n_entries; i++) {
        if (strcmp(entries[i].key, key) == 0) {
            return entries[i].value;
        }
    }
    return NULL;
}

static const char *cfg(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static const char *cfg(const char *fmt, ...) {
    char key[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(key, sizeof key, fmt, ap);
    va_end(ap);
    return lookup(key);
}

/* An integer value; 1 if present and well formed. */
static int parse_ll(const char *s, long long *out) {
    if (!s || !*s) {
        return 0;
    }
    char *end = NULL;
    errno = 0;
    long long v = strtoll(s, &end, 0);
    if (errno || (end && *end)) {
        unsigned long long u = strtoull(s, &end, 0);
        if (errno || (end && *end)) {
            return 0;
        }
        v = (long long)u;
    }
    *out = v;
    return 1;
}

static int cfg_int(long long *out, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int cfg_int(long long *out, const char *fmt, ...) {
    char key[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(key, sizeof key, fmt, ap);
    va_end(ap);
    return parse_ll(lookup(key), out);
}

static long long cfg_int_or(long long dflt, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static long long cfg_int_or(long long dflt, const char *fmt, ...) {
    char key[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(key, sizeof key, fmt, ap);
    va_end(ap);
    long long v;
    return parse_ll(lookup(key), &v) ? v : dflt;
}

static char *trim(char *s) {
    while (*s == ' ' || *s == '\t') {
        s++;
    }
    size_t n = strlen(s);
    while (n > 0 && (s[n - 1] == ' ' || s[n - 1] == '\t' || s[n - 1] == '\r' || s[n - 1] == '\n')) {
        s[--n] = '\0';
    }
    return s;
}

static void free_entries(struct kv *e, size_t n) {
    for (size_t i = 0; i < n; i++) {
        free(e[i].key);
        free(e[i].value);
    }
    free(e);
}

static void on_config_loaded(void);

/* Re-reads the configuration if the file changed. Called with `mu` held at every entry point. */
static void refresh(void) {
    const char *path = getenv("NVML_STANDIN_CONFIG");
    struct stat st;
    if (!path || stat(path, &st) != 0) {
        return;
    }
    if (config_present && st.st_ino == config_stat.st_ino && st.st_size == config_stat.st_size
        && st.st_mtim.tv_sec == config_stat.st_mtim.tv_sec
        && st.st_mtim.tv_nsec == config_stat.st_mtim.tv_nsec) {
        return;
    }
    FILE *f = fopen(path, "r");
    if (!f) {
        return;
    }
    struct kv *fresh = NULL;
    size_t n = 0, cap = 0;
    char line[1024];
    while (fgets(line, sizeof line, f)) {
        char *s = trim(line);
        if (*s == '\0' || *s == '#') {
            continue;
        }
        char *eq = strchr(s, '=');
        if (!eq) {
            continue;
        }
        *eq = '\0';
        char *k = trim(s), *v = trim(eq + 1);
        if (n == cap) {
            cap = cap ? cap * 2 : 256;
            fresh = realloc(fresh, cap * sizeof *fresh);
            if (!fresh) {
                abort();
            }
        }
        fresh[n].key = strdup(k);
        fresh[n].value = strdup(v);
        n++;
    }
    fclose(f);
    free_entries(entries, n_entries);
    entries = fresh;
    n_entries = n;
    config_present = 1;
    config_stat = st;
    config_loads++;
    on_config_loaded();
}

/* ---- call counting and the status file ------------------------------------------------------ */

struct counter {
    const char *name;
    unsigned long long n;
};
static struct counter calls[96];
static size_t n_calls;
static unsigned long long sets_created, waits, wait_errors, events_delivered;

/* Per-process readings: what the status file reports about them. */
static unsigned long long putil_last_seen[MAX_GPUS], putil_returned[MAX_GPUS];
static int putil_asked[MAX_GPUS];
struct race {
    const char *sym;
    char seen[32];
    long long left;
};
static struct race races[] = {
    {"nvmlDeviceGetComputeRunningProcesses_v3", "", 0},
    {"nvmlDeviceGetMPSComputeRunningProcesses_v3", "", 0},
};

static void count_call(const char *name) {
    for (size_t i = 0; i < n_calls; i++) {
        if (strcmp(calls[i].name, name) == 0) {
            calls[i].n++;
            return;
        }
    }
    if (n_calls < sizeof calls / sizeof calls[0]) {
        calls[n_calls].name = name;
        calls[n_calls].n = 1;
        n_calls++;
    }
}

struct event {
    int gpu;
    unsigned long long type;
    unsigned long long data;
    unsigned int gi, ci;
};

#define EVENT_QUEUE 256
struct event_set {
    uint32_t magic;
    unsigned long long id;
    unsigned long long types[MAX_GPUS]; /* registered event types per GPU */
    struct event queue[EVENT_QUEUE];
    size_t head, len;
    struct event_set *next;
};
#define SET_MAGIC 0x45564e54u
static struct event_set *sets;

static void write_status(void) {
    const char *path = getenv("NVML_STANDIN_STATUS");
    if (!path) {
        return;
    }
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.%d.tmp", path, (int)getpid());
    FILE *f = fopen(tmp, "w");
    if (!f) {
        return;
    }
    fprintf(f, "config_loads=%llu\nsets_created=%llu\nwaits=%llu\nwait_errors=%llu\n"
               "events_delivered=%llu\n",
            config_loads, sets_created, waits, wait_errors, events_delivered);
    for (struct event_set *s = sets; s; s = s->next) {
        fprintf(f, "set.%llu.gpus=", s->id);
        int first = 1;
        for (int g = 0; g < MAX_GPUS; g++) {
            if (s->types[g]) {
                fprintf(f, first ? "%d" : ",%d", g);
                first = 0;
            }
        }
        fputc('\n', f);
    }
    for (size_t i = 0; i < n_calls; i++) {
        fprintf(f, "calls.%s=%llu\n", calls[i].name, calls[i].n);
    }
    for (int g = 0; g < MAX_GPUS; g++) {
        if (putil_asked[g]) {
            fprintf(f, "putil.%d.last_seen=%llu\nputil.%d.returned=%llu\n", g, putil_last_seen[g], g,
                    putil_returned[g]);
        }
    }
    for (size_t i = 0; i < sizeof races / sizeof races[0]; i++) {
        fprintf(f, "race.%s.left=%lld\n", races[i].sym, races[i].left);
    }
    if (fclose(f) == 0) {
        rename(tmp, path);
    } else {
        unlink(tmp);
    }
}

/* Every entry point: lock, re-read the configuration if it changed, count the call. */
#define BEGIN(sym)                                                                                \
    static const char SYM[] = sym;                                                                \
    pthread_mutex_lock(&mu);                                                                      \
    refresh();                                                                                    \
    count_call(SYM);                                                                              \
    nvmlReturn_t r = init_count > 0 ? NVML_SUCCESS : NVML_ERROR_UNINITIALIZED;                    \
    if (r == NVML_SUCCESS) {                                                                      \
        long long injected__;                                                                     \
        if (cfg_int(&injected__, "fail.%s", SYM)) {                                               \
            r = (nvmlReturn_t)injected__;                                                         \
        }                                                                                         \
    }

#define END()                                                                                     \
    pthread_mutex_unlock(&mu);                                                                    \
    return r

/* ---- devices -------------------------------------------------------------------------------- */

struct handle {
    uint32_t magic;
    int gpu;
    int slot; /* -1: the physical GPU */
    long long gen;
};
#define HANDLE_MAGIC 0x4e564d4cu

static struct handle phys[MAX_GPUS];
/* MIG handles: one per (GPU, slot, generation); older ones stay allocated (and invalid). */
static struct handle *mig_handles[MAX_GPUS][MAX_SLOTS];

static int gpu_count(void) {
    long long n = cfg_int_or(0, "gpus");
    return n < 0 ? 0 : (n > MAX_GPUS ? MAX_GPUS : (int)n);
}

static long long mig_gen(int gpu) {
    return cfg_int_or(0, "gpu.%d.mig.gen", gpu);
}

static int slot_used(int gpu, int slot) {
    return cfg("gpu.%d.mig.%d.gi", gpu, slot) != NULL;
}

/*
 * Resolves a device handle for function `sym`. `mig_ok`: whether the function accepts MIG device
 * handles (otherwise a MIG handle answers NOT_SUPPORTED, as NVML does for most queries).
 */
static nvmlReturn_t resolve(nvmlDevice_t d, const char *sym, int mig_ok, struct handle **out) {
    struct handle *h = (struct handle *)d;
    if (!h || h->magic != HANDLE_MAGIC || h->gpu < 0 || h->gpu >= gpu_count()) {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    if (cfg_int_or(0, "gpu.%d.lost", h->gpu)) {
        return NVML_ERROR_GPU_IS_LOST;
    }
    long long rc;
    if (cfg_int(&rc, "gpu.%d.fail.%s", h->gpu, sym)) {
        return (nvmlReturn_t)rc;
    }
    if (h->slot >= 0) {
        if (h->gen != mig_gen(h->gpu) || !slot_used(h->gpu, h->slot)) {
            return NVML_ERROR_INVALID_ARGUMENT; /* destroyed or recreated since handed out */
        }
        if (!mig_ok) {
            return NVML_ERROR_NOT_SUPPORTED;
        }
        if (cfg_int(&rc, "gpu.%d.mig.%d.fail.%s", h->gpu, h->slot, sym)) {
            return (nvmlReturn_t)rc;
        }
    }
    *out = h;
    return NVML_SUCCESS;
}

static nvmlReturn_t put_text(char *buf, unsigned int length, const char *text) {
    if (!buf) {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    if (!text) {
        return NVML_ERROR_NOT_SUPPORTED;
    }
    if (strlen(text) + 1 > length) {
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    memcpy(buf, text, strlen(text) + 1);
    return NVML_SUCCESS;
}

static nvmlReturn_t put_uint(unsigned int *out, const char *value) {
    long long v;
    if (!out) {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    if (!parse_ll(value, &v)) {
        return NVML_ERROR_NOT_SUPPORTED;
    }
    *out = (unsigned int)v;
    return NVML_SUCCESS;
}

static long long now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (long long)ts.tv_sec * 1000000LL + ts.tv_nsec / 1000;
}

/* ---- events --------------------------------------------------------------------------------- */

static long long xid_seen = -1;   /* highest xid.<seq> raised */
static long long last_gen[MAX_GPUS];
static int gens_known;
static char fail_next_seen[64];
static long long fail_next_code, fail_next_left;
static char fail_old_seen[64];
static long long fail_old_code;
static unsigned long long fail_old_upto;

static void raise_event(int gpu, unsigned long long type, unsigned long long data, unsigned int gi,
                        unsigned int ci) {
    for (struct event_set *s = sets; s; s = s->next) {
        if (gpu < 0 || gpu >= MAX_GPUS || !(s->types[gpu] & type) || s->len == EVENT_QUEUE) {
            continue;
        }
        struct event *e = &s->queue[(s->head + s->len) % EVENT_QUEUE];
        e->gpu = gpu;
        e->type = type;
        e->data = data;
        e->gi = gi;
        e->ci = ci;
        s->len++;
    }
    pthread_cond_broadcast(&events_cv);
}

static int cmp_ll(const void *a, const void *b) {
    long long x = *(const long long *)a, y = *(const long long *)b;
    return (x > y) - (x < y);
}

static void on_config_loaded(void) {
    /* XIDs new in this configuration, in sequence order. */
    long long seqs[512];
    size_t n = 0;
    for (size_t i = 0; i < n_entries && n < 512; i++) {
        long long seq;
        if (strncmp(entries[i].key, "xid.", 4) == 0 && parse_ll(entries[i].key + 4, &seq)
            && seq > xid_seen) {
            seqs[n++] = seq;
        }
    }
    qsort(seqs, n, sizeof seqs[0], cmp_ll);
    for (size_t i = 0; i < n; i++) {
        int gpu = -1;
        unsigned long long xid = 0;
        unsigned int gi = 0xFFFFFFFFu, ci = 0xFFFFFFFFu;
        const char *v = cfg("xid.%lld", seqs[i]);
        if (v && sscanf(v, "%d %llu %u %u", &gpu, &xid, &gi, &ci) >= 2) {
            raise_event(gpu, EVENT_XID, xid, gi, ci);
        }
        xid_seen = seqs[i];
    }
    /* MIG reconfigurations. */
    for (int g = 0; g < MAX_GPUS; g++) {
        long long gen = mig_gen(g);
        if (gens_known && gen != last_gen[g]) {
            raise_event(g, EVENT_MIG_CONFIG_CHANGE, 0, 0xFFFFFFFFu, 0xFFFFFFFFu);
        }
        last_gen[g] = gen;
    }
    gens_known = 1;
    /* Event-wait failures. */
    const char *fn = cfg("events.fail_next");
    if (fn && strcmp(fn, fail_next_seen) != 0) {
        snprintf(fail_next_seen, sizeof fail_next_seen, "%s", fn);
        if (sscanf(fn, "%lld %lld", &fail_next_code, &fail_next_left) != 2) {
            fail_next_left = 0;
        }
    }
    const char *fo = cfg("events.fail_old_sets");
    if (fo && strcmp(fo, fail_old_seen) != 0) {
        snprintf(fail_old_seen, sizeof fail_old_seen, "%s", fo);
        fail_old_code = strtoll(fo, NULL, 0);
        fail_old_upto = sets_created;
    }
    write_status();
}

/* ---- initialisation and system queries ------------------------------------------------------- */

static nvmlReturn_t init_common(void) {
    pthread_mutex_lock(&mu);
    refresh();
    count_call("nvmlInit_v2");
    nvmlReturn_t r = NVML_SUCCESS;
    long long rc;
    if (!config_present) {
        r = NVML_ERROR_DRIVER_NOT_LOADED;
    } else if (cfg_int(&rc, "init_error")) {
        r = (nvmlReturn_t)rc;
    } else {
        for (int g = 0; g < MAX_GPUS; g++) {
            phys[g].magic = HANDLE_MAGIC;
            phys[g].gpu = g;
            phys[g].slot = -1;
        }
        init_count++;
    }
    write_status();
    pthread_mutex_unlock(&mu);
    return r;
}

EXPORT nvmlReturn_t nvmlInit_v2(void) { return init_common(); }

EXPORT nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    return init_common();
}

EXPORT nvmlReturn_t nvmlShutdown(void) {
    BEGIN("nvmlShutdown");
    if (r == NVML_SUCCESS) {
        init_count--;
    }
    END();
}

EXPORT const char *nvmlErrorString(nvmlReturn_t result) {
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NO_PERMISSION: return "Insufficient Permissions";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_TIMEOUT: return "Timeout";
    case NVML_ERROR_FUNCTION_NOT_FOUND: return "Function Not Found";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "Argument version mismatch";
    default: return "Unknown Error";
    }
}

EXPORT nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    BEGIN("nvmlSystemGetDriverVersion");
    if (r == NVML_SUCCESS) {
        r = put_text(version, length, cfg("driver_version"));
    }
    END();
}

EXPORT nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length) {
    BEGIN("nvmlSystemGetNVMLVersion");
    if (r == NVML_SUCCESS) {
        r = put_text(version, length, cfg("nvml_version"));
    }
    END();
}

EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *cudaDriverVersion) {
    BEGIN("nvmlSystemGetCudaDriverVersion_v2");
    long long v;
    if (r == NVML_SUCCESS) {
        if (!cudaDriverVersion) {
            r = NVML_ERROR_INVALID_ARGUMENT;
        } else if (!cfg_int(&v, "cuda_version")) {
            r = NVML_ERROR_NOT_SUPPORTED;
        } else {
            *cudaDriverVersion = (int)v;
        }
    }
    END();
}

EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *deviceCount) {
    BEGIN("nvmlDeviceGetCount_v2");
    if (r == NVML_SUCCESS) {
        if (!deviceCount) {
            r = NVML_ERROR_INVALID_ARGUMENT;
        } else {
            *deviceCount = (unsigned int)gpu_count();
        }
    }
    write_status();
    END();
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    BEGIN("nvmlDeviceGetHandleByIndex_v2");
    if (r == NVML_SUCCESS) {
        if (!device || index >= (unsigned int)gpu_count()) {
            r = NVML_ERROR_INVALID_ARGUMENT;
        } else if (cfg_int_or(0, "gpu.%u.lost", index)) {
            r = NVML_ERROR_GPU_IS_LOST;
        } else {
            *device = (nvmlDevice_t)&phys[index];
        }
    }
    END();
}

/* ---- static facts --------------------------------------------------------------------------- */

static const char *profile_name(int gpu, int slot) {
    long long p = cfg_int_or(-1, "gpu.%d.mig.%d.profile", gpu, slot);
    return cfg("gpu.%d.profile.%lld.name", gpu, p);
}

EXPORT nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length) {
    BEGIN("nvmlDeviceGetUUID");
    struct handle *h = NULL;
    if (r == NVML_SUCCESS) {
        r = resolve(device, SYM, 1, &h);
    }
    if (r == NVML_SUCCESS) {
        r = put_text(uuid, length,
                     h->slot < 0 ? cfg("gpu.%d.uuid", h->gpu)
                                 : cfg("gpu.%d.mig.%d.uuid", h->gpu, h->slot));
    }
    END();
}

EXPORT nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length) {
    BEGIN("nvmlDeviceGetName");
    struct handle *h = NULL;
    if (r == NVML_SUCCESS) {
        r = resolve(device, SYM, 1, &h);
    }
    if (r == NVML_SUCCESS) {
        const char *base = cfg("gpu.%d.name", h->gpu);
        if (h->slot < 0 || !base) {
            r = put_text(name, length, base);
        } else {
            /* A MIG device is named after its GPU and profile: "NVIDIA H100 ... MIG 1g.10gb". */
            char buf[256];
            const char *p = profile_name(h->gpu, h->slot);
            snprintf(buf, sizeof buf, "%s %s", base, p ? p : "MIG");
            r = put_text(name, length, buf);
        }
    }
    END();
}

EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci) {
    BEGIN("nvmlDeviceGetPciInfo_v3");
    struct handle *h = NULL;
    if (r == NVML_SUCCESS) {
        r = resolve(device, SYM, 0, &h);
    }
    if (r == NVML_SUCCESS && !pci) {
        r = NVML_ERROR_INVALID_ARGUMENT;
    }
    if (r == NVML_SUCCESS) {
        const char *id = cfg("gpu.%d.pci_bus_id", h->gpu);
        unsigned int domain = 0, bus = 0, dev = 0, fn = 0;
        if (!id || sscanf(id, "%x:%x:%x.%x", &domain, &bus, &dev, &fn) != 4) {
            r = NVML_ERROR_NOT_SUPPORTED;
        } else {
            memset(pci, 0, sizeof *pci);
            snprintf(pci->busId, sizeof pci->busId, "%s", id);
            snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "%04X:%02X:%02X.%X", domain & 0xFFFF,
                     bus & 0xFF, dev & 0x1F, fn & 0x7);
            pci->domain = domain;
            pci->bus = bus;
            pci->device = dev;
            pci->pciDeviceId = 0x233010DEu;
            pci->pciSubSystemId = 0x16C110DEu;
        }
    }
    END();
}

#define UINT_QUERY(symbol, key)                                                                   \
    EXPORT nvmlReturn_t symbol(nvmlDevice_t device, unsigned int *out) {                         \
        BEGIN(#symbol);                                                                           \
        struct handle *h = NULL;                                                                  \
        if (r == NVML_SUCCESS) {                                                                  \
            r = resolve(device, SYM, 0, &h);                                                      \
        }                                                                                         \
        if (r == NVML_SUCCESS) {                                                                  \
            r = put_uint(out, cfg("gpu.%d." key, h->gpu));                                        \
        }                                                                                         \
        END();                                                                                    \
    }

#define TEXT_QUERY(symbol, key)                                                                   \
    EXPORT nvmlReturn_t symbol(nvmlDevice_t device, char *out, unsigned int length) {            \
        BEGIN(#symbol);                                                                           \
        struct handle *h = NULL;                                                                  \
        if (r == NVML_SUCCESS) {                                                                  \
            r = resolve(device, SYM, 0, &h);                                                      \
        }                                                                                         \
        if (r == NVML_SUCCESS) {                                                                  \
            r = put_text(out, length, cfg("gpu.%d." key, h->gpu));                                \
        }                                                                                         \
        END();                                                                                    \
    }

UINT_QUERY(nvmlDeviceGetMinorNumber, "minor")
TEXT_QUERY(nvmlDeviceGetSerial, "serial")
TEXT_QUERY(nvmlDeviceGetVbiosVersion, "vbios")
TEXT_QUERY(nvmlDeviceGetInforomImageVersion, "inforom_image")
UINT_QUERY(nvmlDeviceGetPowerUsage, "power_mw")
UINT_QUERY(nvmlDeviceGetPowerManagementLimit, "power_limit_mw")
UINT_QUERY(nvmlDeviceGetEnforcedPowerLimit, "enforced_limit_mw")
UINT_QUERY(nvmlDeviceGetCurrPcieLinkGeneration, "pcie_gen")
UINT_QUERY(nvmlDeviceGetCurrPcieLinkWidth, "pcie_width")

EXPORT nvmlReturn_t nvmlDeviceGetBrand(nvmlDevice_t device, int *type) {
    BEGIN("nvmlDeviceGetBrand");
    struct handle *h = NULL;
    if (r == NVML_SUCCESS) {
        r = resolve(device, SYM, 0, &h);
    }
    if (r == NVML_SUCCESS) {
        r = put_uint((unsigned int *)type, cfg("gpu.%d.brand", h->gpu));
    }
    END();
}

EXPORT nvmlReturn_t nvmlDeviceGetInforomVersion(nvmlDevice_t device, int object, char *version,
                                                unsigned int length) {
    BEGIN("nvmlDeviceGetInforomVersion");
    struct handle *h = NULL;
    static const char *const objects[] = {"oem", "ecc", "power"};
    if (r == NVML_SUCCESS) {
        r = resolve(device, SYM, 0, &h);
    }
    if (r == NVML_SUCCESS) {
        if (object < 0 || object > 3) {
            r = NVML_ERROR_INVALID_ARGUMENT;
        } else if (object == 3) {
            r = NVML_ERROR_NOT_SUPPORTED;
        } else {
            r = put_text(version, length, cfg("gpu.%d.inforom.%s", h->gpu, objects[object]));
        }
    }
    END();
}

/* ---- per-tick readings ---------------------------------------------------------------------- */

EXPORT nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t device, int sensorType, unsigned int *temp) {
    BEGIN("nvmlDeviceGetTemperature");
    struct handle *h = NULL;
    if (r == NVML_SUCCESS) {
        r = resolve(device, SYM, 0, &h);
    }
    if (r == NVML_SUCCESS) {
        r = sensorType != 0 ? NVML_ERROR_INVALID_ARGUMENT : put_uint(temp, cfg("gpu.%d.temp", h->gpu));
    }
    END();
}

EXPORT nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t device, int type, unsigned int *clock) {
    BEGIN("nvmlDeviceGetClockInfo");
    struct handle *h = NULL;
    static const char *const names[] = {"graphics", "sm", "mem", "video"};
    if (r == NVML_SUCCESS) {
        r = resolve(device, SYM, 0, &h);
    }
    if (r == NVML_SUCCESS) {
        r = (type < 0 || type > 3) ? NVML_ERROR_INVALID_ARGUMENT
                                   : put_uint(clock, cfg("gpu.%d.clock.%s", h->gpu, names[type]));
    }
    END();
}

EXPORT nvmlReturn_t nvmlDeviceGetPerformanceState(nvmlDevice_t device, int *pState) {
    BEGIN("nvmlDeviceGetPerformanceState");
    struct handle *h = NULL;
    if (r == NVML_SUCCESS) {
        r = resolve(device, SYM, 0, &h);
    }
    if (r == NVML_SUCCESS) {
        r = put_uint((unsigned int *)pState, cfg("gpu.%d.pstate", h->gpu));
    }
    END();
}

EXPORT nvmlReturn_t nvmlDeviceGetFanSpeed_v2(nvmlDevice_t device, unsigned int fan, unsigned int *speed) {
    BEGIN("nvmlDeviceGetFanSpeed_v2");
    struct handle *h = NULL;
    if (r == NVML_SUCCESS) {
        r = resolve(device, SYM, 0, &h);
    }
    if (r == NVML_SUCCESS) {
        r = fan != 0 ? NVML_ERROR_INVALID_ARGUMENT : put_uint(speed, cfg("gpu.%d.fan", h->gpu));
    }
    END();
}

EXPORT nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *utilization) {
    BEGIN("nvmlDeviceGetUtilizationRates");
    struct handle *h = NULL;
    if (r == NVML_SUCCESS) {
        r = resolve(device, SYM, 0, &h);
    }
    if (r == NVML_SUCCESS) {
        long long g, m;
        if (!utilization) {
            r = NVML_ERROR_INVALID_ARGUMENT;
        } else if (cfg_int_or(0, "gpu.%d.mig", h->gpu)
                   || !cfg_int(&g, "gpu.%d.util.gpu", h->gpu)
                   || !cfg_int(&m, "gpu.%d.util.mem", h->gpu)) {
            r = NVML_ERROR_NOT_SUPPORTED; /* not defined in MIG mode */
        } else {
            utilization->gpu = (unsigned int)g;
            utilization->memory = (unsigned int)m;
        }
    }
    END();
}

static nvmlReturn_t codec(nvmlDevice_t device, const char *sym, const char *key, unsigned int *u,
                          unsigned int *period) {
    struct handle *h = NULL;
    nvmlReturn_t r = resolve(device, sym, 0, &h);
    if (r == NVML_SUCCESS && !period) {
        r = NVML_ERROR_INVALID_ARGUMENT;
    }
    if (r == NVML_SUCCESS) {
        r = put_uint(u, cfg("gpu.%d.%s", h->gpu, key));
    }
    if (r == NVML_SUCCESS) {
        *period = 167000;
    }
    return r;
}

EXPORT nvmlReturn_t nvmlDeviceGetEncoderUtilization(nvmlDevice_t device, unsigned int *utilization,
                                                    unsigned int *samplingPeriodUs) {
    BEGIN("nvmlDeviceGetEncoderUtilization");
    if (r == NVML_SUCCESS) {
        r = codec(device, SYM, "enc", utilization, samplingPeriodUs);
    }
    END();
}

EXPORT nvmlReturn_t nvmlDeviceGetDecoderUtilization(nvmlDevice_t device, unsigned int *utilization,
                                                    unsigned int *samplingPeriodUs) {
    BEGIN("nvmlDeviceGetDecoderUtilization");
    if (r == NVML_SUCCESS) {
        r = codec(device, SYM, "dec", utilization, samplingPeriodUs);
    }
    END();
}

EXPORT nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(nvmlDevice_t device,
                                                           unsigned long long *reasons) {
    BEGIN("nvmlDeviceGetCurrentClocksEventReasons");
    struct handle *h = NULL;
    long long v;
    if (r == NVML_SUCCESS) {
        r = resolve(device, SYM, 0, &h);
    }
    if (r == NVML_SUCCESS) {
        if (!reasons) {
            r = NVML_ERROR_INVALID_ARGUMENT;
        } else if (!cfg_int(&v, "gpu.%d.clocks_event_reasons", h->gpu)) {
            r = NVML_ERROR_NOT_SUPPORTED;
        } else {
            *reasons = (unsigned long long)v;
        }
    }
    END();
}

/* vGPU software licensing: absent (NOT_SUPPORTED, as on bare metal) unless gpu.N.grid.supported
 * is set. A guest lists an NVIDIA RTX feature first and the vGPU feature (state
 * gpu.N.grid.vgpu_state) second, so a wrong element size on the caller's side reads the wrong
 * entry. */
EXPORT nvmlReturn_t nvmlDeviceGetGridLicensableFeatures_v4(nvmlDevice_t device,
                                                           nvmlGridLicensableFeatures_t *features) {
    BEGIN("nvmlDeviceGetGridLicensableFeatures_v4");
    struct handle *h = NULL;
    long long supported;
    if (r == NVML_SUCCESS) {
        r = resolve(device, SYM, 0, &h);
    }
    if (r == NVML_SUCCESS) {
        if (!features) {
            r = NVML_ERROR_INVALID_ARGUMENT;
        } else if (!cfg_int(&supported, "gpu.%d.grid.supported", h->gpu)) {
            r = NVML_ERROR_NOT_SUPPORTED;
        } else {
            memset(features, 0, sizeof(*features));
            features->isGridLicenseSupported = (int)supported;
            if (supported) {
                nvmlGridLicensableFeature_t *rtx = &features->gridLicensableFeatures[0];
                nvmlGridLicensableFeature_t *vgpu = &features->gridLicensableFeatures[1];
                rtx->featureCode = GRID_LICENSE_FEATURE_CODE_NVIDIA_RTX;
                rtx->featureState = 0;
                snprintf(rtx->productName, sizeof(rtx->productName), "NVIDIA RTX Virtual Workstation");
                vgpu->featureCode = GRID_LICENSE_FEATURE_CODE_VGPU;
                vgpu->featureState =
                    (unsigned int)cfg_int_or(0, "gpu.%d.grid.vgpu_state", h->gpu);
                vgpu->featureEnabled = 1;
                snprintf(vgpu->productName, sizeof(vgpu->productName), "NVIDIA Virtual Compute Server");
                features->licensableFeaturesCount = 2;
            }
        }
    }
    END();
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory) {
    BEGIN("nvmlDeviceGetMemoryInfo_v2");
    struct handle *h = NULL;
    if (r == NVML_SUCCESS) {
        r = resolve(device, SYM, 1, &h);
    }
    if (r == NVML_SUCCESS) {
        char prefix[64];
        long long t, f, u, res;
        if (h->slot < 0) {
            snprintf(prefix, sizeof prefix, "gpu.%d.mem", h->gpu);
        } else {
            snprintf(prefix, sizeof prefix, "gpu.%d.mig.%d.mem", h->gpu, h->slot);
        }
        if (!memory) {
            r = NVML_ERROR_INVALID_ARGUMENT;
        } else if (memory->version != MEMORY_V2) {
            r = NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
        } else if (!cfg_int(&t, "%s.total", prefix) || !cfg_int(&f, "%s.free", prefix)
                   || !cfg_int(&u, "%s.used", prefix) || !cfg_int(&res, "%s.reserved", prefix)) {
            r = NVML_ERROR_NOT_SUPPORTED;
        } else {
            memory->total = (unsigned long long)t;
            memory->free = (unsigned long long)f;
            memory->used = (unsigned long long)u;
            memory->reserved = (unsigned long long)res;
        }
    }
    END();
}

EXPORT nvmlReturn_t nvmlDeviceGetEccMode(nvmlDevice_t device, int *current, int *pending) {
    BEGIN("nvmlDeviceGetEccMode");
    struct handle *h = NULL;
    if (r == NVML_SUCCESS) {
        r = resolve(device, SYM, 0, &h);
    }
    if (r == NVML_SUCCESS) {
        if (!current || !pending) {
            r = NVML_ERROR_INVALID_ARGUMENT;
        } else {
            *current = *pending = cfg_int_or(1, "gpu.%d.ecc", h->gpu) ? 1 : 0;
        }
    }
    END();
}

/* Fills one field-values entry from its spec; returns 0 to leave the entry untouched. */
static int fill_field(nvmlFieldValue_t *v, const char *spec, long long now) {
    const char *colon = spec ? strchr(spec, ':') : NULL;
    const char *arg = colon ? colon + 1 : "";
    size_t kind = colon ? (size_t)(colon - spec) : (spec ? strlen(spec) : 0);
    long long n = 0;
#define KIND(k) (spec && kind == strlen(k) && strncmp(spec, k, kind) == 0)
    if (KIND("untouched")) {
        return 0;
    }
    v->timestamp = now;
    v->latencyUsec = 3;
    if (!spec) {
        v->nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
    } else if (KIND("d")) {
        v->nvmlReturn = NVML_SUCCESS;
        v->valueType = NVML_VALUE_TYPE_DOUBLE;
        v->value.dVal = strtod(arg, NULL);
    } else if (!parse_ll(arg, &n)) {
        v->nvmlReturn = NVML_ERROR_UNKNOWN;
    } else if (KIND("u")) {
        v->nvmlReturn = NVML_SUCCESS;
        v->valueType = NVML_VALUE_TYPE_UNSIGNED_LONG_LONG;
        v->value.ullVal = (unsigned long long)n;
    } else if (KIND("i")) {
        v->nvmlReturn = NVML_SUCCESS;
        v->valueType = NVML_VALUE_TYPE_SIGNED_LONG_LONG;
        v->value.sllVal = n;
    } else if (KIND("ui")) {
        v->nvmlReturn = NVML_SUCCESS;
        v->valueType = NVML_VALUE_TYPE_UNSIGNED_INT;
        v->value.uiVal = (unsigned int)n;
    } else if (KIND("ui_as_double")) {
        v->nvmlReturn = NVML_SUCCESS;
        v->valueType = NVML_VALUE_TYPE_DOUBLE;
        v->value.uiVal = (unsigned int)n;
    } else if (KIND("no_type")) {
        v->nvmlReturn = NVML_SUCCESS;
        v->value.ullVal = (unsigned long long)n;
    } else if (KIND("err")) {
        v->nvmlReturn = (nvmlReturn_t)n;
    } else {
        v->nvmlReturn = NVML_ERROR_UNKNOWN;
    }
#undef KIND
    return 1;
}

EXPORT nvmlReturn_t nvmlDeviceGetFieldValues(nvmlDevice_t device, int valuesCount,
                                             nvmlFieldValue_t *values) {
    BEGIN("nvmlDeviceGetFieldValues");
    struct handle *h = NULL;
    if (r == NVML_SUCCESS) {
        r = resolve(device, SYM, 0, &h);
    }
    if (r == NVML_SUCCESS && (valuesCount < 0 || (valuesCount > 0 && !values))) {
        r = NVML_ERROR_INVALID_ARGUMENT;
    }
    if (r == NVML_SUCCESS) {
        long long now = now_us();
        int ecc_off = cfg_int_or(1, "gpu.%d.ecc", h->gpu) == 0;
        for (int i = 0; i < valuesCount; i++) {
            nvmlFieldValue_t *v = &values[i];
            if (ecc_off && v->fieldId >= 1 && v->fieldId <= 31) {
                continue; /* NVML bug 2009232: left as the caller passed it */
            }
            /* `field.ID.scope`; for scope 0 (device-wide, or link 0) also plain `field.ID`. */
            const char *spec = cfg("gpu.%d.field.%u.%u", h->gpu, v->fieldId, v->scopeId);
            if (!spec && v->scopeId == 0) {
                spec = cfg("gpu.%d.field.%u", h->gpu, v->fieldId);
            }
            fill_field(v, spec, now);
        }
    }
    write_status();
    END();
}

/* ---- NVLink --------------------------------------------------------------------------------- */

EXPORT nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t device, unsigned int link, int *isActive) {
    BEGIN("nvmlDeviceGetNvLinkState");
    struct handle *h = NULL;
    long long v;
    if (r == NVML_SUCCESS) {
        r = resolve(device, SYM, 0, &h);
    }
    if (r == NVML_SUCCESS) {
        if (!isActive) {
            r = NVML_ERROR_INVALID_ARGUMENT;
        } else if (!cfg_int(&v, "gpu.%d.nvlink.%u.active", h->gpu, link)) {
            r = NVML_ERROR_NOT_SUPPORTED;
        } else {
            *isActive = v ? 1 : 0;
        }
    }
    END();
}

EXPORT nvmlReturn_t nvmlDeviceGetNvLinkErrorCounter(nvmlDevice_t device, unsigned int link, int counter,
                                                    unsigned long long *counterValue) {
    BEGIN("nvmlDeviceGetNvLinkErrorCounter");
    struct handle *h = NULL;
    static const char *const names[] = {"replay", "recovery", "crc_flit", "crc_data", "ecc_data"};
    long long v;
    if (r == NVML_SUCCESS) {
        r = resolve(device, SYM, 0, &h);
    }
    if (r == NVML_SUCCESS) {
        if (!counterValue || counter < 0 || counter > 4) {
            r = NVML_ERROR_INVALID_ARGUMENT;
        } else if (!cfg_int(&v, "gpu.%d.nvlink.%u.%s", h->gpu, link, names[counter])) {
            r = NVML_ERROR_NOT_SUPPORTED;
        } else {
            *counterValue = (unsigned long long)v;
        }
    }
    END();
}

/* ---- MIG ------------------------------------------------------------------------------------ */

EXPORT nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *currentMode,
                                         unsigned int *pendingMode) {
    BEGIN("nvmlDeviceGetMigMode");
    struct handle *h = NULL;
    if (r == NVML_SUCCESS) {
        r = resolve(device, SYM, 0, &h);
    }
    if (r == NVML_SUCCESS) {
        if (!currentMode || !pendingMode) {
            r = NVML_ERROR_INVALID_ARGUMENT;
        } else {
            *currentMode = *pendingMode = cfg_int_or(0, "gpu.%d.mig", h->gpu) ? 1 : 0;
        }
    }
    END();
}

EXPORT nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t device, unsigned int *count) {
    BEGIN("nvmlDeviceGetMaxMigDeviceCount");
    struct handle *h = NULL;
    if (r == NVML_SUCCESS) {
        r = resolve(device, SYM, 0, &h);
    }
    if (r == NVML_SUCCESS) {
        long long n = cfg_int_or(0, "gpu.%d.mig.slots", h->gpu);
        if (!count) {
            r = NVML_ERROR_INVALID_ARGUMENT;
        } else {
            *count = (unsigned int)(n < 0 ? 0 : (n > MAX_SLOTS ? MAX_SLOTS : n));
        }
    }
    END();
}

EXPORT nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t device, unsigned int index,
                                                        nvmlDevice_t *migDevice) {
    BEGIN("nvmlDeviceGetMigDeviceHandleByIndex");
    struct handle *h = NULL;
    if (r == NVML_SUCCESS) {
        r = resolve(device, SYM, 0, &h);
    }
    if (r == NVML_SUCCESS) {
        if (h->slot >= 0 || !migDevice || index >= MAX_SLOTS
            || index >= (unsigned int)cfg_int_or(0, "gpu.%d.mig.slots", h->gpu)) {
            r = NVML_ERROR_INVALID_ARGUMENT;
        } else if (!cfg_int_or(0, "gpu.%d.mig", h->gpu)) {
            r = NVML_ERROR_NOT_SUPPORTED;
        } else if (!slot_used(h->gpu, (int)index)) {
            r = NVML_ERROR_NOT_FOUND;
        } else {
            long long gen = mig_gen(h->gpu);
            struct handle *m = mig_handles[h->gpu][index];
            if (!m || m->gen != gen) {
                m = calloc(1, sizeof *m); /* the old one stays valid memory, and invalid */
                if (!m) {
                    abort();
                }
                m->magic = HANDLE_MAGIC;
                m->gpu = h->gpu;
                m->slot = (int)index;
                m->gen = gen;
                mig_handles[h->gpu][index] = m;
            }
            *migDevice = (nvmlDevice_t)m;
        }
    }
    END();
}

static nvmlReturn_t mig_id(nvmlDevice_t device, const char *sym, const char *key, unsigned int *id) {
    struct handle *h = NULL;
    nvmlReturn_t r = resolve(device, sym, 1, &h);
    if (r == NVML_SUCCESS) {
        r = h->slot < 0 ? NVML_ERROR_NOT_SUPPORTED
                        : put_uint(id, cfg("gpu.%d.mig.%d.%s", h->gpu, h->slot, key));
    }
    return r;
}

EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t device, unsigned int *id) {
    BEGIN("nvmlDeviceGetGpuInstanceId");
    if (r == NVML_SUCCESS) {
        r = mig_id(device, SYM, "gi", id);
    }
    END();
}

EXPORT nvmlReturn_t nvmlDeviceGetComputeInstanceId(nvmlDevice_t device, unsigned int *id) {
    BEGIN("nvmlDeviceGetComputeInstanceId");
    if (r == NVML_SUCCESS) {
        r = mig_id(device, SYM, "ci", id);
    }
    END();
}

/* The slot holding GPU instance `gi`, or -1. */
static int slot_of_gi(int gpu, long long gi) {
    long long slots = cfg_int_or(0, "gpu.%d.mig.slots", gpu);
    for (int s = 0; s < slots && s < MAX_SLOTS; s++) {
        if (cfg_int_or(-1, "gpu.%d.mig.%d.gi", gpu, s) == gi) {
            return s;
        }
    }
    return -1;
}

struct gi_handle {
    uint32_t magic;
    int gpu;
    int gi;
    long long gen;
};
#define GI_MAGIC 0x47494e53u
static struct gi_handle *gi_handles[MAX_GPUS][MAX_GI];

EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceById(nvmlDevice_t device, unsigned int id,
                                                 nvmlGpuInstance_t *gpuInstance) {
    BEGIN("nvmlDeviceGetGpuInstanceById");
    struct handle *h = NULL;
    if (r == NVML_SUCCESS) {
        r = resolve(device, SYM, 0, &h);
    }
    if (r == NVML_SUCCESS) {
        if (!gpuInstance || h->slot >= 0 || id >= MAX_GI) {
            r = NVML_ERROR_INVALID_ARGUMENT;
        } else if (!cfg_int_or(0, "gpu.%d.mig", h->gpu)) {
            r = NVML_ERROR_NOT_SUPPORTED;
        } else if (cfg_int_or(0, "gpu.%d.gi_denied", h->gpu)) {
            r = NVML_ERROR_NO_PERMISSION;
        } else if (slot_of_gi(h->gpu, id) < 0) {
            r = NVML_ERROR_NOT_FOUND;
        } else {
            long long gen = mig_gen(h->gpu);
            struct gi_handle *g = gi_handles[h->gpu][id];
            if (!g || g->gen != gen) {
                g = calloc(1, sizeof *g);
                if (!g) {
                    abort();
                }
                g->magic = GI_MAGIC;
                g->gpu = h->gpu;
                g->gi = (int)id;
                g->gen = gen;
                gi_handles[h->gpu][id] = g;
            }
            *gpuInstance = (nvmlGpuInstance_t)g;
        }
    }
    END();
}

EXPORT nvmlReturn_t nvmlGpuInstanceGetInfo(nvmlGpuInstance_t gpuInstance, nvmlGpuInstanceInfo_t *info) {
    BEGIN("nvmlGpuInstanceGetInfo");
    struct gi_handle *g = (struct gi_handle *)gpuInstance;
    if (r == NVML_SUCCESS) {
        int slot = g && g->magic == GI_MAGIC ? slot_of_gi(g->gpu, g->gi) : -1;
        if (!info || slot < 0 || g->gen != mig_gen(g->gpu)) {
            r = NVML_ERROR_INVALID_ARGUMENT;
        } else {
            long long p = cfg_int_or(-1, "gpu.%d.mig.%d.profile", g->gpu, slot);
            memset(info, 0, sizeof *info);
            info->device = (nvmlDevice_t)&phys[g->gpu];
            info->id = (unsigned int)g->gi;
            info->profileId = (unsigned int)cfg_int_or(p, "gpu.%d.profile.%lld.id", g->gpu, p);
            info->placement.start = (unsigned int)slot;
            info->placement.size = 1;
        }
    }
    END();
}

static void fill_profile(nvmlGpuInstanceProfileInfo_v2_t *info, int gpu, long long index) {
    unsigned int version = info->version;
    memset(info, 0, sizeof *info);
    info->version = version;
    info->id = (unsigned int)cfg_int_or(index, "gpu.%d.profile.%lld.id", gpu, index);
    info->sliceCount = (unsigned int)cfg_int_or(1, "gpu.%d.profile.%lld.slices", gpu, index);
    info->instanceCount = 7 / (info->sliceCount ? info->sliceCount : 1);
    info->multiprocessorCount = 16 * info->sliceCount;
    info->copyEngineCount = info->sliceCount;
    info->memorySizeMB = (unsigned long long)cfg_int_or(0, "gpu.%d.profile.%lld.mem_mb", gpu, index);
    const char *name = cfg("gpu.%d.profile.%lld.name", gpu, index);
    snprintf(info->name, sizeof info->name, "%s", name ? name : "");
}

EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfoV(nvmlDevice_t device, unsigned int profile,
                                                         nvmlGpuInstanceProfileInfo_v2_t *info) {
    BEGIN("nvmlDeviceGetGpuInstanceProfileInfoV");
    struct handle *h = NULL;
    if (r == NVML_SUCCESS) {
        r = resolve(device, SYM, 0, &h);
    }
    if (r == NVML_SUCCESS) {
        if (!info || profile >= 32) {
            r = NVML_ERROR_INVALID_ARGUMENT;
        } else if (info->version != PROFILE_INFO_V2) {
            r = NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
        } else if (!cfg("gpu.%d.profile.%u.name", h->gpu, profile)) {
            r = NVML_ERROR_NOT_SUPPORTED;
        } else {
            fill_profile(info, h->gpu, profile);
        }
    }
    END();
}

EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfoByIdV(nvmlDevice_t device,
                                                             unsigned int profileId,
                                                             nvmlGpuInstanceProfileInfo_v2_t *info) {
    BEGIN("nvmlDeviceGetGpuInstanceProfileInfoByIdV");
    struct handle *h = NULL;
    if (r == NVML_SUCCESS && cfg_int_or(0, "no_by_id_v")) {
        r = NVML_ERROR_FUNCTION_NOT_FOUND;
    }
    if (r == NVML_SUCCESS) {
        r = resolve(device, SYM, 0, &h);
    }
    if (r == NVML_SUCCESS) {
        long long found = -1;
        for (long long p = 0; p < 32 && found < 0; p++) {
            if (cfg("gpu.%d.profile.%lld.name", h->gpu, p)
                && cfg_int_or(p, "gpu.%d.profile.%lld.id", h->gpu, p) == (long long)profileId) {
                found = p;
            }
        }
        if (!info) {
            r = NVML_ERROR_INVALID_ARGUMENT;
        } else if (info->version != PROFILE_INFO_V2) {
            r = NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
        } else if (found < 0) {
            r = NVML_ERROR_INVALID_ARGUMENT;
        } else {
            fill_profile(info, h->gpu, found);
        }
    }
    END();
}

EXPORT nvmlReturn_t nvmlDeviceGetAttributes_v2(nvmlDevice_t device, nvmlDeviceAttributes_t *attributes) {
    BEGIN("nvmlDeviceGetAttributes_v2");
    struct handle *h = NULL;
    if (r == NVML_SUCCESS) {
        r = resolve(device, SYM, 1, &h);
    }
    if (r == NVML_SUCCESS) {
        if (!attributes) {
            r = NVML_ERROR_INVALID_ARGUMENT;
        } else if (h->slot < 0) {
            r = NVML_ERROR_NOT_SUPPORTED; /* MIG device handles only */
        } else {
            long long p = cfg_int_or(-1, "gpu.%d.mig.%d.profile", h->gpu, h->slot);
            unsigned int slices = (unsigned int)cfg_int_or(1, "gpu.%d.profile.%lld.slices", h->gpu, p);
            memset(attributes, 0, sizeof *attributes);
            attributes->multiprocessorCount = 16 * slices;
            attributes->sharedCopyEngineCount = slices;
            attributes->gpuInstanceSliceCount = slices;
            attributes->computeInstanceSliceCount = slices;
            attributes->memorySizeMB =
                (unsigned long long)cfg_int_or(0, "gpu.%d.profile.%lld.mem_mb", h->gpu, p);
        }
    }
    END();
}

/* ---- GPM ------------------------------------------------------------------------------------ */

struct gpm_sample {
    uint32_t magic;
    int filled;
    int gpu;
    int gi; /* -1: the whole GPU */
    unsigned long long seq;
    unsigned char have[GPM_METRIC_LIMIT];
    double value[GPM_METRIC_LIMIT];
};
#define GPM_MAGIC 0x47504d53u
static unsigned long long gpm_seq;

EXPORT nvmlReturn_t nvmlGpmQueryDeviceSupport(nvmlDevice_t device, nvmlGpmSupport_t *gpmSupport) {
    BEGIN("nvmlGpmQueryDeviceSupport");
    struct handle *h = NULL;
    if (r == NVML_SUCCESS) {
        r = resolve(device, SYM, 0, &h);
    }
    if (r == NVML_SUCCESS) {
        if (!gpmSupport) {
            r = NVML_ERROR_INVALID_ARGUMENT;
        } else if (gpmSupport->version != 1) {
            r = NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
        } else {
            gpmSupport->isSupportedDevice = cfg_int_or(0, "gpu.%d.gpm", h->gpu) ? 1 : 0;
        }
    }
    END();
}

EXPORT nvmlReturn_t nvmlGpmSampleAlloc(nvmlGpmSample_t *gpmSample) {
    BEGIN("nvmlGpmSampleAlloc");
    if (r == NVML_SUCCESS) {
        struct gpm_sample *s = gpmSample ? calloc(1, sizeof *s) : NULL;
        if (!s) {
            r = NVML_ERROR_INVALID_ARGUMENT;
        } else {
            s->magic = GPM_MAGIC;
            *gpmSample = (nvmlGpmSample_t)s;
        }
    }
    END();
}

EXPORT nvmlReturn_t nvmlGpmSampleFree(nvmlGpmSample_t gpmSample) {
    BEGIN("nvmlGpmSampleFree");
    struct gpm_sample *s = (struct gpm_sample *)gpmSample;
    if (r == NVML_SUCCESS) {
        if (!s || s->magic != GPM_MAGIC) {
            r = NVML_ERROR_INVALID_ARGUMENT;
        } else {
            s->magic = 0;
            free(s);
        }
    }
    END();
}

/* Takes a sample of the values under `prefix` ("gpu.0.gpm." or "gpu.0.mig.1.gpm."). */
static void take_sample(struct gpm_sample *s, int gpu, int gi, const char *prefix) {
    size_t n = strlen(prefix);
    memset(s->have, 0, sizeof s->have);
    s->filled = 1;
    s->gpu = gpu;
    s->gi = gi;
    s->seq = ++gpm_seq;
    for (size_t i = 0; i < n_entries; i++) {
        long long id;
        if (strncmp(entries[i].key, prefix, n) == 0 && parse_ll(entries[i].key + n, &id) && id > 0
            && id < GPM_METRIC_LIMIT) {
            s->have[id] = 1;
            s->value[id] = strtod(entries[i].value, NULL);
        }
    }
}

EXPORT nvmlReturn_t nvmlGpmSampleGet(nvmlDevice_t device, nvmlGpmSample_t gpmSample) {
    BEGIN("nvmlGpmSampleGet");
    struct handle *h = NULL;
    struct gpm_sample *s = (struct gpm_sample *)gpmSample;
    if (r == NVML_SUCCESS) {
        r = resolve(device, SYM, 0, &h);
    }
    if (r == NVML_SUCCESS) {
        if (!s || s->magic != GPM_MAGIC) {
            r = NVML_ERROR_INVALID_ARGUMENT;
        } else if (!cfg_int_or(0, "gpu.%d.gpm", h->gpu)) {
            r = NVML_ERROR_NOT_SUPPORTED;
        } else {
            char prefix[64];
            snprintf(prefix, sizeof prefix, "gpu.%d.gpm.", h->gpu);
            take_sample(s, h->gpu, -1, prefix);
        }
    }
    END();
}

EXPORT nvmlReturn_t nvmlGpmMigSampleGet(nvmlDevice_t device, unsigned int gpuInstanceId,
                                        nvmlGpmSample_t gpmSample) {
    BEGIN("nvmlGpmMigSampleGet");
    struct handle *h = NULL;
    struct gpm_sample *s = (struct gpm_sample *)gpmSample;
    if (r == NVML_SUCCESS) {
        r = resolve(device, SYM, 0, &h);
    }
    if (r == NVML_SUCCESS) {
        int slot = slot_of_gi(h->gpu, gpuInstanceId);
        if (!s || s->magic != GPM_MAGIC || slot < 0) {
            r = NVML_ERROR_INVALID_ARGUMENT;
        } else if (!cfg_int_or(0, "gpu.%d.gpm", h->gpu) || !cfg_int_or(0, "gpu.%d.mig", h->gpu)) {
            r = NVML_ERROR_NOT_SUPPORTED;
        } else {
            char prefix[64];
            snprintf(prefix, sizeof prefix, "gpu.%d.mig.%d.gpm.", h->gpu, slot);
            take_sample(s, h->gpu, (int)gpuInstanceId, prefix);
        }
    }
    END();
}

EXPORT nvmlReturn_t nvmlGpmMetricsGet(nvmlGpmMetricsGet_t *metricsGet) {
    BEGIN("nvmlGpmMetricsGet");
    if (r == NVML_SUCCESS) {
        struct gpm_sample *a = metricsGet ? (struct gpm_sample *)metricsGet->sample1 : NULL;
        struct gpm_sample *b = metricsGet ? (struct gpm_sample *)metricsGet->sample2 : NULL;
        if (!metricsGet) {
            r = NVML_ERROR_INVALID_ARGUMENT;
        } else if (metricsGet->version != 1) {
            r = NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
        } else if (!a || !b || a->magic != GPM_MAGIC || b->magic != GPM_MAGIC || !a->filled
                   || !b->filled || a->gpu != b->gpu || a->gi != b->gi || a->seq >= b->seq
                   || metricsGet->numMetrics > GPM_METRIC_LIMIT) {
            r = NVML_ERROR_INVALID_ARGUMENT;
        } else {
            static char unit_pct[] = "%", unit_rate[] = "MiB/s";
            for (unsigned int i = 0; i < metricsGet->numMetrics; i++) {
                nvmlGpmMetric_t *m = &metricsGet->metrics[i];
                unsigned int id = m->metricId;
                m->metricInfo.shortName = NULL;
                m->metricInfo.longName = NULL;
                m->metricInfo.unit = id >= 20 ? unit_rate : unit_pct;
                if (id > 0 && id < GPM_METRIC_LIMIT && b->have[id]) {
                    m->nvmlReturn = NVML_SUCCESS;
                    m->value = b->value[id];
                } else {
                    m->nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
                }
            }
        }
    }
    END();
}

/* ---- events --------------------------------------------------------------------------------- */

EXPORT nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set) {
    BEGIN("nvmlEventSetCreate");
    if (r == NVML_SUCCESS) {
        struct event_set *s = set ? calloc(1, sizeof *s) : NULL;
        if (!s) {
            r = NVML_ERROR_INVALID_ARGUMENT;
        } else {
            s->magic = SET_MAGIC;
            s->id = ++sets_created;
            s->next = sets;
            sets = s;
            *set = (nvmlEventSet_t)s;
        }
    }
    write_status();
    END();
}

static struct event_set *find_set(nvmlEventSet_t set) {
    for (struct event_set *s = sets; s; s = s->next) {
        if ((nvmlEventSet_t)s == set && s->magic == SET_MAGIC) {
            return s;
        }
    }
    return NULL;
}

EXPORT nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t device, unsigned long long eventTypes,
                                             nvmlEventSet_t set) {
    BEGIN("nvmlDeviceRegisterEvents");
    struct handle *h = NULL;
    if (r == NVML_SUCCESS) {
        r = resolve(device, SYM, 0, &h);
    }
    if (r == NVML_SUCCESS) {
        struct event_set *s = find_set(set);
        if (!s || !eventTypes) {
            r = NVML_ERROR_INVALID_ARGUMENT;
        } else if (eventTypes & ~(EVENT_XID | EVENT_MIG_CONFIG_CHANGE)) {
            r = NVML_ERROR_NOT_SUPPORTED; /* none of the requested types is registered */
        } else {
            s->types[h->gpu] |= eventTypes;
        }
    }
    write_status();
    END();
}

EXPORT nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data,
                                        unsigned int timeoutms) {
    BEGIN("nvmlEventSetWait_v2");
    waits++;
    struct event_set *s = NULL;
    if (r == NVML_SUCCESS) {
        s = find_set(set);
        if (!s || !data) {
            r = NVML_ERROR_INVALID_ARGUMENT;
        } else if (fail_next_left > 0) {
            fail_next_left--;
            r = (nvmlReturn_t)fail_next_code;
        } else if (fail_old_code && s->id <= fail_old_upto) {
            r = (nvmlReturn_t)fail_old_code;
        }
    }
    if (r == NVML_SUCCESS) {
        struct timespec deadline;
        clock_gettime(CLOCK_REALTIME, &deadline);
        long long end_ns = (long long)deadline.tv_sec * 1000000000LL + deadline.tv_nsec
                           + (long long)timeoutms * 1000000LL;
        for (;;) {
            if (s->len > 0) {
                struct event *e = &s->queue[s->head];
                s->head = (s->head + 1) % EVENT_QUEUE;
                s->len--;
                data->device = (nvmlDevice_t)&phys[e->gpu];
                data->eventType = e->type;
                data->eventData = e->data;
                data->gpuInstanceId = e->gi;
                data->computeInstanceId = e->ci;
                events_delivered++;
                break;
            }
            struct timespec now;
            clock_gettime(CLOCK_REALTIME, &now);
            long long now_ns = (long long)now.tv_sec * 1000000000LL + now.tv_nsec;
            if (now_ns >= end_ns) {
                r = NVML_ERROR_TIMEOUT;
                break;
            }
            /* Wake at least every 20 ms to notice a changed configuration (new events). */
            long long wake = now_ns + 20000000LL < end_ns ? now_ns + 20000000LL : end_ns;
            struct timespec until = {.tv_sec = wake / 1000000000LL, .tv_nsec = wake % 1000000000LL};
            pthread_cond_timedwait(&events_cv, &mu, &until);
            refresh();
            if (!find_set(set)) {
                r = NVML_ERROR_INVALID_ARGUMENT; /* freed meanwhile */
                break;
            }
        }
    }
    if (r != NVML_SUCCESS && r != NVML_ERROR_TIMEOUT) {
        wait_errors++;
    }
    if (r != NVML_ERROR_TIMEOUT) {
        write_status();
    }
    END();
}

EXPORT nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set) {
    BEGIN("nvmlEventSetFree");
    if (r == NVML_SUCCESS) {
        struct event_set **p = &sets;
        while (*p && (nvmlEventSet_t)*p != set) {
            p = &(*p)->next;
        }
        if (!*p) {
            r = NVML_ERROR_INVALID_ARGUMENT;
        } else {
            struct event_set *s = *p;
            *p = s->next;
            s->magic = 0;
            free(s);
        }
    }
    write_status();
    END();
}

/* ---- processes ------------------------------------------------------------------------------ */

#define MAX_PROCS 64

/* Parses `pid bytes [compute|mps|both]`; 1 if it is listed by the compute (mps = 0) or MPS list. */
static int parse_proc(const char *v, int mps, nvmlProcessInfo_t *out) {
    unsigned int pid = 0;
    char mem[32] = "", kind[16] = "compute";
    if (!v || sscanf(v, "%u %31s %15s", &pid, mem, kind) < 2) {
        return 0;
    }
    int listed = strcmp(kind, "both") == 0 || strcmp(kind, mps ? "mps" : "compute") == 0;
    if (!listed) {
        return 0;
    }
    long long bytes;
    out->pid = pid;
    out->usedGpuMemory = strcmp(mem, "na") == 0 ? NVML_VALUE_NOT_AVAILABLE_ULL
                         : parse_ll(mem, &bytes) ? (unsigned long long)bytes
                                                 : NVML_VALUE_NOT_AVAILABLE_ULL;
    out->gpuInstanceId = 0xFFFFFFFFu;
    out->computeInstanceId = 0xFFFFFFFFu;
    return 1;
}

/* Appends slot S's (or, with slot < 0, the GPU's own) processes of one list to out[*n]. */
static void collect_procs(int gpu, int slot, int mps, nvmlProcessInfo_t *out, size_t *n) {
    for (int k = 0; k < MAX_PROCS && *n < MAX_PROCS; k++) {
        const char *v = slot < 0 ? cfg("gpu.%d.proc.%d", gpu, k) : cfg("gpu.%d.mig.%d.proc.%d", gpu, slot, k);
        nvmlProcessInfo_t p;
        if (!parse_proc(v, mps, &p)) {
            continue;
        }
        if (slot >= 0) {
            p.gpuInstanceId = (unsigned int)cfg_int_or(0, "gpu.%d.mig.%d.gi", gpu, slot);
            p.computeInstanceId = (unsigned int)cfg_int_or(0, "gpu.%d.mig.%d.ci", gpu, slot);
        }
        out[(*n)++] = p;
    }
}

/* Whether this fill call of `sym` loses a scripted race (race.<sym>). */
static int race_lost(const char *sym) {
    for (size_t i = 0; i < sizeof races / sizeof races[0]; i++) {
        struct race *rc = &races[i];
        if (strcmp(rc->sym, sym) != 0) {
            continue;
        }
        const char *v = cfg("race.%s", sym);
        if (v && strcmp(v, rc->seen) != 0) {
            snprintf(rc->seen, sizeof rc->seen, "%s", v);
            rc->left = strtoll(v, NULL, 0);
        }
        if (rc->left > 0) {
            rc->left--;
            return 1;
        }
    }
    return 0;
}

/*
 * nvml.h: "call this function with *infoCount = 0. The return code will be
 * NVML_ERROR_INSUFFICIENT_SIZE, or NVML_SUCCESS if none are running", then with a buffer of
 * *infoCount entries; on a smaller buffer INSUFFICIENT_SIZE with the size needed. In MIG mode
 * the physical handle answers the aggregate only to privileged callers; MIG device handles
 * answer their own instance's processes.
 */
static nvmlReturn_t process_list(const char *sym, nvmlDevice_t device, unsigned int *infoCount,
                                 nvmlProcessInfo_t *infos, int mps) {
    struct handle *h = NULL;
    nvmlReturn_t r = resolve(device, sym, 1, &h);
    if (r == NVML_SUCCESS && !infoCount) {
        r = NVML_ERROR_INVALID_ARGUMENT;
    }
    if (r != NVML_SUCCESS) {
        return r;
    }
    nvmlProcessInfo_t found[MAX_PROCS];
    size_t n = 0;
    if (h->slot >= 0) {
        collect_procs(h->gpu, h->slot, mps, found, &n);
    } else if (cfg_int_or(0, "gpu.%d.mig", h->gpu)) {
        if (!cfg_int_or(0, "gpu.%d.mig.aggregate_procs", h->gpu)) {
            return NVML_ERROR_NO_PERMISSION;
        }
        long long slots = cfg_int_or(0, "gpu.%d.mig.slots", h->gpu);
        for (int sl = 0; sl < slots && sl < MAX_SLOTS; sl++) {
            if (slot_used(h->gpu, sl)) {
                collect_procs(h->gpu, sl, mps, found, &n);
            }
        }
    } else {
        collect_procs(h->gpu, -1, mps, found, &n);
    }
    if (infos && race_lost(sym)) {
        *infoCount = (unsigned int)n + 6;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    if (*infoCount < n) {
        *infoCount = (unsigned int)n;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    if (n > 0 && !infos) {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    if (n > 0) {
        memcpy(infos, found, n * sizeof found[0]);
    }
    *infoCount = (unsigned int)n;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *infoCount,
                                                            nvmlProcessInfo_t *infos) {
    BEGIN("nvmlDeviceGetComputeRunningProcesses_v3");
    if (r == NVML_SUCCESS) {
        r = process_list(SYM, device, infoCount, infos, 0);
    }
    write_status();
    END();
}

EXPORT nvmlReturn_t nvmlDeviceGetMPSComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *infoCount,
                                                               nvmlProcessInfo_t *infos) {
    BEGIN("nvmlDeviceGetMPSComputeRunningProcesses_v3");
    if (r == NVML_SUCCESS) {
        r = process_list(SYM, device, infoCount, infos, 1);
    }
    write_status();
    END();
}

#define MAX_SAMPLES 2048

/* Parses `pid [timestamp] sm mem enc dec` into *out (with_ts: the timestamp is given). */
static int parse_sample(const char *v, int with_ts, nvmlProcessUtilizationSample_t *out) {
    unsigned long long ts = 0;
    int got = with_ts ? sscanf(v, "%u %llu %u %u %u %u", &out->pid, &ts, &out->smUtil, &out->memUtil,
                               &out->encUtil, &out->decUtil)
                      : sscanf(v, "%u %u %u %u %u", &out->pid, &out->smUtil, &out->memUtil,
                               &out->encUtil, &out->decUtil);
    out->timeStamp = ts;
    return got == (with_ts ? 6 : 5);
}

/* The samples the "driver" holds for GPU `gpu` now, newer than `last_seen` unless the GPU is
 * scripted to ignore it, oldest first. */
static size_t utilization_samples(int gpu, unsigned long long last_seen, nvmlProcessUtilizationSample_t *out) {
    int unfiltered = cfg_int_or(0, "gpu.%d.putil_unfiltered", gpu) != 0;
    long long period = cfg_int_or(100000, "gpu.%d.putil_period_us", gpu);
    long long depth = cfg_int_or(20, "gpu.%d.putil_depth", gpu);
    if (period <= 0) {
        period = 100000;
    }
    size_t n = 0;
    for (int k = 0; k < MAX_PROCS && n < MAX_SAMPLES; k++) {
        nvmlProcessUtilizationSample_t s;
        const char *v = cfg("gpu.%d.putil_old.%d", gpu, k);
        if (v && parse_sample(v, 1, &s) && (unfiltered || s.timeStamp > last_seen)) {
            out[n++] = s;
        }
    }
    long long now = now_us();
    long long newest = now - now % period;
    for (long long d = depth - 1; d >= 0; d--) {
        unsigned long long ts = (unsigned long long)(newest - d * period);
        if (!unfiltered && ts <= last_seen) {
            continue;
        }
        for (int k = 0; k < MAX_PROCS && n < MAX_SAMPLES; k++) {
            nvmlProcessUtilizationSample_t s;
            const char *v = cfg("gpu.%d.putil.%d", gpu, k);
            if (!v || !parse_sample(v, 0, &s) || (s.smUtil | s.memUtil | s.encUtil | s.decUtil) == 0) {
                continue;
            }
            s.timeStamp = ts;
            out[n++] = s;
        }
    }
    return n;
}

/*
 * nvml.h: "first determine the size of buffer required to hold the samples by invoking the
 * function with utilization set to NULL"; "If no valid sample entries are found since the
 * lastSeenTimeStamp, NVML_ERROR_NOT_FOUND is returned"; "On MIG-enabled GPUs, querying process
 * utilization is not currently supported." The buffer moves on between the two calls, so a fill
 * call can need more room than the count call said (INSUFFICIENT_SIZE with the size needed).
 */
EXPORT nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t device,
                                                    nvmlProcessUtilizationSample_t *utilization,
                                                    unsigned int *processSamplesCount,
                                                    unsigned long long lastSeenTimeStamp) {
    BEGIN("nvmlDeviceGetProcessUtilization");
    struct handle *h = NULL;
    if (r == NVML_SUCCESS) {
        r = resolve(device, SYM, 0, &h);
    }
    if (r == NVML_SUCCESS && !processSamplesCount) {
        r = NVML_ERROR_INVALID_ARGUMENT;
    }
    if (r == NVML_SUCCESS && cfg_int_or(0, "gpu.%d.mig", h->gpu)) {
        r = NVML_ERROR_NOT_SUPPORTED;
    }
    if (r == NVML_SUCCESS) {
        static nvmlProcessUtilizationSample_t found[MAX_SAMPLES];
        size_t n = utilization_samples(h->gpu, lastSeenTimeStamp, found);
        if (utilization) {
            putil_asked[h->gpu] = 1;
            putil_last_seen[h->gpu] = lastSeenTimeStamp;
        }
        if (n == 0) {
            r = NVML_ERROR_NOT_FOUND;
        } else if (!utilization || *processSamplesCount < n) {
            *processSamplesCount = (unsigned int)n;
            r = NVML_ERROR_INSUFFICIENT_SIZE;
        } else {
            memcpy(utilization, found, n * sizeof found[0]);
            *processSamplesCount = (unsigned int)n;
            putil_returned[h->gpu] += n;
        }
    }
    write_status();
    END();
}
