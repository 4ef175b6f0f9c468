/*
 * A stand-in for DCGM's client library, libdcgm.so.4, for tests without a GPU or a hostengine.
 *
 * It exports the entry points gpu-exporter's DCGM source calls, with the signatures, struct
 * layouts, struct versions (MAKE_DCGM_VERSION: sizeof | version << 24), return codes and blank
 * sentinels of DCGM 4.x's public headers (dcgm_agent.h, dcgm_structs.h, dcgm_fields.h). The
 * declarations below are written from those headers' documented layouts; nothing is included
 * from DCGM.
 *
 * The "hostengine" is a key = value file named by DCGM_STANDIN_CONFIG, re-read on every call. It
 * plays a remote hostengine (dcgmConnect_v2) and the embedded one (dcgmStartEmbedded_v2 /
 * dcgmStartEmbedded: no connect; its handle reads the same GPUs, groups and values, and ignores
 * `hostengine` and `epoch`: it runs in the caller's process, so it cannot go away by itself):
 *   hostengine = up | down          down: dcgmConnect_v2 and every call on a handle fail with
 *                                   DCGM_ST_CONNECTION_NOT_VALID (a hostengine that went away)
 *   epoch = N                       the hostengine's incarnation (default 0): when it changes, the
 *                                   hostengine restarted: handles of the old one are no longer
 *                                   valid and its groups, field groups and watches are gone
 *   gpus = N                        GPU ids 0..N-1 (dcgmGetAllDevices)
 *   uuid.<gpuId> = GPU-...          the GPU's UUID (dcgmGetDeviceAttributes, the MIG hierarchy)
 *   mig.<n> = <gpuId> <entityId> <gpuInstanceId>   the n-th GPU instance entity (n = 0, 1, ...
 *                                   without gaps): DCGM entity id, parent GPU, NVML GI id
 *   metricgroup.<n> = <major> <minor> <fieldId>...  the n-th profiling metric group
 *                                   (dcgmProfGetSupportedMetricGroups); fields of groups with the
 *                                   same major and different minors cannot be watched together
 *                                   (dcgmWatchFields: DCGM_ST_PROFILING_MULTI_PASS), profiling
 *                                   fields (1001-1099) in no group are not supported
 *                                   (DCGM_ST_PROFILING_NOT_SUPPORTED)
 *   profiling.<gpuId> = 0           the GPU has no profiling (DCGM_ST_PROFILING_NOT_SUPPORTED)
 *   refusewatch.<fieldId> = <code>  dcgmWatchFields of a field group holding the field returns
 *                                   the code
 *   value.<entityGroup>.<entityId>.<fieldId> = x    a double; absent: DCGM_FP64_BLANK with
 *                                   status DCGM_ST_NO_DATA. Only watched (entity, field) pairs
 *                                   read: the others are DCGM_ST_NOT_WATCHED
 *   refuse.<fieldId> = 1            the field reads DCGM_FP64_NOT_SUPPORTED, status
 *                                   DCGM_ST_NOT_SUPPORTED
 *   skip.<entityGroup>.<entityId> = 1   dcgmEntitiesGetLatestValues leaves the entries of that
 *                                   entity untouched (a library that does not fill every entry)
 * Faults:
 *   fail.<call> = <code>            the named entry point (e.g. dcgmGroupCreate,
 *                                   dcgmFieldGroupCreate, dcgmWatchFields, dcgmConnect_v2,
 *                                   dcgmInit, dcgmStartEmbedded_v2) returns the code without
 *                                   doing anything
 *   delay.<call> = <ms>             the named entry point sleeps that long first, whatever its
 *                                   timeout says (a slow hostengine, a library that ignores its
 *                                   connect timeout)
 * The hostengine's tables hold 64 entity groups, 64 field groups and 64 watches (a full table:
 * DCGM_ST_MAX_LIMIT), and an entity group at most 64 entities (DCGM_GROUP_MAX_ENTITIES).
 * Calls are counted in the file named by DCGM_STANDIN_STATUS (key = count), when set, beside
 * `live.groups` and `live.field_groups`: the entity and field groups the hostengine holds now,
 * `embedded.running` (1 while the embedded hostengine runs), `embedded.log_stdout` (1 when it was
 * started logging to stdout, "-") and `embedded.severity` (its log severity, when it logs).
 */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define API __attribute__((visibility("default")))

typedef int dcgmReturn_t;
typedef uintptr_t dcgmHandle_t;
typedef unsigned int dcgm_field_eid_t;
typedef int dcgm_field_entity_group_t; /* an enum in dcgm_fields.h */

enum {
    DCGM_ST_OK = 0,
    DCGM_ST_BADPARAM = -1,
    DCGM_ST_VER_MISMATCH = -12,
    DCGM_ST_NO_DATA = -14,
    DCGM_ST_NOT_SUPPORTED = -6,
    DCGM_ST_CONNECTION_NOT_VALID = -21,
    DCGM_ST_UNINITIALIZED = -10,
    DCGM_ST_NOT_WATCHED = -16,
    DCGM_ST_DUPLICATE_KEY = -26,
    DCGM_ST_MAX_LIMIT = -24,
    DCGM_ST_PROFILING_NOT_SUPPORTED = -36,
    DCGM_ST_PROFILING_MULTI_PASS = -38,
};

enum { DCGM_FE_GPU = 1, DCGM_FE_GPU_I = 4 };
enum { DCGM_GROUP_DEFAULT = 0, DCGM_GROUP_EMPTY = 1 };
typedef uintptr_t dcgmGpuGrp_t;
typedef uintptr_t dcgmFieldGrp_t;

#define DCGM_MAX_NUM_DEVICES 32
#define DCGM_MAX_STR_LENGTH 256
#define DCGM_MAX_BLOB_LENGTH 4096
#define DCGM_FT_DOUBLE 'd'
#define DCGM_FP64_BLANK 140737488355328.0
#define DCGM_FP64_NOT_SUPPORTED (DCGM_FP64_BLANK + 2.0)
#define MAKE_DCGM_VERSION(type, ver) ((unsigned int)(sizeof(type) | ((unsigned long)(ver) << 24U)))

typedef struct {
    unsigned int version;
    unsigned int persistAfterDisconnect;
    unsigned int timeoutMs;
    unsigned int addressIsUnixSocket;
} dcgmConnectV2Params_v2;
#define dcgmConnectV2Params_version2 MAKE_DCGM_VERSION(dcgmConnectV2Params_v2, 2)

typedef struct {
    dcgm_field_entity_group_t entityGroupId;
    dcgm_field_eid_t entityId;
} dcgmGroupEntityPair_t;

typedef struct {
    unsigned int version;
    dcgm_field_entity_group_t entityGroupId;
    dcgm_field_eid_t entityId;
    unsigned short fieldId;
    unsigned short fieldType;
    int status;
    unsigned int unused;
    int64_t ts;
    union {
        int64_t i64;
        double dbl;
        char str[DCGM_MAX_STR_LENGTH];
        char blob[DCGM_MAX_BLOB_LENGTH];
    } value;
} dcgmFieldValue_v2;
#define dcgmFieldValue_version2 MAKE_DCGM_VERSION(dcgmFieldValue_v2, 2)

#define DCGM_PROF_MAX_NUM_GROUPS_V2 10
#define DCGM_PROF_MAX_FIELD_IDS_PER_GROUP_V2 64
typedef struct {
    unsigned short majorId;
    unsigned short minorId;
    unsigned int numFieldIds;
    unsigned short fieldIds[DCGM_PROF_MAX_FIELD_IDS_PER_GROUP_V2];
} dcgmProfMetricGroupInfo_v2;

typedef struct {
    unsigned int version;
    unsigned int unused;
    unsigned int gpuId;
    unsigned int numMetricGroups;
    dcgmProfMetricGroupInfo_v2 metricGroups[DCGM_PROF_MAX_NUM_GROUPS_V2];
} dcgmProfGetMetricGroups_v3;
#define dcgmProfGetMetricGroups_version3 MAKE_DCGM_VERSION(dcgmProfGetMetricGroups_v3, 3)

typedef struct {
    char gpuUuid[128];
    unsigned int nvmlGpuIndex;
    unsigned int nvmlInstanceId;
    unsigned int nvmlComputeInstanceId;
    unsigned int nvmlMigProfileId;
    unsigned int nvmlProfileSlices;
} dcgmMigEntityInfo_t;

typedef struct {
    dcgmGroupEntityPair_t entity;
    dcgmGroupEntityPair_t parent;
    dcgmMigEntityInfo_t info;
} dcgmMigHierarchyInfo_v2;

#define DCGM_MAX_TOTAL_INSTANCES_PER_GPU 14
#define DCGM_MAX_HIERARCHY_INFO (DCGM_MAX_NUM_DEVICES * DCGM_MAX_TOTAL_INSTANCES_PER_GPU)
typedef struct {
    unsigned int version;
    unsigned int count;
    dcgmMigHierarchyInfo_v2 entityList[DCGM_MAX_HIERARCHY_INFO];
} dcgmMigHierarchy_v2;
#define dcgmMigHierarchy_version2 MAKE_DCGM_VERSION(dcgmMigHierarchy_v2, 2)

#define DCGM_MAX_CLOCKS 256
typedef struct {
    int version;
    unsigned int memClock;
    unsigned int smClock;
} dcgmClockSet_v1;
typedef struct {
    unsigned int version;
    unsigned int count;
    dcgmClockSet_v1 clockSet[DCGM_MAX_CLOCKS];
} dcgmDeviceSupportedClockSets_v1;
typedef struct {
    unsigned int version;
    unsigned int slowdownTemp;
    unsigned int shutdownTemp;
} dcgmDeviceThermals_v1;
typedef struct {
    unsigned int version;
    unsigned int curPowerLimit;
    unsigned int defaultPowerLimit;
    unsigned int enforcedPowerLimit;
    unsigned int minPowerLimit;
    unsigned int maxPowerLimit;
} dcgmDevicePowerLimits_v1;
typedef struct {
    unsigned int version;
    char brandName[DCGM_MAX_STR_LENGTH];
    char deviceName[DCGM_MAX_STR_LENGTH];
    char pciBusId[DCGM_MAX_STR_LENGTH];
    char serial[DCGM_MAX_STR_LENGTH];
    char uuid[DCGM_MAX_STR_LENGTH];
    char vbios[DCGM_MAX_STR_LENGTH];
    char inforomImageVersion[DCGM_MAX_STR_LENGTH];
    unsigned int pciDeviceId;
    unsigned int pciSubSystemId;
    char driverVersion[DCGM_MAX_STR_LENGTH];
    unsigned int virtualizationMode;
} dcgmDeviceIdentifiers_v1;
typedef struct {
    unsigned int version;
    unsigned int bar1Total;
    unsigned int fbTotal;
    unsigned int fbUsed;
    unsigned int fbFree;
} dcgmDeviceMemoryUsage_v1;
typedef struct {
    unsigned int version;
    unsigned int persistenceModeEnabled;
    unsigned int migModeEnabled;
    unsigned int confidentialComputeMode;
} dcgmDeviceSettings_v2;
typedef struct {
    unsigned int version;
    dcgmDeviceSupportedClockSets_v1 clockSets;
    dcgmDeviceThermals_v1 thermalSettings;
    dcgmDevicePowerLimits_v1 powerLimits;
    dcgmDeviceIdentifiers_v1 identifiers;
    dcgmDeviceMemoryUsage_v1 memoryUsage;
    dcgmDeviceSettings_v2 settings;
} dcgmDeviceAttributes_v3;
#define dcgmDeviceAttributes_version3 MAKE_DCGM_VERSION(dcgmDeviceAttributes_v3, 3)

_Static_assert(sizeof(dcgmFieldValue_v2) == 4128, "dcgmFieldValue_v2 layout");
_Static_assert(sizeof(dcgmProfGetMetricGroups_v3) == 1376, "dcgmProfGetMetricGroups_v3 layout");
_Static_assert(sizeof(dcgmMigHierarchy_v2) == 8 + 164 * 448, "dcgmMigHierarchy_v2 layout");
_Static_assert(sizeof(dcgmDeviceAttributes_v3) == 5220, "dcgmDeviceAttributes_v3 layout");
_Static_assert(sizeof(dcgmConnectV2Params_v2) == 16, "dcgmConnectV2Params_v2 layout");

/* dcgmStartEmbeddedV2Params_v1/_v2/_v3 (the same members up to the handle; v2 adds a service
 * account, v3 a longer deny list: DCGM_MODULE_ID_COUNT_V1 10, _V2 16). */
enum { DCGM_OPERATION_MODE_AUTO = 1, DCGM_OPERATION_MODE_MANUAL = 2 };
typedef struct {
    unsigned int version;
    int opMode;
    dcgmHandle_t dcgmHandle;
    const char *logFile;
    int severity;
    unsigned int denyListCount;
    unsigned int denyList[10];
} dcgmStartEmbeddedV2Params_v1;
typedef struct {
    unsigned int version;
    int opMode;
    dcgmHandle_t dcgmHandle;
    const char *logFile;
    int severity;
    unsigned int denyListCount;
    const char *serviceAccount;
    unsigned int denyList[10];
} dcgmStartEmbeddedV2Params_v2;
typedef struct {
    unsigned int version;
    int opMode;
    dcgmHandle_t dcgmHandle;
    const char *logFile;
    int severity;
    unsigned int denyListCount;
    const char *serviceAccount;
    unsigned int denyList[16];
} dcgmStartEmbeddedV2Params_v3;
#define dcgmStartEmbeddedV2Params_version1 MAKE_DCGM_VERSION(dcgmStartEmbeddedV2Params_v1, 1)
#define dcgmStartEmbeddedV2Params_version2 MAKE_DCGM_VERSION(dcgmStartEmbeddedV2Params_v2, 2)
#define dcgmStartEmbeddedV2Params_version3 MAKE_DCGM_VERSION(dcgmStartEmbeddedV2Params_v3, 3)
_Static_assert(sizeof(dcgmStartEmbeddedV2Params_v1) == 72, "dcgmStartEmbeddedV2Params_v1 layout");
_Static_assert(sizeof(dcgmStartEmbeddedV2Params_v2) == 80, "dcgmStartEmbeddedV2Params_v2 layout");
_Static_assert(sizeof(dcgmStartEmbeddedV2Params_v3) == 104, "dcgmStartEmbeddedV2Params_v3 layout");

static int initialised;
static dcgmHandle_t next_handle = 1;
/* The handle of the embedded hostengine while it runs, else 0. */
static dcgmHandle_t embedded_handle;

/* The configured value of `key`, or NULL; `buf` holds it. */
static const char *config(const char *key, char *buf, size_t len) {
    const char *path = getenv("DCGM_STANDIN_CONFIG");
    if (!path) return NULL;
    FILE *f = fopen(path, "r");
    if (!f) return NULL;
    char line[512];
    const char *found = NULL;
    size_t klen = strlen(key);
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, key, klen) != 0) continue;
        const char *p = line + klen;
        while (*p == ' ') p++;
        if (*p != '=') continue;
        p++;
        while (*p == ' ') p++;
        snprintf(buf, len, "%s", p);
        buf[strcspn(buf, "\r\n")] = 0;
        found = buf;
    }
    fclose(f);
    return found;
}

/* Sets `key` in the status file to `value`, or adds 1 to it when `add`. */
static void status_put(const char *key, long value, int add) {
    const char *path = getenv("DCGM_STANDIN_STATUS");
    if (!path) return;
    long n = 0;
    FILE *f = fopen(path, "r");
    char lines[64][96];
    int nlines = 0;
    if (f) {
        char line[96];
        size_t k = strlen(key);
        while (nlines < 64 && fgets(line, sizeof line, f)) {
            if (strncmp(line, key, k) == 0 && line[k] == ' ') {
                n = strtol(line + k + 3, NULL, 10);
                continue;
            }
            snprintf(lines[nlines++], sizeof lines[0], "%s", line);
        }
        fclose(f);
    }
    /* Written whole to a temporary file and renamed over the old one: a reader never sees
     * half of it. */
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    f = fopen(tmp, "w");
    if (!f) return;
    for (int i = 0; i < nlines; i++) fputs(lines[i], f);
    fprintf(f, "%s = %ld\n", key, add ? n + value : value);
    fclose(f);
    rename(tmp, path);
}

static void count(const char *call) { status_put(call, 1, 1); }

static int hostengine_up(void) {
    char buf[32];
    const char *v = config("hostengine", buf, sizeof buf);
    return !v || strcmp(v, "down") != 0;
}

static long config_long(const char *key, long fallback) {
    char buf[64];
    const char *v = config(key, buf, sizeof buf);
    return v ? strtol(v, NULL, 10) : fallback;
}

/* The fault configured for `call`: `delay.<call>` sleeps first; returns `fail.<call>`'s code, or
 * DCGM_ST_OK. */
static dcgmReturn_t fault(const char *call) {
    char key[96];
    snprintf(key, sizeof key, "delay.%s", call);
    long ms = config_long(key, 0);
    if (ms > 0) {
        struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
        while (nanosleep(&ts, &ts) != 0) {
        }
    }
    snprintf(key, sizeof key, "fail.%s", call);
    return (dcgmReturn_t)config_long(key, 0);
}

#define FAULT(call)                                                                                \
    do {                                                                                           \
        count(call);                                                                               \
        dcgmReturn_t injected = fault(call);                                                       \
        if (injected != DCGM_ST_OK) return injected;                                               \
    } while (0)

#define DCGM_GROUP_MAX_ENTITIES 64

/* The hostengine's state: what its clients created, for the current epoch. */
#define MAX_OBJECTS 64
#define MAX_MEMBERS 128
struct group {
    dcgmGpuGrp_t id;
    int n;
    dcgmGroupEntityPair_t members[MAX_MEMBERS];
};
struct field_group {
    dcgmFieldGrp_t id;
    char name[64];
    int n;
    unsigned short fields[MAX_MEMBERS];
};
struct watch {
    dcgmGpuGrp_t group;
    dcgmFieldGrp_t field_group;
};
static struct {
    long epoch;
    uintptr_t next_id;
    struct group groups[MAX_OBJECTS];
    struct field_group field_groups[MAX_OBJECTS];
    struct watch watches[MAX_OBJECTS];
    dcgmHandle_t handles[MAX_OBJECTS];
    long handle_epoch[MAX_OBJECTS];
} he = {.epoch = -1, .next_id = 1};

/* Writes how many entity and field groups the hostengine holds to the status file. */
static void publish_live(void) {
    long groups = 0, field_groups = 0;
    for (int i = 0; i < MAX_OBJECTS; i++) {
        groups += he.groups[i].id != 0;
        field_groups += he.field_groups[i].id != 0;
    }
    status_put("live.groups", groups, 0);
    status_put("live.field_groups", field_groups, 0);
}

/* Starts a new hostengine incarnation when the configured epoch changed. */
static void sync_epoch(void) {
    long epoch = config_long("epoch", 0);
    if (epoch == he.epoch) return;
    memset(he.groups, 0, sizeof he.groups);
    memset(he.field_groups, 0, sizeof he.field_groups);
    memset(he.watches, 0, sizeof he.watches);
    he.epoch = epoch;
    publish_live();
}

/* Whether a call on `handle` reaches a live hostengine: DCGM_ST_OK or why not. */
static dcgmReturn_t live(dcgmHandle_t handle) {
    if (!handle) return DCGM_ST_BADPARAM;
    if (handle == embedded_handle) {
        if (he.epoch < 0) sync_epoch();
        return DCGM_ST_OK;
    }
    if (!hostengine_up()) return DCGM_ST_CONNECTION_NOT_VALID;
    sync_epoch();
    for (int i = 0; i < MAX_OBJECTS; i++)
        if (he.handles[i] == handle) return he.handle_epoch[i] == he.epoch ? DCGM_ST_OK : DCGM_ST_CONNECTION_NOT_VALID;
    return DCGM_ST_CONNECTION_NOT_VALID;
}

static struct group *find_group(dcgmGpuGrp_t id) {
    for (int i = 0; i < MAX_OBJECTS; i++)
        if (id && he.groups[i].id == id) return &he.groups[i];
    return NULL;
}

static struct field_group *find_field_group(dcgmFieldGrp_t id) {
    for (int i = 0; i < MAX_OBJECTS; i++)
        if (id && he.field_groups[i].id == id) return &he.field_groups[i];
    return NULL;
}

/* The GPU instance entity `n` of the configuration: 1 when it exists. */
static int mig_entry(int n, unsigned int *gpu, unsigned int *entity, unsigned int *gi) {
    char key[32];
    char buf[64];
    snprintf(key, sizeof key, "mig.%d", n);
    const char *v = config(key, buf, sizeof buf);
    return v && sscanf(v, "%u %u %u", gpu, entity, gi) == 3;
}

static int entity_exists(dcgmGroupEntityPair_t e) {
    if (e.entityGroupId == DCGM_FE_GPU) return e.entityId < (unsigned int)config_long("gpus", 0);
    if (e.entityGroupId != DCGM_FE_GPU_I) return 0;
    unsigned int gpu, entity, gi;
    for (int n = 0; mig_entry(n, &gpu, &entity, &gi); n++)
        if (entity == e.entityId) return 1;
    return 0;
}

static void gpu_uuid(unsigned int gpu, char *out, size_t len) {
    char key[32];
    char buf[128];
    snprintf(key, sizeof key, "uuid.%u", gpu);
    const char *v = config(key, buf, sizeof buf);
    if (v)
        snprintf(out, len, "%s", v);
    else
        snprintf(out, len, "GPU-standin-%u", gpu);
}

/* Metric group `n` of the configuration: 1 when it exists. */
static int metric_group(int n, dcgmProfMetricGroupInfo_v2 *g) {
    char key[32];
    char buf[512];
    snprintf(key, sizeof key, "metricgroup.%d", n);
    const char *v = config(key, buf, sizeof buf);
    if (!v) return 0;
    memset(g, 0, sizeof *g);
    char *end;
    g->majorId = (unsigned short)strtoul(v, &end, 10);
    g->minorId = (unsigned short)strtoul(end, &end, 10);
    for (;;) {
        char *next;
        unsigned long f = strtoul(end, &next, 10);
        if (next == end || g->numFieldIds >= DCGM_PROF_MAX_FIELD_IDS_PER_GROUP_V2) break;
        g->fieldIds[g->numFieldIds++] = (unsigned short)f;
        end = next;
    }
    return 1;
}

/* The metric group holding profiling field `f`, or -1. */
static int group_of(unsigned short f, dcgmProfMetricGroupInfo_v2 *out) {
    dcgmProfMetricGroupInfo_v2 g;
    for (int n = 0; n < DCGM_PROF_MAX_NUM_GROUPS_V2 && metric_group(n, &g); n++)
        for (unsigned int i = 0; i < g.numFieldIds; i++)
            if (g.fieldIds[i] == f) {
                *out = g;
                return n;
            }
    return -1;
}

static int is_profiling(unsigned short f) { return f >= 1001 && f <= 1099; }

API dcgmReturn_t dcgmInit(void) {
    FAULT("dcgmInit");
    initialised = 1;
    return DCGM_ST_OK;
}

API dcgmReturn_t dcgmShutdown(void) {
    FAULT("dcgmShutdown");
    initialised = 0;
    return DCGM_ST_OK;
}

API dcgmReturn_t dcgmConnect_v2(const char *ipAddress, dcgmConnectV2Params_v2 *params,
                                dcgmHandle_t *handle) {
    FAULT("dcgmConnect_v2");
    if (!initialised) return DCGM_ST_UNINITIALIZED;
    if (!ipAddress || !params || !handle) return DCGM_ST_BADPARAM;
    if (params->version != dcgmConnectV2Params_version2) return DCGM_ST_VER_MISMATCH;
    if (!hostengine_up()) return DCGM_ST_CONNECTION_NOT_VALID;
    sync_epoch();
    for (int i = 0; i < MAX_OBJECTS; i++) {
        if (he.handles[i] && he.handle_epoch[i] == he.epoch) continue;
        *handle = next_handle++;
        he.handles[i] = *handle;
        he.handle_epoch[i] = he.epoch;
        return DCGM_ST_OK;
    }
    return DCGM_ST_MAX_LIMIT;
}

/* Starts the embedded hostengine: one per process, as DCGM. */
static dcgmReturn_t start_embedded(int opMode, dcgmHandle_t *handle) {
    if (!initialised) return DCGM_ST_UNINITIALIZED;
    if (!handle || (opMode != DCGM_OPERATION_MODE_AUTO && opMode != DCGM_OPERATION_MODE_MANUAL))
        return DCGM_ST_BADPARAM;
    if (embedded_handle) return DCGM_ST_DUPLICATE_KEY;
    embedded_handle = next_handle++;
    *handle = embedded_handle;
    status_put("embedded.running", 1, 0);
    return DCGM_ST_OK;
}

API dcgmReturn_t dcgmStartEmbedded_v2(dcgmStartEmbeddedV2Params_v1 *params) {
    FAULT("dcgmStartEmbedded_v2");
    if (!params) return DCGM_ST_BADPARAM;
    if (params->version != dcgmStartEmbeddedV2Params_version1 &&
        params->version != dcgmStartEmbeddedV2Params_version2 &&
        params->version != dcgmStartEmbeddedV2Params_version3)
        return DCGM_ST_VER_MISMATCH;
    /* Where and how much the embedded hostengine would log: `embedded.log_stdout` (1: "-"),
     * `embedded.severity` (DcgmLoggingSeverity_t, when it logs). */
    int to_stdout = params->logFile && strcmp(params->logFile, "-") == 0;
    dcgmReturn_t st = start_embedded(params->opMode, &params->dcgmHandle);
    if (st == DCGM_ST_OK) {
        status_put("embedded.log_stdout", to_stdout, 0);
        if (params->logFile) status_put("embedded.severity", params->severity, 0);
    }
    return st;
}

API dcgmReturn_t dcgmStartEmbedded(int opMode, dcgmHandle_t *handle) {
    FAULT("dcgmStartEmbedded");
    return start_embedded(opMode, handle);
}

API dcgmReturn_t dcgmStopEmbedded(dcgmHandle_t handle) {
    FAULT("dcgmStopEmbedded");
    if (!initialised) return DCGM_ST_UNINITIALIZED;
    if (!handle || handle != embedded_handle) return DCGM_ST_BADPARAM;
    embedded_handle = 0;
    /* The in-process hostengine's groups and watches go with it. */
    memset(he.groups, 0, sizeof he.groups);
    memset(he.field_groups, 0, sizeof he.field_groups);
    memset(he.watches, 0, sizeof he.watches);
    publish_live();
    status_put("embedded.running", 0, 0);
    return DCGM_ST_OK;
}

API dcgmReturn_t dcgmDisconnect(dcgmHandle_t handle) {
    FAULT("dcgmDisconnect");
    if (!handle) return DCGM_ST_BADPARAM;
    for (int i = 0; i < MAX_OBJECTS; i++)
        if (he.handles[i] == handle) he.handles[i] = 0;
    return DCGM_ST_OK;
}

API dcgmReturn_t dcgmGetAllDevices(dcgmHandle_t handle, unsigned int gpuIdList[DCGM_MAX_NUM_DEVICES],
                                   int *count_out) {
    FAULT("dcgmGetAllDevices");
    if (!gpuIdList || !count_out) return DCGM_ST_BADPARAM;
    dcgmReturn_t st = live(handle);
    if (st != DCGM_ST_OK) return st;
    char buf[32];
    const char *v = config("gpus", buf, sizeof buf);
    int n = v ? atoi(v) : 0;
    if (n > DCGM_MAX_NUM_DEVICES) n = DCGM_MAX_NUM_DEVICES;
    for (int i = 0; i < n; i++) gpuIdList[i] = (unsigned int)i;
    *count_out = n;
    return DCGM_ST_OK;
}

/* Whether a watch covers `field` of `entity`. */
static int watched(dcgmGroupEntityPair_t entity, unsigned short field) {
    for (int w = 0; w < MAX_OBJECTS; w++) {
        struct group *g = find_group(he.watches[w].group);
        struct field_group *fg = find_field_group(he.watches[w].field_group);
        if (!g || !fg) continue;
        int has_entity = 0, has_field = 0;
        for (int i = 0; i < g->n; i++)
            if (g->members[i].entityGroupId == entity.entityGroupId && g->members[i].entityId == entity.entityId)
                has_entity = 1;
        for (int i = 0; i < fg->n; i++)
            if (fg->fields[i] == field) has_field = 1;
        if (has_entity && has_field) return 1;
    }
    return 0;
}

API dcgmReturn_t dcgmEntitiesGetLatestValues(dcgmHandle_t handle, dcgmGroupEntityPair_t entities[],
                                             unsigned int entityCount, unsigned short fields[],
                                             unsigned int fieldCount, unsigned int flags,
                                             dcgmFieldValue_v2 values[]) {
    (void)flags;
    FAULT("dcgmEntitiesGetLatestValues");
    if (!entities || !fields || !values) return DCGM_ST_BADPARAM;
    dcgmReturn_t st = live(handle);
    if (st != DCGM_ST_OK) return st;
    for (unsigned int e = 0; e < entityCount; e++) {
        char skip[64];
        char skipbuf[16];
        snprintf(skip, sizeof skip, "skip.%d.%u", entities[e].entityGroupId, entities[e].entityId);
        if (config(skip, skipbuf, sizeof skipbuf)) continue;
        for (unsigned int f = 0; f < fieldCount; f++) {
            dcgmFieldValue_v2 *out = &values[e * fieldCount + f];
            if (out->version != dcgmFieldValue_version2) return DCGM_ST_VER_MISMATCH;
            memset(&out->entityGroupId, 0, sizeof *out - sizeof out->version);
            out->entityGroupId = entities[e].entityGroupId;
            out->entityId = entities[e].entityId;
            out->fieldId = fields[f];
            out->fieldType = DCGM_FT_DOUBLE;
            out->ts = 1700000000000000LL;
            char key[96];
            char buf[64];
            if (!watched(entities[e], fields[f])) {
                out->status = DCGM_ST_NOT_WATCHED;
                out->value.dbl = DCGM_FP64_BLANK;
                continue;
            }
            snprintf(key, sizeof key, "refuse.%u", fields[f]);
            if (config(key, buf, sizeof buf)) {
                out->status = DCGM_ST_NOT_SUPPORTED;
                out->value.dbl = DCGM_FP64_NOT_SUPPORTED;
                continue;
            }
            snprintf(key, sizeof key, "value.%d.%u.%u", entities[e].entityGroupId, entities[e].entityId,
                     fields[f]);
            const char *v = config(key, buf, sizeof buf);
            if (v) {
                out->status = DCGM_ST_OK;
                out->value.dbl = strtod(v, NULL);
            } else {
                out->status = DCGM_ST_NO_DATA;
                out->value.dbl = DCGM_FP64_BLANK;
            }
        }
    }
    return DCGM_ST_OK;
}

API dcgmReturn_t dcgmGroupCreate(dcgmHandle_t handle, int type, const char *groupName,
                                 dcgmGpuGrp_t *groupId) {
    FAULT("dcgmGroupCreate");
    if (!groupName || !groupId || (type != DCGM_GROUP_EMPTY && type != DCGM_GROUP_DEFAULT))
        return DCGM_ST_BADPARAM;
    dcgmReturn_t st = live(handle);
    if (st != DCGM_ST_OK) return st;
    for (int i = 0; i < MAX_OBJECTS; i++) {
        if (he.groups[i].id) continue;
        memset(&he.groups[i], 0, sizeof he.groups[i]);
        he.groups[i].id = he.next_id++;
        if (type == DCGM_GROUP_DEFAULT) {
            long n = config_long("gpus", 0);
            for (long g = 0; g < n && g < MAX_MEMBERS; g++)
                he.groups[i].members[he.groups[i].n++] = (dcgmGroupEntityPair_t){DCGM_FE_GPU, (unsigned int)g};
        }
        *groupId = he.groups[i].id;
        publish_live();
        return DCGM_ST_OK;
    }
    return DCGM_ST_MAX_LIMIT;
}

API dcgmReturn_t dcgmGroupAddEntity(dcgmHandle_t handle, dcgmGpuGrp_t groupId,
                                    dcgm_field_entity_group_t entityGroupId, dcgm_field_eid_t entityId) {
    FAULT("dcgmGroupAddEntity");
    dcgmReturn_t st = live(handle);
    if (st != DCGM_ST_OK) return st;
    struct group *g = find_group(groupId);
    dcgmGroupEntityPair_t e = {entityGroupId, entityId};
    if (!g || !entity_exists(e)) return DCGM_ST_BADPARAM;
    if (g->n >= DCGM_GROUP_MAX_ENTITIES) return DCGM_ST_MAX_LIMIT;
    g->members[g->n++] = e;
    return DCGM_ST_OK;
}

API dcgmReturn_t dcgmGroupDestroy(dcgmHandle_t handle, dcgmGpuGrp_t groupId) {
    FAULT("dcgmGroupDestroy");
    dcgmReturn_t st = live(handle);
    if (st != DCGM_ST_OK) return st;
    struct group *g = find_group(groupId);
    if (!g) return DCGM_ST_BADPARAM;
    for (int w = 0; w < MAX_OBJECTS; w++)
        if (he.watches[w].group == groupId) memset(&he.watches[w], 0, sizeof he.watches[w]);
    memset(g, 0, sizeof *g);
    publish_live();
    return DCGM_ST_OK;
}

API dcgmReturn_t dcgmFieldGroupCreate(dcgmHandle_t handle, int numFieldIds, const unsigned short *fieldIds,
                                      const char *fieldGroupName, dcgmFieldGrp_t *fieldGroupId) {
    FAULT("dcgmFieldGroupCreate");
    if (numFieldIds <= 0 || numFieldIds > MAX_MEMBERS || !fieldIds || !fieldGroupName || !fieldGroupId)
        return DCGM_ST_BADPARAM;
    dcgmReturn_t st = live(handle);
    if (st != DCGM_ST_OK) return st;
    for (int i = 0; i < MAX_OBJECTS; i++)
        if (he.field_groups[i].id && strcmp(he.field_groups[i].name, fieldGroupName) == 0)
            return DCGM_ST_DUPLICATE_KEY;
    for (int i = 0; i < MAX_OBJECTS; i++) {
        struct field_group *fg = &he.field_groups[i];
        if (fg->id) continue;
        memset(fg, 0, sizeof *fg);
        fg->id = he.next_id++;
        snprintf(fg->name, sizeof fg->name, "%s", fieldGroupName);
        fg->n = numFieldIds;
        memcpy(fg->fields, fieldIds, sizeof(unsigned short) * (size_t)numFieldIds);
        *fieldGroupId = fg->id;
        publish_live();
        return DCGM_ST_OK;
    }
    return DCGM_ST_MAX_LIMIT;
}

API dcgmReturn_t dcgmFieldGroupDestroy(dcgmHandle_t handle, dcgmFieldGrp_t fieldGroupId) {
    FAULT("dcgmFieldGroupDestroy");
    dcgmReturn_t st = live(handle);
    if (st != DCGM_ST_OK) return st;
    struct field_group *fg = find_field_group(fieldGroupId);
    if (!fg) return DCGM_ST_BADPARAM;
    for (int w = 0; w < MAX_OBJECTS; w++)
        if (he.watches[w].field_group == fieldGroupId) memset(&he.watches[w], 0, sizeof he.watches[w]);
    memset(fg, 0, sizeof *fg);
    publish_live();
    return DCGM_ST_OK;
}

/* Whether the profiling fields of `fg`, with those already watched, need one pass: DCGM_ST_OK, or
 * why not. */
static dcgmReturn_t profiling_check(const struct group *g, const struct field_group *fg) {
    for (int i = 0; i < g->n; i++) {
        if (g->members[i].entityGroupId != DCGM_FE_GPU) continue;
        char key[32];
        snprintf(key, sizeof key, "profiling.%u", g->members[i].entityId);
        if (config_long(key, 1) == 0) {
            for (int f = 0; f < fg->n; f++)
                if (is_profiling(fg->fields[f])) return DCGM_ST_PROFILING_NOT_SUPPORTED;
        }
    }
    /* The metric groups in use: those of this field group and of every other watch. */
    dcgmProfMetricGroupInfo_v2 used[2 * MAX_MEMBERS];
    int n_used = 0;
    for (int w = -1; w < MAX_OBJECTS; w++) {
        const struct field_group *x = w < 0 ? fg : find_field_group(he.watches[w].field_group);
        if (!x || (w >= 0 && x == fg)) continue;
        for (int f = 0; f < x->n; f++) {
            if (!is_profiling(x->fields[f])) continue;
            dcgmProfMetricGroupInfo_v2 mg;
            if (group_of(x->fields[f], &mg) < 0) return DCGM_ST_PROFILING_NOT_SUPPORTED;
            for (int u = 0; u < n_used; u++)
                if (used[u].majorId == mg.majorId && used[u].minorId != mg.minorId)
                    return DCGM_ST_PROFILING_MULTI_PASS;
            if (n_used < 2 * MAX_MEMBERS) used[n_used++] = mg;
        }
    }
    return DCGM_ST_OK;
}

API dcgmReturn_t dcgmWatchFields(dcgmHandle_t handle, dcgmGpuGrp_t groupId, dcgmFieldGrp_t fieldGroupId,
                                 long long updateFreq, double maxKeepAge, int maxKeepSamples) {
    FAULT("dcgmWatchFields");
    dcgmReturn_t st = live(handle);
    if (st != DCGM_ST_OK) return st;
    struct group *g = find_group(groupId);
    struct field_group *fg = find_field_group(fieldGroupId);
    if (!g || !fg || updateFreq <= 0 || maxKeepAge < 0 || maxKeepSamples < 0) return DCGM_ST_BADPARAM;
    for (int f = 0; f < fg->n; f++) {
        char key[32];
        snprintf(key, sizeof key, "refusewatch.%u", fg->fields[f]);
        long code = config_long(key, 0);
        if (code) return (dcgmReturn_t)code;
    }
    st = profiling_check(g, fg);
    if (st != DCGM_ST_OK) return st;
    for (int w = 0; w < MAX_OBJECTS; w++)
        if (he.watches[w].group == groupId && he.watches[w].field_group == fieldGroupId) return DCGM_ST_OK;
    for (int w = 0; w < MAX_OBJECTS; w++) {
        if (he.watches[w].group) continue;
        he.watches[w].group = groupId;
        he.watches[w].field_group = fieldGroupId;
        return DCGM_ST_OK;
    }
    return DCGM_ST_MAX_LIMIT;
}

API dcgmReturn_t dcgmUnwatchFields(dcgmHandle_t handle, dcgmGpuGrp_t groupId, dcgmFieldGrp_t fieldGroupId) {
    FAULT("dcgmUnwatchFields");
    dcgmReturn_t st = live(handle);
    if (st != DCGM_ST_OK) return st;
    for (int w = 0; w < MAX_OBJECTS; w++)
        if (he.watches[w].group == groupId && he.watches[w].field_group == fieldGroupId) {
            memset(&he.watches[w], 0, sizeof he.watches[w]);
            return DCGM_ST_OK;
        }
    return DCGM_ST_NOT_WATCHED;
}

API dcgmReturn_t dcgmProfGetSupportedMetricGroups(dcgmHandle_t handle, dcgmProfGetMetricGroups_v3 *metricGroups) {
    FAULT("dcgmProfGetSupportedMetricGroups");
    if (!metricGroups) return DCGM_ST_BADPARAM;
    if (metricGroups->version != dcgmProfGetMetricGroups_version3) return DCGM_ST_VER_MISMATCH;
    dcgmReturn_t st = live(handle);
    if (st != DCGM_ST_OK) return st;
    if (metricGroups->gpuId >= (unsigned int)config_long("gpus", 0)) return DCGM_ST_BADPARAM;
    char key[32];
    snprintf(key, sizeof key, "profiling.%u", metricGroups->gpuId);
    if (config_long(key, 1) == 0) return DCGM_ST_PROFILING_NOT_SUPPORTED;
    metricGroups->numMetricGroups = 0;
    for (int n = 0; n < DCGM_PROF_MAX_NUM_GROUPS_V2 &&
                    metric_group(n, &metricGroups->metricGroups[metricGroups->numMetricGroups]);
         n++)
        metricGroups->numMetricGroups++;
    return DCGM_ST_OK;
}

API dcgmReturn_t dcgmGetGpuInstanceHierarchy(dcgmHandle_t handle, dcgmMigHierarchy_v2 *hierarchy) {
    FAULT("dcgmGetGpuInstanceHierarchy");
    if (!hierarchy) return DCGM_ST_BADPARAM;
    if (hierarchy->version != dcgmMigHierarchy_version2) return DCGM_ST_VER_MISMATCH;
    dcgmReturn_t st = live(handle);
    if (st != DCGM_ST_OK) return st;
    hierarchy->count = 0;
    unsigned int gpu, entity, gi;
    for (int n = 0; n < DCGM_MAX_HIERARCHY_INFO && mig_entry(n, &gpu, &entity, &gi); n++) {
        dcgmMigHierarchyInfo_v2 *e = &hierarchy->entityList[hierarchy->count++];
        memset(e, 0, sizeof *e);
        e->entity = (dcgmGroupEntityPair_t){DCGM_FE_GPU_I, entity};
        e->parent = (dcgmGroupEntityPair_t){DCGM_FE_GPU, gpu};
        gpu_uuid(gpu, e->info.gpuUuid, sizeof e->info.gpuUuid);
        e->info.nvmlGpuIndex = gpu;
        e->info.nvmlInstanceId = gi;
        e->info.nvmlComputeInstanceId = 0xffffffffu;
    }
    return DCGM_ST_OK;
}

API dcgmReturn_t dcgmGetDeviceAttributes(dcgmHandle_t handle, unsigned int gpuId, dcgmDeviceAttributes_v3 *attrs) {
    FAULT("dcgmGetDeviceAttributes");
    if (!attrs) return DCGM_ST_BADPARAM;
    if (attrs->version != dcgmDeviceAttributes_version3) return DCGM_ST_VER_MISMATCH;
    dcgmReturn_t st = live(handle);
    if (st != DCGM_ST_OK) return st;
    if (gpuId >= (unsigned int)config_long("gpus", 0)) return DCGM_ST_BADPARAM;
    gpu_uuid(gpuId, attrs->identifiers.uuid, sizeof attrs->identifiers.uuid);
    snprintf(attrs->identifiers.deviceName, sizeof attrs->identifiers.deviceName, "NVIDIA A100-SXM4-80GB");
    return DCGM_ST_OK;
}
